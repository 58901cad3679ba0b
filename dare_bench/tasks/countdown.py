"""Countdown (d1 / DARE): combine the given numbers with + - * / to reach the target; answer in ``<answer>`` tags.

Standard data: DARE's ``rl/test/countdown_1.parquet`` (256 games, 3 numbers) and
``rl/train/countdown-n20000_1.parquet`` (3 and 4 numbers); without them, the seeded generator (3 numbers in 1..100,
target 1..100, same prompt text). Also reads d1's JSONL (``{"input": "30,100,93", "output": "23"}``) and
Countdown-Tasks rows (``nums``, ``target``). Graders: ``dare`` (0 / 0.1 / 1, also DARE's accuracy), ``d1``
(``compute_score`` reward + ``parse_and_get_acc`` verdict), ``strict`` (exact arithmetic, each number once).

    task = get_task("countdown"); ds = task.generate(4, seed=0)
    task.format_prompt(ds[0])          # "numbers 30 100 93 target 23\n"
    task.format_answer(ds[0])          # "\\boxed{(79+41)/15}\n<answer>(79+41)/15</answer>" (a correct expression)
"""

from __future__ import annotations

import json
from typing import Any

from dare_bench.errors import DataError
from dare_bench.tasks.base import GraderFn, Item, Task, TaskDataset, sha256_items
from dare_bench.tasks.generators import generate_countdown, solve_countdown
from dare_bench.tasks.graders import d1, dare, strict

COUNTDOWN_PROMPT = (
    "Respond in the following format:\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>\n\n"
    "Using only the numbers {numbers}, create an arithmetic expression that evaluates to exactly {target}. You must "
    "use all numbers from the list, and each number must be used exactly once. You may use the operations +, -, *, "
    "and / as needed. After reasoning, provide only your final expression inside <answer></answer> tags without "
    "including an equals sign or the target number. For example, if the numbers are [2, 3, 4] and the target is 5, "
    "a valid answer is: <answer>\n2*4-3\n</answer>"
)


# d1's eval/countdown.py instruction (note: no separator before "Respond"); question "Numbers: [..]\nTarget: N"
D1_EVAL_PROMPT = (
    "Using only the provided numbers, create an arithmetic expression that evaluates to exactly the provided target "
    "number. You may use the operations +, -, *, and / as needed, but each number must be used exactly once. Think "
    "step-by-step. After reasoning, provide only your final expression inside \\boxed{} tags without including an "
    "equals sign or the target number. For example: \\boxed{a + b * c}Respond in the following format:\n<reasoning>\n"
    "Your reasoning here\n</reasoning>\n<answer>\n\\boxed{...}\n</answer>"
)

class CountdownTask(Task):
    name = "countdown"
    d1_eval_prompt = D1_EVAL_PROMPT
    dare_files = {"test": "countdown_1.parquet", "train": "countdown-n20000_1.parquet"}
    hf_hint = "Jiayi-Pan/Countdown-Tasks-3to4"
    has_generator = True

    def build_graders(self) -> dict[str, GraderFn]:
        return {"dare": dare.grade_countdown, "d1": d1.grade_countdown, "strict": strict.grade_countdown}

    def default_generated_size(self, split: str) -> int:
        return 256 if split == "test" else 20000

    def make_item(self, index: int, numbers: list[int], target: int, split: str, solution: str | None = None) -> Item:
        extra: dict[str, Any] = {"index": index, "numbers": json.dumps(numbers), "split": split, "task": "math",
                                 "data_source": "countdown"}
        if solution is not None:
            extra["solution"] = solution
        return Item(
            index=index,
            prompt_messages=[{"role": "user", "content": COUNTDOWN_PROMPT.format(numbers=str(numbers), target=target)}],
            ground_truth=str(target),
            extra=extra,
        )

    def row_to_item(self, row: dict[str, Any], index: int, split: str) -> Item:
        if "input" in row and "output" in row:
            numbers = [int(x) for x in str(row["input"]).split(",")]
            target = int(row["output"])
        elif "nums" in row and "target" in row:
            numbers, target = [int(x) for x in row["nums"]], int(row["target"])
        else:
            raise DataError(f"countdown rows need input/output or nums/target, got {sorted(row)}")
        return self.make_item(index, numbers, target, split)

    def check_item(self, item: Item) -> None:
        try:
            nums = d1.countdown_numbers(item)
            int(item.ground_truth)
        except (KeyError, ValueError, TypeError) as e:
            raise DataError(f"countdown item {item.index}: needs extra_info.numbers and an integer target ({e})") from e
        if not nums:
            raise DataError(f"countdown item {item.index}: empty number list")

    def generate(self, n: int, seed: int = 0, split: str = "test") -> TaskDataset:
        games = generate_countdown(n, seed=seed, n_numbers=3)
        items = [self.make_item(i, nums, target, split, expr) for i, (nums, target, expr) in enumerate(games)]
        return TaskDataset(self.name, split, items, source=f"generator:countdown(seed={seed},n={n},numbers=3)",
                           fingerprint=sha256_items(items))

    def d1_eval_question(self, item: Item) -> str:
        return f"Numbers: {d1.countdown_numbers(item)}\nTarget: {int(item.ground_truth)}"

    def plain_prompt(self, item: Item) -> str:
        nums = " ".join(str(x) for x in d1.countdown_numbers(item))
        return f"numbers {nums} target {item.ground_truth}\n"

    def format_answer(self, item: Item, grader: str | None = None) -> str:
        """Gold completion. Default: accepted by every grader (d1's evaluation reads a box, the rewards read
        ``<answer>``); ``grader="dare"``/``"strict"`` give the shorter ``<answer>`` form for tiny SFT targets."""
        expr = item.extra.get("solution") or solve_countdown(d1.countdown_numbers(item), int(item.ground_truth))
        if expr is None:
            raise DataError(f"countdown item {item.index} has no solution")
        if grader in ("dare", "strict"):
            return f"<answer>{expr}</answer>"
        return f"\\boxed{{{expr}}}\n<answer>{expr}</answer>"
