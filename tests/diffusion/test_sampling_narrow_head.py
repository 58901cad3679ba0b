"""The LLaDA sampler's narrowed steps (issue #15 item 6): at temperature 0 with low-confidence remasking a step
computes the LM head and the confidence softmax only at the positions it may commit. These tests hold it to the
reference path (the head over the whole window, as upstream), token for token and forward for forward, with and
without the Fast-dLLM caches, fixed quotas and threshold, left padding; and check where it must not apply."""

from __future__ import annotations

import pytest
import torch

from dare_bench.bench.rollout import peaked_init
from dare_bench.diffusion.sampling import generate
from dare_bench.diffusion.sampling import llada as llada_sampler

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def llada():
    from dare_bench.models import load_pretrained

    m = load_pretrained("tiny-llada")
    peaked_init(m, seed=0, head_scale=10.0)
    return m.eval()


class HeadRows:
    """Counts the rows the sampler applies the LM head to (`OutputHead.logits`; the model's own forward applies
    its head inline, so the reference path counts none)."""

    def __init__(self, monkeypatch):
        from dare_bench.models.lm_head import OutputHead

        self.rows = 0

        counter, logits = self, OutputHead.logits

        def counting(head, hidden):
            counter.rows += hidden.shape[:-1].numel()
            return logits(head, hidden)

        monkeypatch.setattr(OutputHead, "logits", counting)


def _batch(llada):
    a = torch.randint(0, 500, (1, 5), generator=torch.Generator().manual_seed(1))
    b = torch.randint(0, 500, (1, 9), generator=torch.Generator().manual_seed(2))
    batch = torch.full((2, 9), llada.traits.pad_token_id)
    batch[0, 4:], batch[1] = a[0], b[0]
    return batch, (torch.arange(9)[None] >= torch.tensor([[4], [0]])).long()


SETTINGS = [
    dict(gen_length=32, block_length=8, steps=32),
    dict(gen_length=32, block_length=8, steps=16),
    dict(gen_length=32, block_length=8, threshold=0.9),
    dict(gen_length=32, block_length=8, threshold=0.9, use_cache="prefix"),
    dict(gen_length=32, block_length=8, threshold=0.9, use_cache="dual"),
    dict(gen_length=32, block_length=8, steps=16, use_cache="prefix"),
    dict(gen_length=32, block_length=8, steps=16, use_cache="dual"),
    dict(gen_length=32, block_length=16, threshold=0.7, use_cache="dual", eoser=True),
]


@pytest.mark.parametrize("settings", SETTINGS, ids=["vanilla", "quota-2", "threshold", "prefix", "dual",
                                                    "prefix-quota", "dual-quota", "dual-eoser"])
def test_narrowed_steps_commit_the_reference_path_s_tokens(llada, settings, monkeypatch):
    batch, am = _batch(llada)
    narrowed_rows = HeadRows(monkeypatch)
    narrowed = generate(llada, batch, am, **settings)
    narrowed_count = narrowed_rows.rows
    # the reference: the head over every window, as upstream (a model whose head cannot be applied to rows)
    monkeypatch.setattr(llada_sampler, "_has_plain_head", lambda model: False)
    reference = generate(llada, batch, am, **settings)
    assert torch.equal(narrowed.sequences, reference.sequences)
    assert narrowed.stats.forwards == reference.stats.forwards
    assert narrowed.stats.token_forwards == reference.stats.token_forwards
    # the narrowed path did run: the head saw only commit candidates, far fewer rows than the windows have
    assert 0 < narrowed_count < reference.stats.token_forwards / 2


@pytest.mark.parametrize("settings", [
    dict(gen_length=16, block_length=8, steps=16, temperature=0.9),       # Gumbel noise over the whole window
    dict(gen_length=16, block_length=8, steps=16, remasking="random"),    # random confidences, window-shaped
    dict(gen_length=16, block_length=8, steps=16, cfg_scale=1.0),         # two forwards mixed per position
], ids=["temperature", "random-remasking", "cfg"])
def test_random_or_guided_steps_keep_the_whole_window(llada, settings, monkeypatch):
    """Draws whose random-number stream depends on the window's shape (and CFG) are never narrowed: the head sees
    every window position of every forward."""
    rows = HeadRows(monkeypatch)
    out = generate(llada, torch.randint(0, 500, (1, 6), generator=torch.Generator().manual_seed(0)),
                   generator=torch.Generator().manual_seed(3), **settings)
    assert rows.rows == 0 and out.stats.forwards > 0  # the model's own forward applied its head, not the sampler


def test_a_recorded_trajectory_keeps_the_whole_window(llada, monkeypatch):
    """A trajectory records the proposal of every masked window position (MDPO reads them): not narrowed."""
    rows = HeadRows(monkeypatch)
    out = generate(llada, torch.randint(0, 500, (1, 6), generator=torch.Generator().manual_seed(0)),
                   gen_length=16, block_length=8, steps=16, return_trajectory=True)
    assert rows.rows == 0 and out.trajectory is not None
