"""OpenCompass's answer extraction and verdicts, as DARE's evaluation configs run them (the ``dare`` grader of the
multiple-choice and competition-math tasks).

DARE evaluates MMLU, MMLU-Pro, HellaSwag, ARC-C, GPQA, AIME and OlympiadBench through its OpenCompass fork
(yjyddq/DARE @ 83ae8a3, ``opencompass/``, a modified OpenCompass 0.4.2). Each rule below names the function it
reproduces; the code of those functions is identical in that fork and in OpenCompass 0.5.4 except where said.
``tests/fixtures/graders/opencompass_verdicts.jsonl`` holds completions with the verdicts OpenCompass itself gave
(made by ``tests/fixtures/graders/make_opencompass_verdicts.py``); ``tests/tasks/test_opencompass_verdicts.py``
fails when a rule here drifts from them.

    from dare_bench.tasks.graders import opencompass as oc
    oc.first_option("The answer is (C)", "ABCD")          # 'C'   first_option_postprocess
    oc.answer_pattern("ANSWER: d", r"(?i)ANSWER\\s*:\\s*([A-P])")   # 'd' (then wrong against 'D', as in OC)
    oc.math_v2_equiv(oc.math_postprocess_v2("\\\\boxed{033}"), "33")   # False: MATHEvaluator v2 keeps zeros

Quirks kept on purpose (they move DARE's numbers):
- ``first_option``: a missing comma in OpenCompass's pattern list glues ``故选?\\s*([..])`` to the next pattern, so
  neither matches alone; a match returns the first option letter *in option order* contained in the matched text
  ("(B) and (A)" matched as a whole gives A); the last resort is any capital option letter anywhere ("Dunno" -> D).
- ``gpqa_correct_answer`` (DARE's own ``GPQA_Simple_Eval_postprocess_``, not in upstream OpenCompass): the first
  "The correct answer is (X)", case-insensitive, the text inside the parentheses stripped; no match gives " ".
- AccEvaluator / GPQAEvaluator compare the extracted string with the gold letter exactly: a lowercase "d" is wrong.
- MATHEvaluator v2 keeps leading zeros: "\\boxed{033}" is not "33".
"""

from __future__ import annotations

import re

# ---------------------------------------------------------------------------------------------------- multiple choice


def _option_patterns(options: str) -> list[str]:
    """opencompass/utils/text_postprocessors.py::first_option_postprocess's patterns, in order (cushion=True)."""
    o = options
    return [
        rf"答案是?\s*([{o}])",
        rf"答案是?\s*：\s*([{o}])",
        rf"答案是?\s*:\s*([{o}])",
        rf"答案选项应?该?是\s*([{o}])",
        rf"答案选项应?该?为\s*([{o}])",
        rf"答案应该?是\s*([{o}])",
        rf"答案应该?选\s*([{o}])",
        rf"答案选项为?\s*：\s*([{o}])",
        rf"答案选项为?\s+\(?\*?\*?([{o}])\*?\*?\)?",
        rf"答案选项是?\s*:\s*([{o}])",
        rf"答案为\s*([{o}])",
        rf"答案选\s*([{o}])",
        rf"选择?\s*([{o}])",
        # two patterns glued into one by the missing comma in OpenCompass's list
        rf"故选?\s*([{o}])" rf"只有选?项?\s?([{o}])\s?是?对",
        rf"只有选?项?\s?([{o}])\s?是?错",
        rf"只有选?项?\s?([{o}])\s?不?正确",
        rf"只有选?项?\s?([{o}])\s?错误",
        rf"说法不?对选?项?的?是\s?([{o}])",
        rf"说法不?正确选?项?的?是\s?([{o}])",
        rf"说法错误选?项?的?是\s?([{o}])",
        rf"([{o}])\s?是正确的",
        rf"([{o}])\s?是正确答案",
        rf"选项\s?([{o}])\s?正确",
        rf"所以答\s?([{o}])",
        rf"所以\s?([{o}][.。$]?$)",
        rf"所有\s?([{o}][.。$]?$)",
        rf"[\s，：:,]([{o}])[。，,\.]?$",
        rf"[\s，,：:][故即]([{o}])[。\.]?$",
        rf"[\s，,：:]因此([{o}])[。\.]?$",
        rf"[是为。]\s?([{o}])[。\.]?$",
        rf"因此\s?([{o}])[。\.]?$",
        rf"显然\s?([{o}])[。\.]?$",
        r"答案是\s?(\S+)(?:。|$)",
        r"答案应该是\s?(\S+)(?:。|$)",
        r"答案为\s?(\S+)(?:。|$)",
        rf"(?i)ANSWER\s*:\s*([{o}])",
        rf"[Tt]he answer is:?\s+\(?([{o}])\)?",
        rf"[Tt]he answer is:?\s+\(?\*?\*?([{o}])\*?\*?\)?",
        rf"[Tt]he answer is option:?\s+\(?([{o}])\)?",
        rf"[Tt]he correct answer is:?\s+\(?([{o}])\)?",
        rf"[Tt]he correct answer is option:?\s+\(?([{o}])\)?",
        rf"[Tt]he correct answer is:?.*?boxed{{([{o}])}}",
        rf"[Tt]he correct option is:?.*?boxed{{([{o}])}}",
        rf"[Tt]he correct answer option is:?.*?boxed{{([{o}])}}",
        rf"[Tt]he answer to the question is:?\s+\(?([{o}])\)?",
        rf"^选项\s?([{o}])",
        rf"^([{o}])\s?选?项",
        rf"(\s|^)[{o}][\s。，,：:\.$]",
        r"1.\s?(.*?)$",
        rf"1.\s?([{o}])[.。$]?$",
        # the cushion
        rf"([{o}]):",
        rf"([{o}])",
    ]


def first_option(text: str, options: str) -> str:
    """first_option_postprocess(text, options): the option letter, or '' when no pattern yields one."""
    text = text.strip()
    for pattern in _option_patterns(options):
        match = re.search(pattern, text, re.DOTALL)
        if not match:
            continue
        # a pattern whose group matched nothing (e.g. "(\s|^)" at the start) offers the whole match instead
        found = match.group(1) if match.group(1) else match.group(0)
        for letter in options:
            if letter in found:
                return letter
    return ""


def answer_pattern(text: str, pattern: str) -> str:
    """match_answer_pattern(text, answer_pattern): group 1 of the first match, else ''."""
    match = re.search(pattern, text)
    return match.group(1) if match else ""


#: MMLU-Pro's postprocessor pattern (mmlu_pro_0shot_cot_gen_08c1de.py)
MMLU_PRO_PATTERN = r"(?i)ANSWER\s*:\s*([A-P])"


def gpqa_correct_answer(text: str) -> str:
    """DARE's GPQA_Simple_Eval_postprocess_ (its fork's opencompass/datasets/gpqa.py)."""
    match = re.search(r"The correct answer is \(([^)]+)\)", text, re.IGNORECASE)
    return match.group(1).strip() if match else " "


# ---------------------------------------------------------------------------------------------------- MATH v2


def _last_boxed(text: str) -> str | None:
    """last_boxed_only_string: the last \\boxed{...} (else \\fbox...) with balanced braces, or None."""
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i + 1]
    return None


def extract_boxed_answer(text: str, strip_double_curly_brace: bool = False) -> str | None:
    """opencompass/datasets/math.py::extract_boxed_answer."""
    boxed = _last_boxed(text)
    if boxed is None or not boxed.startswith("\\boxed{") or not boxed.endswith("}"):
        return None  # remove_boxed's failed assertions (e.g. "\\fbox{..}", "\\boxed 5}")
    answer = boxed[len("\\boxed{"):-1]
    if strip_double_curly_brace:
        inner = re.match(r"^\{(.*)\}$", answer)
        if inner:
            answer = inner.group(1)
    return answer


_SUBSTITUTIONS = [("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
                  (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"), ("\\le", "<")]
_REMOVED = ["square", "ways", "integers", "dollars", "mph", "inches", "ft", "hours", "km", "units", "\\ldots", "sue",
            "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
            "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
            "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;",
            r",\!", "{,}", '"', "\\dots", "\n", "\r", "\f"]


def normalize_final_answer(answer: str) -> str:
    """opencompass/datasets/math.py::normalize_final_answer."""
    for before, after in _SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for expr in _REMOVED:
        answer = answer.replace(expr, "")
    answer = re.sub(r"(\\text\{)\((.*?)\)(\})", "\\2", answer)
    answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", answer)
    for tail in (r"finalansweris(.*)", r"answer?is:?(.*)", r"oxed\{(.*?)\}", r"\$(.*?)\$"):
        found = re.findall(tail, answer)
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
    """opencompass/datasets/math.py::math_postprocess_v2: the last box, else the first sentence saying 'final
    answer' / 'answer is', else the first sentence, normalised."""
    boxed = extract_boxed_answer(text, strip_double_curly_brace=True)
    if boxed:
        return boxed
    for sentence in text.split("."):
        if re.search("final answer|answer is", sentence.lower()):
            return normalize_final_answer(sentence)
    return normalize_final_answer(text.split(".")[0])


def _fix_fracs(string: str) -> str:
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
        if b != "{":
            out += "{" + a + "}{" + b + "}" + sub[2:]
        else:
            out += "{" + a + "}" + b + sub[2:]
    return out


def _fix_a_slash_b(string: str) -> str:
    if len(string.split("/")) != 2:
        return string
    a, b = string.split("/")
    try:
        a_int, b_int = int(a), int(b)
    except ValueError:
        raise  # MATHEvaluator lets int() errors escape to is_equiv's except
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
                     ("\\%", ""), ("\\%", ""), ("%", ""), (" .", " 0."), ("{.", "{0."), ("\\cdot", ""),
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
    string = _fix_fracs(string)
    return _fix_a_slash_b(string)


def math_v2_equiv(pred: str | None, gold: str | None) -> bool:
    """MATHEvaluator(version='v2').is_equiv(pred, gold)."""
    if pred is None and gold is None:
        return True
    if pred is None or gold is None:
        return False
    try:
        a, b = _strip_string_v2(pred), _strip_string_v2(gold)
        if a == b or normalize_final_answer(a) == normalize_final_answer(b):
            return True
    except Exception:  # as MATHEvaluator: any failure falls through to the next comparison
        pass
    try:
        if normalize_final_answer(pred) == normalize_final_answer(gold):
            return True
    except Exception:
        pass
    return pred == gold
