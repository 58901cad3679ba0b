"""Honest scales: a task offers the scales it can be reproduced at (`Task.scales`), and the tiny grid is complete.

gsm8k / math500 / humaneval / mbpp entries are paper-only (a tiny replica cannot learn them) and name their CPU-scale
stand-in; arith / pyfunc entries are tiny / micro only. Every algorithm with a plug-in has a tiny entry on every
backbone it supports for every CPU-scale task, plus baseline, sft and lora per backbone x task.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dare_bench import catalogue
from dare_bench.cli import app
from dare_bench.errors import ConfigError
from dare_bench.registry import load_registry
from dare_bench.registry.loader import load_file
from dare_bench.tasks import get_task

CPU_TASKS = ("sudoku", "countdown", "arith", "pyfunc")
PAPER_ONLY = {"gsm8k": "arith", "math500": "arith", "humaneval": "pyfunc", "mbpp": "pyfunc"}


@pytest.fixture(scope="module")
def registry():
    return load_registry()


def test_real_benchmarks_are_paper_only_and_name_an_existing_stand_in(registry):
    seen = 0
    for spec in registry:
        if spec.task not in PAPER_ONLY or spec.algorithm == "released":  # released: the next test
            continue
        seen += 1
        assert set(spec.scales) <= {"paper", "official"}, spec.name
        for scale in ("tiny", "micro"):
            with pytest.raises(ConfigError) as err:
                spec.resolve(scale)
            msg = str(err.value)
            stand_in = f"{spec.algorithm}-{spec.backbone}-{PAPER_ONLY[spec.task]}"
            assert f"{spec.task} has no {scale} scale" in msg and f"dare-bench reproduce {stand_in}" in msg
            assert stand_in in registry.names(), f"{spec.name} names {stand_in}, which does not exist"
    assert seen >= 90


def test_a_released_checkpoint_names_its_shrunk_cpu_path(registry):
    """An evaluation of a released checkpoint has no replica scale: its CPU path is the suite on shrunk weights."""
    specs = [s for s in registry if s.algorithm == "released"]
    assert specs
    for spec in specs:
        assert list(spec.scales) == ["paper"], spec.name
        with pytest.raises(ConfigError) as err:
            spec.resolve("tiny")
        assert f"dare-bench eval-suite {spec.backbone} --shrunk --benchmarks {spec.task}" in str(err.value)


def test_procedural_tasks_are_tiny_and_micro_only(registry):
    for task, scales in (("arith", {"tiny", "micro"}), ("pyfunc", {"tiny", "micro"})):
        specs = [s for s in registry if s.task == task]
        assert specs
        for spec in specs:
            assert set(spec.scales) == scales, spec.name
            with pytest.raises(ConfigError, match=f"{task} has no paper scale"):
                spec.resolve("paper")


def test_code_tasks_name_pyfunc_at_tiny_scale(registry):
    with pytest.raises(ConfigError) as err:
        registry.get("d1-llada-humaneval").resolve("tiny")
    assert str(err.value) == ("humaneval has no tiny scale (a tiny replica cannot learn HumanEval); for CPU-scale "
                              "code RL use `pyfunc`: dare-bench reproduce d1-llada-pyfunc")


def test_the_exact_message_of_the_issue(registry):
    with pytest.raises(ConfigError) as err:
        registry.get("d1-llada-gsm8k").resolve("tiny")
    assert str(err.value) == ("gsm8k has no tiny scale (a tiny replica cannot learn GSM8K); for CPU-scale math RL "
                              "use `arith`: dare-bench reproduce d1-llada-arith")


def test_a_file_that_names_a_scale_its_task_lacks_is_refused(tmp_path):
    import shutil

    from dare_bench.registry.loader import default_directory

    shutil.copytree(default_directory() / "_defaults", tmp_path / "_defaults")
    path = tmp_path / "sft-llada-gsm8k.yaml"
    path.write_text("name: sft-llada-gsm8k\nalgorithm: sft\nbackbone: llada\ntask: gsm8k\npaper_ref: x\n"
                    "scales:\n  tiny:\n    eval: {limit: 10}\n")
    with pytest.raises(ConfigError, match="gsm8k has no tiny scale"):
        load_file(path)


def test_reproduce_at_a_missing_scale_is_one_line_and_writes_nothing(tmp_path):
    import os
    import subprocess
    import sys

    db = tmp_path / "runs.db"
    res = subprocess.run([sys.executable, "-m", "dare_bench.cli", "reproduce", "d1-llada-humaneval", "--scale",
                          "micro", "--db", str(db)], capture_output=True, text=True,
                         env={**os.environ, "DARE_BENCH_HOME": str(tmp_path / "home")})
    assert res.returncode != 0
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "dare-bench reproduce d1-llada-pyfunc" in lines[0], res.stderr
    assert not db.exists() and not (tmp_path / "home").exists()


def _plugin_algorithms_for(backbone: str) -> list[str]:
    from dare_bench.trainers.algorithms.base import get_algorithm

    attention = catalogue.backbone(backbone).attention
    return [name for name, spec in catalogue.algorithms().items()
            if spec.plugin is not None and attention in get_algorithm(name).attention_kinds]


def test_the_tiny_grid_is_complete(registry):
    missing = []
    # a further released checkpoint of a family (sdar30b, llada2.1) shares the family's replica: no grid of its own
    for backbone in (b.name for b in catalogue.BACKBONES if not b.is_variant):
        for task in CPU_TASKS:
            for algorithm in ["baseline", "sft", "lora", *_plugin_algorithms_for(backbone)]:
                name = f"{algorithm}-{backbone}-{task}"
                if name not in registry.names():
                    missing.append(name)
                elif "tiny" not in registry.get(name).scales:
                    missing.append(f"{name} (no tiny scale)")
    assert not missing, missing


def test_list_json_reports_the_scales(registry):
    out = CliRunner().invoke(app, ["list", "--task", "arith", "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert rows and all(r["scales"] == ["tiny", "micro"] for r in rows)


def test_task_scales_are_declared_consistently():
    for name in ("gsm8k", "math500", "humaneval", "mbpp"):
        task = get_task(name)
        assert task.scales == ("paper",) and task.cpu_stand_in is not None
        stand_in = get_task(task.cpu_stand_in[0])
        assert stand_in.scales == ("tiny", "micro")
    assert get_task("sudoku").scales == ("paper", "tiny", "micro")


def test_calibrated_base_recipes_show_their_scan():
    """A backbone x task base recipe states the command that scanned it and what it chose: the start step (fixed
    rule), or the validation target and the step the rule took on the calibrating machine (target rule)."""
    from dare_bench.registry.loader import default_directory

    files = sorted((default_directory() / "_defaults" / "backbone-tasks").glob("*.yaml"))
    assert files
    for path in files:
        backbone, task = path.stem.rsplit("-", 1)
        assert backbone in catalogue.backbone_names() and get_task(task).offers_scale("tiny"), path.name
        text = path.read_text()
        assert f"dare-bench calibrate sft-{backbone}-{task}" in text, f"{path.name}: no scan command"
        from dare_bench.pipeline.plan import resolve

        base = resolve(f"sft-{backbone}-{task}", "tiny")[1].profile.base.model_dump()  # with every layer under it
        header = text.split("scales:")[0]
        if base.get("target"):
            assert f"value {base['target']['value']:g}" in header, f"{path.name}: the scan does not show the target"
            assert "rule's step" in header, f"{path.name}: the scan does not show the step the rule took"
        else:
            start = base["start_step"]
            assert f"{start}" in header, f"{path.name}: the scan does not show step {start}"
