"""Can a reproduction run on this machine, at a scale? And if not, why (`dare-bench list --runnable`).

The reasons, in the order they are checked:
- "no plug-in": an RL algorithm the catalogue lists without a plug-in file yet (none today);
- "GPU-only": paper / official scales without a CUDA device (`--device cpu` with a shrunk checkpoint still runs them);
- "missing data": `train.data` does not resolve here (the DataError names the file and the variable to set);
- "missing data": the evaluation split is absent (the error names `dare-bench data get <task>`);
- "not built": VRPO's preference source at paper scale (only pairs from the base's samples exist), or an
  evaluation protocol whose data dare-bench does not ship (SDAR-30B's few-shot MMLU-Pro / 10-shot HellaSwag).
Everything else the plan checks (the plug-in's cross-field settings, the algorithm on the backbone) is tested
against the real plan for every entry in tests/registry/test_runnable.py.

    dare-bench list --runnable
    from dare_bench.registry.runnable import why_not_runnable
    why_not_runnable(get("d1-llada-gsm8k"), "tiny")   # None when it runs, else (kind, one-line reason)
"""

from __future__ import annotations

from dare_bench import catalogue
from dare_bench.errors import ConfigError, DataError, NotBuiltError

# VRPO's only preference data source the pipeline builds (pipeline.plan.TASK_PAIRS names the same string)
TASK_PAIRS = "task-pairs-from-base"


def why_not_runnable(spec, scale: str, *, gpu: bool | None = None) -> tuple[str, str] | None:
    """None when `spec` at `scale` can run here; else (kind, reason) with kind in no plug-in | GPU-only |
    missing data | not built | no such scale. `gpu`: whether a CUDA device is present (default: ask torch)."""
    if scale not in spec.scales:
        try:
            spec.resolve(scale)  # the task's refusal, naming the stand-in (gsm8k -> arith)
        except ConfigError as exc:
            return "no such scale", str(exc)
    algo = catalogue.algorithm(spec.algorithm)
    if algo.kind == "rl" and algo.plugin is None:
        return "no plug-in", f"{spec.algorithm} has no RL plug-in yet (dare_bench/trainers/algorithms/)"
    if scale in ("paper", "official"):
        if gpu is None:
            import torch

            gpu = torch.cuda.is_available()
        if not gpu:
            return "GPU-only", "paper scale needs a CUDA GPU (or --device cpu with a shrunk checkpoint)"
    profile = spec.scales[scale]
    if algo.kind == "preference":
        knobs = algo.settings(profile.train)
        if knobs.preference_data != TASK_PAIRS:
            return "not built", f"VRPO on preference_data {knobs.preference_data!r} is not implemented"
    try:
        spec.resolve(scale, with_data=True).check_evaluation_items()
    except DataError as exc:
        return "missing data", str(exc)
    except NotBuiltError as exc:
        return "not built", str(exc)
    return None


__all__ = ["TASK_PAIRS", "why_not_runnable"]
