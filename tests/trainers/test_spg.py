"""SPG plug-in: shared/docs/algorithms.md §5 invariants, the brute-forced sandwich and the official DARE fixture."""

import itertools
import json
import math
import re

import pytest
import torch
from float_bounds import assert_same_up_to_ulps

from dare_bench.errors import ConfigError
from dare_bench.models.base import ModelTraits
from dare_bench.trainers.algorithms import AlgorithmState, RolloutBatch, get_algorithm
from dare_bench.trainers.algorithms.spg import spg_policy_loss, spg_sequence_logps

from rl_fakes import EOS, MASK, PAD, micro_dream, micro_llada, toy_rollout_batch
from testpaths import LOSSES

TRAITS = ModelTraits(family="llada", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=0,
                     attention="bidirectional")


def _batch(n_prompts=2, g=3, p=4, c=8, seed=0) -> RolloutBatch:
    return toy_rollout_batch(n_prompts, g, p, c, seed)


# --- official fixture ---------------------------------------------------------------------------------------------

class _DrawLogits(torch.nn.Module):
    """Returns the fixture logits of the draw whose perturbed sequence is the input (one forward per draw)."""

    def __init__(self, perturbed, logits, traits):
        super().__init__()
        self.perturbed = perturbed  # [B, n, L]
        self.logits = torch.nn.Parameter(logits.clone())  # [B, n, L, V]
        self.traits = traits

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        for j in range(self.perturbed.shape[1]):
            if torch.equal(input_ids, self.perturbed[:, j]):
                return self.logits[:, j]
        raise AssertionError("input is none of the fixture's perturbed sequences")


def test_official_fixture_every_case():
    path = LOSSES / "spg"
    from safetensors.torch import load_file

    cases = json.loads((path / "cases.json").read_text())["cases"]
    T = load_file(str(path / "cases.safetensors"))
    assert len(cases) == 6
    for case in cases:
        x = {k: T[v["key"]] for k, v in case["inputs"].items()}
        out = {k: T[v["key"]] for k, v in case["outputs"].items() if "key" in v}  # None metrics have no tensor
        grads = {k: T[v["key"]] for k, v in case["grads"].items()}
        a = case["call_args"]
        if case["name"].startswith("case"):
            lp = x["log_prob"].clone().requires_grad_(True)
            loss = spg_policy_loss(lp, x["advantages"], x["response_mask"])
            loss.backward()
            assert torch.equal(loss, out["pg_loss"]) and torch.equal(lp.grad, grads["log_prob"]), case["name"]
            continue
        # the official estimator + loss through the plug-in's own backward, logits from the fixture
        P = a["prompt_len"]
        traits = ModelTraits(family="llada", mask_token_id=a["MASK_TOKEN_ID"], eos_token_id=6, pad_token_id=6,
                             logit_shift=0, attention="bidirectional")
        variant = {"mix": "mixture"}.get(a["logp_estimation"], a["logp_estimation"])
        algo = get_algorithm("spg")({"num_t": a["mc_num"], "mask_block_length": 4, "eubo_beta": a["eubo_beta"],
                                     "mix_weight": a["mix_weight"], "variant": variant}, traits)
        ids, am = x["input_ids"], x["attention_mask"]
        batch = RolloutBatch(ids[:, :P], am[:, :P], ids[:, P:], am[:, P:], torch.zeros(4), 1)
        masks = x["mask_indices"]  # [B, 1 iteration, n, L]
        model = _DrawLogits(x["perturbed_seq"][:, 0], x["logits"], traits)
        state = AlgorithmState(rows={"masks": masks})
        adv = x["advantages"][:, 0]  # the sequence advantage, broadcast over the response in the fixture
        metrics = algo.backward(model, batch, state, adv, loss_scale=1.0, iteration=0)
        with torch.no_grad():
            est = algo.sequence_logps(model, batch, masks[:, 0], adv)
        assert_same_up_to_ulps(est["seq"], out["per_seq_logps"][0], what=case["name"])
        assert metrics["loss"] == out["pg_loss"].item(), case["name"]
        assert_same_up_to_ulps(model.logits.grad, grads["logits"], what=case["name"])
        # the masks are the official block-wise draws: prompt never fully masked, padding after the completion is
        assert bool(masks[:, 0][:, :, P:][(am[:, None, P:] == 0).expand_as(masks[:, 0][:, :, P:])].all())


def test_loss_direct_matches_definition():
    lp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    adv = torch.tensor([0.5, -1.0, 0.0], dtype=torch.float64)
    m = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    want = -(0.5 * -1.0 * 2 + -1.0 * -2.0 * 1 + 0.0) / 6
    assert spg_policy_loss(lp, adv, m).item() == pytest.approx(want)


# --- the sandwich, brute forced ----------------------------------------------------------------------------------

def _toy(seed, L=3, V=3):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(L, V, generator=g, dtype=torch.float64) * 1.5
    U = torch.randn(L, L, V, V, generator=g, dtype=torch.float64) * 1.5

    def cond(i, x, visible):
        z = W[i].clone()
        for j in visible:
            z = z + U[i, j, x[j]]
        return torch.softmax(z, -1)[x[i]]
    return cond


def test_sandwich_on_brute_forced_toy():
    """ELBO ≤ log p ≤ EUBO per token, exactly, for a toy conditional model over L = 3 tokens, vocabulary 3.

    log p(x) = log E_σ Π_k p(x_σk | x_σ<k) (the any-order generative likelihood); E[L_lo] is the plug-in's ELBO
    surrogate averaged over every one-block SPG draw (m ~ U{1..3}, M uniform), obtained by feeding all draws at
    their probabilities (3 singles, 3 pairs, the full mask three times: 9 equally likely draws);
    the upper side is the Rényi bound (1/β) log E_σ[(Π_k p)^β].
    """
    L = 3
    draws = [c for m in (1, 2) for c in itertools.combinations(range(L), m)] + [tuple(range(L))] * 3
    perturb = torch.zeros(1, len(draws), L, dtype=torch.bool)
    for j, M in enumerate(draws):
        perturb[0, j, list(M)] = True
    surrogate_below = 0
    for seed in range(3):
        cond = _toy(seed)
        for x in itertools.product(range(3), repeat=L):
            prods = []
            for perm in itertools.permutations(range(L)):
                prods.append(math.prod(cond(i, x, perm[:k]).item() for k, i in enumerate(perm)))
            logp = math.log(sum(prods) / len(prods)) / L
            probs = torch.zeros(1, len(draws), L, dtype=torch.float64)
            for j, M in enumerate(draws):
                vis = [i for i in range(L) if i not in M]
                for i in M:
                    probs[0, j, i] = cond(i, x, vis)
            logps = torch.where(perturb, probs.clamp_min(1e-300).log(), torch.zeros_like(probs))
            for beta in (1.0, 1.5, 2.0):
                est = spg_sequence_logps(logps, probs, perturb, torch.ones(1, L, dtype=torch.long),
                                         torch.tensor([False]), mode="eubo", beta=beta)
                renyi = math.log(sum(p ** beta for p in prods) / len(prods)) / beta / L
                assert est["elbo"].item() <= logp + 1e-12 <= renyi + 2e-12, (seed, x, beta)
                surrogate_below += int(est["eubo"].item() < logp)
    # Finding, kept visible: the official per-token EUBO surrogate is not itself an upper bound of log p.
    assert surrogate_below > 0


# --- plug-in ------------------------------------------------------------------------------------------------------

def test_validate_refuses_bad_settings():
    S = get_algorithm("spg")
    assert S({}, TRAITS).config.variant == "mixture"
    with pytest.raises(ConfigError, match="KL"):
        S({"kl_beta": 0.04}, TRAITS)
    S({"clip_ratio_c": 3.0, "clip_eps": 0.2}, TRAITS)  # inherited shared settings: unused, as in DARE
    with pytest.raises(ConfigError, match="eubo_beta"):
        S({"eubo_beta": 0.5}, TRAITS)
    with pytest.raises(ConfigError, match="variant"):
        S({"variant": "renyi"}, TRAITS)
    with pytest.raises(ConfigError, match="disagree"):
        S({"num_t": 2, "mc_samples": 4}, TRAITS)
    assert S({"num_t": 3, "mc_samples": 1}, TRAITS).num_draws == 3  # the loop's default mc_samples = 1
    assert S({"num_t": 3, "mc_samples": 1}, TRAITS).unread_settings().keys() == {"mc_samples"}
    assert S({"num_t": 3, "mc_samples": 3}, TRAITS).unread_settings() == {} == S({}, TRAITS).unread_settings()
    assert S({"block_length": 4}, TRAITS).config.mask_block_length == 4  # upstream's argument name, an alias
    with pytest.raises(ConfigError, match="not defined"):
        S({}, ModelTraits(family="sdar", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=0,
                          attention="block_causal", block_size=4))


@pytest.mark.parametrize("overrides, error", [
    (["train.mc_samples=1"], "override 'train.mc_samples=1' is not read: spg draws num_t = 2"),
    (["train.algorithm.num_t=1", "train.mc_samples=1"], None),  # both: what the MC-sensitivity sweep sets
    (["train.mc_samples=2"], None),  # agrees with num_t: read
])
def test_an_override_spg_would_not_read_is_refused_at_plan_time(overrides, error):
    """`--set train.mc_samples=1` on SPG once changed the config hash and nothing else (SPG draws num_t mask
    sets); it is now one ConfigError before any work."""
    from dare_bench.pipeline.plan import resolve

    if error is None:
        resolve("spg-llada-sudoku", "micro", overrides)
    else:
        with pytest.raises(ConfigError, match=re.escape(error)):
            resolve("spg-llada-sudoku", "micro", overrides)


def test_block_masks_per_iteration_and_all_positive_is_elbo_only():
    batch = _batch()
    algo = get_algorithm("spg")({"mask_block_length": 4}, TRAITS)
    st = algo.prepare(batch, None, None, generator=torch.Generator().manual_seed(0), num_iterations=3)
    seeds = st.shared["mask_seeds"]
    assert st.rows["masks"].shape == (6, 3, 2, 12)
    for k, s in enumerate(seeds):
        assert torch.equal(st.rows["masks"][:, k], algo.draw(batch, s).mask)
    # block structure on the valid completion: the chosen block has >= 1 mask, every later block is all masks
    P = 4
    for r in range(6):
        n_valid = int(batch.completion_mask[r].sum())
        for j in range(2):
            comp = st.rows["masks"][r, 0, j, P:P + n_valid]
            blocks = [comp[b:b + 4] for b in range(0, n_valid, 4)]
            k = next(i for i, blk in enumerate(blocks) if blk.any() and all(bb.all() for bb in blocks[i + 1:]))
            assert all(bb.all() for bb in blocks[k + 1:])
    policy = micro_llada(0)
    adv = torch.tensor([0.5, 0.1, 0.2, 0.3, 0.4, 0.6])
    with torch.no_grad():
        mix = algo.sequence_logps(policy, batch, st.rows["masks"][:, 0], adv)
        elbo = get_algorithm("spg")({"mask_block_length": 4, "variant": "elbo"}, TRAITS).sequence_logps(
            policy, batch, st.rows["masks"][:, 0], adv)
    assert torch.equal(mix["seq"], elbo["seq"]) and torch.equal(mix["seq"], mix["elbo"])
    with torch.no_grad():
        neg = algo.sequence_logps(policy, batch, st.rows["masks"][:, 0], -adv)
    torch.testing.assert_close(neg["seq"], 0.5 * neg["eubo"] + 0.5 * neg["elbo"])


@pytest.mark.parametrize("backbone", ["llada", "dream"])
def test_micro_training_step(backbone):
    if backbone == "llada":
        model = micro_llada(0)
    else:
        model = micro_dream(0)
    algo = get_algorithm("spg")({"mask_block_length": 4}, model.traits)
    batch = _batch()
    adv = algo.advantages(batch.rewards, batch.group_size)
    st = algo.prepare(batch, model, None, generator=torch.Generator().manual_seed(0), num_iterations=1)
    model.zero_grad()
    m = algo.backward(model, batch, st, adv, loss_scale=1.0, iteration=0)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0
    assert math.isfinite(m["loss"]) and m["elbo"] < 0
