"""Live against OpenCompass: its own postprocessors + evaluators still give the shipped verdicts on the corpus, and
the OpenCompass plug-in's evaluator (`DareTaskEvaluator`, the task's `dare` grader) gives the same verdicts.

Runs only where OpenCompass imports (its own venv, numpy<2; CI's OpenCompass step):
    /tmp/ocvenv/bin/python -m pytest tests/evaluators/test_opencompass_task_verdicts_live.py -q
GPQA's postprocessor and the prompt rendering read DARE's fork (yjyddq/DARE @ 83ae8a3, opencompass/opencompass):
set DARE_OPENCOMPASS to that folder to include them; without it those parts skip.
"""

import importlib.util
import json
import os

import pytest

from testpaths import FIXTURES, OPENCOMPASS_TASK_PROMPTS, OPENCOMPASS_TASK_VERDICTS

HAVE_OC = importlib.util.find_spec("opencompass") is not None
pytestmark = [pytest.mark.extra,
              pytest.mark.skipif(not HAVE_OC, reason="opencompass extra not installed (own venv, numpy<2)")]
SHIPPED = [json.loads(line) for line in OPENCOMPASS_TASK_VERDICTS.read_text(encoding="utf-8").splitlines()]
DARE_OC = os.environ.get("DARE_OPENCOMPASS")


def generator():
    path = FIXTURES / "graders" / "make_opencompass_task_verdicts.py"
    spec = importlib.util.spec_from_file_location("make_opencompass_task_verdicts", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_corpus_is_the_generators():
    assert [(r["task"], r["gold"], r["completion"]) for r in SHIPPED] == generator().CASES


def test_opencompass_still_gives_the_shipped_verdicts():
    live = generator().live_verdicts([(r["task"], r["gold"], r["completion"]) for r in SHIPPED], DARE_OC)
    checked = 0
    for row, got in zip(SHIPPED, live):
        if got is None:  # GPQA without DARE's fork
            assert row["task"] == "gpqa" and DARE_OC is None
            continue
        assert got == {"pred": row["pred"], "correct": row["correct"]}, row
        checked += 1
    assert checked >= len(SHIPPED) - sum(r["task"] == "gpqa" for r in SHIPPED)


def test_prompts_are_still_the_ones_opencompass_builds():
    if not DARE_OC:
        pytest.skip("set DARE_OPENCOMPASS to DARE's fork (its dataset configs) to render the prompts")
    shipped = [json.loads(line) for line in OPENCOMPASS_TASK_PROMPTS.read_text(encoding="utf-8").splitlines()]
    assert generator().render_prompts(DARE_OC) == shipped


@pytest.mark.parametrize("task_name", sorted({r["task"] for r in SHIPPED}))
def test_plugin_evaluator_gives_the_shipped_verdicts(task_name, tmp_path, monkeypatch):
    from dare_bench.evaluators.opencompass import DareTaskEvaluator
    from dare_bench.tasks import get_task

    monkeypatch.delenv("DARE_BENCH_DATA", raising=False)
    rows = [r for r in SHIPPED if r["task"] == task_name]
    letters = getattr(get_task(task_name), "letters", "")
    source = tmp_path / f"{task_name}.jsonl"
    with source.open("w", encoding="utf-8") as f:  # one item per corpus row, with the row's gold
        for i, r in enumerate(rows):
            extra = {"index": i, **({"options": [[x, f"option {x}"] for x in letters]} if letters else {})}
            f.write(json.dumps({"data_source": task_name, "prompt": [{"role": "user", "content": "q"}],
                                "reward_model": {"style": "rule", "ground_truth": r["gold"]},
                                "extra_info": extra}) + "\n")
    result = DareTaskEvaluator(task=task_name, source=str(source)).score(
        [r["completion"] for r in rows], list(range(len(rows))))
    got = [(d["extracted"], d["correct"]) for d in result["details"]]
    assert got == [(r["pred"], r["correct"]) for r in rows]
    assert result["accuracy"] == pytest.approx(100.0 * sum(r["correct"] for r in rows) / len(rows))
