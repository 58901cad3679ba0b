"""Shared GRPO pieces against the official DARE / verl outputs (fixtures in ../shared/fixtures/losses/).

Every case of `grpo_advantage/`, `grpo_policy_loss/` and `kl_penalty/` is replayed: values and autograd gradients
must agree to the last bit up to `ULPS` units in the last place, with NaN / ±inf at exactly the same places.

Where we deliberately differ: nowhere in the formulas. The allowance exists because `torch.exp` is not correctly
rounded and its last bit differs between CPUs: on this machine (AMD EPYC, torch 2.13 CPU) `torch.exp` returns 1 ulp
more than numpy's exp for a few inputs, while the fixture machine agreed with numpy. That moves 14 of the ~1,000
compared numbers by at most 2 ulp of max(|x|, 1): 5 gradients of policy-loss cases 2/3, and 9 k3 values / means /
gradients (k3 = exp(d)
− d − 1 inherits one ulp of exp(d) ≈ 1). Everything else is bit-identical,
which `test_fixtures_mostly_bitwise` keeps true.
"""

import json
import math

import pytest
import torch

from dare_bench.errors import ConfigError
from dare_bench.trainers.algorithms.common import (
    agg_loss,
    dare_kl_penalty,
    group_advantages,
    grpo_outcome_advantage,
    kl_estimate,
    policy_loss,
)

from testpaths import LOSSES


def _load(folder):
    path = LOSSES / folder
    from safetensors.torch import load_file

    return json.loads((path / "cases.json").read_text())["cases"], load_file(str(path / "cases.safetensors"))


def _cases(folder):
    path = LOSSES / folder / "cases.json"
    return [c["name"] for c in json.loads(path.read_text())["cases"]]


def _case(folder, name):
    cases, tensors = _load(folder)
    case = next(c for c in cases if c["name"] == name)
    inputs = {k: tensors[v["key"]].clone() for k, v in case["inputs"].items()}
    outputs = {k: tensors[v["key"]] for k, v in case["outputs"].items()}
    grads = {k: tensors[v["key"]] for k, v in case.get("grads", {}).items()}
    return case, inputs, outputs, grads


ULPS = 2
MISMATCHED_BITS: list[int] = []  # numbers not bit-identical, for the bitwise-count test


def _same(actual, expected, what):
    assert actual.shape == expected.shape, what
    a, e = actual.detach(), expected
    assert a.dtype == e.dtype, f"{what}: dtype {a.dtype} != {e.dtype}"
    assert torch.equal(torch.isnan(a), torch.isnan(e)), f"{what}: NaN positions differ\n{a}\n{e}"
    finite = torch.isfinite(e)
    assert torch.equal(a[~finite & ~torch.isnan(e)], e[~finite & ~torch.isnan(e)]), f"{what}: inf differs"
    a, e = a[finite], e[finite]
    # ulps of max(|e|, 1): k3 = exp(d) − d − 1 inherits exp's last bit at magnitude ~1 even when k3 itself is small
    tol = ULPS * torch.finfo(e.dtype).eps * e.abs().clamp_min(1.0)
    diff = (a - e).abs()
    assert (diff <= tol).all(), f"{what}: max |diff| = {diff.max().item()} (> {ULPS} ulp)\n{a}\n{e}"
    MISMATCHED_BITS.append(int((a != e).sum()))


@pytest.mark.parametrize("name", _cases("grpo_advantage"))
def test_grpo_advantage_fixture(name):
    case, x, out, _ = _case("grpo_advantage", name)
    args = case["call_args"]
    scores = x["token_level_rewards"].sum(dim=-1)
    adv = grpo_outcome_advantage(scores, args["index"], norm_by_std=args["norm_adv_by_std_in_grpo"],
                                 epsilon=args["epsilon"])
    assert adv.dtype == out["advantages"].dtype
    _same(adv.unsqueeze(-1) * x["response_mask"], out["advantages"], f"{name} advantages")


def test_group_advantages_contiguous_matches_index_form():
    g = torch.Generator().manual_seed(0)
    r = torch.rand(12, generator=g, dtype=torch.float64)
    std = group_advantages(r, 4, "std")
    assert torch.equal(std, grpo_outcome_advantage(r, [i // 4 for i in range(12)]))
    mean = group_advantages(r, 4, "mean")
    assert torch.equal(mean, grpo_outcome_advantage(r, [i // 4 for i in range(12)], norm_by_std=False))
    # leave-one-out: A_j = r_j − mean of the other G−1 rewards = G/(G−1) · (r_j − mean)
    loo = group_advantages(r, 4, "loo")
    torch.testing.assert_close(loo, mean * 4 / 3, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError):
        group_advantages(r, 5, "std")
    with pytest.raises(ConfigError):
        group_advantages(r, 4, "median")


@pytest.mark.parametrize("name", _cases("grpo_policy_loss"))
def test_grpo_policy_loss_fixture(name):
    case, x, out, grads = _case("grpo_policy_loss", name)
    args = case["call_args"]
    logp = x["l_theta"].requires_grad_(True)
    res = policy_loss(x["old_l_theta"], logp, x["advantages"], x["response_mask"],
                      clip_low=args["cliprange_low"], clip_high=args["cliprange_high"],
                      clip_ratio_c=args["clip_ratio_c"], agg=args["loss_agg_mode"], ref_logp=x.get("ref_l_theta"))
    _same(res.loss, out["pg_loss"], f"{name} pg_loss")
    _same(res.clip_frac, out["pg_clipfrac"], f"{name} pg_clipfrac")
    _same(res.ppo_kl, out["ppo_kl"], f"{name} ppo_kl")
    _same(res.clip_frac_lower, out["pg_clipfrac_lower"], f"{name} pg_clipfrac_lower")
    assert res.clip_frac.dtype == out["pg_clipfrac"].dtype  # float32 metrics, as verl
    (g,) = torch.autograd.grad(res.loss, logp)
    _same(g, grads["l_theta"], f"{name} d pg_loss / d l_theta")


def test_policy_loss_ratio_one_is_minus_mean_advantage():
    """§1.4: with ℓ = ℓ_old the loss is −Σ(A·m)/Σm and its gradient −A·m/Σm (fixture case4's closed form)."""
    g = torch.Generator().manual_seed(1)
    logp = torch.randn(3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    adv = torch.randn(3, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 5)
    mask[1, 3:] = 0
    for c in (3.0, None):
        res = policy_loss(logp.detach(), logp, adv, mask, clip_low=0.5, clip_ratio_c=c)
        expected = -(adv[:, None] * mask).sum() / mask.sum()
        torch.testing.assert_close(res.loss, expected, rtol=1e-12, atol=1e-12)
        (grad,) = torch.autograd.grad(res.loss, logp)
        torch.testing.assert_close(grad, -adv[:, None] * mask / mask.sum(), rtol=1e-12, atol=1e-12)


def test_policy_loss_without_dual_clip_differs_only_for_large_negative_ratio():
    old = torch.zeros(1, 3, dtype=torch.float64)
    logp = torch.log(torch.tensor([[0.5, 2.0, 5.0]], dtype=torch.float64))
    adv = torch.full((1,), -1.0, dtype=torch.float64)
    mask = torch.ones(1, 3)
    dual = policy_loss(old, logp, adv, mask, clip_low=0.2, clip_ratio_c=3.0).per_token
    plain = policy_loss(old, logp, adv, mask, clip_low=0.2, clip_ratio_c=None).per_token
    # A<0: max(−Aρ, −A·clip(ρ)) = ρ unless ρ < 0.8; dual clip caps it at c = 3
    torch.testing.assert_close(plain, torch.tensor([[0.8, 2.0, 5.0]], dtype=torch.float64))
    torch.testing.assert_close(dual, torch.tensor([[0.8, 2.0, 3.0]], dtype=torch.float64))
    with pytest.raises(ConfigError):
        policy_loss(old, logp, adv, mask, clip_ratio_c=1.0)


def test_agg_loss_modes_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert math.isclose(agg_loss(loss, mask, "token-mean").item(), 18 / 5, rel_tol=1e-12)
    assert math.isclose(agg_loss(loss, mask, "seq-mean-token-sum").item(), (3 + 15) / 2, rel_tol=1e-12)
    assert math.isclose(agg_loss(loss, mask, "seq-mean-token-mean").item(), (1.5 + 5) / 2, rel_tol=1e-12)
    assert math.isclose(agg_loss(loss, mask, "seq-mean-token-sum-norm").item(), 18 / 3, rel_tol=1e-12)
    with pytest.raises(ConfigError):
        agg_loss(loss, mask, "sum")


@pytest.mark.parametrize("name", _cases("kl_penalty"))
def test_kl_penalty_fixture(name):
    case, x, out, grads = _case("kl_penalty", name)
    kind = case["call_args"]["kl_penalty"]
    if name.startswith("dllm_"):
        logp = x["l_theta"].requires_grad_(True)
        kld = dare_kl_penalty(logp, x["ref_l_theta"], kind, x["advantages"])
        grad_key = "l_theta"
    else:
        logp = x["logprob"].requires_grad_(True)
        kld = kl_estimate(logp, x["ref_logprob"], kind)
        grad_key = "logprob"
    _same(kld, out["kld"], f"{name} kld")
    kl_loss = agg_loss(kld, x["response_mask"], "token-mean")
    _same(kl_loss, out["kl_loss"], f"{name} kl_loss")
    (g,) = torch.autograd.grad(kl_loss, logp)
    _same(g, grads[grad_key], f"{name} d kl_loss / d {grad_key}")


def test_k3_nonnegative_and_zero_iff_equal():
    g = torch.Generator().manual_seed(2)
    logp = torch.randn(4, 6, generator=g, dtype=torch.float64)
    ref = logp + torch.randn(4, 6, generator=g, dtype=torch.float64)
    k3 = kl_estimate(logp, ref, "k3", clamp=None)
    assert (k3 > 0).all()
    assert torch.equal(kl_estimate(logp, logp, "k3", clamp=None), torch.zeros_like(logp))
    with pytest.raises(ConfigError):
        kl_estimate(logp, ref, "k4")


def test_fixtures_mostly_bitwise():
    """Guard the allowance above: nearly every compared number must be bit-identical. Replays every fixture case
    itself, so the count does not depend on which tests ran before."""
    MISMATCHED_BITS.clear()
    for test, folder in ((test_grpo_advantage_fixture, "grpo_advantage"), (test_grpo_policy_loss_fixture,
                         "grpo_policy_loss"), (test_kl_penalty_fixture, "kl_penalty")):
        for name in _cases(folder):
            test(name)
    assert len(MISMATCHED_BITS) >= 20, f"only {len(MISMATCHED_BITS)} comparisons made"
    assert sum(MISMATCHED_BITS) <= 16, f"{sum(MISMATCHED_BITS)} numbers differ in their last bits"
