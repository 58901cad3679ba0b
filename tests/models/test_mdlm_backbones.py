"""LLaDA / Dream forward contract beyond the official fixtures: packing, padding, KV cache (prefix and
replace_position), gradient checkpointing, masks with empty rows, and the flash-attn / flex backends (GPU)."""

import importlib.util

import pytest
import torch

from dare_bench.errors import DareBenchError
from dare_bench.models import from_config, load_pretrained
from dare_bench.models.layers import attention, packed_position_ids, segment_mask
from dare_bench.models.presets import preset_config

FAMILIES = ["llada", "dream"]
PRESET = {"llada": "tiny-llada", "dream": "tiny-dream"}
_CACHE = {}


# the presets' architecture, narrower and shallower so these checks stay cheap on a shared CPU
SMALL = {
    "llada": dict(d_model=64, mlp_hidden_size=128, n_layers=2),
    "dream": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2),
}


def _small(family, seed=7):
    model = from_config(preset_config(PRESET[family], **SMALL[family]), device="cpu")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.init_weights()
    return model.eval()


def _model(family):
    if family not in _CACHE:
        _CACHE[family] = _small(family)
    return _CACHE[family]


def _ids(*shape, seed=0):
    # ordinary tokens only (the presets' special ids sit at 510/511)
    return torch.randint(0, 500, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_and_padded_equal_separate_runs(family):
    model = _model(family)
    a, b = _ids(1, 7, seed=1), _ids(1, 5, seed=2)
    with torch.no_grad():
        alone_a, alone_b = model(a), model(b)
        seg = torch.tensor([[0] * 7 + [1] * 5])
        packed = model(torch.cat([a, b], 1), position_ids=packed_position_ids(seg), attn_mask=segment_mask(seg))
        pad = model.traits.pad_token_id
        batch = torch.cat([a, torch.cat([b, torch.full((1, 2), pad)], 1)])
        mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
        padded = model(batch, mask)
    assert (packed[:, :7] - alone_a).abs().max() <= 1e-5
    assert (packed[:, 7:] - alone_b).abs().max() <= 1e-5
    assert (padded[:1] - alone_a).abs().max() <= 1e-5
    assert (padded[1:, :5] - alone_b).abs().max() <= 1e-5
    assert torch.isfinite(padded).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_all_ones_padding_mask_is_no_mask(family):
    model = _model(family)
    ids = _ids(2, 9, seed=3)
    with torch.no_grad():
        assert torch.equal(model(ids, torch.ones_like(ids)), model(ids))


def test_padding_semantics():
    ids = _ids(1, 6, seed=4)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1]])
    other = ids.clone()
    other[:, :2] = (other[:, :2] + 1) % 500  # different pad ids
    with torch.no_grad():
        llada = _model("llada")
        # LLaDA: pad keys are hidden from every query (positions stay 0..L-1), pad queries still see real keys
        out, out2 = llada(ids, mask), llada(other, mask)
        assert torch.equal(out[:, 2:], out2[:, 2:])
        assert torch.isfinite(out).all() and not torch.allclose(out[:, 2:], llada(ids)[:, 2:])
        dream = _model("dream")
        pos = torch.tensor([[1, 1, 0, 1, 2, 3]])  # the official sampler's cumsum positions
        out, out2 = dream(ids, mask, pos), dream(other, mask, pos)
        assert torch.equal(out[:, 2:], out2[:, 2:]) and torch.isfinite(out).all()
        # Dream: a pad query sees nothing, its attention output is 0, so it ignores the real tokens
        third = ids.clone()
        third[:, 2:] = (third[:, 2:] + 1) % 500
        out3 = dream(third, mask, pos)
        assert torch.equal(out[:, :2], out3[:, :2]) and not torch.allclose(out[:, 2:], out3[:, 2:])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padded", [False, True])
def test_prefix_kv_cache_equals_uncached_forward(family, padded):
    model = _model(family)
    ids = _ids(2, 12, seed=5)
    pad_mask = torch.ones(2, 12, dtype=torch.long)
    if padded:
        pad_mask[1, :3] = 0
    n = 8
    q = torch.arange(12)[:, None]
    k = torch.arange(12)[None, :]
    # the cached prefix was encoded without the new tokens; the new tokens see everything
    pattern = ((k < n) | (q >= n))[None, None]
    with torch.no_grad():
        full = model(ids, pad_mask, attn_mask=pattern)
        cache = model.new_kv_cache()
        first = model(ids[:, :n], pad_mask[:, :n], kv_cache=cache, update_cache=True)
        assert len(cache) == n
        explicit = model(ids[:, n:], pad_mask, torch.arange(n, 12).expand(2, -1), kv_cache=cache)
        assert len(cache) == n  # update_cache=False leaves the cache alone
        default = model(ids[:, n:], pad_mask, kv_cache=cache)
        with pytest.raises(DareBenchError, match=r"attention_mask must be .*\[B, 12\]"):
            model(ids[:, n:], pad_mask[:, n:] * 0, kv_cache=cache)
    assert (first - full[:, :n]).abs().max() <= 1e-5
    assert (explicit - full[:, n:]).abs().max() <= 1e-5
    assert torch.equal(explicit, default)


@pytest.mark.parametrize("family", FAMILIES)
def test_replace_position_equals_uncached_forward(family):
    model = _model(family)
    x, y = _ids(1, 12, seed=6), _ids(1, 4, seed=7)
    s, e = 4, 8
    # uncached equivalent: [x ; y] where x attends only to x (the cache) and y, placed at positions s..e-1,
    # attends to x outside [s, e) plus itself
    qi = torch.arange(16)[:, None]
    kj = torch.arange(16)[None, :]
    x_part = (qi < 12) & (kj < 12)
    y_part = (qi >= 12) & (((kj < 12) & ((kj < s) | (kj >= e))) | (kj >= 12))
    pos = torch.cat([torch.arange(12), torch.arange(s, e)])[None]
    with torch.no_grad():
        ref = model(torch.cat([x, y], 1), position_ids=pos, attn_mask=(x_part | y_part)[None, None])
        cache = model.new_kv_cache()
        model(x, kv_cache=cache, update_cache=True)
        before = [t.clone() for t in cache.keys]
        out = model(y, kv_cache=cache, replace_position=(s, e))
        assert all(torch.equal(a, b) for a, b in zip(before, cache.keys))  # not updated
        out2 = model(y, position_ids=torch.arange(s, e)[None], kv_cache=cache, replace_position=(s, e),
                     update_cache=True)
        assert len(cache) == 12
        for a, b in zip(before, cache.keys):
            assert torch.equal(a[..., :s, :], b[..., :s, :]) and torch.equal(a[..., e:, :], b[..., e:, :])
            assert not torch.equal(a[..., s:e, :], b[..., s:e, :])
    assert (out - ref[:, 12:]).abs().max() <= 1e-5
    assert torch.equal(out, out2)


@pytest.mark.parametrize("family", FAMILIES)
def test_gradient_checkpointing_gives_same_gradients(family, monkeypatch):
    model = _small(family, seed=11).train()
    ids = _ids(2, 10, seed=8)
    target = _ids(2, 10, seed=9)
    mask = torch.tensor([[1] * 10, [0] * 3 + [1] * 7])

    def grads():
        model.zero_grad(set_to_none=True)
        logits = model(ids, mask)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten()).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain = grads()
    model.gradient_checkpointing_enable()
    calls = []
    real = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(f"dare_bench.models.{family}.checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    ckpt = grads()
    assert len(calls) == model.num_layers
    assert plain.keys() == ckpt.keys() and len(plain) == len(list(model.parameters()))
    for n in plain:
        assert torch.allclose(plain[n], ckpt[n], atol=1e-7, rtol=1e-6), n


def test_dream_pad_embedding_gets_no_gradient():
    model = _small("dream").train()
    pad = model.traits.pad_token_id
    assert torch.count_nonzero(model.model.embed_tokens.weight[pad]) == 0
    ids = torch.tensor([[pad, 5, 6, pad]])
    model(ids).sum().backward()
    g = model.model.embed_tokens.weight.grad
    assert torch.count_nonzero(g[pad]) == 0 and torch.count_nonzero(g[5]) > 0


# --- flash-attn grouping (CPU-checkable part) and GPU backends -------------------------------------------------

def _masks(b, l):
    g = torch.Generator().manual_seed(0)
    seg = torch.tensor([[0] * 5 + [1] * 4 + [2] * (l - 9)] * b)
    blk = torch.arange(l)[:, None] // 4 >= torch.arange(l)[None, :] // 4
    keypad = torch.ones(b, l, dtype=torch.bool)
    keypad[0, :3] = False
    qk = keypad[:, None, None, :] & keypad[:, None, :, None]
    return {
        "key_padding": keypad[:, None, None, :],
        "query_key_padding": qk,
        "packed": segment_mask(seg),
        "block_causal": blk[None, None],
        "random": torch.rand(b, 1, l, l, generator=g) > 0.4,
    }


@pytest.mark.parametrize("kind", ["key_padding", "query_key_padding", "packed", "block_causal", "random"])
def test_flash_grouping_reproduces_masked_attention(kind):
    """flash.py's decomposition of a mask into varlen groups, run with sdpa per group, equals masked sdpa."""
    from dare_bench.models.flash import group_queries

    b, h, hkv, l, d = 2, 4, 2, 14, 8
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(b, n, l, d, generator=g, dtype=torch.float64) for n in (h, hkv, hkv))
    mask = _masks(b, l)[kind]
    ref = attention(q, k, v, mask)
    groups, empty = group_queries(mask, b, l, l)
    out = torch.zeros_like(q)
    covered = torch.zeros(b, l, dtype=torch.bool)
    for row, qi, ki in groups:
        kk = k[row][:, ki].repeat_interleave(h // hkv, 0)
        vv = v[row][:, ki].repeat_interleave(h // hkv, 0)
        out[row][:, qi] = torch.nn.functional.scaled_dot_product_attention(q[row][:, qi], kk, vv)
        assert not covered[row, qi].any()
        covered[row, qi] = True
    assert torch.equal(covered, ~empty)
    assert (out - ref).abs().max() <= 1e-12


class _FakeFlash:
    """flash_attn's two entry points emulated with sdpa on CPU, to check flash.py's packing and unpacking."""

    @staticmethod
    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False):
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=softmax_scale, enable_gqa=True)
        return out.transpose(1, 2)

    @staticmethod
    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False):
        assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32 and not causal
        assert max_seqlen_q == int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
        outs = []
        for i in range(len(cu_seqlens_q) - 1):
            qs = q[cu_seqlens_q[i]:cu_seqlens_q[i + 1]].transpose(0, 1)
            ks = k[cu_seqlens_k[i]:cu_seqlens_k[i + 1]].transpose(0, 1)
            vs = v[cu_seqlens_k[i]:cu_seqlens_k[i + 1]].transpose(0, 1)
            outs.append(torch.nn.functional.scaled_dot_product_attention(
                qs, ks, vs, scale=softmax_scale, enable_gqa=True).transpose(0, 1))
        return torch.cat(outs)


@pytest.mark.parametrize("kind", [None, "key_padding", "query_key_padding", "packed", "block_causal", "random"])
def test_flash_varlen_packing_on_cpu(kind):
    from dare_bench.models.flash import varlen_attention

    b, h, hkv, l, d = 2, 4, 2, 14, 8
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(b, n, l, d, generator=g, dtype=torch.float64) for n in (h, hkv, hkv))
    mask = None if kind is None else _masks(b, l)[kind]
    ref = attention(q, k, v, mask, scale=0.3)
    out = varlen_attention(_FakeFlash, q, k, v, mask, scale=0.3)
    assert out.shape == ref.shape and (out - ref).abs().max() <= 1e-12


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["key_padding", "query_key_padding", "packed", "block_causal", "random"])
def test_flex_backend_masks_on_cpu(kind):
    """layers.attention's flex path (eager flex_attention runs on CPU, slowly) equals sdpa, empty rows included."""
    b, h, hkv, l, d = 2, 4, 2, 14, 16
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(b, n, l, d, generator=g) for n in (h, hkv, hkv))
    mask = _masks(b, l)[kind]
    assert (attention(q, k, v, mask, backend="flex") - attention(q, k, v, mask)).abs().max() <= 1e-5


needs_flash = pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="flash-attn not installed")


def _backend_outputs(family, backend):
    model = load_pretrained(PRESET[family], dtype="bfloat16", device="cuda", seed=7)
    ids = _ids(2, 16, seed=10).cuda()
    seg = torch.tensor([[0] * 9 + [1] * 7] * 2).cuda()
    pad = torch.ones(2, 16, dtype=torch.long).cuda()
    pad[1, :4] = 0
    blk = (torch.arange(16)[:, None] // 4 >= torch.arange(16)[None, :] // 4).cuda()[None, None]
    calls = {
        "plain": dict(),
        "padded": dict(attention_mask=pad),
        "packed": dict(position_ids=packed_position_ids(seg), attn_mask=segment_mask(seg)),
        "block_causal": dict(attn_mask=blk),
    }
    out = {}
    with torch.no_grad():
        for name, kw in calls.items():
            model.set_attention_backend("sdpa")
            ref = model(ids, **kw).float()
            model.set_attention_backend(backend)
            out[name] = (ref, model(ids, **kw).float())
    return out


@pytest.mark.gpu
@needs_flash
@pytest.mark.parametrize("family", FAMILIES)
def test_flash_attn_backend_matches_sdpa(family):
    for name, (ref, got) in _backend_outputs(family, "flash_attn").items():
        assert (ref - got).abs().max() <= 2e-2 * ref.abs().max(), name


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_flex_backend_matches_sdpa(family):
    for name, (ref, got) in _backend_outputs(family, "flex").items():
        assert (ref - got).abs().max() <= 2e-2 * ref.abs().max(), name
