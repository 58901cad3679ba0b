"""The chunked LM head (models/lm_head.py) equals materialised logits: values and gradients (hidden states, weight,
bias) in float32 to 1e-6 relative (gradients 4e-6), for every family's head convention (LLaDA bias / logit scale /
tied embeddings, Dream's shifted rows and tied head, SDAR / LLaDA2 float32 logits and tied heads), chunk sizes
that do not divide N, bf16 inputs and autocast; and `forward(..., return_hidden=True)` gives back exactly the
default forward's logits."""

import pytest
import torch

from dare_bench.errors import ConfigError, DataError
from dare_bench.models.io import build_model
from dare_bench.models.lm_head import OutputHead, chunked_token_logprobs
from dare_bench.models.presets import preset_config

torch.set_num_threads(1)


def full_logprobs(hidden, head, targets):
    """The materialised reference: all logits, float32 log-softmax, gather (likelihood.token_logprobs' math)."""
    logits = head.logits(hidden).float()
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None])[:, 0]


def rel_err(a, b):
    """Norm-wise relative error ||a - b|| / ||b||."""
    a, b = a.detach(), b.detach()
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _toy(n=37, d=24, v=3001, bias=True, scale=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(v, d, generator=g) * 0.3).to(dtype).requires_grad_()
    b = (torch.randn(v, generator=g) * 0.1).to(dtype).requires_grad_() if bias else None
    targets = torch.randint(v, (n,), generator=g)
    return hidden, OutputHead(weight, b, scale), targets


def _grads(fn, hidden, head, targets, upstream):
    out = fn(hidden, head, targets)
    params = [hidden, head.weight] + ([head.bias] if head.bias is not None else [])
    grads = torch.autograd.grad((out * upstream).sum(), params)
    return out.detach(), grads


@pytest.mark.parametrize("chunk", [1, 5, 16, 37, 100])  # 5 and 16 do not divide 37
@pytest.mark.parametrize("bias,scale", [(True, None), (False, 0.125), (True, 0.3)])
def test_values_and_gradients_equal_the_materialised_head_fp32(chunk, bias, scale):
    hidden, head, targets = _toy(bias=bias, scale=scale)
    upstream = torch.randn(targets.shape[0], generator=torch.Generator().manual_seed(1))
    ref, ref_g = _grads(full_logprobs, hidden, head, targets, upstream)
    got, got_g = _grads(lambda h, hd, t: chunked_token_logprobs(h, hd, t, chunk_tokens=chunk), hidden, head, targets,
                        upstream)
    assert got.dtype == torch.float32
    assert rel_err(got, ref) <= 1e-6
    for a, b in zip(got_g, ref_g):
        # the weight gradient sums over chunks in another order than the materialised matmul: 1.05e-6 on an AMD
        # EPYC (chunk 1), so gradients get 4e-6 (a wrong scale, bias or shift is off by > 1e-2)
        assert a.dtype == b.dtype and rel_err(a, b) <= 4e-6


def test_entropy_equals_the_materialised_entropy_and_carries_no_gradient():
    hidden, head, targets = _toy(scale=0.5)
    lp, ent = chunked_token_logprobs(hidden, head, targets, chunk_tokens=8, with_entropy=True)
    logp_all = torch.log_softmax(head.logits(hidden).float(), dim=-1)
    ref = -(logp_all.exp() * logp_all).sum(-1)
    assert rel_err(ent, ref) <= 1e-6 and not ent.requires_grad and lp.requires_grad
    assert rel_err(lp, full_logprobs(hidden, head, targets)) <= 1e-6


def test_bf16_inputs_follow_the_materialised_path_within_bf16_rounding():
    """bf16 hidden / weight: the matmul in bf16, logsumexp in fp32 (as the full path upcasts), gradients in bf16.
    Both paths are compared with the float64 truth of the same bf16 numbers: the chunked one is no worse."""
    hidden, head, targets = _toy(dtype=torch.bfloat16, v=2003)
    upstream = torch.ones(targets.shape[0])
    full, full_g = _grads(full_logprobs, hidden, head, targets, upstream)
    got, got_g = _grads(lambda h, hd, t: chunked_token_logprobs(h, hd, t, chunk_tokens=6), hidden, head, targets,
                        upstream)
    h64 = hidden.detach().double().requires_grad_()
    head64 = OutputHead(head.weight.detach().double().requires_grad_(), head.bias.detach().double().requires_grad_())
    true, true_g = _grads(full_logprobs, h64, head64, targets, upstream.double())
    assert got.dtype == torch.float32
    assert rel_err(got, true) <= max(2 * rel_err(full, true), 1e-3)
    for a, b, t in zip(got_g, full_g, true_g):
        assert a.dtype == b.dtype == torch.bfloat16
        assert rel_err(a, t) <= max(2 * rel_err(b, t), 2e-2)


def test_autocast_casts_like_the_materialised_linear():
    """fp32 master weights under bf16 autocast: both paths run the head's matmul in bf16 and the gradients land in
    fp32 on the master copies."""
    hidden, head, targets = _toy(v=1501)
    upstream = torch.ones(targets.shape[0])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        full, full_g = _grads(full_logprobs, hidden, head, targets, upstream)
        got, got_g = _grads(lambda h, hd, t: chunked_token_logprobs(h, hd, t, chunk_tokens=7), hidden, head,
                            targets, upstream)
    assert got.dtype == torch.float32 and rel_err(got, full) <= 1e-2
    for a, b in zip(got_g, full_g):
        assert a.dtype == b.dtype == torch.float32 and rel_err(a, b) <= 3e-2


def test_bad_chunk_and_shapes_are_one_line_errors():
    hidden, head, targets = _toy()
    with pytest.raises(ConfigError, match="chunk_tokens"):
        chunked_token_logprobs(hidden, head, targets, chunk_tokens=0)
    with pytest.raises(DataError, match="hidden"):
        chunked_token_logprobs(hidden[None], head, targets, chunk_tokens=4)
    # leading dims are flattened and restored
    batched = chunked_token_logprobs(hidden.view(1, 37, -1), head, targets.view(1, 37), chunk_tokens=4)
    assert batched.shape == (1, 37) and torch.equal(batched[0], chunked_token_logprobs(hidden, head, targets,
                                                                                       chunk_tokens=4))


# --- the families' heads --------------------------------------------------------------------------------------------
HEADS = [
    ("llada", {}),
    ("llada", {"include_bias": True, "scale_logits": True}),
    ("llada", {"weight_tying": True, "scale_logits": True}),
    ("dream", {}),
    ("dream", {"tie_word_embeddings": True}),
    ("sdar", {}),
    ("sdar", {"tie_word_embeddings": True}),
    ("llada2", {}),
    ("llada2", {"tie_word_embeddings": True}),
]


@pytest.mark.parametrize("family,overrides", HEADS, ids=[f"{f}-{'-'.join(o) or 'default'}" for f, o in HEADS])
def test_each_family_exposes_its_head_and_chunked_logprobs_match(family, overrides):
    torch.manual_seed(0)
    model = build_model(preset_config(f"tiny-{family}", **overrides))
    model.init_weights()
    with torch.no_grad():  # non-zero biases, so a dropped bias would show
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    ids = torch.randint(0, 13, (2, 9))
    logits = model(ids)
    out = model(ids, return_hidden=True)
    assert out.states.shape == (*ids.shape, out.head.weight.shape[1])
    assert torch.equal(out.head.logits(out.states), logits)  # the default forward's head, op for op
    if overrides.get("include_bias"):
        assert out.head.bias is not None
    if overrides.get("scale_logits"):
        assert out.head.scale is not None
    tied = overrides.get("weight_tying") or overrides.get("tie_word_embeddings")
    emb = next(m for m in model.modules() if isinstance(m, torch.nn.Embedding)).weight
    assert (out.head.weight is emb) == bool(tied)

    targets = torch.randint(0, 13, ids.shape)
    ref = torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None])[..., 0].flatten()
    ref_g = torch.autograd.grad(ref.sum(), list(model.parameters()), allow_unused=True)
    out = model(ids, return_hidden=True)
    got = chunked_token_logprobs(out.states.flatten(0, 1), out.head, targets.flatten(), chunk_tokens=4)
    got_g = torch.autograd.grad(got.sum(), list(model.parameters()), allow_unused=True)
    assert rel_err(got, ref) <= 1e-6
    head_index = [i for i, p in enumerate(model.parameters()) if p is out.head.weight]
    assert rel_err(got_g[head_index[0]], ref_g[head_index[0]]) <= 1e-6
    # every parameter, as one vector (some are ~0 in theory, e.g. a key bias under softmax, and only noise there)
    both = [(a, b) for a, b in zip(got_g, ref_g) if b is not None]
    assert all(a is not None for a, _ in both)
    assert rel_err(torch.cat([a.flatten() for a, _ in both]), torch.cat([b.flatten() for _, b in both])) <= 1e-6


def test_a_lora_wrapped_head_is_refused():
    from dare_bench.models.lm_head import linear_head

    class Wrapped(torch.nn.Linear):
        pass

    with pytest.raises(ConfigError, match="plain Linear"):
        linear_head(Wrapped(4, 8))
