"""HumanEval: complete a Python function; graded by running the official ``check`` tests.

Standard data: DARE's ``rl/test/humaneval_1.parquet`` (164; user turn "Complete the following python code:\\n" +
prompt; ground truth = the test code defining ``check(candidate)``). Also reads ``openai_humaneval`` rows (``prompt``,
``test``, ``entry_point``, ``canonical_solution``). Graders: ``dare`` (DARE's harness, quirks and all — see
``graders/dare.py``), ``strict`` (entry point must be defined and ``check(entry_point)`` must run). d1 has no
HumanEval grader. Code runs through ``dare_bench.sandbox``.

OpenCompass protocols (task option ``protocol``, grader ``opencompass``; ``tasks/protocols.py``), from DARE's fork
yjyddq/DARE@83ae8a3, ``opencompass/opencompass/configs/datasets/``; both grade with humaneval_postprocess_v2 (the
first fenced block, left-stripped) + HumanEvalEvaluator (prompt + prediction + tests + ``check(entry_point)``, 3 s):

- ``humaneval_gen_8e312c`` (``humaneval/humaneval_gen_8e312c.py``; LLaDA, Dream, LLaDA2.x): "Complete the following
  python code:\n{prompt}" (DARE's RL prompt too).
- ``humaneval_openai_sample_evals_gen_dcae0e`` (``humaneval/humaneval_openai_sample_evals_gen_dcae0e.py``, what
  ``humaneval/humaneval_gen.py`` imports; SDAR): "Read the following function signature and docstring, and fully
  implement the function described. Your response should only contain the code for this function.\n{prompt}".
"""

from __future__ import annotations

from typing import Any

from dare_bench.errors import DataError
from dare_bench.tasks.base import GraderFn, Item
from dare_bench.tasks.graders import dare, strict
from dare_bench.tasks.graders import opencompass_protocols as ocp
from dare_bench.tasks.graders.strict import humaneval_entry_point
from dare_bench.tasks.protocols import Protocol, ProtocolTask, user_turn

HUMANEVAL_PREFIX = "Complete the following python code:\n"
SAMPLE_EVALS_PREFIX = ("Read the following function signature and docstring, and fully implement the function "
                       "described. Your response should only contain the code for this function.\n")


def _grade_dare(text: str, item: Item):
    return dare.grade_code(text, item, "humaneval")


def _grade_opencompass(task, text: str, item: Item):
    prediction = ocp.humaneval_postprocess_v2(text)
    res = ocp.humaneval_verdict(prediction, task.code_prompt(item), item.ground_truth, humaneval_entry_point(item))
    res.details["prediction"] = prediction
    return res


PROTOCOLS = {
    "humaneval_gen_8e312c": Protocol(
        "humaneval_gen_8e312c", "humaneval/humaneval_gen_8e312c.py",
        lambda task, item: user_turn(HUMANEVAL_PREFIX + task.code_prompt(item)), _grade_opencompass),
    "humaneval_openai_sample_evals_gen_dcae0e": Protocol(
        "humaneval_openai_sample_evals_gen_dcae0e", "humaneval/humaneval_openai_sample_evals_gen_dcae0e.py",
        lambda task, item: user_turn(SAMPLE_EVALS_PREFIX + task.code_prompt(item)), _grade_opencompass),
}


class HumanEvalTask(ProtocolTask):
    name = "humaneval"
    kind = "code"
    scales = ("paper",)
    cpu_stand_in = ("pyfunc", "code", "a tiny replica cannot learn HumanEval")
    parallel_grading = True
    dare_files = {"test": "humaneval_1.parquet"}
    hf_hint = "openai/openai_humaneval"
    protocols = PROTOCOLS

    def base_graders(self) -> dict[str, GraderFn]:
        return {"dare": _grade_dare, "strict": strict.grade_humaneval}

    def row_to_item(self, row: dict[str, Any], index: int, split: str) -> Item:
        if not {"prompt", "test"} <= set(row):
            raise DataError(f"humaneval rows need prompt and test, got {sorted(row)}")
        extra = {"index": index, "split": split, "task": "code", "data_source": "humaneval"}
        for key in ("entry_point", "canonical_solution", "task_id"):
            if key in row:
                extra[key] = row[key]
        extra["code_prompt"] = str(row["prompt"])
        messages = [{"role": "user", "content": HUMANEVAL_PREFIX + str(row["prompt"])}]
        return Item(index, messages, str(row["test"]), extra)

    def code_prompt(self, item: Item) -> str:
        content = item.prompt_messages[-1]["content"]
        return content[len(HUMANEVAL_PREFIX):] if content.startswith(HUMANEVAL_PREFIX) else content

    def plain_prompt(self, item: Item) -> str:
        return self.code_prompt(item)

    def format_answer(self, item: Item, grader: str | None = None) -> str:
        solution = item.extra.get("canonical_solution")
        if not solution:
            raise DataError("this HumanEval source has no canonical solution (DARE's parquet has none); "
                            "load openai_humaneval rows to get gold completions")
        return f"```python\n{self.code_prompt(item)}{solution}\n```"
