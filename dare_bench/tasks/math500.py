"""MATH500 (test) / MATH (train): competition problems with LaTeX answers.

Standard data: DARE's ``rl/test/math500_1.parquet`` (500) and ``rl/train/math_1.parquet`` (7474); both hold the bare
problem as the user turn and the final answer as ground truth. Also reads rows with ``problem`` + ``answer``
(HuggingFaceH4/MATH-500) or ``problem`` + ``solution`` (the boxed answer is taken from the solution). Graders:
``dare`` (last ``\\boxed{}``, Hendrycks match or sympy), ``d1`` (reward: Hendrycks match on the last box, or on the
whole completion when nothing is boxed, plus a format bonus; eval: last box else first ``<answer>``), ``strict``.

OpenCompass protocol (task option ``protocol``, grader ``opencompass``; ``tasks/protocols.py``):
``math_prm800k_500_0shot_cot_gen_11c4b5`` (DARE's fork yjyddq/DARE@83ae8a3, ``opencompass/opencompass/configs/
datasets/math/math_prm800k_500_0shot_cot_gen_11c4b5.py``, SDAR-8B's MATH cell): "{problem}\\nPlease reason step by
step, and put your final answer within \\boxed{}."; no postprocessor, MATHVerifyEvaluator (math_verify). Its gold is
OpenCompass's: the last ``\\boxed{}`` of the solution when the rows carry one (Hugging Face MATH-500 rows), else the
``answer`` (DARE's parquet, taken by MATH-500 from that same box). The full MATH test set (5000) is the ``math``
task.
"""

from __future__ import annotations

from typing import Any

from dare_bench.errors import DataError
from dare_bench.tasks.base import GraderFn, Item
from dare_bench.tasks.graders import d1, dare, strict
from dare_bench.tasks.graders import opencompass_protocols as ocp
from dare_bench.tasks.graders.dare import extract_answer
from dare_bench.tasks.protocols import Protocol, ProtocolTask, graded, user_turn

# d1's eval/math500.py instruction; the stray '" ' after </answer> is in the original
D1_EVAL_PROMPT = (
    "You are a math expert. You will be given a question to solve. Solve it step by step. Wrap the final answer "
    "in a \\boxed{}.\nRespond in the following format:\n<reasoning>\nYour reasoning here\n</reasoning>\n<answer>\n"
    "\\boxed{...}\n</answer>\" \n"
)

#: the 0-shot MATH instruction of OpenCompass's math_*_0shot_*_11c4b5 configs
ZERO_SHOT = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."


def zero_shot_messages(task, item: Item) -> list[dict[str, str]]:
    return user_turn(ZERO_SHOT.format(problem=item.prompt_messages[-1]["content"]))


def opencompass_gold(item: Item) -> str | None:
    """MATHDataset's gold: extract_boxed_answer(solution) (None for a solution without a box, as there), when the
    item carries its solution; else the item's answer."""
    solution = item.extra.get("solution")
    return ocp.extract_boxed_answer(str(solution)) if solution is not None else item.ground_truth


def grade_math_verify(task, text: str, item: Item):
    gold = opencompass_gold(item)
    ok, parsed = ocp.math_verify_verdict(text, gold)
    return graded(ok, parsed, gold)


PROTOCOLS = {
    "math_prm800k_500_0shot_cot_gen_11c4b5": Protocol(
        "math_prm800k_500_0shot_cot_gen_11c4b5", "math/math_prm800k_500_0shot_cot_gen_11c4b5.py",
        zero_shot_messages, grade_math_verify),
}


class Math500Task(ProtocolTask):
    name = "math500"
    scales = ("paper",)
    cpu_stand_in = ("arith", "math", "a tiny replica cannot learn MATH")
    d1_eval_prompt = D1_EVAL_PROMPT
    dare_files = {"test": "math500_1.parquet", "train": "math_1.parquet"}
    hf_hint = "HuggingFaceH4/MATH-500"
    protocols = PROTOCOLS

    def base_graders(self) -> dict[str, GraderFn]:
        return {"dare": dare.grade_math, "d1": d1.grade_math, "strict": strict.grade_math}

    def row_to_item(self, row: dict[str, Any], index: int, split: str) -> Item:
        if "problem" not in row or not ("answer" in row or "solution" in row):
            raise DataError(f"math rows need problem and answer (or solution), got {sorted(row)}")
        gold = row.get("answer")
        if gold is None:
            gold = extract_answer(str(row["solution"]))
            if gold is None:
                raise DataError("solution has no \\boxed{} answer")
        extra = {"index": index, "split": split, "task": "math", "data_source": "math500"}
        if "solution" in row:  # OpenCompass's protocols take their gold from it
            extra["solution"] = str(row["solution"])
        return Item(index, [{"role": "user", "content": str(row["problem"])}], str(gold), extra)

    def plain_prompt(self, item: Item) -> str:
        return f"Problem: {item.prompt_messages[-1]['content']}\nSolution:\n"

    def format_answer(self, item: Item, grader: str | None = None) -> str:
        gt = item.ground_truth
        return f"<reasoning>\nThe answer is \\boxed{{{gt}}}.\n</reasoning>\n<answer>\n\\boxed{{{gt}}}\n</answer>\n"
