"""The official calling convention of every family: the mask forms each official forward takes give the same logits
as the equivalent native call, and anything else is refused with a clear `DareBenchError`.

LLaDA: 2-D padding `attention_mask` (or its [B, 1, 1, L] view), 4-D pattern as `attention_bias`. Dream: None /
"full" / 4-D bool or additive `attention_mask`. SDAR: 4-D bool or 0/1 `attention_mask` (read with .bool()).
LLaDA2: 4-D additive or bool `attention_mask`. Fixture cases of the official calls are in the *_parity.py tests.
"""

import pytest
import torch

from dare_bench.errors import DareBenchError
from dare_bench.models import load_pretrained
from dare_bench.models.block import full_attention_mask, inference_block_causal_mask

L = 24
_MODELS = {}


def _model(name):
    if name not in _MODELS:
        torch.manual_seed(0)
        m = load_pretrained(f"tiny-{name}")
        m.eval()
        _MODELS[name] = m
    return _MODELS[name]


def _ids(b=2, n=L, seed=1):
    return torch.randint(0, 200, (b, n), generator=torch.Generator().manual_seed(seed))


def _additive(mask_bool, value=float("-inf")):
    return torch.zeros(mask_bool.shape).masked_fill(~mask_bool, value)


def _same(a, b):
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


# --- LLaDA2 ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("block", [4, 8])
def test_llada2_4d_additive_mask_of_another_block_size_equals_native_block_size(block):
    model = _model("llada2")
    ids = _ids()
    default = model.traits.block_size
    assert default == 32 and block != default
    causal = inference_block_causal_mask(L, L, block)
    with torch.no_grad():
        official = model(input_ids=ids, attention_mask=_additive(causal))  # 0 / -inf float, as generate() builds
        finfo_min = model(ids, _additive(causal, torch.finfo(torch.float32).min))  # 0 / finfo.min: same
        as_bool = model(ids, causal.expand(2, 1, L, L))
        bf16 = model(ids, _additive(causal).to(torch.bfloat16))  # the official generate's mask dtype
        model.config["block_size"] = block
        try:
            native = model(ids)
        finally:
            model.config["block_size"] = default
    _same(official, native)
    _same(finfo_min, native)
    _same(as_bool, native)
    _same(bf16, native)
    assert not torch.allclose(official, model(ids).detach(), atol=1e-3)  # the block size matters


def test_llada2_4d_mask_equal_to_the_default_pattern_equals_no_mask_call():
    model = _model("llada2")
    ids = _ids(n=72)  # three blocks of 32 (last one partial)
    causal = inference_block_causal_mask(72, 72, model.traits.block_size)
    with torch.no_grad():
        plain = model(ids)
        _same(model(ids, attention_mask=_additive(causal)), plain)
        _same(model(ids, attention_mask=causal), plain)
        _same(model(ids, attn_mask=_additive(causal)), plain)
        # upstream's attention_mask=None is full attention: the same as an all-zero additive mask
        _same(model(ids, attention_mask=torch.zeros(1, 1, 72, 72)), model(ids, attn_mask=full_attention_mask(72)))


def test_llada2_4d_mask_with_kv_cache():
    model = _model("llada2")
    ids = _ids(n=40)
    causal = inference_block_causal_mask(40, 40, 8)
    with torch.no_grad():
        full = model(ids, _additive(causal))
        cache = model.new_kv_cache()
        model(ids[:, :16], _additive(causal[..., :16, :16]), kv_cache=cache, update_cache=True)
        # the official shape with a cache: [B, 1, new queries, cached + new keys]
        _same(model(ids[:, 16:], attention_mask=_additive(causal[..., 16:, :]), kv_cache=cache), full[:, 16:])


# --- SDAR -----------------------------------------------------------------------------------------------------------

def test_sdar_official_4d_masks_equal_native_call():
    model = _model("sdar")
    ids = _ids()
    b = model.traits.block_size
    causal = inference_block_causal_mask(L, L, b).expand(2, 1, L, L)
    other = inference_block_causal_mask(L, L, 2 * b)
    with torch.no_grad():
        plain = model(ids)
        _same(model(input_ids=ids, attention_mask=causal), plain)
        _same(model(ids, causal.long()), plain)  # upstream reads it with .bool(): 0/1 integers are the same
        _same(model(ids, causal.to(torch.int8)), plain)
        _same(model(ids, attention_mask=other), model(ids, attn_mask=other))
        # the native keyword also takes an additive float mask
        _same(model(ids, attn_mask=_additive(other)), model(ids, attn_mask=other))
    with pytest.raises(DareBenchError, match=r"SDAR: attention_mask of dtype torch.float32 .*inverted"):
        model(ids, attention_mask=_additive(causal))


# --- Dream ----------------------------------------------------------------------------------------------------------

def test_dream_official_masks_equal_native_call():
    model = _model("dream")
    ids = _ids()
    pad = torch.ones(2, L, dtype=torch.long)
    pad[0, :5] = 0
    m = pad.bool()
    mask4 = m[:, None, None, :] & m[:, None, :, None]  # the official sampler's mask
    pos = (pad.cumsum(-1) - 1).masked_fill(pad == 0, 1)
    with torch.no_grad():
        plain = model(ids)
        _same(model(ids, "full"), plain)
        _same(model(ids, attention_mask=torch.ones(2, L)), plain)
        native = model(ids, pad, pos)
        _same(model(input_ids=ids, attention_mask=mask4, position_ids=pos), native)
        _same(model(ids, _additive(mask4), pos), native)
        _same(model(ids, attn_mask=mask4, position_ids=pos), native)
    with pytest.raises(DareBenchError, match="'full'"):
        model(ids, "causal")
    with pytest.raises(DareBenchError, match=r"Dream: attention_mask of dtype torch.int64"):
        model(ids, mask4.long())


# --- LLaDA ----------------------------------------------------------------------------------------------------------

def test_llada_official_masks_equal_native_call():
    model = _model("llada")
    ids = _ids()
    pad = torch.ones(2, L, dtype=torch.long)
    pad[1, :4] = 0
    pattern = inference_block_causal_mask(L, L, 8).expand(2, 1, L, L)
    with torch.no_grad():
        native_pad = model(ids, pad)
        _same(model(ids, pad[:, None, None, :]), native_pad)  # upstream flattens [B, 1, 1, L] the same way
        native = model(ids, pad, attn_mask=pattern)
        _same(model(ids, pad, attention_bias=pattern), native)
        _same(model(ids, pad, attention_bias=pattern.to(torch.int8)), native)
        _same(model(ids, pad, attention_bias=_additive(pattern, torch.finfo(torch.float32).min)), native)
        _same(model(ids, attention_bias=torch.ones(1, 1, L, L, dtype=torch.bool)), model(ids))
    with pytest.raises(DareBenchError, match="attention_bias"):
        model(ids, pattern)  # a 4-D pattern is upstream's attention_bias, not attention_mask
    with pytest.raises(DareBenchError, match="pass the 4-D mask once"):
        model(ids, attention_bias=pattern, attn_mask=pattern)


# --- every family: what is refused ----------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["llada", "dream", "sdar", "llada2"])
def test_malformed_masks_and_positions_are_refused(family):
    model = _model(family)
    ids = _ids()
    ok = torch.ones(2, 1, L, L, dtype=torch.bool)
    with pytest.raises(DareBenchError, match="attention_mask"):
        model(ids, torch.ones(2, L, L, dtype=torch.bool))  # 3-D
    with pytest.raises(DareBenchError, match="attention_mask"):
        model(ids, torch.ones(2, L - 1))  # does not cover every key
    with pytest.raises(DareBenchError, match="attention_mask"):
        model(ids, [[1] * L] * 2)  # not a tensor
    with pytest.raises(DareBenchError, match="attn_mask"):
        model(ids, attn_mask=torch.ones(2, 1, L, L - 1, dtype=torch.bool))
    with pytest.raises(DareBenchError, match="attn_mask"):
        model(ids, attn_mask=torch.ones(2, 1, L, L, dtype=torch.long))  # native: bool or additive only
    with pytest.raises(DareBenchError, match="position_ids"):
        model(ids, position_ids=torch.arange(L))  # 1-D
    if family != "llada":
        with pytest.raises(DareBenchError, match="pass the 4-D mask once"):
            model(ids, ok, attn_mask=ok)
        with pytest.raises(DareBenchError, match=r"attention_mask must be \[B or 1, 1, 24, 24\]"):
            model(ids, torch.ones(2, 1, L, L + 1, dtype=torch.bool))
