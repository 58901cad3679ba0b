"""The plan resolves `train.data`: sources and fingerprints in the config hash, a missing file refused before the
store is touched, the sources listed in dry-run plans; and `--checkpoint` refused at the replica scales."""

import shutil

import pytest

from dare_bench.errors import ConfigError, DataError
from dare_bench.pipeline.plan import check_checkpoint_option, local_plan, resolve

from testpaths import DARE_DATA

SUDOKU_TRAIN = DARE_DATA / "rl" / "train" / "sudoku-n20000_1.parquet"


def _dare_dir(root):
    (root / "rl" / "train").mkdir(parents=True)
    shutil.copy(SUDOKU_TRAIN, root / "rl" / "train" / SUDOKU_TRAIN.name)
    return root


def test_generator_and_dare_data_hash_differently_the_same_files_the_same(tmp_path, monkeypatch):
    monkeypatch.delenv("DARE_BENCH_DATA", raising=False)
    _, generated = resolve("d1-llada-sudoku", "micro")
    assert [d.entry for d in generated.data] == ["sudoku"]
    assert generated.data[0].source.startswith("generator:sudoku(")
    monkeypatch.setenv("DARE_BENCH_DATA", str(_dare_dir(tmp_path / "a")))
    _, dare_a = resolve("d1-llada-sudoku", "micro")
    monkeypatch.setenv("DARE_BENCH_DATA", str(_dare_dir(tmp_path / "b")))
    _, dare_b = resolve("d1-llada-sudoku", "micro")
    assert dare_a.data[0].source != dare_b.data[0].source
    assert dare_a.content_hash == dare_b.content_hash != generated.content_hash
    # the recipe fields are the same: only the data section differs
    assert dare_a.profile == generated.profile


def test_overrides_that_change_nothing_leave_a_run_unmodified(monkeypatch):
    monkeypatch.delenv("DARE_BENCH_DATA", raising=False)
    _, cfg = resolve("d1-llada-sudoku", "micro", ["train.lr=2.0e-5"])
    assert cfg.data and not cfg.modified
    _, cfg = resolve("d1-llada-sudoku", "micro", ["train.data=[generator:7]"])
    assert cfg.modified and cfg.data[0].source.startswith("generator:sudoku(seed=7")


def test_missing_data_fails_at_plan_time_before_the_store(tmp_path, monkeypatch):
    from dare_bench.pipeline import reproduce

    monkeypatch.setenv("DARE_BENCH_DATA", str(tmp_path / "empty"))
    db = tmp_path / "runs.db"
    with pytest.raises(DataError, match=r"train.data entry 'math': no file at .*math_1.parquet"):
        reproduce("d1-llada-gsm8k", "paper", db=f"sqlite:///{db}", progress=False, log=lambda m: None)
    with pytest.raises(DataError, match="DARE_BENCH_DATA"):
        reproduce("d1-llada-gsm8k", "paper", dry_run=True, progress=False, log=lambda m: None)
    assert not db.exists()


def test_paper_gsm8k_and_math500_train_on_the_same_dare_math_then_gsm8k(monkeypatch):
    monkeypatch.setenv("DARE_BENCH_DATA", str(DARE_DATA))
    _, cfg = resolve("d1-llada-gsm8k", "paper")
    assert [(d.entry, d.source.rsplit("/", 1)[-1]) for d in cfg.data] == [
        ("math", "math_1.parquet"), ("gsm8k", "gsm8k_1.parquet")]
    assert resolve("d1-llada-math500", "paper")[1].data == cfg.data


def test_local_plan_lists_the_resolved_sources(monkeypatch):
    monkeypatch.delenv("DARE_BENCH_DATA", raising=False)
    _, cfg = resolve("sft-llada-sudoku", "micro")
    plan = local_plan(cfg)
    assert plan["data"] == [d.model_dump() for d in cfg.data] and plan["data"][0]["entry"] == "sudoku"
    assert plan["config"]["data"] == plan["data"]


def test_checkpoint_option_only_at_the_real_scales():
    check_checkpoint_option("paper", "/ckpt/LLaDA-8B-Instruct")
    check_checkpoint_option("official", "/ckpt/LLaDA-8B-Instruct")
    check_checkpoint_option("micro", None)
    for scale in ("tiny", "micro"):
        with pytest.raises(ConfigError, match=f"--checkpoint applies to --scale paper or official; --scale {scale}"):
            check_checkpoint_option(scale, "/ckpt/LLaDA-8B-Instruct")


def _cli(args, tmp_path):
    """`dare-bench ...` in a subprocess: (returncode, stderr lines), and whether the store file appeared."""
    import os
    import subprocess
    import sys

    db = tmp_path / "runs.db"
    res = subprocess.run([sys.executable, "-m", "dare_bench.cli", *args, "--db", f"sqlite:///{db}"],
                         capture_output=True, text=True, env={**os.environ, "DARE_BENCH_HOME": str(tmp_path / "h")})
    return res.returncode, [line for line in res.stderr.splitlines() if line.strip()], db.exists()


def _bad_files(tmp_path):
    import json

    wrong = tmp_path / "wrong_columns.jsonl"
    wrong.write_text(json.dumps({"foo": 1, "bar": 2}) + "\n")
    no_tests = tmp_path / "no_tests.jsonl"
    row = {"data_source": "pyfunc", "prompt": [{"role": "user", "content": "write f"}],
           "reward_model": {"style": "rule", "ground_truth": ""},
           "extra_info": {"index": 0, "split": "train", "task": "code", "name": "f", "docstring": "f(1)==2"}}
    no_tests.write_text(json.dumps(row) + "\n")
    return wrong, no_tests


@pytest.mark.parametrize("case", ["unknown entry", "wrong columns", "code row without tests", "knob out of range",
                                  "unknown knob", "validation set larger than the training split"])
def test_bad_training_input_is_one_line_and_writes_nothing(case, tmp_path):
    """The issue's bad inputs: each one error line, exit != 0, no store (and no tiny base) written."""
    wrong, no_tests = _bad_files(tmp_path)
    name, override, message = {
        "unknown entry": ("d1-llada-arith", "train.data=[arithh]", "did you mean 'arith'?"),
        "wrong columns": ("d1-llada-arith", f"train.data=[{wrong}]", "rows need question and answer"),
        "code row without tests": ("d1-llada-pyfunc", f"train.data=[{no_tests}]", "not a JSON list of asserts"),
        "knob out of range": ("d1-llada-arith", "task_options.steps=9", "steps must be an integer in 1..4"),
        "unknown knob": ("d1-llada-pyfunc", "task_options.steps=2", "has no option 'steps'"),
        # sudoku's train split has 20000 puzzles: holding out 15000 leaves too few for the base's SFT
        "validation set larger than the training split": (
            "d1-llada-sudoku", "base.target.validation_items=15000",
            "validation_items 15000 needs at least 30000 training items; sudoku has 20000"),
    }[case]
    scale = "tiny" if case.startswith("validation") else "micro"  # micro bases take a fixed step: no validation set
    code, lines, wrote = _cli(["reproduce", name, override, "--scale", scale], tmp_path)  # a real run
    assert code != 0 and len(lines) == 1 and message in lines[0], lines
    assert not wrote and not (tmp_path / "h").exists()


def test_task_options_reach_training_and_evaluation(monkeypatch):
    """`task_options` configures the generator for both splits; the run's hash records it."""
    monkeypatch.delenv("DARE_BENCH_DATA", raising=False)
    _, default = resolve("d1-llada-arith", "micro")
    _, easy = resolve("d1-llada-arith", "micro", ["task_options.steps=1", "task_options.max_operand=40"])
    assert default.content_hash != easy.content_hash and default.data != easy.data
    task = easy.run_task()
    assert task.steps == 1 and default.run_task().steps == 2
    assert {len(i.extra["problem"].split()) for i in task.load("test", limit=20).items} == {2}  # start + 1 op
    from dare_bench.tasks import get_task

    assert get_task("arith").steps == 2  # the registered instance is not changed


def test_the_result_carries_the_entry_s_primary_metric():
    """The summaries and the per-seed table read `ReproduceResult.metric`: pyfunc's is pass@1, not accuracy."""
    from dare_bench.pipeline import reproduce

    assert reproduce("d1-llada-pyfunc", "micro", dry_run=True, log=lambda _: None).metric == "pass@1"
    assert reproduce("d1-llada-arith", "micro", dry_run=True, log=lambda _: None).metric == "accuracy"
