"""The official DARE per-token estimators of d1 and Coupled-GRPO (fixture `losses/coupled_d1_logprob`), reproduced
by `dare_bench.diffusion.likelihood` from the stored masks and logits, through the official token-level PPO loss to
the gradient w.r.t. the logits.

Deliberate differences from the official actor, checked explicitly below:
- positions that are not valid completion tokens hold 0 in our per-token outputs; upstream keeps -CE of the
  all-zero logits of padded completion positions there (d1: at every padded position; coupled: where a copy masked
  padding). The loss never reads them (response_mask), so pg_loss and gradients are unchanged;
- per-copy ELBOs (upstream `loss_per_sample` x R) exclude padded positions; upstream adds -log(V)/p for each padded
  position a copy masked (constant, no gradient). The difference is asserted to be exactly that.
The per-token values on valid completion tokens agree to 8 float64 ulps (tests/float_bounds.py: bit-identical on
the CPU the fixture was made on; AVX2 kernels differ by 1-2 ulps).
"""

import json
import math

import pytest
import torch
from float_bounds import assert_same_up_to_ulps

from dare_bench.diffusion.likelihood import coupled_token_logprobs_from_logits, d1_token_logprobs_from_logits
from dare_bench.diffusion.masking import MaskDraw, prompt_response_masks

from testpaths import LOSSES

FOLDER = LOSSES / "coupled_d1_logprob"


@pytest.fixture(scope="module")
def fixture():
    from safetensors.torch import load_file

    tensors = load_file(str(FOLDER / "cases.safetensors"))
    cases = {c["name"]: c for c in json.loads((FOLDER / "cases.json").read_text())["cases"]}
    return tensors, cases


def dare_token_ppo_loss(old, new, adv, mask, eps_low, eps_high, c):
    """DARE dllm `compute_policy_loss` (algorithms.md §1.4: clip + dual-clip, verl token-mean), written out here so
    the test does not depend on the RL plug-ins.

    verl's masked_mean divides by `mask.sum() + 1e-8`; with an integer / bool mask that sum is int64 and adding the
    Python float promotes it to float32, where the 1e-8 vanishes: the effective denominator is exactly sum(mask)
    (the stored pg_loss / ppo_kl agree with that, not with a float64 `sum + 1e-8`)."""
    assert not mask.dtype.is_floating_point

    def masked_mean(x):
        return (x * mask).sum() / (mask.sum() + 1e-8)

    ratio = torch.exp(new - old)
    ppo_kl = masked_mean(torch.exp(old - new) - (old - new) - 1)
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    clip1 = torch.maximum(l1, l2)
    clipfrac = masked_mean(torch.gt(l2, l1).float())
    l3 = -adv * c
    clip2 = torch.min(l3, clip1)
    clipfrac_lower = masked_mean(torch.gt(clip1, l3) * (adv < 0).float())
    loss = masked_mean(torch.where(adv < 0, clip2, clip1))
    return loss, clipfrac, ppo_kl, clipfrac_lower


def _draw(T, case, prompt_len):
    am = T[f"{case}/in/attention_mask"]
    _, response = prompt_response_masks(am, prompt_len)
    return MaskDraw(mask=T[f"{case}/in/mask_indices"], p_mask=T[f"{case}/in/p_mask"], response_mask=response,
                    scheme=case), response


def _check_loss(T, J, case, old, new, mask, logits):
    args = J[case]["call_args"]
    adv = T[f"{case}/in/advantages"]
    loss, clipfrac, kl, clipfrac_lower = dare_token_ppo_loss(old, new, adv, mask, args["cliprange_low"],
                                                             args["cliprange_high"], args["clip_ratio_c"])
    out = J[case]["outputs"]
    assert loss.item() == pytest.approx(out["pg_loss"]["value"], rel=1e-12, abs=1e-15)
    assert kl.item() == pytest.approx(out["ppo_kl"]["value"], rel=1e-12, abs=1e-15)
    assert clipfrac.item() == pytest.approx(out["pg_clipfrac"]["value"], rel=1e-6)
    assert clipfrac_lower.item() == pytest.approx(out["pg_clipfrac_lower"]["value"], rel=1e-6, abs=1e-9)
    (grad,) = torch.autograd.grad(loss, logits)
    want = T[f"{case}/grad/logits"]
    assert torch.allclose(grad, want, rtol=1e-10, atol=1e-14)


def test_coupled_grpo_estimator_matches_official(fixture):
    T, J = fixture
    case, P = "coupled_grpo", J["coupled_grpo"]["call_args"]["prompt_len"]
    V = J[case]["call_args"]["vocab"]
    ids = T[f"{case}/in/input_ids"]
    draw, response = _draw(T, case, P)
    R = ids.shape[1] - P
    outs = {}
    for name, key in (("log_prob", "logits"), ("old_log_prob", "old_logits")):
        logits = T[f"{case}/in/{key}"].clone().requires_grad_(name == "log_prob")
        est = coupled_token_logprobs_from_logits(logits, ids, draw)
        ref = T[f"{case}/out/{name}"]
        # the same up to float64 ulps on valid completion tokens, 0 elsewhere (upstream: 0 on the prompt,
        # -CE(0-logits) on pads)
        assert_same_up_to_ulps(est.token_logprobs[response], ref[response])
        assert not bool(est.token_logprobs[~response].any())
        assert not bool(ref[:, :P].any())
        outs[name] = (est, logits)
    est, logits = outs["log_prob"]
    # per-copy ELBO: upstream sums over every masked position incl. padding, where its logits are all zero
    pad_masked = draw.mask & ~response[:, None]
    pad_weight = torch.where(pad_masked, -math.log(V) / draw.p_mask.clamp_min(1e-30), torch.zeros(()).double())
    upstream = T[f"{case}/out/loss_per_sample"][:, :, 0] * R
    assert torch.allclose(est.copy_elbo.detach() + pad_weight.sum(-1), upstream, rtol=1e-12, atol=1e-12)
    assert torch.allclose(T[f"{case}/out/loss_per_sample"], (upstream / R)[..., None].expand(-1, -1, R))
    old = outs["old_log_prob"][0].token_logprobs[:, -R:]
    _check_loss(T, J, case, old, est.token_logprobs[:, -R:], T[f"{case}/in/attention_mask"][:, -R:], logits)


def test_d1_estimator_matches_official(fixture):
    T, J = fixture
    case, P = "d1", J["d1"]["call_args"]["prompt_len"]
    ids = T[f"{case}/in/input_ids"]
    draw, response = _draw(T, case, P)
    R = ids.shape[1] - P
    outs = {}
    for name, key in (("log_prob", "logits"), ("old_log_prob", "old_logits")):
        logits = T[f"{case}/in/{key}"].clone().requires_grad_(name == "log_prob")
        lp = d1_token_logprobs_from_logits(logits[:, 0], ids, draw)
        ref = T[f"{case}/out/{name}"][:, 0]  # [B, R]
        valid = response[:, -R:]
        assert_same_up_to_ulps(lp[:, -R:][valid], ref[valid])
        assert not bool(lp[~response].any())
        outs[name] = (lp, logits)
    lp, logits = outs["log_prob"]
    # d1's loss mask is the completion part of the mask (= every valid completion token)
    loss_mask = T[f"{case}/in/mask_indices"][:, 0, -R:]
    assert torch.equal(loss_mask, response[:, -R:])
    _check_loss(T, J, case, outs["old_log_prob"][0][:, -R:], lp[:, -R:], loss_mask, logits)
