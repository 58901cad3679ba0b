"""Countdown (d1 / DARE): combine the given numbers with + - * / to reach the target; answer in ``<answer>`` tags.

Standard data: DARE's ``rl/test/countdown_1.parquet`` (256 games, 3 numbers) and
``rl/train/countdown-n20000_1.parquet`` (3 and 4 numbers); without them, the seeded generator (3 numbers in 1..100,
target 1..100, same prompt text). Also reads d1's JSONL (``{"input": "30,100,93", "output": "23"}``) and
Countdown-Tasks rows (``nums``, ``target``). The compact format of the tiny replicas (``task_options: {max_number:
M}``, optionally ``ops``, ``numbers`` and ``in_order``): every split is generated, ``numbers`` numbers in 1..M
combined with ``ops`` into a positive target (``in_order``: in the listed order, no parentheses, the usual
precedence), the prompt's numbers next to the answer, and a game (its numbers, sorted unless in order, and target)
is a test game iff a hash of it says so, so training never sees a test game. Graders: ``dare`` (0 /
0.1 / 1, also DARE's accuracy), ``d1`` (``compute_score`` reward + ``parse_and_get_acc`` verdict), ``strict`` (exact
arithmetic, each number once).

    task = get_task("countdown"); ds = task.generate(4, seed=0)
    task.format_prompt(ds[0])          # "numbers 30 100 93 target 23\n"
    task.format_answer(ds[0])          # "\\boxed{(79+41)/15}\n<answer>(79+41)/15</answer>" (a correct expression)
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from dare_bench.errors import ConfigError, DataError
from dare_bench.tasks.base import SPLITS, GraderFn, Item, Task, TaskDataset, sha256_items
from dare_bench.tasks.generators import generate_countdown, make_countdown_game, solve_countdown
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

COMPACT_TEST_BUCKETS = 10  # a compact game is a test game iff sha256(its key) % 10 == 0
COMPACT_MAX_MISSES = 20000  # consecutive repeated / other-split draws before the space counts as exhausted
MAX_NUMBER_RANGE = (2, 100)
NUMBERS_RANGE = (2, 4)


def game_key(numbers: list[int], target: int, in_order: bool = False) -> str:
    """A game, up to the order of its numbers unless the order is part of it (`in_order`): what the compact
    format's splits keep apart."""
    return f"{' '.join(map(str, numbers if in_order else sorted(numbers)))}={target}"


def split_of_game(numbers: list[int], target: int, in_order: bool = False) -> str:
    """Which split a compact game belongs to: a pure function of the game, so the splits can never overlap."""
    digest = int(hashlib.sha256(game_key(numbers, target, in_order).encode()).hexdigest(), 16)
    return "test" if digest % COMPACT_TEST_BUCKETS == 0 else "train"


def in_order_game(rng: random.Random, numbers: int, max_number: int, ops: str) -> tuple[list[int], int, str]:
    """Numbers and one operation between each neighbour pair, read with the usual precedence and no parentheses:
    the target is the expression's value (a positive integer)."""
    while True:
        nums = [rng.randint(1, max_number) for _ in range(numbers)]
        expr = str(nums[0]) + "".join(rng.choice(ops) + str(x) for x in nums[1:])
        value = strict.exact_value(expr)  # the strict grader's own arithmetic
        if value is not None and value.denominator == 1 and value >= 1:
            return nums, int(value), expr


def generate_compact(n: int, seed: int, split: str, max_number: int, ops: str, numbers: int,
                     in_order: bool = False) -> list[tuple[list[int], int, str]]:
    """Up to ``n`` distinct games of ``split`` in the compact format (fewer when its space has fewer)."""
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    rng = random.Random(f"countdown-compact:{split}:{seed}:{numbers}:{max_number}:{ops}:{in_order}")
    seen: set[str] = set()
    games: list[tuple[list[int], int, str]] = []
    misses = 0
    while len(games) < n and misses <= COMPACT_MAX_MISSES:
        if in_order:
            nums, target, expr = in_order_game(rng, numbers, max_number, ops)
        else:
            nums, target, expr = make_countdown_game(rng, numbers, 1, max_number, 1, max_number ** numbers, ops)
        key = game_key(nums, target, in_order)
        if key in seen or split_of_game(nums, target, in_order) != split:
            misses += 1
            continue
        misses = 0
        seen.add(key)
        games.append((nums, target, expr))
    return games


class CountdownTask(Task):
    name = "countdown"
    d1_eval_prompt = D1_EVAL_PROMPT
    dare_files = {"test": "countdown_1.parquet", "train": "countdown-n20000_1.parquet"}
    hf_hint = "Jiayi-Pan/Countdown-Tasks-3to4"
    has_generator = True

    # `max_number: null` is the standard games (DARE's files, else the 1..100 generator); an integer turns on the
    # compact format (module doc), which `ops` and `numbers` shape
    option_defaults = {"max_number": None, "ops": "+-*/", "numbers": 3, "in_order": False}
    max_number: int | None = None
    ops = "+-*/"
    numbers = 3
    in_order = False  # the prompt lists the numbers in the answer's order, no parentheses: choose the operations

    def check_options(self, options: dict[str, Any]) -> None:
        max_number, ops, numbers = options["max_number"], options["ops"], options["numbers"]
        if max_number is None:
            if any(options[k] != self.option_defaults[k] for k in ("ops", "numbers", "in_order")):
                raise ConfigError("countdown: task_options ops / numbers / in_order shape the compact format only; "
                                  "set max_number too (null is the standard games)")
            return
        if not isinstance(options["in_order"], bool):
            raise ConfigError(f"countdown: in_order must be true or false, got {options['in_order']!r}")
        lo, hi = MAX_NUMBER_RANGE
        if isinstance(max_number, bool) or not isinstance(max_number, int) or not lo <= max_number <= hi:
            raise ConfigError(f"countdown: max_number must be null or an integer in {lo}..{hi}, got {max_number!r}")
        lo, hi = NUMBERS_RANGE
        if isinstance(numbers, bool) or not isinstance(numbers, int) or not lo <= numbers <= hi:
            raise ConfigError(f"countdown: numbers must be an integer in {lo}..{hi}, got {numbers!r}")
        if (not isinstance(ops, str) or not ops or len(set(ops)) != len(ops) or not set(ops) <= set("+-*/")
                or not set(ops) & set("+*")):
            # "+" or "*" keeps a positive target reachable ("-" / "/" alone rarely give one)
            raise ConfigError(f"countdown: ops must be distinct characters of '+-*/' including '+' or '*', "
                              f"got {ops!r}")

    def dare_path(self, split: str) -> Path | None:
        # DARE's games are the standard format; the compact one is generated for every split
        return None if self.max_number is not None else super().dare_path(split)

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
        if self.max_number is None:
            games = generate_countdown(n, seed=seed, n_numbers=3)
            source = f"generator:countdown(seed={seed},n={n},numbers=3)"
        else:
            games = generate_compact(n, seed, split, self.max_number, self.ops, self.numbers, self.in_order)
            source = (f"generator:countdown(seed={seed},n={n},split={split},numbers={self.numbers},"
                      f"max_number={self.max_number},ops={self.ops}{',in_order' if self.in_order else ''})")
        items = [self.make_item(i, nums, target, split, expr) for i, (nums, target, expr) in enumerate(games)]
        return TaskDataset(self.name, split, items, source=source, fingerprint=sha256_items(items))

    def d1_eval_question(self, item: Item) -> str:
        return f"Numbers: {d1.countdown_numbers(item)}\nTarget: {int(item.ground_truth)}"

    def plain_prompt(self, item: Item) -> str:
        nums = " ".join(str(x) for x in d1.countdown_numbers(item))
        if self.max_number is not None:
            # the numbers last, next to the answer: their distance to it does not move with the target's width
            return f"target {item.ground_truth} numbers {nums}\n"
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
