"""HumanEval / MBPP graders through the sandbox: DARE's harness (quirks included) versus strict.

DARE (``code_reward.py``): the first fenced block (or the first one defining a function) is run as
``BASE_IMPORTS + code + test`` plus ``check(<first def>)`` — no prompt, no entry point. Programs run concurrently to
keep the suite fast.
"""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from dare_bench.errors import ConfigError
from dare_bench.tasks import get_task
from dare_bench.tasks.base import Item

HE_PROMPT = 'from typing import List\n\n\ndef add(x: int, y: int) -> int:\n    """Add two numbers."""\n'
HE = Item(0, [{"role": "user", "content": "Complete the following python code:\n" + HE_PROMPT}],
          "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate(1, 2) == 3\n"
          "    assert candidate(0, 0) == 0\n    assert candidate(-1, 1) == 0\n\n", {"task": "code"})
MBPP = Item(0, [{"role": "user", "content": "..."}, {"role": "assistant", "content": "[BEGIN]\n"}],
            json.dumps(['assert remove_Occ("hello","l") == "heo"', 'assert remove_Occ("abcda","a") == "bcd"',
                        'assert remove_Occ("PHP","P") == "H"']), {"task": "code"})
GOOD_MBPP = ("def remove_Occ(s,ch):\n    i = s.find(ch)\n    s = s[:i] + s[i+1:]\n    j = s.rfind(ch)\n"
             "    return s[:j] + s[j+1:]")


def fence(code):
    return f"Here is the code:\n```python\n{code}\n```\n"


HE_CASES = [
    # name, completion, dare, strict
    ("correct", fence("def add(x, y):\n    return x + y"), True, True),
    ("wrong", fence("def add(x, y):\n    return x - y"), False, False),
    ("raises", fence("def add(x, y):\n    raise ValueError('no')"), False, False),
    # DARE appends check(<first def>) only when the code defines a function: no def, no test call
    ("quirk_no_function_passes", fence("print('I will not write the function')"), True, False),
    # the first def is taken as the entry point: a helper defined first gets tested
    ("quirk_helper_first_fails", fence("def helper(v):\n    return v\n\ndef add(x, y):\n    return helper(x) + y"),
     False, True),
    # exit status 0 is a pass: sys.exit(0) before the tests run
    ("quirk_early_exit_passes", fence("import sys\ndef add(x, y):\n    return 0\nsys.exit(0)"), True, False),
    ("no_code_fence", "def add(x, y):\n    return x + y", False, False),
]


def _grade_all(task, item, cases):
    with ThreadPoolExecutor(max_workers=4) as pool:
        futs = {c[0]: pool.submit(lambda c: (task.grade(c[1], item, "dare"), task.grade(c[1], item, "strict")), c)
                for c in cases}
        return {k: f.result() for k, f in futs.items()}


def test_humaneval_table():
    task = get_task("humaneval")
    got = _grade_all(task, HE, HE_CASES)
    for name, _, dare, strict in HE_CASES:
        d, s = got[name]
        assert (d.correct, s.correct) == (dare, strict), (name, d.details, s.details)
        assert d.reward == float(dare)


MBPP_CASES = [
    ("begin_done_quoted", f" '{GOOD_MBPP}' \n[DONE] \n\n", True, True),
    ("fenced", fence(GOOD_MBPP), True, True),
    ("wrong_name", fence(GOOD_MBPP.replace("remove_Occ", "remove_occ")), False, False),
    ("too_short", " 'pass' \n[DONE]", False, False),
]


def test_mbpp_table():
    task = get_task("mbpp")
    got = _grade_all(task, MBPP, MBPP_CASES)
    for name, _, dare, strict in MBPP_CASES:
        d, s = got[name]
        assert (d.correct, s.correct) == (dare, strict), (name, d.details, s.details)


def test_d1_has_no_code_grader():
    for name in ("humaneval", "mbpp"):
        assert get_task(name).graders == ["dare", "strict"]
        with pytest.raises(ConfigError, match="does not exist"):
            get_task(name).grade("x", HE, grader="d1")


def test_dare_harness_program_text():
    from dare_bench.tasks.graders.dare import BASE_IMPORTS, extract_code, humaneval_program, timed

    code = extract_code(fence("def add(x, y):\n    return x + y") + fence("print(add(1, 2))"))
    assert code == "def add(x, y):\n    return x + y"  # the block with a def wins
    program, timeout = humaneval_program(code, HE.ground_truth)
    assert timeout == 3 and program.startswith("\n" + BASE_IMPORTS) and program.count("check(add)") == 2
    assert "import pandas as pd" in BASE_IMPORTS and "zip_longest, cycle, pairwise" in BASE_IMPORTS
    # the timing markers wrap the code and tests only; the official text is otherwise unchanged
    timed_program = timed(program)
    assert timed_program.startswith("\n" + BASE_IMPORTS + "import time as _dare_bench_time")
    assert program.strip() in timed_program.replace(
        "import time as _dare_bench_time\n_dare_bench_t0 = _dare_bench_time.perf_counter()\n", "")


@pytest.mark.slow
def test_infinite_loop_times_out():
    task = get_task("humaneval")
    loop = fence("def add(x, y):\n    while True:\n        pass")
    for grader in ("dare", "strict"):
        r = task.grade(loop, HE, grader)
        assert not r.correct and r.details["status"] == "timeout"


def test_grade_many_keeps_order_and_runs_code_concurrently():
    task = get_task("mbpp")
    completions = [fence(GOOD_MBPP), "no code", fence(GOOD_MBPP.replace("return s[:j]", "return s[:j+1]"))]
    results = task.grade_many(completions, [MBPP] * 3, grader="strict")
    assert [r.correct for r in results] == [True, False, False]
    with pytest.raises(ConfigError):
        task.grade_many(["a"], [MBPP, MBPP])


def test_strict_mbpp_entry_point_skips_builtins_and_modules():
    from dare_bench.tasks.graders.strict import mbpp_entry_point

    assert mbpp_entry_point(["assert math.isclose(area_tetra(3), 15.58, rel_tol=0.001)"]) == "area_tetra"
    assert mbpp_entry_point(["assert set(similar((3, 4), (4, 5))) == set((4,))"]) == "similar"
    assert mbpp_entry_point(["assert sum(10,15) == 6"]) == "sum"  # an MBPP task really is named sum


def test_grader_parses_are_serialised_across_threads():
    """CPython 3.11's AST converter is not thread-safe (gh-106905): a concurrent parse once scored a correct HumanEval
    answer wrong with "AST constructor recursion depth mismatch". Graders parse through one lock."""
    import threading

    from dare_bench.tasks.graders import pyast

    done = threading.Event()
    with pyast._PARSE_LOCK:
        worker = threading.Thread(target=lambda: (pyast.parse("x = 1"), done.set()))
        worker.start()
        assert not done.wait(0.3)  # blocked while another parse holds the lock
    assert done.wait(5)
    worker.join()


def test_parsing_generated_code_raises_no_syntax_warning():
    """`[v*7for v in a]` (a tiny replica's rollout) parses with Python's "invalid decimal literal" SyntaxWarning,
    which went to stderr once per rollout in sweep worker logs; the graders' parse silences it, and only it."""
    import ast
    import warnings

    from dare_bench.tasks.graders import pyast

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tree = pyast.parse("y = [v*7for v in a]")
        assert isinstance(tree.body[0], ast.Assign)
        assert not [w for w in caught if issubclass(w.category, SyntaxWarning)]
        ast.parse("y = [v*7for v in a]")  # outside the graders' parse it still warns
        assert [w for w in caught if issubclass(w.category, SyntaxWarning)]
