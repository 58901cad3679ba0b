"""The statistics behind `dare-bench check`: how far a score may move before it counts as a real shift.

The rule (justified in `dare_bench/check/__init__.py`'s docstring):

    sigma^2   = max(seed variance, item variance / n) * (1 + 1/K)      # one new run vs the mean of K recorded seeds
    item var  = p~(1 - p~), p~ = (x + 1)/(n + 2) for 0/1 items (Laplace: never zero); else the sample variance
                (bootstrap), or q(1 - q) R^2 with q = 1/(n + 2) when every item has the same value
    fail when |current - baseline mean| > z * sigma,  z = Phi^-1(1 - alpha / (2 m))  # Bonferroni over m checks

Curves (reward, loss): per-step residuals against the mean recorded curve; their mean is z-tested with the per-step
sigmas above, and the count of positive residuals is sign-tested (two-sided binomial) at the same alpha / m.
Pure Python (statistics.NormalDist): no torch, no numpy, so the check of a store is instant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist, fmean
from typing import Sequence

# Below this size a difference is floating-point noise (other BLAS / ISA kernels reorder sums; fp32 keeps ~7
# digits and a loss is a reduction over thousands of O(1) terms, so ~1e-4 relative, and ~1e-6 absolute for a value
# that is 0 by construction, e.g. a GRPO loss at mu = 1, logged as +-5e-9).
NUMERIC_REL_FLOOR = 1e-4
NUMERIC_ABS_FLOOR = 1e-6


def numeric_floor_var(value: float) -> float:
    """The variance floating-point noise alone can give a value of this size."""
    return NUMERIC_ABS_FLOOR ** 2 + (NUMERIC_REL_FLOOR * abs(value)) ** 2


def bonferroni_z(alpha: float, m: int) -> float:
    """Two-sided critical value that keeps the chance of any false alarm among `m` checks below `alpha`."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    return NormalDist().inv_cdf(1.0 - alpha / (2.0 * max(1, m)))


def sample_var(xs: Sequence[float]) -> float:
    """Unbiased variance (ddof = 1); 0 for fewer than two values."""
    if len(xs) < 2:
        return 0.0
    m = fmean(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def item_variance(items: Sequence[float]) -> float:
    """Per-item variance of a metric: what its standard error over n items (binomial / bootstrap) is built on.

    0/1 items: the Laplace-smoothed binomial variance p~(1 - p~), p~ = (x + 1)/(n + 2), so a metric that is 0 (or 1)
    on every item keeps a standard error of about one item in n. Continuous items: the sample variance (the bootstrap
    standard error squared, times n); when every item has the same value, the Laplace floor q(1 - q) R^2 of an
    all-zero binary metric, q = 1/(n + 2), scaled by the metric's range R (1 for scores in [0, 1]).
    """
    n = len(items)
    if n == 0:
        return 0.0
    if all(x in (0.0, 1.0) for x in items):
        p = (sum(items) + 1.0) / (n + 2.0)
        return p * (1.0 - p)
    v = sample_var(items)
    if v > 0.0:
        return v
    q = 1.0 / (n + 2)
    scale = max(1.0, max(abs(x) for x in items))
    return q * (1.0 - q) * scale * scale


@dataclass
class ScalarTest:
    baseline: float          # mean over recorded seeds
    current: float
    sigma: float
    tolerance: float
    z: float                 # standardised shift
    seed_sd: float
    item_se: float
    passed: bool

    @property
    def delta(self) -> float:
        return self.current - self.baseline


def scalar_test(seed_values: Sequence[float], seed_items: Sequence[Sequence[float]] | None, current: float,
                z_crit: float) -> ScalarTest:
    """One new value against the values of K recorded seeds (and, when known, their per-item values)."""
    k = len(seed_values)
    if k == 0:
        raise ValueError("no recorded values")
    base = fmean(seed_values)
    seed_v = sample_var(seed_values)
    item_v = 0.0
    if seed_items:
        per_seed = [item_variance(items) / len(items) for items in seed_items if items]
        item_v = fmean(per_seed) if per_seed else 0.0
    item_v = max(item_v, numeric_floor_var(base))
    sigma = math.sqrt(max(seed_v, item_v) * (1.0 + 1.0 / k))
    tol = z_crit * sigma
    zval = (current - base) / sigma
    return ScalarTest(base, float(current), sigma, tol, zval, math.sqrt(seed_v), math.sqrt(item_v),
                      abs(current - base) <= tol)


@dataclass
class CurveTest:
    steps: int
    mean_residual: float
    sigma: float             # of the mean residual
    tolerance: float
    z: float
    positive: int            # residuals above the recorded mean
    negative: int
    sign_p: float            # two-sided binomial p-value of the positive / negative split
    sign_alpha: float
    mean_passed: bool
    sign_passed: bool
    baseline_mean: float     # mean of the recorded curve (for the report)
    current_mean: float

    @property
    def passed(self) -> bool:
        return self.mean_passed and self.sign_passed


def binom_two_sided(k: int, n: int) -> float:
    """P(a split at least as lopsided as k of n) for a fair coin."""
    if n == 0:
        return 1.0
    lo = min(k, n - k)
    tail = sum(math.comb(n, i) for i in range(lo + 1)) / 2.0 ** n
    return min(1.0, 2.0 * tail)


def curve_test(seed_curves: Sequence[Sequence[float]], current: Sequence[float], z_crit: float, sign_alpha: float,
               step_floor_var: Sequence[float] | None = None) -> CurveTest:
    """Residuals of `current` against the mean of K recorded curves of the same length.

    Per-step variance: the seed variance, or the within-step floor (e.g. reward_std^2 / rollouts per step) when
    larger, or the numeric floor; steps are treated as independent (rollouts are redrawn every step).
    """
    k = len(seed_curves)
    t_len = len(current)
    means = [fmean(c[t] for c in seed_curves) for t in range(t_len)]
    var_t = []
    for t in range(t_len):
        v = sample_var([c[t] for c in seed_curves])
        if step_floor_var is not None:
            v = max(v, step_floor_var[t])
        var_t.append(max(v, numeric_floor_var(means[t])))
    residuals = [c - m for c, m in zip(current, means)]
    mean_res = fmean(residuals)
    sigma = math.sqrt(sum(var_t) * (1.0 + 1.0 / k)) / t_len
    tol = z_crit * sigma
    # A residual inside the numeric floor carries no sign.
    pos = sum(1 for r, v in zip(residuals, var_t) if r > math.sqrt(v) * 1e-3)
    neg = sum(1 for r, v in zip(residuals, var_t) if r < -math.sqrt(v) * 1e-3)
    p = binom_two_sided(pos, pos + neg)
    return CurveTest(steps=t_len, mean_residual=mean_res, sigma=sigma, tolerance=tol, z=mean_res / sigma,
                     positive=pos, negative=neg, sign_p=p, sign_alpha=sign_alpha, mean_passed=abs(mean_res) <= tol,
                     sign_passed=p >= sign_alpha, baseline_mean=fmean(means), current_mean=fmean(current))
