"""GSM8K: grade-school word problems; the gold answer is the number after ``####``.

Standard data: DARE's ``rl/{train,test}/gsm8k_1.parquet`` (7473 / 1319; the bare question as the user turn, gold
numbers keep thousands separators such as "2,125"). Also reads ``openai/gsm8k`` rows (``question``, ``answer``) from a
file or ``hf:openai/gsm8k:main@<revision>``. Graders: ``dare`` (last ``\\boxed{}``, sympy), ``d1`` (XML rewards;
eval = first valid ``\\boxed{}`` else last number in ``<answer>``, as floats), ``strict``. The two official graders
disagree on many realistic completions (``<answer>`` without a box, "1,000", "18.0", several boxes): see
``tests/tasks/test_graders_math.py``.

    task = get_task("gsm8k"); task.grade("... so \\\\boxed{18}", item)            # dare
"""

from __future__ import annotations

from typing import Any

from dare_bench.errors import DataError
from dare_bench.tasks.base import GraderFn, Item, Task
from dare_bench.tasks.graders import d1, dare, strict

# d1's eval/gsm8k.py instruction (zero-shot: instruction + "\n\n" + question)
D1_EVAL_PROMPT = (
    "You are a math expert. You will be given a question to solve. Solve it step by step. Wrap the final answer "
    "in a \\boxed{}. \nRespond in the following format:\n<reasoning>\nYour reasoning here\n</reasoning>\n<answer>\n"
    "\\boxed{...}\n</answer>"
)

class GSM8KTask(Task):
    name = "gsm8k"
    scales = ("paper",)
    cpu_stand_in = ("arith", "math", "a tiny replica cannot learn GSM8K")
    d1_eval_prompt = D1_EVAL_PROMPT
    dare_files = {"test": "gsm8k_1.parquet", "train": "gsm8k_1.parquet"}
    hf_hint = "openai/gsm8k:main"

    def build_graders(self) -> dict[str, GraderFn]:
        return {"dare": dare.grade_math, "d1": d1.grade_gsm8k, "strict": strict.grade_gsm8k}

    def row_to_item(self, row: dict[str, Any], index: int, split: str) -> Item:
        if "question" not in row or "answer" not in row:
            raise DataError(f"gsm8k rows need question and answer, got {sorted(row)}")
        answer = str(row["answer"])
        gold = answer.split("####")[1].strip() if "####" in answer else answer.strip()
        return Item(index, [{"role": "user", "content": str(row["question"])}], gold,
                    {"index": index, "split": split, "task": "math", "data_source": "gsm8k"})

    def check_item(self, item: Item) -> None:
        try:
            d1.gsm8k_gold_number(item.ground_truth)
        except ValueError as e:
            raise DataError(f"gsm8k item {item.index}: gold answer {item.ground_truth!r} is not a number") from e

    def plain_prompt(self, item: Item) -> str:
        return f"Question: {item.prompt_messages[-1]['content']}\nAnswer:\n"

    def format_answer(self, item: Item, grader: str | None = None) -> str:
        # accepted by all three graders: a box for dare/d1-eval/strict, a bare <answer> for d1's XML rewards
        gt = item.ground_truth
        return f"<reasoning>\nThe answer is \\boxed{{{gt}}}.\n</reasoning>\n<answer>\n{gt}\n</answer>\n"
