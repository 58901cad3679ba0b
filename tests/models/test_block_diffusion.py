"""Block-diffusion masks, layouts, KV cache and training forward, on every block-diffusion tiny preset."""

import pytest
import torch

from dare_bench.errors import DareBenchError
from dare_bench.models import load_pretrained
from dare_bench.models.block import (
    bd3_attention_mask,
    dfactory_bd_loss,
    inference_block_causal_mask,
    packed_training_forward,
    pad_position_ids,
    sample_lengths,
    sdar_packed_training_mask,
    training_forward,
)
from dare_bench.models.presets import list_presets

PRESETS = [p for p in ("tiny-sdar", "tiny-llada2") if p in list_presets()]


def _model(name):
    model = load_pretrained(name, seed=0)
    # the mask rules do not depend on the block size; a small one keeps the CPU cost down (LLaDA2's default is 32)
    model.config["block_size"] = min(model.traits.block_size, 8)
    return model


def test_bd3_truth_table():
    # algorithms.md §2.2: n=8, block 4
    m = bd3_attention_mask(8, 4)[0, 0]
    noisy5 = set(torch.nonzero(m[5]).flatten().tolist())
    assert noisy5 == {4, 5, 6, 7} | {8 + j for j in range(4)}  # its noisy block + clean blocks < 1
    clean1 = set(torch.nonzero(m[8 + 1]).flatten().tolist())
    assert clean1 == {8, 9, 10, 11}
    clean6 = set(torch.nonzero(m[8 + 6]).flatten().tolist())
    assert clean6 == set(range(8, 16))
    noisy1 = set(torch.nonzero(m[1]).flatten().tolist())
    assert noisy1 == {0, 1, 2, 3}
    # clean never sees noisy; noisy never sees other noisy blocks
    assert not m[8:, :8].any()
    assert not m[:4, 4:8].any() and not m[4:8, :4].any()
    # clean copy alone is the inference block-causal mask
    assert torch.equal(m[8:, 8:], inference_block_causal_mask(8, 8, 4)[0, 0])


def test_sdar_packed_mask_is_block_diagonal():
    one = sdar_packed_training_mask([[6]], 4)[0, 0]
    assert torch.equal(one, bd3_attention_mask(6, 4)[0, 0])
    two = sdar_packed_training_mask([[6, 10], [16]], 4)
    assert two.shape == (2, 1, 32, 32)
    assert torch.equal(two[0, 0, :12, :12], one) and not two[0, 0, :12, 12:].any() and not two[0, 0, 12:, :12].any()
    assert torch.equal(two[0, 0, 12:, 12:], bd3_attention_mask(10, 4)[0, 0])
    with pytest.raises(DareBenchError):
        sdar_packed_training_mask([[6], [7]], 4)


def test_padding_positions_become_a_sample():
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0, 0, 0], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]])
    fixed = pad_position_ids(pos)
    assert fixed.tolist()[0] == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2]
    assert sample_lengths(fixed) == [[3, 4, 3], [10]]


@pytest.mark.parametrize("preset", PRESETS)
def test_cached_block_decode_equals_recompute(preset):
    model = _model(preset)
    b = model.traits.block_size
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 200, (2, 4 * b), generator=g)
    x[:, 3 * b + 1::2] = model.traits.mask_token_id
    cache = model.new_kv_cache()
    with torch.no_grad():
        model(x[:, : 2 * b], kv_cache=cache, update_cache=True)  # prefill two committed blocks
        for k in (2, 3):
            blk = x[:, k * b:(k + 1) * b]
            cached = model(blk, kv_cache=cache)  # decode step: attend, do not store
            assert len(cache) == k * b
            full = model(x[:, : (k + 1) * b])[:, k * b:]  # recompute with the block-causal mask
            torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-5)
            model(blk, kv_cache=cache, update_cache=True)  # commit
        assert len(cache) == 4 * b
        # dual-cache replacement of the last block equals the same block-causal recompute
        blk = x[:, 3 * b:]
        rep = model(blk, kv_cache=cache, replace_position=(3 * b, 4 * b))
        torch.testing.assert_close(rep, model(x)[:, 3 * b:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("preset", PRESETS)
def test_training_forward_equals_blockwise_loop(preset):
    """Doubled input [x_t ; x_0] == running each noisy block after its clean prefix (algorithms.md §2.2)."""
    model = _model(preset)
    b = model.traits.block_size
    L = 3 * b
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, 200, (2, L), generator=g)
    masked = torch.rand(2, L, generator=g) < 0.5
    noisy = torch.where(masked, model.traits.mask_token_id, clean)
    with torch.no_grad():
        out = training_forward(model, noisy, clean)
        assert out.shape == (2, L, model.config["vocab_size"])
        for k in range(L // b):
            seq = torch.cat([clean[:, : k * b], noisy[:, k * b:(k + 1) * b]], dim=1)
            ref = model(seq)[:, k * b:]
            torch.testing.assert_close(out[:, k * b:(k + 1) * b], ref, atol=1e-5, rtol=1e-5)
    labels = torch.where(masked, clean, -100)
    loss = dfactory_bd_loss(out, labels)
    ref = torch.nn.functional.cross_entropy(out[masked], clean[masked], reduction="sum") / masked.sum()
    torch.testing.assert_close(loss, ref)


@pytest.mark.parametrize("preset", PRESETS)
def test_packed_equals_padded(preset):
    model = _model(preset)
    b = model.traits.block_size
    g = torch.Generator().manual_seed(2)
    lens = [b + 2, 2 * b + 1]
    T = sum(lens) + 3  # trailing padding
    clean = torch.randint(0, 200, (1, T), generator=g)
    noisy = torch.where(torch.rand(1, T, generator=g) < 0.5, model.traits.mask_token_id, clean)
    pos = torch.cat([torch.arange(n) for n in lens] + [torch.zeros(3, dtype=torch.long)])[None]
    with torch.no_grad():
        packed = packed_training_forward(model, noisy, clean, pos)
        start = 0
        for n in lens:
            pad_len = max(lens)
            c = torch.full((1, pad_len), model.traits.pad_token_id)
            z = c.clone()
            c[0, :n], z[0, :n] = clean[0, start:start + n], noisy[0, start:start + n]
            am = torch.zeros(1, pad_len, dtype=torch.long)
            am[0, :n] = 1
            padded = training_forward(model, z, c, attention_mask=am)
            torch.testing.assert_close(packed[:, start:start + n], padded[:, :n], atol=1e-5, rtol=1e-5)
            # without padding at all (one sample alone) the logits are the same too
            alone = training_forward(model, noisy[:, start:start + n], clean[:, start:start + n])
            torch.testing.assert_close(alone, padded[:, :n], atol=1e-5, rtol=1e-5)
            start += n


def test_bad_inputs_are_one_clear_error():
    model = _model("tiny-sdar")
    ids = torch.zeros(1, 8, dtype=torch.long)
    with pytest.raises(DareBenchError, match="attn_mask"):
        model(ids, attn_mask=torch.ones(1, 1, 8, 7, dtype=torch.bool))
    with pytest.raises(DareBenchError, match="replace_position"):
        model(ids, replace_position=(0, 8))
    with pytest.raises(DareBenchError, match="attention_mask"):
        model(ids, attention_mask=torch.ones(1, 5))
    with pytest.raises(DareBenchError, match="noisy and clean"):
        training_forward(model, ids, ids[:, :4])
    with pytest.raises(DareBenchError, match="block_size"):
        bd3_attention_mask(8, 0)
    if "tiny-llada" in list_presets():  # a masked-diffusion (bidirectional) backbone has no block layout
        with pytest.raises(DareBenchError, match="block-diffusion"):
            training_forward(load_pretrained("tiny-llada"), ids, ids)


def test_padding_mask_hides_keys():
    model = _model("tiny-sdar")
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 200, (1, 8), generator=g)
    am = torch.ones(1, 8, dtype=torch.long)
    am[0, 6:] = 0
    with torch.no_grad():
        padded = model(x, attention_mask=am)[:, :6]
        short = model(x[:, :6])
    torch.testing.assert_close(padded, short, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("preset", PRESETS)
def test_adapt_vocab_sets_family_fields(preset):
    from dare_bench.models import FAMILIES, detect_family
    from dare_bench.models.io import build_model
    from dare_bench.models.presets import preset_config

    cfg = preset_config(preset)
    spec = detect_family(cfg)
    assert FAMILIES[spec.name].adapt_vocab is not None
    new = spec.adapt_vocab(cfg, vocab_size=100, mask_token_id=99, eos_token_id=98, pad_token_id=97, bos_token_id=96)
    assert cfg["vocab_size"] != 100  # the preset itself is untouched
    model = build_model(new)
    model.init_weights()
    t = model.traits
    assert (t.mask_token_id, t.eos_token_id, t.pad_token_id, t.bos_token_id) == (99, 98, 97, 96)
    assert model.lm_head.weight.shape[0] == 100
    with torch.no_grad():
        assert model(torch.randint(0, 100, (1, 9))).shape == (1, 9, 100)


@pytest.mark.parametrize("preset", PRESETS)
def test_gradient_checkpointing_and_bf16(preset):
    model = _model(preset)
    ids = torch.randint(0, 200, (1, 12), generator=torch.Generator().manual_seed(4))
    model.train()
    grads = []
    for ckpt in (False, True):
        model.zero_grad()
        model.gradient_checkpointing_enable(ckpt)
        training_forward(model, ids, ids).logsumexp(-1).mean().backward()
        grads.append(model.lm_head.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-5)
    model.eval()
    with torch.no_grad():
        ref = model(ids)
        low = model.to(torch.bfloat16)(ids)
    assert low.dtype == torch.float32  # logits upcast
    assert (low - ref).abs().max() < 0.5


@pytest.mark.parametrize("preset", PRESETS)
def test_tied_embeddings_have_no_head_weight(preset, tmp_path):
    from dare_bench.models.io import build_model
    from dare_bench.models.presets import preset_config

    model = build_model(preset_config(preset, tie_word_embeddings=True))
    model.init_weights()
    assert not any(k.startswith("lm_head") for k in model.state_dict())
    model.save_pretrained(tmp_path / "tied")
    again = load_pretrained(tmp_path / "tied")
    ids = torch.randint(0, 200, (1, 8), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(again(ids), model(ids), atol=1e-5, rtol=1e-5)
        # the output projection really is the input embedding: changing one moves the other
        emb = next(m for n, m in again.model.named_children() if n in ("embed_tokens", "word_embeddings"))
        emb.weight[7] += 1.0
        assert not torch.allclose(again(ids)[..., 7], model(ids)[..., 7])
