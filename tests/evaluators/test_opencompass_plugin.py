"""OpenCompass plug-in: same verdicts as the native evaluator on a tiny model; one-line error without the extra.

The comparison test runs only where OpenCompass is importable (its own venv, numpy<2):
    /tmp/ocvenv/bin/python -m pytest tests/evaluators/test_opencompass_plugin.py -q
"""

import importlib.util
import json

import pytest
from typer.testing import CliRunner

from dare_bench.errors import DareBenchError

HAVE_OC = importlib.util.find_spec("opencompass") is not None


@pytest.fixture(autouse=True)
def _no_dare_data(monkeypatch):
    monkeypatch.delenv("DARE_BENCH_DATA", raising=False)


@pytest.mark.extra
@pytest.mark.skipif(HAVE_OC, reason="checks the message shown when the extra is missing")
def test_missing_extra_is_a_one_line_error():
    from dare_bench.cli import app
    from dare_bench.evaluators.opencompass import run_opencompass_eval

    with pytest.raises(DareBenchError, match=r"pip install 'dare-bench\[opencompass\]'"):
        run_opencompass_eval("tiny-llada", "sudoku", limit=1)
    res = CliRunner().invoke(app, ["eval", "--model", "tiny-llada", "--task", "sudoku", "--limit", "1",
                                   "--engine", "opencompass"])
    assert res.exit_code == 2 and res.stderr.startswith("error: opencompass is not installed")


@pytest.mark.extra
@pytest.mark.skipif(not HAVE_OC, reason="opencompass extra not installed (pip install 'dare-bench[opencompass]')")
def test_opencompass_and_native_give_the_same_verdicts(tmp_path):
    from dare_bench.evaluators.evaluator import evaluate
    from dare_bench.evaluators.opencompass import run_opencompass_eval
    from dare_bench.tasks import get_task

    task = get_task("sudoku")
    items = list(task.load(split="test", limit=4))
    # half gold, half wrong completions: verdicts must agree item by item, through OpenCompass' own evaluator task
    gold = {it.index: task.format_answer(it) for it in items}

    kw = dict(preset="micro", limit=4, seed=0, batch_size=4)
    native = evaluate("tiny-llada", "sudoku", progress=False, **kw)
    oc = run_opencompass_eval("tiny-llada", "sudoku", work_dir=tmp_path / "oc", **kw)
    assert [r["index"] for r in oc.records] == [r["index"] for r in native.records]
    assert [r["completion"] for r in oc.records] == [r["completion"] for r in native.records]
    assert [r["correct"] for r in oc.records] == [r["correct"] for r in native.records]
    assert [r["reward"] for r in oc.records] == [r["reward"] for r in native.records]
    assert oc.metrics["accuracy"] == native.metrics["accuracy"]
    assert oc.metrics["opencompass_accuracy"] == pytest.approx(100 * native.metrics["accuracy"])
    assert oc.metrics["forwards"] == native.metrics["forwards"]
    assert (tmp_path / "oc" / "dare_eval_config.py").exists()
    results = json.loads((tmp_path / "oc" / "results" / "dare-dllm" / "dare_sudoku.json").read_text())
    assert len(results["details"]) == 4

    # whole pipelines again with a stand-in sampler that answers items 0 and 2 correctly: True verdicts too
    from dare_bench.tasks.tokenizer import build_task_tokenizer

    tok = build_task_tokenizer("sudoku")
    by_prompt = {task.format_prompt(it, "plain"): (gold[it.index] if k % 2 == 0 else "<answer>1111</answer>")
                 for k, it in enumerate(items)}

    def stand_in(model, prompt_ids, attention_mask=None, **settings):
        import types

        import torch

        rows = [r + tok(by_prompt[tok.decode(r, skip_special_tokens=True)], add_special_tokens=False)["input_ids"]
                + [tok.eos_token_id] for r in prompt_ids.tolist()]
        width = max(map(len, rows))
        seq = torch.tensor([r + [tok.eos_token_id] * (width - len(r)) for r in rows])
        st = types.SimpleNamespace(forwards=1, generated_tokens=width - prompt_ids.shape[1], tokens_per_forward=1.0,
                                   wall_seconds=0.0)
        return types.SimpleNamespace(sequences=seq, prompt_length=prompt_ids.shape[1], stats=st, settings=settings)

    native2 = evaluate("tiny-llada", "sudoku", progress=False, generate_fn=stand_in, **kw)
    oc2 = run_opencompass_eval("tiny-llada", "sudoku", work_dir=tmp_path / "oc2", generate_fn=stand_in, **kw)
    assert [r["correct"] for r in native2.records] == [True, False, True, False]
    assert [(r["index"], r["correct"], r["reward"], r["extracted"]) for r in oc2.records] == \
        [(r["index"], r["correct"], r["reward"], r["extracted"]) for r in native2.records]
    assert oc2.metrics["opencompass_accuracy"] == 50.0

    # grading alone: gold completions are correct through OpenCompass' evaluator, wrong ones are not
    from dare_bench.evaluators.opencompass import DareTaskEvaluator

    ev = DareTaskEvaluator(task="sudoku", limit=4)
    preds = [gold[it.index] if k % 2 == 0 else "<answer>1111</answer>" for k, it in enumerate(items)]
    out = ev.score(preds, [it.index for it in items])
    assert [d["correct"] for d in out["details"]] == [True, False, True, False] and out["accuracy"] == 50.0
