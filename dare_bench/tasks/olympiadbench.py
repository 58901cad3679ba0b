"""OlympiadBench (the 5 open-ended text-only sets DARE evaluates: maths en/zh COMP, maths zh CEE, physics en COMP,
physics zh CEE): DARE's 0-shot competition-math evaluation.

Follows OpenCompass ``configs/datasets/OlympiadBench/OlympiadBench_0shot_gen_be8b13.py`` (every DARE example config)
with its ``OlympiadBench_categories.py``: the prompt is ``OlympiadBenchPrompter.make_prompt`` (English or Chinese
instruction naming the answer type, the unit rule and "So the final answer is \\boxed{answer}.", the problem, then
"Please reason step by step, and put your final answer within \\boxed{}." / its Chinese form); verdict:
``olympiadbench_postprocess_v2`` + ``OlympiadBenchEvaluator(version='v2')`` (``graders/opencompass_olympiad.py``; needs
``antlr4-python3-runtime==4.11.0`` for sympy's LaTeX parser, as OpenCompass does). The gold is ``final_answer[0]``.
OpenCompass reports each of the 5 sets (``extra_info.category``); DARE's figure is their mean. Task option ``protocol``:
``OlympiadBench_0shot_gen_be8b13`` (the only one; every cell).

Data: ``dare-bench data get olympiadbench --hf`` (Hothan/OlympiadBench, the 5 configs, train split: the files
OpenCompass's ``OlympiadBenchDataset`` reads) -> ``rl/test/olympiadbench.parquet``; raw rows load directly.
"""

from __future__ import annotations

from dare_bench.tasks.base import GradeResult, Item
from dare_bench.tasks.graders import opencompass_olympiad as olympiad
from dare_bench.tasks.protocols import OpenCompassTask, Protocol, own_messages

#: the configs OlympiadBench_categories.py lists, in its order
CATEGORIES = ("OE_TO_maths_en_COMP", "OE_TO_maths_zh_COMP", "OE_TO_maths_zh_CEE", "OE_TO_physics_en_COMP",
              "OE_TO_physics_zh_CEE")

_TYPES = {"Numerical": ("a numerical value", "数值"), "Expression": ("an expression", "表达式"),
          "Equation": ("an equation", "方程"), "Interval": ("an interval", "区间")}


def _single_type(answer_type: str, chinese: bool) -> str:
    if "-" in answer_type:
        answer_type = answer_type[:answer_type.find("-")]
    for key, (en, zh) in _TYPES.items():
        if key in answer_type:
            return zh if chinese else en
    raise ValueError(f"Error parsing answer type {answer_type}!")


def _answer_type_text(answer_type: str, chinese: bool, multiple: bool) -> str:
    """get_answer_type_text."""
    if "Need_human_evaluate" in answer_type or "Tuple" in answer_type:
        return ""
    if not multiple:
        text = _single_type(answer_type, chinese)
        return f"，答案类型为{text}" if chinese else f"The answer of The problem should be {text}. "
    kinds = [_single_type(t, chinese) for t in answer_type.split(",")] if "," in answer_type else \
        [_single_type(answer_type, chinese)]
    if len(set(kinds)) == 1:
        return (f"，题目有多个答案，答案类型均为{kinds[0]}" if chinese
                else f"The problem has multiple answers, each of them should be {kinds[0]}. ")
    if chinese:
        return f"，题目有多个答案，答案类型分别为{'、'.join(kinds)}"
    return f"The problem has multiple answers, with the answers in order being {', '.join(kinds)}. "


def make_prompt(problem: str, language: str, subject: str, question_type: str, answer_type: str,
                is_multiple_answer: bool, unit: str | None) -> str:
    """OlympiadBenchPrompter.make_prompt with the problem put in (OlympiadBenchTemplate)."""
    chinese, math_subject = language == "Chinese", subject == "Math"
    if chinese:
        field = "数学" if math_subject else "物理"
        if question_type == "Theorem proof":
            head = (f"以下是中国{field}竞赛中的证明题。请根据题目的要求，运用逻辑推理及常用定理证明题目中的命题。"
                    "证明过程中使用的变量和公式请使用LaTeX格式表示。")
        else:
            box = "\\boxed{用英文逗号连接的多个答案}" if is_multiple_answer else "\\boxed{答案}"
            unit_text = ""
            if unit:
                box += "(单位)"
                unit_text = "，注意答案的单位不要放在\\boxed{}中"
            head = (f"以下是中国{field}竞赛中的解答题{_answer_type_text(answer_type, True, is_multiple_answer)}。"
                    "请根据题目的要求和所提供的信息计算得出答案。解答过程和结果中使用的变量和公式请使用LaTeX格式表示。"
                    f"请在最后以\"所以最终答案是{box}。\"显式给出结果{unit_text}。")
        tail = "\n请通过逐步推理来解答问题，并把最终答案放置于\\boxed{}中。"
    else:
        field = "Math" if math_subject else "Physics"
        if question_type == "Theorem proof":
            head = (f"The following is a theorem proving problem from an International {field} competition. Please "
                    "use logical reasoning and common theorems to prove the proposition in the problem according to "
                    "the given requirements. Please use LaTeX format to represent the variables and formulas used in "
                    "the proof.")
        else:
            box = "\\boxed{multiple answers connected with commas}" if is_multiple_answer else "\\boxed{answer}"
            unit_text = ""
            if unit:
                box += "(unit)"
                unit_text = ", note that the unit of the answer should not be included in \\boxed{}"
            head = (f"The following is an open-ended problem from an International {field} competition. "
                    f"{_answer_type_text(answer_type, False, is_multiple_answer)}Please calculate the answer "
                    "according to the given requirements and the information provided. Please use LaTeX format to "
                    "represent the variables and formulas used in the solution process and results. Please end your "
                    f"solution with \"So the final answer is {box}.\" and give the result explicitly{unit_text}.")
        tail = "\nPlease reason step by step, and put your final answer within \\boxed{}."
    return head + "\n" + problem + "\n" + tail


def grade_olympiad(completion: str, item: Item) -> GradeResult:
    pred = olympiad.postprocess_v2(completion)
    ok = olympiad.judge(pred, item.ground_truth)
    return GradeResult(ok, float(ok), pred, {"pred": pred})


PROTOCOLS = {
    "OlympiadBench_0shot_gen_be8b13": Protocol(
        "OlympiadBench_0shot_gen_be8b13", "OlympiadBench/OlympiadBench_0shot_gen_be8b13.py", own_messages,
        lambda task, text, item: grade_olympiad(text, item)),
}


class OlympiadBenchTask(OpenCompassTask):
    name = "olympiadbench"
    scales = ("paper",)
    cpu_stand_in = ("arith", "math", "a tiny replica cannot learn OlympiadBench")
    raw_converter = "olympiadbench"
    dare_files = {"test": "olympiadbench.parquet"}
    hf_hint = "Hothan/OlympiadBench"

    protocols = PROTOCOLS
    default_protocol = "OlympiadBench_0shot_gen_be8b13"

    def load(self, *args, **kwargs):
        # before any generation: an evaluation must not decode for hours and then fail to grade
        olympiad.require_latex_parser()
        return super().load(*args, **kwargs)

    def grade(self, completion: str, item: Item, grader: str = "dare") -> GradeResult:
        olympiad.require_latex_parser()  # one ConfigError, not every answer silently wrong
        return super().grade(completion, item, grader)

    def plain_prompt(self, item: Item) -> str:
        return item.prompt_messages[-1]["content"]

    def format_answer(self, item: Item, grader: str | None = None) -> str:
        return f"So the final answer is \\boxed{{{item.ground_truth}}}."
