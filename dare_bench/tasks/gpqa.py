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

Data: ``dare-bench data get gpqa --hf`` (Idavidrein/gpqa ``gpqa_diamond``, train split = the diamond CSV; the data
set is **gated**: accept its terms on the Hub and log in first) -> ``rl/test/gpqa.parquet``. Raw rows ("Question",
"Correct Answer", "Incorrect Answer 1..3") load directly, shuffled the same way (so a file's row order matters).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Sequence

from dare_bench.tasks.base import GraderFn, Item
from dare_bench.tasks.choice import ChoiceTask, letter_grader
from dare_bench.tasks.graders import opencompass_choice as oc


@lru_cache(maxsize=1)
def five_shot_prompt() -> str:
    return Path(__file__).with_name("gpqa_fewshot.txt").read_text(encoding="utf-8")


class GPQATask(ChoiceTask):
    name = "gpqa"
    raw_converter = "gpqa"
    dare_files = {"test": "gpqa.parquet"}
    hf_hint = "Idavidrein/gpqa:gpqa_diamond"

    def build_graders(self) -> dict[str, GraderFn]:
        grade = letter_grader(oc.gpqa_correct_answer)
        # DARE scores this benchmark only through OpenCompass: its rule is both `dare` and `opencompass`
        return {"dare": grade, "opencompass": grade}

    def make_prompt(self, question: str, choices: Sequence[str]) -> str:
        lines = "\n".join(f"{letter}. {text}" for letter, text in zip("ABCD", choices))
        return (f"{five_shot_prompt()}\nQuestion:\n{question}\nChoices:\n{lines}\nWhen you're ready to answer, please "
                "use the format 'The correct answer is (X)' where X is the correct letter choice from 'ABCD'.")

    def format_answer(self, item: Item, grader: str | None = None) -> str:
        return f"The correct answer is ({item.ground_truth})"
