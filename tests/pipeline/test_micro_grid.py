"""Every distinct (algorithm, backbone, task kind) of the registry runs end to end at micro scale (slow: ~60 runs).

Task kinds are DARE's: "math" (answer extraction; sudoku, countdown, arith) and "code" (hidden tests through the
sandbox; pyfunc). For each combination the first runnable entry is run (arith for math, then sudoku, countdown;
pyfunc for code); an entry the registry marks not runnable (no plug-in yet) is skipped by the selection, not here.

    pytest -m slow tests/pipeline/test_micro_grid.py
"""

from __future__ import annotations

import pytest

from dare_bench.registry import load_registry
from dare_bench.registry.runnable import why_not_runnable
from dare_bench.tasks import get_task

PREFERENCE = {"math": ("arith", "sudoku", "countdown"), "code": ("pyfunc",)}


def _combinations() -> list[str]:
    registry = load_registry()
    chosen: dict[tuple[str, str, str], str] = {}
    for kind, tasks in PREFERENCE.items():
        for task in tasks:
            for spec in registry.select(task=task):
                key = (spec.algorithm, spec.backbone, kind)
                if key in chosen or "micro" not in spec.scales:
                    continue
                if why_not_runnable(spec, "micro", gpu=False) is None:
                    chosen[key] = spec.name
    return sorted(chosen.values())


COMBINATIONS = _combinations()


def test_the_selection_covers_every_backbone_and_both_kinds():
    names = set(COMBINATIONS)
    assert len(names) >= 50
    for backbone in ("llada", "dream", "sdar", "llada2"):
        assert any(f"-{backbone}-pyfunc" in n for n in names) and any(f"-{backbone}-arith" in n for n in names)
    assert {get_task(n.rsplit("-", 1)[1]).kind for n in names} == {"math", "code"}


@pytest.mark.slow
@pytest.mark.parametrize("name", COMBINATIONS)
def test_micro_run(name, tmp_path_factory, monkeypatch):
    from dare_bench.pipeline import reproduce

    shared = tmp_path_factory.getbasetemp() / "micro-grid"  # one home (cached bases) and store for the grid
    shared.mkdir(exist_ok=True)
    monkeypatch.setenv("DARE_BENCH_HOME", str(shared / "home"))
    db = shared / "runs.db"
    result = reproduce(name, "micro", seed=0, db=f"sqlite:///{db}", progress=False, log=lambda _: None)
    assert result.status == "finished", result.message
    assert result.metric in result.metrics and result.metric in result.base_metrics
    spec = load_registry().get(name)
    if spec.scales["micro"].train.kind != "none":
        assert result.final_model is not None
