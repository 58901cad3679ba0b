"""GPQA diamond (198 questions, 4 options): DARE's few-shot generation evaluation.

Follows DARE's own ``configs/datasets/gpqa/gpqa_fewshot_gen.py`` in its OpenCompass fork (yjyddq/DARE @ 83ae8a3,
``opencompass/``; imported by the llada / dream / llada2 / SDAR-8B configs, SDAR-30B imports ``gpqa_gen``): one user
turn = the five expert examples (``gpqa_fewshot.txt`` beside this file, that config's ``five_shot_prompt`` copied
unchanged, sha256 6d720fc4...) + "\\nQuestion:\\n<q>\\nChoices:\\nA. ...\\nD. ...\\nWhen you're ready to answer,
please use the format 'The correct answer is (X)' where X is the correct letter choice from 'ABCD'."; verdict: the
fork's ``GPQA_Simple_Eval_postprocess_`` (the first "The correct answer is (X)", any case, X stripped; else " ") +
GPQAEvaluator (``pred == gold``). Options: the fork's ``GPQADataset_`` seeds Python's ``random`` with 0 once and
shuffles [correct, incorrect 1-3] row after row, in file order; the gold is the first letter holding the correct
text. The converter does the same over the whole file.

Task option ``protocol`` (``tasks/protocols.py``; grader ``opencompass`` = ``dare``), each in DARE's fork under
``configs/datasets/gpqa/``:

- ``gpqa_fewshot_gen``: the above (the task without a protocol).
- ``gpqa_openai_simple_evals_gen_5aeece`` (SDAR-30B: ``gpqa_gen`` imports it): zero-shot, one user turn, the
  simple-evals instruction + "<question>\n\nA) ...\nD) ..."; options as OpenCompass's ``GPQADataset`` orders them
  (not the seeded shuffle): the n-th data row (from 1) rotates [correct, incorrect 1-3] by pattern
  ``['ABCD', 'BCDA', 'CDAB', 'DABC'][n % 4]``, the gold is the first letter holding the correct text. The item's
  options are undone back to the file's order by replaying ``GPQADataset_``'s seeded shuffles up to its row
  (``extra_info.index``: so the item must come from converting the whole file, as ``data get`` does).
  Verdict: ``GPQA_Simple_Eval_postprocess`` (the first ``(?i)ANSWER\\s*:\\s*([A-D])``, else None) + GPQAEvaluator.

Data: ``dare-bench data get gpqa --hf`` (Idavidrein/gpqa ``gpqa_diamond``, train split = the diamond CSV; the data
set is **gated**: accept its terms on the Hub and log in first) -> ``rl/test/gpqa.parquet``. Raw rows ("Question",
"Correct Answer", "Incorrect Answer 1..3") load directly, shuffled the same way (so a file's row order matters).
"""

from __future__ import annotations

import random
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from dare_bench.errors import DataError
from dare_bench.tasks.base import GradeResult, Item
from dare_bench.tasks.choice import (
    SIMPLE_EVALS_ABCD,
    ChoiceTask,
    framed,
    letter_protocol_grade,
    option_lines,
    options_of,
)
from dare_bench.tasks.graders import opencompass_choice as oc
from dare_bench.tasks.protocols import Protocol, graded, own_messages, user_turn


@lru_cache(maxsize=1)
def five_shot_prompt() -> str:
    return Path(__file__).with_name("gpqa_fewshot.txt").read_text(encoding="utf-8")


def _choices_block(options: Sequence[str]) -> str:
    lines = "\n".join(f"{letter}. {text}" for letter, text in zip("ABCD", options))
    return (f"\nChoices:\n{lines}\nWhen you're ready to answer, please use the format 'The correct answer is (X)' "
            "where X is the correct letter choice from 'ABCD'.")


@lru_cache(maxsize=4096)
def _seeded_shuffle(position: int) -> tuple[int, ...]:
    """GPQADataset_'s shuffle of row `position`: random.Random(0), one 4-shuffle per row before it (content-blind,
    so the shuffle of positions is the shuffle of the options)."""
    rng = random.Random(0)
    for _ in range(position + 1):
        order = [0, 1, 2, 3]
        rng.shuffle(order)
    return tuple(order)


def file_order(item: Item) -> list[str]:
    """[correct, incorrect 1, 2, 3] of the item's CSV row: its shown options with GPQADataset_'s shuffle undone."""
    position = int(item.extra.get("index", item.index))
    order = _seeded_shuffle(position)
    shown = [text for _, text in options_of(item)]
    original = [""] * 4
    for k, source in enumerate(order[:len(shown)]):
        original[source] = shown[k]
    if len(shown) != 4 or original[0] != dict(options_of(item)).get(item.ground_truth):
        raise DataError(f"gpqa item {item.index}: its options are not GPQADataset_'s shuffle of row {position} (the "
                        "simple-evals protocol needs items converted from the whole diamond file in its order)")
    return original


def simple_evals_options(item: Item) -> tuple[list[str], str]:
    """GPQADataset's options (rotated by the row number from 1) and its gold letter."""
    original = file_order(item)
    pattern = ["ABCD", "BCDA", "CDAB", "DABC"][(int(item.extra.get("index", item.index)) + 1) % 4]
    options = [original[ord(c) - ord("A")] for c in pattern]
    return options, "ABCD"[options.index(original[0])]


def _question(item: Item) -> str:
    return framed(item, item.prompt_messages[-1]["content"], f"{five_shot_prompt()}\nQuestion:\n",
                  _choices_block([text for _, text in options_of(item)]))


def _messages_simple_evals(task, item: Item) -> list[dict[str, str]]:
    options, _ = simple_evals_options(item)
    return user_turn(SIMPLE_EVALS_ABCD.format(question=_question(item),
                                              options=option_lines(list(zip("ABCD", options)), ") ")))


def _grade_simple_evals(task, completion: str, item: Item) -> GradeResult:
    _, gold = simple_evals_options(item)
    pred = oc.gpqa_simple_eval(completion)
    return graded(pred == gold, pred, gold)


PROTOCOLS = {
    "gpqa_fewshot_gen": Protocol("gpqa_fewshot_gen", "gpqa/gpqa_fewshot_gen.py", own_messages,
                                 letter_protocol_grade(oc.gpqa_correct_answer)),
    "gpqa_openai_simple_evals_gen_5aeece": Protocol(
        "gpqa_openai_simple_evals_gen_5aeece", "gpqa/gpqa_openai_simple_evals_gen_5aeece.py", _messages_simple_evals,
        _grade_simple_evals),
}


class GPQATask(ChoiceTask):
    name = "gpqa"
    raw_converter = "gpqa"
    dare_files = {"test": "gpqa.parquet"}
    hf_hint = "Idavidrein/gpqa:gpqa_diamond"

    protocols = PROTOCOLS
    default_protocol = "gpqa_fewshot_gen"

    def make_prompt(self, question: str, choices: Sequence[str]) -> str:
        return f"{five_shot_prompt()}\nQuestion:\n{question}{_choices_block(choices)}"

    def format_answer(self, item: Item, grader: str | None = None) -> str:
        if self.protocol == "gpqa_openai_simple_evals_gen_5aeece":
            return f"ANSWER: {simple_evals_options(item)[1]}"
        return f"The correct answer is ({item.ground_truth})"
