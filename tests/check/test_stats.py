"""The tolerance rule of `dare-bench check`: noise passes at the promised rate, real shifts fail."""

import random
from statistics import NormalDist

from dare_bench.check import stats


def _binomial_run(rng: random.Random, p: float, n: int = 16) -> list[float]:
    return [1.0 if rng.random() < p else 0.0 for _ in range(n)]


def _simulate(p_baseline: float, p_current: float, alpha: float, trials: int = 2000, k: int = 3) -> float:
    """Fraction of checks that fail when K baseline seeds come from p_baseline and the new run from p_current."""
    rng = random.Random(0)
    z = stats.bonferroni_z(alpha, 1)
    fails = 0
    for _ in range(trials):
        items = [_binomial_run(rng, p_baseline) for _ in range(k)]
        new = sum(_binomial_run(rng, p_current)) / 16
        t = stats.scalar_test([sum(i) / 16 for i in items], items, new, z)
        fails += not t.passed
    return fails / trials


def test_false_alarms_stay_below_alpha_and_real_shifts_fail():
    alpha = 0.01
    for p in (0.05, 0.3, 0.5):
        assert _simulate(p, p, alpha) <= 2 * alpha  # the normal approximation of 16 items: within a factor 2
    # 16 items resolve only large accuracy shifts (the continuous score and the curves are finer)
    assert _simulate(0.6, 0.0, alpha) > 0.9
    assert _simulate(0.05, 0.5, alpha) > 0.9


def test_bonferroni_critical_value():
    assert abs(stats.bonferroni_z(0.05, 1) - NormalDist().inv_cdf(0.975)) < 1e-12
    assert stats.bonferroni_z(0.01, 40) > stats.bonferroni_z(0.01, 4) > stats.bonferroni_z(0.01, 1)


def test_a_deterministic_all_zero_baseline_tolerates_an_item_flip_but_not_a_shift():
    zeros = [0.0] * 16
    z = stats.bonferroni_z(0.01, 1)
    one_flip = stats.scalar_test([0.0, 0.0, 0.0], [zeros] * 3, 1 / 16, z)
    assert one_flip.seed_sd == 0.0 and one_flip.item_se > 0 and one_flip.passed
    half = stats.scalar_test([0.0, 0.0, 0.0], [zeros] * 3, 0.5, z)
    assert not half.passed and half.z > z


def test_item_variance_floor_scales_with_the_range():
    assert abs(stats.item_variance([0.0] * 16) - stats.item_variance([1.0] * 16)) < 1e-15
    assert stats.item_variance([0.0] * 16) > 0
    assert abs(stats.item_variance([3.0] * 16) - 9 * stats.item_variance([1.0] * 16)) < 1e-12
    spread = [0.2, 0.6] * 8  # continuous: the bootstrap (sample) variance
    assert stats.item_variance(spread) == stats.sample_var(spread)
    assert stats.item_variance([0.0, 1.0] * 8) == 0.25  # 0/1: Laplace, (8 + 1) / (16 + 2) = 1/2


def test_the_seed_spread_widens_the_tolerance_when_larger_than_the_item_error():
    items = [[0.5] * 16] * 3
    z = stats.bonferroni_z(0.01, 1)
    tight = stats.scalar_test([0.5, 0.5, 0.5], items, 0.5, z)
    loose = stats.scalar_test([0.2, 0.5, 0.8], items, 0.5, z)
    assert loose.tolerance > tight.tolerance and loose.seed_sd > loose.item_se


def test_a_consistent_curve_drift_within_the_mean_tolerance_fails_the_sign_test():
    steps, s = 50, 0.05
    means = [0.2 + 0.004 * t for t in range(steps)]
    seeds = [[m - s for m in means], list(means), [m + s for m in means]]
    z = stats.bonferroni_z(0.01, 2)
    drift = stats.curve_test(seeds, [m + 0.3 * s for m in means], z, 0.005)
    assert drift.mean_passed and not drift.sign_passed and drift.positive == steps
    noise_rng = random.Random(1)
    noisy = stats.curve_test(seeds, [m + noise_rng.gauss(0, s) for m in means], z, 0.005)
    assert noisy.passed


def test_three_steps_cannot_fail_the_sign_test_and_an_exact_replay_passes():
    seeds = [[0.30, 0.31, 0.29], [0.33, 0.30, 0.32], [0.28, 0.27, 0.30]]
    z = stats.bonferroni_z(0.01, 2)
    low = stats.curve_test(seeds, [0.29, 0.28, 0.28], z, 0.005)
    assert low.sign_p >= 0.25 and low.sign_passed
    replay = stats.curve_test(seeds, seeds[0], z, 0.005)
    assert replay.passed
    assert not stats.curve_test(seeds, [0.0, 0.0, 0.0], z, 0.005).mean_passed


def test_the_within_step_floor_applies_when_seeds_agree():
    seeds = [[0.3, 0.3, 0.3]] * 3
    z = stats.bonferroni_z(0.01, 2)
    bare = stats.curve_test(seeds, [0.32, 0.32, 0.32], z, 0.005)
    floored = stats.curve_test(seeds, [0.32, 0.32, 0.32], z, 0.005, step_floor_var=[0.2 ** 2 / 16] * 3)
    assert not bare.mean_passed and floored.mean_passed
