"""EBPO plug-in: shared/docs/algorithms.md §8 invariants and the official DARE fixture (every case)."""

import json

import pytest
import torch

from dare_bench.errors import ConfigError
from dare_bench.models.base import ModelTraits
from dare_bench.trainers.algorithms import RolloutBatch, get_algorithm
from dare_bench.trainers.algorithms.ebpo import composite_elbo, ebpo_kl, ebpo_policy_loss

from rl_fakes import EOS, MASK, PAD, toy_rollout_batch
from testpaths import LOSSES

BLOCK = ModelTraits(family="sdar", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=0,
                    attention="block_causal", block_size=4)
MDLM = ModelTraits(family="llada", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=0,
                   attention="bidirectional")


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


def _batch() -> RolloutBatch:
    return toy_rollout_batch(p=4, c=8, pad_second_group=False, first_end=3)


def _grads(model):
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


# --- official fixture ---------------------------------------------------------------------------------------------

def test_official_fixture_every_case():
    path = LOSSES / "ebpo"
    from safetensors.torch import load_file

    cases = json.loads((path / "cases.json").read_text())["cases"]
    T = load_file(str(path / "cases.safetensors"))
    assert len(cases) == 11
    for case in cases:
        name = case["name"]
        x = {k: T[v["key"]] for k, v in case["inputs"].items()}
        out = {k: T[v["key"]] for k, v in case["outputs"].items()}
        grads = {k: T[v["key"]] for k, v in case.get("grads", {}).items()}
        a = case["call_args"]
        if name.startswith("composite"):
            c = x["elbo_contributions"].clone().requires_grad_(True)
            got = composite_elbo(c, x["contribution_mask"], x.get("timestep_weights"))
            got.sum().backward()
            assert torch.equal(got, out["composite_elbo"]), name
            assert torch.equal(c.grad, grads["elbo_contributions"]), name
        elif name.startswith("loss"):
            lt = x["l_theta"].clone().requires_grad_(True)
            loss, cf, kl, cfl = ebpo_policy_loss(x["old_l_theta"], lt, x["advantages"], x["response_mask"],
                                                 clip_low=a["cliprange_low"], clip_high=a["cliprange_high"])
            loss.backward()
            assert torch.equal(loss, out["pg_loss"]), name  # +inf in loss_negative_adv_overflow, as DARE
            assert cf.item() == out["pg_clipfrac"].item() and cfl.item() == out["pg_clipfrac_lower"].item(), name
            assert kl.item() == out["ppo_kl"].item(), name
            assert torch.equal(lt.grad, grads["l_theta"]), name
        elif name.startswith("kl"):
            s = x["sequence_elbo"].clone().requires_grad_(True)
            per = ebpo_kl(s, x["ref_sequence_elbo"], a["kl_estimator"])
            kl = per[x["sample_mask"]].mean()
            kl.backward()
            if a["kl_estimator"] == "k3":  # exp's last bit differs between CPUs (as in test_common_losses.py)
                torch.testing.assert_close(per, out["per_sample_kl"], rtol=0, atol=4.5e-16)
                torch.testing.assert_close(kl, out["kl_loss"], rtol=0, atol=4.5e-16)
                torch.testing.assert_close(s.grad, grads["sequence_elbo"], rtol=0, atol=4.5e-16)
                continue
            assert torch.equal(per, out["per_sample_kl"]) and torch.equal(kl, out["kl_loss"]), name
            assert torch.equal(s.grad, grads["sequence_elbo"]), name
        else:
            assert name == "pipeline_contrib_to_loss"
            c = x["elbo_contributions"].clone().requires_grad_(True)
            old = composite_elbo(x["old_elbo_contributions"], x["contribution_mask"])
            cur = composite_elbo(c, x["contribution_mask"])
            loss, cf, kl, cfl = ebpo_policy_loss(old, cur, x["advantages"], x["response_mask"],
                                                 clip_low=a["cliprange_low"], clip_high=a["cliprange_high"])
            loss.backward()
            assert torch.equal(old, out["old_composite"]) and torch.equal(cur, out["composite"])
            assert torch.equal(loss, out["pg_loss"]) and kl.item() == out["ppo_kl"].item()
            assert cf.item() == out["pg_clipfrac"].item() and cfl.item() == out["pg_clipfrac_lower"].item()
            assert torch.equal(c.grad, grads["elbo_contributions"])


def test_log_space_clip_equals_naive_ppo_where_exp_is_finite():
    g = torch.Generator().manual_seed(0)
    old = torch.randn(64, generator=g, dtype=torch.float64)
    new = old + 0.6 * torch.randn(64, generator=g, dtype=torch.float64)
    adv = torch.randn(64, generator=g, dtype=torch.float64)
    valid = torch.rand(64, generator=g) > 0.1
    loss, *_ = ebpo_policy_loss(old, new, adv, valid, clip_low=0.2, clip_high=0.28)
    r = torch.exp(new - old)
    naive = torch.maximum(-adv * r, -adv * r.clamp(0.8, 1.28))[valid].mean()
    torch.testing.assert_close(loss, naive, rtol=1e-12, atol=1e-14)
    # the optional dual clip caps the ratio at c for A < 0
    capped, *_ = ebpo_policy_loss(old, old + 5.0, -torch.ones(64, dtype=torch.float64), valid, clip_ratio_c=3.0)
    assert capped.item() == pytest.approx(3.0)


# --- plug-in ------------------------------------------------------------------------------------------------------

def test_validate_refuses_bad_settings():
    E = get_algorithm("ebpo")
    with pytest.raises(ConfigError, match="not defined"):
        E({}, MDLM)  # EBPO on an MDLM backbone
    with pytest.raises(ConfigError, match="block size"):
        E({"block_length": 8}, BLOCK)
    with pytest.raises(ConfigError, match="kl_estimator"):
        E({"kl_estimator": "k9"}, BLOCK)
    with pytest.raises(ConfigError, match="multiple"):
        E({"mc_samples": 6, "n_l": 4}, BLOCK)
    algo = E({}, BLOCK)
    assert algo.config.mc_samples == 16 and algo.config.kl_estimator == "k2" and algo.config.clip_ratio_c is None


def test_every_block_masked_in_every_row_and_old_terms():
    batch = _batch()
    model = _micro_block("sdar")
    algo = get_algorithm("ebpo")({"mc_samples": 4, "kl_beta": 0.05}, model.traits)
    st = algo.prepare(batch, model, _micro_block("sdar", 1), generator=torch.Generator().manual_seed(0),
                      num_iterations=2)
    mask, bidx = st.rows["mask"], st.rows["block_index"]
    for r in range(batch.num_rows):
        for b in range(int(bidx[r].max()) + 1):
            in_block = bidx[r] == b
            assert mask[r][:, in_block].any(dim=-1).all(), (r, b)
        assert not mask[r][:, bidx[r] < 0].any()  # prompt and post-EOS positions never masked
    p = st.rows["p_mask"][st.rows["mask"]]
    assert (p > 0).all() and (p <= 1).all()
    with torch.no_grad():
        torch.testing.assert_close(st.rows["old_composite"], algo.composite(model, batch, st.rows))


def test_theta_old_loss_and_gradient():
    """At θ = θ_old: loss = −mean(A), gradient = ∇ of −mean(A·B) (composite ELBO B)."""
    batch = _batch()
    model = _micro_block("sdar")
    algo = get_algorithm("ebpo")({"mc_samples": 3}, model.traits)
    adv = algo.advantages(batch.rewards, batch.group_size)
    st = algo.prepare(batch, model, None, generator=torch.Generator().manual_seed(1), num_iterations=1)
    model.zero_grad()
    m = algo.backward(model, batch, st, adv, loss_scale=1.0, iteration=0)
    assert m["loss"] == pytest.approx(-adv.mean().item(), abs=1e-6) and m["clip_frac"] == 0.0
    got = _grads(model)
    model.zero_grad()
    (-(adv * algo.composite(model, batch, st.rows)).mean()).backward()
    for a, b in zip(got, _grads(model)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in got)


def test_per_row_backward_equals_full_graph_away_from_old():
    """The proxy-gradient path == autograd through the full composite objective (clip active or not)."""
    batch = _batch()
    model = _micro_block("sdar")
    algo = get_algorithm("ebpo")({"mc_samples": 2, "kl_beta": 0.1, "kl_estimator": "k3"}, model.traits)
    adv = algo.advantages(batch.rewards, batch.group_size)
    st = algo.prepare(batch, model, _micro_block("sdar", 3), generator=torch.Generator().manual_seed(2),
                      num_iterations=2)
    with torch.no_grad():
        for prm in model.parameters():
            prm.add_(0.02 * torch.randn(prm.shape, generator=torch.Generator().manual_seed(prm.numel())))
    model.zero_grad()
    m = algo.backward(model, batch, st, adv, loss_scale=0.25, iteration=1)
    got = _grads(model)
    model.zero_grad()
    B = algo.composite(model, batch, st.rows)
    loss, _, _ = algo.objective(B, st.rows["old_composite"], st.rows["ref_composite"], adv,
                                batch.completion_mask.bool().any(dim=1))
    (loss * 0.25).backward()
    assert m["loss"] == pytest.approx(loss.item(), rel=1e-5)
    for a, b in zip(got, _grads(model)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_micro_training_step(family):
    model = _micro_block(family)
    algo = get_algorithm("ebpo")({"mc_samples": 2}, model.traits)
    batch = _batch()
    adv = algo.advantages(batch.rewards, batch.group_size)
    st = algo.prepare(batch, model, None, generator=torch.Generator().manual_seed(0), num_iterations=1)
    model.zero_grad()
    m = algo.backward(model, batch, st, adv, loss_scale=1.0, iteration=0)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0
    assert m["elbo"] < 0
