"""MDPO plug-in (shared/docs/algorithms.md §10.1): step scores / advantages against a hand computation of DARE's
`compute_step_wise_advantage`, top-K selection, λ_t and confidence weighting of `compute_mdpo_policy_loss`, the
gradient on a micro LLaDA against a hand-built objective, and the contract extension (recorded proposals,
`RolloutBatch.grader`)."""

import math

import pytest
import torch

from dare_bench.diffusion.sampling import generate
from dare_bench.errors import ConfigError
from dare_bench.models.base import ModelTraits
from dare_bench.trainers.algorithms import RolloutBatch, get_algorithm
from dare_bench.trainers.algorithms.base import CompletionGrader
from dare_bench.trainers.algorithms.mdpo import select_steps, step_advantages, step_loss, step_scores
from dare_bench.trainers.loop import _split_trajectory

from rl_fakes import EOS, MASK, PAD, micro_dream, micro_llada

TRAITS = ModelTraits(family="llada", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=0,
                     attention="bidirectional")


# --- step scores and advantages -------------------------------------------------------------------------------------

def test_step_scores_by_hand():
    r = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    # k=0: (0-0)+1 + mean(1,1,0) ; k=1: (1-0)+1 + mean(1,0) ; k=2: (1-1)+1 + mean(0) ; k=3: (0-1)+1 + r_3
    want = torch.tensor([[1 + 2 / 3, 2 + 0.5, 1 + 0.0, 0 + 0.0]])
    assert torch.allclose(step_scores(r), want)
    assert torch.allclose(step_scores(torch.tensor([[0.7]])), torch.tensor([[1.7 + 0.7]]))


def test_step_advantages_group_and_step_normalised():
    r = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 1.0],   # prompt 0, G = 3
                      [0.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.0, 1.0, 0.0]])  # prompt 1
    s = step_scores(r)
    a = step_advantages(r, 3)
    for g in range(2):
        blk = s[3 * g:3 * g + 3]
        want = (blk - blk.mean(0)) / (blk.std(0, unbiased=True) + 1e-6)
        assert torch.allclose(a[3 * g:3 * g + 3], want, atol=1e-6)
    # one hand value: prompt 0, step 0 scores 1+1, 1+0.5, 2+1 -> mean 2.1667, std 0.7638
    s00 = torch.tensor([2.0, 1.5, 3.0])
    assert math.isclose(float(a[0, 0]), float((2.0 - s00.mean()) / (s00.std() + 1e-6)), rel_tol=1e-5)
    plain = step_advantages(r, 3, std_normalise=False)
    assert torch.allclose(plain[:3], s[:3] - s[:3].mean(0))
    assert torch.equal(step_advantages(r, 1), s)  # a group of one: DARE's mean 0, std 1


def test_top_k_steps_by_summed_absolute_advantage():
    a = torch.tensor([[0.1, -3.0, 0.5, 0.0], [0.2, 1.0, -0.6, 2.5]])  # sums of |A|: 0.3, 4.0, 1.1, 2.5
    assert select_steps(a, 2).tolist() == [1, 3]  # sorted ascending, as DARE
    assert select_steps(a, 3).tolist() == [1, 2, 3]
    assert select_steps(a, None).tolist() == [0, 1, 2, 3]
    assert select_steps(a, 9).tolist() == [0, 1, 2, 3]


# --- the per-step loss ------------------------------------------------------------------------------------------------

def test_step_loss_lambda_and_confidence_by_hand():
    logp = torch.tensor([[-1.0, -2.0, -0.5, -1.5], [-0.2, -0.3, -0.4, -0.6]])
    old = logp - torch.tensor([[0.0, 0.5, -0.1, 0.0], [0.0, 0.0, 0.0, 0.0]])  # ratio e^0, e^0.5, e^-0.1, 1
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    conf = torch.tensor([[0.9, 0.5, 0.2, 0.7], [0.4, 1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, -2.0])
    out = step_loss(logp, old, adv, mask, conf, completion_length=4, clip_low=0.2, clip_high=0.2)
    # row 0: λ = 4/3, A = 1: per token max(-ρ, -clip ρ) = -min(ρ, clip ρ) -> -1, -1.2, -e^-0.1
    r0 = (4 / 3) * (0.9 * -1.0 + 0.5 * -1.2 + 0.2 * -math.exp(-0.1)) / 3
    # row 1: λ = 4, A = -2, ρ = 1: 2 * 4 * 0.4 / 1
    r1 = 4 * 2.0 * 0.4
    assert torch.allclose(out["rows"], torch.tensor([r0, r1]), atol=1e-6)
    assert torch.allclose(out["lambda"], torch.tensor([4 / 3, 4.0]))
    assert math.isclose(float(out["clip_frac"]), 1 / 4)  # the e^0.5 token of row 0
    ref = logp + 0.3
    kl = step_loss(logp, old, adv, mask, torch.ones_like(conf), completion_length=4, clip_low=0.2,
                   clip_high=0.2, beta=0.5, ref_logp=ref)
    plain = step_loss(logp, old, adv, mask, torch.ones_like(conf), completion_length=4, clip_low=0.2,
                      clip_high=0.2)
    # ½ (0.3)² per token, weighted by β, not by λ
    assert torch.allclose(kl["rows"] - plain["rows"], torch.full((2,), 0.5 * 0.045), atol=1e-6)


# --- a real rollout through the plug-in -----------------------------------------------------------------------------

def _rollout(model, temperature=0.9):
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 10, (2, 5), generator=g).repeat_interleave(2, dim=0)
    am = torch.ones(4, 5, dtype=torch.long)
    prompt[2:, 0], am[2:, 0] = PAD, 0
    out = generate(model, prompt, am, temperature=temperature, return_trajectory=True, gen_length=8, steps=4,
                   block_length=4, generator=torch.Generator().manual_seed(1))
    comp = out.canvas[:, 5:]
    calls = []

    def grade_row(r, toks):  # reward: fraction of digit tokens, so the step rewards differ
        calls.append((r, tuple(toks)))
        return sum(t < 10 for t in toks) / len(toks)

    grader = CompletionGrader(grade_row, tuple(range(4)))
    rewards = grader(comp)
    batch = RolloutBatch(prompt, am, comp, torch.ones_like(comp), rewards, group_size=2,
                         trajectories=_split_trajectory(out.trajectory, 4), grader=grader)
    return batch, out, calls


def test_the_sampler_records_proposals_and_their_probabilities():
    model = micro_llada(0)
    batch, out, _ = _rollout(model)
    steps = out.trajectory.steps
    assert len(steps) == 4
    for k, s in enumerate(steps):
        was_masked = s.state == MASK
        # every mask position the step saw is proposed (a micro model may draw the mask id itself); committed
        # ones are what the step wrote
        assert torch.equal(s.proposal[~was_masked], s.state[~was_masked])
        after = steps[k + 1].state if k + 1 < len(steps) else out.canvas
        assert torch.equal(after[s.unmasked], s.proposal[s.unmasked])
        assert bool((s.proposal_prob[was_masked] > 0).all()) and bool((s.proposal_prob[~was_masked] == 0).all())
    # the probability is softmax(logits / T) of the proposed token, on the recorded state
    s = steps[1]
    with torch.no_grad():
        logits = model(s.state, **out.trajectory.model_kwargs)
        logits = logits.logits if hasattr(logits, "logits") else logits
    want = torch.softmax(logits.float() / 0.9, -1).gather(-1, s.proposal.unsqueeze(-1)).squeeze(-1)
    m = s.state == MASK
    assert torch.allclose(s.proposal_prob[m], want[m], atol=1e-5)


def test_prepare_grades_every_step_and_selects_top_k():
    model = micro_llada(0)
    batch, out, calls = _rollout(model)
    calls.clear()
    algo = get_algorithm("mdpo")({"top_k_steps": 2}, model.traits)
    state = algo.prepare(batch, model, None, generator=torch.Generator(), num_iterations=1)
    assert len(calls) == 4 * 4  # every row at every step
    props = torch.stack([s.proposal[:, 5:] for s in out.trajectory.steps], 1)
    want_r = torch.tensor([[sum(t < 10 for t in props[i, k].tolist()) / 8 for k in range(4)] for i in range(4)])
    assert torch.allclose(state.rows["step_rewards"], want_r)
    adv = step_advantages(want_r, 2)
    sel = select_steps(adv, 2)
    assert state.shared["steps"] == sel.tolist()
    assert torch.allclose(state.rows["adv"], adv[:, sel])
    for j, k in enumerate(sel.tolist()):
        st = out.trajectory.steps[k]
        assert torch.equal(state.rows["states"][:, j], st.state)
        assert torch.equal(state.rows["mask"][:, j], (st.state[:, 5:] == MASK) & (st.proposal[:, 5:] != MASK))
        assert torch.allclose(state.rows["conf"][:, j], st.proposal_prob[:, 5:])
    off = get_algorithm("mdpo")({"top_k_steps": 2, "confidence_weighting": False}, model.traits)
    st2 = off.prepare(batch, model, None, generator=torch.Generator(), num_iterations=1)
    assert bool((st2.rows["conf"] == 1).all())


def test_gradient_matches_the_hand_built_objective():
    """backward's gradient = ∇ of (1/(N K')) Σ_{rows, selected k} Σ_{i∈M_k} c_i (−A λ ρ_i) / |M_k| at θ = θ_old."""
    model = micro_llada(0)
    batch, out, _ = _rollout(model)
    algo = get_algorithm("mdpo")({"top_k_steps": 3}, model.traits)
    state = algo.prepare(batch, model, None, generator=torch.Generator(), num_iterations=1)
    model.zero_grad()
    metrics = algo.backward(model, batch, state, torch.zeros(4), loss_scale=1.0, iteration=0)
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    total = 0.0
    sel = state.shared["steps"]
    for j, k in enumerate(sel):
        st = out.trajectory.steps[k]
        logits = model(st.state, **out.trajectory.model_kwargs)
        logits = logits.logits if hasattr(logits, "logits") else logits
        lp = torch.log_softmax(logits.float()[:, 5:], -1).gather(-1, st.proposal[:, 5:].unsqueeze(-1)).squeeze(-1)
        m = ((st.state[:, 5:] == MASK) & (st.proposal[:, 5:] != MASK)).float()
        lam = 8 / m.sum(1)
        ratio = torch.exp(lp - lp.detach())
        a = state.rows["adv"][:, j]
        per = -(a[:, None] * ratio) * lam[:, None] * st.proposal_prob[:, 5:] * m
        total = total + (per.sum(1) / m.sum(1)).sum() / (4 * len(sel))
    total.backward()
    assert math.isclose(metrics["loss"], float(total.detach()), rel_tol=1e-5, abs_tol=1e-7)
    for g, p in zip(got, model.parameters()):
        assert torch.allclose(g, p.grad, atol=1e-6), "gradient differs from the hand-built objective"
    assert metrics["steps_selected"] == 3 and metrics["steps"] == 4


def test_micro_batches_sum_to_the_full_batch():
    model = micro_llada(0)
    batch, _, _ = _rollout(model)
    algo = get_algorithm("mdpo")({"top_k_steps": 2, "kl_beta": 0.1}, model.traits)
    ref = micro_llada(1)
    state = algo.prepare(batch, model, ref, generator=torch.Generator(), num_iterations=2)
    assert state.rows["old_logp"].shape == (4, 2, 8) and state.rows["ref_logp"].shape == (4, 2, 8)
    model.zero_grad()
    algo.backward(model, batch, state, torch.zeros(4), loss_scale=1.0, iteration=0)
    full = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    for sl in (slice(0, 2), slice(2, 4)):
        algo.backward(model, batch.select(sl), state.select(sl), torch.zeros(2), loss_scale=0.5, iteration=0)
    for a, p in zip(full, model.parameters()):
        assert torch.allclose(a, p.grad, atol=1e-6)


# the official diffusion_generate (alg origin / entropy, DARE's Dream MDPO conf_alg), Fast-dLLM blocks
@pytest.mark.parametrize("block_length, alg", [(None, None), (None, "entropy"), (4, "entropy")])
def test_dream_records_proposals_and_trains(block_length, alg):
    model = micro_dream(0)
    prompt = torch.randint(0, 10, (4, 5), generator=torch.Generator().manual_seed(0))
    extra = {} if block_length is None else {"block_length": block_length}
    if alg is not None:
        extra["alg"] = alg
    out = generate(model, prompt, None, temperature=0.5, return_trajectory=True, gen_length=8, steps=4,
                   generator=torch.Generator().manual_seed(1), **extra)
    for s in out.trajectory.steps:
        m = s.state == MASK
        assert torch.equal(s.proposal[~m], s.state[~m]) and bool((s.proposal_prob[~m] == 0).all())
    comp = out.canvas[:, 5:]
    grader = CompletionGrader(lambda r, toks: sum(t < 10 for t in toks) / len(toks), tuple(range(4)))
    batch = RolloutBatch(prompt, torch.ones_like(prompt), comp, torch.ones_like(comp), grader(comp), 2,
                         trajectories=_split_trajectory(out.trajectory, 4), grader=grader)
    algo = get_algorithm("mdpo")({"top_k_steps": 2}, model.traits)
    state = algo.prepare(batch, model, None, generator=torch.Generator(), num_iterations=1)
    model.zero_grad()
    metrics = algo.backward(model, batch, state, torch.zeros(4), loss_scale=1.0, iteration=0)
    assert math.isfinite(metrics["loss"]) and metrics["scored_tokens"] > 0


# --- contract and settings -------------------------------------------------------------------------------------------

def test_grader_select_keeps_rows_aligned():
    seen = []
    g = CompletionGrader(lambda r, toks: (seen.append(r), float(r))[1], (0, 1, 2, 3))
    assert g.select(slice(2, 4))(torch.zeros(2, 3, dtype=torch.long)).tolist() == [2.0, 3.0]
    assert g.select([3, 0])(torch.zeros(2, 3, dtype=torch.long)).tolist() == [3.0, 0.0]
    b = RolloutBatch(torch.zeros(4, 2, dtype=torch.long), torch.ones(4, 2, dtype=torch.long),
                     torch.zeros(4, 3, dtype=torch.long), torch.ones(4, 3, dtype=torch.long), torch.zeros(4), 2,
                     grader=g)
    assert b.select(torch.tensor([1, 2])).grader.rows == (1, 2)
    with pytest.raises(ValueError):
        g(torch.zeros(3, 3, dtype=torch.long))


def test_the_loop_grader_grades_like_the_rollouts():
    """`rollout_batch`'s grader: mask ids count as EOS, cut at the first stop token, same reward as the rollout."""
    from dare_bench.trainers.loop import rollout_batch

    from rl_fakes import CharTokenizer, ReverseTask

    model = micro_llada(0)
    task = ReverseTask()
    items = task.items
    batch, _ = rollout_batch(model, CharTokenizer(), task, items, [0, 1], 2,
                             {"gen_length": 4, "steps": 4, "temperature": 0.9},
                             generator=torch.Generator().manual_seed(0))
    assert torch.equal(batch.grader(batch.completion_ids), batch.rewards)
    with_mask = batch.completion_ids.clone()
    with_mask[:, 1:] = MASK  # = first token then EOS
    cut = batch.completion_ids.clone()
    cut[:, 1:] = EOS
    assert torch.equal(batch.grader(with_mask), batch.grader(cut))


def test_the_loop_grader_grades_every_step_in_one_batched_call():
    """MDPO grades [N, K, C] proposals: the loop's grader sends all N x K to the task's `grade_many` at once (code
    tasks: concurrent, each distinct program once), with the same rewards as grading row by row, step by step."""
    from dare_bench.trainers.algorithms.base import CompletionGrader
    from dare_bench.trainers.loop import rollout_batch

    from rl_fakes import CharTokenizer, ReverseTask

    class BatchGradedTask(ReverseTask):
        def __init__(self):
            super().__init__()
            self.batches = []

        def grade_many(self, completions, items, grader="dare"):
            self.batches.append(len(completions))
            return [self.grade(c, it, grader) for c, it in zip(completions, items)]

    task = BatchGradedTask()
    batch, _ = rollout_batch(micro_llada(0), CharTokenizer(), task, task.items, [0, 1], 2,
                             {"gen_length": 4, "steps": 4, "temperature": 0.9},
                             generator=torch.Generator().manual_seed(0))
    assert task.batches == [4]  # the rollouts themselves: one call
    g = torch.Generator().manual_seed(3)
    steps = torch.randint(0, 12, (4, 3, 4), generator=g)
    steps[1, 2, 2:] = MASK
    task.batches.clear()
    graded = batch.grader(steps)
    assert task.batches == [12] and graded.shape == (4, 3)
    one_by_one = CompletionGrader(batch.grader.grade_row, batch.grader.rows)  # no batched path: row by row
    want = torch.stack([one_by_one(steps[:, k]) for k in range(3)], dim=1)
    assert torch.equal(graded, want) and len(set(want.flatten().tolist())) > 1
    sub = batch.grader.select([2, 0])
    assert torch.equal(sub(steps[[2, 0]]), want[[2, 0]])


def test_settings_are_checked():
    ok = get_algorithm("mdpo")({}, TRAITS)
    assert ok.config.top_k_steps == 16 and ok.config.confidence_weighting and ok.std_normalise
    assert get_algorithm("mdpo")({"advantage": "mean"}, TRAITS).std_normalise is False
    with pytest.raises(ConfigError, match="contradicts"):
        get_algorithm("mdpo")({"advantage": "mean", "std_normalise": True}, TRAITS)
    with pytest.raises(ConfigError, match="mc_samples"):
        get_algorithm("mdpo")({"mc_samples": 2}, TRAITS)
    with pytest.raises(ConfigError, match="leave_one_out|mean"):
        get_algorithm("mdpo")({"advantage": "leave_one_out"}, TRAITS)
    block = ModelTraits(family="sdar", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=1,
                        attention="block_causal")
    with pytest.raises(ConfigError, match="not defined"):
        get_algorithm("mdpo")({}, block)
