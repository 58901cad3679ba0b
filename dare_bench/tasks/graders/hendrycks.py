"""Hendrycks-MATH string normalisation and ``\\boxed{}`` extraction, in the two variants d1 ships.

d1 carries two copies of these helpers that differ in ways that change verdicts:

- training (``diffu-grpo/math500_utils.py``): ``last_boxed_only_string`` returns the WHOLE string when it holds no
  ``\\boxed``/``\\fbox`` (so an unboxed completion is compared whole against the answer) and None for unbalanced
  braces; ``remove_boxed`` returns its input unchanged when it is not ``\\boxed{...}``; ``boxed_in_answer`` tests for
  ``"\\boxed"`` written without a raw string, i.e. for a backspace character followed by "oxed", which never
  occurs — so the "boxed inside <answer>" format bonus is really "has an <answer> tag".
- evaluation (``eval/parser_helper.py``): ``last_boxed_only_string`` returns None without a box; ``remove_boxed``
  asserts (raises) on anything but ``\\boxed{...}``/``\\boxed x``, which callers turn into "no answer".

Both share ``strip_string``/``is_equiv`` (exact string equality after the Hendrycks normalisation: ``\\dfrac``→``\\frac``,
``0.5``→``\\frac{1}{2}``, ``a/b``→``\\frac{a}{b}``, units after ``\\text{ ``, ``\\left``/``\\right``, degrees, ``\\$``, ``\\%``,
a leading ``x =`` of at most two characters...). No numeric or symbolic equivalence: ``\\frac{1}{4}`` ≠ ``0.25``.
"""

from __future__ import annotations

import re

# ---------------------------------------------------------------------------------------------- shared normalisation


def _fix_fracs(string: str) -> str:
    substrs = string.split("\\frac")
    new_str = substrs[0]
    if len(substrs) > 1:
        for substr in substrs[1:]:
            new_str += "\\frac"
            # an empty piece ("\\frac" at the very end) raises IndexError in the original; strip_string's caller
            # (is_equiv) catches it and falls back to raw string equality — reproduced by letting it raise
            if substr[0] == "{":
                new_str += substr
            else:
                if len(substr) < 2:
                    return string
                a, b = substr[0], substr[1]
                if b != "{":
                    new_str += "{" + a + "}{" + b + "}" + substr[2:]
                else:
                    new_str += "{" + a + "}" + b + substr[2:]
    return new_str


def _fix_a_slash_b(string: str) -> str:
    if len(string.split("/")) != 2:
        return string
    a, b = string.split("/")
    try:
        ai, bi = int(a), int(b)
    except ValueError:
        return string
    if string != f"{ai}/{bi}":
        return string
    return "\\frac{" + str(ai) + "}{" + str(bi) + "}"


def _remove_right_units(string: str) -> str:
    if "\\text{ " in string:
        splits = string.split("\\text{ ")
        # the original asserts exactly one unit marker; more than one raises -> is_equiv's raw-equality fallback
        assert len(splits) == 2
        return splits[0]
    return string


def _fix_sqrt(string: str) -> str:
    if "\\sqrt" not in string:
        return string
    splits = string.split("\\sqrt")
    new_string = splits[0]
    for split in splits[1:]:
        # "\\sqrt" at the very end: split == "" -> IndexError in the original (caught by is_equiv)
        if split[0] != "{":
            new_string += "\\sqrt{" + split[0] + "}" + split[1:]
        else:
            new_string += "\\sqrt" + split
    return new_string


def strip_string(string: str) -> str:
    string = string.replace("\n", "")
    string = string.replace("\\!", "")
    string = string.replace("\\\\", "\\")
    string = string.replace("tfrac", "frac")
    string = string.replace("dfrac", "frac")
    string = string.replace("\\left", "")
    string = string.replace("\\right", "")
    string = string.replace("^{\\circ}", "")
    string = string.replace("^\\circ", "")
    string = string.replace("\\$", "")
    string = _remove_right_units(string)
    string = string.replace("\\%", "")
    # the original repeats this with "\%" in a non-raw string: an invalid escape that stays backslash-percent, so a
    # bare "%" is never removed ("50%" != "50")
    string = string.replace(" .", " 0.")
    string = string.replace("{.", "{0.")
    if len(string) == 0:
        return string
    if string[0] == ".":
        string = "0" + string
    if len(string.split("=")) == 2 and len(string.split("=")[0]) <= 2:
        string = string.split("=")[1]
    string = _fix_sqrt(string)
    string = string.replace(" ", "")
    string = _fix_fracs(string)
    if string == "0.5":
        string = "\\frac{1}{2}"
    string = _fix_a_slash_b(string)
    return string


def is_equiv(str1: str | None, str2: str | None) -> bool:
    if str1 is None and str2 is None:
        return True
    if str1 is None or str2 is None:
        return False
    try:
        return strip_string(str1) == strip_string(str2)
    except Exception:
        return str1 == str2


def _boxed_span(string: str, idx: int) -> str | None:
    depth = 0
    for i in range(idx, len(string)):
        if string[i] == "{":
            depth += 1
        if string[i] == "}":
            depth -= 1
            if depth == 0:
                return string[idx : i + 1]
    return None


# ---------------------------------------------------------------------------------------------- training copy


def train_last_boxed_only_string(string: str) -> str | None:
    """d1 ``math500_utils.last_boxed_only_string``: the whole string when nothing is boxed."""
    idx = string.rfind("\\boxed")
    if "\\boxed " in string:
        return "\\boxed " + string.split("\\boxed ")[-1].split("$")[0]
    if idx < 0:
        idx = string.rfind("\\fbox")
        if idx < 0:
            return string
    return _boxed_span(string, idx)


def train_remove_boxed(s: str) -> str:
    """d1 ``math500_utils.remove_boxed``: raises on ``None``; a ``\\boxed `` prefix mismatch raises too."""
    if "\\boxed " in s:
        left = "\\boxed "
        assert s[: len(left)] == left
        return s[len(left) :]
    left = "\\boxed{"
    if s[: len(left)] == left and s[-1:] == "}":
        return s[len(left) : -1]
    return s


def train_boxed_in_answer(response: str) -> float:
    """d1 ``boxed_in_answer`` for one response (before the 0.5 weight): 1.5 with an <answer> tag, else 0.5."""
    reward = 0.0
    try:
        r = response.split("<answer>")[1].split("</answer>")[0]
        reward += 1.0
    except IndexError:
        r = response
    # the official source writes "\boxed" in a normal string: "\b" is a backspace, so this is never found
    reward += 1.0 if "\x08oxed" in r else 0.5
    return reward


# ---------------------------------------------------------------------------------------------- evaluation copy


def eval_last_boxed_only_string(string: str) -> str | None:
    """d1 ``eval/parser_helper.last_boxed_only_string``: None when nothing is boxed or braces never close."""
    idx = string.rfind("\\boxed")
    if "\\boxed " in string:
        return "\\boxed " + string.split("\\boxed ")[-1].split("$")[0]
    if idx < 0:
        idx = string.rfind("\\fbox")
        if idx < 0:
            return None
    return _boxed_span(string, idx)


def eval_remove_boxed(s: str) -> str:
    """d1 ``eval/parser_helper.remove_boxed``: raises (TypeError on None, AssertionError on a mismatch)."""
    if "\\boxed " in s:
        left = "\\boxed "
        assert s[: len(left)] == left
        return s[len(left) :]
    left = "\\boxed{"
    assert s[: len(left)] == left
    assert s[-1] == "}"
    return s[len(left) : -1]
