"""Sudoku and Countdown graders: dare / d1 / strict verdicts on realistic and awkward completions.

Expected values are derived by hand from the official code (DARE ``math_reward.py``; d1 ``reward_func.py`` and
``eval/parse_and_get_acc.py``); each row says why. Tuples are (correct, reward, score).
"""

import json
import time

import pytest

from dare_bench.tasks import get_task
from dare_bench.tasks.base import Item

SUDOKU = Item(0, [{"role": "user", "content": "..."}], "3142243142131324", {"puzzle": "3102200002100320"})
# blanks at 2,5,6,7,8,11,12,15 -> gold digits 4,4,3,1,4,3,1,4


def cd(numbers, target):
    return Item(0, [{"role": "user", "content": "..."}], str(target), {"numbers": json.dumps(numbers)})


CD = cd([30, 100, 93], 23)

SUDOKU_CASES = [
    # name, completion, dare, d1, strict
    ("plain", "<reasoning>\nok\n</reasoning>\n<answer>\n3142243142131324\n</answer>\n",
     (True, 1.0, 1.0), (True, 1.0, 1.0), True),
    ("rows_on_lines", "<answer>\n3142\n2431\n4213\n1324\n</answer>", (True, 1.0, 1.0), (True, 1.0, 1.0), True),
    ("spaces", "<answer>3 1 4 2 2 4 3 1 4 2 1 3 1 3 2 4</answer>", (True, 1.0, 1.0), (True, 1.0, 1.0), True),
    # d1's evaluation removes only whitespace: '|' shifts cells -> 2 of 8 blanks right; its reward keeps digits only
    ("pipe_separators", "<answer>3142|2431|4213|1324</answer>", (True, 1.0, 1.0), (False, 1.0, 0.25), True),
    # no tags: rewards give 0, d1's evaluation falls back to any 16-digit run
    ("no_tags", "The solution is 3142243142131324.", (False, 0.0, 0.0), (True, 0.0, 1.0), False),
    # several answers: rewards read the last, d1's evaluation the first
    ("two_answers", "<answer>1111111111111111</answer> wait <answer>3142243142131324</answer>",
     (True, 1.0, 1.0), (False, 1.0, 0.25), True),
    ("truncated", "<reasoning>\nrow 1 is 3142\n</reasoning>\n<answer>\n31422431", (False, 0.0, 0.0),
     (False, 0.0, 0.0), False),
    ("eot_instead_of_close", "<answer>\n3142243142131324<|endoftext|>", (False, 0.0, 0.0), (True, 0.0, 1.0), False),
    # short answers are padded with '0': only blank 2 ('4') is right
    ("short_padded", "<answer>3142</answer>", (False, 0.125, 0.125), (False, 0.125, 0.125), False),
    # long answers are truncated to 16
    ("long_truncated", "<answer>31422431421313241234</answer>", (True, 1.0, 1.0), (True, 1.0, 1.0), False),
    # givens are never checked: changing given cell 0 still scores full marks officially
    ("changes_a_given", "<answer>4142243142131324</answer>", (True, 1.0, 1.0), (True, 1.0, 1.0), False),
    ("fenced_in_answer", "<answer>\n```\n3142 2431 4213 1324\n```\n</answer>", (True, 1.0, 1.0), (True, 1.0, 1.0),
     False),
    # the rewards keep only digits; d1's evaluation keeps "\boxed{" and shifts every cell (1 of 8 right)
    ("boxed_in_answer", "<answer>\n\\boxed{3142243142131324}\n</answer>", (True, 1.0, 1.0), (False, 1.0, 0.125),
     True),
    ("empty", "", (False, 0.0, 0.0), (False, 0.0, 0.0), False),
    ("empty_answer", "<answer></answer>", (False, 0.0, 0.0), (False, 0.0, 0.0), False),
]


@pytest.mark.parametrize("name,text,dare,d1,strict", SUDOKU_CASES, ids=[c[0] for c in SUDOKU_CASES])
def test_sudoku_table(name, text, dare, d1, strict):
    task = get_task("sudoku")
    for grader, want in (("dare", dare), ("d1", d1)):
        r = task.grade(text, SUDOKU, grader)
        assert (r.correct, r.reward, r.score) == pytest.approx(want), (grader, r)
    assert task.grade(text, SUDOKU, "strict").correct is strict


def test_quirk_sudoku_alternative_solution_only_strict_accepts():
    # 3040413004000304 (a DARE test puzzle) has two solutions; the graders know one
    item = Item(0, [], "2143413214233214", {"puzzle": "3040413004000304"})
    from dare_bench.tasks.generators import count_sudoku_solutions, sudoku_is_solution
    assert count_sudoku_solutions("3040413004000304") == 2
    other = "3241413214232314"
    assert sudoku_is_solution(other) and all(p in ("0", o) for p, o in zip("3040413004000304", other))
    task = get_task("sudoku")
    text = f"<answer>{other}</answer>"
    assert not task.grade(text, item, "dare").correct and not task.grade(text, item, "d1").correct
    assert task.grade(text, item, "strict").correct


COUNTDOWN_CASES = [
    # name, item, completion, dare, d1, strict
    ("plain", CD, "<reasoning>\n...\n</reasoning>\n<answer>\n30-100+93\n</answer>", (True, 1.0, 1.0),
     (False, 1.0, 0.0), True),
    # d1's evaluation reads a box (its eval prompt asks for one); rewards read <answer>
    ("boxed_and_answer", CD, "\\boxed{30-(100-93)}\n<answer>30-(100-93)</answer>", (True, 1.0, 1.0),
     (True, 1.0, 1.0), True),
    ("boxed_only", CD, "so the answer is \\boxed{93-100+30}", (False, 0.0, 0.0), (True, 0.0, 1.0), True),
    # "= 23" brings the target's digits into the number check (0.1), d1's evaluation cuts "= value" off
    ("with_equals", CD, "\\boxed{30 - 100 + 93 = 23}\n<answer>30 - 100 + 93 = 23</answer>", (False, 0.1, 0.1),
     (True, 0.1, 1.0), True),
    ("number_twice", CD, "<answer>30*30/30-100+93</answer>", (False, 0.1, 0.1), (False, 0.1, 0.0), False),
    ("wrong_numbers", CD, "\\boxed{25-2}<answer>25-2</answer>", (False, 0.1, 0.1), (False, 0.1, 0.0), False),
    ("wrong_value", CD, "\\boxed{30+100-93}<answer>30+100-93</answer>", (False, 0.1, 0.1), (False, 0.1, 0.0),
     False),
    ("no_answer_at_all", CD, "I could not find it.", (False, 0.0, 0.0), (False, 0.0, 0.0), False),
    # the last <answer> counts for rewards
    ("two_answers", CD, "<answer>1+1</answer> no: <answer>30-100+93</answer>", (True, 1.0, 1.0),
     (False, 1.0, 0.0), True),
    # "--30" is 30 in Python; strict refuses unary tricks
    ("double_negation", CD, "\\boxed{--30-100+93}<answer>--30-100+93</answer>", (True, 1.0, 1.0), (True, 1.0, 1.0),
     False),
    ("decimal_point", CD, "<answer>30.0-100+93</answer>", (False, 0.1, 0.1), (False, 0.1, 0.0), False),
    ("latex_operators", cd([6, 4, 3], 8), "\\boxed{6 \\times 4 \\div 3}\n<answer>6 \\times 4 \\div 3</answer>",
     (False, 0.1, 0.1), (True, 0.1, 1.0), True),
    ("division_float", cd([6, 4, 3], 8), "\\boxed{6*4/3}\n<answer>6*4/3</answer>", (True, 1.0, 1.0),
     (True, 1.0, 1.0), True),
    ("division_by_zero", cd([5, 5, 3], 3), "\\boxed{3+5/(5-5)}<answer>3+5/(5-5)</answer>", (False, 0.1, 0.1),
     (False, 0.1, 0.0), False),
    # ** passes the official character whitelist
    ("power", cd([2, 3, 1], 9), "\\boxed{3**2*1}<answer>3**2*1</answer>", (True, 1.0, 1.0), (True, 1.0, 1.0), False),
    ("floor_division", cd([7, 2, 1], 3), "\\boxed{7//2*1}<answer>7//2*1</answer>", (True, 1.0, 1.0),
     (True, 1.0, 1.0), False),
    ("unbalanced", CD, "\\boxed{30-(100-93}<answer>30-(100-93</answer>", (False, 0.1, 0.1), (False, 0.1, 0.0),
     False),
    ("truncated", CD, "<reasoning>\n30-(100-93) = 23\n</reasoning>\n<answer>\n30-(100", (False, 0.0, 0.0),
     (True, 0.0, 1.0), False),
]


@pytest.mark.parametrize("name,item,text,dare,d1,strict", COUNTDOWN_CASES, ids=[c[0] for c in COUNTDOWN_CASES])
def test_countdown_table(name, item, text, dare, d1, strict):
    task = get_task("countdown")
    for grader, want in (("dare", dare), ("d1", d1)):
        r = task.grade(text, item, grader)
        assert (r.correct, r.reward, r.score) == pytest.approx(want), (grader, r)
    assert task.grade(text, item, "strict").correct is strict


def test_quirk_countdown_format_score_counts_as_dare_accuracy():
    # DARE's dllm_rm returns acc = score, so every well-formed wrong answer adds 0.1 to its countdown accuracy
    r = get_task("countdown").grade("<answer>30+100-93</answer>", CD, "dare")
    assert r.correct is False and r.score == pytest.approx(0.1)


def test_quirk_countdown_huge_power_does_not_hang():
    # 99**99**99 passes the whitelist; eval would run out of time/memory. It cannot equal the target.
    t0 = time.time()
    r = get_task("countdown").grade("\\boxed{99**99**99}<answer>99**99**99</answer>", cd([99, 99, 99], 1), "dare")
    assert r.reward == pytest.approx(0.1) and not r.correct and time.time() - t0 < 2


def test_quirk_countdown_d1_eval_takes_first_equation_of_unboxed_text():
    # no box: d1's evaluation searches the whole completion for "expr = number" and validates that expression
    text = "try 30 + 100 - 93 = 37, no. Then 30 - 100 + 93 = 23.\n<answer>30-100+93</answer>"
    r = get_task("countdown").grade(text, CD, "d1")
    assert r.extracted == "30 + 100 - 93" and r.correct is False


def test_sudoku_eval_pattern_rewrite_matches_the_official_regex():
    import random
    import re

    official, ours = r".*?(\d{16})\s*</answer>", r"(\d{16})\s*</answer>"
    rng = random.Random(0)
    for _ in range(500):
        s = "".join(rng.choice("0123456789 \n</answer>ax") for _ in range(rng.randint(0, 60)))
        if rng.random() < 0.6:
            s += "".join(rng.choice("0123456789") for _ in range(rng.randint(14, 20))) + rng.choice(
                ["</answer>", " \n</answer>", "x"]) + s
        a, b = re.search(official, s, re.DOTALL), re.search(ours, s, re.DOTALL)
        assert (a and a.group(1)) == (b and b.group(1))
