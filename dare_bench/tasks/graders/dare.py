"""The ``dare`` grader (default): DARE's ``dllm_rm`` reward, which is also DARE's validation accuracy.

Source: ``verl/utils/reward_score/{__init__,math_reward,code_reward}.py`` and ``code_utils/{humanevalplus,utils}.py``,
read at hxhcreate/DARE@f4999da (a fork of yjyddq/DARE; upstream's ``reward_score`` folder is not in the code
index, the wiring — ``dllm_rm`` routing ``extra_info.task`` math/code — matches upstream's recipes and reward manager).
``dllm_rm`` returns ``{"score", "acc", "pred"}``; here ``reward`` = score, ``score`` = acc (the per-item number DARE's
validation averages), ``correct`` = acc == 1.

Routing and quirks (tests named ``test_quirk_*`` / ``quirk_*`` rows in ``tests/tasks/test_graders_*.py``):

- math tasks (GSM8K, MATH500, AIME): only the LAST ``\\boxed{...}`` counts, and only when the completion contains
  ``\\boxed``; ``<answer>`` tags are ignored, so d1-format completions score 0. ``\\boxed 5`` (no braces) and an
  unclosed box extract nothing. Grading is ``sympy_grader.grade`` (Hendrycks string match, then sympy).
- countdown (routed through the math reward by ``data_source``): d1's rule (last ``<answer>``; 0 / 0.1 / 1) — and the
  0.1 "format score" is also the *accuracy*: a well-formed wrong answer counts 0.1 in DARE's countdown accuracy. The
  official ``abs(result - target)`` is unguarded (a non-numeric result would raise; the whitelist makes that
  unreachable in practice — scored 0 here if it ever happens); ``**`` and ``//`` pass the whitelist.
- sudoku: d1's rule; the cell fraction is both reward and accuracy.
- humaneval: the first fenced code block (or the first block defining a function) is run as
  ``BASE_IMPORTS + code + test`` with no prompt prepended; ``check(<first def name>)`` is appended twice. Code that
  defines no function (or binds the name with a lambda) never calls ``check`` at all and passes if it merely runs; code
  whose first function is a helper calls ``check(helper)``; the ``if __name__ == "__main__"`` block is removed. Exit
  status 0 is a pass, so ``sys.exit(0)`` before the tests passes. Timeout: 1 s per
  ``assert`` in the test.
- mbpp: code from OpenCompass-style ``[BEGIN] ... [DONE]`` / fence patterns (at least 10 characters), run with the
  asserts appended; 1 s per assert.

Deliberate deviations: code runs in ``dare_bench.sandbox`` (own uid, no network, read-only filesystem
outside its directory, 2 GiB memory limit) without the audit hook where those OS layers exist — DARE's harness has no
hook, and the hook refuses the ``subprocess`` import that pandas (in the preamble) performs; where they do not, the hook
stays on and the preamble's pandas import is dropped (recorded in ``details``). DARE's budget (1 s per assert) is
applied to the code and tests only, timed after the preamble's imports, which are machine-dependent (see
``STARTUP_GRACE_S``). Sympy comparisons time out (see ``sympy_grader``).
"""

from __future__ import annotations

import ast
import json
import re

from dare_bench.sandbox import isolation, run_code
from dare_bench.tasks.base import GradeResult, Item
from dare_bench.tasks.graders import pyast, sympy_grader
from dare_bench.tasks.graders.safe_eval import python_arith_eval

# ---------------------------------------------------------------------------------------------- math


def last_boxed_only_string(string: str) -> str | None:
    idx = string.rfind("\\boxed")
    if idx < 0:
        idx = string.rfind("\\fbox")
        if idx < 0:
            return None
    depth = 0
    for i in range(idx, len(string)):
        if string[i] == "{":
            depth += 1
        if string[i] == "}":
            depth -= 1
            if depth == 0:
                return string[idx : i + 1]
    return None


def remove_boxed(s: str | None) -> str | None:
    left = "\\boxed{"
    if s is None or s[: len(left)] != left or s[-1:] != "}":
        return None
    return s[len(left) : -1]


def extract_answer(passage: str) -> str | None:
    if "\\boxed" in passage:
        return remove_boxed(last_boxed_only_string(passage))
    return None


def math_acc(pred: str | None, label: str) -> int:
    if pred is None or label == "":
        return 0
    truth = str(label)
    if "\\boxed" in truth:
        truth = extract_answer(truth)
        if truth is None:
            return 0
    return 1 if sympy_grader.grade(pred, truth) else 0


def grade_math(text: str, item: Item) -> GradeResult:
    pred = extract_answer(text)
    acc = math_acc(pred, item.ground_truth)
    return GradeResult(acc == 1, float(acc), pred, {}, score=float(acc))


# ---------------------------------------------------------------------------------------------- countdown / sudoku


def countdown_acc(text: str, target: int, numbers: list[int], format_score: float = 0.1) -> tuple[str | None, float]:
    matches = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    equation = matches[-1].strip() if matches else None
    if equation is None:
        return None, 0.0
    try:
        ok = sorted(int(n) for n in re.findall(r"\d+", equation)) == sorted(numbers)
    except Exception:
        ok = False
    if not ok:
        return equation, format_score
    try:
        if not re.match(r"^[\d+\-*/().\s]+$", equation):
            raise ValueError("Invalid characters in equation.")
        result = python_arith_eval(equation)
    except Exception:
        result = None
    if result is None:
        return equation, format_score
    # not guarded officially: a non-numeric result raises out of the reward function
    return equation, (1.0 if abs(result - target) < 1e-5 else format_score)


def grade_countdown(text: str, item: Item) -> GradeResult:
    from dare_bench.tasks.graders.d1 import countdown_numbers

    try:
        pred, acc = countdown_acc(text, int(item.ground_truth), countdown_numbers(item))
    except TypeError as e:
        return GradeResult(False, 0.0, None, {"error": f"official reward raises here: {e}"}, score=0.0)
    return GradeResult(acc == 1.0, acc, pred, {}, score=acc)


def grade_sudoku(text: str, item: Item) -> GradeResult:
    from dare_bench.tasks.graders.d1 import sudoku_puzzle, sudoku_reward, sudoku_reward_extract

    acc = sudoku_reward(text, item.ground_truth, sudoku_puzzle(item))
    return GradeResult(acc == 1.0, acc, sudoku_reward_extract(text), {}, score=acc)


# ---------------------------------------------------------------------------------------------- code

BASE_IMPORTS = "\n".join([
    "from itertools import accumulate, chain, combinations, count, permutations, product, groupby, islice, repeat",
    "from copy import deepcopy",
    "from string import ascii_lowercase, ascii_uppercase",
    "from math import floor, log2, log10, sqrt, comb, gcd, ceil, inf, isqrt, factorial, atan2, pi",
    "from collections import defaultdict, deque, Counter",
    "from bisect import bisect, bisect_left, bisect_right, insort",
    "from heapq import heappush, heappop, heapify, merge, nlargest, nsmallest, heapreplace",
    "from functools import reduce, cache, lru_cache, cmp_to_key, reduce",
    "from random import randrange, shuffle",
    "from operator import itemgetter, sub, xor, or_",
    "from re import search as re_search  # Assuming 're' refers to a regex search",
    "from os.path import commonprefix",
    "from typing import List, Tuple, Dict, Set, Optional, Union, Any, Callable, Iterable, Iterator, Generator, Deque",
    "import copy", "import string", "import math", "import collections", "import bisect", "import heapq",
    "import functools", "import random", "import itertools", "import operator", "import re", "import datetime",
    "from time import time",
    "import numpy as np",
    "import pandas as pd",
    "from math import log, prod  # 'log' and 'prod' are functions in the math module",
    "from collections import deque, defaultdict, Counter, OrderedDict",
    "from itertools import accumulate, permutations, combinations, product, groupby, islice, chain, repeat, "
    "zip_longest, cycle, pairwise",
    "from functools import lru_cache, reduce, partial",
    "from operator import iand",
    "import sys",
    "import io, os",
    "",
])


def extract_code(response: str) -> str | None:
    blocks = re.findall(r"```(?:\w+)?\s*\n(.*?)```", response, re.DOTALL)
    if not blocks:
        return None
    if len(blocks) == 1:
        return blocks[0].strip()
    for block in blocks:
        block = block.strip()
        if re.search(r"def\s+\w+\s*\(", block):
            return block
    return blocks[-1].strip()


_MBPP_PATTERNS = [
    r"\[BEGIN\]\s*'(.*)'\s*\[DONE\]", r"BEGIN\s*'(.*)'\s*\[DONE\]", r"\[BEGIN\]\s*'(.*)'\s*DONE",
    r"BEGIN\s*'(.*)'\s*DONE", r"\[BEGIN\]\s*'(.*)\s*\[DONE\]", r"BEGIN\s*'(.*)\s*\[DONE\]",
    r"\[BEGIN\]\s*'(.*)\s*DONE", r"BEGIN\s*'(.*)\s*DONE", r"\[BEGIN\]\s*(.*)\s*\[DONE\]", r"BEGIN\s*(.*)\s*\[DONE\]",
    r"\[BEGIN\]\s*(.*)\s*DONE", r"BEGIN\s*(.*)\s*DONE", r"```python\s*(.*)\s*```", r"```\s*(.*)\s*```",
    r"```python\s*(.*)\s*$", r"```\s*(.*)\s*$", r"(.*)\s*```.*", r"\[BEGIN\]\s*'(.*)", r"\[BEGIN\](.*)",
    r"'(.*)'\s*\[DONE\]",
]


def extract_code_mbpp(response: str) -> str | None:
    text = response
    for p in _MBPP_PATTERNS:
        m = re.search(p, text, re.DOTALL)
        if m:
            text = m.group(1)
            break
    text = text.split("```")[0]
    text = re.split(r"'?\s*\[?DONE\]?", text)[0]
    text = text.replace("\\_", "_").strip()
    if not text or len(text.strip()) < 10:
        return None
    return text


def clean_main_block(code: str) -> str:
    out, skipping = [], False
    for line in code.split("\n"):
        s = line.strip()
        if s.startswith('if __name__ == "__main__"') or s.startswith("if __name__ == '__main__'"):
            skipping = True
            continue
        if skipping:
            if s and not line.startswith(" ") and not line.startswith("\t"):
                skipping = False
            else:
                continue
        out.append(line)
    return "\n".join(out)


def harness_program(code: str, test: str) -> str:
    return f"\n{BASE_IMPORTS}\n\n{code}\n\n{test}\n\n"


def humaneval_program(code: str, test: str) -> tuple[str, int]:
    """(program, timeout seconds) as DARE's ``humaneval_check_correctness`` builds them (entry_point=None)."""
    code = clean_main_block(code)
    try:
        n_tests = sum(isinstance(node, ast.Assert) for node in ast.walk(pyast.parse(test)))
    except SyntaxError:
        n_tests = test.count("assert ")
    m = re.search(r"def\s+(\w+)\s*\(", code)
    if m:
        # the official code appends the call in two places (entry_point is never passed): it runs twice
        test += f"\n\n# Execute the tests\ncheck({m.group(1)})"
        test += f"\n\n# Execute the tests\ncheck({m.group(1)})"
    return harness_program(code, test), n_tests


def mbpp_program(code: str, tests_json: str) -> tuple[str, int]:
    tests = json.loads(tests_json)
    return harness_program(clean_main_block(code), "\n".join(tests)), len(tests)


def official_exit_ok(res) -> bool:
    """DARE's harness passes on exit status 0, including an early ``sys.exit(0)`` (the sandbox flags that)."""
    if res.status == "timeout":
        return False
    if res.passed or res.returncode == 0:  # os._exit(0) skips the sandbox's end-of-program marker
        return True
    return res.returncode == 98 and "exited before running to its end" in (res.stderr or "")


# Officially the budget is 1 s per assert *including* interpreter start and BASE_IMPORTS (numpy + pandas), which take
# 0.3 s on a quiet machine and several seconds on a loaded one. To keep verdicts about the code, not the host, the
# program is timed from the end of the preamble to the end of the tests (markers below) and must fit in the official
# budget there; the sandbox's wall-clock limit gets STARTUP_GRACE_S on top for the imports.
STARTUP_GRACE_S = 10.0
_ELAPSED = "DARE-BENCH-ELAPSED"


def timed(program: str) -> str:
    """Insert timing markers after the preamble and after the tests (private names; the program text is unchanged)."""
    head, sep, rest = program.partition(BASE_IMPORTS)
    start = "import time as _dare_bench_time\n_dare_bench_t0 = _dare_bench_time.perf_counter()\n"
    end = ("\nimport sys as _dare_bench_sys\n"
           f"print('{_ELAPSED}', _dare_bench_time.perf_counter() - _dare_bench_t0, file=_dare_bench_sys.stderr)\n")
    return head + sep + start + rest + end


def _elapsed(stderr: str) -> float | None:
    m = re.search(_ELAPSED + r" ([0-9.eE+-]+)", stderr or "")
    return float(m.group(1)) if m else None


def _run(program: str, timeout: float):
    """Run like DARE's harness (no audit hook) where the OS isolation layers hold; otherwise keep the hook, which
    refuses the ``subprocess`` import pandas performs, so the preamble's pandas import is dropped."""
    iso = isolation()
    os_isolated = iso.own_uid and iso.network_namespace and iso.mount_namespace
    deviation = None
    program = timed(program)
    if not os_isolated:
        program = program.replace("import pandas as pd\n", "", 1)
        deviation = "audit-hooked sandbox: preamble's 'import pandas as pd' dropped"
    res = run_code(program, timeout=timeout + STARTUP_GRACE_S, memory_mb=2048, guard=not os_isolated)
    return res, deviation


def grade_code(text: str, item: Item, kind: str) -> GradeResult:
    code = extract_code_mbpp(text) if kind == "mbpp" else extract_code(text)
    if code is None:
        return GradeResult(False, 0.0, None, {"error": "No code found in model response"})
    program, timeout = (mbpp_program if kind == "mbpp" else humaneval_program)(code, item.ground_truth)
    if timeout <= 0:
        return GradeResult(False, 0.0, code, {"error": "no tests (official timeout 0)"})
    res, deviation = _run(program, float(timeout))
    elapsed = _elapsed(res.stderr)
    # no marker: the program ended early (sys.exit / os._exit) or failed; official_exit_ok decides
    ok = official_exit_ok(res) and (elapsed is None or elapsed <= timeout)
    details = {"status": res.status, "stderr": (res.stderr or "")[-2000:], "seconds": res.seconds,
               "code_seconds": elapsed, "budget_seconds": timeout}
    if deviation:
        details["deviation"] = deviation
    return GradeResult(ok, float(ok), code, details)
