"""Hendrycks-MATH string normalisation and ``\\boxed{}`` extraction, as d1 and DARE ship them.

d1's two copies (``diffu-grpo/math500_utils.py`` for training, ``eval/parser_helper.py`` for evaluation; the latter
read through two independent forks, SimonCao1207/d1 and xiaohangt/wd1, which agree) behave identically here:

- ``last_boxed_only_string`` returns the WHOLE string when it holds no ``\\boxed``/``\\fbox`` (so an unboxed
  completion is compared whole against the answer), None when the braces never close, and for ``\\boxed x`` (a space,
  no brace) everything after the last ``"\\boxed "`` up to the next ``$``;
- ``remove_boxed`` returns its input unchanged unless it is ``\\boxed{...}`` (raises on None);
- ``fix_a_slash_b`` lets ``int()``'s ValueError escape for ``x/2``-like strings, so ``is_equiv`` falls back to raw
  string equality for any answer with one non-integer slash (``"x/2 "`` ≠ ``"x/2"``); DARE's copy catches it
  (``lenient=True``);
- training's ``boxed_in_answer`` tests for ``"\boxed"`` written without a raw string, i.e. for a backspace character
  followed by "oxed", which never occurs — so the "boxed inside <answer>" format bonus is really "has an <answer>".

``strip_string``/``is_equiv``: exact string equality after the Hendrycks normalisation (``\\dfrac``→``\\frac``,
``0.5``→``\\frac{1}{2}``, ``a/b``→``\\frac{a}{b}``, units after ``\\text{ ``, ``\\left``/``\\right``, degrees, ``\\$``,
``\\%`` (a bare ``%`` stays), a leading ``x =`` of at most two characters...). No numeric or symbolic equivalence.
"""

from __future__ import annotations

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


def _fix_a_slash_b(string: str, lenient: bool = False) -> str:
    if len(string.split("/")) != 2:
        return string
    a, b = string.split("/")
    try:
        ai, bi = int(a), int(b)
    except ValueError:
        if lenient:
            return string
        raise
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


def strip_string(string: str, lenient: bool = False) -> str:
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
    string = _fix_a_slash_b(string, lenient)
    return string


def is_equiv(str1, str2) -> bool:
    """d1's ``is_equiv`` (the eval copy's float branch included; strings never take it)."""
    if type(str1) is float or type(str2) is float:
        try:
            return abs(float(str1) - float(str2)) < 1e-6
        except Exception:
            return False
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


# ---------------------------------------------------------------------------------------------- d1's extraction


def last_boxed_only_string(string: str) -> str | None:
    """d1's ``last_boxed_only_string``: the whole string when nothing is boxed, None for unclosed braces."""
    idx = string.rfind("\\boxed")
    if "\\boxed " in string:
        return "\\boxed " + string.split("\\boxed ")[-1].split("$")[0]
    if idx < 0:
        idx = string.rfind("\\fbox")
        if idx < 0:
            return string
    return _boxed_span(string, idx)


def remove_boxed(s: str) -> str:
    """d1's ``remove_boxed``: raises TypeError on None and AssertionError for a misplaced ``\\boxed ``."""
    if "\\boxed " in s:
        left = "\\boxed "
        assert s[: len(left)] == left
        return s[len(left) :]
    left = "\\boxed{"
    if s[: len(left)] == left and s[-1:] == "}":
        return s[len(left) : -1]
    return s


def boxed_in_answer(response: str) -> float:
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
