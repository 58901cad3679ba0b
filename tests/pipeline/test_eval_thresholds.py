"""`eval.thresholds`: the final model is also decoded with confidence-threshold decoding at each threshold, stored
as evaluations `final-thr<t>` (accuracy and tokens per forward: the trade CAP claims to move); bad values are
ConfigErrors at load time, and a threshold the evaluation sampler refuses fails the dry run, before any write."""

from __future__ import annotations

import pytest

from dare_bench.errors import ConfigError
from dare_bench.pipeline.evaluation import threshold_label
from dare_bench.pipeline.plan import resolve

FAST = ["base.start_step=2", "eval.limit=4"]


def test_the_final_model_is_decoded_at_each_threshold(tmp_path):
    """The llada2 block sampler's own threshold is 0.95, so `final-thr0.95` must repeat the final evaluation
    completion for completion; at threshold 1.0 no position is confident enough to commit early, so decoding is
    the step schedule's one token per forward at most."""
    from dare_bench.pipeline import reproduce
    from dare_bench.store import Store

    db = f"sqlite:///{tmp_path / 'runs.db'}"
    res = reproduce("wsd-llada2-sudoku", "micro", seed=0, db=db, overrides=[*FAST, "eval.thresholds=[0.95,1.0]"],
                    progress=False, log=lambda _: None)
    assert res.status == "finished"
    assert set(res.threshold_metrics) == {"final-thr0.95", "final-thr1"}
    store = Store(db)
    evals = {e["checkpoint"]: e for e in store.evaluations(res.run_id)}
    assert {"final", "final-thr0.95", "final-thr1"} <= set(evals)
    def measured(m):  # the metrics without the wall-clock timings
        return {k: v for k, v in m.items() if not k.endswith("_seconds")}

    assert measured(evals["final-thr0.95"]["metrics"]) == measured(evals["final"]["metrics"]) == measured(res.metrics)
    assert evals["final-thr0.95"]["sampler"]["threshold"] == 0.95 and evals["final-thr1"]["sampler"]["threshold"] == 1
    samples = {k: [s["completion"] for s in store.samples(evals[k]["id"])] for k in ("final", "final-thr0.95")}
    assert samples["final"] == samples["final-thr0.95"] and len(samples["final"]) == 4
    assert 0 < evals["final-thr1"]["metrics"]["tokens_per_forward"] <= 1.0
    assert res.threshold_metrics["final-thr1"] == evals["final-thr1"]["metrics"]


def test_labels_and_the_pinned_entries():
    assert [threshold_label(t) for t in (0.9, 0.95, 1.0)] == ["final-thr0.9", "final-thr0.95", "final-thr1"]
    for name in ("wsd-llada2-sudoku", "wsd-cap-llada2-sudoku", "bdlm-llada2-sudoku"):
        assert resolve(name, "tiny")[1].profile.eval.thresholds == [0.9, 0.95, 1.0]


def test_no_thresholds_leave_the_config_hash_as_it_was():
    """Empty (the default) is left out of the dump, so every config hash recorded before the field still holds."""
    _, cfg = resolve("sft-llada-sudoku", "micro")
    assert cfg.profile.eval.thresholds == [] and "thresholds" not in cfg.profile.eval.model_dump()
    _, with_one = resolve("sft-llada-sudoku", "micro", ["eval.thresholds=[0.9]"])
    assert with_one.content_hash != cfg.content_hash


@pytest.mark.parametrize("value,message", [("[1.5]", "in \\(0, 1\\], got 1.5"), ("[0]", "got 0"),
                                           ("[0.9,0.9]", "must be distinct")])
def test_a_threshold_out_of_range_is_a_config_error(value, message):
    with pytest.raises(ConfigError, match=f"eval.thresholds.*{message}"):
        resolve("wsd-llada2-sudoku", "micro", [f"eval.thresholds={value}"])


def test_a_threshold_the_sampler_refuses_fails_before_any_write(tmp_path):
    """LLaDA's ASS step plan fixes its own quotas: with a threshold the sampler refuses it, so resolving the run
    (what the dry run and the pipeline do first) names the threshold, and the store is never created."""
    from dare_bench.pipeline import reproduce

    overrides = ["eval.thresholds=[0.9]", "eval.sampler.extra={ass: true}"]
    with pytest.raises(ConfigError, match="eval.thresholds 0.9: ass fixes its own per-step quotas"):
        resolve("d1-llada-sudoku", "micro", overrides)
    db = tmp_path / "runs.db"
    with pytest.raises(ConfigError):
        reproduce("d1-llada-sudoku", "micro", seed=0, db=f"sqlite:///{db}", overrides=overrides, progress=False,
                  log=lambda _: None)
    assert not db.exists()


def test_thresholds_below_one_with_top_k_one_fail_before_any_write(tmp_path):
    """The block samplers' confidence is the probability after the top-k filter, 1.0 for every token under top_k 1
    (shown on `block_sample_tokens`): a threshold below 1 would commit every block in one forward, so the pinned
    entries decode without top_k and the combination is refused before any write."""
    import torch

    from dare_bench.diffusion.sampling.block import block_sample_tokens
    from dare_bench.pipeline import reproduce

    logits = torch.randn(2, 5, 11, generator=torch.Generator().manual_seed(0))
    _, conf = block_sample_tokens(logits, 1.0, 1, None, torch.Generator().manual_seed(0))
    assert torch.equal(conf, torch.ones_like(conf))
    _, conf = block_sample_tokens(logits, 1.0, None, None, torch.Generator().manual_seed(0))
    assert bool((conf < 1.0).all())
    for name in ("wsd-llada2-sudoku", "wsd-cap-llada2-sudoku", "bdlm-llada2-sudoku"):
        for scale in ("tiny", "micro"):
            assert resolve(name, scale)[1].profile.eval.sampler.top_k is None
    overrides = ["eval.sampler.top_k=1"]
    with pytest.raises(ConfigError, match=r"eval.thresholds \[0.9\] with eval.sampler.top_k 1"):
        resolve("wsd-llada2-sudoku", "micro", overrides)
    resolve("wsd-llada2-sudoku", "micro", [*overrides, "eval.thresholds=[1.0]"])  # 1.0 alone is well defined
    db = tmp_path / "runs.db"
    with pytest.raises(ConfigError):
        reproduce("wsd-llada2-sudoku", "micro", seed=0, db=f"sqlite:///{db}", overrides=overrides, progress=False,
                  log=lambda _: None)
    assert not db.exists()
