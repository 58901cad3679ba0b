"""The ``strict`` grader: dare-bench's own verdicts, closing the exploitable holes of the official graders.

It is not an official grader and is never the default; use it to see how much of a score rests on grader leniency.
Reward = verdict (1.0 / 0.0) everywhere, so a policy cannot farm partial credit from malformed answers.

What it closes (per task):

- Sudoku / Countdown read the LAST ``<answer>`` body (a single ``\\boxed{}`` around it is unwrapped, as d1's
  evaluation prompts ask for), else the last ``\\boxed{}``.
- Sudoku: whitespace and the separators ``| , - + _ .`` are ignored, any other character fails; it must be exactly 16
  digits 1-4, keep every given of the puzzle and satisfy all rows, columns and boxes — so a valid alternative
  solution of a puzzle with several passes (the official graders compare with one stored grid, pad short answers
  with zeros, truncate long ones and keep the digits of any junk).
- Countdown: an optional trailing ``= target``; ``\\times`` / ``\\cdot`` / ``\\div`` read as operators; only
  integer literals, ``+ - * /`` and parentheses (no ``**``, ``//``, decimals, unary tricks such as ``--5``); every
  given number used exactly once as a literal; exact rational arithmetic (no 1e-5 tolerance).
- GSM8K / MATH: every ``\\boxed{}`` answer in the completion must agree (hedging with several boxes fails); the last
  box, else the last ``<answer>``, is graded; GSM8K compares exact rationals after removing thousands separators,
  currency and a trailing unit word; MATH uses the DARE symbolic check.
- Code: the program must define the entry point, and the official tests must actually be invoked
  (HumanEval ``check(entry_point)``; MBPP every assert), in the sandbox with a time and memory limit.
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction

from dare_bench.sandbox import run_code
from dare_bench.tasks.base import GradeResult, Item
from dare_bench.tasks.generators import sudoku_is_solution
from dare_bench.tasks.graders import pyast

# ---------------------------------------------------------------------------------------------- Sudoku

_SUDOKU_SEPARATORS = re.compile(r"[\s|,\-+_.]")


def tagged_answer(text: str) -> str | None:
    """The last ``<answer>`` body, else the last ``\\boxed{}``; a single box around the body is unwrapped (d1's
    evaluation prompts ask for ``<answer>\\boxed{...}</answer>``)."""
    matches = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    if matches:
        body = matches[-1].strip()
        inner = all_boxed(body)
        if len(inner) == 1 and re.fullmatch(r"\\(?:boxed|fbox)\s*\{.*\}", body, re.DOTALL):
            return inner[0].strip()
        return body
    boxes = all_boxed(text)
    return boxes[-1].strip() if boxes else None


def strict_sudoku_extract(text: str) -> str | None:
    body = tagged_answer(text)
    return None if body is None else _SUDOKU_SEPARATORS.sub("", body)


def grade_sudoku(text: str, item: Item) -> GradeResult:
    puzzle = str(item.extra["puzzle"])
    grid = strict_sudoku_extract(text)
    if grid is None:
        return GradeResult(False, 0.0, None, {"reason": "no <answer> block and no \\boxed{}"})
    keeps_givens = len(grid) == 16 and all(p == "0" or p == g for p, g in zip(puzzle, grid))
    ok = keeps_givens and sudoku_is_solution(grid)
    if ok:
        reason = "ok"
    elif keeps_givens or len(grid) != 16:
        reason = "not 16 digits 1-4 / breaks a rule"
    else:
        reason = "changes a given"
    return GradeResult(ok, float(ok), grid, {"reason": reason})


# ---------------------------------------------------------------------------------------------- Countdown


class _Reject(Exception):
    pass


def _strict_arith(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.Expression):
        return _strict_arith(node.body, used)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        a, b = _strict_arith(node.left, used), _strict_arith(node.right, used)
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        if b == 0:
            raise _Reject("division by zero")
        return a / b
    raise _Reject(f"disallowed syntax: {type(node).__name__}")


def exact_value(expr: str) -> Fraction | None:
    """The exact value of an expression of integers, + - * / and parentheses, with the usual precedence (None:
    other syntax, or a division by zero)."""
    try:
        return _strict_arith(pyast.parse(expr.replace("\n", " ").strip(), mode="eval"), [])
    except (_Reject, SyntaxError, ValueError):
        return None


def strict_countdown_value(expr: str, numbers: list[int], target: int) -> tuple[bool, str]:
    expr = expr.strip().replace("\\times", "*").replace("\\cdot", "*").replace("\\div", "/")
    m = re.fullmatch(r"(.*?)\s*=\s*(-?\d+)", expr, re.DOTALL)
    if m:
        if int(m.group(2)) != target:
            return False, "stated result is not the target"
        expr = m.group(1)
    if not re.fullmatch(r"[0-9+\-*/()\s]+", expr) or "**" in expr or "//" in expr:
        return False, "characters outside digits, + - * / and parentheses"
    try:
        tree = pyast.parse(expr.replace("\n", " ").strip(), mode="eval")
        used: list[int] = []
        value = _strict_arith(tree, used)
    except (_Reject, SyntaxError, ValueError) as e:
        return False, str(e)
    if sorted(used) != sorted(numbers):
        return False, f"numbers used {sorted(used)} != given {sorted(numbers)}"
    if value != target:
        return False, f"value {value} != target {target}"
    return True, "ok"


def grade_countdown(text: str, item: Item) -> GradeResult:
    from dare_bench.tasks.graders.d1 import countdown_numbers

    expr = tagged_answer(text)
    if expr is None:
        return GradeResult(False, 0.0, None, {"reason": "no <answer> block and no \\boxed{}"})
    ok, reason = strict_countdown_value(expr, countdown_numbers(item), int(item.ground_truth))
    return GradeResult(ok, float(ok), expr, {"reason": reason})


# ---------------------------------------------------------------------------------------------- GSM8K / MATH


def all_boxed(text: str) -> list[str]:
    """Contents of every balanced ``\\boxed{...}`` / ``\\fbox{...}``, in order of their opening (one linear pass)."""
    openers = {m.end() - 1 for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)}
    stack: list[tuple[int, bool]] = []
    found: list[tuple[int, str]] = []
    for i, ch in enumerate(text):
        if ch == "{":
            stack.append((i, i in openers))
        elif ch == "}" and stack:
            start, is_box = stack.pop()
            if is_box:
                found.append((start, text[start + 1 : i]))
    return [content for _, content in sorted(found)]


def final_answer(text: str) -> tuple[str | None, list[str]]:
    """The graded answer (last box, else last <answer> body) and every boxed answer."""
    from dare_bench.tasks.graders.d1 import last_answer_tag

    # an empty or "..." box is a format placeholder, not an answer
    boxes = [b for b in all_boxed(text) if not re.fullmatch(r"\s*\.*\s*", b)]
    if boxes:
        return boxes[-1].strip(), boxes
    return last_answer_tag(text), boxes


_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def parse_number(s: str) -> Fraction | None:
    """A plain number, with optional currency, thousands separators, ``\\frac``, ``a/b`` or a trailing unit word."""
    s = s.strip()
    s = re.sub(r"^\\text\{(.*)\}$", r"\1", s).strip()
    s = s.replace("\\$", "").replace("$", "").replace("\\!", "").replace("\\,", "").strip()
    s = re.sub(r"(?<=\d)\.$", "", s)  # a sentence-final period
    s = re.sub(r"\s*(?:\\text\{\s*[A-Za-z ]+\}|\\%|%|[A-Za-z]+(?:\s+[A-Za-z]+)?)\.?$", "", s).strip()
    m = re.fullmatch(r"-?\\[dt]?frac\{(-?\d+)\}\{(\d+)\}", s)
    if m:
        return Fraction(int(m.group(1)), int(m.group(2))) * (-1 if s.startswith("-") else 1)
    m = re.fullmatch(r"(-?\d+)\s*/\s*(\d+)", s)
    if m and int(m.group(2)) != 0:
        return Fraction(int(m.group(1)), int(m.group(2)))
    if _NUMBER.fullmatch(s):
        return Fraction(s.replace(",", ""))
    return None


def grade_gsm8k(text: str, item: Item) -> GradeResult:
    answer, boxes = final_answer(text)
    if answer is None:
        return GradeResult(False, 0.0, None, {"reason": "no \\boxed{} and no <answer>"})
    values = {parse_number(b) for b in boxes}
    if len(values) > 1:
        return GradeResult(False, 0.0, answer, {"reason": "several different boxed answers"})
    value = parse_number(answer)
    gold = parse_number(item.ground_truth.split("####")[-1])
    ok = value is not None and value == gold
    return GradeResult(ok, float(ok), answer, {"reason": "ok" if ok else f"{value} != {gold}"})


def grade_math(text: str, item: Item) -> GradeResult:
    from dare_bench.tasks.graders import sympy_grader

    answer, boxes = final_answer(text)
    if answer is None:
        return GradeResult(False, 0.0, None, {"reason": "no \\boxed{} and no <answer>"})
    others = {b.strip() for b in boxes[:-1]} - {answer}
    # more than a handful of distinct boxes is hedging whatever they say (and keeps sympy calls bounded)
    if len(others) > 8 or any(not sympy_grader.grade(b, answer) for b in others):
        return GradeResult(False, 0.0, answer, {"reason": "several different boxed answers"})
    ok = sympy_grader.grade(answer, item.ground_truth)
    return GradeResult(ok, float(ok), answer, {"reason": "ok" if ok else "not equivalent"})


# ---------------------------------------------------------------------------------------------- code


def _defines(code: str, name: str) -> bool:
    try:
        tree = pyast.parse(code)
    except SyntaxError:
        return False
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in tree.body)


def humaneval_entry_point(item: Item) -> str:
    if item.extra.get("entry_point"):
        return str(item.extra["entry_point"])
    prompt = item.prompt_messages[-1]["content"]
    names = re.findall(r"^def\s+(\w+)\s*\(", prompt, re.MULTILINE)
    if not names:
        raise ValueError("cannot tell the HumanEval entry point from the prompt")
    return names[-1]  # HumanEval prompts put helpers first and the function under test last


def grade_humaneval(text: str, item: Item) -> GradeResult:
    from dare_bench.tasks.graders.dare import extract_code

    entry = humaneval_entry_point(item)
    code = extract_code(text)
    if code is None or not _defines(code, entry):
        return GradeResult(False, 0.0, code, {"reason": f"no top-level def {entry}(...)"})
    prompt = item.prompt_messages[-1]["content"]
    imports = "\n".join(ln for ln in prompt.splitlines() if re.match(r"(import|from)\s+\w", ln))
    program = f"{imports}\n\n{code}\n\n{item.ground_truth}\n\ncheck({entry})\n"
    n_asserts = item.ground_truth.count("assert")
    res = run_code(program, timeout=float(max(3, n_asserts)), memory_mb=1024)
    return GradeResult(res.passed, float(res.passed), code, {"status": res.status, "stderr": res.stderr[-2000:]})


def mbpp_entry_point(tests: list[str]) -> str:
    """The function under test: the first called name that is not a builtin (``math.isclose(area(..))`` -> area),
    else the first name after ``assert`` (one MBPP task is literally called ``sum``)."""
    import builtins

    for t in tests:
        try:
            tree = pyast.parse(t)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not hasattr(builtins, node.func.id):
                return node.func.id
    m = re.search(r"assert\s+(?:not\s+)?\(?\s*(\w+)\s*\(", tests[0]) if tests else None
    if m is None:
        raise ValueError("cannot tell the MBPP function name from the tests")
    return m.group(1)


def grade_mbpp(text: str, item: Item) -> GradeResult:
    import json

    from dare_bench.tasks.graders.dare import extract_code, extract_code_mbpp

    tests = json.loads(item.ground_truth)
    name = mbpp_entry_point(tests)
    code = extract_code(text) or extract_code_mbpp(text)
    if code is None or not _defines(code, name):
        return GradeResult(False, 0.0, code, {"reason": f"no top-level def {name}(...)"})
    program = code + "\n\n" + "\n".join(tests) + "\n"
    res = run_code(program, timeout=float(max(3, len(tests))), memory_mb=1024)
    return GradeResult(res.passed, float(res.passed), code, {"status": res.status, "stderr": res.stderr[-2000:]})
