"""What the multiple-choice tasks share (mmlu, mmlupro, hellaswag, arcc, gpqa): items carry their options, the gold is
an option letter, grading is OpenCompass's postprocessor + an exact letter match (AccEvaluator / GPQAEvaluator).

An item's ``extra["options"]`` is the list of (letter, text) pairs shown to the model, ``ground_truth`` the gold
letter; an item without options, or whose gold is not one of its letters, is one DataError. Raw rows of the public
data go through the task's converter in ``tasks/data.py`` (the very rows ``dare-bench data get <task> --hf``
writes), so a raw file and the converted parquet give the same items.

    task = get_task("arcc")
    task.grade("The answer is (C)", item)        # GradeResult(correct=..., extracted='C')
"""

from __future__ import annotations

from typing import Callable

from dare_bench.errors import DataError
from dare_bench.tasks.base import GradeResult, GraderFn, Item, Task


def options_of(item: Item) -> list[tuple[str, str]]:
    return [(str(letter), str(text)) for letter, text in item.extra.get("options") or []]


def letter_grader(extract: Callable[[str], str]) -> GraderFn:
    """A grader that extracts a letter with `extract` and compares it to the gold letter as a string (OpenCompass's
    AccEvaluator maps both to ids by their string; GPQAEvaluator compares with ==): 'd' is not 'D'."""

    def grade(completion: str, item: Item) -> GradeResult:
        pred = extract(completion)
        ok = str(pred) == item.ground_truth
        return GradeResult(ok, float(ok), pred, {"pred": pred})

    return grade


class ChoiceTask(Task):
    """Base of the multiple-choice tasks: evaluation only (a test split, no training data, paper scale)."""

    scales = ("paper",)
    #: the option letters the official postprocessor looks for
    letters: str = "ABCD"
    def check_item(self, item: Item) -> None:
        options = options_of(item)
        if not options:
            raise DataError(f"{self.name} item {item.index} has no options (a multiple-choice item needs "
                            f"extra_info.options)")
        if item.ground_truth not in [letter for letter, _ in options]:
            raise DataError(f"{self.name} item {item.index}: gold {item.ground_truth!r} is not one of its options "
                            f"{''.join(letter for letter, _ in options)}")

    def plain_prompt(self, item: Item) -> str:
        return item.prompt_messages[-1]["content"]

    def format_answer(self, item: Item, grader: str | None = None) -> str:
        return f"The answer is ({item.ground_truth})"
