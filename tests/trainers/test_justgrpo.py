"""JustGRPO plug-in: packed, chunked AR-order log-probs against one forward per token; the GRPO loss and gradient
against a hand-computed clipped objective (DARE-style token-mean and the official JustGRPO scale); chunk-size
invariance; the block-length-1 rollout requirement; the official advantages."""

import math

import pytest
import torch

from dare_bench.errors import ConfigError
from dare_bench.models.base import ModelTraits
from dare_bench.trainers.algorithms import AlgorithmState, RolloutBatch, get_algorithm
from dare_bench.trainers.algorithms.common import agg_loss
from dare_bench.trainers.algorithms.justgrpo import chunk_agg, position_chunks

from rl_fakes import EOS, MASK, PAD, micro_llada

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


TRAITS = ModelTraits(family="llada", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=0,
                     attention="bidirectional")
C = 7  # completion length: chunk sizes 2, 3, 4, 5 do not divide it
CHUNKS = (1, 2, 3, 4, 5, 7, None)


def _model():
    return micro_llada(0, n_layers=2).double()  # float64: the packed / naive comparison is then exact to ~1e-15


def _batch(n_prompts=2, g=3, p=5, c=C, seed=0) -> RolloutBatch:
    """Left-padded prompts (0, 1, 2 pads), completions ending in EOS at varying places and EOS-padded after it."""
    gen = torch.Generator().manual_seed(seed)
    n = n_prompts * g
    prompt = torch.randint(0, 10, (n, p), generator=gen)
    pmask = torch.ones(n, p, dtype=torch.long)
    for r in range(n):
        pad = r % 3
        prompt[r, :pad] = PAD
        pmask[r, :pad] = 0
    comp = torch.randint(0, 10, (n, c), generator=gen)
    cmask = torch.ones(n, c, dtype=torch.long)
    ends = [2, c, 4, 1, 6, 3][:n]  # first EOS at end - 1 (row 1 has no EOS: all c tokens scored)
    for r, end in enumerate(ends):
        if end < c or r != 1:
            comp[r, end - 1:] = EOS
            cmask[r, end:] = 0
    rewards = torch.tensor([1.0, 0.0, 0.25, 1.0, 1.0, 1.0][:n])  # the second group ties: A = 0 there
    return RolloutBatch(prompt, pmask, comp, cmask, rewards, group_size=g)


def naive_logprobs(model, batch: RolloutBatch, scored: torch.Tensor) -> torch.Tensor:
    """One forward per (row, t): [prompt, o_<t, [M] ...] over the whole canvas, with the row's padding mask."""
    n, c = batch.completion_ids.shape
    p = batch.prompt_ids.shape[1]
    out = [[torch.zeros((), dtype=torch.float64) for _ in range(c)] for _ in range(n)]
    for r in range(n):
        for t in range(c):
            if not scored[r, t]:
                continue
            comp = batch.completion_ids[r].clone()
            comp[t:] = MASK
            x = torch.cat([batch.prompt_ids[r], comp]).unsqueeze(0)
            attn = torch.cat([batch.prompt_mask[r], torch.ones(c, dtype=torch.long)]).unsqueeze(0)
            logits = model(x, attention_mask=attn)
            logits = logits if isinstance(logits, torch.Tensor) else logits.logits
            out[r][t] = torch.log_softmax(logits[0, p + t].double(), -1)[batch.completion_ids[r, t]]
    return torch.stack([torch.stack(row) for row in out])


def _algo(**cfg):
    return get_algorithm("justgrpo")(cfg, TRAITS)


# --- (a) packed, chunked log-probs == one forward per token ----------------------------------------------------------
@pytest.mark.parametrize("score_padding", [False, True])
def test_packed_chunked_logprobs_equal_the_naive_per_position_forwards(score_padding):
    model, batch = _model(), _batch()
    scored = torch.ones(batch.num_rows, C, dtype=torch.bool) if score_padding else batch.completion_mask.bool()
    with torch.no_grad():
        ref = naive_logprobs(model, batch, scored)
        worst = 0.0
        for k in CHUNKS:
            algo = _algo(position_chunk_size=k, score_padding=score_padding)
            got = algo.completion_logprobs(model, batch)
            assert got.shape == (batch.num_rows, C) and got.dtype == torch.float64
            assert torch.equal(got[~scored], torch.zeros_like(got[~scored]))
            worst = max(worst, float((got - ref).abs().max()))
    assert worst < 1e-12, worst
    assert (ref[scored] < 0).all()  # real log-probs, not the zeros of unscored places


def test_packed_logprobs_in_float32_match_to_float_tolerance():
    model, batch = micro_llada(0, n_layers=2), _batch()
    scored = batch.completion_mask.bool()
    with torch.no_grad():
        ref = naive_logprobs(model, batch, scored).float()
        for k in CHUNKS:
            got = _algo(position_chunk_size=k).completion_logprobs(model, batch)
            torch.testing.assert_close(got, ref, rtol=0, atol=2e-6)


def test_queries_mask_the_whole_suffix_of_the_canvas():
    """Query (r, t) = the rollout's decoding state: prompt and o_<t kept, every position >= t masked (EOS padding
    after the first EOS too); each chunk is one forward, ceil(C / k) per call, even where nothing is scored."""
    from dare_bench.trainers.algorithms.justgrpo import ar_queries

    batch = _batch()
    scored = batch.completion_mask.bool()
    ids, attn, rows, pos = ar_queries(batch, scored, 0, C, MASK)
    assert len(rows) == int(scored.sum()) and (pos[1:] >= pos[:-1]).all()  # position-major
    for q in range(len(rows)):
        r, t = int(rows[q]), int(pos[q])
        assert torch.equal(ids[q, :5], batch.prompt_ids[r]) and torch.equal(attn[q], batch.attention_mask[r])
        assert torch.equal(ids[q, 5:5 + t], batch.completion_ids[r, :t]) and (ids[q, 5 + t:] == MASK).all()

    calls = []

    def counting(x, attention_mask=None):
        calls.append(x.shape[0])
        return model(x, attention_mask=attention_mask)

    model = _model()
    short = _batch()
    short.completion_mask[:, 2:] = 0  # nothing scored after position 1: the later chunks run a dummy query
    with torch.no_grad():
        lp = _algo(position_chunk_size=2).completion_logprobs(counting, short)
    assert len(calls) == math.ceil(C / 2) and calls[-1] == 1
    assert torch.equal(lp[:, 2:], torch.zeros_like(lp[:, 2:]))
    assert position_chunks(7, 3) == [(0, 3), (3, 6), (6, 7)] and position_chunks(7, None) == [(0, 7)]


# --- (b) loss / gradient == hand-computed GRPO clipped objective ----------------------------------------------------
def _grads(model):
    return [p.grad.detach().clone() for p in model.parameters()]


def _hand_loss(model, batch, adv, old_shift, *, eps, official):
    """−min(ρA, clip(ρ, 1−ε, 1+ε)A) on the naive log-probs, token-mean over the scored tokens (DARE / verl), or
    the official JustGRPO scale: every position, Σ / (gen_length · (valid_samples + 1e-5))."""
    n = batch.num_rows
    scored = torch.ones(n, C, dtype=torch.bool) if official else batch.completion_mask.bool()
    logp = naive_logprobs(model, batch, scored)
    old = logp.detach() + old_shift
    ratio = torch.exp(logp - old)
    a = adv.unsqueeze(1)
    per_token = -torch.min(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a)
    if official:
        valid = float((adv != 0).sum())
        return (per_token * scored).sum() / C / (valid + 1e-5), old
    m = scored.double()
    return (per_token * m).sum() / m.sum(), old


@pytest.mark.parametrize("official", [False, True])
def test_loss_and_gradient_equal_the_hand_computed_clipped_objective(official):
    batch = _batch()
    algo = _algo(position_chunk_size=3, clip_eps=0.2,
                 **({"score_padding": True, "valid_sample_norm": True} if official else {}))
    adv = algo.advantages(batch.rewards, batch.group_size).double()
    assert (adv[3:] == 0).all() and (adv[:3] != 0).all()
    # an old policy away from the current one, so that both clip branches are active
    shift = torch.linspace(-0.4, 0.4, batch.num_rows * C, dtype=torch.float64).view(batch.num_rows, C)

    hand_model = _model()
    hand, old = _hand_loss(hand_model, batch, adv, shift, eps=0.2, official=official)
    hand.backward()
    hand = hand.detach()

    model = _model()
    state = AlgorithmState(rows={"old_logp": old.detach()})
    metrics = algo.backward(model, batch, state, adv, loss_scale=1.0, iteration=0)
    # official: its +1e-5 on the valid-sample count vs token-mean's +1e-8 on the token count (relative 1e-5 / 3)
    assert metrics["loss"] == pytest.approx(float(hand), rel=1e-5 if official else 1e-10, abs=1e-13)
    assert 0 < metrics["clip_frac"] < 1
    # official: Σ / (C · (v + 1e-5)); token-mean here: Σ / (C · v) -- the same up to that constant. Any change in
    # the upstream bits shows as float32-level noise: the model's backward keeps some float32 parts (a float64
    # model's own gradient scaled by c is c · g only to ~5e-6 relative), hence the looser tolerance there.
    v = float((adv != 0).sum())
    rescale = v / (v + 1e-5) if official else 1.0
    for g_hand, g in zip(_grads(hand_model), _grads(model)):
        if official:
            torch.testing.assert_close(g * rescale, g_hand, rtol=1e-5, atol=1e-5 * float(g_hand.abs().max()))
        else:
            torch.testing.assert_close(g, g_hand, rtol=1e-9, atol=1e-13)


def test_mu_one_ratio_is_one_and_gradient_is_the_policy_gradient():
    """μ = 1 (no old log-probs): ratio ≡ 1, so the gradient is −Σ A ∇ℓ / #tokens on the naive log-probs."""
    batch = _batch()
    algo = _algo(position_chunk_size=4)
    adv = algo.advantages(batch.rewards, batch.group_size).double()
    state = algo.prepare(batch, _model(), None, generator=torch.Generator(), num_iterations=1)
    assert state.rows == {}
    hand_model = _model()
    m = batch.completion_mask.double()
    logp = naive_logprobs(hand_model, batch, batch.completion_mask.bool())
    (-(adv.unsqueeze(1) * logp * m).sum() / m.sum()).backward()
    model = _model()
    metrics = algo.backward(model, batch, state, adv, loss_scale=0.5, iteration=0)
    assert metrics["clip_frac"] == 0.0 and metrics["scored_tokens"] == float(m.sum())
    for g_hand, g in zip(_grads(hand_model), _grads(model)):
        torch.testing.assert_close(g, 0.5 * g_hand, rtol=1e-9, atol=1e-12)


def test_kl_term_and_old_logprobs_from_prepare():
    batch = _batch()
    model, ref_model = _model(), micro_llada(1, n_layers=2).double()
    algo = _algo(position_chunk_size=2, kl_beta=0.1, kl_estimator="k3")
    state = algo.prepare(batch, model, ref_model, generator=torch.Generator(), num_iterations=2)
    scored = batch.completion_mask.bool()
    with torch.no_grad():
        torch.testing.assert_close(state.rows["old_logp"], naive_logprobs(model, batch, scored), rtol=0, atol=1e-12)
        torch.testing.assert_close(state.rows["ref_logp"], naive_logprobs(ref_model, batch, scored), rtol=0,
                                   atol=1e-12)
    adv = algo.advantages(batch.rewards, batch.group_size).double()
    hand_model = _model()
    logp = naive_logprobs(hand_model, batch, scored)
    d = state.rows["ref_logp"] - logp
    kl = torch.clamp(torch.exp(d) - d - 1, -10, 10)
    m = scored.double()
    (agg_loss(-(adv.unsqueeze(1) * torch.exp(logp - state.rows["old_logp"])), m) + 0.1 * agg_loss(kl, m)).backward()
    metrics = algo.backward(model, batch, state, adv, loss_scale=1.0, iteration=1)
    assert metrics["kl"] > 0
    for g_hand, g in zip(_grads(hand_model), _grads(model)):  # float32-level noise, see above
        torch.testing.assert_close(g, g_hand, rtol=1e-5, atol=1e-5 * float(g_hand.abs().max()))


# --- (c) the chunk size changes nothing ------------------------------------------------------------------------------
@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                      "seq-mean-token-sum-norm"])
def test_chunk_size_does_not_change_loss_or_gradient(loss_agg):
    batch = _batch()
    results = []
    for k in CHUNKS:
        algo = _algo(position_chunk_size=k, loss_agg=loss_agg)
        adv = algo.advantages(batch.rewards, batch.group_size).double()
        model = _model()
        old = algo.completion_logprobs(_model(), batch).detach() + 0.1
        metrics = algo.backward(model, batch, AlgorithmState(rows={"old_logp": old}), adv, loss_scale=1.0,
                                iteration=0)
        results.append((metrics["loss"], _grads(model)))
    loss0, grads0 = results[0]
    for loss, grads in results[1:]:
        assert loss == pytest.approx(loss0, rel=1e-12)
        for a, b in zip(grads, grads0):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14)


def test_chunk_shares_sum_to_agg_loss():
    gen = torch.Generator().manual_seed(3)
    loss = torch.randn(4, 7, generator=gen, dtype=torch.float64)
    mask = (torch.rand(4, 7, generator=gen) > 0.3).double()
    mask[:, 0] = 1
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        total = sum(chunk_agg(loss[:, s:e], mask[:, s:e], mask, mode) for s, e in position_chunks(7, 3))
        torch.testing.assert_close(total, agg_loss(loss, mask, mode), rtol=1e-12, atol=1e-15)


# --- settings ------------------------------------------------------------------------------------------------------
def test_official_advantages_and_settings():
    algo = _algo()
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5])
    a = algo.advantages(r, 3)
    g = r.view(2, 3)
    hand = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-4)).reshape(-1)
    torch.testing.assert_close(a, hand)
    torch.testing.assert_close(_algo(advantage="mean").advantages(r, 3), (g - g.mean(1, keepdim=True)).reshape(-1))
    with pytest.raises(ConfigError, match="mc_samples"):
        _algo(mc_samples=2)
    with pytest.raises(ConfigError, match="advantage"):
        _algo(advantage="leave_one_out")
    with pytest.raises(ConfigError, match="token-mean"):
        _algo(valid_sample_norm=True, loss_agg="seq-mean-token-mean")
    with pytest.raises(ConfigError, match="unknown setting"):
        _algo(position_chunk=4)
    with pytest.raises(ConfigError):
        _algo(position_chunk_size=0)
    block = ModelTraits(family="sdar", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=0,
                        attention="block_causal")
    with pytest.raises(ConfigError, match="not defined"):
        get_algorithm("justgrpo")({}, block)


def test_rollouts_must_decode_left_to_right():
    algo = _algo()
    assert algo.check_rollout({"gen_length": 8, "steps": 8}) == {"gen_length": 8, "steps": 8, "block_length": 1}
    assert algo.check_rollout({"gen_length": 8, "block_length": 1})["block_length"] == 1
    with pytest.raises(ConfigError, match="block_length = 1"):
        algo.check_rollout({"gen_length": 8, "steps": 8, "block_length": 4})
    # other plug-ins require nothing
    d1 = get_algorithm("d1")({}, TRAITS)
    assert d1.check_rollout({"block_length": 4}) == {"block_length": 4}


def test_rollout_at_block_length_one_is_left_to_right():
    """With block_length 1 the LLaDA sampler fills the canvas strictly left to right (trajectory order)."""
    from dare_bench.diffusion.sampling import generate

    model = micro_llada(0)
    prompt = torch.tensor([[1, 2, 3, 10]])
    torch.manual_seed(0)  # the sampler's Gumbel noise (a draw of the mask id itself would leave a position masked)
    out = generate(model, prompt, **_algo().check_rollout({"gen_length": 6, "steps": 6, "temperature": 1.0}),
                   return_trajectory=True)
    steps = out.trajectory.steps
    order = [step.unmasked[0].nonzero().flatten().tolist() for step in steps]
    assert len(steps) == 6 and all(len(o) <= 1 for o in order)  # at most one token per step
    flat = [o[0] for o in order if o]
    # left to right, step k never beyond completion position k (the micro model can draw the mask id itself,
    # which leaves a position masked; a real LLaDA never does)
    assert flat == sorted(set(flat)) and all(o[0] <= 4 + k for k, o in enumerate(order) if o)
