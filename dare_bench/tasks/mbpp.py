"""MBPP: write a Python function that passes three asserts; OpenCompass's 3-shot ``[BEGIN] ... [DONE]`` prompt.

Standard data: DARE's ``rl/test/mbpp_1.parquet`` (500; eight chat turns: three solved examples, the task, and a
pre-filled ``[BEGIN]\\n`` assistant turn; ground truth = JSON list of assert strings). Also reads MBPP rows (``text``,
``test_list``, optional ``code``) — the prompt is rebuilt in DARE's layout. Graders: ``dare`` (DARE's harness:
OpenCompass-style code extraction, asserts appended, 1 s per assert), ``strict`` (the function named in the asserts
must be defined). d1 has no MBPP grader.

OpenCompass protocol (task option ``protocol``, grader ``opencompass``; ``tasks/protocols.py``): ``mbpp_gen_830460``
(DARE's fork yjyddq/DARE@83ae8a3, ``opencompass/opencompass/configs/datasets/mbpp/mbpp_gen_830460.py``, what
``mbpp/mbpp_gen.py`` imports; all six models): the same 3-shot turns and task turn, without the last "[BEGIN]\\n"
turn (OpenCompass drops a final BOT turn in generation mode; the chat ends with the task and the generation prompt);
MBPPEvaluator as DARE's fork has it (its [BEGIN]/[DONE] extraction, the asserts as written, 10 s).
"""

from __future__ import annotations

import json
from typing import Any

from dare_bench.errors import DataError
from dare_bench.tasks.base import GraderFn, Item
from dare_bench.tasks.graders import dare, strict
from dare_bench.tasks.graders import opencompass_protocols as ocp
from dare_bench.tasks.protocols import Protocol, ProtocolTask

_HEAD = ("You are an expert Python programmer, and here is your task: {text} "
         "Your code should pass these tests:\n\n {tests}")
# OpenCompass's template ends the task turn with two spaces; its few-shot turns carry their own (one) space
_TASK = _HEAD + "  \n"
_SHOT = _HEAD + " \n"

# OpenCompass's MBPP few-shot turns (MBPP tasks 2, 3, 4), exactly as DARE's parquet carries them
FEW_SHOT = [
    {"role": "user", "content": _SHOT.format(
        text="Write a function to find the similar elements from the given two tuple lists.",
        tests="assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)\nassert similar_elements((1, 2, 3, 4),"
              "(5, 4, 3, 7)) == (3, 4) \nassert similar_elements((11, 12, 14, 13),(17, 15, 14, 13)) == (13, 14)")},
    {"role": "assistant", "content": "[BEGIN]\n 'def similar_elements(test_tup1, test_tup2):\r\n  "
                                     "res = tuple(set(test_tup1)"
                                     " & set(test_tup2))\r\n  return (res)' \n[DONE] \n\n "},
    {"role": "user", "content": _SHOT.format(
        text="Write a python function to identify non-prime numbers.",
        tests="assert is_not_prime(2) == False \nassert is_not_prime(10) == True \nassert is_not_prime(35) == True")},
    {"role": "assistant", "content": "[BEGIN]\n 'import math\r\ndef is_not_prime(n):\r\n    result = False\r\n"
                                     "    for i in range(2,int(math.sqrt(n)) + 1):\r\n        if n % i == 0:\r\n"
                                     "            result = "
                                     "True\r\n    return result' \n[DONE] \n\n "},
    {"role": "user", "content": _SHOT.format(
        text="Write a function to find the largest integers from a given list of numbers using heap queue algorithm.",
        tests="assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],3)==[85, 75, 65] \nassert "
              "heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],2)==[85, 75] \nassert heap_queue_largest( "
              "[25, 35, 22, 85, 14, 65, 75, 22, 58],5)==[85, 75, 65, 58, 35]")},
    {"role": "assistant", "content": "[BEGIN]\n 'import heapq as hq\r\ndef heap_queue_largest(nums,n):\r\n  "
                                     "largest_nums = "
                                     "hq.nlargest(n, nums)\r\n  return largest_nums' \n[DONE] \n\n "},
]


def _grade_dare(text: str, item: Item):
    return dare.grade_code(text, item, "mbpp")


def _opencompass_messages(task, item: Item) -> list[dict[str, str]]:
    messages = [dict(m) for m in item.prompt_messages]
    if messages and messages[-1]["role"] == "assistant":  # DARE's "[BEGIN]\n" pre-fill: not sent by OpenCompass
        messages = messages[:-1]
    return messages


def _grade_opencompass(task, text: str, item: Item):
    res = ocp.mbpp_verdict(text, item.ground_truth)
    res.details["prediction"] = res.extracted
    return res


PROTOCOLS = {
    "mbpp_gen_830460": Protocol("mbpp_gen_830460", "mbpp/mbpp_gen_830460.py", _opencompass_messages,
                                _grade_opencompass),
}


class MBPPTask(ProtocolTask):
    name = "mbpp"
    kind = "code"
    scales = ("paper",)
    cpu_stand_in = ("pyfunc", "code", "a tiny replica cannot learn MBPP")
    parallel_grading = True
    dare_files = {"test": "mbpp_1.parquet"}
    hf_hint = "mbpp"
    protocols = PROTOCOLS

    def base_graders(self) -> dict[str, GraderFn]:
        return {"dare": _grade_dare, "strict": strict.grade_mbpp}

    def make_messages(self, text: str, tests: list[str]) -> list[dict[str, str]]:
        task = {"role": "user", "content": _TASK.format(text=text, tests="\n".join(tests))}
        return [dict(m) for m in FEW_SHOT] + [task, {"role": "assistant", "content": "[BEGIN]\n"}]

    def row_to_item(self, row: dict[str, Any], index: int, split: str) -> Item:
        text = row.get("text", row.get("prompt"))  # the "sanitized" MBPP config calls it prompt
        if text is None or "test_list" not in row:
            raise DataError(f"mbpp rows need text (or prompt) and test_list, got {sorted(row)}")
        tests = [str(t) for t in row["test_list"]]
        extra = {"index": index, "split": split, "task": "code", "data_source": "mbpp"}
        if row.get("code"):
            extra["code"] = str(row["code"])
        return Item(index, self.make_messages(str(text), tests), json.dumps(tests), extra)

    def check_item(self, item: Item) -> None:
        try:
            tests = json.loads(item.ground_truth)
        except ValueError as e:
            raise DataError(f"mbpp item {item.index}: ground truth is not a JSON list of asserts") from e
        if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
            raise DataError(f"mbpp item {item.index}: ground truth is not a JSON list of asserts")

    def plain_prompt(self, item: Item) -> str:
        msgs = item.prompt_messages
        task = msgs[-2]["content"] if len(msgs) >= 2 else msgs[-1]["content"]
        return task + "[BEGIN]\n"

    def format_answer(self, item: Item, grader: str | None = None) -> str:
        code = item.extra.get("code")
        if not code:
            raise DataError("this MBPP source has no reference code (DARE's parquet has none); "
                            "load MBPP rows with 'code'")
        return f" '{code}' \n[DONE]"
