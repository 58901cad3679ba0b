"""Coupled-GRPO plug-in: shared/docs/algorithms.md §4 invariants and the official DARE estimator + loss case."""

import json

import pytest
import torch
from float_bounds import assert_same_up_to_ulps

from dare_bench.errors import ConfigError
from dare_bench.models.base import ModelTraits
from dare_bench.trainers.algorithms import AlgorithmState, RolloutBatch, get_algorithm

from rl_fakes import EOS, MASK, PAD, micro_dream, micro_llada, toy_rollout_batch
from testpaths import LOSSES

TRAITS = ModelTraits(family="llada", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=0,
                     attention="bidirectional")


def _batch(n_prompts=2, g=3, p=5, c=6, seed=0) -> RolloutBatch:
    return toy_rollout_batch(n_prompts, g, p, c, seed)


class _CopyLogits(torch.nn.Module):
    """Returns the fixture logits of the copy whose perturbed sequence is the input."""

    def __init__(self, perturbed, logits, traits):
        super().__init__()
        self.perturbed, self.traits = perturbed, traits
        self.logits = torch.nn.Parameter(logits.clone())

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        for j in range(self.perturbed.shape[1]):
            if torch.equal(input_ids, self.perturbed[:, j]):
                return self.logits[:, j]
        raise AssertionError("input is none of the fixture's perturbed copies")


def test_official_coupled_estimator_and_loss_fixture():
    path = LOSSES / "coupled_d1_logprob"
    from safetensors.torch import load_file

    case = next(c for c in json.loads((path / "cases.json").read_text())["cases"] if c["name"] == "coupled_grpo")
    T = load_file(str(path / "cases.safetensors"))
    x = {k: T[v["key"]] for k, v in case["inputs"].items()}
    out = {k: T[v["key"]] for k, v in case["outputs"].items()}
    a = case["call_args"]
    P = a["prompt_len"]
    traits = ModelTraits(family="llada", mask_token_id=a["MASK_TOKEN_ID"], eos_token_id=6, pad_token_id=6,
                         logit_shift=0, attention="bidirectional")
    algo = get_algorithm("coupled_grpo")({"clip_eps": a["cliprange"], "clip_ratio_c": a["clip_ratio_c"],
                                          "loss_agg": a["loss_agg_mode"]}, traits)
    ids, am = x["input_ids"], x["attention_mask"]
    batch = RolloutBatch(ids[:, :P], am[:, :P], ids[:, P:], am[:, P:], torch.zeros(4), 1)
    mask, p_mask = x["mask_indices"], x["p_mask"]
    old_model = _CopyLogits(x["perturbed_seq"], x["old_logits"], traits)
    model = _CopyLogits(x["perturbed_seq"], x["logits"], traits)
    with torch.no_grad():
        old = algo.completion_logprobs(old_model, batch, mask, p_mask)
    valid = am[:, P:].bool()
    assert_same_up_to_ulps(old[valid], out["old_log_prob"][:, P:][valid])
    state = AlgorithmState(rows={"mask": mask[:, None], "p_mask": p_mask[:, None], "old_logp": old[:, None]})
    metrics = algo.backward(model, batch, state, x["advantages"][:, 0], loss_scale=1.0, iteration=0)
    with torch.no_grad():
        assert_same_up_to_ulps(algo.completion_logprobs(model, batch, mask, p_mask)[valid],
                               out["log_prob"][:, P:][valid])
    # the loss is a float64 mean of the log-probs above: the same up to their ulps (CPU kernels differ)
    assert metrics["pg_loss"] == pytest.approx(out["pg_loss"].item(), rel=1e-14, abs=1e-15)
    assert metrics["clip_frac"] == out["pg_clipfrac"].item()
    assert metrics["clip_frac_lower"] == out["pg_clipfrac_lower"].item()
    # k3 metric: exp's last bit differs between CPUs (see test_common_losses.py)
    assert metrics["ppo_kl"] == pytest.approx(out["ppo_kl"].item(), rel=0, abs=4.5e-16)
    grad = T[case["grads"]["logits"]["key"]]
    # padded positions: upstream restores zero logits there (no gradient); ours are multiplied out (zero gradient)
    torch.testing.assert_close(model.logits.grad, grad, rtol=0, atol=4.5e-16)


def test_validate_refuses_bad_settings():
    C = get_algorithm("coupled_grpo")
    algo = C({}, TRAITS)
    assert algo.config.clip_eps == 0.5 and algo.config.clip_ratio_c is None
    with pytest.raises(ConfigError, match="mc_samples"):
        C({"mc_samples": 2}, TRAITS)
    with pytest.raises(ConfigError, match="t_min"):
        C({"t_min": 0.7, "t_max": 0.3}, TRAITS)
    with pytest.raises(ConfigError, match="not implemented"):
        C({"pairs": 2}, TRAITS)
    assert C({"t_min": 0.2, "t_max": 0.8, "pairs": 1}, TRAITS).config.pairs == 1
    with pytest.raises(ConfigError, match="not defined"):
        C({}, ModelTraits(family="sdar", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=0,
                          attention="block_causal", block_size=4))


def test_invariants_1_2_complementary_masks_cover_each_token_once():
    batch = _batch()
    algo = get_algorithm("coupled_grpo")({}, TRAITS)
    P = 5
    ts = []
    for seed in range(6):
        d = algo.draw(batch, seed)
        full, b, c = d.mask[:, 0, P:], d.mask[:, 1, P:], d.mask[:, 2, P:]
        valid = batch.completion_mask.bool()
        assert full[valid].all() and not (b & c).any()
        assert torch.equal((b | c) & valid, valid), "every scored token is in exactly one coupled copy"
        # real prompt tokens are never masked (upstream's "non-prompt" includes the left pads, hidden anyway)
        assert not (d.mask[:, :, :P] & batch.prompt_mask.bool()[:, None]).any()
        t = d.t[0, 1].item()
        assert torch.all(d.t[:, 1] == t) and 0.2 <= t <= 0.8, "one t per call, in [0.2, 0.8]"
        assert torch.allclose(d.p_mask[:, 1, P:][b], torch.tensor(t)) and torch.allclose(
            d.p_mask[:, 2, P:][c], torch.tensor(1 - t))
        ts.append(t)
    assert len(set(ts)) == 6


class _Unigram(torch.nn.Module):
    """Ignores its input and the position: the same logits everywhere."""

    def __init__(self, V, traits):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(V, generator=torch.Generator().manual_seed(0)))
        self.traits = traits

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return self.table[None, None].expand(input_ids.shape[0], input_ids.shape[1], -1)


def test_invariant_3_weights_with_a_context_free_model():
    batch = _batch()
    algo = get_algorithm("coupled_grpo")({}, TRAITS)
    model = _Unigram(16, TRAITS)
    d = algo.draw(batch, 7)
    t = d.t[0, 1].item()
    with torch.no_grad():
        got = algo.completion_logprobs(model, batch, d.mask, d.p_mask)
        lp = torch.log_softmax(model.table, -1)[batch.completion_ids]  # [N, C]
    in_b = d.mask[:, 1, 5:]
    want = torch.where(in_b, (lp + lp / t) / 2, (lp + lp / (1 - t)) / 2)
    valid = batch.completion_mask.bool()
    torch.testing.assert_close(got[valid], want[valid])
    assert (got[~valid] == 0).all()


def test_invariant_4_leave_one_out_and_ratio_one_at_old():
    batch = _batch()
    algo = get_algorithm("coupled_grpo")({"kl_beta": 0.01}, TRAITS)
    adv = algo.advantages(batch.rewards, batch.group_size)
    torch.testing.assert_close(adv.view(2, 3).sum(dim=1), torch.zeros(2), atol=1e-6, rtol=0)
    torch.testing.assert_close(adv[0], batch.rewards[0] - (batch.rewards[1] + batch.rewards[2]) / 2)
    policy = micro_llada(0)
    st = algo.prepare(batch, policy, policy, generator=torch.Generator().manual_seed(0), num_iterations=2)
    assert st.rows["mask"].shape == (6, 2, 3, 11) and st.rows["old_logp"].shape == (6, 2, 6)
    policy.zero_grad()
    m = algo.backward(policy, batch, st, adv, loss_scale=1.0, iteration=1)
    cm = batch.completion_mask.float()
    assert m["clip_frac"] == 0.0 and m["kl"] == 0.0
    assert m["loss"] == pytest.approx((-(adv[:, None] * cm).sum() / cm.sum()).item(), abs=1e-6)
    got = [p.grad.clone() for p in policy.parameters()]
    policy.zero_grad()
    lp = algo.completion_logprobs(policy, batch, st.rows["mask"][:, 1], st.rows["p_mask"][:, 1])
    (-(lp * adv[:, None] * cm).sum() / cm.sum()).backward()
    for g1, p in zip(got, policy.parameters()):
        torch.testing.assert_close(g1, p.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("backbone", ["llada", "dream"])
def test_micro_training_step(backbone):
    if backbone == "llada":
        model = micro_llada(0)
    else:
        model = micro_dream(0)
    algo = get_algorithm("coupled_grpo")({}, model.traits)
    batch = _batch()
    adv = algo.advantages(batch.rewards, batch.group_size)
    st = algo.prepare(batch, model, None, generator=torch.Generator().manual_seed(0), num_iterations=1)
    model.zero_grad()
    algo.backward(model, batch, st, adv, loss_scale=1.0, iteration=0)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0
