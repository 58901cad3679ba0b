"""GSM8K and MATH graders: dare / d1 / strict verdicts, derived by hand from the official code.

DARE: ``math_reward.py`` (last ``\\boxed{}`` only, Hendrycks then sympy). d1: ``reward_func.py`` (XML rewards; MATH
correctness on the last box or the whole completion) and ``parse_and_get_acc.py`` (GSM8K: first valid box, else
last number in ``<answer>``, floats; MATH: last box, else the whole completion).
"""

import pytest

from dare_bench.tasks import get_task
from dare_bench.tasks.base import Item


def g(gt):
    return Item(0, [{"role": "user", "content": "q"}], gt, {})


PERFECT_D1 = "<reasoning>\nShe sells 9 eggs at $2 each.\n</reasoning>\n<answer>\n18\n</answer>\n"

GSM_CASES = [
    # name, gold, completion, dare correct, d1 correct, strict correct
    ("d1_format_no_box", "18", PERFECT_D1, False, True, True),
    ("boxed_no_tags", "18", "9 * 2 = 18, so the answer is \\boxed{18}.", True, True, True),
    ("boxed_in_answer", "18", "<reasoning>\n9*2\n</reasoning>\n<answer>\n\\boxed{18}\n</answer>\n", True, True, True),
    ("float_18_0", "18", "\\boxed{18.0}", True, True, True),
    ("dollar", "18", "\\boxed{\\$18}", True, True, True),
    ("unit_word", "18", "\\boxed{18 dollars}", False, True, True),
    ("percent", "25", "\\boxed{25\\%}", True, True, True),
    ("x_equals", "18", "\\boxed{x = 18}", True, True, False),
    ("negative", "-5", "\\boxed{-5}", True, True, True),
    ("first_vs_last_box", "18", "First \\boxed{18}, on reflection \\boxed{20}.", False, True, False),
    ("skips_ellipsis_box", "18", "Format: \\boxed{...}. Answer: \\boxed{18}", True, True, True),
    ("boxed_without_braces", "18", "The answer is \\boxed 18", False, False, False),
    ("thousands_in_box", "1,000", "\\boxed{1,000}", True, False, True),
    ("thousands_plain_box", "1,000", "\\boxed{1000}", True, True, True),
    # inside <answer>, d1's evaluation takes the LAST number: "2,125" reads as 125
    ("thousands_in_answer", "2,125", "<answer>\n2,125\n</answer>", False, False, True),
    ("answer_sentence", "18", "<answer>\nThe answer is 18\n</answer>", False, True, False),
    ("truncated", "18", "<reasoning>\nSo she makes 9 * 2 = 18 dollars", False, False, False),
    # DARE: an integer gold needs an integer-looking answer (no sympy); d1's non-greedy regex reads "\\frac{36"
    ("integer_gold_rejects_unsimplified", "18", "\\boxed{\\frac{36}{2}}", False, False, True),
    ("empty", "18", "", False, False, False),
]


@pytest.mark.parametrize("name,gold,text,dare,d1,strict", GSM_CASES, ids=[c[0] for c in GSM_CASES])
def test_gsm8k_table(name, gold, text, dare, d1, strict):
    task = get_task("gsm8k")
    item = g(gold)
    got = {k: task.grade(text, item, k).correct for k in ("dare", "d1", "strict")}
    assert got == {"dare": dare, "d1": d1, "strict": strict}


def test_d1_gsm8k_training_reward_parts():
    task = get_task("gsm8k")
    r = task.grade(PERFECT_D1, g("18"), "d1")
    assert r.reward == pytest.approx(4.0)  # xmlcount .5 + soft .5 + strict .5 + int .5 + correctness 2
    assert r.details["reward_parts"] == pytest.approx(
        {"xmlcount": 0.5, "soft_format": 0.5, "strict_format": 0.5, "int": 0.5, "correctness": 2.0})
    # a box inside <answer> is what d1's EVAL prompt asks for, but its reward wants the bare number
    r = task.grade("<reasoning>\n9*2\n</reasoning>\n<answer>\n\\boxed{18}\n</answer>\n", g("18"), "d1")
    assert r.correct and r.reward == pytest.approx(1.5)
    # trailing junk after </answer> costs 0.001 per character in xmlcount and breaks the strict format
    r = task.grade(PERFECT_D1 + "xyz", g("18"), "d1")
    assert r.details["reward_parts"]["strict_format"] == 0.0
    assert r.details["reward_parts"]["xmlcount"] == pytest.approx(0.5 - 0.003 - 0.003)
    assert task.grade("no tags, \\boxed{18}", g("18"), "d1").reward == 0.0
    assert task.grade("<reasoning>\nSo 9 * 2 = 18 dollars", g("18"), "d1").reward == pytest.approx(0.125)


def test_quirk_d1_gsm8k_reward_is_string_equality():
    task = get_task("gsm8k")
    for text in ("<answer>\n18.0\n</answer>", "<answer>\n$18\n</answer>", "<answer>\n18 dollars\n</answer>"):
        assert task.grade(text, g("18"), "d1").details["reward_parts"]["correctness"] == 0.0
    # gold keeps DARE's thousands separator: "2125" earns nothing, "2,125" earns 2.0
    assert task.grade("<answer>\n2125\n</answer>", g("2,125"), "d1").details["reward_parts"]["correctness"] == 0.0
    assert task.grade("<answer>\n2,125\n</answer>", g("2,125"), "d1").details["reward_parts"]["correctness"] == 2.0


def test_quirk_dare_ignores_answer_tags():
    r = get_task("gsm8k").grade(PERFECT_D1, g("18"), "dare")
    assert r.correct is False and r.reward == 0.0 and r.extracted is None


HALF = "\\frac{1}{2}"
POLAR = "\\left( 3, \\frac{\\pi}{2} \\right)"

MATH_CASES = [
    # name, gold, completion, dare, d1, strict
    ("same", HALF, "\\boxed{\\frac{1}{2}}", True, True, True),
    ("dfrac", HALF, "\\boxed{\\dfrac{1}{2}}", True, True, True),
    ("frac12_shorthand", HALF, "\\boxed{\\frac12}", True, True, True),
    ("decimal_0_5", HALF, "\\boxed{0.5}", True, True, True),  # d1: the hard-coded 0.5 -> \frac{1}{2}
    ("decimal_0_50", HALF, "\\boxed{0.50}", True, False, True),  # d1 has no numeric equivalence
    ("slash", HALF, "\\boxed{1/2}", True, True, True),
    ("unreduced", HALF, "\\boxed{2/4}", False, False, False),  # DARE compares literal fractions as strings
    ("unboxed_sentence", HALF, "The answer is 1/2", False, False, False),
    # d1 takes the whole completion when nothing is boxed, so <answer> is ignored; strict reads it
    ("answer_tag_only", HALF, "<answer>\\frac{1}{2}</answer>", False, False, True),
    ("last_of_two_boxes", HALF, "\\boxed{1} then \\boxed{\\frac{1}{2}}", True, True, False),
    ("fbox", HALF, "\\fbox{\\frac{1}{2}}", False, False, True),
    ("space_before_brace", HALF, "\\boxed {\\frac{1}{2}}", False, False, True),
    ("tuple_left_right", POLAR, "\\boxed{(3, \\frac{\\pi}{2})}", True, True, True),
    ("tuple_pi_slash", POLAR, "\\boxed{(3, \\pi/2)}", True, False, True),
    ("integer_5_0", "5", "\\boxed{5.0}", True, False, True),
    ("text_unit_with_space", "4", "\\boxed{4\\text{ inches}}", True, True, True),
    ("text_unit_no_space", "4", "\\boxed{4 \\text{inches}}", True, False, True),
    ("sqrt_equivalent", "\\frac{\\sqrt{2}}{2}", "\\boxed{\\frac{1}{\\sqrt{2}}}", True, False, True),
    ("degrees", "30", "\\boxed{30^\\circ}", True, True, True),
    ("truncated_box", HALF, "so \\boxed{\\frac{1}{2", False, False, False),
]


@pytest.mark.parametrize("name,gold,text,dare,d1,strict", MATH_CASES, ids=[c[0] for c in MATH_CASES])
def test_math_table(name, gold, text, dare, d1, strict):
    task = get_task("math500")
    item = g(gold)
    got = {k: task.grade(text, item, k).correct for k in ("dare", "d1", "strict")}
    assert got == {"dare": dare, "d1": d1, "strict": strict}


def test_quirk_d1_math_format_bonus_ignores_the_box():
    # "\boxed" in a non-raw string is "\x08oxed": the bonus is 0.75 with an <answer> tag, 0.25 without, box or not
    task = get_task("math500")
    assert task.grade("\\boxed{\\frac{1}{2}}", g(HALF), "d1").reward == pytest.approx(2.25)
    assert task.grade("<answer>\\boxed{\\frac{1}{2}}</answer>", g(HALF), "d1").reward == pytest.approx(2.75)
    assert task.grade("<answer>nothing</answer>", g(HALF), "d1").reward == pytest.approx(0.75)


def test_dare_reward_equals_accuracy_for_math():
    r = get_task("math500").grade("\\boxed{0.5}", g(HALF), "dare")
    assert (r.correct, r.reward, r.score, r.extracted) == (True, 1.0, 1.0, "0.5")


def test_dare_and_d1_disagree_on_common_gsm8k_formats():
    """The two official graders part ways on everyday completions (which is why the grader is pinned per run)."""
    task = get_task("gsm8k")
    disagreements = {
        "d1 tags, no box": (PERFECT_D1, "18"),
        "first box vs last box": ("\\boxed{18} ... actually \\boxed{20}", "18"),
        "unit inside box": ("\\boxed{18 dollars}", "18"),
        "thousands separator in box": ("\\boxed{1,000}", "1,000"),
        "sentence in answer tag": ("<answer>\nThe answer is 18\n</answer>", "18"),
        "currency in answer tag": ("<answer>\n$18\n</answer>", "18"),
    }
    for why, (text, gold) in disagreements.items():
        d, o = task.grade(text, g(gold), "dare"), task.grade(text, g(gold), "d1")
        assert d.correct != o.correct, why


def test_quirk_d1_gsm8k_eval_number_parsing():
    task = get_task("gsm8k")
    # in a box the FIRST number of an unparseable content counts: "1,000" -> 1
    assert task.grade("\\boxed{1,000}", g("1000"), "d1").extracted == "1.0"
    # in <answer> the LAST number counts: "2,125" -> 125
    assert task.grade("<answer>2,125</answer>", g("2,125"), "d1").extracted == "125.0"
    # non-greedy box regex: \boxed{\frac{1}{2}} yields "\frac{1" -> 1
    assert task.grade("\\boxed{\\frac{1}{2}}", g("1"), "d1").correct is True


def test_quirk_d1_math_unboxed_completion_is_compared_whole():
    task = get_task("math500")
    assert task.grade("\\frac{1}{2}", g(HALF), "d1").correct is True  # the bare completion IS the answer
    assert task.grade("\\frac{1}{2}.", g(HALF), "d1").correct is False
    assert task.grade("<answer>\\frac{1}{2}</answer>", g(HALF), "d1").correct is False


def test_quirk_d1_slash_answers_fall_back_to_raw_equality():
    # fix_a_slash_b lets int()'s ValueError escape, so is_equiv compares the raw strings
    task = get_task("math500")
    assert task.grade("\\boxed{x/2}", g("x/2"), "d1").correct is True
    assert task.grade("\\boxed{x / 2}", g("x/2"), "d1").correct is False
    assert task.grade("\\boxed{x / 2}", g("x/2"), "dare").correct is True


def test_quirk_dare_integer_gold_needs_integer_answer():
    task = get_task("math500")
    assert task.grade("\\boxed{\\frac{36}{2}}", g("18"), "dare").correct is False
    assert task.grade("\\boxed{18.0}", g("18"), "dare").correct is True


def test_quirk_boxed_with_a_space_and_no_braces():
    # d1's helper special-cases "\boxed " (space): everything after it up to "$" is the answer
    task = get_task("math500")
    text = "so the answer is $\\boxed 18$"
    assert task.grade(text, g("18"), "d1").correct is True
    assert task.grade(text, g("18"), "dare").correct is False  # DARE needs \boxed{...}
    assert get_task("gsm8k").grade(text, g("18"), "d1").correct is False  # GSM8K's regex needs the brace


def test_quirk_dare_normalises_slash_answers_that_d1_compares_raw():
    task = get_task("math500")
    text = "\\boxed{\\left( x / 2 \\right)}"
    assert task.grade(text, g("(x/2)"), "dare").correct is True
    assert task.grade(text, g("(x/2)"), "d1").correct is False
