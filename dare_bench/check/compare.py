"""Compare one observed run with its baseline: the list of checks `dare-bench check` reports.

Each check is a dict {"name", "status" (pass | fail | error), "baseline", "current", "delta", "tolerance",
"sigma", "z", "detail"}. `plan_checks` counts them first, so the Bonferroni critical value is known before any
test is made.
"""

from __future__ import annotations

from typing import Any

from dare_bench.check import stats
from dare_bench.check.baseline import ITEM_FIELDS

EVALUATIONS = ("final", "base")
METRICS = ("accuracy", "score", "mean_reward")
CURVE_NAMES = ("reward_mean", "loss", "grad_norm")


def _scalar_names(baseline: dict[str, Any]) -> list[tuple[str, str]]:
    first = baseline["runs"][0]
    out = []
    for ev in EVALUATIONS:
        metrics = (first.get(ev) or {}).get("metrics", {})
        out += [(ev, m) for m in METRICS if m in metrics]
    return out


def _curve_names(baseline: dict[str, Any]) -> list[str]:
    runs = baseline["runs"]
    return [c for c in CURVE_NAMES if all(c in r.get("curves", {}) for r in runs)]


def plan_checks(baseline: dict[str, Any]) -> int:
    """How many statistical tests `compare` makes for this baseline (a curve counts twice: mean and sign)."""
    return len(_scalar_names(baseline)) + 2 * len(_curve_names(baseline))


def _check(name: str, status: str, detail: str = "", **numbers: float | None) -> dict[str, Any]:
    out = {"name": name, "status": status, "baseline": None, "current": None, "delta": None, "tolerance": None,
           "sigma": None, "z": None, "detail": detail}
    out.update({k: (None if v is None else float(v)) for k, v in numbers.items()})
    return out


def _items(run: dict[str, Any], ev: str, metric: str) -> list[float] | None:
    values = ((run.get(ev) or {}).get("items") or {}).get(ITEM_FIELDS[metric])
    if not values or any(v is None for v in values):
        return None
    return [float(v) for v in values]


def compare(baseline: dict[str, Any], current: dict[str, Any], z_crit: float, alpha_each: float) -> list[dict]:
    """Every check of `current` (an `observe` dict) against `baseline`; alpha_each = the per-test false-alarm rate."""
    checks: list[dict[str, Any]] = []
    runs = baseline["runs"]
    for ev, metric in _scalar_names(baseline):
        name = f"{ev}/{metric}"
        cur_ev = current.get(ev)
        if not cur_ev or metric not in cur_ev.get("metrics", {}):
            checks.append(_check(name, "fail", f"the run has no {ev} evaluation with {metric}"))
            continue
        base_fp = (runs[0].get(ev) or {}).get("data_fingerprint")
        if base_fp and cur_ev.get("data_fingerprint") and cur_ev["data_fingerprint"] != base_fp:
            # Same config, other items: the task data (or its generator) changed under the reproduction.
            checks.append(_check(name, "fail", f"evaluated items changed (data fingerprint "
                                               f"{cur_ev['data_fingerprint'][:19]} != recorded {base_fp[:19]})"))
            continue
        seed_values = [float(r[ev]["metrics"][metric]) for r in runs if (r.get(ev) or {}).get("metrics", {})
                       .get(metric) is not None]
        items = [i for i in (_items(r, ev, metric) for r in runs) if i]
        t = stats.scalar_test(seed_values, items or None, float(cur_ev["metrics"][metric]), z_crit)
        detail = (f"n={cur_ev.get('n_items')} K={len(seed_values)} seed sd {t.seed_sd:.4f}, item se {t.item_se:.4f}")
        checks.append(_check(name, "pass" if t.passed else "fail", detail, baseline=t.baseline, current=t.current,
                             delta=t.delta, tolerance=t.tolerance, sigma=t.sigma, z=t.z))
    for curve in _curve_names(baseline):
        seed_curves = [r["curves"][curve] for r in runs]
        cur = (current.get("curves") or {}).get(curve)
        mean_name, sign_name = f"curve/{curve}/mean", f"curve/{curve}/sign"
        if not cur:
            checks += [_check(mean_name, "fail", f"the run logged no {curve}"), _check(sign_name, "fail", "")]
            continue
        lengths = {len(c) for c in seed_curves}
        if lengths != {len(cur)}:
            msg = f"{len(cur)} steps logged, {sorted(lengths)} recorded"
            checks += [_check(mean_name, "fail", msg), _check(sign_name, "fail", msg)]
            continue
        floor = None
        rollouts = runs[0].get("rollouts_per_step")
        if curve == "reward_mean" and rollouts and all("reward_std" in r["curves"] for r in runs):
            # Within one step the mean reward of `rollouts` samples has variance std^2 / rollouts.
            stds = [r["curves"]["reward_std"] for r in runs]
            floor = [sum(s[t] ** 2 for s in stds) / len(stds) / rollouts for t in range(len(cur))]
        t = stats.curve_test(seed_curves, cur, z_crit, alpha_each, floor)
        checks.append(_check(mean_name, "pass" if t.mean_passed else "fail",
                             f"mean residual over {t.steps} steps", baseline=t.baseline_mean, current=t.current_mean,
                             delta=t.mean_residual, tolerance=t.tolerance, sigma=t.sigma, z=t.z))
        checks.append(_check(sign_name, "pass" if t.sign_passed else "fail",
                             f"{t.positive} above / {t.negative} below the recorded mean, p={t.sign_p:.3g} "
                             f"(fails below {t.sign_alpha:.3g})"))
    return checks
