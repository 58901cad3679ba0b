"""AIME 2025 (30 problems): as ``aime2024.py``, with OpenCompass ``configs/datasets/aime2025/
aime2025_gen_repeat8_5e9f4f.py`` (every DARE example config): the user turn "<problem>\\nRemember to put your final
answer within \\boxed{}."; the same ``math_postprocess_v2`` + ``MATHEvaluator(version='v2')`` verdict, 8 runs.
Task option ``protocol``: ``aime2025_gen_repeat8_5e9f4f`` (the only one; every cell).

Data: DARE's ``rl/test/aime2025.parquet`` (``dare-bench data get aime2025``; one gold is "336^\\circ").
"""

from __future__ import annotations

from dare_bench.tasks.aime2024 import AIME2024Task, grade_math_v2
from dare_bench.tasks.protocols import Protocol, own_messages

PROTOCOLS = {
    "aime2025_gen_repeat8_5e9f4f": Protocol("aime2025_gen_repeat8_5e9f4f", "aime2025/aime2025_gen_repeat8_5e9f4f.py",
                                            own_messages, lambda task, text, item: grade_math_v2(text, item)),
}


class AIME2025Task(AIME2024Task):
    name = "aime2025"
    cpu_stand_in = ("arith", "math", "a tiny replica cannot learn AIME")
    dare_files = {"test": "aime2025.parquet"}
    protocols = PROTOCOLS
    default_protocol = "aime2025_gen_repeat8_5e9f4f"
    instruction = "\nRemember to put your final answer within \\boxed{}."
