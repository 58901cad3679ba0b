"""The ``d1`` grader: d1's training rewards (``diffu-grpo/reward_func.py``) and its evaluation verdicts
(``eval/parse_and_get_acc.py``), reproduced rule for rule, quirks included.

``reward`` = the sum of the reward functions d1's ``diffu_grpo_train.py`` enables for the task;
``correct``/``score`` = what ``parse_and_get_acc.py`` counts. The two often disagree by design: d1 trains on
``<answer>`` tags and evaluates GSM8K on ``\\boxed{}`` first.

Quirks reproduced (tests named ``test_quirk_*`` or table rows in ``tests/tasks/test_graders_{puzzles,math}.py``):

- GSM8K reward: correctness is *string* equality of the stripped ``<answer>`` text with the gold ("18.0", "$18" and
  "18 dollars" get 0); without ``<answer>`` the whole completion is the "answer"; the int bonus uses ``str.isdigit``.
- GSM8K eval: the FIRST ``\\boxed{...}`` whose content parses wins (non-greedy ``\\boxed{(.*?)}``: for
  ``\\boxed{\\frac{1}{2}}`` the content is ``\\frac{1``); ``"1,000"`` is read as 1 (first ``-?\\d+\\.?\\d*`` match);
  inside ``<answer>`` the LAST number wins; compared as floats, so "18.0" is right.
- MATH reward: no ``\\boxed`` → the whole completion is compared; the format bonus is 0.75 with an ``<answer>`` tag
  and 0.25 without, whatever the box (see ``hendrycks.boxed_in_answer``).
- MATH eval: the last box; with no box at all the WHOLE completion is the answer (d1's helper returns its input), so
  ``<answer>`` is only consulted when the completion is empty or a box never closes; Hendrycks ``is_equiv``.
- Countdown reward: last ``<answer>``; 0 without one, 0.1 for a wrong / invalid / unevaluable expression, 1 when
  |value − target| < 1e-5; numbers are checked as the multiset of ``\\d+`` runs (so "2.5" uses 2 and 5).
- Countdown eval: the last ``\\boxed{}``; with no box the WHOLE completion, from which the first ``expr = number``
  run is cut out (so an equation written in the reasoning counts, and ``<answer>`` is ignored); the first
  ``<answer>`` only when a box never closes; ``\\times``/``\\div``/``\\cdot`` are translated.
- Sudoku reward: digits of the last ``<answer>`` (``str.isdigit``, separators dropped), padded/truncated to 16;
  reward = fraction of blank cells right. Eval: first ``<answer>`` (or fallbacks), only whitespace removed — a
  separator such as ``|`` shifts every later cell; score = cell accuracy (the official metric), correct = all right.
- d1's ``coding_reward_func`` targets KodCode (``from solution import`` tests), a task dare-bench does not register,
  and d1 has no HumanEval/MBPP evaluation: the d1 × humaneval / mbpp pairs do not exist (ConfigError).
- GSM8K gold for the evaluation is the number after ``####`` with commas removed (d1 compares floats; the forks
  we could read parse it this way).
"""

from __future__ import annotations

import json
import re

from dare_bench.tasks.base import GradeResult, Item
from dare_bench.tasks.graders import hendrycks as H
from dare_bench.tasks.graders.safe_eval import python_arith_eval

# ---------------------------------------------------------------------------------------------- XML helpers


def extract_xml_answer(text: str) -> str:
    answer = text.split("<answer>")[-1]
    answer = answer.split("</answer>")[0]
    return answer.strip()


def count_xml(text: str) -> float:
    count = 0.0
    if text.count("<reasoning>\n") == 1:
        count += 0.125
    if text.count("\n</reasoning>\n") == 1:
        count += 0.125
    if text.count("\n<answer>\n") == 1:
        count += 0.125
        count -= len(text.split("\n</answer>\n")[-1]) * 0.001
    if text.count("\n</answer>") == 1:
        count += 0.125
        count -= (len(text.split("\n</answer>")[-1]) - 1) * 0.001
    return count


_STRICT_FMT = re.compile(r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$", re.DOTALL)
_SOFT_FMT = re.compile(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>", re.DOTALL)


def strict_format_reward(text: str) -> float:
    return 0.5 if _STRICT_FMT.match(text) else 0.0


def soft_format_reward(text: str) -> float:
    return 0.5 if _SOFT_FMT.match(text) else 0.0


def last_answer_tag(text: str) -> str | None:
    """d1 ``extract_solution``: the last ``<answer>...</answer>`` body, stripped."""
    matches = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    return matches[-1].strip() if matches else None


# ---------------------------------------------------------------------------------------------- GSM8K


def gsm8k_reward(text: str, gold: str) -> tuple[float, dict[str, float]]:
    extracted = extract_xml_answer(text)
    parts = {
        "xmlcount": count_xml(text),
        "soft_format": soft_format_reward(text),
        "strict_format": strict_format_reward(text),
        "int": 0.5 if extracted.isdigit() else 0.0,
        "correctness": 2.0 if extracted == gold else 0.0,
    }
    return sum(parts.values()), parts


_NUM = re.compile(r"-?\d+\.?\d*")


def gsm8k_eval_parse(text: str) -> float | None:
    parsed = None
    for boxed in re.findall(r"\\boxed{(.*?)}", text):
        boxed = boxed.strip()
        if boxed and boxed != "..." and not re.match(r"^\.+$", boxed):
            try:
                parsed = float(boxed)
                break
            except ValueError:
                numbers = _NUM.findall(boxed)
                if numbers:
                    try:
                        parsed = float(numbers[0])
                        break
                    except ValueError:
                        pass
    if parsed is None:
        m = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)
        if m:
            body = m.group(1).strip()
            if body:
                try:
                    parsed = float(body)
                except ValueError:
                    numbers = _NUM.findall(body)
                    if numbers:
                        try:
                            parsed = float(numbers[-1])
                        except ValueError:
                            pass
    return parsed


def gsm8k_gold_number(gold: str) -> float:
    # d1's eval stores the GSM8K answer as a number (the text after "####", commas removed)
    return float(gold.split("####")[-1].strip().replace(",", ""))


def grade_gsm8k(text: str, item: Item) -> GradeResult:
    gold = item.ground_truth
    reward, parts = gsm8k_reward(text, gold)
    parsed = gsm8k_eval_parse(text)
    correct = parsed is not None and parsed == gsm8k_gold_number(gold)
    return GradeResult(correct, reward, None if parsed is None else repr(parsed),
                       {"reward_parts": parts, "reward_extracted": extract_xml_answer(text)})


# ---------------------------------------------------------------------------------------------- MATH


def math_gold(gold: str) -> str:
    # d1 passes the gold through remove_boxed(last_boxed_only_string(...)); a plain answer comes back unchanged
    return H.remove_boxed(H.last_boxed_only_string(gold))


def math_reward(text: str, gold: str) -> tuple[float, dict[str, float], str]:
    r = text
    try:
        r = H.remove_boxed(H.last_boxed_only_string(text))
    except Exception:
        pass
    parts = {
        "correctness": 2.0 if H.is_equiv(r, math_gold(gold)) else 0.0,
        "boxed_and_answer_tags_format": H.boxed_in_answer(text) * 0.5,
    }
    return sum(parts.values()), parts, r


def math_eval_parse(text: str) -> str | None:
    try:
        parsed = H.remove_boxed(H.last_boxed_only_string(text))
    except Exception:
        parsed = None
    if not parsed:
        m = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)
        if m:
            parsed = m.group(1).strip()
    return parsed


def grade_math(text: str, item: Item) -> GradeResult:
    reward, parts, _ = math_reward(text, item.ground_truth)
    parsed = math_eval_parse(text)
    correct = parsed is not None and H.is_equiv(parsed, item.ground_truth)
    return GradeResult(correct, reward, parsed, {"reward_parts": parts})


# ---------------------------------------------------------------------------------------------- Countdown


def countdown_numbers(item: Item) -> list[int]:
    nums = item.extra["numbers"]
    if isinstance(nums, str):
        nums = json.loads(nums)
    return [int(x) for x in nums]


def _numbers_match(equation: str, numbers: list[int]) -> bool:
    try:
        return sorted(int(n) for n in re.findall(r"\d+", equation)) == sorted(numbers)
    except Exception:
        return False


_ALLOWED = re.compile(r"^[\d+\-*/().\s]+$")


def countdown_reward(text: str, numbers: list[int], target: int) -> tuple[float, str | None]:
    """d1 ``compute_score`` (format_score 0.1, score 1.0)."""
    equation = last_answer_tag(text)
    if equation is None:
        return 0.0, None
    if not _numbers_match(equation, numbers):
        return 0.1, equation
    try:
        if not _ALLOWED.match(equation):
            return 0.1, equation
        result = python_arith_eval(equation)
    except Exception:
        return 0.1, equation
    try:
        return (1.0 if abs(result - target) < 1e-5 else 0.1), equation
    except Exception:
        return 0.1, equation


def countdown_eval(text: str, numbers: list[int], target: int) -> tuple[bool, str]:
    try:
        equation = H.remove_boxed(H.last_boxed_only_string(text))
    except Exception:
        m = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)
        equation = m.group(1).strip() if m else text
    equation = equation.replace(r"\div", "/").replace(r"\times", "*").replace(r"\cdot", "*")
    m = re.search(r"([0-9+\-*/() ]+)=[0-9. ]+", equation)
    if m:
        equation = m.group(1).strip()
    if not _numbers_match(equation, numbers):
        return False, equation
    try:
        if not _ALLOWED.match(equation):
            raise ValueError("Invalid characters in equation.")
        result = python_arith_eval(equation.strip())
    except Exception:
        result = float("inf")
    # a non-numeric result (e.g. a tuple) makes the official script raise here; we score it wrong
    return bool(abs(result - target) < 1e-5), equation


def grade_countdown(text: str, item: Item) -> GradeResult:
    numbers, target = countdown_numbers(item), int(item.ground_truth)
    reward, _ = countdown_reward(text, numbers, target)
    try:
        correct, equation = countdown_eval(text, numbers, target)
    except Exception as e:
        return GradeResult(False, reward, None, {"eval_error": f"{type(e).__name__}: {e}"})
    return GradeResult(correct, reward, equation, {})


# ---------------------------------------------------------------------------------------------- Sudoku


def sudoku_reward_extract(text: str) -> str | None:
    matches = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    if matches:
        return "".join(ch for ch in matches[-1].strip() if ch.isdigit())
    return None


def sudoku_cells(solution: str, gold: str, puzzle: str) -> tuple[int, int]:
    """(correct blank cells, blank cells) after d1's pad-with-'0' / truncate-to-16."""
    if len(solution) < 16:
        solution = solution + "0" * (16 - len(solution))
    elif len(solution) > 16:
        solution = solution[:16]
    empty = [i for i in range(16) if puzzle[i] == "0"]
    return sum(1 for i in empty if solution[i] == gold[i]), len(empty)


def sudoku_reward(text: str, gold: str, puzzle: str) -> float:
    solution = sudoku_reward_extract(text)
    if not solution:
        return 0.0
    right, empty = sudoku_cells(solution, gold, puzzle)
    return right / empty if empty else 0.0


_SUDOKU_EVAL_PATTERNS = [
    r"<answer>.*?```\s*([\d\s]+)```",
    r"<answer>(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|</answer>)",
    r"</answer>\s*(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|$)",
    # official: r".*?(\d{16})\s*</answer>" — with DOTALL the lazy prefix only makes re.search find the leftmost
    # match, which re.search does anyway; dropping it gives the same group without quadratic time on long text
    r"(\d{16})\s*</answer>",
    r"\b(\d{16})\b",
]


def sudoku_eval_extract(text: str) -> str:
    solution = ""
    for pattern in _SUDOKU_EVAL_PATTERNS:
        if solution:
            break
        m = re.search(pattern, text, re.DOTALL)
        if m and m.group(1).strip():
            solution = m.group(1).strip()
    return re.sub(r"\s", "", solution)


def grade_sudoku(text: str, item: Item) -> GradeResult:
    puzzle, gold = sudoku_puzzle(item), item.ground_truth
    reward = sudoku_reward(text, gold, puzzle)
    solution = sudoku_eval_extract(text)
    empty = sum(1 for ch in puzzle if ch == "0")
    right = sudoku_cells(solution, gold, puzzle)[0] if solution else 0
    acc = right / empty if empty else 0.0
    return GradeResult(bool(empty) and right == empty, reward, solution or None,
                       {"correct_cells": right, "empty_cells": empty}, score=acc)


def sudoku_puzzle(item: Item) -> str:
    puzzle = str(item.extra["puzzle"])
    if len(puzzle) != 16:
        raise ValueError(f"invalid puzzle string {puzzle!r}")
    return puzzle


__all__ = [
    "grade_countdown", "grade_gsm8k", "grade_math", "grade_sudoku",
    "countdown_reward", "countdown_eval", "gsm8k_reward", "gsm8k_eval_parse", "math_reward", "math_eval_parse",
    "sudoku_reward", "sudoku_eval_extract", "extract_xml_answer", "count_xml", "last_answer_tag",
]
