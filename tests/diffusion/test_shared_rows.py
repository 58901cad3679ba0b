"""Sampler forwards compute identical canvas rows once (diffusion/sampling/core.py `shared_rows_forward`, issue #16
item 4). These tests hold it to the plain forward bit for bit (logits and hidden states, with per-row padding
masks), to the same tokens and forward counts through `generate` for an RL-style batch (each prompt `group` times,
sampling at T > 0), to the compute meter's count, and check where it must not apply (a KV cache)."""

from __future__ import annotations

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


@torch.no_grad()
def test_a_forward_with_a_kv_cache_is_never_shared(model):
    ids, _ = _rows(model)
    cache = model.new_kv_cache()
    out, shared = shared_rows_forward(model, ids, {"kv_cache": cache, "update_cache": True})
    assert shared == 0 and len(cache) == ids.shape[1] and out.shape[0] == ids.shape[0]


def test_generate_group_copies_same_tokens_fewer_rows_same_counted_compute():
    from dare_bench.models import load_pretrained

    model = load_pretrained("tiny-llada")
    peaked_init(model, seed=0, head_scale=10.0)
    model.eval()
    prompts = torch.randint(5, 26, (2, 6), generator=torch.Generator().manual_seed(0)).repeat_interleave(4, dim=0)
    kw = dict(gen_length=12, steps=12, temperature=0.6, remasking="low_confidence")
    runs = {}
    for name in ("every", "shared"):
        with ComputeMeter(model) as meter:
            if name == "every":
                with computing_every_row():
                    out = generate(model, prompts, generator=torch.Generator().manual_seed(7), **kw)
            else:
                out = generate(model, prompts, generator=torch.Generator().manual_seed(7), **kw)
        runs[name] = (out, meter.token_forwards)
    (every, every_tokens), (shared, shared_tokens) = runs["every"], runs["shared"]
    assert torch.equal(every.sequences, shared.sequences)
    assert every.stats.forwards == shared.stats.forwards == 12
    assert every.stats.row_forwards == shared.stats.row_forwards == 12 * 8
    assert every.stats.token_forwards == shared.stats.token_forwards == every_tokens == shared_tokens
    assert every.stats.shared_rows == 0
    # at least the first step: four identical canvases per prompt, two rows computed instead of eight
    assert shared.stats.shared_rows >= 6
