"""CJ-GRPO plug-in: shared/docs/algorithms.md §9 invariants, the official `cj_collapse` fixture (every case) and
the per-step loss of EOSER-ASS-RL `compute_loss`, on real recorded trajectories."""

import json

import pytest
import torch

from dare_bench.diffusion.sampling import generate
from dare_bench.errors import ConfigError, DataError
from dare_bench.models.base import ModelTraits, shift_logits
from dare_bench.trainers.algorithms import RolloutBatch, get_algorithm
from dare_bench.trainers.algorithms.cj_grpo import collapse_step_logprobs, split_trajectory

from rl_fakes import EOS, MASK, PAD, micro_llada
from testpaths import LOSSES


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


def _rollout(model, *, block=False, padded=None, temperature=0.9, seed=1, **settings) -> RolloutBatch:
    """G = 2 completions for each of 2 prompts, with per-row trajectories, as the shared loop would build them.
    The second prompt is one token shorter (left-padded), except for `block` without `padded`."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 10, (2, 5), generator=g).repeat_interleave(2, dim=0)
    am = torch.ones(4, 5, dtype=torch.long)
    if block and not padded:
        prompt, am = prompt[:, 1:], am[:, 1:]  # equal lengths: one batch, one joint trajectory
    else:
        prompt[2:, 0], am[2:, 0] = PAD, 0  # block: decoded row by row, one trajectory per row
    if block:
        settings = {"gen_length": 8, "block_length": 4, "denoising_steps": 2, **settings}
    else:
        settings = {"gen_length": 8, "steps": 4, "block_length": 4, **settings}
    out = generate(model, prompt, am, temperature=temperature, return_trajectory=True,
                   generator=torch.Generator().manual_seed(seed), **settings)
    P = prompt.shape[1]
    comp = out.canvas[:, P:]
    cmask = torch.ones_like(comp)
    for r in range(4):  # scored: up to and including the first EOS
        hits = (comp[r] == EOS).nonzero()
        if len(hits):
            cmask[r, int(hits[0]) + 1:] = 0
    rewards = torch.tensor([1.0, 0.0, 0.3, 0.6])
    if block and padded:  # the sampler's per-row trajectories, through the loop's split as a run would
        from dare_bench.trainers.loop import _split_trajectory

        assert isinstance(out.trajectory, list)
        return RolloutBatch(prompt, am, comp, cmask, rewards, group_size=2,
                            trajectories=_split_trajectory(out.trajectory, 4))
    return RolloutBatch(prompt, am, comp, cmask, rewards, group_size=2, trajectories=split_trajectory(out.trajectory))


def _grads(model):
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


# --- official fixture ---------------------------------------------------------------------------------------------

def test_official_collapse_fixture_every_case():
    path = LOSSES / "cj_collapse"
    from safetensors.torch import load_file

    cases = json.loads((path / "cases.json").read_text())["cases"]
    T = load_file(str(path / "cases.safetensors"))
    assert len(cases) == 5
    for case in cases:
        x = {k: T[v["key"]] for k, v in case["inputs"].items()}
        slp = x["step_log_probs"].clone().requires_grad_(True)
        if "expected_error" in case:
            msg = case["expected_error"]["message"]
            assert case["expected_error"]["type"] == "ValueError"
            with pytest.raises(ValueError) as info:
                collapse_step_logprobs(slp, x["trajectory"], x["response_mask"])
            assert str(info.value) == msg, case["name"]
            continue
        got = collapse_step_logprobs(slp, x["trajectory"], x["response_mask"])
        got.sum().backward()
        out = {k: T[v["key"]] for k, v in case["outputs"].items()}
        assert torch.equal(got, out["collapsed"]), case["name"]
        assert torch.equal(slp.grad, T[case["grads"]["step_log_probs"]["key"]]), case["name"]


# --- settings -----------------------------------------------------------------------------------------------------

def test_validate_and_rollout_overrides():
    C = get_algorithm("cj_grpo")
    assert C.needs_trajectory and C.rollout_overrides == {"return_trajectory": True}
    llada = micro_llada(0).traits
    algo = C({"decoding": "eoser-ass", "ass_blocks": 2}, llada)
    assert algo.rollout_overrides == {"return_trajectory": True, "eoser": True, "ass": True, "ass_blocks": 2,
                                      "eos_max_gamma": 1.0}
    assert C({"decoding": "eoser", "eos_gamma_min": 0.3}, llada).rollout_overrides == {
        "return_trajectory": True, "eoser": True, "eos_min_gamma": 0.3, "eos_max_gamma": 1.0}
    with pytest.raises(ConfigError, match="eos_gamma"):
        C({"eos_gamma_min": 0.3}, llada)
    dream = ModelTraits(family="dream", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=1,
                        attention="bidirectional")
    with pytest.raises(ConfigError, match="EOSER"):
        C({"decoding": "eoser"}, dream)
    with pytest.raises(ConfigError, match="mc_samples"):
        C({"mc_samples": 2}, llada)
    with pytest.raises(ConfigError, match="ass_blocks"):
        C({"decoding": "eoser", "ass_blocks": 2}, llada)
    with pytest.raises(ConfigError, match="loss_mode"):
        C({"loss_mode": "token"}, llada)
    # the EOSER / ASS overrides drive the real sampler: ASS decodes 8 tokens in log2(8) = 3 steps
    m = micro_llada(0)
    prompt = torch.randint(0, 10, (2, 4), generator=torch.Generator().manual_seed(0))
    over = dict(algo.rollout_overrides)
    out = generate(m, prompt, gen_length=8, temperature=0.9, generator=torch.Generator().manual_seed(0), **over)
    assert len(out.trajectory.steps) == 3


# --- trajectory invariants ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("block", [False, True])
def test_trajectory_partition_and_states(block):
    model = _micro_block("sdar") if block else micro_llada(0)
    batch = _rollout(model, block=block)
    algo = get_algorithm("cj_grpo")({}, model.traits)
    rows, assign = algo.trajectory_rows(batch)
    P = batch.prompt_ids.shape[1]
    # (1) U_s partition the completion: every position unmasked by exactly one step
    assert torch.equal(assign.sum(dim=1), torch.ones_like(batch.completion_ids))
    for r in rows:
        # (2) x^(s+1) = x^(s) with U_s filled in
        for s in range(r.num_steps - 1):
            changed = r.states[s + 1] != r.states[s]
            assert torch.equal(changed, r.unmasked[s])
        assert (r.states[0, P:] == MASK).all()


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_padded_block_rollout_scores_each_row_on_its_own_trajectory(family):
    """Prompts of different lengths on a block backbone: the sampler decodes row by row and records one trajectory
    per row (its own step count); each completion token is assigned to the one step that unmasked it and scored
    with the sampler's own call on that row (its pads left out), and a greedy rollout's tokens are the argmax."""
    from dare_bench.models.layers import block_causal_mask

    model = _micro_block(family)
    batch = _rollout(model, block=True, padded=True, temperature=1.0, top_k=1)
    algo = get_algorithm("cj_grpo")({}, model.traits)
    rows, assign = algo.trajectory_rows(batch)
    P, C = batch.prompt_ids.shape[1], batch.completion_ids.shape[1]
    assert [r.start for r in rows] == [0, 0, 1, 1]
    assert rows[0].num_steps != rows[2].num_steps
    # every generated position unmasked at exactly one step; the right fill of the shorter canvases at none
    assert torch.equal(assign.sum(dim=1), (batch.completion_ids != MASK).long())
    assert int(assign[2:, :, C - 1].sum()) == 0  # the shorter prompt's canvas ends before the batch width
    with torch.no_grad():
        for s in range(assign.shape[1]):
            lp = algo.step_logprobs(model, batch, rows, s)
            for i, r in enumerate(rows):
                if s >= r.num_steps:
                    assert bool((lp[i] == 0).all()) and not bool(assign[i, s].any())
                    continue
                a, e = r.start, r.region_end[s]
                logits = model(r.states[s:s + 1, a:e], position_ids=torch.arange(e - a)[None],
                               attn_mask=block_causal_mask(e - a, e - a, r.block_size))
                ref = torch.log_softmax(logits.float(), -1)[0, P - a:]
                n = e - P
                want = ref.gather(-1, batch.completion_ids[i, :n, None])[:, 0]
                torch.testing.assert_close(lp[i, :n], want)
                assert not bool(assign[i, s, n:].any())  # nothing past the step's block end
                hit = assign[i, s, :n]
                assert torch.equal(ref.argmax(-1)[hit], batch.completion_ids[i, :n][hit])


def test_step_logprobs_condition_on_the_recorded_state_greedy_replay():
    """ℓ^(s)_i = log softmax(f(x^(s)))[x_i] with the sampler's own call; a greedy rollout's tokens are the argmax."""
    model = micro_llada(0)
    batch = _rollout(model, temperature=0.0)
    algo = get_algorithm("cj_grpo")({}, model.traits)
    rows, assign = algo.trajectory_rows(batch)
    P = batch.prompt_ids.shape[1]
    with torch.no_grad():
        for s in range(assign.shape[1]):
            lp = algo.step_logprobs(model, batch, rows, s)
            states = torch.stack([r.states[s] for r in rows])
            kw = {k: torch.cat([r.model_kwargs[k] for r in rows]) for k in rows[0].model_kwargs}
            logits = shift_logits(model(states, **kw), 0)[:, P:]
            ref = torch.log_softmax(logits.float(), -1)
            torch.testing.assert_close(lp, ref.gather(-1, batch.completion_ids[..., None])[..., 0])
            # greedy: the committed token is the argmax of the state's distribution
            assert torch.equal(ref.argmax(-1)[assign[:, s]], batch.completion_ids[assign[:, s]])


@pytest.mark.parametrize("mode", ["per_step", "collapsed"])
def test_loss_value_and_gradient_at_theta_old(mode):
    model = micro_llada(0)
    batch = _rollout(model)
    algo = get_algorithm("cj_grpo")({"loss_mode": mode, "kl_beta": 0.04}, model.traits)
    adv = algo.advantages(batch.rewards, batch.group_size)
    st = algo.prepare(batch, model, model, generator=torch.Generator(), num_iterations=2)
    model.zero_grad()
    m = algo.backward(model, batch, st, adv, loss_scale=1.0, iteration=0)
    got = _grads(model)
    assign = st.rows["assign"]
    S = assign.shape[1]
    cm = batch.completion_mask.float()
    a = adv[:, None]
    model.zero_grad()
    rows = [r for r in batch.trajectories]
    steps = torch.stack([algo.step_logprobs(model, batch, rows, s) for s in range(S)], dim=1)  # [N, S, C]
    if mode == "per_step":  # official: (1/S) Σ_s Σ_{U_s} −A ρ / |U_s|, ρ = 1 and KL = 0 at θ = θ_old = ref
        want_loss = sum((-(a * assign[:, s]).sum() / assign[:, s].sum()) for s in range(S)) / S
        surrogate = sum((-(a * steps[:, s] * assign[:, s]).sum() / assign[:, s].sum()) for s in range(S)) / S
    else:  # DARE: collapse then token-mean over the scored tokens
        collapsed = collapse_step_logprobs(steps, assign & batch.completion_mask.bool()[:, None],
                                           batch.completion_mask)
        want_loss = -(a * cm).sum() / cm.sum()
        surrogate = -(a * collapsed * cm).sum() / cm.sum()
    assert m["loss"] == pytest.approx(want_loss.item(), abs=1e-6)
    assert m["clip_frac"] == 0.0 and m["kl"] == pytest.approx(0.0, abs=1e-7)
    surrogate.backward()
    want = _grads(model)
    assert any(g.abs().sum() > 0 for g in want)
    for g1, g2 in zip(got, want):
        torch.testing.assert_close(g1, g2, rtol=1e-4, atol=1e-7)


def test_collapsed_skips_tokens_no_step_unmasked():
    """A scored token the sampler never unmasked (the loop turns a leftover mask id into EOS) is not scored."""
    from dataclasses import replace

    model = micro_llada(0)
    batch = _rollout(model)
    P = batch.prompt_ids.shape[1]
    rows = list(batch.trajectories)
    un = rows[0].unmasked.clone()
    un[:, P] = False  # completion column 0 of row 0: never unmasked
    rows[0] = replace(rows[0], unmasked=un)
    batch = replace(batch, trajectories=rows)
    algo = get_algorithm("cj_grpo")({"loss_mode": "collapsed"}, model.traits)
    st = algo.prepare(batch, model, None, generator=torch.Generator(), num_iterations=1)
    want = batch.completion_mask.bool().clone()
    want[0, 0] = False
    assert torch.equal(st.rows["scored"], want)
    adv = algo.advantages(batch.rewards, batch.group_size)
    m = algo.backward(model, batch, st, adv, loss_scale=1.0, iteration=0)
    w = want.float()
    assert m["loss"] == pytest.approx((-(adv[:, None] * w).sum() / w.sum()).item(), abs=1e-6)
    assert m["scored_tokens"] == float(want.sum())


def test_missing_or_foreign_trajectories_are_refused():
    model = micro_llada(0)
    batch = _rollout(model)
    algo = get_algorithm("cj_grpo")({}, model.traits)
    from dataclasses import replace

    with pytest.raises(DataError, match="trajectory"):
        algo.prepare(replace(batch, trajectories=None), model, None, generator=torch.Generator(), num_iterations=1)
    other = batch.trajectories[2:] + batch.trajectories[:2]  # rows of another prompt
    with pytest.raises(DataError, match="prompt"):
        algo.prepare(replace(batch, trajectories=other), model, None, generator=torch.Generator(),
                     num_iterations=1)


@pytest.mark.parametrize("backbone", ["llada", "sdar", "sdar_padded", "llada2_padded", "llada_eoser_ass"])
def test_micro_training_step(backbone):
    if backbone in ("sdar", "sdar_padded", "llada2_padded"):
        model = _micro_block(backbone.split("_")[0])
        batch = _rollout(model, block=True, padded=backbone.endswith("padded"))
        algo = get_algorithm("cj_grpo")({}, model.traits)
    elif backbone == "llada":
        model = micro_llada(0)
        batch = _rollout(model)
        algo = get_algorithm("cj_grpo")({}, model.traits)
    else:
        model = micro_llada(0)
        algo = get_algorithm("cj_grpo")({"decoding": "eoser-ass"}, model.traits)
        prompt = torch.randint(0, 10, (4, 5), generator=torch.Generator().manual_seed(0))
        out = generate(model, prompt, gen_length=8, temperature=0.9, generator=torch.Generator().manual_seed(3),
                       **algo.rollout_overrides)
        comp = out.canvas[:, 5:]
        batch = RolloutBatch(prompt, torch.ones_like(prompt), comp, torch.ones_like(comp),
                             torch.tensor([1.0, 0.0, 0.3, 0.6]), 2, trajectories=split_trajectory(out.trajectory))
    adv = algo.advantages(batch.rewards, batch.group_size)
    st = algo.prepare(batch, model, None, generator=torch.Generator(), num_iterations=1)
    model.zero_grad()
    m = algo.backward(model, batch, st, adv, loss_scale=1.0, iteration=0)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0
    # every unmasked position is scored once (a random micro model may commit the mask id itself: never unmasked)
    assert m["steps"] == st.rows["assign"].shape[1] and m["scored_tokens"] == float(st.rows["assign"].sum())
