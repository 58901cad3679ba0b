"""OpenCompass's option extraction for the multiple-choice tasks (mmlu, mmlupro, hellaswag, arcc, gpqa), as DARE's
evaluation configs run it: their ``dare`` (= ``opencompass``) grader. The AIME tasks use ``opencompass_protocols``'
math_postprocess_v2 + MATHEvaluator v2, OlympiadBench ``opencompass_olympiad``.

DARE evaluates these benchmarks through its OpenCompass fork (yjyddq/DARE @ 83ae8a3, ``opencompass/``, a modified
OpenCompass 0.4.2). Each rule below names the function it reproduces; the code of those functions is identical in
that fork and in OpenCompass 0.5.4 except where said.
``tests/fixtures/graders/opencompass_tasks/verdicts.jsonl`` holds completions with the verdicts OpenCompass itself
gave (made by ``tests/fixtures/graders/make_opencompass_task_verdicts.py``);
``tests/tasks/test_opencompass_task_verdicts.py`` fails when a rule here drifts from them.

    from dare_bench.tasks.graders import opencompass_choice as oc
    oc.first_option("The answer is (C)", "ABCD")          # 'C'   first_option_postprocess
    oc.answer_pattern("ANSWER: d", oc.MMLU_PRO_PATTERN)   # 'd' (then wrong against 'D', as in OpenCompass)
    oc.gpqa_correct_answer("The correct answer is ( C )")  # 'C'   DARE's GPQA_Simple_Eval_postprocess_

Quirks kept on purpose (they move DARE's numbers):
- ``first_option``: a missing comma in OpenCompass's pattern list glues ``故选?\\s*([..])`` to the next pattern, so
  neither matches alone; a match returns the first option letter *in option order* contained in the matched text
  ("答案是(DB)" and "The answer is D or B" give B); the last resort is the first capital option letter anywhere
  ("Dunno" -> D).
- ``gpqa_correct_answer`` (DARE's own ``GPQA_Simple_Eval_postprocess_``, not in upstream OpenCompass): the first
  "The correct answer is (X)", case-insensitive, the text inside the parentheses stripped; no match gives " ".
- the simple-evals configs (``mmlu_openai_simple_evals_gen_b618ea``, ``gpqa_openai_simple_evals_gen_5aeece``):
  the first ``(?i)ANSWER\\s*:\\s*([A-D])``; "answer: c" extracts "c" (wrong), no match gives '' (MMLU's
  match_answer_pattern) or None (GPQA_Simple_Eval_postprocess); "ANSWER: (C)" matches nothing.
- AccEvaluator / GPQAEvaluator compare the extracted string with the gold letter exactly: a lowercase "d" is wrong.
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


#: the simple-evals configs' pattern (mmlu_openai_simple_evals_gen_b618ea; GPQA_Simple_Eval_postprocess's, too)
SIMPLE_EVALS_ABCD_PATTERN = r"(?i)ANSWER\s*:\s*([A-D])"


def gpqa_simple_eval(text: str) -> str | None:
    """GPQA_Simple_Eval_postprocess (gpqa_openai_simple_evals_gen_5aeece): group 1 of the first match, else None."""
    match = re.search(SIMPLE_EVALS_ABCD_PATTERN, text)
    return match.group(1) if match else None


def gpqa_correct_answer(text: str) -> str:
    """DARE's GPQA_Simple_Eval_postprocess_ (its fork's opencompass/datasets/gpqa.py)."""
    match = re.search(r"The correct answer is \(([^)]+)\)", text, re.IGNORECASE)
    return match.group(1).strip() if match else " "
