"""OpenCompass protocols: the task option ``protocol`` (an OpenCompass dataset-config name) of gsm8k, math, math500,
humaneval and mbpp, for DARE's "Evaluation Result Reproduction" table, which DARE scored with its OpenCompass fork.

A protocol is one dataset config: its prompt (the HUMAN turns, and the few-shot turns when it has them, sent as chat
messages so the checkpoint's chat template applies, exactly as DARE's OpenCompass model wrappers send them: a last
BOT turn such as MBPP's "[BEGIN]\\n" is dropped in generation mode), and its grading (pred_postprocessor +
evaluator), available as the grader ``opencompass`` (``graders/opencompass_protocols.py``). Without a protocol a
task is exactly as before (DARE's verl prompt, graders dare / d1 / strict); an unknown protocol is one ConfigError
listing the known ones.

    task = get_task("gsm8k").with_options({"protocol": "gsm8k_gen_1d7fe4"})
    task.messages(item)                          # the 4-shot chat of gsm8k_gen_1d7fe4
    task.grade(completion, item, grader="opencompass")   # gsm8k_postprocess + Gsm8kEvaluator

The benchmarks DARE scores *only* through OpenCompass (mmlu, mmlupro, hellaswag, arcc, gpqa, aime2024, aime2025,
olympiadbench) are ``OpenCompassTask``s: their items are built by one config (``default_protocol``, the one most
DARE configs import), which is also their behaviour without a protocol; another protocol rebuilds the chat from the
item (its question and options) and both graders ``dare`` and ``opencompass`` give that protocol's verdict.

In a reproduction: ``task_options: {protocol: gsm8k_gen_1d7fe4}`` and ``grader: opencompass``. Every protocol's
source is its task's docstring and ``Protocol.source``; ``tests/tasks/test_opencompass_protocols.py`` checks the
prompts against OpenCompass's rendering and the verdicts against OpenCompass's evaluators.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from dare_bench.errors import ConfigError
from dare_bench.tasks.base import GradeResult, GraderFn, Item, Task

#: DARE's OpenCompass fork, where each protocol's config file lives (``opencompass/opencompass/configs/datasets/``)
DARE_FORK = "yjyddq/DARE@83ae8a3"
FEWSHOT_PATH = Path(__file__).with_name("opencompass_fewshot.json")


@lru_cache(maxsize=1)
def fewshot_turns() -> dict[str, list[dict[str, str]]]:
    """Few-shot chat turns of the configs that have them, as OpenCompass renders them (provenance in the file)."""
    data = json.loads(FEWSHOT_PATH.read_text(encoding="utf-8"))
    return {k: v for k, v in data.items() if not k.startswith("_")}


@dataclass(frozen=True)
class Protocol:
    """One OpenCompass dataset config: ``messages(task, item)`` its chat, ``grade(task, completion, item)`` its
    verdict (``GradeResult.extracted`` = the prediction after its postprocessor)."""

    name: str
    source: str  # the config file in DARE's fork, relative to opencompass/opencompass/configs/datasets/
    messages: Callable[[Any, Item], list[dict[str, str]]]
    grade: Callable[[Any, str, Item], GradeResult]


class ProtocolTask(Task):
    """A task with the ``protocol`` option. Subclasses set ``protocols`` and implement ``base_graders``."""

    protocols: dict[str, Protocol] = {}
    option_defaults: dict[str, Any] = {"protocol": None}
    protocol: str | None = None

    def base_graders(self) -> dict[str, GraderFn]:
        raise NotImplementedError

    def build_graders(self) -> dict[str, GraderFn]:
        graders = dict(self.base_graders())
        if self.protocol is not None:
            spec = self.protocols[self.protocol]
            graders["opencompass"] = lambda text, item: spec.grade(self, text, item)
        return graders

    def check_options(self, options: dict[str, Any]) -> None:
        name = options.get("protocol")
        if name is not None and name not in self.protocols:
            raise ConfigError(f"task {self.name!r} has no OpenCompass protocol {name!r}; known: "
                              f"{', '.join(sorted(self.protocols))}")

    def with_options(self, options: dict[str, Any] | None) -> "Task":
        configured = super().with_options(options)
        if configured is not self:  # the copy's `opencompass` grader reads the copy's protocol
            configured._graders = configured.build_graders()
        return configured

    def messages(self, item: Item, style: str = "dare") -> list[dict[str, str]]:
        if self.protocol is not None and style == "dare":
            return self.protocols[self.protocol].messages(self, item)
        return super().messages(item, style)


class OpenCompassTask(ProtocolTask):
    """A benchmark DARE scores only through OpenCompass: ``protocols[default_protocol]`` is what the task does without
    a protocol (its items' own chat, its own grader); under any protocol ``dare`` and ``opencompass`` are the same
    verdict, the protocol's (DARE has no other rule for these benchmarks)."""

    default_protocol: str = ""

    def build_graders(self) -> dict[str, GraderFn]:
        spec = self.protocols[self.protocol or self.default_protocol]

        def grade(text: str, item: Item) -> GradeResult:
            return spec.grade(self, text, item)

        return {"dare": grade, "opencompass": grade}


def own_messages(task: Any, item: Item) -> list[dict[str, str]]:
    """The chat the item carries: what the converter built with the task's default config."""
    return item.prompt_messages


def user_turn(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def graded(correct: bool, prediction: str | None, reference: str | None, **details: Any) -> GradeResult:
    return GradeResult(bool(correct), float(bool(correct)), prediction,
                       {"prediction": prediction, "reference": reference, **details})
