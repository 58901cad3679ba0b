"""`dare-bench eval` / `dare-bench score` through the real CLI app (Typer CliRunner)."""

import json

import pytest
from typer.testing import CliRunner

from dare_bench.cli import app

from testpaths import DARE_DATA

runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_dare_data(monkeypatch):
    monkeypatch.delenv("DARE_BENCH_DATA", raising=False)  # sudoku falls back to its seeded generator


def _sudoku_items(n):
    from dare_bench.tasks import get_task

    task = get_task("sudoku")
    return task, task.load(split="test", limit=n)


def test_score_json_one_item_per_line_in_order(tmp_path):
    task, ds = _sudoku_items(3)
    gold = [task.format_answer(it) for it in ds]
    lines = [
        {"index": ds[1].index, "completion": gold[1]},
        {"index": ds[0].index, "completion": "<answer>no idea</answer>"},
        {"index": ds[1].index, "completion": None},  # malformed: scored wrong, not fatal
        {"index": ds[1].index, "completion": gold[1]},
        {"index": ds[2].index, "completion": gold[2]},
    ]
    preds = tmp_path / "preds.jsonl"
    preds.write_text("".join(json.dumps(l) + "\n" for l in lines))
    res = runner.invoke(app, ["score", "--task", "sudoku", "--predictions", str(preds), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out) == {"task", "items", "metrics"} and out["task"] == "sudoku"
    assert [(i["index"], i["correct"]) for i in out["items"]] == [
        (ds[1].index, True), (ds[0].index, False), (ds[1].index, False), (ds[1].index, True), (ds[2].index, True)]
    assert all(set(i) == {"index", "correct", "reward", "extracted"} for i in out["items"])
    assert out["metrics"]["accuracy"] == pytest.approx(3 / 5)
    human = runner.invoke(app, ["score", "--task", "sudoku", "--predictions", str(preds)])
    assert human.exit_code == 0 and "correct" in human.stdout and "accuracy=0.6" in human.stdout


def test_score_with_data_file_and_grader(tmp_path):
    data = DARE_DATA / "rl" / "test" / "sudoku_1.parquet"
    from dare_bench.tasks import get_task

    task = get_task("sudoku")
    items = task.load(split="test", source=data, limit=2)
    preds = tmp_path / "p.jsonl"
    preds.write_text("".join(json.dumps({"index": it.index, "completion": task.format_answer(it)}) + "\n"
                             for it in items))
    for grader in task.graders:
        res = runner.invoke(app, ["score", "--task", "sudoku", "--predictions", str(preds), "--data", str(data),
                                  "--grader", grader, "--json"])
        assert res.exit_code == 0, res.output
        assert [i["correct"] for i in json.loads(res.stdout)["items"]] == [True, True], grader


@pytest.mark.parametrize("case", ["unknown_task", "missing_index", "unreadable_data", "bad_shape_data",
                                  "bad_predictions", "unknown_grader"])
def test_score_bad_input_is_one_clear_error(case, tmp_path):
    preds = tmp_path / "p.jsonl"
    preds.write_text('{"index": 0, "completion": "<answer>1</answer>"}\n')
    args = ["score", "--task", "sudoku", "--predictions", str(preds), "--json"]
    if case == "unknown_task":
        args[2] = "sudoku9"
        expect = "unknown task"
    elif case == "missing_index":
        preds.write_text('{"index": 123456, "completion": "x"}\n')
        expect = "not in"
    elif case == "unreadable_data":
        args += ["--data", str(tmp_path / "nope.parquet")]
        expect = "not found"
    elif case == "bad_shape_data":
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"colour": "red"}\n')
        args += ["--data", str(bad)]
        expect = "bad.jsonl"
    elif case == "bad_predictions":
        preds.write_text('{"index": 0, "completion": "x"}\n[1, 2]\n')
        expect = ":2:"
    else:
        args += ["--grader", "nope"]
        expect = "grader 'nope'"
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert res.stdout == "" and res.stderr.startswith("error: ") and expect in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_eval_json_on_a_tiny_preset_model():
    res = runner.invoke(app, ["eval", "--model", "tiny-llada", "--task", "sudoku", "--limit", "2", "--preset",
                              "micro", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert {"task", "model", "preset", "metrics", "items"} <= set(out)
    assert out["preset"] == "micro" and out["model"] == "tiny-llada" and len(out["items"]) == 2
    assert out["metrics"]["forwards"] > 0 and 0 <= out["metrics"]["accuracy"] <= 1


def test_eval_bad_input_is_one_clear_error():
    res = runner.invoke(app, ["eval", "--model", "tiny-llada", "--task", "nosuchtask", "--json"])
    assert res.exit_code == 2 and res.stderr.startswith("error: unknown task")
    res = runner.invoke(app, ["eval", "--model", "tiny-llada", "--task", "sudoku", "--engine", "vllm"])
    assert res.exit_code == 2 and "unknown engine" in res.stderr
    res = runner.invoke(app, ["eval", "--model", "tiny-llada", "--task", "sudoku", "--preset", "nope", "--limit", "1"])
    assert res.exit_code == 2 and "unknown sampler preset" in res.stderr


def test_eval_a_saved_checkpoint_directory(tmp_path):
    """The path a trained tiny model takes: checkpoint dir with its tokenizer -> default `tiny` preset."""
    from dare_bench.evaluators.evaluator import load_model
    from dare_bench.tasks import get_task

    loaded = load_model("tiny-llada", get_task("sudoku"), seed=1)
    ckpt = tmp_path / "ckpt"
    loaded.model.save_pretrained(ckpt, tokenizer=loaded.tokenizer)
    out_file = tmp_path / "result.json"
    res = runner.invoke(app, ["eval", "--model", str(ckpt), "--task", "sudoku", "--limit", "2", "--json",
                              "--output", str(out_file)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["preset"] == "tiny" and out["model"] == str(ckpt) and [i["index"] for i in out["items"]] == [0, 1]
    assert json.loads(out_file.read_text())["items"] == out["items"]


def test_eval_set_overrides_reach_the_sampler():
    res = runner.invoke(app, ["eval", "--model", "tiny-llada", "--task", "sudoku", "--limit", "1", "--preset", "micro",
                              "--set", "gen_length=8", "--set", "steps=4", "--set", "remasking=random", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert (out["sampler"]["gen_length"] == 8 and out["sampler"]["steps"] == 4
            and out["sampler"]["remasking"] == "random")
    bad = runner.invoke(app, ["eval", "--model", "tiny-llada", "--task", "sudoku", "--limit", "1", "--set", "oops"])
    assert bad.exit_code == 2 and "key=value" in bad.stderr
    unknown = runner.invoke(app, ["eval", "--model", "tiny-llada", "--task", "sudoku", "--limit", "1", "--preset",
                                  "micro", "--set", "warp=9"])
    assert unknown.exit_code == 2 and "unknown setting" in unknown.stderr
