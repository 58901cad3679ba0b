"""AIME 2024 (30 problems, integer answers): DARE's competition-math evaluation (``aime2025.py`` is the same for 2025).

Follows OpenCompass ``configs/datasets/aime2024/aime2024_gen_repeat8_6e39a4.py`` (DARE's llada / dream / llada2 /
SDAR-8B configs): the user turn "<problem>\\nPlease reason step by step, and put your final answer within
\\boxed{}."; verdict: ``math_postprocess_v2`` (the last ``\\boxed{}``, else the sentence saying "final answer" /
"answer is", normalised) + ``MATHEvaluator(version='v2')`` (string normalisation, no sympy: "\\boxed{033}" is not
"33"). The config runs the set 8 times (``aime2024-run0..7``, sampled): DARE's figure is the mean of the 8 runs.

Task option ``protocol`` (``tasks/protocols.py``; grader ``opencompass`` = ``dare``), in DARE's fork under
``configs/datasets/aime2024/``:

- ``aime2024_gen_repeat8_6e39a4``: the above (the task without a protocol). The task itself does not repeat: the
  registry's ``eval.repeats: 8`` samples each problem 8 times.
- ``aime2024_gen_17d799`` (SDAR-30B: ``aime2024_gen`` imports it): the same user turn, one run; verdict:
  MATHVerifyEvaluator (no postprocessor; ``math_verify`` parses the whole completion, the gold as ``$<answer>$``:
  "\boxed{033}" is 33 there).

Data: DARE's ``rl/test/aime2024.parquet`` (the bare problem as the user turn, gold = the answer;
``dare-bench data get aime2024``), to which this task adds OpenCompass's instruction. Raw rows of OpenCompass's
jsonl (``origin_prompt`` + ``gold_answer``, or ``question`` + ``answer``) load directly.
"""

from __future__ import annotations

from typing import Any

from dare_bench.errors import DataError
from dare_bench.tasks.base import GradeResult, Item
from dare_bench.tasks.graders import opencompass_protocols as ocp
from dare_bench.tasks.protocols import OpenCompassTask, Protocol, graded, own_messages


def grade_math_v2(completion: str, item: Item) -> GradeResult:
    """OpenCompass math_postprocess_v2 + MATHEvaluator(version='v2')."""
    pred = ocp.math_postprocess_v2(completion)
    ok = ocp.math_v2_equiv(pred, item.ground_truth)
    return GradeResult(ok, float(ok), pred, {"pred": pred})


def _grade_math_verify(task, completion: str, item: Item) -> GradeResult:
    ok, parsed = ocp.math_verify_verdict(completion, item.ground_truth)
    return graded(ok, parsed, item.ground_truth)


PROTOCOLS = {
    "aime2024_gen_repeat8_6e39a4": Protocol("aime2024_gen_repeat8_6e39a4", "aime2024/aime2024_gen_repeat8_6e39a4.py",
                                            own_messages, lambda task, text, item: grade_math_v2(text, item)),
    "aime2024_gen_17d799": Protocol("aime2024_gen_17d799", "aime2024/aime2024_gen_17d799.py", own_messages,
                                    _grade_math_verify),
}


class AIME2024Task(OpenCompassTask):
    name = "aime2024"
    scales = ("paper",)
    cpu_stand_in = ("arith", "math", "a tiny replica cannot learn AIME")
    dare_files = {"test": "aime2024.parquet"}
    hf_hint = ""
    #: OpenCompass's instruction after the problem (the config's prompt template)
    instruction = "\nPlease reason step by step, and put your final answer within \\boxed{}."

    protocols = PROTOCOLS
    default_protocol = "aime2024_gen_repeat8_6e39a4"

    def verl_row_to_item(self, row: dict[str, Any], i: int) -> Item:
        item = super().verl_row_to_item(row, i)
        return self._with_instruction(item)

    def _with_instruction(self, item: Item) -> Item:
        messages = [dict(m) for m in item.prompt_messages]
        if not messages or messages[-1]["role"] != "user":
            raise DataError(f"{self.name} item {item.index}: the prompt must end with the user's problem")
        messages[-1]["content"] += self.instruction
        return Item(item.index, messages, item.ground_truth, item.extra)

    def row_to_item(self, row: dict[str, Any], index: int, split: str) -> Item:
        question = row.get("question", row.get("origin_prompt"))
        answer = row.get("answer", row.get("gold_answer"))
        if question is None or answer is None:
            raise DataError(f"{self.name} rows need question + answer (or origin_prompt + gold_answer), got "
                            f"{sorted(row)}")
        item = Item(index, [{"role": "user", "content": str(question)}], str(answer),
                    {"index": index, "split": split, "task": "math", "data_source": self.name})
        self.check_item(item)
        return self._with_instruction(item)

    def check_item(self, item: Item) -> None:
        if not item.ground_truth.strip():
            raise DataError(f"{self.name} item {item.index} has no answer")

    def plain_prompt(self, item: Item) -> str:
        return item.prompt_messages[-1]["content"]

    def format_answer(self, item: Item, grader: str | None = None) -> str:
        return f"So the final answer is \\boxed{{{item.ground_truth}}}."
