"""wd1 plug-in: the weights, the weighted log-likelihood loss and its gradient, no ratio, settings validation.

The formula is that of the official code (xiaohangt/wd1 @ 0898985, `wd1/trainers/rev_grpo_trainer.py`
`compute_loss`): see the module docstring of `dare_bench/trainers/algorithms/wd1.py`. The repository ships no
numeric example, so the expected values here are computed by hand (Python floats) from the formula.
"""

import math

import pytest
import torch

from dare_bench.errors import ConfigError
from dare_bench.models.base import ModelTraits
from dare_bench.trainers.algorithms import AlgorithmState, RolloutBatch, get_algorithm
from dare_bench.trainers.algorithms.wd1 import wd1_weights

from rl_fakes import EOS, MASK, PAD, micro_llada

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


TRAITS = ModelTraits(family="llada", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=0,
                     attention="bidirectional")


def _batch(rewards, g, p=6, c=5, seed=0) -> RolloutBatch:
    gen = torch.Generator().manual_seed(seed)
    n = len(rewards)
    prompt = torch.randint(0, 10, (n, p), generator=gen)
    pmask = torch.ones(n, p, dtype=torch.long)
    for r in range(n):  # left padding of varying length, shared within a group
        pad = (r // g) % 3
        prompt[r, :pad] = PAD
        pmask[r, :pad] = 0
    comp = torch.randint(0, 10, (n, c), generator=gen)
    cmask = torch.ones(n, c, dtype=torch.long)
    for r in range(n):
        end = 1 + r % c  # scored up to and including the first EOS
        comp[r, end - 1:] = EOS
        cmask[r, end:] = 0
    return RolloutBatch(prompt, pmask, comp, cmask, torch.tensor(rewards, dtype=torch.float32), group_size=g)


def _hand_weights(rewards, g):
    """w⁺, w⁻ by hand: A = r − group mean; softmax of ±A within each group (Python floats)."""
    wp, wn = [], []
    for k in range(0, len(rewards), g):
        grp = rewards[k:k + g]
        mean = sum(grp) / g
        adv = [r - mean for r in grp]
        zp, zn = sum(math.exp(a) for a in adv), sum(math.exp(-a) for a in adv)
        wp += [math.exp(a) / zp for a in adv]
        wn += [math.exp(-a) / zn for a in adv]
    return wp, wn


# --- settings ------------------------------------------------------------------------------------------------------
def test_registered_defaults_and_validation():
    Wd1 = get_algorithm("wd1")
    assert Wd1.name == "wd1"
    algo = Wd1({}, TRAITS)
    c = algo.config
    assert (c.trainer_type, c.p_mask_prompt, c.random_masking, c.mc_samples, c.kl_beta) == (
        "wll_d1_neg", 0.15, True, 1, 0.0)
    assert Wd1({"trainer_type": "wll_d1_pos_only"}, TRAITS).config.trainer_type == "wll_d1_pos_only"
    # the shared settings it ignores are accepted (the shared recipes set them for every plug-in)
    Wd1({"clip_eps": 0.2, "clip_ratio_c": 3.0, "loss_agg": "seq-mean-token-sum", "kl_estimator": "k2"}, TRAITS)
    with pytest.raises(ConfigError, match="mc_samples"):
        Wd1({"mc_samples": 2}, TRAITS)
    with pytest.raises(ConfigError, match="KL"):
        Wd1({"kl_beta": 0.04}, TRAITS)
    with pytest.raises(ConfigError, match="advantage"):
        Wd1({"advantage": "leave_one_out"}, TRAITS)
    with pytest.raises(ConfigError, match="trainer_type"):
        Wd1({"trainer_type": "wll_d1_neg_ref"}, TRAITS)
    with pytest.raises(ConfigError, match="unknown setting"):
        Wd1({"temperature": 1.0}, TRAITS)
    with pytest.raises(ConfigError, match="p_mask_prompt"):
        Wd1({"p_mask_prompt": 1.0}, TRAITS)
    block = ModelTraits(family="sdar", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=0,
                        attention="block_causal", block_size=4)
    with pytest.raises(ConfigError, match="not defined"):
        Wd1({}, block)
    dream = ModelTraits(family="dream", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=1,
                        attention="bidirectional")
    assert Wd1({}, dream).traits.logit_shift == 1


def test_the_catalogue_knobs_are_the_plugins():
    from dare_bench import catalogue

    spec = catalogue.algorithm("wd1")
    assert spec.kind == "rl" and spec.plugin == "wd1" and spec.knobs is get_algorithm("wd1").Config
    assert set(spec.knob_names) >= {"trainer_type", "p_mask_prompt", "random_masking"}


# --- weights -------------------------------------------------------------------------------------------------------
def test_weights_single_positive_by_hand():
    """r = [1, 0, 0, 0]: A = [3/4, −1/4, −1/4, −1/4], w⁺_0 = e/(e + 3), w⁻_0 = e⁻¹/(e⁻¹ + 3)."""
    algo = get_algorithm("wd1")({}, TRAITS)
    adv = algo.advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4)
    torch.testing.assert_close(adv, torch.tensor([0.75, -0.25, -0.25, -0.25]))
    wp, wn = wd1_weights(adv, 4)
    e = math.e
    torch.testing.assert_close(wp, torch.tensor([e / (e + 3), 1 / (e + 3), 1 / (e + 3), 1 / (e + 3)]))
    torch.testing.assert_close(wn, torch.tensor([1 / e / (1 / e + 3), 1 / (1 / e + 3), 1 / (1 / e + 3),
                                                 1 / (1 / e + 3)]))
    assert wp[0].item() == pytest.approx(0.4753669, abs=1e-6) and wn[0].item() == pytest.approx(0.1092318, abs=1e-6)
    coef = algo.coefficients(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4)
    torch.testing.assert_close(coef, wp - wn)
    assert coef[0] > 0 and (coef[1:] < 0).all()  # pull the right one up, push the others down


def test_weights_all_equal_rewards_are_uniform_and_cancel():
    algo = get_algorithm("wd1")({}, TRAITS)
    r = torch.full((6,), 0.7)
    wp, wn = wd1_weights(algo.advantages(r, 6), 6)
    assert torch.equal(wp, torch.full((6,), 1 / 6)) and torch.equal(wn, wp)
    assert torch.equal(algo.coefficients(r, 6), torch.zeros(6))
    pos = get_algorithm("wd1")({"trainer_type": "wll_d1_pos_only"}, TRAITS)
    assert torch.equal(pos.coefficients(r, 6), torch.full((6,), 1 / 6))


def test_weights_per_group_match_the_hand_formula():
    """Several groups: each group's weights are its own softmax (not one over the batch), as one group per device
    in the official setup."""
    rewards = [1.0, 0.0, 0.5, 0.25, 2.0, 2.0, 2.0, 4.0, 0.3, 0.3, 0.0, 1.5]
    g = 4
    algo = get_algorithm("wd1")({}, TRAITS)
    wp, wn = wd1_weights(algo.advantages(torch.tensor(rewards), g), g)
    hp, hn = _hand_weights(rewards, g)
    torch.testing.assert_close(wp, torch.tensor(hp), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(wn, torch.tensor(hn), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(wp.view(-1, g).sum(1), torch.ones(3))
    torch.testing.assert_close(wn.view(-1, g).sum(1), torch.ones(3))
    # shifting one group's rewards by a constant changes nothing (A is centred); another group's rewards do not matter
    shifted = rewards[:4] + [r + 10 for r in rewards[4:8]] + rewards[8:]
    torch.testing.assert_close(algo.coefficients(torch.tensor(shifted), g), algo.coefficients(torch.tensor(rewards), g))
    with pytest.raises(ValueError, match="groups"):
        wd1_weights(torch.zeros(5), 4)


def test_mean_std_advantage_is_an_option():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    a = get_algorithm("wd1")({"advantage": "mean_std"}, TRAITS).advantages(r, 4)
    torch.testing.assert_close(a, (r - 0.25) / (r.std() + 1e-6))


# --- loss and gradient -----------------------------------------------------------------------------------------------
def _hand_loss(algo, policy, batch, mask, rewards, g, pos_only=False):
    """−(1/#groups) Σ_groups Σ_i (w⁺_i − w⁻_i) Σ_t m_it ℓ_it with hand weights (w⁺ only when pos_only)."""
    hp, hn = _hand_weights(rewards, g)
    coef = torch.tensor(hp) if pos_only else torch.tensor(hp) - torch.tensor(hn)
    logp = algo.completion_logprobs(policy, batch, mask)
    seq = (logp * batch.completion_mask).sum(-1)
    return -(coef * seq).sum() / (len(rewards) // g)


@pytest.mark.parametrize("trainer_type", ["wll_d1_neg", "wll_d1_pos_only"])
def test_loss_and_gradient_are_the_hand_weighted_log_likelihood(trainer_type):
    rewards = [1.0, 0.0, 0.0, 0.0, 0.2, 0.9, 0.4, 0.4]
    g = 4
    batch = _batch(rewards, g)
    algo = get_algorithm("wd1")({"trainer_type": trainer_type}, TRAITS)
    policy = micro_llada(0)
    adv = algo.advantages(batch.rewards, g)
    state = algo.prepare(batch, policy, None, generator=torch.Generator().manual_seed(3), num_iterations=2)
    for it in range(2):
        policy.zero_grad()
        metrics = algo.backward(policy, batch, state, adv, loss_scale=1.0, iteration=it)
        got = [p.grad.clone() for p in policy.parameters()]
        policy.zero_grad()
        expected = _hand_loss(algo, policy, batch, state.rows["masks"][:, it], rewards, g,
                              pos_only=trainer_type == "wll_d1_pos_only")
        expected.backward()
        assert metrics["loss"] == pytest.approx(expected.item(), rel=1e-5)
        for g1, p in zip(got, policy.parameters()):
            torch.testing.assert_close(g1, p.grad, rtol=1e-5, atol=1e-7)
        assert any(x.abs().sum() > 0 for x in got)


def test_one_group_micro_batch_is_the_official_compute_loss():
    """A micro-batch of one whole group: ce_loss + min_likeli_loss of the official `compute_loss`, i.e.
    −Σ L·softmax(A) + Σ L·softmax(−A) over the group, with L = Σ_t ℓ·completion_mask."""
    rewards = [0.0, 1.0, 0.5, 0.5, 0.0, 0.25]
    batch = _batch(rewards, 6)
    algo = get_algorithm("wd1")({}, TRAITS)
    policy = micro_llada(2)
    state = algo.prepare(batch, policy, None, generator=torch.Generator().manual_seed(0), num_iterations=1)
    adv = algo.advantages(batch.rewards, 6)
    metrics = algo.backward(policy, batch, state, adv, loss_scale=1.0, iteration=0)
    with torch.no_grad():
        per_token_logps = algo.completion_logprobs(policy, batch, state.rows["masks"][:, 0])
        seq = (per_token_logps * batch.completion_mask).sum(-1)
        ce_loss = -(seq * torch.softmax(adv, dim=0)).sum()
        min_likeli_loss = (seq * torch.softmax(-adv, dim=0)).sum()
    # float32 sums in another order than the official compute_loss (2.7e-6 relative on an AVX2 CPU)
    assert metrics["loss"] == pytest.approx((ce_loss + min_likeli_loss).item(), rel=1e-5)


def test_all_equal_rewards_give_zero_loss_and_gradient():
    batch = _batch([0.5] * 8, 4)
    algo = get_algorithm("wd1")({}, TRAITS)
    policy = micro_llada(0)
    state = algo.prepare(batch, policy, None, generator=torch.Generator().manual_seed(0), num_iterations=1)
    metrics = algo.backward(policy, batch, state, algo.advantages(batch.rewards, 4), loss_scale=1.0, iteration=0)
    assert metrics["loss"] == 0.0
    assert all(float(p.grad.abs().max()) == 0.0 for p in policy.parameters())


def test_micro_batches_give_the_full_batch_gradient():
    """Equal micro-batches (whole groups or not) with the loop's 1/#micro scale: the mean over groups."""
    rewards = [1.0, 0.0, 0.3, 0.8, 0.8, 0.1]
    g = 3
    batch = _batch(rewards, g)
    algo = get_algorithm("wd1")({}, TRAITS)
    policy = micro_llada(1)
    adv = algo.advantages(batch.rewards, g)
    state = algo.prepare(batch, policy, None, generator=torch.Generator().manual_seed(5), num_iterations=1)
    algo.backward(policy, batch, state, adv, loss_scale=1.0, iteration=0)
    full = [p.grad.clone() for p in policy.parameters()]
    for size in (3, 2, 1):  # one group, groups split across micro-batches, one row
        policy.zero_grad()
        n_micro = batch.num_rows // size
        for a in range(0, batch.num_rows, size):
            sl = slice(a, a + size)
            algo.backward(policy, batch.select(sl), state.select(sl), adv[sl], loss_scale=1.0 / n_micro, iteration=0)
        for g1, p in zip(full, policy.parameters()):
            torch.testing.assert_close(p.grad, g1, rtol=1e-5, atol=1e-7)


# --- no ratio ------------------------------------------------------------------------------------------------------
def test_no_ratio_nothing_of_the_old_policy_is_used():
    rewards = [1.0, 0.0, 0.5, 0.0, 0.2, 0.9]
    batch = _batch(rewards, 3)
    algo = get_algorithm("wd1")({}, TRAITS)
    policy, other = micro_llada(0), micro_llada(9)
    # prepare runs no forward: the state drawn with another policy (and a reference) is the same
    s1 = algo.prepare(batch, policy, None, generator=torch.Generator().manual_seed(1), num_iterations=2)
    s2 = algo.prepare(batch, other, other, generator=torch.Generator().manual_seed(1), num_iterations=2)
    assert set(s1.rows) == {"masks", "coef"}
    assert all(torch.equal(s1.rows[k], s2.rows[k]) for k in s1.rows) and s1.shared == s2.shared
    adv = algo.advantages(batch.rewards, 3)
    base = algo.backward(policy, batch, s1, adv, loss_scale=1.0, iteration=1)["loss"]
    # old / reference log-probs in the state (as a ratio-based plug-in would store) change nothing
    noisy = AlgorithmState(rows={**s1.rows, "old_logp": torch.randn(6, 2, 5), "ref_logp": torch.randn(6, 2, 5)},
                           shared=dict(s1.shared))
    assert algo.backward(policy, batch, noisy, adv, loss_scale=1.0, iteration=1)["loss"] == base
    # and the advantages handed to backward are not re-weighted there (weights come from the group's rewards)
    assert algo.backward(policy, batch, s1, 100 * adv, loss_scale=1.0, iteration=1)["loss"] == base


def test_masks_are_d1s():
    batch = _batch([1.0, 0.0, 0.5, 0.0], 4)
    wd1 = get_algorithm("wd1")({"p_mask_prompt": 0.3}, TRAITS)
    d1 = get_algorithm("d1")({"p_mask_prompt": 0.3}, TRAITS)
    for seed in (0, 7, 42):
        assert torch.equal(wd1.draw_masks(batch, seed), d1.draw_masks(batch, seed))
    assert get_algorithm("wd1")({"random_masking": False}, TRAITS).mask_seeds(torch.Generator(), 3) == [42] * 3
    state = wd1.prepare(batch, None, None, generator=torch.Generator().manual_seed(0), num_iterations=3)
    assert state.rows["masks"].shape == (4, 3, 11)
    for k, s in enumerate(state.shared["mask_seeds"]):
        assert 0 <= s < 4096 and torch.equal(state.rows["masks"][:, k], wd1.draw_masks(batch, s))


def test_one_update_raises_the_best_completions_likelihood():
    """One small step on the wd1 loss raises Σ c·L (c = w⁺ − w⁻): first order Δ ≈ lr·‖∇‖²."""
    rewards = [1.0, 0.0, 0.0, 0.0]
    batch = _batch(rewards, 4)
    algo = get_algorithm("wd1")({}, TRAITS)
    policy = micro_llada(0)
    state = algo.prepare(batch, policy, None, generator=torch.Generator().manual_seed(1), num_iterations=1)
    mask, coef = state.rows["masks"][:, 0], state.rows["coef"]

    def objective():
        with torch.no_grad():
            seq = (algo.completion_logprobs(policy, batch, mask) * batch.completion_mask).sum(-1)
            return float((coef * seq).sum())

    before = objective()
    algo.backward(policy, batch, state, algo.advantages(batch.rewards, 4), loss_scale=1.0, iteration=0)
    with torch.no_grad():
        sq = sum(float((p.grad ** 2).sum()) for p in policy.parameters())
        for p in policy.parameters():
            p -= 1e-3 * p.grad
    gain = objective() - before
    assert gain > 0 and gain == pytest.approx(1e-3 * sq, rel=0.2)


def test_runs_through_the_shared_loop():
    from dare_bench.trainers.loop import RLRunOptions, train_rl

    from rl_fakes import CharTokenizer, ReverseTask, rl_settings

    result = train_rl(micro_llada(0), CharTokenizer(), ReverseTask(), "wd1", rl_settings(steps=4, mu=2),
                      options=RLRunOptions(progress=False, micro_batch_size=8))
    assert len(result.history) == 2 and all(math.isfinite(h["loss"]) for h in result.history)
