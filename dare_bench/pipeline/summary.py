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
    metric: str = "accuracy"  # the reproduction's primary metric (eval.metric): what the summaries show
    compute: dict[str, Any] = field(default_factory=dict)  # training compute counted (trainers/compute.py)
    control: "ReproduceResult | None" = None  # its compute-matched SFT control (`reproduce --control`)
    #: the final model at each `eval.thresholds` value: {"final-thr0.9": metrics, ...}
    threshold_metrics: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        keys = ("run_id", "name", "scale", "status", "base_metrics", "metrics", "wall_seconds", "db")
        out = {k: getattr(self, k) for k in keys}
        out.update(seed=self.seed, config_hash=self.config_hash, modified=self.modified, metric=self.metric,
                   stage_seconds=self.stage_seconds, reward_curve=self.reward_curve, final_model=self.final_model)
        if self.compute:
            out["compute"] = self.compute
        if self.threshold_metrics:
            out["threshold_metrics"] = self.threshold_metrics
        if self.control is not None:
            out["control"] = self.control.to_json()
        if self.message:
            out["message"] = self.message
        if self.plan:
            out["plan"] = self.plan
        return out


def student_t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (p > 0.5), by bisection on its CDF (mpmath, which
    sympy brings; no scipy): 4.303 for p 0.975 and df 2."""
    import mpmath

    def cdf(x: float) -> float:
        return 1 - 0.5 * float(mpmath.betainc(df / 2, 0.5, 0, df / (df + x * x), regularized=True))

    lo, hi = 0.0, 1e4
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def seed_summary(results: list[ReproduceResult], metric: str = "accuracy") -> dict[str, Any]:
    """Mean and 95% confidence half-width (Student t over seeds) of the final and base `metric`, and the gain."""
    import statistics

    def stats(values: list[float]) -> dict[str, Any]:
        n = len(values)
        mean = statistics.fmean(values) if n else float("nan")
        half = (student_t_quantile(0.975, n - 1) * statistics.stdev(values) / n ** 0.5) if n > 1 else None
        return {"values": values, "mean": mean, "ci95": half, "n": n}

    finals = [float(r.metrics[metric]) for r in results if metric in r.metrics]
    bases = [float(r.base_metrics[metric]) for r in results if metric in r.base_metrics]
    gains = [f - b for f, b in zip(finals, bases)] if len(finals) == len(bases) else []
    out = {"metric": metric, "final": stats(finals), "base": stats(bases), "gain": stats(gains)}
    controls = [r.control.metrics.get(metric) for r in results if r.control is not None]
    if controls and len(controls) == len(results) == len(finals) and None not in controls:
        out["control"] = stats([float(c) for c in controls])
        out["vs_control"] = stats([f - float(c) for f, c in zip(finals, controls)])
    return out


def seed_table_lines(results: list[ReproduceResult], metric: str = "accuracy") -> list[str]:
    """The per-seed table `reproduce` prints after running every pinned seed, with mean ± 95% CI."""
    lines = [f"{'seed':>6}  {'run':>5}  {'status':<9} {'base':>8}  {'final':>8}  {'gain':>8}"]
    for r in results:
        b, f = r.base_metrics.get(metric), r.metrics.get(metric)
        gain = f"{f - b:+8.3f}" if isinstance(b, float) and isinstance(f, float) else f"{'':>8}"
        fmt = lambda v: f"{v:8.3f}" if isinstance(v, float) else f"{'-':>8}"  # noqa: E731
        lines.append(f"{r.seed:>6}  {str(r.run_id or '-'):>5}  {r.status:<9} {fmt(b)}  {fmt(f)}  {gain}")
    summary = seed_summary(results, metric)
    cell = lambda st: (f"{st['mean']:8.3f} ± {st['ci95']:.3f}" if st["ci95"] is not None  # noqa: E731
                       else f"{st['mean']:8.3f}")
    lines.append(f"{'mean':>6}  {'':>5}  {'(95% CI)':<9} {cell(summary['base'])}  {cell(summary['final'])}  "
                 f"{cell(summary['gain'])}")
    if "vs_control" in summary:
        lines.append(f"compute-matched SFT control: final {cell(summary['control']).strip()}; "
                     f"RL - control {cell(summary['vs_control']).strip()}")
    return lines


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
    c = result.control
    if c is not None and isinstance(c.metrics.get(metric), float) and isinstance(result.metrics.get(metric), float):
        lines.append(f"control ({c.name}, run {c.run_id}, same {result.compute.get('flops', 0):.3e} FLOPs): "
                     f"final {c.metrics[metric]}  (RL - control {result.metrics[metric] - c.metrics[metric]:+.3f})")
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


__all__ = ["ReproduceResult", "seed_summary", "seed_table_lines", "sparkline", "student_t_quantile", "summary_lines"]
