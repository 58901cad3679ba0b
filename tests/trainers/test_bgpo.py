"""BGPO plug-in: the invariants of shared/docs/algorithms.md §6 and the official DARE loss fixture (every case)."""

import json

import pytest
import torch

from dare_bench.errors import ConfigError
from dare_bench.models.base import ModelTraits
from dare_bench.trainers.algorithms import RolloutBatch, get_algorithm
from dare_bench.trainers.algorithms.bgpo import bgpo_policy_loss

from rl_fakes import EOS, MASK, PAD, micro_llada, toy_rollout_batch
from testpaths import LOSSES

TRAITS = ModelTraits(family="llada", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=0,
                     attention="bidirectional")


def _batch(n_prompts=2, g=3, p=5, c=6, seed=0) -> RolloutBatch:
    return toy_rollout_batch(n_prompts, g, p, c, seed)


def _grads(model):
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


# --- official fixture ---------------------------------------------------------------------------------------------

def _cases():
    path = LOSSES / "bgpo"
    from safetensors.torch import load_file

    return json.loads((path / "cases.json").read_text())["cases"], load_file(str(path / "cases.safetensors"))


def test_official_fixture_every_case():
    cases, T = _cases()
    assert len(cases) == 4
    for case in cases:
        x = {k: T[v["key"]] for k, v in case["inputs"].items()}
        out = {k: T[v["key"]] for k, v in case["outputs"].items()}
        a = case["call_args"]
        lt = x["l_theta"].clone().requires_grad_(True)
        res = bgpo_policy_loss(x["old_l_theta"], lt, x["advantages"], x["response_mask"], clip_low=a["cliprange_low"],
                               clip_high=a["cliprange_high"], clip_ratio_c=a["clip_ratio_c"], agg=a["loss_agg_mode"])
        res.loss.backward()
        grad = T[case["grads"]["l_theta"]["key"]]
        # clip fractions are decided by comparisons only: equal bit for bit in every case
        assert res.clip_frac.item() == out["pg_clipfrac"].item(), case["name"]
        assert res.clip_frac_lower.item() == out["pg_clipfrac_lower"].item(), case["name"]
        if case["name"] != "case2_delta_below_minus_one":
            # 1 + Δ here vs DARE's exp(log(1 + Δ)): equal up to exp∘log rounding (a few ulp), not bit for bit
            torch.testing.assert_close(res.loss, out["pg_loss"], rtol=1e-14, atol=1e-15)
            torch.testing.assert_close(lt.grad, grad, rtol=1e-13, atol=1e-15)
            torch.testing.assert_close(res.ppo_kl, out["ppo_kl"], rtol=1e-14, atol=1e-15)
            continue
        # Deliberate difference: DARE is NaN here (log(1 + Δ) with Δ = -1.3 on row 0, log 0 on row 2); we are finite.
        assert torch.isnan(out["pg_loss"]) and torch.isfinite(res.loss)
        assert torch.isfinite(lt.grad).all()
        finite_rows = torch.isfinite(grad).all(dim=1)
        assert finite_rows.tolist() == [False, True, False, True, True, True]
        torch.testing.assert_close(lt.grad[finite_rows], grad[finite_rows], rtol=1e-13, atol=1e-15)
        # rows 0 and 2 follow the definition with ρ = 1 + Δ computed directly
        m = x["response_mask"].double()
        d = x["l_theta"] - x["old_l_theta"]
        A = x["advantages"]
        ratio = torch.where(A > 0, 1 + d, torch.exp(d))
        clipped = torch.maximum(-A * ratio, -A * ratio.clamp(0.8, 1.2))
        per_tok = torch.where(A < 0, torch.minimum(-A * 3.0, clipped), clipped)
        # verl's +1e-8 is added to the int64 count (a float32 result: lost for counts > 1), as in masked_mean
        want = (per_tok * m).sum() / (x["response_mask"].sum() + 1e-8)
        torch.testing.assert_close(res.loss, want, rtol=1e-14, atol=0)
        assert torch.equal(res.per_token[0], per_tok[0]) and torch.equal(res.per_token[2], per_tok[2])


def test_linear_branch_below_minus_one_is_finite_with_gradient():
    old = torch.zeros(2, 3, dtype=torch.float64)
    lt = torch.tensor([[-1.5] * 3, [-1.0] * 3], dtype=torch.float64, requires_grad=True)
    adv = torch.ones(2, 3, dtype=torch.float64)
    res = bgpo_policy_loss(old, lt, adv, torch.ones(2, 3), clip_low=0.2, clip_ratio_c=3.0)
    res.loss.backward()
    # ρ = 1 + Δ = -0.5 and 0 (< 1 - ε: the unclipped side for A > 0 keeps the gradient -A / count)
    assert res.loss.item() == pytest.approx(-(-0.5 * 3 + 0 * 3) / 6)
    assert torch.allclose(lt.grad, torch.full_like(lt, -1 / 6))
    # a huge Δ on the linear side leaves the exp branch finite (no 0 * inf in the gradient)
    lt2 = torch.full((1, 2), 1000.0, dtype=torch.float64, requires_grad=True)
    r2 = bgpo_policy_loss(torch.zeros(1, 2, dtype=torch.float64), lt2, torch.ones(1, 2, dtype=torch.float64),
                          torch.ones(1, 2), clip_low=0.2)
    r2.loss.backward()
    assert torch.isfinite(r2.loss) and torch.isfinite(lt2.grad).all()


def test_bound_is_below_exact_objective_without_clipping():
    """Σ_k over copies: A·mean_k ρ_k ≤ A·exp(mean_k Δ_k) for either sign of A (the 'boundary' of BGPO)."""
    g = torch.Generator().manual_seed(0)
    delta = torch.randn(200, 16, generator=g, dtype=torch.float64) * 0.7
    for sign in (1.0, -1.0):
        A = sign * (0.1 + torch.rand(200, 1, generator=g, dtype=torch.float64))
        rho = torch.where(A > 0, 1 + delta, torch.exp(delta))
        bound = (A * rho).mean(dim=1)
        exact = A[:, 0] * torch.exp(delta.mean(dim=1))
        assert (bound <= exact + 1e-12).all()
        # and through the loss (no clip active with ε ≈ 1 and c huge): −loss_k averaged = the bound
        losses = []
        for k in range(16):
            losses.append(bgpo_policy_loss(torch.zeros(200, 1, dtype=torch.float64), delta[:, k:k + 1], A,
                                           torch.ones(200, 1), clip_low=0.999999, clip_high=1e9,
                                           clip_ratio_c=1e12, agg="seq-mean-token-sum").per_token)
        torch.testing.assert_close(-torch.cat(losses, dim=1).mean(dim=1), bound)


# --- plug-in ------------------------------------------------------------------------------------------------------

def test_validate_refuses_bad_settings():
    B = get_algorithm("bgpo")
    algo = B({}, TRAITS)
    assert algo.config.mc_samples == 16 and algo.config.clip_ratio_c == 3.0
    with pytest.raises(ConfigError, match="multiple of n_l"):
        B({"mc_samples": 6, "n_l": 4}, TRAITS)
    with pytest.raises(ConfigError, match="unknown setting"):
        B({"mc_sample": 4}, TRAITS)
    with pytest.raises(ConfigError, match="clip_ratio_c"):
        B({"clip_ratio_c": 0.5}, TRAITS)
    with pytest.raises(ConfigError, match="loss_agg"):
        B({"loss_agg": "sum"}, TRAITS)
    with pytest.raises(ConfigError):
        B({"mc_samples": 0}, TRAITS)


def test_elbo_normalisations_of_the_dare_actors():
    batch = _batch()
    policy = micro_llada(0)
    st = get_algorithm("bgpo")({"mc_samples": 2}, TRAITS).prepare(batch, policy, None,
                                                                   generator=torch.Generator().manual_seed(0),
                                                                   num_iterations=1)
    n = batch.completion_mask.sum(dim=1).float()
    with torch.no_grad():
        e = {norm: get_algorithm("bgpo")({"mc_samples": 2, "elbo_norm": norm}, TRAITS).copy_elbo(policy, batch,
                                                                                                  st.rows, 1)
             for norm in ("padded", "valid", "valid_x_padded")}
    total = e["padded"] * 6
    torch.testing.assert_close(e["valid"], total / n)
    torch.testing.assert_close(e["valid_x_padded"], total / (n * 6))


def test_masks_shared_across_iterations_and_models():
    batch = _batch()
    algo = get_algorithm("bgpo")({"mc_samples": 4, "kl_beta": 0.1}, TRAITS)
    policy, ref = micro_llada(0), micro_llada(1)
    st = algo.prepare(batch, policy, ref, generator=torch.Generator().manual_seed(0), num_iterations=2)
    assert st.rows["mask"].shape == (6, 4, 11)
    # post-EOS completion positions and the prompt are never masked; every row has >= 1 masked token per copy
    resp = batch.completion_mask.bool()
    assert not st.rows["mask"][:, :, :5].any()
    assert not (st.rows["mask"][:, :, 5:] & ~resp[:, None, :]).any()
    assert st.rows["mask"][:, :, 5:].any(dim=-1).all()
    with torch.no_grad():
        for k in range(4):
            torch.testing.assert_close(st.rows["old_elbo"][:, k], algo.copy_elbo(policy, batch, st.rows, k))
            torch.testing.assert_close(st.rows["ref_elbo"][:, k], algo.copy_elbo(ref, batch, st.rows, k))
    # μ = 1 without KL: no old forward at all
    st1 = get_algorithm("bgpo")({"mc_samples": 4}, TRAITS).prepare(batch, policy, None, generator=torch.Generator(),
                                                                     num_iterations=1)
    assert set(st1.rows) == {"mask", "p_mask"}


def test_reference_without_traits_lora_style():
    """The loop's LoRA reference (`AdapterDisabled`) is a bare callable: the estimators get the policy's traits."""

    class Bare:
        def __init__(self, model):
            self.model = model

        def __call__(self, *args, **kwargs):
            return self.model(*args, **kwargs)

    batch = _batch()
    ref = micro_llada(1)
    algo = get_algorithm("bgpo")({"mc_samples": 2, "kl_beta": 0.1}, TRAITS)
    st = algo.prepare(batch, micro_llada(0), Bare(ref), generator=torch.Generator().manual_seed(0), num_iterations=1)
    with torch.no_grad():
        torch.testing.assert_close(st.rows["ref_elbo"], algo.all_copies(ref, batch, st.rows))


def test_theta_old_value_and_gradient_equal_elbo_ratio_objective():
    """At θ = θ_old: BGPO loss = −token-mean(A) and ∇ = ∇ of token-mean(−A·exp(B − B_old)), B = mean_k e_k."""
    batch = _batch()
    algo = get_algorithm("bgpo")({"mc_samples": 4, "n_l": 2}, TRAITS)
    policy = micro_llada(0)
    adv = algo.advantages(batch.rewards, batch.group_size)
    st = algo.prepare(batch, policy, None, generator=torch.Generator().manual_seed(1), num_iterations=2)
    policy.zero_grad()
    m = algo.backward(policy, batch, st, adv, loss_scale=1.0, iteration=0)
    got = _grads(policy)
    cm = batch.completion_mask.float()
    assert m["loss"] == pytest.approx((-(adv[:, None] * cm).sum() / cm.sum()).item(), abs=1e-6)
    assert m["clip_frac"] == 0.0
    policy.zero_grad()
    B = algo.all_copies(policy, batch, st.rows).mean(dim=1)
    B_old = st.rows["old_elbo"].mean(dim=1)
    per_tok = -adv[:, None] * torch.exp(B - B_old)[:, None] * cm
    (per_tok.sum() / (cm.sum() + 1e-8)).backward()
    want = _grads(policy)
    assert any(g.abs().sum() > 0 for g in want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_per_sample_backward_equals_one_backward_over_all_samples():
    """Linearity in the copies: K backward passes (memory O(1)) == one backward of (1/K) Σ_k loss_k, at any θ."""
    batch = _batch()
    algo = get_algorithm("bgpo")({"mc_samples": 4, "clip_eps": 0.2}, TRAITS)
    policy = micro_llada(0)
    adv = algo.advantages(batch.rewards, batch.group_size)
    st = algo.prepare(batch, policy, None, generator=torch.Generator().manual_seed(2), num_iterations=2)
    with torch.no_grad():  # move θ away from θ_old so both branches and the clip are exercised
        for p in policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    policy.zero_grad()
    m = algo.backward(policy, batch, st, adv, loss_scale=0.5, iteration=1)
    got = _grads(policy)
    policy.zero_grad()
    total = 0
    for k in range(4):
        e = algo.copy_elbo(policy, batch, st.rows, k)
        loss, _, _ = algo.copy_loss(e, st.rows["old_elbo"][:, k], None, adv, batch.completion_mask)
        total = total + loss / 4
    (total * 0.5).backward()
    assert m["loss"] == pytest.approx(total.item(), rel=1e-5)
    for a, b in zip(got, _grads(policy)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in got)


def _micro_block(family: str, seed: int = 0):
    from dare_bench.models.io import build_model
    from dare_bench.models.presets import preset_config

    if family == "sdar":
        from dare_bench.models.sdar import adapt_vocab

        cfg = preset_config("tiny-sdar", num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    else:
        from dare_bench.models.llada2 import adapt_vocab

        cfg = preset_config("tiny-llada2", num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                            moe_intermediate_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                            block_size=4)
    cfg = adapt_vocab(cfg, vocab_size=16, mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD)
    model = build_model(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.init_weights()
    return model


@pytest.mark.parametrize("backbone", ["llada", "sdar"])
def test_micro_training_step(backbone):
    model = micro_llada(0) if backbone == "llada" else _micro_block("sdar")
    algo = get_algorithm("bgpo")({"mc_samples": 2}, model.traits)
    batch = _batch(p=4, c=8)
    if backbone == "sdar":  # block samplers produce unpadded prompts
        batch.prompt_ids[:, 0] = 3
        batch.prompt_mask[:] = 1
    adv = algo.advantages(batch.rewards, batch.group_size)
    st = algo.prepare(batch, model, None, generator=torch.Generator().manual_seed(0), num_iterations=1)
    model.zero_grad()
    m = algo.backward(model, batch, st, adv, loss_scale=1.0, iteration=0)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0
    assert m["mc_samples"] == 2 and m["elbo"] < 0
