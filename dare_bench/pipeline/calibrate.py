"""`dare-bench calibrate NAME`: the scan that picks a tiny base's `start_step` (docs/tiny-scale-feasibility.md).

Post-training at tiny scale starts from an under-trained SFT base, so that RL has room to help: the method is to
train the base once, evaluate it at several SFT steps with the reproduction's pinned evaluation, and take the first
step whose accuracy sits in a target window (10-30 % by default). The scan trains exactly as the base cache does
(`base_cache.base_sft_setup`: same initialisation, items, batches and recipe), so its step-k model is the base that
`base.start_step: k` builds (at tiny scale, which reads the whole training split; a micro run reads a
start-step-sized item set, so there only the last scanned step is). Nothing is written: the table is the output,
to paste into the defaults layer that holds the recipe (`_defaults/backbone-tasks/<backbone>-<task>.yaml`).
With a validation-target recipe (`base.target`, the machine-stable rule), the scan also evaluates the held-out
validation items at every check of the rule, and marks the step the rule chooses with its test metric: the base
that recipe builds on this machine.

    dare-bench calibrate sft-llada-arith                          # steps 50, 100, ..., 400 at tiny scale
    dare-bench calibrate sft-sdar-pyfunc --at 100,150,200,300 base.lr=2e-3 --json
    dare-bench calibrate sft-llada-sudoku --scale micro --at 10,20 --window 0,1
    dare-bench calibrate sft-dream-sudoku --at 200,300,400 base.target.value=0.2   # where does a target land?

    from dare_bench.pipeline.calibrate import calibrate
    scan = calibrate("sft-llada-arith", at=[100, 200], log=print)   # Scan(rows=[{step, metrics, seconds}], ...)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from dare_bench.errors import ConfigError

DEFAULT_STEPS = (50, 100, 150, 200, 250, 300, 350, 400)
DEFAULT_WINDOW = (0.10, 0.30)


@dataclass
class Scan:
    """The scan of one reproduction's base: per step, the evaluation metrics and the SFT seconds so far."""

    name: str
    scale: str
    metric: str
    window: tuple[float, float]
    recipe: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    # the recipe's validation-target rule (None: a fixed start_step): its check steps' validation metric, and the
    # step it chooses (the first check whose validation metric reaches the target; None: not within the scan)
    target: dict[str, Any] | None = None
    validation: list[list[float]] = field(default_factory=list)
    chosen_step: int | None = None
    model: Any = field(default=None, repr=False)  # the base after the last scanned step (not serialised)

    @property
    def suggested_step(self) -> int | None:
        """The first scanned step whose primary metric lies in the window (None: no step does)."""
        lo, hi = self.window
        return next((r["step"] for r in self.rows if lo <= r["metrics"].get(self.metric, -1.0) <= hi), None)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "scale": self.scale, "metric": self.metric, "window": list(self.window),
                "recipe": self.recipe, "rows": self.rows, "suggested_start_step": self.suggested_step,
                "target": self.target, "validation": self.validation, "target_step": self.chosen_step}

    def lines(self) -> list[str]:
        """The table, as the YAML comment of a calibrated base recipe shows it."""
        other = sorted({k for r in self.rows for k in r["metrics"] if k != self.metric and k in ("score",)})
        val = self.target is not None
        head = (f"step  {self.metric:>9}" + "".join(f"  {k:>6}" for k in other) + ("  valid." if val else "")
                + "  sft s")
        out = [head]
        for r in self.rows:
            m = r["metrics"]
            out.append(f"{r['step']:>4}  {m.get(self.metric, float('nan')):>9.3f}"
                       + "".join(f"  {m.get(k, float('nan')):>6.3f}" for k in other)
                       + (f"  {r.get('validation', float('nan')):>6.3f}" if val else "")
                       + f"  {r['seconds']:>5.0f}" + ("  <- target rule" if r["step"] == self.chosen_step else ""))
        step = self.suggested_step
        lo, hi = self.window
        out.append(f"suggested start_step: {step} (first step with {self.metric} in [{lo:g}, {hi:g}])" if step
                   else f"no scanned step has {self.metric} in [{lo:g}, {hi:g}]: scan other steps or change the recipe")
        if val:
            out.append(f"target rule (validation {self.metric} >= {self.target['value']:g}, checked every "
                       f"{self.target['every']} from {self.target['from_step']}): "
                       + (f"step {self.chosen_step}" if self.chosen_step else "not reached within the scan"))
        return out


def parse_steps(text: str) -> list[int]:
    """`50,100,150` -> [50, 100, 150] (ascending, positive, distinct)."""
    try:
        steps = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--at {text!r}: expected comma-separated step counts, e.g. 50,100,200") from None
    if not steps or any(s <= 0 for s in steps) or sorted(set(steps)) != steps:
        raise ConfigError(f"--at {text!r}: expected ascending, distinct, positive step counts")
    return steps


def parse_window(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--window {text!r}: expected LOW,HIGH, e.g. 0.1,0.3") from None
    if not 0 <= lo <= hi <= 1:
        raise ConfigError(f"--window {text!r}: expected 0 <= LOW <= HIGH <= 1")
    return lo, hi


def calibrate(name: str, scale: str = "tiny", *, at: list[int] | tuple[int, ...] = DEFAULT_STEPS,
              overrides: list[str] | tuple[str, ...] = (), window: tuple[float, float] = DEFAULT_WINDOW,
              seed: int = 0, log=print, progress: bool = False) -> Scan:
    """Train `name`'s tiny base to `max(at)` SFT steps, evaluating at each step of `at` (see the module doc)."""
    from dare_bench.pipeline.base_cache import base_sft_setup, drop_overlong, validation_items
    from dare_bench.pipeline.evaluation import evaluate_model, validation_metric
    from dare_bench.pipeline.plan import _train_items_needed, resolve
    from dare_bench.tasks.mixtures import load_mixture
    from dare_bench.tasks.tokenizer import build_task_tokenizer
    from dare_bench.trainers.sft import SFTRunOptions, train_sft

    at = sorted(set(at))
    if not at or at[0] <= 0:
        raise ConfigError("calibrate: the scan steps must be positive")
    _, cfg = resolve(name, scale, overrides)
    if cfg.profile.base is None:
        raise ConfigError(f"{name} at scale {scale} has no tiny base to calibrate (only tiny / micro scales do)")
    target = cfg.profile.base.target
    if target is None:  # a micro run draws a step-sized item set: the scan's last step is the base's
        _, cfg = resolve(name, scale, [*overrides, f"base.start_step={at[-1]}"])
    task = cfg.run_task()
    tokenizer = build_task_tokenizer(cfg.task)
    items = list(drop_overlong(cfg, log, task, load_mixture(task, cfg.profile.train.data, _train_items_needed(cfg)),
                               tokenizer, "plain"))
    model, examples, sft_cfg = base_sft_setup(cfg, task, tokenizer, items, steps=at[-1])
    recipe = cfg.profile.base.model_dump(exclude={"start_step", "target"})
    scan = Scan(name=name, scale=scale, metric=cfg.profile.eval.metric, window=window, recipe=recipe,
                target=target.model_dump() if target else None)
    val_items = validation_items(cfg, items)
    limit = cfg.profile.eval.limit
    # the limit caps the test set (a generated one may be smaller): "up to"
    log(f"calibrate: SFT of {cfg.profile.model.preset} on {len(examples)} {cfg.task} examples, evaluated at "
        f"steps {', '.join(map(str, at))} ({f'up to {limit}' if limit else 'all'} test items each)")
    start = time.perf_counter()
    evaluation_seconds = 0.0

    def after_step(step: int) -> None:
        nonlocal evaluation_seconds
        checked = target is not None and target.checks(step)
        if step not in at and not (checked and scan.chosen_step is None):
            return
        t0 = time.perf_counter()
        validation = None
        if checked or (target is not None and step in at):
            validation = validation_metric(model, tokenizer, task, cfg, val_items, seed=cfg.profile.base.seed)
            if checked:
                scan.validation.append([step, validation])
            if checked and scan.chosen_step is None and validation >= target.value:
                scan.chosen_step = step  # the base the recipe's rule builds: its test metric goes in the table
        if step not in at and scan.chosen_step != step:
            evaluation_seconds += time.perf_counter() - t0
            return
        model.eval()
        result, _ = evaluate_model(model, tokenizer, task, cfg, seed=seed, progress=False, label=f"step-{step}",
                                   step=step)
        model.train()
        evaluation_seconds += time.perf_counter() - t0
        metrics = {k: float(v) for k, v in result.metrics.items() if isinstance(v, (int, float))}
        seconds = time.perf_counter() - start - evaluation_seconds  # SFT time only: what the base costs
        row = {"step": step, "metrics": metrics, "seconds": round(seconds, 1)}
        if validation is not None:
            row["validation"] = validation
        scan.rows.append(row)
        log(f"  step {step}: {scan.metric} = {metrics.get(scan.metric, float('nan')):.3f}"
            + (f", validation {validation:.3f}" if validation is not None else "")
            + ("  (the target rule's step)" if step == scan.chosen_step else ""))

    train_sft(model, examples, sft_cfg, SFTRunOptions(progress=progress, after_step=after_step))
    scan.model = model
    return scan


__all__ = ["DEFAULT_STEPS", "DEFAULT_WINDOW", "Scan", "calibrate", "parse_steps", "parse_window"]
