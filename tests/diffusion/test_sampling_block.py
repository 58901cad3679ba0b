"""Block diffusion samplers (SDAR / LLaDA2 conventions): the exact KV cache gives the recompute tokens, stop / return
conventions, trajectories, batching and validation. Small peaked random models (CPU)."""

from __future__ import annotations

import pytest
import torch

from dare_bench.bench.rollout import peaked_init
from dare_bench.diffusion.cache import ExactBlockCache
from dare_bench.diffusion.sampling import generate, replay_trajectory
from dare_bench.errors import SamplerError
from dare_bench.models.layers import block_causal_mask

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _model(preset):
    from dare_bench.models import load_pretrained

    m = load_pretrained(preset)
    peaked_init(m, seed=0, head_scale=10.0)
    return m.eval()


@pytest.fixture(scope="module")
def sdar():
    return _model("tiny-sdar")


@pytest.fixture(scope="module")
def llada2():
    return _model("tiny-llada2")


def _prompt(n, batch=1, seed=0, vocab=4000):
    return torch.randint(0, vocab, (batch, n), generator=torch.Generator().manual_seed(seed))


class Wrapped(torch.nn.Module):
    def __init__(self, inner, bias_token=None, bias=0.0):
        super().__init__()
        self.inner, self.bias_token, self.bias, self.calls = inner, bias_token, bias, 0

    @property
    def traits(self):
        return self.inner.traits

    def new_kv_cache(self):
        return self.inner.new_kv_cache()

    def forward(self, *a, **kw):
        self.calls += 1
        logits = self.inner(*a, **kw)
        if self.bias_token is not None:
            logits = logits.clone()
            logits[..., self.bias_token] += self.bias
        return logits


@torch.no_grad()
def test_cached_block_logits_match_recompute(sdar):
    b = sdar.traits.block_size
    ids = _prompt(5 * b)
    full = sdar(ids, position_ids=torch.arange(5 * b)[None], attn_mask=block_causal_mask(5 * b, 5 * b, b))
    cache = ExactBlockCache(sdar, b, lambda x, **kw: sdar(x, **kw))
    cache.prefill(ids[:, :2 * b])
    got = [cache.block_logits(ids[:, 2 * b:3 * b])]
    cache.commit(ids[:, 2 * b:3 * b])
    got.append(cache.block_logits(ids[:, 3 * b:4 * b]))  # merged forward: pending block + this block
    cache.commit(ids[:, 3 * b:4 * b])
    cache.flush()
    got.append(cache.block_logits(ids[:, 4 * b:]))
    # float32 rounding only: the peaked test model has logits of size ~20, so compare relative to their scale
    scale = full.abs().max().item()
    assert (torch.cat(got, 1) - full[:, 2 * b:]).abs().max().item() <= 1e-5 * scale
    assert torch.equal(torch.cat(got, 1).argmax(-1), full[:, 2 * b:].argmax(-1))


@pytest.mark.parametrize("family", ["sdar", "llada2"])
@pytest.mark.parametrize("settings", [
    dict(top_k=1),
    dict(temperature=1.0, top_k=0, top_p=1.0, threshold=0.9),
    dict(temperature=0.7, top_k=20, top_p=0.9, remasking_strategy="low_confidence_static"),
    dict(temperature=1.0, remasking_strategy="sequential"),
], ids=["greedy", "dynamic", "static-topk-topp", "sequential"])
def test_exact_cache_gives_recompute_tokens(sdar, llada2, family, settings):
    model = sdar if family == "sdar" else llada2
    b = 4 if family == "sdar" else 8
    prompt = _prompt(b + 2, batch=2)
    kw = dict(gen_length=3 * b, block_length=b, denoising_steps=b // 2, convention=family, stop_at_eos=False,
              **settings)
    outs = [generate(model, prompt, use_cache=c, generator=torch.Generator().manual_seed(5), **kw)
            for c in ("none", "exact")]
    assert torch.equal(outs[0].canvas, outs[1].canvas)
    assert torch.equal(outs[0].sequences, outs[1].sequences)
    assert outs[1].stats.token_forwards < outs[0].stats.token_forwards
    assert not bool((outs[1].canvas == model.traits.mask_token_id).any())


def test_batched_rows_equal_single_rows(sdar):
    prompts = _prompt(6, batch=2, seed=3)
    kw = dict(gen_length=12, block_length=4, top_k=1)
    both = generate(sdar, prompts, **kw).sequences
    for j in range(2):
        assert torch.equal(both[j], generate(sdar, prompts[j:j + 1], **kw).sequences[0])


def test_stop_at_eos_and_return_conventions(sdar, llada2):
    for inner, conv in ((sdar, "sdar"), (llada2, "llada2")):
        eos = inner.traits.eos_token_id
        model = Wrapped(inner, eos, 100.0)  # every position predicts eos with certainty
        b = 4
        prompt = _prompt(6)
        out = generate(model, prompt, gen_length=16, block_length=b, convention=conv, top_k=1, stop_at_eos=True)
        canvas = out.canvas
        # the block after the prompt's partial block is decoded, then decoding stops
        assert bool((canvas[0, 6:8] == eos).all())
        assert bool((canvas[0, 8:] == inner.traits.mask_token_id).all())
        if conv == "sdar":
            assert out.sequences.shape[1] == canvas.shape[1] and out.prompt_length == 6
        else:  # LLaDA2 returns the generated tokens only, cut after the first eos
            assert out.sequences.tolist() == [[eos]] and out.prompt_length == 0
    # LLaDA2 eos_early_stop returns prompt + tokens up to the first eos
    out = generate(Wrapped(llada2, llada2.traits.eos_token_id, 100.0), _prompt(6), gen_length=16, block_length=4,
                   top_k=1, eos_early_stop=True)
    assert out.sequences.shape == (1, 7) and out.prompt_length == 6


@pytest.mark.parametrize("cache", ["exact", "none"])
def test_block_trajectory_replays(sdar, cache):
    out = generate(sdar, _prompt(6), gen_length=12, block_length=4, denoising_steps=2, top_k=1, use_cache=cache,
                   return_trajectory=True)
    traj = out.trajectory
    seen = torch.zeros_like(out.canvas, dtype=torch.long)
    for step in traj.steps:
        seen += step.unmasked.long()
    assert int(seen.max()) == 1
    assert int(seen.sum()) == out.canvas.shape[1] - 6
    assert torch.equal(replay_trajectory(sdar, traj), out.canvas)


@pytest.mark.parametrize("settings", [
    dict(gen_length=8, block_length=16),
    dict(gen_length=16, block_length=4, temperature=0.0, convention="sdar"),
    dict(gen_length=16, block_length=4, remasking_strategy="random"),
    dict(gen_length=16, block_length=4, confidence_threshold=1.2),
    dict(gen_length=16, block_length=4, threshold=0.0),
    dict(gen_length=16, block_length=4, use_cache="dual"),
    dict(gen_length=16, block_length=4, steps=2, denoising_steps=4),
    dict(gen_length=16, block_length=4, alg="entropy"),
    dict(gen_length=16, block_length=4, eos_early_stop=True, convention="sdar"),
    dict(gen_length=16, block_length=4, convention="bd3lm"),
])
def test_invalid_block_settings_fail_before_any_forward(sdar, settings):
    model = Wrapped(sdar)
    with pytest.raises(SamplerError):
        generate(model, _prompt(6), **settings)
    assert model.calls == 0


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_left_padded_batch_equals_one_prompt_at_a_time(sdar, llada2, family):
    model = sdar if family == "sdar" else llada2
    a, b = _prompt(5, seed=1), _prompt(7, seed=2)
    batch = torch.full((2, 7), model.traits.pad_token_id)
    batch[0, 2:], batch[1] = a[0], b[0]
    am = (torch.arange(7)[None] >= torch.tensor([[2], [0]])).long()
    kw = dict(gen_length=8, block_length=4, top_k=1, convention=family)
    out = generate(model, batch, am, **kw)
    one = [generate(model, p, **kw) for p in (a, b)]
    mask = model.traits.mask_token_id
    for j, (o, p_len) in enumerate(zip(one, (5, 7))):
        row = out.canvas[j, 7:]
        row = row[row != mask] if family == "sdar" else row
        gen = o.canvas[0, p_len:]
        assert row[:gen.shape[0]].tolist() == gen.tolist()
        if family == "llada2":
            assert out.sequences[j, :o.sequences.shape[1]].tolist() == o.sequences[0].tolist()
    assert out.stats.forwards == sum(o.stats.forwards for o in one)


@pytest.mark.parametrize("cache", ["exact", "none"])
@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_left_padded_batch_records_one_trajectory_per_row(sdar, llada2, family, cache):
    """Prompts of different lengths (their own block grids, different step counts): one trajectory per row, laid
    out like the canvas; replayed it gives the canvas, each generated token is unmasked once, and the tokens are
    those of each row decoded alone (and of the same call without a trajectory)."""
    model = sdar if family == "sdar" else llada2
    a, b = _prompt(4, seed=1), _prompt(7, seed=2)
    P, mask, pad = 7, model.traits.mask_token_id, model.traits.pad_token_id
    batch = torch.full((2, P), pad)
    batch[0, 3:], batch[1] = a[0], b[0]
    am = (torch.arange(P)[None] >= torch.tensor([[3], [0]])).long()
    # one token a step (static: no threshold shortcut), so SDAR's quota never exceeds the masks left and no step
    # rewrites a token (an upstream quirk that a replay, writing unmasked positions only, does not reproduce)
    kw = dict(gen_length=8, block_length=4, denoising_steps=4, remasking_strategy="low_confidence_static", top_k=1,
              convention=family, stop_at_eos=False, use_cache=cache)
    out = generate(model, batch, am, return_trajectory=True, **kw)
    plain = generate(model, batch, am, **kw)
    assert torch.equal(out.canvas, plain.canvas) and torch.equal(out.sequences, plain.sequences)
    trajs = out.trajectory
    assert isinstance(trajs, list) and len(trajs) == 2
    assert [len(t.steps) for t in trajs] == [8, 9]  # 2 blocks against 1 mask + 2 blocks: the step axes differ
    for j, (traj, p, start) in enumerate(zip(trajs, (4, 7), (3, 0))):
        alone = generate(model, batch[j:j + 1, start:], return_trajectory=True, **kw)
        n = alone.canvas.shape[1]
        assert torch.equal(out.canvas[j, start:start + n], alone.canvas[0])
        assert bool((out.canvas[j, start + n:] == mask).all())
        assert traj.start == start and traj.prompt_length == P and traj.kind == "block"
        assert len(traj.steps) == len(alone.trajectory.steps)
        first = traj.steps[0].state[0]
        assert torch.equal(first[:P], batch[j]) and bool((first[P:] == mask).all())
        seen = torch.zeros(out.canvas.shape[1], dtype=torch.long)
        for st, own in zip(traj.steps, alone.trajectory.steps):
            assert st.state.shape == (1, out.canvas.shape[1])
            assert torch.equal(st.state[0, start:start + n], own.state[0])
            assert st.region_end == start + own.region_end
            seen += st.unmasked[0].long()
        # every generated token unmasked at exactly one step; nothing in the prompt, the pads or the right fill
        assert torch.equal(seen[P:], (out.canvas[j, P:] != mask).long()) and int(seen[:P].sum()) == 0
        assert torch.equal(replay_trajectory(model, traj)[0], out.canvas[j])
    assert torch.equal(replay_trajectory(model, trajs), out.canvas)
    # sampled: recording the trajectory leaves the tokens as they are
    kw.update(top_k=0, temperature=1.0)
    outs = [generate(model, batch, am, return_trajectory=rt, generator=torch.Generator().manual_seed(3), **kw)
            for rt in (False, True)]
    assert torch.equal(outs[0].canvas, outs[1].canvas) and torch.equal(outs[0].sequences, outs[1].sequences)


def test_block_decoding_ends_when_the_model_only_predicts_the_mask_token():
    """A (badly trained) model whose argmax is always the mask token must not make the sampler loop forever."""
    import dataclasses

    import torch

    from dare_bench.diffusion.sampling import generate
    from dare_bench.models import load_pretrained
    from dare_bench.models.lm_head import HiddenStates

    model = load_pretrained("tiny-sdar")
    mask_id = model.traits.mask_token_id
    real_forward = model.forward

    def mask_loving(*args, **kwargs):
        out = real_forward(*args, **kwargs)
        if isinstance(out, HiddenStates):  # the exact cache applies the head itself: give its bias the mask token
            bias = torch.zeros(out.head.weight.shape[0])
            bias[mask_id] = 1e4
            return dataclasses.replace(out, head=dataclasses.replace(out.head, bias=bias))
        out[..., mask_id] = 1e4
        return out

    model.forward = mask_loving
    out = generate(model, torch.tensor([[1, 2, 3, 4]]), gen_length=8, block_length=4, denoising_steps=2,
                   temperature=1.0, top_k=1)
    assert out.sequences.shape[1] >= 12
    assert out.stats.forwards < 40


@pytest.mark.parametrize("shape", [(1, 7), (64, 300), (33, 4096)])
def test_multinomial_one_is_torch_multinomial(shape):
    """The exact cache's draw (uniforms for every row, the log for the wanted rows only) samples the tokens
    torch.multinomial samples over all rows, and leaves the generator where torch does; so does the fallback
    (float64 probabilities: torch's own call with placeholder rows)."""
    from dare_bench.diffusion.sampling.block import multinomial_matches_torch, multinomial_one

    assert multinomial_matches_torch()
    n, vocab = shape
    for seed in range(4):
        g = torch.Generator().manual_seed(100 + seed)
        probs = torch.softmax(torch.randn(n, vocab, generator=g) * (1 + 4 * seed), dim=-1)
        index = torch.randperm(n, generator=g)[: max(1, n // 3)].sort().values
        for dtype in (torch.float32, torch.float64):
            p = probs.to(dtype)
            theirs, ours = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
            want = torch.multinomial(p, 1, generator=theirs).squeeze(-1)
            assert torch.equal(multinomial_one(p, ours, n), want)
            assert torch.equal(ours.get_state(), theirs.get_state())
            theirs, ours = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
            want = torch.multinomial(p, 1, generator=theirs).squeeze(-1)[index]
            assert torch.equal(multinomial_one(p[index], ours, n, index), want)
            assert torch.equal(ours.get_state(), theirs.get_state())


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_exact_cache_heads_only_the_positions_a_step_writes(sdar, llada2, family, monkeypatch):
    """With a plain backbone the cached sampler sends through the LM head only the positions a step may write
    (masked ones; whole rows where SDAR asks topk for more positions than are masked, which a low threshold
    forces here): the same tokens as recompute and as the cache with whole-block logits."""
    from dare_bench.diffusion.sampling import block as block_mod

    model = sdar if family == "sdar" else llada2
    assert block_mod.head_outside_forward(model) and not block_mod.head_outside_forward(Wrapped(model))
    seen = {"partial": 0, "whole_rows": 0}
    real = block_mod.BlockSettings.sampled_positions

    def counting(self, mask_index, quota):
        need = real(self, mask_index, quota)
        seen["partial"] += int(bool((~need).any()))
        seen["whole_rows"] += int(bool((need & ~mask_index).any()))
        return need

    monkeypatch.setattr(block_mod.BlockSettings, "sampled_positions", counting)
    b = 4 if family == "sdar" else 8
    kw = dict(gen_length=4 * b, block_length=b, denoising_steps=b // 2, convention=family, stop_at_eos=False,
              temperature=1.0, top_k=0, top_p=1.0, threshold=0.3)
    prompt = _prompt(b + 3, batch=3, seed=4)
    outs = [generate(model, prompt, use_cache=c, generator=torch.Generator().manual_seed(9), **kw)
            for c in ("none", "exact")]
    monkeypatch.setattr(block_mod, "head_outside_forward", lambda m: False)
    outs.append(generate(model, prompt, use_cache="exact", generator=torch.Generator().manual_seed(9), **kw))
    assert torch.equal(outs[0].canvas, outs[1].canvas) and torch.equal(outs[1].canvas, outs[2].canvas)
    assert seen["partial"] > 0
    assert (seen["whole_rows"] > 0) == (family == "sdar")  # LLaDA2 caps topk at the masks left
