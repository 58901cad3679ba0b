"""Sampler forwards compute identical canvas rows once (diffusion/sampling/core.py `shared_rows_forward`, issue #16
item 4). These tests hold it to the plain forward bit for bit (logits and hidden states, with per-row padding
masks), to the same tokens and forward counts through `generate` for an RL-style batch (each prompt `group` times,
sampling at T > 0), to the compute meter's count, and check where it must not apply (a KV cache without the rows'
history). Block diffusion's exact block cache hands each row's history (its canvas): identical rows share the
forward and the cache update, bit for bit (SDAR); models with routed experts (LLaDA2) and matmuls under 16 rows are
never shared, whose kernels depend on the batch."""

from __future__ import annotations

import contextlib

import pytest
import torch

from dare_bench.bench.rollout import peaked_init
from dare_bench.diffusion.sampling import generate
from dare_bench.diffusion.sampling.core import computing_every_row, model_logits, shared_rows_forward
from dare_bench.trainers.compute import ComputeMeter

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module", params=["tiny-llada", "tiny-dream"])
def model(request):
    from dare_bench.models import load_pretrained

    m = load_pretrained(request.param)
    peaked_init(m, seed=0, head_scale=10.0)
    return m.eval()


def _rows(model):
    """Six rows, four distinct inputs: rows 0/2/5 equal, rows 1/4 equal in ids but row 4 left-padded."""
    vocab = int(model.config.get("vocab_size") or model.config["embedding_size"])
    g = torch.Generator().manual_seed(3)
    a, b, c = (torch.randint(5, vocab, (1, 10), generator=g) for _ in range(3))
    ids = torch.cat([a, b, a, c, b, a])
    mask = torch.ones_like(ids)
    mask[4, :2] = 0
    return ids, mask


@torch.no_grad()
def test_shared_rows_give_the_plain_forward_bit_for_bit(model):
    ids, mask = _rows(model)
    out, shared = shared_rows_forward(model, ids, {"attention_mask": mask})
    assert shared == 2  # rows 2 and 5 reuse row 0; row 4 differs from row 1 in its padding mask
    assert torch.equal(out, model_logits(model, ids, attention_mask=mask))
    hidden, shared = shared_rows_forward(model, ids, {"attention_mask": mask, "return_hidden": True})
    plain = model(ids, attention_mask=mask, return_hidden=True)
    assert shared == 2 and torch.equal(hidden.states, plain.states) and hidden.head is not None
    with computing_every_row():  # the reference path: nothing shared
        assert shared_rows_forward(model, ids, {"attention_mask": mask})[1] == 0
    assert shared_rows_forward(model, ids[:1], {})[1] == 0  # one row: nothing to share
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 kernels depend on the batch: computed whole
        assert shared_rows_forward(model, ids, {"attention_mask": mask})[1] == 0


@torch.no_grad()
def test_a_kv_cache_forward_without_the_rows_history_is_never_shared(model):
    ids, _ = _rows(model)
    cache = model.new_kv_cache()
    out, shared = shared_rows_forward(model, ids, {"kv_cache": cache, "update_cache": True})
    assert shared == 0 and len(cache) == ids.shape[1] and out.shape[0] == ids.shape[0]


def _every_and_shared(model, prompts, kw):
    """(output, counted token forwards) of `generate` with every row computed, then with rows shared, same seed."""
    runs = []
    for every in (True, False):
        with ComputeMeter(model) as meter, computing_every_row() if every else contextlib.nullcontext():
            out = generate(model, prompts, generator=torch.Generator().manual_seed(7), **kw)
        runs.append((out, meter.token_forwards))
    return runs


def test_generate_group_copies_same_tokens_fewer_rows_same_counted_compute():
    from dare_bench.models import load_pretrained

    model = load_pretrained("tiny-llada")
    peaked_init(model, seed=0, head_scale=10.0)
    model.eval()
    prompts = torch.randint(5, 26, (2, 6), generator=torch.Generator().manual_seed(0)).repeat_interleave(4, dim=0)
    kw = dict(gen_length=12, steps=12, temperature=0.6, remasking="low_confidence")
    (every, every_tokens), (shared, shared_tokens) = _every_and_shared(model, prompts, kw)
    assert torch.equal(every.sequences, shared.sequences)
    assert every.stats.forwards == shared.stats.forwards == 12
    assert every.stats.row_forwards == shared.stats.row_forwards == 12 * 8
    assert every.stats.token_forwards == shared.stats.token_forwards == every_tokens == shared_tokens
    assert every.stats.shared_rows == 0
    # at least the first step: four identical canvases per prompt, two rows computed instead of eight
    assert shared.stats.shared_rows >= 6


def test_the_premise_float32_linear_rows_do_not_depend_on_the_batch_from_16_rows():
    """What sharing rests on, checked on the machine that runs it: a float32 linear layer's row is the same bits
    in any batch of 16 rows or more (fewer rows, and bfloat16, take other kernels: core.py)."""
    from dare_bench.diffusion.sampling.core import MIN_SHARED_MATMUL_ROWS

    g = torch.Generator().manual_seed(0)
    for k, n in ((64, 64), (256, 1024), (1024, 4096), (4096, 512)):
        w, x = torch.randn(n, k, generator=g), torch.randn(160, k, generator=g)
        full = torch.nn.functional.linear(x, w)
        for m in range(MIN_SHARED_MATMUL_ROWS, 160, 7):
            assert torch.equal(torch.nn.functional.linear(x[:m], w), full[:m]), (k, n, m)


def _history_rows(n=14):
    """Six rows of `n` tokens, three distinct: rows 0 / 2 / 5 equal, rows 1 / 4 equal."""
    g = torch.Generator().manual_seed(3)
    a, b, c = (torch.randint(5, 1000, (1, n), generator=g) for _ in range(3))
    return torch.cat([a, b, a, c, b, a])


@torch.no_grad()
def test_a_cache_forward_with_the_rows_history_is_shared_bit_for_bit():
    from dare_bench.models import load_pretrained

    model = load_pretrained("tiny-sdar")
    peaked_init(model, seed=0, head_scale=10.0)
    model.eval()
    ids = _history_rows()
    prefix, block = ids[:, :6], ids[:, 6:]  # the shared forwards: 3 rows x 6 and 3 rows x 8 tokens (>= 16)
    caches = {}
    for name in ("plain", "shared"):
        cache = model.new_kv_cache()
        pos = torch.arange(6, 14).expand(6, 8)
        if name == "plain":
            model_logits(model, prefix, kv_cache=cache, update_cache=True)
            out = model_logits(model, block, position_ids=pos, kv_cache=cache, update_cache=True)
        else:
            _, shared = shared_rows_forward(model, prefix, {"kv_cache": cache, "update_cache": True},
                                            history=prefix)
            assert shared == 3
            out, shared = shared_rows_forward(model, block, {"position_ids": pos, "kv_cache": cache,
                                                             "update_cache": True}, history=ids)
            assert shared == 3  # rows 2 / 5 repeat row 0 and row 4 row 1
        caches[name] = (out, cache)
    (plain, plain_cache), (shared, shared_cache) = caches["plain"], caches["shared"]
    assert torch.equal(plain, shared)
    assert len(plain_cache) == len(shared_cache) == 14
    for a, b in zip(plain_cache.keys + plain_cache.values, shared_cache.keys + shared_cache.values):
        assert torch.equal(a, b)
    # too few rows for the matmuls' row-independent kernels: computed whole
    few = model.new_kv_cache()
    assert shared_rows_forward(model, ids[:, :4], {"kv_cache": few, "update_cache": True}, history=ids[:, :4])[1] == 0


@pytest.mark.parametrize("preset,block", [("tiny-sdar", 4), ("tiny-llada2", 8)])
def test_block_rollouts_share_rows_under_the_exact_cache_on_dense_models(preset, block):
    from dare_bench.models import load_pretrained

    model = load_pretrained(preset)
    peaked_init(model, seed=0, head_scale=10.0)
    model.eval()
    family = preset.split("-")[1]
    prompts = torch.randint(5, 4000, (4, 2 * block + 2), generator=torch.Generator().manual_seed(0))
    prompts = prompts.repeat_interleave(4, dim=0)  # an RL group: each prompt 4 times
    kw = dict(gen_length=3 * block, block_length=block, denoising_steps=block // 2, convention=family,
              stop_at_eos=False, temperature=0.7, use_cache="exact")
    (every, every_tokens), (shared, shared_tokens) = _every_and_shared(model, prompts, kw)
    assert torch.equal(every.canvas, shared.canvas) and torch.equal(every.sequences, shared.sequences)
    assert every.stats.forwards == shared.stats.forwards
    assert every.stats.token_forwards == shared.stats.token_forwards == every_tokens == shared_tokens
    assert every.stats.shared_rows == 0
    if preset == "tiny-llada2":  # routed experts: an expert's rows depend on the batch (core.py), never shared
        assert shared.stats.shared_rows == 0
    else:
        assert shared.stats.shared_rows >= 12  # at least the prefill
