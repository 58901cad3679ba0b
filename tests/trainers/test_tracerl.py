"""TraceRL plug-in: the trace rounds (shrink), the official step-level returns / GAE by hand, the per-token
log-probs of the recorded states, the policy gradient against a hand-written objective, ratio = 1 at θ = θ_old,
the value model (zero head, clipped loss), checkpointed plug-in state, and the MDLM refusal."""

import pytest
import torch
from test_cj_grpo import _micro_block, _rollout

from dare_bench.errors import ConfigError
from dare_bench.trainers.algorithms import get_algorithm
from dare_bench.trainers.algorithms.cj_grpo import RowTrajectory
from dare_bench.trainers.algorithms.tracerl import (
    collapse_k_unique,
    trace_plan,
    trace_returns,
    zscore_rewards,
)

from rl_fakes import micro_llada


def test_refused_on_mdlm_and_reference_kl():
    T = get_algorithm("tracerl")
    assert T.attention_kinds == ("block_causal",)
    with pytest.raises(ConfigError, match="not defined for llada"):
        T({}, micro_llada(0).traits)
    with pytest.raises(ConfigError):
        T({"kl_beta": 0.1}, _micro_block("sdar").traits)


def test_mdlm_entry_is_one_config_error_at_load(tmp_path, monkeypatch):
    import shutil

    from dare_bench.pipeline import plan
    from dare_bench.registry.loader import default_directory

    d = tmp_path / "repro"
    shutil.copytree(default_directory(), d)
    text = (d / "tracerl-sdar-sudoku.yaml").read_text().replace("sdar", "llada")
    (d / "tracerl-llada-sudoku.yaml").write_text(text)
    monkeypatch.setenv("DARE_BENCH_REPRODUCTIONS", str(d))
    with pytest.raises(ConfigError, match="tracerl is not defined for llada"):
        plan.resolve("tracerl-llada-sudoku", "micro")


def test_zscore_and_collapse_are_the_official_functions():
    r = torch.tensor([1.0, 0.0, 1.0, 0.5, 0.5, 0.5])
    z = zscore_rewards(r, 3)
    g = torch.tensor([1.0, 0.0, 1.0])
    assert torch.allclose(z[:3], (g - g.mean()) / g.std(unbiased=False))
    assert torch.equal(z[3:], torch.zeros(3))  # constant group: 0
    assert collapse_k_unique([5, 3, 3, 9, 7], 2) == [5, 5, 5, 9, 9]
    assert collapse_k_unique([5, 3, 9], 1) == [5, 3, 9]


def _hand_row():
    # two blocks of 4 completion columns; block A decoded by steps 0, 1, 2; block B by steps 3, 4
    S, C = 5, 8
    assign = torch.zeros(S, C, dtype=torch.bool)
    assign[0, [1]] = assign[1, [0, 3]] = assign[2, [2]] = True
    assign[3, [4, 5]] = assign[4, [6, 7]] = True
    row = RowTrajectory(states=torch.zeros(S, C, dtype=torch.long), unmasked=assign, region_end=[4, 4, 4, 8, 8],
                        kind="block", block_size=4)
    scored = torch.ones(C, dtype=torch.bool)
    scored[7] = False  # past the first EOS
    return row, assign, scored


def test_trace_plan_rounds_and_shrink():
    row, assign, scored = _hand_row()
    at, sid, rounds = trace_plan(row, assign, scored, shrink=1)
    assert rounds == 3 and torch.equal(at, assign & scored)
    assert sid.tolist() == [1, 0, 2, 1, 3, 3, 4, -1]
    at2, sid2, rounds2 = trace_plan(row, assign, scored, shrink=2)
    # block A: steps {0, 1} -> one round scored in the state before step 0, {2} alone; block B: {3, 4}
    assert rounds2 == 2
    assert at2[0].tolist() == [True, True, False, True, False, False, False, False]
    assert at2[2].tolist() == [False, False, True, False, False, False, False, False]
    assert at2[3].tolist() == [False, False, False, False, True, True, True, False]
    assert not at2[1].any() and not at2[4].any()
    assert sid2.tolist() == [1, 1, 2, 1, 4, 4, 4, -1]


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (1.0, 0.0), (0.9, 0.5)])
def test_returns_and_gae_by_hand(gamma, lam):
    row, assign, scored = _hand_row()
    _, sid, _ = trace_plan(row, assign, scored, shrink=1)
    V = torch.tensor([0.1, 0.2, -0.3, 0.4, 0.5, -0.1, 0.7, 9.0])
    R, A = trace_returns(0.8, V, sid, gamma, lam)
    # steps 0..4 over the sequence; token sets {1}, {0,3}, {2}, {4,5}, {6}; reward on step 4's tokens
    toks = [[1], [0, 3], [2], [4, 5], [6]]
    vs = [float(V[t].mean()) for t in toks]
    rs = [0.0, 0.0, 0.0, 0.0, 0.8]
    Rs, As = [0.0] * 6, [0.0] * 6
    for i in range(4, -1, -1):
        Rs[i] = rs[i] + gamma * Rs[i + 1]
        v_next = vs[i + 1] if i < 4 else 0.0
        As[i] = rs[i] - vs[i] + gamma * v_next + gamma * lam * As[i + 1]
    for i, t in enumerate(toks):
        v_next = vs[i + 1] if i < 4 else 0.0
        for j in t:
            assert R[j] == pytest.approx(rs[i] + gamma * Rs[i + 1], abs=1e-6)
            assert A[j] == pytest.approx(rs[i] - float(V[j]) + gamma * v_next + gamma * lam * As[i + 1], abs=1e-6)
    assert R[7] == 0 and A[7] == 0
    if gamma == lam == 1.0:  # the official assertion 1: R = reward, A = R − V
        m = sid >= 0
        assert torch.allclose(R[m], torch.full_like(R[m], 0.8)) and torch.allclose(A[m], R[m] - V[m])


def _setup(family="sdar", **cfg):
    model = _micro_block(family, seed=0)
    batch = _rollout(model, block=True, padded=True)
    algo = get_algorithm("tracerl")(cfg, model.traits)
    return model, batch, algo


def test_logprobs_are_direct_forwards_of_the_recorded_states():
    model, batch, algo = _setup()
    rows, score_at, _, _ = algo.plan(batch)
    with torch.no_grad():
        lp = algo.trace_outputs(model, batch, rows, score_at)
    P = batch.prompt_ids.shape[1]
    from dare_bench.models.layers import block_causal_mask

    checked = 0
    for i, r in enumerate(rows):
        for s in range(r.num_steps):
            for c in score_at[i, s].nonzero().flatten().tolist():
                x = r.states[s][r.start:r.region_end[s]][None]
                n = x.shape[1]
                logits = model(x, position_ids=torch.arange(n)[None], attn_mask=block_causal_mask(n, n, 4))
                want = torch.log_softmax(logits[0, P + c - r.start].float(), -1)[batch.completion_ids[i, c]]
                assert float(lp[i, c]) == pytest.approx(float(want), abs=1e-5)
                checked += 1
    assert checked == int(score_at.sum()) > 0


def test_policy_gradient_matches_hand_objective_and_ratio_is_one():
    model, batch, algo = _setup(value_model=False, old_kl_beta=0.01)
    state = algo.prepare(batch, model, None, generator=torch.Generator(), num_iterations=2)
    rows, score_at = algo.plan(batch)[0], state.rows["score_at"]
    adv = algo.advantages(batch.rewards, batch.group_size)
    # θ = θ_old: the stored old log-probs are the current ones, ratio 1, KL 0
    lp = algo.trace_outputs(model, batch, rows, score_at)
    assert torch.allclose(lp[score_at.any(1)], state.rows["old_logp"][score_at.any(1)], atol=1e-6)
    model.zero_grad()
    metrics = algo.backward(model, batch, state, adv, loss_scale=1.0, iteration=0)
    assert metrics["clip_frac"] == 0 and metrics["kl"] == pytest.approx(0, abs=1e-6)
    got = [p.grad.clone() for p in model.parameters()]
    # hand objective: −Σ_tokens A·exp(ℓ − ℓ_old) / (C · rows); its KL term has zero gradient at θ = θ_old
    model.zero_grad()
    lp = algo.trace_outputs(model, batch, rows, score_at)
    m = score_at.any(1).float()
    C = batch.completion_ids.shape[1]
    n_rows = float(state.rows["rounds"].sum())
    loss = -(adv[:, None] * torch.exp(lp - lp.detach()) * m).sum() / C / n_rows
    loss.backward()
    for g, p in zip(got, model.parameters()):
        assert torch.allclose(g, p.grad, atol=1e-6)
    assert metrics["loss"] == pytest.approx(float(loss), abs=1e-6)


def test_value_model_zero_head_advantages_and_training():
    model, batch, algo = _setup(value_rows_per_step=4)
    state = algo.prepare(batch, model, None, generator=torch.Generator(), num_iterations=1)
    assert algo.value_net is not None and algo.value_net is not model
    assert torch.equal(state.rows["old_values"], torch.zeros_like(state.rows["old_values"]))  # zero-init head
    z = zscore_rewards(batch.rewards, batch.group_size)
    m = state.rows["score_at"].any(1)
    # γ = λ = 1 and V = 0: every scored token's return and advantage is the sequence's z-scored reward
    assert torch.allclose(state.rows["token_adv"][m], z[:, None].expand_as(m)[m])
    assert torch.allclose(state.rows["returns"][m], z[:, None].expand_as(m)[m])
    assert state.shared["value_metrics"]["value_steps"] >= 1
    # the value model moved, the policy did not get gradients from it
    assert any(p.abs().sum() > 0 for p in algo.value_net.lm_head.parameters())
    assert all(p.grad is None for p in model.parameters())
    # its state goes into checkpoints and comes back
    st = algo.state_dict()
    other = get_algorithm("tracerl")({"value_rows_per_step": 4}, model.traits)
    other.load_state_dict(st)
    other._ensure_value_model(model)
    for a, b in zip(algo.value_net.state_dict().values(), other.value_net.state_dict().values()):
        assert torch.equal(a, b)
    # policy step with per-token advantages runs and reports the value loss
    metrics = algo.backward(model, batch, state, z, loss_scale=1.0, iteration=0)
    assert "value_loss" in metrics and metrics["scored_tokens"] == float(m.sum())


def test_value_loss_is_the_official_clipped_loss():
    _, _, algo = _setup()
    v = torch.tensor([[0.5, -0.4, 1.0]])
    old = torch.tensor([[0.0, 0.0, 0.9]])
    ret = torch.tensor([[1.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    clipped = old + (v - old).clamp(-0.2, 0.2)
    want = (0.5 * torch.maximum((v - ret) ** 2, (clipped - ret) ** 2) * mask).sum() / 3
    assert float(algo.value_loss(v, old, ret, mask, 3)) == pytest.approx(float(want))


def test_llada2_runs():
    model, batch, algo = _setup("llada2")
    state = algo.prepare(batch, model, None, generator=torch.Generator(), num_iterations=1)
    metrics = algo.backward(model, batch, state, algo.advantages(batch.rewards, 2), loss_scale=1.0, iteration=0)
    assert metrics["scored_tokens"] > 0
