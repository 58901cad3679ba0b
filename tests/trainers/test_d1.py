"""d1 / diffu-GRPO plug-in: the invariants of shared/docs/algorithms.md §3 and the official DARE d1 estimator case."""

import json

import pytest
import torch
from float_bounds import assert_same_up_to_ulps

from dare_bench.errors import ConfigError
from dare_bench.models.base import ModelTraits
from dare_bench.trainers.algorithms import AlgorithmState, RolloutBatch, get_algorithm

from rl_fakes import EOS, MASK, PAD, micro_llada
from testpaths import LOSSES

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TRAITS = ModelTraits(family="llada", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=0,
                     attention="bidirectional")


def _batch(n_prompts=3, g=4, p=6, c=5, seed=0) -> RolloutBatch:
    gen = torch.Generator().manual_seed(seed)
    n = n_prompts * g
    prompt = torch.randint(0, 10, (n, p), generator=gen)
    pmask = torch.ones(n, p, dtype=torch.long)
    for r in range(n):  # left padding of varying length, shared within a group
        pad = (r // g) % 3
        prompt[r, :pad] = PAD
        pmask[r, :pad] = 0
    comp = torch.randint(0, 10, (n, c), generator=gen)
    cmask = torch.ones(n, c, dtype=torch.long)
    for r in range(n):
        end = 1 + r % c  # first EOS at position end-1; after it: EOS padding, not scored
        comp[r, end - 1:] = EOS
        cmask[r, end:] = 0
    rewards = torch.rand(n, generator=gen)
    return RolloutBatch(prompt, pmask, comp, cmask, rewards, group_size=g)


def test_registered_and_validates():
    D1 = get_algorithm("d1")
    assert D1.name == "d1"
    algo = D1({}, TRAITS)
    assert algo.config.clip_eps == 0.5 and algo.config.p_mask_prompt == 0.15 and algo.config.mc_samples == 1
    with pytest.raises(ConfigError, match="mc_samples"):
        D1({"mc_samples": 2}, TRAITS)
    with pytest.raises(ConfigError, match="advantage"):
        D1({"advantage": "leave_one_out"}, TRAITS)
    with pytest.raises(ConfigError, match="unknown setting"):
        D1({"p_mask_promt": 0.1}, TRAITS)
    with pytest.raises(ConfigError, match="loss_agg"):
        D1({"loss_agg": "sum"}, TRAITS)
    block = ModelTraits(family="sdar", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=0,
                        attention="block_causal", block_size=4)
    with pytest.raises(ConfigError, match="not defined"):
        D1({}, block)


def test_advantages_mean_by_default_std_on_request():
    r = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0, 2.0, 2.0, 4.0])
    a = get_algorithm("d1")({}, TRAITS).advantages(r, 4)
    torch.testing.assert_close(a, torch.tensor([0.5, -0.5, 0.0, 0.0, -0.5, -0.5, -0.5, 1.5]))
    s = get_algorithm("d1")({"advantage": "mean_std"}, TRAITS).advantages(r, 4)
    torch.testing.assert_close(s[:4],
                               torch.tensor([0.5, -0.5, 0.0, 0.0]) / (torch.tensor([1.0, 0, .5, .5]).std() + 1e-6))


def test_invariant_1_masks_cover_completion_not_padding():
    batch = _batch()
    algo = get_algorithm("d1")({}, TRAITS)
    for seed in range(5):
        mask = algo.draw_masks(batch, seed)
        p = batch.prompt_ids.shape[1]
        assert mask[:, p:].all(), "every completion position is masked (p = 1)"
        assert not (mask[:, :p] & (batch.prompt_mask == 0)).any(), "prompt padding is never masked"
        assert not (mask & ~batch.attention_mask.bool()).any(), "nothing beyond the attention mask is masked"
        # (completion tokens after the first EOS are attended and masked, as upstream d1; only the scored part,
        # `completion_mask`, stops at the EOS)


def test_invariant_2_prompt_mask_rate():
    batch = _batch(n_prompts=50, g=4, p=40)
    algo = get_algorithm("d1")({}, TRAITS)
    mask = algo.draw_masks(batch, 123)
    real = batch.prompt_mask.bool()
    frac = mask[:, :40][real].float().mean().item()
    n = int(real.sum())
    assert abs(frac - 0.15) < 4 * (0.15 * 0.85 / n) ** 0.5, (frac, n)  # 4 sigma of a binomial over ~7,000 tokens
    frac_05 = get_algorithm("d1")({"p_mask_prompt": 0.5}, TRAITS).draw_masks(batch, 123)[:, :40][real].float().mean()
    assert abs(frac_05.item() - 0.5) < 4 * (0.25 / n) ** 0.5


def test_mask_seeds_per_iteration_shared_by_old_ref_new():
    batch = _batch()
    algo = get_algorithm("d1")({"kl_beta": 0.04}, TRAITS)
    policy = micro_llada(0)
    ref = micro_llada(1)
    state = algo.prepare(batch, policy, ref, generator=torch.Generator().manual_seed(0), num_iterations=3)
    seeds = state.shared["mask_seeds"]
    assert len(seeds) == 3 and all(0 <= s < 4096 for s in seeds)
    masks = state.rows["masks"]
    assert masks.shape == (batch.num_rows, 3, 11)
    for k, s in enumerate(seeds):
        assert torch.equal(masks[:, k], algo.draw_masks(batch, s))
        # the stored old / ref log-probs are those of this iteration's mask
        with torch.no_grad():
            torch.testing.assert_close(state.rows["old_logp"][:, k],
                                       algo.completion_logprobs(policy, batch, masks[:, k]))
            torch.testing.assert_close(state.rows["ref_logp"][:, k], algo.completion_logprobs(ref, batch, masks[:, k]))
    fixed = get_algorithm("d1")({"random_masking": False}, TRAITS)
    assert fixed.mask_seeds(torch.Generator().manual_seed(0), 3) == [42, 42, 42]
    # μ = 1 and no KL: no extra forward in prepare (old = ℓ.detach(), as upstream)
    st1 = get_algorithm("d1")({}, TRAITS).prepare(batch, policy, None, generator=torch.Generator(), num_iterations=1)
    assert set(st1.rows) == {"masks"}


def test_invariant_3_ratio_one_loss_and_gradient():
    """θ = θ_old, same mask: ratio ≡ 1, loss = −Σ A·m / Σm, gradient = −∇ Σ ℓ·A·m / Σm."""
    batch = _batch()
    algo = get_algorithm("d1")({"clip_ratio_c": 3.0}, TRAITS)
    policy = micro_llada(0)
    adv = algo.advantages(batch.rewards, batch.group_size)
    state = algo.prepare(batch, policy, None, generator=torch.Generator().manual_seed(3), num_iterations=2)
    for it in range(2):
        policy.zero_grad()
        metrics = algo.backward(policy, batch, state, adv, loss_scale=1.0, iteration=it)
        m = batch.completion_mask.float()
        expected = -(adv[:, None] * m).sum() / m.sum()
        assert metrics["clip_frac"] == 0.0 and abs(metrics["ppo_kl"]) < 1e-7
        assert metrics["loss"] == pytest.approx(expected.item(), abs=1e-7)
        got = [p.grad.clone() for p in policy.parameters()]
        policy.zero_grad()
        logp = algo.completion_logprobs(policy, batch, state.rows["masks"][:, it])
        (-(logp * adv[:, None] * m).sum() / m.sum()).backward()
        for g1, p in zip(got, policy.parameters()):
            torch.testing.assert_close(g1, p.grad, rtol=1e-5, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in got)


def test_invariant_4_kl_zero_iff_reference_equal():
    batch = _batch()
    algo = get_algorithm("d1")({"kl_beta": 0.1}, TRAITS)
    policy = micro_llada(0)
    adv = algo.advantages(batch.rewards, batch.group_size)
    same = algo.prepare(batch, policy, policy, generator=torch.Generator().manual_seed(0), num_iterations=1)
    m = algo.backward(policy, batch, same, adv, loss_scale=1.0, iteration=0)
    assert m["kl"] == 0.0
    other = algo.prepare(batch, policy, micro_llada(7), generator=torch.Generator().manual_seed(0), num_iterations=1)
    policy.zero_grad()
    m2 = algo.backward(policy, batch, other, adv, loss_scale=1.0, iteration=0)
    assert m2["kl"] > 0
    assert m2["loss"] == pytest.approx(m2["pg_loss"] + 0.1 * m2["kl"], rel=1e-6)


class _LogitsModel(torch.nn.Module):
    """Returns fixed logits whatever the input: replays the official case through `D1.backward`."""

    def __init__(self, logits):
        super().__init__()
        self.logits = torch.nn.Parameter(logits)

    def forward(self, input_ids, attention_mask=None):
        assert input_ids.shape == self.logits.shape[:2]
        return self.logits


def test_official_d1_estimator_and_loss_fixture():
    path = LOSSES / "coupled_d1_logprob"
    from safetensors.torch import load_file

    case = next(c for c in json.loads((path / "cases.json").read_text())["cases"] if c["name"] == "d1")
    T = load_file(str(path / "cases.safetensors"))
    x = {k: T[v["key"]] for k, v in case["inputs"].items()}
    out = {k: T[v["key"]] for k, v in case["outputs"].items()}
    args = case["call_args"]
    p = args["prompt_len"]
    traits = ModelTraits(family="llada", mask_token_id=args["MASK_TOKEN_ID"], eos_token_id=6, pad_token_id=6,
                         logit_shift=0, attention="bidirectional")
    algo = get_algorithm("d1")({"clip_eps": args["cliprange"], "clip_ratio_c": args["clip_ratio_c"],
                                "loss_agg": args["loss_agg_mode"]}, traits)
    ids, am = x["input_ids"], x["attention_mask"]
    batch = RolloutBatch(ids[:, :p], am[:, :p], ids[:, p:], x["mask_indices"][:, 0, p:], torch.zeros(4), 1)
    old_model, model = _LogitsModel(x["old_logits"][:, 0]), _LogitsModel(x["logits"][:, 0].clone())
    masks = x["mask_indices"][:, 0]
    with torch.no_grad():
        old = algo.completion_logprobs(old_model, batch, masks)
    # the official actor unpads by attention_mask, so padded response positions get all-zero logits there (value
    # log V); they are outside the response mask and never scored: compare the valid positions
    valid = am[:, p:].bool()
    assert_same_up_to_ulps(old[valid], out["old_log_prob"][:, 0][valid])
    state = AlgorithmState(rows={"masks": masks[:, None], "old_logp": old[:, None]})
    adv_row = x["advantages"][:, 0]  # the sequence advantage (the fixture broadcasts it times the response mask)
    metrics = algo.backward(model, batch, state, adv_row, loss_scale=1.0, iteration=0)
    with torch.no_grad():
        assert_same_up_to_ulps(algo.completion_logprobs(model, batch, masks)[valid], out["log_prob"][:, 0][valid])
    # the loss is a float64 mean of the log-probs above: the same up to their ulps (CPU kernels differ)
    assert metrics["pg_loss"] == pytest.approx(out["pg_loss"].item(), rel=1e-14, abs=1e-15)
    assert metrics["clip_frac"] == out["pg_clipfrac"].item()
    # k3 metric: exp's last bit differs between CPUs (see test_common_losses.py)
    assert metrics["ppo_kl"] == pytest.approx(out["ppo_kl"].item(), rel=0, abs=4.5e-16)
    assert metrics["clip_frac_lower"] == out["pg_clipfrac_lower"].item()
    grad = T[case["grads"]["logits"]["key"]][:, 0]
    torch.testing.assert_close(model.logits.grad, grad, rtol=0, atol=4.5e-16)
    # and the official masks are what our sampler draws for the same layout: prompt iid, response fully masked
    assert torch.equal(masks[:, p:], am[:, p:].bool())


def test_one_update_moves_probability_towards_positive_advantages():
    """One small gradient step on the d1 loss raises Σ A·ℓ (same mask): rewarded completions become likelier."""
    batch = _batch()
    algo = get_algorithm("d1")({}, TRAITS)
    policy = micro_llada(0)
    adv = algo.advantages(batch.rewards, batch.group_size)
    state = algo.prepare(batch, policy, None, generator=torch.Generator().manual_seed(1), num_iterations=1)
    mask = state.rows["masks"][:, 0]
    m = batch.completion_mask.float()

    def surrogate():
        with torch.no_grad():
            return float((algo.completion_logprobs(policy, batch, mask) * adv[:, None] * m).sum() / m.sum())

    before = surrogate()
    algo.backward(policy, batch, state, adv, loss_scale=1.0, iteration=0)
    with torch.no_grad():
        sq = sum(float((p.grad ** 2).sum()) for p in policy.parameters())
        for p in policy.parameters():
            p -= 1e-2 * p.grad
    gain = surrogate() - before
    assert gain > 0 and gain == pytest.approx(1e-2 * sq, rel=0.2)  # first-order: Δ ≈ lr·‖∇‖²


def test_kl_variants_and_estimators():
    """kl_variant 'standard' is the d1 trainer's unclamped k3; 'dare' is DARE's advantage-dependent kl_penalty."""
    from dare_bench.trainers.algorithms.common import agg_loss, dare_kl_penalty

    g = torch.Generator().manual_seed(4)
    logp = -torch.rand(4, 5, generator=g, dtype=torch.float64)
    ref = logp + 0.3 * torch.randn(4, 5, generator=g, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64)
    m = torch.ones(4, 5)
    std = get_algorithm("d1")({"kl_beta": 0.1}, TRAITS)
    _, ms = std.loss_terms(logp, logp, ref, adv, m)
    d = ref - logp
    assert ms["kl"] == pytest.approx(float((torch.exp(d) - d - 1).mean()), rel=1e-12)
    dare = get_algorithm("d1")({"kl_beta": 0.1, "kl_variant": "dare", "kl_estimator": "k2"}, TRAITS)
    _, md = dare.loss_terms(logp, logp, ref, adv, m)
    assert md["kl"] == pytest.approx(float(agg_loss(dare_kl_penalty(logp, ref, "k2", adv), m)), rel=1e-12)
    assert md["kl"] != ms["kl"]
