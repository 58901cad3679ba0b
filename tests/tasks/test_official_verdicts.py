"""Regression against the official graders' own verdicts.

``data/official_verdicts.jsonl`` holds 660 generated completions (number formats, boxes vs ``<answer>`` tags, LaTeX
variants, countdown expressions, sudoku layouts, truncations) with the values the OFFICIAL code returned for them:
DARE's ``math_rm`` (``acc``; ``null`` where it raises) and d1's ``reward_func.py`` rewards and
``parse_and_get_acc.py`` verdicts (run once, outside this repository, on the sources cited in the grader modules).
Any drift of the ``dare`` or ``d1`` grader from the official behaviour on these cases fails here.
"""

import json
from pathlib import Path

import pytest

from dare_bench.tasks import get_task
from dare_bench.tasks.base import Item

ROWS = [json.loads(line) for line in (Path(__file__).parent / "data" / "official_verdicts.jsonl").open()]


def _item(row):
    extra = {k: row[k] for k in ("numbers", "puzzle") if k in row}
    return Item(0, [{"role": "user", "content": "q"}], row["gold"], extra)


@pytest.mark.parametrize("task_name", ["gsm8k", "math500", "countdown", "sudoku"])
def test_matches_official_verdicts(task_name):
    task = get_task(task_name)
    rows = [r for r in ROWS if r["task"] == task_name]
    assert len(rows) >= 100
    mismatches = []
    for r in rows:
        item = _item(r)
        dare, d1 = task.grade(r["completion"], item, "dare"), task.grade(r["completion"], item, "d1")
        want = r["dare_acc"]
        if want is None:  # the official reward raises: scored wrong here
            dare_ok = not dare.correct and dare.reward == 0.0
        else:
            dare_ok = dare.score == pytest.approx(want) and dare.correct == (want == 1)
        d1_ok = d1.reward == pytest.approx(r["d1_reward"], abs=1e-9)
        if "d1_correct" in r:
            d1_ok = d1_ok and d1.correct == r["d1_correct"]
        else:
            d1_ok = d1_ok and d1.score == pytest.approx(r["d1_score"]) and d1.correct == (r["d1_score"] == 1.0)
        if not (dare_ok and d1_ok):
            mismatches.append((r["completion"], r["gold"], dare, d1))
    assert not mismatches, mismatches[:5]


def test_corpus_exercises_both_outcomes_and_grader_disagreement():
    gsm = [r for r in ROWS if r["task"] == "gsm8k"]
    assert sum(r["dare_acc"] == 1 for r in gsm) >= 10 and sum(r["d1_correct"] for r in gsm) >= 10
    assert sum((r["dare_acc"] == 1) != r["d1_correct"] for r in gsm) >= 10
