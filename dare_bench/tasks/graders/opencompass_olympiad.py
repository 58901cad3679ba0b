"""OlympiadBench's verdict as OpenCompass computes it: ``olympiadbench_postprocess_v2`` + ``OlympiadBenchEvaluator``
(version v2) and its ``MathJudger`` (opencompass/datasets/OlympiadBench.py, the same in DARE's fork and 0.5.4).

The judge compares with sympy's LaTeX parser, which needs ``antlr4-python3-runtime`` 4.11 (OpenCompass's
requirements/extra.txt): without it OpenCompass cannot even build the evaluator, so neither can this module
(`require_latex_parser`, one ConfigError). Kept as OpenCompass has them:
- the postprocessor looks for "So the final answer is" even on Chinese problems; no match keeps the whole text;
- the judge reads *every* ``\\boxed{}`` of each side (nested ones too) joined by commas, else the ``$...$`` of the last
  line, else the whole text; answers are split on top-level commas and matched greedily, in any order;
- the numeric check accepts the prediction /100 or x100 (percentages), with the prediction as the reference;
- ``x = 3`` style: the expression check compares right-hand sides unless both sides hold '=';
- "\\pm" expands to two answers; Chinese characters are removed before comparing.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache

from dare_bench.errors import ConfigError

_SIGNALS = [("\\left", ""), ("\\right", ""), ("∶", ":"), ("，", ","), ("$", ""), ("\\approx", "="), ("\\simeq", "="),
            ("\\sim", "="), ("^\\prime", "'"), ("^{\\prime}", "'"), ("^\\circ", ""), ("%", "")]
_STRIP = "\n$,.:;^_=+`!@#$%^&*~，。"
PRECISION = 1e-8


@lru_cache(maxsize=1)
def latex_parser_available() -> bool:
    try:
        from sympy.parsing.latex import parse_latex

        parse_latex("\\pi")
        return True
    except Exception:
        return False


def require_latex_parser() -> None:
    if not latex_parser_available():
        raise ConfigError("the olympiadbench grader needs sympy's LaTeX parser, as OpenCompass's judge does: "
                          "pip install antlr4-python3-runtime==4.11.0")


def postprocess_v2(text: str) -> str:
    """olympiadbench_postprocess_v2(text) with its defaults (is_chinese=False, is_deepseek=False)."""
    found = re.findall("So the final answer is (.*)", text)
    return found[-1].strip() if found else text


def _boxed_contents(text: str) -> str:
    out = ""
    for match in re.finditer(r"\\boxed{", text):
        depth, end = 1, match.end()
        while depth > 0 and end < len(text):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        if depth != 0:
            raise ValueError("Mismatched braces in LaTeX string.")
        out += text[match.end():end - 1] + ","
    if out == "":
        last_line = text.strip().split("\n")[-1]
        dollars = re.findall(r"\$(.*?)\$", last_line)
        out = "".join(d + "," for d in dollars) if dollars else text
    return out


def _clean(expression: str) -> str:
    if "\\in " in expression:
        expression = expression.split("\\in ")[1]
    for old, new in _SIGNALS:
        expression = expression.replace(old, new)
    expression = expression.strip(_STRIP)
    return re.sub(r"\\(?:mathrm|mathbf)\{~?([^}]*)\}", r"\1", expression)


def _split_top_level_commas(expr: str) -> list[str]:
    depth, parts, start = 0, [], 0
    for i, ch in enumerate(expr):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(expr[start:i].strip())
            start = i + 1
    if start < len(expr):
        parts.append(expr[start:].strip())
    return parts


def _expand_pm(parts: list[str]) -> list[str]:
    out = []
    for p in parts:
        out += [p.replace("\\pm", "+"), p.replace("\\pm", "-")] if "\\pm" in p else [p]
    return out


class _Judge:
    """MathJudger's comparisons; `precision` is set per answer as in `judge`."""

    def __init__(self) -> None:
        from sympy.parsing.latex import parse_latex

        self.parse_latex = parse_latex
        self.pi = parse_latex("\\pi")
        self.precision = PRECISION

    def judge(self, pred: str, gold: str) -> bool:
        try:
            pred, gold = _clean(_boxed_contents(pred)), _clean(_boxed_contents(gold))
        except Exception:
            return False
        if pred == gold:
            return True
        pred = re.sub(r"[\u4e00-\u9fff]+", "", pred)
        gold = re.sub(r"[\u4e00-\u9fff]+", "", gold)
        left, right = _expand_pm(_split_top_level_commas(pred)), _expand_pm(_split_top_level_commas(gold))
        precisions = [PRECISION] * len(left)
        if len(left) != len(right):
            return False
        idx = -1
        while left:  # greedy pairing, walking the left list as MathJudger does
            idx = (idx + 1) % len(left)
            item = left[idx]
            self.precision = precisions[idx]
            for other in right:
                if self.is_equal(item, other):
                    left.remove(item)
                    right.remove(other)
                    precisions.remove(self.precision)
                    break
            else:
                return False
        return True

    @staticmethod
    def _is_interval(e: str) -> bool:
        return e.startswith(("(", "[")) and e.endswith((")", "]"))

    def is_equal(self, a: str, b: str) -> bool:
        if a == b and a != "" and b != "":
            return True
        if self._is_interval(a) and self._is_interval(b):
            try:
                if self.interval_equal(a, b):
                    return True
            except Exception:
                return False
        try:
            if self.numerical_equal(a, b):
                return True
        except Exception:
            pass
        try:
            if self.expression_equal(a, b) and not ("=" in a and "=" in b):
                return True
        except Exception:
            pass
        try:
            if self.equation_equal(a, b):
                return True
        except Exception:
            pass
        return False

    def numerical_equal(self, a: str, b: str) -> bool:
        reference, prediction = float(a), float(b)
        return any(abs(x - prediction) <= self.precision * 1.01 for x in (reference / 100, reference, reference * 100))

    def expression_equal(self, a: str, b: str):
        from sympy import Symbol, simplify, sympify

        def rhs(e: str) -> str:
            return (e.split("=")[1] if "=" in e else e).strip()

        x, y = sympify(self.parse_latex(rhs(a))), sympify(self.parse_latex(rhs(b)))
        if x == y:
            return True
        x, y = x.subs(self.pi, math.pi), y.subs(self.pi, math.pi)
        if x.has(Symbol) != y.has(Symbol):
            return False
        if not x.has(Symbol) and not y.has(Symbol):
            try:
                if not (_computable(x) and _computable(y)):
                    return False
                if abs(x.evalf() - y.evalf()) <= self.precision * 1.01:
                    return True
                return False
            except Exception:
                return False
        try:
            # may be a sympy relation (symbols left): its truth value raises in the caller, as in OpenCompass
            return abs(simplify(x - y).evalf()) < 1e-3
        except Exception:
            return False

    def equation_equal(self, a: str, b: str) -> bool:
        from sympy import Eq, simplify

        def moved(eq: str):
            lhs, rhs = eq.split("=")
            e = Eq(self.parse_latex(lhs), self.parse_latex(rhs))
            return simplify(e.lhs - e.rhs)

        x, y = moved(a), moved(b)
        q1, q2 = simplify(x / y), simplify(y / x)
        return bool((q1.is_Integer and q1 != 0) or (q2.is_Integer and q2 != 0))

    def interval_equal(self, a: str, b: str) -> bool:
        if a == b:
            return True
        parts_a, parts_b = a.split("\\cup"), b.split("\\cup")
        if len(parts_a) != len(parts_b):
            return False
        for p, q in zip(parts_a, parts_b):
            if p[0] != q[0] or p[-1] != q[-1]:
                return False
            for u, v in zip(p.strip("[]()").split(","), q.strip("[]()").split(",")):
                if not self.expression_equal(u, v):
                    return False
        return True


def _computable(expr) -> bool:
    """MathJudger.can_compute_power: a numeric power with |exponent| > 1000 is refused."""
    from sympy import Pow

    if not isinstance(expr, Pow):
        return True
    base, exp = expr.as_base_exp()
    if not (base.is_number and exp.is_number):
        return False
    return not abs(exp.evalf()) > 1000


@lru_cache(maxsize=1)
def _judge() -> _Judge:
    require_latex_parser()
    return _Judge()


def judge(pred: str, gold: str) -> bool:
    """OlympiadBenchEvaluator(version='v2') on one (postprocessed prediction, gold final answer) pair."""
    try:
        return bool(_judge().judge(pred, gold))
    except ConfigError:
        raise
    except Exception:  # the evaluator records the error and counts the answer wrong
        return False
