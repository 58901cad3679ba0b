"""MATH (test, 5000 problems): the full Hendrycks MATH test set, as OpenCompass's ``opencompass/math`` dataset holds
it; the "MATH" column of DARE's evaluation table for LLaDA, Dream, SDAR-30B-A3B and LLaDA2.x (SDAR-8B's cell is
MATH-500: the ``math500`` task).

Data: no pinned copy. DARE's RL data has no MATH test file and this machine reached no public copy to pin, so
``dare-bench data`` offers none; pass the file with ``source=``: OpenCompass's ``data/math/math.json`` (an object
``{id: {problem, level, type, solution}}``, read in key order as OpenCompass does) or Hendrycks MATH test rows
(``problem`` + ``solution``) as .jsonl / .json / .parquet. The gold is OpenCompass's: ``extract_boxed_answer`` of the
solution (its last ``\\boxed{}``). Graders without a protocol: those of math500 (``dare``, ``d1``, ``strict``).

OpenCompass protocols (task option ``protocol``, grader ``opencompass``; ``tasks/protocols.py``), from DARE's fork
yjyddq/DARE@83ae8a3, ``opencompass/opencompass/configs/datasets/``:

- ``math_0shot_gen_11c4b5`` (``math/math_0shot_gen_11c4b5.py``; LLaDA, Dream, LLaDA2.x): "{problem}\\nPlease reason
  step by step, and put your final answer within \\boxed{}."; math_postprocess_v2 + MATHEvaluator(version='v2').
- ``math_gen_a58d9d`` (``math/math_gen_a58d9d.py``, what ``math/math_gen.py`` imports; SDAR-30B-A3B): 4-shot chat
  ("Problem:\\n...\\nSolution:", the doubled braces of the config kept, as OpenCompass's safe_substitute leaves them),
  then "Problem:\\n{problem}\\nSolution:\\n"; no postprocessor, MATHVerifyEvaluator (math_verify on the completion).

    task = get_task("math").with_options({"protocol": "math_0shot_gen_11c4b5"})
    ds = task.load("test", source="data/math/math.json")
    task.grade(completion, ds[0], grader="opencompass")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dare_bench.errors import DataError
from dare_bench.tasks.base import Item, TaskDataset, sha256_file
from dare_bench.tasks.graders import opencompass_protocols as ocp
from dare_bench.tasks.math500 import Math500Task, grade_math_verify, zero_shot_messages
from dare_bench.tasks.protocols import Protocol, fewshot_turns, graded, user_turn


def _grade_math_v2(task, text: str, item: Item):
    pred = ocp.math_postprocess_v2(text)
    return graded(ocp.math_v2_equiv(pred, item.ground_truth), pred, item.ground_truth)


def _four_shot(task, item: Item) -> list[dict[str, str]]:
    return [dict(m) for m in fewshot_turns()["math_gen_a58d9d"]] + user_turn(
        f"Problem:\n{item.prompt_messages[-1]['content']}\nSolution:\n")


PROTOCOLS = {
    "math_0shot_gen_11c4b5": Protocol("math_0shot_gen_11c4b5", "math/math_0shot_gen_11c4b5.py", zero_shot_messages,
                                      _grade_math_v2),
    "math_gen_a58d9d": Protocol("math_gen_a58d9d", "math/math_gen_a58d9d.py", _four_shot, grade_math_verify),
}


class MathTask(Math500Task):
    name = "math"
    cpu_stand_in = ("arith", "math", "a tiny replica cannot learn MATH")
    d1_eval_prompt = None
    dare_files: dict[str, str] = {}
    hf_hint = "a MATH test file"
    protocols = PROTOCOLS

    def row_to_item(self, row: dict[str, Any], index: int, split: str) -> Item:
        if "problem" not in row or "solution" not in row:
            raise DataError(f"MATH rows need problem and solution, got {sorted(row)}")
        gold = ocp.extract_boxed_answer(str(row["solution"]))
        if gold is None:
            raise DataError("the solution has no \\boxed{} answer")
        extra = {"index": index, "split": split, "task": "math", "data_source": "math",
                 "solution": str(row["solution"])}
        for key in ("level", "type", "subject", "unique_id"):
            if key in row:
                extra[key] = row[key]
        return Item(index, [{"role": "user", "content": str(row["problem"])}], gold, extra)

    def _load_default(self, split: str, limit: int | None) -> TaskDataset:
        raise DataError("no pinned MATH test file (dare-bench data has none): pass source=<OpenCompass's "
                        "data/math/math.json, or MATH test rows with problem + solution>")

    def _load_file(self, path: Path, split: str) -> TaskDataset:
        if path.suffix.lower() == ".json" and path.is_file():
            text = path.read_text(encoding="utf-8")
            if text.lstrip().startswith("{"):  # OpenCompass's layout: {id: record}, in key order
                try:
                    records = list(json.loads(text).values())
                except ValueError as e:
                    raise DataError(f"cannot read {path}: {e}") from e
                if not all(isinstance(r, dict) for r in records):
                    raise DataError(f"{path}: every value of the JSON object must be a record")
                items = self.rows_to_items(records, split, where=str(path))
                return TaskDataset(self.name, split, items, source=str(path.resolve()),
                                   fingerprint=sha256_file(path))
        return super()._load_file(path, split)
