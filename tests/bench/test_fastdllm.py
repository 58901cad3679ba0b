"""`dare-bench bench fastdllm`: the side-by-side against the official Fast-dLLM code. The official code is not in
the repo (nor in CI), so these tests stand a fake clone in for it: the same layout and call signatures
(`llada/model/modeling_llada.py` `LLaDAModelLM.from_pretrained`, `llada/generate.py`
`generate_with_{prefix,dual}_cache(model, prompt[1, P], ...) -> (x, nfe)`), backed by our sampler. They check the
harness (checkpoint, interleaved timing, per-prompt official calls, the token comparison and its failure) and the
one-line errors; the real comparison is run by hand (the module docstring)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from dare_bench.errors import DareBenchError

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

MODELING = '''
from dare_bench.models import load_pretrained


class _Out:
    def __init__(self, logits):
        self.logits = logits


class LLaDAModelLM:
    @classmethod
    def from_pretrained(cls, path, torch_dtype=None):
        self = cls()
        self.inner = load_pretrained(path).float().eval()
        return self

    def eval(self):
        return self

    def __call__(self, x):
        return _Out(self.inner(x))
'''

GENERATE = '''
import torch
from dare_bench.diffusion.sampling import generate

SHIFT = {shift}


def _run(model, prompt, cache, steps, gen_length, block_length, temperature, threshold, mask_id):
    assert prompt.shape[0] == 1  # as upstream: one prompt per call
    out = generate(model.inner, prompt, gen_length=gen_length, block_length=block_length, steps=steps,
                   threshold=threshold, use_cache=cache)
    x = out.canvas[:, :prompt.shape[1] + gen_length].clone()
    x[:, prompt.shape[1]:] += SHIFT
    return x, out.stats.forwards


def generate_with_prefix_cache(model, prompt, steps=128, gen_length=128, block_length=128, temperature=0.,
                               remasking="low_confidence", mask_id=126336, threshold=None):
    return _run(model, prompt, "prefix", steps, gen_length, block_length, temperature, threshold, mask_id)


def generate_with_dual_cache(model, prompt, steps=128, gen_length=128, block_length=128, temperature=0.,
                             remasking="low_confidence", mask_id=126336, threshold=None):
    return _run(model, prompt, "dual", steps, gen_length, block_length, temperature, threshold, mask_id)
'''


def _fake_clone(root, shift=0):
    (root / "llada" / "model").mkdir(parents=True)
    (root / "llada" / "model" / "__init__.py").write_text("")
    (root / "llada" / "model" / "modeling_llada.py").write_text(textwrap.dedent(MODELING))
    (root / "llada" / "generate.py").write_text(textwrap.dedent(GENERATE.format(shift=shift)))
    return root


SMALL = dict(layers=1, hidden=128, gen_lengths=(32,), batches=(1, 2), rounds=2, prompt_length=8)


@pytest.mark.integration
def test_every_setting_is_timed_on_both_sides_and_the_tokens_compared(tmp_path):
    from dare_bench.bench.fastdllm import measure

    out = measure(_fake_clone(tmp_path / "clone"), **SMALL)
    rows = out["rows"]
    assert [(r["batch"], r["cache"], r["schedule"]) for r in rows] == [
        (b, c, s) for b in (1, 2) for c in ("prefix", "dual") for s in ("threshold", "steps")]
    for r in rows:
        assert r["same_tokens"], r
        assert r["speedup"] == pytest.approx(r["ours_tokens_per_second"] / r["official_tokens_per_second"])
        # the official side is called once per prompt: a fixed schedule makes B times one batched call's forwards
        # (threshold decoding: the rows' sum, against the batch's slowest row)
        if r["schedule"] == "steps":
            assert r["official_forwards"] == r["batch"] * r["ours_forwards"]
        else:
            assert r["ours_forwards"] <= r["official_forwards"] <= r["batch"] * r["ours_forwards"]
    assert out["settings"]["max_abs_logit_difference"] == 0.0
    assert "model" not in sys.modules and "generate" not in sys.modules  # the clone's generic names are dropped


def test_a_small_vocabulary_checkpoint_has_its_ids_at_the_end_and_runs(tmp_path):
    """`--vocab`: the layers, not the 126k-row head, make the bulk of a forward (as in the 8B original)."""
    from dare_bench.bench.fastdllm import measure, write_checkpoint
    from dare_bench.models import load_pretrained

    model = load_pretrained(str(write_checkpoint(tmp_path / "ckpt", layers=1, hidden=128, seed=0, vocab=300)))
    traits = model.traits
    assert model.output_head().weight.shape[0] == 300
    assert (traits.mask_token_id, traits.eos_token_id, traits.pad_token_id) == (299, 298, 298)
    out = measure(_fake_clone(tmp_path / "clone"), vocab=300, **{**SMALL, "batches": (2,), "rounds": 1})
    assert all(r["same_tokens"] for r in out["rows"]) and "vocabulary 300" in out["settings"]["checkpoint"]


@pytest.mark.integration
def test_other_tokens_are_reported(tmp_path):
    from dare_bench.bench.fastdllm import measure

    out = measure(_fake_clone(tmp_path / "clone", shift=1), **{**SMALL, "batches": (1,), "rounds": 1})
    assert not any(r["same_tokens"] for r in out["rows"])


def test_a_missing_clone_is_one_error(tmp_path):
    from dare_bench.bench.fastdllm import load_official

    with pytest.raises(DareBenchError, match="no llada/model/modeling_llada.py"):
        load_official(tmp_path)
    broken = _fake_clone(tmp_path / "broken")
    (broken / "llada" / "generate.py").write_text("import not_a_module_anywhere\n")
    with pytest.raises(DareBenchError, match="does not import here .*transformers 4.46"):
        load_official(broken)


@pytest.mark.parametrize("args, message", [
    (["--gen-lengths", "40"], "multiple of the block length 32"),
    (["--batches", "0"], "each must be >= 1"),
    (["--checkpoint", "/nonexistent", "--vocab", "512"], "--vocab shapes the shrunk checkpoint"),
])
def test_bad_options_are_one_line(tmp_path, args, message):
    res = subprocess.run([sys.executable, "-m", "dare_bench.cli", "bench", "fastdllm", "--official",
                          str(_fake_clone(tmp_path / "clone")), *args], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode != 0 and len(lines) == 1 and message in lines[0], res.stderr
