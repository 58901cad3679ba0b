"""HumanEval: complete a Python function; graded by running the official ``check`` tests.

Standard data: DARE's ``rl/test/humaneval_1.parquet`` (164; user turn "Complete the following python code:\\n" +
prompt; ground truth = the test code defining ``check(candidate)``). Also reads ``openai_humaneval`` rows (``prompt``,
``test``, ``entry_point``, ``canonical_solution``). Graders: ``dare`` (DARE's harness, quirks and all — see
``graders/dare.py``), ``strict`` (entry point must be defined and ``check(entry_point)`` must run). d1 has no
HumanEval grader. Code runs through ``dare_bench.sandbox``.
"""

from __future__ import annotations

from typing import Any

from dare_bench.errors import DataError
from dare_bench.tasks.base import GraderFn, Item, Task
from dare_bench.tasks.graders import dare, strict

HUMANEVAL_PREFIX = "Complete the following python code:\n"


def _grade_dare(text: str, item: Item):
    return dare.grade_code(text, item, "humaneval")


class HumanEvalTask(Task):
    name = "humaneval"
    kind = "code"
    scales = ("paper",)
    cpu_stand_in = ("pyfunc", "code", "a tiny replica cannot learn HumanEval")
    parallel_grading = True
    dare_files = {"test": "humaneval_1.parquet"}
    hf_hint = "openai/openai_humaneval"

    def build_graders(self) -> dict[str, GraderFn]:
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
