"""FlexAttention block masks (models/block.py) against the dense reference masks, and the `flex` backend's outputs
against sdpa with the dense masks, on the SDAR and LLaDA2 tiny presets.

CPU (default run): the tile tables of every BlockMask, expanded the way the fused kernels read them (skipped tile:
nothing, full tile: everything, partial tile: the mask_mod), equal the dense mask; logits equal in float32 (torch's
eager FlexAttention, forward only: torch 2.13 refuses FlexAttention's backward on CPU). `slow`: the compiled CPU
kernel, which does read the tiles. `gpu`: logits and gradients with the compiled CUDA kernel.
"""

import warnings

import pytest
import torch

from dare_bench.errors import DareBenchError
from dare_bench.models import load_pretrained
from dare_bench.models.block import (
    bd3_attention_mask,
    bd3_block_mask,
    block_causal_block_mask,
    block_tables,
    dense_block_mask,
    inference_block_causal_mask,
    packed_training_forward,
    training_forward,
)
from dare_bench.models.layers import attention

flex_api = pytest.importorskip("torch.nn.attention.flex_attention")
FAMILIES = ("tiny-sdar", "tiny-llada2")
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def _kernel_view(block_mask, batch: int) -> torch.Tensor:
    """The bool `[batch, Lq, Lk]` a tile-sparse kernel attends to under `block_mask`."""
    q_len, k_len = block_mask.seq_lengths
    q_tile, k_tile = block_mask.BLOCK_SIZE
    partial, full = (t[:, 0].expand(batch, -1, -1) for t in block_tables(block_mask))
    assert not bool((partial & full).any()), "a tile is both partial and full"
    up = lambda t: t.repeat_interleave(q_tile, 1).repeat_interleave(k_tile, 2)[:, :q_len, :k_len]  # noqa: E731
    mod = flex_api.create_mask(block_mask.mask_mod, batch, 1, q_len, k_len, device="cpu")[:, 0]
    return up(full) | (up(partial) & mod)


def _left_padding(b: int, n: int, pads=(0, 3, 7)) -> torch.Tensor:
    keep = torch.ones(b, n, dtype=torch.bool)
    for row in range(b):
        keep[row, : pads[row % len(pads)]] = False
    return keep


@pytest.mark.parametrize("seq_len,block_size", [(13, 4), (40, 5), (64, 8), (33, 32)])
@pytest.mark.parametrize("padded", [False, True])
def test_bd3_block_mask_tiles_equal_the_dense_mask(seq_len, block_size, padded):
    keep = _left_padding(3, 2 * seq_len) if padded else None
    bm = bd3_block_mask(seq_len, block_size, keep_keys=keep, tile=8)
    ref = bd3_attention_mask(seq_len, block_size)[:, 0]
    if padded:
        ref = ref & keep[:, None, :]
    got = _kernel_view(bm, 3)
    assert torch.equal(got, ref.expand_as(got))
    partial, full = block_tables(bm)
    assert bool((~partial & ~full).any()), "clean queries never see noisy keys: some tiles are skipped"
    if seq_len % 8 == 0 and block_size % 8 == 0:
        assert bool(full.any()), "tile-aligned blocks: some tiles run without the mask_mod"


@pytest.mark.parametrize("q_len,k_len,q_offset", [(30, 30, 0), (6, 13, 7), (5, 40, 35), (9, 20, 3)])
@pytest.mark.parametrize("padded", [False, True])
def test_block_causal_block_mask_tiles_equal_the_dense_mask(q_len, k_len, q_offset, padded):
    keep = _left_padding(2, k_len, pads=(0, 5)) if padded else None
    bm = block_causal_block_mask(q_len, k_len, 4, q_offset, keep_keys=keep, tile=4)
    ref = inference_block_causal_mask(q_len, k_len, 4, q_offset)[:, 0]
    if padded:
        ref = ref & keep[:, None, :]
    got = _kernel_view(bm, 2)
    assert torch.equal(got, ref.expand_as(got))


@pytest.mark.parametrize("batch", [1, 3])
def test_dense_block_mask_tiles_equal_the_mask(batch):
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(batch, 1, 21, 19, generator=g) > 0.5
    mask[..., :8, :8] = True  # a full tile
    mask[..., 8:16, 8:16] = False  # an empty one
    got = _kernel_view(dense_block_mask(mask, tile=8), batch)
    assert torch.equal(got, mask[:, 0])


def test_block_masks_are_built_once_per_shape():
    assert bd3_block_mask(24, 4) is bd3_block_mask(24, 4)
    assert bd3_block_mask(24, 4) is not bd3_block_mask(24, 8)
    assert block_causal_block_mask(4, 12, 4, 8) is block_causal_block_mask(4, 12, 4, 8)
    assert block_causal_block_mask(4, 12, 4, 8) is not block_causal_block_mask(4, 12, 4, 4)


def test_block_mask_equals_the_dense_mask_through_attention():
    """layers.attention with the BlockMask == sdpa with the dense mask, GQA and rows that see nothing included."""
    g = torch.Generator().manual_seed(1)
    n, bs = 19, 4
    q = torch.randn(3, 4, 2 * n, 16, generator=g)
    k, v = (torch.randn(3, 2, 2 * n, 16, generator=g) for _ in range(2))
    keep = _left_padding(3, 2 * n)
    keep[2] = False  # a row whose queries see no key: 0, as the sdpa path gives
    ref = attention(q, k, v, bd3_attention_mask(n, bs) & keep[:, None, None, :], scale=0.25)
    got = attention(q, k, v, bd3_block_mask(n, bs, keep_keys=keep), backend="flex", scale=0.25)
    assert (got - ref).abs().max() <= 1e-6 and not bool(got[2].any())


def _model(name, block_size, backend="sdpa"):
    model = load_pretrained(name, seed=0)
    model.config["block_size"] = block_size
    model.set_attention_backend(backend)
    return model


def _batch(b, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 500, (b, n), generator=g), torch.randint(0, 500, (b, n), generator=g)


def _both(model, fn):
    out = {}
    for backend in ("sdpa", "flex"):
        model.set_attention_backend(backend)
        with torch.no_grad():
            out[backend] = fn()
    return out["sdpa"], out["flex"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seq_len,block_size", [(23, 5), (24, 4), (70, 8)])  # 5 does not divide 23; 2L = 140 > 128
def test_training_layout_logits_equal_sdpa(family, seq_len, block_size):
    model = _model(family, block_size)
    noisy, clean = _batch(3, seq_len)
    pad = _left_padding(3, seq_len).long()
    ref, got = _both(model, lambda: training_forward(model, noisy, clean, attention_mask=pad))
    assert (got - ref).abs().max() <= 1e-5
    ref, got = _both(model, lambda: training_forward(model, noisy, clean))
    assert (got - ref).abs().max() <= 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_inference_logits_equal_sdpa(family):
    """Block-causal inference: a left-padded batch, then a KV-cached step whose queries cross a block edge."""
    model = _model(family, 5)
    ids, nxt = _batch(3, 17, seed=2)
    pad = _left_padding(3, 17).long()
    ref, got = _both(model, lambda: model(ids, attention_mask=pad))
    assert (got - ref).abs().max() <= 1e-5

    def cached_step():
        cache = model.new_kv_cache()
        model(ids[:, :12], attention_mask=pad[:, :12], kv_cache=cache, update_cache=True)
        return model(nxt[:, :6], attention_mask=torch.cat([pad[:, :12], torch.ones(3, 6, dtype=torch.long)], 1),
                     kv_cache=cache)

    ref, got = _both(model, cached_step)
    assert (got - ref).abs().max() <= 1e-5


def test_sdar_packed_layout_logits_equal_sdpa():
    """Explicit dense masks under flex (here SDAR's packed layout) become a BlockMask once per forward."""
    model = _model("tiny-sdar", 4)
    noisy, clean = _batch(2, 20, seed=3)
    pos = torch.tensor([list(range(9)) + list(range(11)), list(range(14)) + [0] * 6])
    ref, got = _both(model, lambda: packed_training_forward(model, noisy, clean, pos))
    assert (got - ref).abs().max() <= 1e-5


def test_flex_backward_on_cpu_is_one_line_error():
    model = _model("tiny-sdar", 4, backend="flex")
    noisy, clean = _batch(1, 8)
    with pytest.raises(DareBenchError, match="no backward on CPU") as info:
        training_forward(model, noisy, clean)
    assert "\n" not in str(info.value)
    with pytest.raises(DareBenchError, match="needs the 'flex' attention backend"):
        q = torch.randn(1, 1, 16, 8)
        attention(q, q, q, bd3_block_mask(8, 4))


@pytest.mark.slow
def test_compiled_cpu_kernel_equals_sdpa():
    """The fused CPU kernel (torch.compile, ~1 min to build), which reads the tile tables, on a padded BD3 mask."""
    g = torch.Generator().manual_seed(4)
    n, bs = 250, 128  # 2L = 500: four 128-tiles, full ones (tile-aligned blocks), a partial tail
    q, k, v = (torch.randn(2, 2, 2 * n, 32, generator=g) for _ in range(3))
    keep = _left_padding(2, n, pads=(0, 140)).repeat(1, 2)  # as training_forward: both copies padded
    ref = attention(q, k, v, bd3_attention_mask(n, bs) & keep[:, None, None, :])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = torch.compile(flex_api.flex_attention)(q, k, v, block_mask=bd3_block_mask(n, bs, keep_keys=keep))
    assert (got - ref).abs().max() <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_gradients_equal_sdpa_on_cuda(family):
    """Compiled FlexAttention (CUDA) vs sdpa with the dense masks, float32: the BD3 training layout with left padding
    and a block size that does not divide the length (logits and every parameter's gradient), and inference."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    noisy, clean = (x.cuda() for x in _batch(3, 150))
    pad = _left_padding(3, 150).long().cuda()
    out = {}
    for backend in ("sdpa", "flex"):
        model = _model(family, 7, backend).cuda()  # eval mode (no dropout), gradients still flow
        logits = training_forward(model, noisy, clean, attention_mask=pad)
        (logits.float().pow(2).mean()).backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        with torch.no_grad():
            infer = model(noisy, attention_mask=pad)
        out[backend] = (logits.detach(), grads, infer)
    (ref, ref_g, ref_i), (got, got_g, got_i) = out["sdpa"], out["flex"]
    assert (got - ref).abs().max() <= 1e-4 * ref.abs().max()
    assert (got_i - ref_i).abs().max() <= 1e-4 * ref_i.abs().max()
    assert ref_g.keys() == got_g.keys()
    for name in ref_g:
        assert (got_g[name] - ref_g[name]).abs().max() <= 1e-4 * ref_g[name].abs().max().clamp_min(1e-12), name
