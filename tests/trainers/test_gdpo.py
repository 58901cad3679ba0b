"""GDPO plug-in: the official fixture (the authors' estimator and `compute_loss`, every case), then one test per piece
that would catch its drift: the Gauss-Legendre nodes and weights, the semi-deterministic ELBO by hand on a micro
LLaDA, unbiasedness and variance against plain double Monte Carlo on an enumerable example, the loss and gradient
against a hand-written objective, the k3 KL on the raw ELBO, per-iteration masks, the two ELBO spans.

The formulas are those of `KevinRojas1499/GDPO` @ 1918683 (see the module docstring of
`dare_bench/trainers/algorithms/gdpo.py`); the fixture's provenance is `tests/fixtures/losses/gdpo/README.md`.
"""

import itertools
import json
import math

import numpy as np
import pytest
import torch

from dare_bench.diffusion.masking import fixed_ratio_masks
from dare_bench.errors import ConfigError
from dare_bench.models.base import ModelTraits
from dare_bench.trainers.algorithms import AlgorithmState, RolloutBatch, get_algorithm
from dare_bench.trainers.algorithms.gdpo import quadrature

from rl_fakes import EOS, MASK, PAD, micro_dream, micro_llada, toy_rollout_batch
from testpaths import LOSSES

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TRAITS = ModelTraits(family="llada", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=0,
                     attention="bidirectional")
BLOCK = ModelTraits(family="sdar", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=0,
                    attention="block_causal", block_size=4)
RULES = ("gauss-1", "gauss-2", "gauss-3", "gauss-4", "gauss-5")


def gdpo(**settings):
    return get_algorithm("gdpo")(settings, TRAITS)


class Toy(torch.nn.Module):
    """The fixture's toy model (`cases.json` `toy_model`), float64, as a dare-bench backbone (traits, logits)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.E = torch.nn.Parameter(torch.randn(16, 8, generator=g, dtype=torch.float64) * 0.7)
        self.P = torch.nn.Parameter(torch.randn(32, 8, generator=g, dtype=torch.float64) * 0.7)
        self.W = torch.nn.Parameter(torch.randn(8, 16, generator=g, dtype=torch.float64) * 0.9)
        self.traits = TRAITS

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        h = self.E[input_ids] + self.P[: input_ids.shape[1]]
        return torch.tanh(h + h.mean(dim=1, keepdim=True)) @ self.W


@pytest.fixture
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _plain_batch(seq: torch.Tensor, p: int, rewards=None) -> RolloutBatch:
    """One prompt group, no padding: prompt = seq[:, :p], completion = the rest, every position scored."""
    n, c = seq.shape[0], seq.shape[1] - p
    r = torch.zeros(n) if rewards is None else torch.as_tensor(rewards, dtype=torch.float64)
    return RolloutBatch(seq[:, :p], torch.ones(n, p, dtype=torch.long), seq[:, p:], torch.ones(n, c, dtype=torch.long),
                        r, group_size=n)


def _grads(model):
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def _perturb(model, scale=0.02):
    with torch.no_grad():
        for prm in model.parameters():
            prm.add_(scale * torch.randn(prm.shape, generator=torch.Generator().manual_seed(prm.numel()),
                                         dtype=prm.dtype))


# --- official fixture ---------------------------------------------------------------------------------------------

def _fixture():
    from safetensors.torch import load_file

    path = LOSSES / "gdpo"
    return json.loads((path / "cases.json").read_text()), load_file(str(path / "cases.safetensors"))


def test_official_estimator_fixture_every_case(float64):
    """`NumericalIntegrationEstimator.get_log_likelihood` (run unmodified): the masks of every node (the model inputs
    of each official forward), the sequence ELBO and its gradient w.r.t. every weight."""
    meta, T = _fixture()
    cases = [c for c in meta["cases"] if c["kind"] == "estimator"]
    assert {c["call"]["method"] for c in cases} == set(RULES)
    for case in cases:
        call, name = case["call"], case["name"]
        seq = T[case["inputs"]["seq"]["key"]]
        C, K = call["logits_to_keep"], call["mc_batch_size"]
        P, B = seq.shape[1] - C, seq.shape[0]
        algo = gdpo(quadrature=call["method"], mc_samples=K)
        batch = _plain_batch(seq, P)
        draw = algo.draw(batch, call["seed"])
        # official forward q holds rows b·K + k at node q; ours is copy q·K + k of row b
        noisy = draw.noisy_ids(seq, MASK)
        assert len(case["forwards"]) == len(algo.times)
        for q, fwd in enumerate(case["forwards"]):
            ours = noisy[:, q * K:(q + 1) * K].reshape(B * K, -1)
            assert torch.equal(ours, T[fwd["key"]]), (name, q)
        model = Toy(case["model_seed"])
        rows = {"mask": draw.mask, "p_mask": draw.p_mask}
        E = algo.sequence_elbo(model, batch, rows, 0)
        torch.testing.assert_close(E, T[case["outputs"]["logps"]["key"]], rtol=0, atol=1e-12)
        grads = torch.autograd.grad(E.sum(), [model.E, model.P, model.W])
        for n, g in zip("EPW", grads):
            torch.testing.assert_close(g, T[case["grads"][n]["key"]], rtol=0, atol=1e-12)


def test_official_loss_fixture_every_case(float64):
    """`GDPOTrainer.compute_loss` (run unmodified): value and gradient w.r.t. every weight of the plug-in's
    `backward`, with the official old / reference ELBOs of the case's iteration and its mask seed."""
    meta, T = _fixture()
    cases = [c for c in meta["cases"] if c["kind"] == "loss"]
    assert len(cases) == 2
    for case in cases:
        call, name = case["call"], case["name"]
        x = {k: T[v["key"]] for k, v in case["inputs"].items()}
        mu, it = call["num_iterations"], call["iteration"]
        algo = gdpo(quadrature=call["method"], clip_eps=call["epsilon"], kl_beta=call["beta"], kl_estimator="k3",
                    advantage="mean")
        batch = _plain_batch(x["seq"], case["prompt_len"])
        draws = [algo.draw(batch, call["mask_seed"] if k == it else 1000 + k) for k in range(mu)]
        rows = {"mask": torch.cat([d.mask for d in draws], 1), "p_mask": torch.cat([d.p_mask for d in draws], 1)}
        n = batch.num_rows
        if mu > 1:
            rows["old"] = torch.zeros(n, mu).index_copy(1, torch.tensor([it]), x["old_logps"][:, None])
        if call["beta"]:
            rows["ref"] = torch.zeros(n, mu).index_copy(1, torch.tensor([it]), x["ref_logps"][:, None])
        model = Toy(case["model_seed"])
        with torch.no_grad():
            torch.testing.assert_close(algo.sequence_elbo(model, batch, rows, it), x["current_logps"], rtol=0,
                                       atol=1e-12)
        m = algo.backward(model, batch, AlgorithmState(rows=rows), x["advantages"], loss_scale=1.0, iteration=it)
        assert m["loss"] == pytest.approx(T[case["outputs"]["loss"]["key"]].item(), rel=1e-12, abs=1e-14), name
        if call["beta"]:
            assert m["kl"] == pytest.approx(case["outputs"]["kl_metric"], rel=1e-12)
        for p, n_ in zip(model.parameters(), "EPW"):
            torch.testing.assert_close(p.grad, T[case["grads"][n_]["key"]], rtol=0, atol=1e-12)


# --- quadrature ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rule", RULES)
def test_gauss_legendre_nodes_and_weights(rule):
    """t = (x + 1)/2, w/2 of the N-point Gauss-Legendre rule (numpy's leggauss to 1e-15, the official order), the
    weights sum to 1 and the rule is exact on [0, 1] for t^d, d < 2N (and not for d = 2N)."""
    N = int(rule[-1])
    times, weights = quadrature(rule)
    x, w = np.polynomial.legendre.leggauss(N)
    order = np.argsort(times)
    np.testing.assert_allclose(np.asarray(times)[order], (x + 1) / 2, rtol=0, atol=1e-15)
    np.testing.assert_allclose(np.asarray(weights)[order], w / 2, rtol=0, atol=1e-15)
    assert math.fsum(weights) == pytest.approx(1.0, abs=1e-15)
    for d in range(2 * N):
        assert math.fsum(wq * tq ** d for tq, wq in zip(times, weights)) == pytest.approx(1 / (d + 1), abs=1e-14)
    assert math.fsum(wq * tq ** (2 * N) for tq, wq in zip(times, weights)) != pytest.approx(1 / (2 * N + 1),
                                                                                           abs=1e-9)


def test_official_node_order():
    """The order fixes the RNG order of the masks (node-major): upstream's lists, not sorted."""
    s3, s5 = math.sqrt(3 / 5), math.sqrt(5 - 2 * math.sqrt(10 / 7)) / 3
    assert quadrature("gauss-3")[0] == pytest.approx(((1 - s3) / 2, 0.5, (1 + s3) / 2), abs=1e-16)
    t4 = quadrature("gauss-4")[0]
    assert t4[0] < t4[1] and t4[2] < t4[0] and t4[3] > t4[1]  # inner pair, then outer pair
    t5 = quadrature("gauss-5")[0]
    assert t5[0] == 0.5 and t5[1] == pytest.approx((1 - s5) / 2, abs=1e-16) and t5[3] < t5[1]


# --- the estimator --------------------------------------------------------------------------------------------------

def test_semi_deterministic_elbo_by_hand_on_micro_llada():
    """Ê = Σ_q (w_q / K) Σ_k (1/t_q) Σ_{masked} log softmax(f(x̃_qk))[y], each copy masking exactly int(t_q C) of
    the C canvas positions (post-EOS included) and never a prompt token; by hand from the model's logits."""
    batch = toy_rollout_batch()
    model = micro_llada(0)
    algo = gdpo(mc_samples=2)
    st = algo.prepare(batch, model, None, generator=torch.Generator().manual_seed(3), num_iterations=1)
    ids, attn = batch.input_ids, batch.attention_mask
    P, C = batch.prompt_ids.shape[1], batch.completion_ids.shape[1]
    mask = st.rows["mask"]
    assert mask.shape == (6, 6, P + C) and not mask[:, :, :P].any()
    want = torch.zeros(6)
    with torch.no_grad():
        for q, (t, w) in enumerate(zip(algo.times, algo.weights)):
            for k in range(2):
                m = mask[:, 2 * q + k]
                assert (m.sum(dim=1) == int(t * C)).all()
                logits = model(torch.where(m, MASK, ids), attention_mask=attn)
                lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[..., None])[..., 0]
                want += (w / 2) * (lp * m).sum(dim=1) / t
        got = algo.sequence_elbo(model, batch, st.rows, 0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_completion_span_scores_up_to_the_first_eos_only():
    """`elbo_span: completion`: counts int(t L_i) of the L_i scored tokens, post-EOS positions never masked and
    hidden from attention (the other ELBO plug-ins' layout); `canvas` (official) masks over all C positions."""
    batch = toy_rollout_batch()
    P = batch.prompt_ids.shape[1]
    L = batch.completion_mask.sum(dim=1)
    assert len(set(L.tolist())) > 1
    algo = gdpo(elbo_span="completion")
    st = algo.prepare(batch, None, None, generator=torch.Generator().manual_seed(0), num_iterations=1)
    comp_mask = st.rows["mask"][:, :, P:]
    post_eos = ~batch.completion_mask.bool()
    assert not (comp_mask & post_eos[:, None, :]).any()
    for q, t in enumerate(algo.times):
        assert comp_mask[:, q].sum(dim=1).tolist() == [int(t * v) for v in L.tolist()]
    _, attn, _ = algo.layout(batch)
    assert torch.equal(attn[:, P:], batch.completion_mask)
    canvas = gdpo()
    _, attn_c, _ = canvas.layout(batch)
    assert bool(attn_c[:, P:].all())


def test_fixed_ratio_masks_match_upstream_rng():
    """One `randperm(L)` per (ratio, row, copy) from the generator, as upstream after `torch.manual_seed(s)`."""
    am = torch.ones(2, 9, dtype=torch.long)
    draw = fixed_ratio_masks(am, 3, generator=torch.Generator().manual_seed(7), ratios=(0.5, 0.9), n=2)
    torch.manual_seed(7)
    for q, t in enumerate((0.5, 0.9)):
        for i in range(2):
            for k in range(2):
                want = torch.zeros(6, dtype=torch.bool)
                want[torch.randperm(6)[:int(t * 6)]] = True
                assert torch.equal(draw.mask[i, 2 * q + k, 3:], want)
    assert torch.equal(draw.p_mask[:, :, 0], torch.tensor([[0.5, 0.5, 0.9, 0.9]] * 2, dtype=draw.p_mask.dtype))
    with pytest.raises(ConfigError, match="ratios"):
        fixed_ratio_masks(am, 3, generator=torch.Generator(), ratios=(0.0,))


def test_unbiased_for_its_quadrature_and_far_lower_variance_than_plain_mc(float64):
    """One 8-token completion of the toy model, every one of the 2^8 masks enumerated. S(m) = Σ_{i∈m} log p(y_i |
    y ⊙ m); g(k) = mean of S over |m| = k. The exact ELBO (t ~ U(0,1), iid Bernoulli(t) masks, weight 1/t) is
    Σ_k g(k) / k. Plain double MC is unbiased for it with a huge variance; the semi-deterministic estimator is
    unbiased for its quadrature Σ_q w_q g(int(t_q L)) / t_q (the plug-in's draws average to it) with a variance
    Σ_q (w_q / t_q)² Var_{|m|=k_q} S. At the same budget of 3 forwards (gauss-3, K = 1) its variance is > 50x
    smaller and its mean squared error (quadrature bias² + variance) is smaller too: the paper's trade."""
    p, L = 3, 8
    seq = torch.randint(0, 13, (1, p + L), generator=torch.Generator().manual_seed(1))
    model = Toy(0)
    bits = torch.tensor(list(itertools.product([0, 1], repeat=L)), dtype=torch.bool)  # [256, L], row = binary code
    full = torch.cat([torch.zeros(len(bits), p, dtype=torch.bool), bits], dim=1)
    ids = seq.expand(len(bits), -1)
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.where(full, MASK, ids)), -1).gather(-1, ids[..., None])[..., 0]
    S = (lp * full).sum(dim=1)
    count = bits.sum(dim=1)
    g = torch.stack([S[count == k].mean() for k in range(L + 1)])
    var_k = torch.stack([S[count == k].var(unbiased=False) for k in range(L + 1)])
    elbo = sum(g[k] / k for k in range(1, L + 1))

    # plain double MC, simulated exactly from the table: t ~ U(0,1), Bernoulli(t) masks, S / t
    gen = torch.Generator().manual_seed(5)
    n = 100_000
    t = torch.rand(n, generator=gen)
    code = ((torch.rand(n, L, generator=gen) < t[:, None]).long() * 2 ** torch.arange(L - 1, -1, -1)).sum(dim=1)
    plain = S[code] / t
    assert abs(plain.mean() - elbo) < 4 * plain.std() / math.sqrt(n)  # unbiased for the ELBO
    var_plain3 = plain.var() / 3  # three forwards

    algo = gdpo(quadrature="gauss-3", mc_samples=1)
    target = sum(w * g[int(tq * L)] / tq for tq, w in zip(algo.times, algo.weights))
    var_sd = sum((w / tq) ** 2 * var_k[int(tq * L)] for tq, w in zip(algo.times, algo.weights))
    batch = _plain_batch(seq, p)
    draws = 300
    with torch.no_grad():
        est = torch.stack([algo.sequence_elbo(model, batch, {"mask": d.mask, "p_mask": d.p_mask}, 0)[0]
                           for d in (algo.draw(batch, s) for s in range(draws))])
    assert abs(est.mean() - target) < 4 * math.sqrt(var_sd / draws)  # unbiased for its quadrature
    assert est.var().item() == pytest.approx(var_sd.item(), rel=0.25)
    assert var_sd < var_plain3 / 50
    assert (target - elbo) ** 2 + var_sd < var_plain3


def test_consistent_as_the_completion_grows():
    """Mean-field check of the fixed-count rounding: with log p(y_i | ·) = a_i independent of the context,
    g(k) = k ā, the ELBO is L ā (the exact log-likelihood) and the estimator's mean is Σ_q w_q int(t_q L) ā / t_q:
    its relative error is the rounding's: about 1 % or less at the recipe's 256 tokens for every rule, 28 % for
    gauss-3 at 8 tokens (7.6 % at the tiny scale's 24). gauss-1 (t = ½) never rounds for even L."""
    for rule in RULES:
        times, weights = quadrature(rule)
        rel = {L: abs(math.fsum(w * int(t * L) / (t * L) for t, w in zip(times, weights)) - 1) for L in (8, 24, 256)}
        assert rel[256] < 0.011 and rel[8] >= rel[256], (rule, rel)
        if rule == "gauss-3":
            assert rel[8] == pytest.approx(0.2816, abs=1e-4) and rel[24] == pytest.approx(0.0762, abs=1e-4)


# --- loss ------------------------------------------------------------------------------------------------------------

def _hand_elbo(model, batch, mask, times, weights, K):
    """Ê with a graph, by hand (no plug-in code): Σ_q (w_q / K) Σ_k Σ_masked log p / t_q."""
    ids, attn = batch.input_ids, batch.attention_mask
    total = 0
    for q, (t, w) in enumerate(zip(times, weights)):
        for k in range(K):
            m = mask[:, q * K + k]
            logits = model(torch.where(m, MASK, ids), attention_mask=attn)
            lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[..., None])[..., 0]
            total = total + (w / K) * (lp * m).sum(dim=1) / t
    return total


def test_loss_and_gradient_equal_the_hand_written_objective():
    """Away from θ_old, μ = 2 at iteration 1, with KL: the plug-in's proxy backward (one copy's graph at a time)
    gives the value and gradient of mean(−min(ρA, clip(ρ)A)) + β mean(k3(Ê, Ê_ref)), ρ = exp((Ê − Ê_old) / R),
    written out by hand with autograd through every forward."""
    batch = toy_rollout_batch()
    model, ref = micro_llada(0), micro_llada(3)
    eps, beta = 0.05, 0.1
    algo = gdpo(quadrature="gauss-2", mc_samples=2, clip_eps=eps, kl_beta=beta)
    adv = algo.advantages(batch.rewards, batch.group_size)
    st = algo.prepare(batch, model, ref, generator=torch.Generator().manual_seed(4), num_iterations=2)
    assert st.rows["mask"].shape[1] == 2 * 2 * 2 and set(st.rows) == {"mask", "p_mask", "old", "ref"}
    _perturb(model, 0.05)
    model.zero_grad()
    m = algo.backward(model, batch, st, adv, loss_scale=0.5, iteration=1)
    got = _grads(model)
    model.zero_grad()
    R = batch.completion_ids.shape[1]
    E = _hand_elbo(model, batch, st.rows["mask"][:, 4:], algo.times, algo.weights, 2)
    rho = torch.exp((E - st.rows["old"][:, 1]) / R)
    pg = -torch.minimum(rho * adv, torch.clamp(rho, 1 - eps, 1 + eps) * adv)
    d = st.rows["ref"][:, 1] - E
    loss = pg.mean() + beta * (torch.exp(d) - d - 1).mean()
    (loss * 0.5).backward()
    want = _grads(model)
    assert m["loss"] == pytest.approx(loss.item(), rel=1e-5)
    assert 0 < m["clip_frac"] < 1  # some rows are clipped at ε = 0.05
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    with pytest.raises(ConfigError, match="no masks"):
        algo.backward(model, batch, st, adv, loss_scale=1.0, iteration=2)


def test_theta_old_ratio_one_and_policy_gradient():
    """μ = 1: Ê_old = Ê (no forward in `prepare`), ρ = 1, loss = −mean(A), gradient = ∇ −mean(A Ê) / R."""
    batch = toy_rollout_batch()
    model = micro_llada(0)
    algo = gdpo()
    adv = algo.advantages(batch.rewards, batch.group_size)
    st = algo.prepare(batch, model, None, generator=torch.Generator().manual_seed(2), num_iterations=1)
    assert set(st.rows) == {"mask", "p_mask"}
    model.zero_grad()
    m = algo.backward(model, batch, st, adv, loss_scale=1.0, iteration=0)
    assert m["loss"] == pytest.approx(-adv.mean().item(), abs=1e-6) and m["ratio"] == pytest.approx(1.0)
    got = _grads(model)
    model.zero_grad()
    R = batch.completion_ids.shape[1]
    (-(adv * _hand_elbo(model, batch, st.rows["mask"], algo.times, algo.weights, 1)).mean() / R).backward()
    for a, b in zip(got, _grads(model)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in got)


def test_k3_kl_is_on_the_raw_sequence_elbo():
    """KL = mean_n exp(Ê_ref − Ê) − (Ê_ref − Ê) − 1 on RAW ELBOs (upstream, unclamped), the reference on the same
    masks; `kl_estimator: k2` gives ½(Ê − Ê_ref)²; neither is divided by R."""
    batch = toy_rollout_batch()
    policy, ref = micro_llada(0), micro_llada(1)
    for kind in ("k3", "k2"):
        algo = gdpo(kl_beta=0.1, kl_estimator=kind)
        st = algo.prepare(batch, policy, ref, generator=torch.Generator().manual_seed(1), num_iterations=1)
        adv = algo.advantages(batch.rewards, batch.group_size)
        m = algo.backward(policy, batch, st, adv, loss_scale=1.0, iteration=0)
        with torch.no_grad():
            E = _hand_elbo(policy, batch, st.rows["mask"], algo.times, algo.weights, 1)
            E_ref = _hand_elbo(ref, batch, st.rows["mask"], algo.times, algo.weights, 1)
        torch.testing.assert_close(st.rows["ref"][:, 0], E_ref, rtol=1e-5, atol=1e-5)
        d = E_ref - E
        want = (torch.exp(d) - d - 1).mean() if kind == "k3" else (0.5 * d ** 2).mean()
        assert m["kl"] == pytest.approx(want.item(), rel=1e-4)
        assert m["loss"] == pytest.approx(-adv.mean().item() + 0.1 * m["kl"], rel=1e-5, abs=1e-6)


def test_micro_batches_give_the_whole_batch_gradient():
    """Masks are drawn for the whole batch in `prepare`: two half micro-batches at loss_scale ½ = the whole."""
    batch = toy_rollout_batch()
    model = micro_llada(0)
    algo = gdpo(kl_beta=0.05)
    st = algo.prepare(batch, model, micro_llada(2), generator=torch.Generator().manual_seed(6), num_iterations=2)
    adv = algo.advantages(batch.rewards, batch.group_size)
    _perturb(model, 0.05)
    model.zero_grad()
    algo.backward(model, batch, st, adv, loss_scale=1.0, iteration=1)
    whole = _grads(model)
    model.zero_grad()
    for rows in (slice(0, 3), slice(3, 6)):
        algo.backward(model, batch.select(rows), st.select(rows), adv[rows], loss_scale=0.5, iteration=1)
    for a, b in zip(whole, _grads(model)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


# --- settings, masks per iteration, backbones --------------------------------------------------------------------

def test_defaults_and_validation():
    algo = gdpo()
    c = algo.config
    assert (c.quadrature, c.mc_samples, c.kl_estimator, c.random_masking, c.elbo_span, c.clip_ratio_c) == (
        "gauss-3", 1, "k3", True, "canvas", None)
    assert len(algo.times) == 3 and algo.copies_per_iteration == 3
    torch.testing.assert_close(algo.advantages(torch.tensor([1.0, 0.0, 0.5]), 3), torch.tensor([0.5, -0.5, 0.0]))
    with pytest.raises(ConfigError, match="not defined"):
        get_algorithm("gdpo")({}, BLOCK)
    for bad, match in (({"quadrature": "simpson"}, "quadrature"), ({"clip_eps": 1.0}, "clip_eps"),
                       ({"advantage": "median"}, "advantage"), ({"mc_samples": 0}, "mc_samples"),
                       ({"elbo_span": "prompt"}, "elbo_span"), ({"num_nodes": 3}, "unknown setting")):
        with pytest.raises(ConfigError, match=match):
            gdpo(**bad)
    with pytest.raises(ConfigError, match="reference"):
        gdpo(kl_beta=0.1).prepare(toy_rollout_batch(), micro_llada(0), None, generator=torch.Generator(),
                                  num_iterations=1)


def test_mask_seeds_per_iteration():
    """random_masking: μ seeds U{0..4095} from the loop's generator, one mask set per iteration (reproducible);
    off: seed 42 for every iteration, the same masks each time (upstream)."""
    batch = toy_rollout_batch()
    algo, model = gdpo(), micro_llada(0)
    st = algo.prepare(batch, model, None, generator=torch.Generator().manual_seed(0), num_iterations=3)
    seeds = st.shared["mask_seeds"]
    assert len(seeds) == 3 and all(0 <= s < 4096 for s in seeds)
    per_it = st.rows["mask"].view(6, 3, 3, -1)
    assert not torch.equal(per_it[:, 0], per_it[:, 1])
    for k, s in enumerate(seeds):
        assert torch.equal(per_it[:, k], algo.draw(batch, s).mask)
    fixed = gdpo(random_masking=False)
    st2 = fixed.prepare(batch, model, None, generator=torch.Generator().manual_seed(0), num_iterations=3)
    assert st2.shared["mask_seeds"] == [42, 42, 42]
    m2 = st2.rows["mask"].view(6, 3, 3, -1)
    assert torch.equal(m2[:, 0], m2[:, 2]) and torch.equal(m2[:, 0], fixed.draw(batch, 42).mask)


def test_dream_backbone_step():
    """Dream's shifted logits (handled by the likelihood module): a finite, non-zero gradient step."""
    model = micro_dream(0)
    assert model.traits.logit_shift == 1
    algo = get_algorithm("gdpo")({"kl_beta": 0.01}, model.traits)
    batch = toy_rollout_batch()
    adv = algo.advantages(batch.rewards, batch.group_size)
    st = algo.prepare(batch, model, micro_dream(1), generator=torch.Generator().manual_seed(0), num_iterations=2)
    model.zero_grad()
    m = algo.backward(model, batch, st, adv, loss_scale=1.0, iteration=1)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and sum(float(g.abs().sum()) for g in grads) > 0
    assert m["elbo"] < 0 and math.isfinite(m["kl"]) and m["elbo_forwards"] == 3
