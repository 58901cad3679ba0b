"""`dare-bench check --run` on real micro reproductions against the committed baselines.

Default suite: one reproduction run twice in a shared home (the unchanged tree passes; a monkeypatched, broken
sudoku grader fails on the scores it grades). `slow`: the whole committed CI set, a broken SFT loss, and a
record -> check round trip.

    .venv/bin/python -m pytest tests/check/test_check_run.py            # ~2 micro runs
    .venv/bin/python -m pytest tests/check/test_check_run.py -m slow    # the CI set and more (minutes)
"""

import json

import pytest
from typer.testing import CliRunner

from dare_bench.cli import app

FAST = "sft-llada-sudoku"  # the cheapest baselined micro run: base + 3 SFT steps + two 16-item evaluations


def _check(*args):
    result = CliRunner().invoke(app, ["check", "--json", *args])
    report = json.loads(result.stdout) if result.stdout.strip().startswith("{") else None
    return result, report


@pytest.fixture(scope="module")
def shared_home(tmp_path_factory):
    """One DARE_BENCH_HOME for this module's runs: the second run reuses the first one's SFT base."""
    return tmp_path_factory.mktemp("check_home")


def _failed(report):
    return {c["name"]: c for e in report["reproductions"] for c in e["checks"] if c["status"] != "pass"}


def _break_the_sudoku_grader(monkeypatch):
    """A plausible grader bug: the answer regex insists on the newline-delimited block of DARE's prompt format
    (`<answer>\\n...\\n</answer>`), so the compact answers of the tiny replicas no longer parse and score 0."""
    import re

    from dare_bench.tasks.graders import d1

    def strict_extract(text):
        found = re.findall(r"<answer>\n(.*?)\n</answer>", text, re.DOTALL)
        return "".join(ch for ch in found[-1] if ch.isdigit()) if found else None

    monkeypatch.setattr(d1, "sudoku_reward_extract", strict_extract)


@pytest.mark.integration
def test_the_unchanged_tree_passes_and_a_broken_grader_fails(tmp_path, shared_home, monkeypatch):
    monkeypatch.setenv("DARE_BENCH_HOME", str(shared_home))
    db = f"sqlite:///{tmp_path / 'check.db'}"
    result, report = _check(FAST, "--run", "--reuse-cache", "--db", db)
    assert result.exit_code == 0, result.output
    (entry,) = report["reproductions"]
    assert entry["status"] == "pass" and entry["run_id"] is not None
    score = next(c for c in entry["checks"] if c["name"] == "final/score")
    assert score["baseline"] > 0, "the micro set must score something, or a broken grader goes unseen"

    _break_the_sudoku_grader(monkeypatch)
    result, report = _check(FAST, "--run", "--reuse-cache", "--db", db)
    assert result.exit_code == 1, result.output
    failed = _failed(report)
    # The base evaluation is reused from the cache (graded before the break); the final one shows the break.
    assert {"final/score", "final/mean_reward"} <= set(failed)
    assert all(failed[m]["delta"] < -failed[m]["tolerance"] for m in ("final/score", "final/mean_reward"))
    assert not any(name.startswith("base/") or name.startswith("curve/") for name in failed)


@pytest.mark.slow
def test_the_ci_set_passes_on_the_unchanged_tree(tmp_path):
    result, report = _check("--run", "--db", f"sqlite:///{tmp_path / 'check.db'}")
    assert result.exit_code == 0, result.output
    assert len(report["reproductions"]) >= 4 and all(e["status"] == "pass" for e in report["reproductions"])


@pytest.mark.slow
def test_a_sign_flipped_sft_loss_fails(tmp_path, monkeypatch):
    from dare_bench.trainers import sft

    original = sft.sft_loss
    monkeypatch.setattr(sft, "sft_loss", lambda *a, **k: -original(*a, **k))
    result, report = _check(FAST, "--run", "--db", f"sqlite:///{tmp_path / 'check.db'}")
    assert result.exit_code == 1, result.output
    assert "curve/loss/mean" in _failed(report)


@pytest.mark.slow
def test_record_then_check_round_trip(tmp_path):
    directory = tmp_path / "baselines"
    db = f"sqlite:///{tmp_path / 'check.db'}"
    args = ["--baselines", str(directory), "--db", db, "--scale", "micro"]
    rec = CliRunner().invoke(app, ["check", "--record", FAST, "--seeds", "2", "-o", "base.start_step=160", *args])
    assert rec.exit_code == 0, rec.output
    doc = json.loads((directory / f"{FAST}.micro.json").read_text())
    assert doc["seeds"] == [0, 1] and len(doc["runs"]) == 2 and doc["overrides"]
    assert doc["packages"].get("torch") and doc["hardware"].get("torch_threads") == 1
    result, report = _check(FAST, "--run", *args)
    assert result.exit_code == 0, result.output


@pytest.mark.slow
def test_an_rl_loss_summed_instead_of_token_averaged_fails_on_its_gradient(tmp_path, monkeypatch):
    """The GRPO loss of a micro run is 0 by construction (mu = 1), so its value cannot show a broken loss; the
    gradient norm does: a token-sum aggregation scales it by the completion length."""
    from dare_bench.trainers.algorithms.d1 import D1

    original = D1.loss_terms

    def summed(self, logp, old_logp, ref_logp, advantages, completion_mask):
        loss, metrics = original(self, logp, old_logp, ref_logp, advantages, completion_mask)
        scale = completion_mask.sum(-1).float().mean()
        return loss * scale, {**metrics, "loss": metrics["loss"] * float(scale)}

    monkeypatch.setattr(D1, "loss_terms", summed)
    result, report = _check("d1-llada-sudoku", "--run", "--db", f"sqlite:///{tmp_path / 'check.db'}")
    assert result.exit_code == 1, result.output
    assert "curve/grad_norm/mean" in _failed(report)
