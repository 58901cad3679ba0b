"""The dry run of every registry entry at every scale it declares either passes or fails for the documented reason
that `dare-bench list --runnable` gives (no plug-in, GPU-only, missing data, not built), and the two agree: no
entry is listed as runnable whose plan fails, none as not runnable whose plan passes."""

import pytest

from dare_bench.errors import DareBenchError
from dare_bench.registry import load_registry
from dare_bench.registry.runnable import why_not_runnable

from testpaths import DARE_DATA


@pytest.fixture(autouse=True)
def _dare_data(monkeypatch):
    monkeypatch.setenv("DARE_BENCH_DATA", str(DARE_DATA))


def _plan_error(name: str, scale: str) -> str | None:
    from dare_bench.pipeline.plan import resolve

    try:
        resolve(name, scale)
    except DareBenchError as exc:
        return str(exc)
    return None


def test_every_entry_at_every_scale_plans_or_says_why():
    reg = load_registry()
    disagree, reasons = [], {}
    for name in sorted(reg.specs):
        spec = reg.get(name)
        for scale in spec.scales:
            verdict = why_not_runnable(spec, scale, gpu=True)  # the plan itself needs no GPU
            error = _plan_error(name, scale)
            if (verdict is None) != (error is None):
                disagree.append((name, scale, verdict, error))
            if verdict is not None:
                reasons[verdict[0]] = reasons.get(verdict[0], 0) + 1
    assert not disagree, disagree[:5]
    assert set(reasons) <= {"no plug-in", "missing data", "not built"}
    assert "missing data" in reasons  # today: DARE's code RL sets (every RL algorithm has its plug-in)


def test_paper_without_a_gpu_is_gpu_only():
    spec = load_registry().get("d1-llada-gsm8k")
    assert why_not_runnable(spec, "paper", gpu=False)[0] == "GPU-only"
    assert why_not_runnable(load_registry().get("d1-llada-arith"), "micro", gpu=False) is None


def test_list_runnable_json_reports_every_scale():
    import json

    from typer.testing import CliRunner

    from dare_bench.cli import app

    r = CliRunner().invoke(app, ["list", "--runnable", "--json", "--task", "sudoku", "--backbone", "llada"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert rows and all(set(row["runnable"]) == set(row["scales"]) for row in rows)
    d1 = next(row for row in rows if row["name"] == "d1-llada-sudoku")
    assert d1["runnable"]["micro"] is None and d1["runnable"]["tiny"] is None
