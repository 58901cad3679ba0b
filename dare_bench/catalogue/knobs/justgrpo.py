"""JustGRPO: the plug-in's settings (its knobs and its defaults of the shared ones), torch-free.

The catalogue reads `ALGORITHM` to validate reproductions at load time with this very class; the plug-in
(`dare_bench/trainers/algorithms/justgrpo.py`) is built from it at run time. See `dare_bench/catalogue/__init__.py`.
"""

from __future__ import annotations

from pydantic import Field

from dare_bench.catalogue import AlgorithmSpec
from dare_bench.catalogue.settings import AlgorithmConfig


class JustGrpoConfig(AlgorithmConfig):
    # Response positions per packed forward (DARE `justgrpo_position_chunk_size`, its recipe default 1); None = all
    # positions of the completion in one forward. Changes memory and speed only, never the numbers.
    position_chunk_size: int | None = Field(None, gt=0)
    # Score every completion position, the EOS padding after the first EOS too (official `grpo.py::logprob_loss`
    # sums over all gen_length positions); False = up to and including the first EOS (DARE, dare-bench).
    score_padding: bool = False
    # Normalise by the rows with a non-zero advantage only (official: scale = 1 / (gen_length * valid_samples));
    # with token-mean and score_padding this is the official loss. Needs loss_agg token-mean.
    valid_sample_norm: bool = False


ALGORITHM = AlgorithmSpec(name="justgrpo", kind="rl", knobs=JustGrpoConfig)
