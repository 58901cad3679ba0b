"""MATH (test, 5000 problems): the full Hendrycks MATH test set, as OpenCompass's ``opencompass/math`` dataset holds
it; the "MATH" column of DARE's evaluation table for LLaDA, Dream, SDAR-30B-A3B and LLaDA2.x (SDAR-8B's cell is
MATH-500: the ``math500`` task).

Data: DARE's repository has no MATH test file, so ``dare-bench data get math --hf`` converts the public rows into
``$DARE_BENCH_DATA/rl/test/math.parquet`` (verl rows: the bare problem as the user turn, ground truth OpenCompass's
gold, ``extra_info`` the solution, level and type; ``tasks/data.py``'s ``opencompass_math`` converter): the 5000 rows
of EleutherAI/hendrycks_math's 7 subject configs (test), the problems of OpenCompass's ``data/math/math.json``.
``--from FILE`` converts that ``math.json`` itself (an object ``{id: {problem, level, type, solution}}``, read in key
order as OpenCompass's MATHDataset does) or MATH test rows (``problem`` + ``solution``) as .jsonl / .json /
.parquet; ``source=`` loads either kind of file through the same converter. The gold is OpenCompass's:
``extract_boxed_answer`` of the solution (its last ``\\boxed{}``; none when it has no box, as MATHDataset keeps such a
row and every answer to it is wrong). Graders without a protocol: those of math500 (``dare``, ``d1``, ``strict``).

OpenCompass protocols (task option ``protocol``, grader ``opencompass``; ``tasks/protocols.py``), from DARE's fork
yjyddq/DARE@83ae8a3, ``opencompass/opencompass/configs/datasets/``:

- ``math_0shot_gen_11c4b5`` (``math/math_0shot_gen_11c4b5.py``; LLaDA, Dream, LLaDA2.x): "{problem}\\nPlease reason
  step by step, and put your final answer within \\boxed{}."; math_postprocess_v2 + MATHEvaluator(version='v2').
- ``math_gen_a58d9d`` (``math/math_gen_a58d9d.py``, what ``math/math_gen.py`` imports; SDAR-30B-A3B): 4-shot chat
  ("Problem:\\n...\\nSolution:", the doubled braces of the config kept, as OpenCompass's safe_substitute leaves them),
  then "Problem:\\n{problem}\\nSolution:\\n"; no postprocessor, MATHVerifyEvaluator (math_verify on the completion).

    dare-bench data get math --hf                  # or: dare-bench data get math --from data/math/math.json
    task = get_task("math").with_options({"protocol": "math_0shot_gen_11c4b5"})
    ds = task.load("test")                         # or task.load("test", source="data/math/math.json")
    task.grade(completion, ds[0], grader="opencompass")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dare_bench.errors import DataError
from dare_bench.tasks.base import TaskDataset, read_rows, sha256_file
from dare_bench.tasks.graders import opencompass_protocols as ocp
from dare_bench.tasks.math500 import Math500Task, grade_math_verify, opencompass_gold, zero_shot_messages
from dare_bench.tasks.protocols import Protocol, fewshot_turns, graded, user_turn


def _grade_math_v2(task, text: str, item):
    # the gold from the solution, as MATHDataset: a solution without a box is reference None (never right)
    pred, gold = ocp.math_postprocess_v2(text), opencompass_gold(item)
    return graded(ocp.math_v2_equiv(pred, gold), pred, gold)


def _four_shot(task, item) -> list[dict[str, str]]:
    return [dict(m) for m in fewshot_turns()["math_gen_a58d9d"]] + user_turn(
        f"Problem:\n{item.prompt_messages[-1]['content']}\nSolution:\n")


PROTOCOLS = {
    "math_0shot_gen_11c4b5": Protocol("math_0shot_gen_11c4b5", "math/math_0shot_gen_11c4b5.py", zero_shot_messages,
                                      _grade_math_v2),
    "math_gen_a58d9d": Protocol("math_gen_a58d9d", "math/math_gen_a58d9d.py", _four_shot, grade_math_verify),
}


def read_math_rows(path: Path) -> list[dict[str, Any]]:
    """The raw rows of a MATH file: OpenCompass's ``math.json`` (one object ``{id: record}``) as its records in key
    order, as MATHDataset iterates it; any other file as ``base.read_rows`` reads it."""
    if path.suffix.lower() == ".json" and path.is_file():
        text = path.read_text(encoding="utf-8")
        if text.lstrip().startswith("{"):
            try:
                records = list(json.loads(text).values())
            except ValueError as e:
                raise DataError(f"cannot read {path}: {e}") from e
            if not all(isinstance(r, dict) for r in records):
                raise DataError(f"{path}: every value of the JSON object must be a record")
            return records
    return read_rows(path)


class MathTask(Math500Task):
    name = "math"
    cpu_stand_in = ("arith", "math", "a tiny replica cannot learn MATH")
    d1_eval_prompt = None
    dare_files = {"test": "math.parquet"}
    # no hf: source hint: the set is 7 configs of EleutherAI/hendrycks_math, which one hf:<id>:<config> cannot name
    hf_hint = ""
    raw_converter = "opencompass_math"
    protocols = PROTOCOLS

    def _load_file(self, path: Path, split: str) -> TaskDataset:
        items = self.rows_to_items(read_math_rows(path), split, where=str(path))
        return TaskDataset(self.name, split, items, source=str(path.resolve()), fingerprint=sha256_file(path))
