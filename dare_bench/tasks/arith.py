"""Arith: procedural multi-step arithmetic word problems, graded exactly like GSM8K (CPU-scale, no download).

A problem is a start value and 1..4 operations applied in order to a running total ("Ana has 3 boxes of 4 apples.
Then Ana gives away 5 apples. How many apples does Ana have now?" = 3 *4 -5 = 7). Every intermediate value is a whole
number in 1..999 (division only when exact), so answers stay short. The item is GSM8K-shaped: the bare question as
the user turn, the gold number as ``ground_truth``; ``row_to_item`` / ``check_item`` / the graders / d1's
evaluation prompt are :class:`~dare_bench.tasks.gsm8k.GSM8KTask`'s own (this class subclasses it), so ``arith``
exercises GSM8K's extraction and comparison: ``dare`` = last ``\\boxed{}`` + sympy, ``d1`` = XML rewards and the
first-box evaluation, ``strict``. Files of ``openai/gsm8k``-style rows (``question``, ``answer`` ending ``#### n``)
load too.

Generator: ``generate(n, seed, split, steps=2, max_operand=20, ops="+-*/")`` is a pure function of its arguments
(a ``random.Random`` per (split, seed)); ``steps`` (operations, 1..4), ``max_operand`` (operands drawn from
1..max_operand, 4..99) and ``ops`` (the operations allowed, a subset of ``+-*/`` with ``+`` or ``*``) are the
difficulty knobs, anything else is one ConfigError. A test set is "at most n" (an evaluation limit is a cap, as on a
file); an asked-for training set of n is exactly n, or one ConfigError when the setting has fewer problems (the default
training set, 20000, is "up to" too). Train and test never share a
problem: a problem (its arithmetic, whatever the names in the story) belongs to the test split iff the sha256 of
its key ("3 *4 -5") is 0 mod 10; each split draws only its own problems, without repeats.

Tiny format (character-level tokenizer ``build_task_tokenizer("arith")``; ``<answer>`` / ``</answer>`` are one
token each)::

    task = get_task("arith"); item = task.generate(1, seed=0)[0]
    task.format_prompt(item)        # e.g. "arith 3 *4 -5\\n"
    task.format_answer(item)        # then "3*4=12\\n12-5=7\\n\\\\boxed{7}\\n<answer>7</answer>\\n#### 7"
    task.format_answer(item, grader="dare")   # without the <answer> part (dare and strict read the box)

The gold completion shows each step, then the number three ways: ``\\boxed{n}`` (what DARE's grader, d1's
evaluation and strict read), ``<answer>n</answer>`` (what d1's training reward compares) and GSM8K's closing
``#### n``, which none of the three graders reads (on GSM8K either): a completion with only ``#### n`` scores wrong,
as it does on ``gsm8k``.

Lengths in tiny-tokenizer tokens, for ``s`` steps and any ``max_operand`` (operands <= 2 digits, totals <= 3):
prompt <= 9 + 4s, default answer <= 25 + 11s, the ``dare`` / ``strict`` form 3 + (digits of the answer) shorter.
Maximum (median at the default ``max_operand=20``) of prompt + answer: steps 1: 13 + 36 = 49 (43); steps 2:
17 + 47 = 64 (54); steps 3: 21 + 58 = 79 (65); steps 4: 25 + 69 = 94 (78). ``tests/tasks/test_arith.py`` checks
the bounds.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import replace
from typing import Any

from dare_bench.errors import ConfigError, DataError
from dare_bench.tasks.base import SPLITS, Item, TaskDataset, sha256_items
from dare_bench.tasks.gsm8k import GSM8KTask

STEPS_RANGE = (1, 4)
MAX_OPERAND_RANGE = (4, 99)
DEFAULT_STEPS = 2
DEFAULT_MAX_OPERAND = 20
DEFAULT_OPS = "+-*/"
MAX_VALUE = 999       # every running total stays in 1..MAX_VALUE (three digits at most)
TEST_BUCKETS = 10     # a problem is a test problem iff sha256(key) % TEST_BUCKETS == 0
MAX_MISSES = 20000    # consecutive unusable draws before the generator says the problem space is too small

_NAMES = ("Ana", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivan", "Jo", "Kim", "Leo", "Mia", "Noor")
_THINGS = ("apples", "marbles", "stickers", "coins", "pencils", "cards", "shells", "books", "eggs", "beads")
_OPS = "+-*/"
_KEY = re.compile(r"(\d+)((?: [-+*/]\d+)+)")


def problem_key(start: int, ops: list[tuple[str, int]]) -> str:
    """The canonical text of a problem, also its tiny prompt body: ``"3 *4 -5"``."""
    return " ".join([str(start)] + [f"{op}{b}" for op, b in ops])


def parse_key(key: str) -> tuple[int, list[tuple[str, int]]]:
    m = _KEY.fullmatch(key)
    if m is None:
        raise DataError(f"arith problem key {key!r} is not '<start> <op><n> ...'")
    parts = key.split(" ")
    return int(parts[0]), [(p[0], int(p[1:])) for p in parts[1:]]


def apply_op(value: int, op: str, b: int) -> int:
    if op == "+":
        return value + b
    if op == "-":
        return value - b
    if op == "*":
        return value * b
    if value % b:
        raise DataError(f"arith: {value}/{b} is not exact")
    return value // b


def split_of(key: str) -> str:
    """Which split a problem belongs to (a pure function of the problem: the splits can never overlap)."""
    return "test" if int(hashlib.sha256(key.encode()).hexdigest(), 16) % TEST_BUCKETS == 0 else "train"


def check_knobs(steps: Any, max_operand: Any, ops: Any = DEFAULT_OPS) -> None:
    for name, value, (lo, hi) in (("steps", steps, STEPS_RANGE), ("max_operand", max_operand, MAX_OPERAND_RANGE)):
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ConfigError(f"arith: {name} must be an integer in {lo}..{hi}, got {value!r}")
    if (not isinstance(ops, str) or not ops or len(set(ops)) != len(ops) or not set(ops) <= set(_OPS)
            or not set(ops) & set("+*")):
        # "+" or "*" keeps a draw from getting stuck at 1 ("-" and "/" cannot leave it)
        raise ConfigError(f"arith: ops must be distinct characters of {_OPS!r} including '+' or '*', got {ops!r}")


def _choices(value: int, op: str, max_operand: int) -> range:
    """Operands that keep the running total a whole number in 1..MAX_VALUE."""
    if op == "+":
        return range(1, min(max_operand, MAX_VALUE - value) + 1)
    if op == "-":
        return range(1, min(max_operand, value - 1) + 1)
    if op == "*":
        return range(2, min(max_operand, MAX_VALUE // value) + 1)
    return range(2, min(max_operand, value) + 1)  # "/": exactness is checked by the caller


def random_problem(rng: random.Random, steps: int, max_operand: int,
                   allowed: str = DEFAULT_OPS) -> tuple[int, list[tuple[str, int]]] | None:
    """One random problem, or None when the draw reaches a total no allowed operation can leave (e.g. ``*`` alone
    past 999 // 2): the caller counts that as a miss."""
    start = rng.randint(1, max_operand)
    value, ops = start, []
    for _ in range(steps):
        options = []
        for op in allowed:
            bs = [b for b in _choices(value, op, max_operand) if op != "/" or value % b == 0]
            if bs:
                options.append((op, bs))
        if not options:
            return None
        op, bs = rng.choice(options)
        b = rng.choice(bs)
        ops.append((op, b))
        value = apply_op(value, op, b)
    return start, ops


def generate_arith(n: int, seed: int = 0, split: str = "test", steps: int = DEFAULT_STEPS,
                   max_operand: int = DEFAULT_MAX_OPERAND, at_most: bool = False,
                   ops: str = DEFAULT_OPS) -> list[tuple[int, list[tuple[str, int]], str, str]]:
    """``n`` distinct problems of ``split``: ``[(start, ops, name, things), ...]``. ``at_most``: fewer when the
    setting has fewer distinct problems (a small space: single-digit operands), instead of a ConfigError. ``ops``:
    the operations a problem may use (a subset of ``"+-*/"``)."""
    check_knobs(steps, max_operand, ops)
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(f"arith: n must be a non-negative integer, got {n!r}")
    rng = random.Random(f"arith:{split}:{seed}")
    seen: set[str] = set()
    out = []
    misses = 0  # consecutive draws that were repeats or the other split's: the space is (nearly) exhausted
    while len(out) < n:
        if misses > MAX_MISSES:
            if at_most:
                break
            raise ConfigError(f"arith: could not draw {n} distinct {split} problems with steps={steps}, "
                              f"max_operand={max_operand}, ops={ops!r} (found {len(out)}); ask for fewer or a "
                              f"harder setting")
        drawn = random_problem(rng, steps, max_operand, ops)
        if drawn is None:
            misses += 1
            continue
        start, chosen = drawn
        key = problem_key(start, chosen)
        if key in seen or split_of(key) != split:
            misses += 1
            continue
        misses = 0
        seen.add(key)
        out.append((start, chosen, rng.choice(_NAMES), rng.choice(_THINGS)))
    return out


def word_problem(start: int, ops: list[tuple[str, int]], name: str, things: str) -> str:
    """The GSM8K-style question (the chat prompt real checkpoints get)."""
    rest = list(ops)
    if rest and rest[0][0] == "*":
        sentences = [f"{name} has {start} boxes of {rest[0][1]} {things}."]
        rest = rest[1:]
    else:
        sentences = [f"{name} has {start} {things}."]
    for op, b in rest:
        sentences.append({
            "+": f"Then {name} gets {b} more {things}.",
            "-": f"Then {name} gives away {b} {things}.",
            "*": f"Then the number of {things} {name} has becomes {b} times as large.",
            "/": f"Then {name} shares the {things} equally among {b} friends and keeps one share.",
        }[op])
    sentences.append(f"How many {things} does {name} have now?")
    return " ".join(sentences)


def solution_lines(start: int, ops: list[tuple[str, int]]) -> tuple[list[str], int]:
    value, lines = start, []
    for op, b in ops:
        new = apply_op(value, op, b)
        lines.append(f"{value}{op}{b}={new}")
        value = new
    return lines, value


class ArithTask(GSM8KTask):
    name = "arith"
    scales = ("tiny", "micro")
    cpu_stand_in = None
    dare_files: dict[str, str] = {}
    hf_hint = ""
    has_generator = True

    option_defaults = {"steps": DEFAULT_STEPS, "max_operand": DEFAULT_MAX_OPERAND, "ops": DEFAULT_OPS}
    steps = DEFAULT_STEPS  # the generator's defaults; a reproduction sets them with `task_options`
    max_operand = DEFAULT_MAX_OPERAND
    ops = DEFAULT_OPS

    def check_options(self, options: dict[str, Any]) -> None:
        check_knobs(options["steps"], options["max_operand"], options["ops"])

    def default_generated_size(self, split: str) -> int:
        return 500 if split == "test" else 20000

    def make_item(self, index: int, start: int, ops: list[tuple[str, int]], name: str, things: str,
                  split: str) -> Item:
        key = problem_key(start, ops)
        _, answer = solution_lines(start, ops)
        return Item(
            index=index,
            prompt_messages=[{"role": "user", "content": word_problem(start, ops, name, things)}],
            ground_truth=str(answer),
            extra={"index": index, "problem": key, "steps": len(ops), "split": split, "task": "math",
                   "data_source": "arith"},
        )

    def row_to_item(self, row: dict[str, Any], index: int, split: str) -> Item:
        item = super().row_to_item(row, index, split)  # GSM8K's rows: question + answer ending "#### n"
        return replace(item, extra={**item.extra, "data_source": "arith"})

    def generate(self, n: int, seed: int = 0, split: str = "test", steps: int | None = None,
                 max_operand: int | None = None, ops: str | None = None) -> TaskDataset:
        steps = self.steps if steps is None else steps
        max_operand = self.max_operand if max_operand is None else max_operand
        ops = self.ops if ops is None else ops
        # the default training set is "up to 20000" and a test set "up to n" (the evaluation's `limit` is a cap, as
        # on a file): a small space (single-digit operands, few operations) gives all it has
        at_most = split == "test" or n == self.default_generated_size("train")
        problems = generate_arith(n, seed, split, steps, max_operand, at_most=at_most, ops=ops)
        items = [self.make_item(i, *p, split) for i, p in enumerate(problems)]
        # the source names ops only when it is not the default, so the default datasets' sources stay as they were
        ops_part = "" if ops == DEFAULT_OPS else f",ops={ops}"
        source = f"generator:arith(seed={seed},n={n},steps={steps},max_operand={max_operand}{ops_part})"
        return TaskDataset(self.name, split, items, source=source, fingerprint=sha256_items(items))

    def plain_prompt(self, item: Item) -> str:
        if "problem" not in item.extra:  # a GSM8K-style row from a file: no compact form, GSM8K's plain prompt
            return super().plain_prompt(item)
        return f"arith {item.extra['problem']}\n"

    def format_answer(self, item: Item, grader: str | None = None) -> str:
        """Gold completion every grader accepts (steps, box, ``<answer>``, ``#### n``); ``grader="dare"`` /
        ``"strict"``: the shorter form without ``<answer>`` that those graders need."""
        gt = item.ground_truth
        lines: list[str] = []
        if "problem" in item.extra:
            lines, value = solution_lines(*parse_key(str(item.extra["problem"])))
            if str(value) != gt:
                raise DataError(f"arith item {item.index}: problem {item.extra['problem']!r} gives {value}, "
                                f"not the stored answer {gt!r}")
        lines.append(f"\\boxed{{{gt}}}")
        if grader not in ("dare", "strict"):
            lines.append(f"<answer>{gt}</answer>")
        lines.append(f"#### {gt}")
        return "\n".join(lines)
