"""The result of `dare-bench reproduce` and its one-screen summary (`ReproduceResult`, `summary_lines`).

    from dare_bench.pipeline import reproduce, summary_lines
    print("\n".join(summary_lines(reproduce("d1-llada-sudoku", scale="micro"))))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ReproduceResult:
    run_id: int | None
    name: str
    scale: str
    status: str  # finished | failed | skipped | dry-run
    base_metrics: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    wall_seconds: float = 0.0
    db: str = ""
    stage_seconds: dict[str, float] = field(default_factory=dict)
    reward_curve: list[float] = field(default_factory=list)
    seed: int = 0
    config_hash: str = ""
    modified: bool = False
    message: str = ""
    plan: dict[str, Any] = field(default_factory=dict)
    final_model: str | None = None  # directory of the trained model (HF checkpoint, or PEFT adapters for LoRA)

    def to_json(self) -> dict[str, Any]:
        keys = ("run_id", "name", "scale", "status", "base_metrics", "metrics", "wall_seconds", "db")
        out = {k: getattr(self, k) for k in keys}
        out.update(seed=self.seed, config_hash=self.config_hash, modified=self.modified,
                   stage_seconds=self.stage_seconds, reward_curve=self.reward_curve, final_model=self.final_model)
        if self.message:
            out["message"] = self.message
        if self.plan:
            out["plan"] = self.plan
        return out


def summary_lines(result: ReproduceResult, metric: str = "accuracy") -> list[str]:
    """The one-screen summary printed at the end of `dare-bench reproduce`."""
    lines = [f"{result.name} [{result.scale}, seed {result.seed}] -> {result.status}"
             + (f" (run {result.run_id}, {result.db})" if result.run_id else "")]
    if result.message:
        lines.append(result.message)
    if result.base_metrics or result.metrics:
        b, f = result.base_metrics.get(metric), result.metrics.get(metric)
        delta = f"  ({f - b:+.3f})" if isinstance(b, float) and isinstance(f, float) else ""
        lines.append(f"{metric}: base {b}  ->  final {f}{delta}")
    if result.reward_curve:
        lines.append("reward: " + sparkline(result.reward_curve)
                     + f"  {result.reward_curve[0]:.3f} -> {result.reward_curve[-1]:.3f}")
    if result.stage_seconds:
        lines.append("time: " + ", ".join(f"{k} {v:.1f}s" for k, v in result.stage_seconds.items())
                     + f"; total {result.wall_seconds:.1f}s")
    return lines


def sparkline(values: list[float]) -> str:
    bars = "▁▂▃▄▅▆▇█"
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    step = max(1, len(values) // 60)
    return "".join(bars[min(7, int((v - lo) / span * 7.999))] for v in values[::step])


__all__ = ["ReproduceResult", "sparkline", "summary_lines"]
