"""ESPO plug-in: the official DARE fixture (every case) and one test per piece that would catch its drift
(shared/docs/algorithms.md §10.4): per-token normalisation of the sequence ELBO ratio, the L+1 levels with the
complement copy (the masking half is in tests/diffusion/test_masking.py), k2 KL on the raw sequence ELBO, the
memory-bounded backward, per-iteration masks."""

import json
import math

import pytest
import torch
from float_bounds import assert_same_up_to_ulps

from dare_bench.diffusion.likelihood import aligned_logits, elbo, token_logprobs
from dare_bench.diffusion.masking import espo_batch_masks
from dare_bench.errors import ConfigError
from dare_bench.models.base import ModelTraits
from dare_bench.trainers.algorithms import RolloutBatch, get_algorithm
from dare_bench.trainers.algorithms.bgpo import elbo_layout
from dare_bench.trainers.algorithms.espo import espo_kl, espo_policy_loss, masked_sequence_mean

from rl_fakes import EOS, MASK, PAD, micro_dream, micro_llada, toy_rollout_batch
from testpaths import LOSSES

TRAITS = ModelTraits(family="llada", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=0,
                     attention="bidirectional")
BLOCK = ModelTraits(family="sdar", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=0,
                    attention="block_causal", block_size=4)


def _batch(**kw) -> RolloutBatch:
    return toy_rollout_batch(**{"n_prompts": 2, "g": 3, "p": 5, "c": 6, "seed": 0, **kw})


def _grads(model):
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def _perturb(model, scale=0.02):
    with torch.no_grad():
        for prm in model.parameters():
            prm.add_(scale * torch.randn(prm.shape, generator=torch.Generator().manual_seed(prm.numel())))


# --- official fixture ---------------------------------------------------------------------------------------------

def test_official_fixture_every_case():
    """DARE `compute_policy_loss_espo`, `compute_espo_kl` and `compute_espo_sequence_elbo` (run unmodified):
    values, metrics and gradients bit for bit (the policy loss and k3: exp's last bit may differ between CPUs; the
    sequence ELBO value: summation order, see below)."""
    from safetensors.torch import load_file

    from dare_bench.diffusion.likelihood import elbo_term_from_logits

    path = LOSSES / "espo"
    cases = json.loads((path / "cases.json").read_text())["cases"]
    T = load_file(str(path / "cases.safetensors"))
    assert len(cases) == 12
    seen = set()
    for case in cases:
        name, a = case["name"], case["call_args"]
        x = {k: T[v["key"]] for k, v in case["inputs"].items()}
        out = {k: T[v["key"]] for k, v in case["outputs"].items()}
        grads = {k: T[v["key"]] for k, v in case.get("grads", {}).items()}
        if name.startswith("loss"):
            lt = x["l_theta"].clone().requires_grad_(True)
            loss, cf, kl, cfl = espo_policy_loss(x["old_l_theta"], lt, x["advantages"], x["response_mask"],
                                                 clip_low=a["cliprange_low"], clip_high=a["cliprange_high"])
            loss.backward()
            # ρ = exp(...): exp's last float64 bit differs between CPUs (measured on an AMD EPYC: loss 2.8e-17 =
            # 1 ulp, gradient 3.5e-18), so value and gradient take the k3 bound below; the ratio-free outputs
            # (clip fractions, ppo_kl) stay bit for bit
            exp_tol = dict(rtol=0, atol=4.5e-16)
            torch.testing.assert_close(loss, out["pg_loss"], **exp_tol, msg=name)
            assert torch.equal(cf, out["pg_clipfrac"]) and torch.equal(cfl, out["pg_clipfrac_lower"]), name
            assert torch.equal(kl, out["ppo_kl"]), name
            torch.testing.assert_close(lt.grad, grads["l_theta"], **exp_tol, msg=name)
        elif name.startswith("kl"):
            s = x["sequence_elbo"].clone().requires_grad_(True)
            per = espo_kl(s, x["ref_sequence_elbo"], a["normalization_length"], a["kl_estimator"])
            kl = per.mean()
            kl.backward()
            tol = dict(rtol=0, atol=4.5e-16) if a["kl_estimator"] == "k3" else dict(rtol=0, atol=0)
            torch.testing.assert_close(per, out["kl"], **tol)
            torch.testing.assert_close(kl, out["kl_loss"], **tol)
            torch.testing.assert_close(s.grad, grads["sequence_elbo"], **tol)
        else:
            assert name.startswith("seq_elbo_row")
            row, rv = int(name[len("seq_elbo_row")]), name.endswith("True")
            # the masks come from our sampler (the official draw: seed 11, 4 rows of one 8-of-10 response)
            am = torch.zeros(4, 14, dtype=torch.long)
            am[:, :12] = 1
            draw = espo_batch_masks(am, 4, generator=torch.Generator().manual_seed(11), n=1)
            assert torch.equal(draw.mask[row, 0], x["mask_indices"]) and torch.equal(draw.p_mask[row, 0],
                                                                                     x["p_mask"])
            one = draw.rows([row])
            logits = x["logits"][None].clone().requires_grad_(True)
            comp = x["coupled_logits"][None].clone().requires_grad_(True)
            term = elbo_term_from_logits(logits, x["targets"][None], one, 0,
                                         complement_logits=comp if rv else None)
            # DARE sums the masked and the complement half each, then halves; we halve per token, then sum: the
            # order of the float64 additions differs (measured: <= 3.6e-15 on |E| ~ 20, 1 ulp), gradients agree
            torch.testing.assert_close(term.total[0], out["sequence_elbo"], rtol=0, atol=1e-14)
            if term.total.requires_grad:
                gl, gc = torch.autograd.grad(term.total.sum(), (logits, comp), allow_unused=True)
                assert_same_up_to_ulps(gl[0], grads["logits"], what=name)
                assert_same_up_to_ulps(torch.zeros_like(grads["coupled_logits"]) if gc is None else gc[0],
                                       grads["coupled_logits"], what=name)
        seen.add(name.split("_")[0])
    assert seen == {"loss", "kl", "seq"}


def test_fixture_loss_counts_empty_rows_and_has_no_dual_clip():
    """Row 3 of `loss_token_varying_empty_row_asym` has no valid token: its A is 0 and it still counts."""
    g = torch.Generator().manual_seed(0)
    old = torch.randn(4, 5, generator=g, dtype=torch.float64)
    new = old + 0.5
    mask = torch.ones(4, 5, dtype=torch.long)
    mask[3] = 0
    adv = -torch.ones(4, 5, dtype=torch.float64)
    loss, *_ = espo_policy_loss(old, new, adv, mask, clip_low=0.2)
    r = torch.exp(masked_sequence_mean(new, mask) - masked_sequence_mean(old, mask))
    want = (r[:3].sum() + 0.0) / 4  # A < 0, ρ = e^0.5 unclipped (no dual clip); the empty row adds 0 / 4
    torch.testing.assert_close(loss, want)
    capped, *_ = espo_policy_loss(old, old + 5.0, adv, mask, clip_low=0.2, clip_ratio_c=3.0)
    assert capped.item() == pytest.approx(3.0 * 3 / 4)


# --- plug-in: settings ----------------------------------------------------------------------------------------------

def test_validate_and_defaults():
    E = get_algorithm("espo")
    algo = E({}, TRAITS)
    c = algo.config
    assert (c.mc_samples, c.kl_estimator, c.reduce_var, c.stratify_rows, c.clip_ratio_c) == (2, "k2", True, True,
                                                                                            None)
    torch.testing.assert_close(algo.advantages(torch.tensor([1.0, 0.0, 0.5]), 3),
                               torch.tensor([0.75, -0.75, 0.0]))  # leave-one-out (DARE's rloo)
    assert E({"clip_eps": 0.0}, TRAITS).config.clip_eps == 0.0  # DARE's countdown recipe
    with pytest.raises(ConfigError, match="not defined"):
        E({}, BLOCK)
    with pytest.raises(ConfigError, match="advantage"):
        E({"advantage": "median"}, TRAITS)
    with pytest.raises(ConfigError, match="clip_eps"):
        E({"clip_eps": 1.0}, TRAITS)
    with pytest.raises(ConfigError, match="kl_estimator"):
        E({"kl_estimator": "k9"}, TRAITS)
    with pytest.raises(ConfigError, match="unknown setting"):
        E({"reduce_variance": True}, TRAITS)


# --- the pieces -----------------------------------------------------------------------------------------------------

def test_per_token_normalisation_uses_the_padded_length():
    """b = mean_m E_m / R, R = the padded completion length (DARE's response_length, the official
    logits_to_keep), NOT the number of valid tokens; ρ = exp(b − b_old) = exp((E − E_old) / R)."""
    batch = _batch()
    model = micro_llada(0)
    algo = get_algorithm("espo")({"mc_samples": 2}, TRAITS)
    st = algo.prepare(batch, model, None, generator=torch.Generator().manual_seed(0), num_iterations=1)
    ids, attn, _ = elbo_layout(batch)
    R = batch.completion_ids.shape[1]
    assert R == 6 and batch.completion_mask.sum(dim=1).tolist() != [6] * 6
    with torch.no_grad():
        b = algo.normalized(model, batch, st.rows, 0)
        E = elbo(model, ids, algo._draw(batch, st.rows), attention_mask=attn, reduce_var=True).terms
    torch.testing.assert_close(b, (E / R).mean(dim=1))
    # the objective's ratio: a shift of the raw ELBO by R·δ is a ratio of e^δ (inside the clip: −A e^δ)
    adv = torch.tensor([1.0, -0.5, 0.25, 2.0, -1.0, 0.5])
    delta = 0.05
    loss, metrics, _ = algo.objective(b + delta, b, None, adv, batch.completion_mask, R)
    torch.testing.assert_close(loss, (-adv * math.exp(delta)).mean(), rtol=1e-6, atol=1e-7)
    assert metrics["ppo_kl"] == pytest.approx(-delta, rel=1e-5) and metrics["clip_frac"] == 0.0


def test_sequence_elbo_is_half_masked_plus_half_complement():
    """E = ½ [−Σ_masked CE(x̃)/p − Σ_(valid, unmasked) CE(x̃ᶜ)/(L/(L+1) − p)], p = k/(L+1), from the model's
    logits by hand; reduce_var=false: the masked term alone."""
    batch = _batch()
    model = micro_llada(0)
    ids, attn, P = elbo_layout(batch)
    for rv in (True, False):
        algo = get_algorithm("espo")({"mc_samples": 3, "reduce_var": rv, "stratify_rows": False}, TRAITS)
        st = algo.prepare(batch, model, None, generator=torch.Generator().manual_seed(3), num_iterations=1)
        valid = batch.completion_mask.bool()
        L = valid.sum(dim=1)
        with torch.no_grad():
            for k in range(3):
                m = st.rows["mask"][:, k]
                counts = m[:, P:].sum(dim=1)
                p = counts.float() / (L + 1).float()
                assert torch.equal(st.rows["p_mask"][:, k, P], p)  # L+1 levels, k = 0 allowed
                lp = token_logprobs(aligned_logits(model, torch.where(m, MASK, ids), attention_mask=attn), ids)
                masked = (lp[:, P:] * m[:, P:]).sum(dim=1) / torch.where(counts > 0, p, torch.ones_like(p))
                want = masked
                if rv:
                    cm = valid & ~m[:, P:]
                    comp_ids = ids.clone()
                    comp_ids[:, P:] = torch.where(cm, MASK, ids[:, P:])
                    lpc = token_logprobs(aligned_logits(model, comp_ids, attention_mask=attn), ids)[:, P:]
                    pc = L.float() / (L.float() + 1.0) - p
                    pc = torch.where(pc > 0, pc, torch.ones_like(pc))  # k = L: no complement token
                    want = (masked + (lpc * cm).sum(dim=1) / pc) / 2
                got = algo.sequence_elbo(model, batch, st.rows, k)
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_k2_kl_is_on_the_raw_sequence_elbo():
    """KL = mean_n ½ (E − E_ref)² / R on raw ELBOs with the reference on the same masks (applying k2 to the
    normalised b instead would be R times smaller)."""
    batch = _batch()
    policy, ref = micro_llada(0), micro_llada(1)
    algo = get_algorithm("espo")({"mc_samples": 2, "kl_beta": 0.1}, TRAITS)
    st = algo.prepare(batch, policy, ref, generator=torch.Generator().manual_seed(1), num_iterations=1)
    adv = algo.advantages(batch.rewards, batch.group_size)
    m = algo.backward(policy, batch, st, adv, loss_scale=1.0, iteration=0)
    ids, attn, _ = elbo_layout(batch)
    R = batch.completion_ids.shape[1]
    with torch.no_grad():
        draw = algo._draw(batch, st.rows)
        E = elbo(policy, ids, draw, attention_mask=attn, reduce_var=True).mean
        E_ref = elbo(ref, ids, draw, attention_mask=attn, reduce_var=True).mean
    want = (0.5 * (E - E_ref) ** 2 / R).mean()
    assert m["kl"] == pytest.approx(want.item(), rel=1e-5)
    assert m["kl"] > 0 and m["loss"] == pytest.approx(-adv.mean().item() + 0.1 * m["kl"], rel=1e-5, abs=1e-6)


def test_theta_old_loss_and_gradient():
    """At θ = θ_old: ρ = 1, loss = −mean(A), gradient = ∇ of −mean(A · b) (one backward per half-copy)."""
    batch = _batch()
    model = micro_llada(0)
    algo = get_algorithm("espo")({"mc_samples": 2}, TRAITS)
    adv = algo.advantages(batch.rewards, batch.group_size)
    st = algo.prepare(batch, model, None, generator=torch.Generator().manual_seed(2), num_iterations=1)
    assert set(st.rows) == {"mask", "p_mask", "p_complement"}  # μ = 1, no KL: no forward in prepare
    model.zero_grad()
    m = algo.backward(model, batch, st, adv, loss_scale=1.0, iteration=0)
    assert m["loss"] == pytest.approx(-adv.mean().item(), abs=1e-6) and m["clip_frac"] == 0.0
    assert m["ratio"] == pytest.approx(1.0)
    got = _grads(model)
    model.zero_grad()
    (-(adv * algo.normalized(model, batch, st.rows, 0)).mean()).backward()
    for a, b in zip(got, _grads(model)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in got)


def test_per_iteration_masks_old_terms_and_full_graph_gradient():
    """μ = 2: a distinct mask set per update iteration (DARE's [B, I, M, S]); b_old of iteration 1 is θ_old's on
    iteration 1's masks; away from θ_old the proxy-gradient backward == autograd through the whole objective."""
    batch = _batch()
    model, ref = micro_llada(0), micro_llada(3)
    algo = get_algorithm("espo")({"mc_samples": 2, "kl_beta": 0.1, "kl_estimator": "k2", "clip_eps": 0.05},
                                 TRAITS)
    adv = algo.advantages(batch.rewards, batch.group_size)
    st = algo.prepare(batch, model, ref, generator=torch.Generator().manual_seed(4), num_iterations=2)
    assert st.rows["mask"].shape == (6, 4, 11) and st.rows["old"].shape == (6, 2) and st.rows["ref"].shape == (6, 2)
    assert not torch.equal(st.rows["mask"][:, :2], st.rows["mask"][:, 2:])
    with torch.no_grad():
        torch.testing.assert_close(st.rows["old"][:, 1], algo.normalized(model, batch, st.rows, 1))
        torch.testing.assert_close(st.rows["ref"][:, 0], algo.normalized(ref, batch, st.rows, 0))
    _perturb(model, 0.05)
    model.zero_grad()
    m = algo.backward(model, batch, st, adv, loss_scale=0.25, iteration=1)
    got = _grads(model)
    model.zero_grad()
    b = algo.normalized(model, batch, st.rows, 1)
    loss, _, _ = algo.objective(b, st.rows["old"][:, 1], st.rows["ref"][:, 1], adv, batch.completion_mask, 6)
    (loss * 0.25).backward()
    assert m["loss"] == pytest.approx(loss.item(), rel=1e-5)
    for a, b_ in zip(got, _grads(model)):
        torch.testing.assert_close(a, b_, rtol=1e-4, atol=1e-7)
    with pytest.raises(ConfigError, match="no masks"):
        algo.backward(model, batch, st, adv, loss_scale=1.0, iteration=2)


def test_rows_are_stratified_only_when_lengths_agree():
    """Equal completion lengths (L = 6 valid): one k spread over the 6 rows gives 6 distinct of the 7 levels;
    unequal lengths or stratify_rows=false: one independent level per row."""
    batch = _batch(first_end=6, pad_second_group=False)  # every row: 6 scored tokens
    algo = get_algorithm("espo")({"mc_samples": 3}, TRAITS)
    st = algo.prepare(batch, None, None, generator=torch.Generator().manual_seed(0), num_iterations=1)
    counts = st.rows["mask"][:, :, 5:].sum(dim=-1)  # [6 rows, 3 copies]
    for k in range(3):
        assert len(set(counts[:, k].tolist())) == 6 and counts[:, k].max() <= 6
    free = get_algorithm("espo")({"mc_samples": 3, "stratify_rows": False}, TRAITS)
    st2 = free.prepare(batch, None, None, generator=torch.Generator().manual_seed(0), num_iterations=1)
    c2 = st2.rows["mask"][:, :, 5:].sum(dim=-1)
    assert (c2 >= 0).all() and (c2 <= 6).all() and not torch.equal(c2, counts)


def test_micro_training_step_finite_gradients():
    model = micro_llada(0)
    algo = get_algorithm("espo")({"mc_samples": 2, "kl_beta": 0.01}, TRAITS)
    batch = _batch()
    adv = algo.advantages(batch.rewards, batch.group_size)
    st = algo.prepare(batch, model, micro_llada(1), generator=torch.Generator().manual_seed(0), num_iterations=1)
    model.zero_grad()
    m = algo.backward(model, batch, st, adv, loss_scale=1.0, iteration=0)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0
    assert m["elbo"] < 0 and math.isfinite(m["kl"])


def test_dream_backbone_step():
    """The official repo also trains Dream (shifted logits, `recipes/run_demo_dream.sh`): a micro Dream step."""
    model = micro_dream(0)
    assert model.traits.logit_shift == 1
    algo = get_algorithm("espo")({"mc_samples": 2}, model.traits)
    batch = _batch()
    adv = algo.advantages(batch.rewards, batch.group_size)
    st = algo.prepare(batch, model, None, generator=torch.Generator().manual_seed(0), num_iterations=1)
    model.zero_grad()
    m = algo.backward(model, batch, st, adv, loss_scale=1.0, iteration=0)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and m["elbo"] < 0
