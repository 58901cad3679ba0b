"""MATH500 (test) / MATH (train): competition problems with LaTeX answers.

Standard data: DARE's ``rl/test/math500_1.parquet`` (500) and ``rl/train/math_1.parquet`` (7474); both hold the bare
problem as the user turn and the final answer as ground truth. Also reads rows with ``problem`` + ``answer``
(HuggingFaceH4/MATH-500) or ``problem`` + ``solution`` (the boxed answer is taken from the solution). Graders:
``dare`` (last ``\\boxed{}``, Hendrycks match or sympy), ``d1`` (reward: Hendrycks match on the last box, or on the
whole completion when nothing is boxed, plus a format bonus; eval: last box else first ``<answer>``), ``strict``.
"""

from __future__ import annotations

from typing import Any

from dare_bench.errors import DataError
from dare_bench.tasks.base import GraderFn, Item, Task
from dare_bench.tasks.graders import d1, dare, strict
from dare_bench.tasks.graders.dare import extract_answer

# d1's eval/math500.py instruction; the stray '" ' after </answer> is in the original
D1_EVAL_PROMPT = (
    "You are a math expert. You will be given a question to solve. Solve it step by step. Wrap the final answer "
    "in a \\boxed{}.\nRespond in the following format:\n<reasoning>\nYour reasoning here\n</reasoning>\n<answer>\n"
    "\\boxed{...}\n</answer>\" \n"
)

class Math500Task(Task):
    name = "math500"
    scales = ("paper",)
    cpu_stand_in = ("arith", "math", "a tiny replica cannot learn MATH")
    d1_eval_prompt = D1_EVAL_PROMPT
    dare_files = {"test": "math500_1.parquet", "train": "math_1.parquet"}
    hf_hint = "HuggingFaceH4/MATH-500"

    def build_graders(self) -> dict[str, GraderFn]:
        return {"dare": dare.grade_math, "d1": d1.grade_math, "strict": strict.grade_math}

    def row_to_item(self, row: dict[str, Any], index: int, split: str) -> Item:
        if "problem" not in row or not ("answer" in row or "solution" in row):
            raise DataError(f"math rows need problem and answer (or solution), got {sorted(row)}")
        gold = row.get("answer")
        if gold is None:
            gold = extract_answer(str(row["solution"]))
            if gold is None:
                raise DataError("solution has no \\boxed{} answer")
        return Item(index, [{"role": "user", "content": str(row["problem"])}], str(gold),
                    {"index": index, "split": split, "task": "math", "data_source": "math500"})

    def plain_prompt(self, item: Item) -> str:
        return f"Problem: {item.prompt_messages[-1]['content']}\nSolution:\n"

    def format_answer(self, item: Item, grader: str | None = None) -> str:
        gt = item.ground_truth
        return f"<reasoning>\nThe answer is \\boxed{{{gt}}}.\n</reasoning>\n<answer>\n\\boxed{{{gt}}}\n</answer>\n"
