"""MMLU-Pro (12032 test questions, up to 10 options A-J): DARE's 0-shot chain-of-thought generation evaluation.

Follows OpenCompass ``configs/datasets/mmlu_pro/mmlu_pro_gen.py`` -> ``mmlu_pro_0shot_cot_gen_08c1de.py`` (DARE's
llada / dream / llada2 / SDAR-8B configs; SDAR-30B imports a few-shot variant that is not this task's): the
simple-evals instruction ("... 'ANSWER: $LETTER' ..."), "Question:\\n\\n<question>\\n\\nOptions:\\n\\n<options>", where
the options are ``MMLUProDataset``'s ``options_str`` ("A. ..." lines, an "N/A" option skipped, its letter kept);
verdict: ``match_answer_pattern`` with ``(?i)ANSWER\\s*:\\s*([A-P])`` + AccEvaluator (an exact letter: the
case-insensitive pattern captures a lowercase "d", which is then wrong). OpenCompass reports per category
(``extra_info.category``) and averages the 14 categories. Task option ``protocol``: ``mmlu_pro_0shot_cot_gen_08c1de``
(the above, the only one implemented; SDAR-30B's ``mmlu_pro_few_shot_gen_bfaf90`` needs the five validation-split
shots of each category, which the task's data does not carry).

Data: ``dare-bench data get mmlupro --hf`` (TIGER-Lab/MMLU-Pro test) -> ``$DARE_BENCH_DATA/rl/test/mmlupro.parquet``;
raw rows (question, options, answer, category, ...) load directly.
"""

from __future__ import annotations

from typing import Sequence

from dare_bench.tasks.base import Item
from dare_bench.tasks.choice import ChoiceTask, letter_protocol_grade
from dare_bench.tasks.graders import opencompass_choice as oc
from dare_bench.tasks.protocols import Protocol, own_messages, unavailable

LETTERS = "ABCDEFGHIJKLMNOP"


def options_str(options: Sequence[str]) -> tuple[str, list[tuple[str, str]]]:
    """``MMLUProDataset._parse``: "X. text" lines by position, "N/A" options left out (their letters too)."""
    shown = [(LETTERS[i], str(text)) for i, text in enumerate(options) if text != "N/A"]
    return "".join(f"{letter}. {text}\n" for letter, text in shown).strip(), shown


PROTOCOLS = {
    "mmlu_pro_0shot_cot_gen_08c1de": Protocol(
        "mmlu_pro_0shot_cot_gen_08c1de", "mmlu_pro/mmlu_pro_0shot_cot_gen_08c1de.py", own_messages,
        letter_protocol_grade(lambda text: oc.answer_pattern(text, oc.MMLU_PRO_PATTERN))),
    # SDAR-30B's cell: 5 shots per category from MMLU-Pro's validation split, which `dare-bench data` does not write
    "mmlu_pro_few_shot_gen_bfaf90": unavailable(
        "mmlu_pro_few_shot_gen_bfaf90", "mmlu_pro/mmlu_pro_few_shot_gen_bfaf90.py",
        "its shots are MMLU-Pro's validation split (5 questions per category), which dare-bench does not fetch or "
        "ship yet; the zero-shot mmlu_pro_0shot_cot_gen_08c1de runs"),
}


class MMLUProTask(ChoiceTask):
    name = "mmlupro"
    raw_converter = "mmlupro"
    letters = LETTERS
    dare_files = {"test": "mmlupro.parquet"}
    hf_hint = "TIGER-Lab/MMLU-Pro"

    protocols = PROTOCOLS
    default_protocol = "mmlu_pro_0shot_cot_gen_08c1de"

    def make_prompt(self, question: str, options_text: str) -> str:
        return ("Answer the following multiple choice question. The last line of your response should be of the "
                "following format: 'ANSWER: $LETTER' (without quotes) where LETTER is one of Options(e.g. one of "
                "ABCDEFGHIJKLMNOP). Think step by step before answering.\n\n"
                f"Question:\n\n{question}\n\nOptions:\n\n{options_text}")

    def format_answer(self, item: Item, grader: str | None = None) -> str:
        return f"ANSWER: {item.ground_truth}"
