"""What the multiple-choice tasks share (mmlu, mmlupro, hellaswag, arcc, gpqa): items carry their options, the gold is
an option letter, grading is OpenCompass's postprocessor + an exact letter match (AccEvaluator / GPQAEvaluator).

An item's ``extra["options"]`` is the list of (letter, text) pairs shown to the model, ``ground_truth`` the gold
letter; an item without options, or whose gold is not one of its letters, is one DataError. Each task is an
``OpenCompassTask`` (``tasks/protocols.py``): its items carry its default config's chat; another protocol (task option
``protocol``) reads the question back out of that chat (``framed``: the default config's text around it must be
there, else one DataError) and builds its own. Raw rows of the public
data go through the task's converter in ``tasks/data.py`` (the very rows ``dare-bench data get <task> --hf``
writes), so a raw file and the converted parquet give the same items.

    task = get_task("arcc")
    task.grade("The answer is (C)", item)        # GradeResult(correct=..., extracted='C')
"""

from __future__ import annotations

from typing import Callable

from dare_bench.errors import DataError
from dare_bench.tasks.base import GradeResult, GraderFn, Item
from dare_bench.tasks.protocols import OpenCompassTask


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


def letter_protocol_grade(extract: Callable[[str], str]) -> Callable[..., GradeResult]:
    """``letter_grader`` as a ``Protocol.grade`` (task, completion, item)."""
    grade = letter_grader(extract)
    return lambda task, completion, item: grade(completion, item)


def framed(item: Item, text: str, prefix: str, suffix: str) -> str:
    """The question inside ``prefix`` + question + ``suffix`` (the default config's prompt around it)."""
    if not (text.startswith(prefix) and text.endswith(suffix) and len(text) >= len(prefix) + len(suffix)):
        raise DataError(f"item {item.index}: its prompt is not the task's default config's (cannot read the question "
                        f"back for another protocol): {text[:80]!r}")
    return text[len(prefix):len(text) - len(suffix)]


def option_lines(options: list[tuple[str, str]], sep: str = ". ") -> str:
    """"A. text" lines (``sep`` ") " for the simple-evals configs), newline-joined."""
    return "\n".join(f"{letter}{sep}{text}" for letter, text in options)


#: the simple-evals instruction of mmlu_openai_simple_evals_gen_b618ea / gpqa_openai_simple_evals_gen_5aeece
SIMPLE_EVALS_ABCD = ("Answer the following multiple choice question. The last line of your response should be of the "
                     "following format: 'ANSWER: $LETTER' (without quotes) where LETTER is one of ABCD. Think step by "
                     "step before answering.\n\n{question}\n\n{options}")


class ChoiceTask(OpenCompassTask):
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
