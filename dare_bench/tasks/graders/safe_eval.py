"""Evaluate the arithmetic strings that Countdown graders pass to Python's ``eval``, with Python's own semantics.

The official graders call ``eval(expr, {"__builtins__": None}, {})`` after a character whitelist
(``^[\\d+\\-*/().\\s]+$``). That whitelist still admits ``**`` (so ``9**9**9**9`` would hang the official grader) and
``//``. ``python_arith_eval`` walks the same AST and applies the same Python operators, so every value, float rounding
and exception (ZeroDivisionError, OverflowError, TypeError on tuples, SyntaxError) matches ``eval``; the one difference
is that a power whose result would exceed ``MAX_POW_BITS`` bits returns ``HUGE`` instead of computing for minutes —
such a value can never equal a Countdown target, which is the verdict the official grader reaches eventually.

Usage::

    python_arith_eval("(100-93)*30/10")   # -> 21.0
"""

from __future__ import annotations

import ast
import math
import operator

from dare_bench.tasks.graders import pyast

MAX_POW_BITS = 1 << 16


class _Huge(float):
    """A stand-in for an astronomically large exact integer: compares unequal to every target."""


HUGE = _Huge("inf")

_BIN = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
    ast.Mod: operator.mod,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _pow(a, b):
    if isinstance(a, _Huge) or isinstance(b, _Huge):
        return HUGE
    if isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1:
        if b * max(1, abs(a).bit_length()) > MAX_POW_BITS:
            return HUGE
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 and abs(a) > 1:
        try:
            if b * math.log2(abs(a)) > MAX_POW_BITS:
                return HUGE
        except (OverflowError, ValueError):
            return HUGE
    return operator.pow(a, b)


def _eval(node):
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float, complex):
        return node.value
    if isinstance(node, ast.Tuple):
        return tuple(_eval(e) for e in node.elts)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        v = _eval(node.operand)
        return v if isinstance(v, _Huge) else _UNARY[type(node.op)](v)
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        a, b = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            return _pow(a, b)
        if isinstance(a, _Huge) or isinstance(b, _Huge):
            return HUGE
        return _BIN[type(node.op)](a, b)
    if isinstance(node, ast.Call):
        # "2(3)" parses as a call; with builtins disabled eval raises TypeError: 'int' object is not callable
        raise TypeError("object is not callable")
    raise ValueError(f"unsupported expression node {type(node).__name__}")


def python_arith_eval(expr: str):
    """``eval(expr, {"__builtins__": None}, {})`` for whitelisted arithmetic, without the hang on huge powers."""
    # eval() strips leading/trailing spaces and tabs (not newlines) from a string before compiling it
    return _eval(pyast.parse(expr.strip(" \t"), mode="eval"))
