"""The answer checker DARE's math reward uses: Hendrycks normalisation, then the PRM800K / DeepScaleR sympy check.

``grade(given, truth)`` is ``grade_answer_mathd(given, truth) or grade_answer_sympy(given, truth)`` as in DARE's
``verl/utils/reward_score/math_reward.py`` (read at hxhcreate/DARE@f4999da, a fork of yjyddq/DARE: the upstream
file is not in the code index). Behaviour worth knowing (all reproduced):

- normalisation strips ``$``, ``%``, ``\\text{...}`` wrappers, unit words (cm, hour, feet, ... and their plurals),
  ``^\\circ``, thousands commas (``1,000`` → ``1000``), turns ``million`` into ``*10^6``, drops braces, lower-cases;
  LaTeX goes through ``pylatexenc`` (``\\frac{1}{2}`` → ``1/2``, ``\\sqrt`` → ``sqrt``, ``\\pi`` → ``pi``);
- an integer truth accepts only an integer-looking answer (``5.0`` normalises to ``5`` and passes, ``4.9999999``
  fails); two literal fractions are compared as strings (``2/4`` ≠ ``1/2``); otherwise ``sympy.simplify(a - b) == 0``
  decides, so ``0.5`` = ``1/2`` and ``\\sqrt{2}/2`` = ``1/\\sqrt{2}``;
- tuples / intervals compare element-wise and need the same brackets; expressions with more than two distinct
  letters, ``^{``/``^(`` or big exponents are never given to sympy.

Deviation (deliberate): the official call has no time limit; here one sympy comparison is cut off after
``SYMPY_TIMEOUT_S`` seconds (counted as "not equal") when running on the main thread, so a pathological answer cannot
stall an evaluation.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import threading

from dare_bench.tasks.graders import hendrycks as H

SYMPY_TIMEOUT_S = 5

# pylatexenc logs a warning for every malformed macro (e.g. "\\frac" without arguments) in model output
logging.getLogger("pylatexenc").setLevel(logging.ERROR)

_BAD_SUBSTRINGS = ["^{", "^("]
_BAD_REGEXES = [r"\^[0-9]+\^", r"\^[0-9][0-9]+"]
_TUPLE_CHARS = "()[]"
_UNITS = ["degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month", "year",
          "foot", "feet", "inch", "yard"]


def mathd_normalize(answer: str | None) -> str | None:
    if answer is None:
        return None
    answer = answer.strip()
    try:
        m = re.search(r"^\\text\{(?P<text>.+?)\}$", answer)
        if m is not None:
            answer = m.group("text").strip()
        return H.strip_string(answer, lenient=True)  # DARE's copy of _fix_a_slash_b catches everything
    except Exception:
        return answer


def _is_float(num: str) -> bool:
    try:
        float(num)
        return True
    except ValueError:
        return False


def _is_int(x: float) -> bool:
    try:
        return abs(x - int(round(x))) <= 1e-7
    except Exception:
        return False


def _is_frac(expr: str) -> bool:
    return bool(re.search(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$", expr))


def _strip_commas(expr: str) -> str:
    # only "properly formatted" thousands separators, so tuple commas survive
    p = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
    while True:
        nxt = p.sub(r"\1\3\4", expr)
        if nxt == expr:
            return nxt
        expr = nxt


def _str_is_int(x: str) -> bool:
    try:
        v = float(_strip_commas(x))
        return abs(v - int(round(v))) <= 1e-7
    except Exception:
        return False


def _str_to_int(x: str) -> int:
    return int(float(x.replace(",", "")))


def _parse_latex(expr: str) -> str:
    from pylatexenc import latex2text

    expr = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac")
    expr = expr.replace("\\frac", " \\frac")  # so "1\\frac12" reads as a mixed number
    expr = latex2text.LatexNodes2Text().latex_to_text(expr)
    for a, b in (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*")):
        expr = expr.replace(a, b)
    return expr.strip()


def normalize(expr: str | None) -> str | None:
    if expr is None:
        return None
    m = re.search(r"^\\text\{(?P<text>.+?)\}$", expr)
    if m is not None:
        expr = m.group("text")
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    expr = expr.replace("million", "*10^6").replace("billion", "*10^9").replace("trillion", "*10^12")
    for unit in _UNITS:
        expr = re.sub(f"{unit}(es)?(s)? *(\\^[0-9]+)?", "", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if len(expr) > 0 and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    if _is_float(expr) and _is_int(float(expr)):
        expr = str(int(round(float(expr))))
    if "\\" in expr:
        try:
            expr = _parse_latex(expr)
        except Exception:
            pass
    expr = re.sub("- *", "-", expr)
    expr = re.sub("([0-9]) +([0-9])", r"\1+\2", expr)  # "7 3/4" is a mixed number
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _str_is_int(expr):
        expr = str(_str_to_int(expr))
    return expr


def _should_allow_eval(expr: str) -> bool:
    letters = {ch for ch in expr.replace("sqrt", "").replace("frac", "") if ch.isalpha()}
    if len(letters) > 2:
        return False
    if any(bad in expr for bad in _BAD_SUBSTRINGS):
        return False
    return not any(re.search(bad, expr) for bad in _BAD_REGEXES)


class _SympyTimeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: int):
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def _raise(signum, frame):
        raise _SympyTimeout()

    old = signal.signal(signal.SIGALRM, _raise)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _equal_under_sympy(truth: str, given: str) -> bool:
    import sympy
    from sympy.parsing import sympy_parser

    try:
        expr = f"({truth})-({given})"
        if not _should_allow_eval(expr):
            return False
        with _time_limit(SYMPY_TIMEOUT_S):
            diff = sympy_parser.parse_expr(
                expr.replace("^", "**"),
                transformations=(sympy_parser.standard_transformations
                                 + (sympy_parser.implicit_multiplication_application,)),
            )
            return sympy.simplify(diff) == 0
    except BaseException as e:  # sympy raises anything from SyntaxError to RecursionError; never KeyboardInterrupt
        if isinstance(e, KeyboardInterrupt):
            raise
        return False


def _split_tuple(expr: str) -> list[str]:
    expr = _strip_commas(expr)
    if len(expr) == 0:
        return []
    if (len(expr) > 2 and expr[0] in _TUPLE_CHARS and expr[-1] in _TUPLE_CHARS
            and all(ch not in expr[1:-1] for ch in _TUPLE_CHARS)):
        return [e.strip() for e in expr[1:-1].split(",")]
    return [expr]


def grade_answer_sympy(given: str, truth: str) -> bool:
    t, g = normalize(truth), normalize(given)
    if t is None:
        return False
    if t == g:
        return True
    if len(g) == 0:
        return False
    t_elems, g_elems = _split_tuple(t), _split_tuple(g)
    if len(t_elems) > 1 and (t[0] != g[0] or t[-1] != g[-1]):
        return False
    if len(t_elems) != len(g_elems):
        return False
    ok = False
    for te, ge in zip(t_elems, g_elems):
        if _is_frac(te) and _is_frac(ge):
            ok = te == ge  # unreduced fractions must not pass through simplify
        elif _str_is_int(te) != _str_is_int(ge):
            ok = False
        else:
            ok = _equal_under_sympy(te, ge)
        if not ok:
            break
    return ok


def grade_answer_mathd(given: str, truth: str) -> bool:
    return mathd_normalize(truth) == mathd_normalize(given)


def grade(given: str, truth: str) -> bool:
    return grade_answer_mathd(given, truth) or grade_answer_sympy(given, truth)
