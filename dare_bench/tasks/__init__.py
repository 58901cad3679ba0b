"""Tasks: data, prompts, answer extraction, training rewards and evaluation verdicts, one file per task.

Registered tasks: ``sudoku`` (4x4), ``countdown`` (3 numbers), ``gsm8k``, ``math500``, ``math`` (the MATH test set,
5000, evaluation only), ``humaneval``, ``mbpp``, and
the procedural CPU-scale ``arith`` (GSM8K-style multi-step arithmetic, graded by gsm8k's graders) and ``pyfunc`` (a
small Python function from a docstring, graded through the sandbox). Evaluation-only benchmarks DARE scores only
through OpenCompass, each with the prompt and verdict of the dataset config DARE imports (``graders/
opencompass_choice.py``, ``opencompass_olympiad.py``, AIME on ``opencompass_protocols.py``): multiple choice ``mmlu``
(5-shot), ``mmlupro``, ``hellaswag``, ``arcc`` (ARC-Challenge dev), ``gpqa`` (diamond), and competition math
``aime2024``, ``aime2025``, ``olympiadbench``; their one rule is both the ``dare`` and the ``opencompass`` grader.

Real data: ``dare-bench data get <task>... [--from PATH | --hf] [--out DIR]`` writes DARE's verl parquet files (pinned
in ``data_manifest.yaml``) to ``$DARE_BENCH_DATA/rl/<split>/``; ``dare-bench data list | verify`` (``tasks/data.py``).

API (used by the trainer, the evaluator and the CLI — keep it small and stable)::

    from dare_bench.tasks import get_task, list_tasks
    task = get_task("sudoku")                     # unknown name -> ConfigError with a suggestion
    ds = task.load(split="test", source=None, limit=None)
        # source: None (DARE parquet under $DARE_BENCH_DATA/rl/<split>/, else the generator for sudoku/countdown),
        #         a .parquet/.jsonl/.json/.csv path, "hf:<id>[:<config>]@<revision>", or "generator[:<seed>]"
    ds.source, ds.fingerprint                     # what was resolved; sha256 of the file bytes / of the items' JSON
    item = ds[0]                                  # Item(index, prompt_messages, ground_truth, extra)
    task.generate(n, seed, split)                 # the procedural tasks only (sudoku, countdown, arith, pyfunc)
    task.format_prompt(item, "plain")             # short prompt for tiny models (task tokenizer covers it)
    task.format_prompt(item, tokenizer)           # the checkpoint's chat template over DARE's messages
    task.format_prompt(item, tokenizer, style="d1")   # d1's evaluation prompt (+ "<reasoning>"), for d1 presets
    task.messages(item, style)                    # the chat itself ("dare" | "d1")
    task.format_answer(item)                      # gold completion every grader accepts (SFT target)
    task.format_answer(item, grader="dare")       # countdown: the shorter form that grader needs
    from dare_bench.tasks.tokenizer import build_task_tokenizer   # tiny char-level HF tokenizer per task
    res = task.grade(completion, item, grader="dare")
        # GradeResult(correct, reward, extracted, details, score): reward = the grader's TRAINING reward,
        # correct = its EVALUATION verdict, score = the per-item evaluation metric the official code averages
    task.grade_many(completions, items, grader)   # same, in input order; code tasks run concurrently
    task.graders                                  # graders that exist for this task
    grader_source("dare")                         # provenance string for run records

Graders (``dare_bench/tasks/graders/``): ``dare`` (default; DARE's ``dllm_rm``), ``d1`` (d1's reward_func.py rewards
and parse_and_get_acc.py verdicts), ``strict`` (ours: closes the exploitable official quirks). Pairs that do not
exist: ``d1`` × ``humaneval`` / ``mbpp`` (d1 has no HumanEval/MBPP reward or evaluation); asking for one raises
ConfigError. Each grader module's docstring lists the official quirks it reproduces. OpenCompass protocols: gsm8k,
math, math500, humaneval and mbpp take the task option ``protocol`` (an OpenCompass dataset-config name of DARE's
evaluation table, ``tasks/protocols.py``): that config's chat prompt, and the grader ``opencompass`` (its
postprocessor + evaluator)::

    task = get_task("gsm8k").with_options({"protocol": "gsm8k_gen_1d7fe4"})
    task.messages(item); task.grade(completion, item, grader="opencompass")

Averaging: the official aggregate is the mean of ``score`` — except d1's Sudoku evaluation, which divides total
correct cells by total blank cells (``details["correct_cells"]`` / ``details["empty_cells"]``; equal to the mean when
every puzzle has the same number of blanks, as in DARE's files and the generator).
"""

from __future__ import annotations

import difflib

from dare_bench.errors import ConfigError
from dare_bench.tasks.base import GradeResult, Item, Task, TaskDataset
from dare_bench.tasks.graders import GRADER_SOURCES, grader_source

_REGISTRY: dict[str, str] = {
    "sudoku": "dare_bench.tasks.sudoku:SudokuTask",
    "countdown": "dare_bench.tasks.countdown:CountdownTask",
    "gsm8k": "dare_bench.tasks.gsm8k:GSM8KTask",
    "math500": "dare_bench.tasks.math500:Math500Task",
    "math": "dare_bench.tasks.math:MathTask",
    "humaneval": "dare_bench.tasks.humaneval:HumanEvalTask",
    "mbpp": "dare_bench.tasks.mbpp:MBPPTask",
    "pyfunc": "dare_bench.tasks.pyfunc:PyFuncTask",
    "arith": "dare_bench.tasks.arith:ArithTask",
    "mmlu": "dare_bench.tasks.mmlu:MMLUTask",
    "mmlupro": "dare_bench.tasks.mmlupro:MMLUProTask",
    "hellaswag": "dare_bench.tasks.hellaswag:HellaSwagTask",
    "arcc": "dare_bench.tasks.arcc:ARCChallengeTask",
    "gpqa": "dare_bench.tasks.gpqa:GPQATask",
    "aime2024": "dare_bench.tasks.aime2024:AIME2024Task",
    "aime2025": "dare_bench.tasks.aime2025:AIME2025Task",
    "olympiadbench": "dare_bench.tasks.olympiadbench:OlympiadBenchTask",
}
_CACHE: dict[str, Task] = {}

DEFAULT_GRADER = "dare"
GRADERS = ("dare", "d1", "strict", "opencompass")


def list_tasks() -> list[str]:
    return sorted(_REGISTRY)


def get_task(name: str) -> Task:
    if name not in _REGISTRY:
        close = difflib.get_close_matches(str(name), list(_REGISTRY), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown task {name!r}{hint} (known: {', '.join(list_tasks())})")
    if name not in _CACHE:
        import importlib

        module, cls = _REGISTRY[name].split(":")
        _CACHE[name] = getattr(importlib.import_module(module), cls)()
    return _CACHE[name]


__all__ = ["get_task", "list_tasks", "Task", "TaskDataset", "Item", "GradeResult", "DEFAULT_GRADER", "GRADERS",
           "GRADER_SOURCES", "grader_source"]
