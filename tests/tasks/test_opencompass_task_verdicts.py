"""The `dare` grader of the eight benchmarks DARE scores through OpenCompass reproduces OpenCompass's own verdicts.

`tests/fixtures/graders/opencompass_tasks/verdicts.jsonl`: hand-written completions (the hard cases: "The answer is
(C)", "D. xxx", lowercase letters, several letters, Chinese answer forms, boxed integers with leading zeros, fractions,
several boxes, ...) with the extracted answer and verdict OpenCompass's postprocessor + evaluator gave each
(`tests/fixtures/graders/make_opencompass_task_verdicts.py`; see tests/fixtures/README.md). Any drift of a rule in
`dare_bench/tasks/graders/opencompass_choice.py` or `olympiad.py` fails here. OlympiadBench's judge needs sympy's LaTeX
parser (antlr4-python3-runtime 4.11, a dependency of the package).

    OMP_NUM_THREADS=1 python -m pytest tests/tasks/test_opencompass_task_verdicts.py -q
"""

import json

import pytest

from dare_bench.tasks import get_task
from dare_bench.tasks.base import Item
from dare_bench.tasks.graders.opencompass_olympiad import latex_parser_available

from testpaths import OPENCOMPASS_TASK_VERDICTS

ROWS = [json.loads(line) for line in OPENCOMPASS_TASK_VERDICTS.read_text(encoding="utf-8").splitlines()]
TASKS = ["mmlu", "mmlupro", "hellaswag", "arcc", "gpqa", "aime2024", "aime2025", "olympiadbench"]


def corpus_item(task_name: str, gold: str, index: int = 0) -> Item:
    """An item with the row's gold (multiple choice: the letters the official postprocessor may return)."""
    letters = get_task(task_name).letters if hasattr(get_task(task_name), "letters") else ""
    extra = {"options": [[x, f"option {x}"] for x in letters]} if letters else {}
    return Item(index, [{"role": "user", "content": "q"}], gold, {"index": index, **extra})


@pytest.mark.parametrize("task_name", TASKS)
def test_dare_grader_matches_opencompass(task_name):
    if task_name == "olympiadbench":
        needs_latex_parser()
    task = get_task(task_name)
    rows = [r for r in ROWS if r["task"] == task_name]
    assert len(rows) >= 20
    assert {r["correct"] for r in rows} == {True, False}  # the corpus exercises both verdicts
    wrong = []
    for r in rows:
        res = task.grade(r["completion"], corpus_item(task_name, r["gold"]), "dare")
        if (res.extracted, res.correct) != (r["pred"], r["correct"]):
            wrong.append((r["completion"], r["gold"], (res.extracted, res.correct), (r["pred"], r["correct"])))
    assert not wrong, f"{len(wrong)} of {len(rows)} differ from OpenCompass: {wrong[:5]}"


@pytest.mark.parametrize("task_name", TASKS)
def test_gold_completion_is_accepted(task_name):
    if task_name == "olympiadbench":
        needs_latex_parser()
    task = get_task(task_name)
    for gold in sorted({r["gold"] for r in ROWS if r["task"] == task_name}):
        item = corpus_item(task_name, gold)
        assert task.grade(task.format_answer(item), item).correct, (task_name, gold)


def needs_latex_parser():
    """OlympiadBench's judge needs sympy's LaTeX parser: antlr4-python3-runtime 4.11.0 exactly (a dependency)."""
    if not latex_parser_available():
        pytest.skip("sympy's LaTeX parser is unavailable (needs antlr4-python3-runtime==4.11.0)")
