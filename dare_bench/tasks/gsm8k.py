"""GSM8K: grade-school word problems; the gold answer is the number after ``####``.

Standard data: DARE's ``rl/{train,test}/gsm8k_1.parquet`` (7473 / 1319; the bare question as the user turn, gold
numbers keep thousands separators such as "2,125"). Also reads ``openai/gsm8k`` rows (``question``, ``answer``) from a
file or ``hf:openai/gsm8k:main@<revision>``. Graders: ``dare`` (last ``\\boxed{}``, sympy), ``d1`` (XML rewards;
eval = first valid ``\\boxed{}`` else last number in ``<answer>``, as floats), ``strict``. The two official graders
disagree on many realistic completions (``<answer>`` without a box, "1,000", "18.0", several boxes): see
``tests/tasks/test_graders_math.py``.

OpenCompass protocols (task option ``protocol``, grader ``opencompass``; see ``tasks/protocols.py``), each from
DARE's fork (yjyddq/DARE@83ae8a3) ``opencompass/opencompass/configs/datasets/``:

- ``gsm8k_gen_1d7fe4`` (``gsm8k/gsm8k_gen_1d7fe4.py``, what ``gsm8k/gsm8k_gen.py`` imports): 4-shot chat,
  "Question: {question}\\nLet's think step by step\\nAnswer:"; gsm8k_postprocess (last number before any
  "Question:") + Gsm8kEvaluator (``pred == gold`` or ``|float(pred) - int(gold)| < 1e-6``).
- ``gsm8k_0shot_v2_gen_17d799`` (``gsm8k/gsm8k_0shot_v2_gen_17d799.py``): "{question}\\nPlease reason step by
  step, and put your final answer within \\boxed{}."; math_postprocess_v2 + MATHEvaluator(version='v2').

The gold of both is gsm8k_dataset_postprocess: the number after "####" without its commas.

    task = get_task("gsm8k"); task.grade("... so \\\\boxed{18}", item)            # dare
    get_task("gsm8k").with_options({"protocol": "gsm8k_gen_1d7fe4"}).grade(text, item, "opencompass")
"""

from __future__ import annotations

from typing import Any

from dare_bench.errors import DataError
from dare_bench.tasks.base import GraderFn, Item
from dare_bench.tasks.graders import d1, dare, strict
from dare_bench.tasks.graders import opencompass_protocols as ocp
from dare_bench.tasks.protocols import Protocol, ProtocolTask, fewshot_turns, graded, user_turn

# d1's eval/gsm8k.py instruction (zero-shot: instruction + "\n\n" + question)
D1_EVAL_PROMPT = (
    "You are a math expert. You will be given a question to solve. Solve it step by step. Wrap the final answer "
    "in a \\boxed{}. \nRespond in the following format:\n<reasoning>\nYour reasoning here\n</reasoning>\n<answer>\n"
    "\\boxed{...}\n</answer>"
)

def _question(item: Item) -> str:
    return item.prompt_messages[-1]["content"]


def _grade_gsm8k_gen(task, text: str, item: Item):
    pred, ref = ocp.gsm8k_postprocess(text), ocp.gsm8k_reference(item.ground_truth)
    return graded(ocp.gsm8k_equal(pred, ref), pred, ref)


def _grade_math_v2(task, text: str, item: Item):
    pred, ref = ocp.math_postprocess_v2(text), ocp.gsm8k_reference(item.ground_truth)
    return graded(ocp.math_v2_equiv(pred, ref), pred, ref)


PROTOCOLS = {
    "gsm8k_gen_1d7fe4": Protocol(
        "gsm8k_gen_1d7fe4", "gsm8k/gsm8k_gen_1d7fe4.py",
        lambda task, item: [dict(m) for m in fewshot_turns()["gsm8k_gen_1d7fe4"]]
        + user_turn(f"Question: {_question(item)}\nLet's think step by step\nAnswer:"),
        _grade_gsm8k_gen),
    "gsm8k_0shot_v2_gen_17d799": Protocol(
        "gsm8k_0shot_v2_gen_17d799", "gsm8k/gsm8k_0shot_v2_gen_17d799.py",
        lambda task, item: user_turn(
            f"{_question(item)}\nPlease reason step by step, and put your final answer within \\boxed{{}}."),
        _grade_math_v2),
}


class GSM8KTask(ProtocolTask):
    name = "gsm8k"
    scales = ("paper",)
    cpu_stand_in = ("arith", "math", "a tiny replica cannot learn GSM8K")
    d1_eval_prompt = D1_EVAL_PROMPT
    dare_files = {"test": "gsm8k_1.parquet", "train": "gsm8k_1.parquet"}
    hf_hint = "openai/gsm8k:main"
    protocols = PROTOCOLS

    def base_graders(self) -> dict[str, GraderFn]:
        return {"dare": dare.grade_math, "d1": d1.grade_gsm8k, "strict": strict.grade_gsm8k}

    def row_to_item(self, row: dict[str, Any], index: int, split: str) -> Item:
        if "question" not in row or "answer" not in row:
            raise DataError(f"gsm8k rows need question and answer, got {sorted(row)}")
        answer = str(row["answer"])
        gold = answer.split("####")[1].strip() if "####" in answer else answer.strip()
        return Item(index, [{"role": "user", "content": str(row["question"])}], gold,
                    {"index": index, "split": split, "task": "math", "data_source": "gsm8k"})

    def check_item(self, item: Item) -> None:
        try:
            d1.gsm8k_gold_number(item.ground_truth)
        except ValueError as e:
            raise DataError(f"gsm8k item {item.index}: gold answer {item.ground_truth!r} is not a number") from e

    def plain_prompt(self, item: Item) -> str:
        return f"Question: {item.prompt_messages[-1]['content']}\nAnswer:\n"

    def format_answer(self, item: Item, grader: str | None = None) -> str:
        # accepted by all three graders: a box for dare/d1-eval/strict, a bare <answer> for d1's XML rewards
        gt = item.ground_truth
        return f"<reasoning>\nThe answer is \\boxed{{{gt}}}.\n</reasoning>\n<answer>\n{gt}\n</answer>\n"
