"""`train.lm_head_chunk_tokens` changes memory, not numbers: every likelihood estimator, the SFT loss, the VRPO loss
and every RL plug-in that reads the switch give the same values and gradients with it on (scored tokens only,
chunked LM head) as with it off (materialised logits), on tiny models of all four families, with left-padded rows,
a chunk size that divides nothing, and block-diffusion layouts."""

import pytest
import torch

from dare_bench.check import gradients as grad_check
from dare_bench.diffusion.likelihood import coupled_token_logprobs, d1_token_logprobs, elbo, elbo_term
from dare_bench.diffusion.masking import coupled_masks, d1_masks, ebpo_block_masks, espo_masks, stratified_masks
from dare_bench.models.io import build_model
from dare_bench.models.presets import preset_config
from dare_bench.trainers.algorithms.base import get_algorithm, list_algorithms
from dare_bench.trainers.preference import vrpo_loss
from dare_bench.trainers.sft import sft_loss

torch.set_num_threads(1)
CHUNK = 5  # divides neither the scored counts nor the lengths below
FAMILIES = ["llada", "dream", "sdar", "llada2"]


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def tiny(family, seed=0):
    model = build_model(preset_config(f"tiny-{family}"))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.init_weights()
    return model


def batch(model, rows=4, prompt=5, length=16, left_pad=True):
    g = torch.Generator().manual_seed(7)
    vocab = model.output_head().weight.shape[0]
    ids = torch.randint(0, min(vocab, 200), (rows, length), generator=g)
    attn = torch.ones(rows, length, dtype=torch.long)
    attn[1, -3:] = 0  # right padding
    if left_pad and not model.traits.is_block_diffusion:
        attn[2, :2] = 0  # left padding: the estimators left-align such rows
    return ids, attn, prompt


def on_off(model, fn):
    """fn(chunk) -> tensor; its value and the gradient of its sum over every parameter, for chunk None and CHUNK."""
    out = []
    for chunk in (None, CHUNK):
        model.zero_grad(set_to_none=True)
        value = fn(chunk)
        value.sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        out.append((value.detach(), grads))
    return out


def assert_same(model, fn, tol=1e-6):
    """Values within `tol`; gradients within 4e-6 (fp32): the chunked head sums the hidden states' gradient over
    vocabulary chunks in another order, and over ~1e5 parameters that reordering alone reached 1.04e-6 (llada2's
    variance-reduced ESPO term, fp32, this CPU), so the gradient bound is a few times that, still far below a drift.
    A looser `tol` (bf16 autocast) bounds both."""
    grad_tol = max(tol, 4e-6)
    (v_full, g_full), (v_chunk, g_chunk) = on_off(model, fn)
    assert rel(v_chunk, v_full) <= tol and rel(g_chunk, g_full) <= grad_tol, (rel(v_chunk, v_full),
                                                                                rel(g_chunk, g_full))


@pytest.mark.parametrize("family", FAMILIES)
def test_elbo_terms_equal_with_the_chunked_head(family):
    model = tiny(family)
    ids, attn, p = batch(model)
    draw = stratified_masks(attn, p, n=2, generator=torch.Generator().manual_seed(1))
    assert_same(model, lambda c: elbo_term(model, ids, draw, 1, attention_mask=attn, head_chunk_tokens=c).per_token)
    espo = espo_masks(attn, p, n=1, generator=torch.Generator().manual_seed(8))
    assert_same(model, lambda c: elbo_term(model, ids, espo, 0, attention_mask=attn, reduce_var=True,
                                           head_chunk_tokens=c).total)
    assert_same(model, lambda c: elbo(model, ids, draw, attention_mask=attn, head_chunk_tokens=c).mean)


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_block_elbo_terms_equal_with_the_chunked_head(family):
    model = tiny(family)
    ids, attn, p = batch(model)
    draw = ebpo_block_masks(attn, p, block_length=model.traits.block_size, n=2,
                            generator=torch.Generator().manual_seed(2))
    assert_same(model, lambda c: elbo_term(model, ids, draw, 0, attention_mask=attn,
                                           head_chunk_tokens=c).per_block)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_d1_and_coupled_estimates_equal_with_the_chunked_head(family):
    model = tiny(family)
    ids, attn, p = batch(model)
    d1 = d1_masks(attn, p, generator=torch.Generator().manual_seed(3))
    assert_same(model, lambda c: d1_token_logprobs(model, ids, d1, attention_mask=attn, head_chunk_tokens=c))
    cp = coupled_masks(attn, p, generator=torch.Generator().manual_seed(4))
    assert_same(model, lambda c: coupled_token_logprobs(model, ids, cp, attention_mask=attn,
                                                        head_chunk_tokens=c).token_logprobs)


@pytest.mark.parametrize("family", FAMILIES)
def test_sft_loss_equals_with_the_chunked_head(family):
    model = tiny(family)
    ids, _, p = batch(model, left_pad=False)
    plen, alen = torch.full((ids.shape[0],), p), torch.full((ids.shape[0],), ids.shape[1] - p)
    assert_same(model, lambda c: sft_loss(model, ids, plen, alen, torch.Generator().manual_seed(5),
                                          head_chunk_tokens=c))


def test_sft_loss_equals_under_bf16_autocast():
    model = tiny("llada")
    ids, _, p = batch(model, left_pad=False)
    plen, alen = torch.full((ids.shape[0],), p), torch.full((ids.shape[0],), ids.shape[1] - p)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert_same(model, lambda c: sft_loss(model, ids, plen, alen, torch.Generator().manual_seed(5),
                                              head_chunk_tokens=c), tol=5e-3)


def test_vrpo_loss_equals_with_the_chunked_head():
    policy, reference = tiny("llada", 0), tiny("llada", 1)
    reference.requires_grad_(False)
    ids, attn, p = batch(policy, left_pad=False)
    assert_same(policy, lambda c: vrpo_loss(policy, reference, ids, attn, p, beta=0.2, mc_samples=2,
                                            generator=torch.Generator().manual_seed(6), head_chunk_tokens=c)[0])


def _reads_the_switch(name):
    return "lm_head_chunk_tokens" not in get_algorithm(name).Config.unused_shared_settings


# the RL plug-ins' snapshots (sft / lora / vrpo have their own: the SFT and VRPO tests above cover their losses)
PLUGINS = [(a, b) for a, b in grad_check.entries() if a not in grad_check.SUPERVISED and _reads_the_switch(a)]


@pytest.mark.parametrize("algorithm,backbone", PLUGINS, ids=[f"{a}-{b}" for a, b in PLUGINS])
def test_every_plugin_reading_the_switch_has_the_same_loss_and_gradient(algorithm, backbone, monkeypatch):
    """The pinned gradient snapshot (check/gradients.py) with the switch on equals the one with it off."""
    off = grad_check.snapshot(algorithm, backbone)
    plain = grad_check._plugin

    def chunked(name, traits):
        algo, config = plain(name, traits)
        config = dict(config, lm_head_chunk_tokens=3)
        return type(algo)(config, traits), config

    monkeypatch.setattr(grad_check, "_plugin", chunked)
    on = grad_check.snapshot(algorithm, backbone)
    assert on["config"]["lm_head_chunk_tokens"] == 3 and on["batch_fingerprint"] == off["batch_fingerprint"]
    # float32 rounding only: ~10x the thread / float noise check/gradients.py measured (loss 2.5e-6 relative +
    # 7e-8 absolute, as a GRPO loss can be ~0 by construction; norm 4.9e-7), far inside its pinned tolerances
    assert abs(on["loss"] - off["loss"]) <= 1e-5 * abs(off["loss"]) + 1e-7
    assert abs(on["grad_norm"] - off["grad_norm"]) <= 1e-5 * off["grad_norm"]
    assert rel(torch.tensor(on["projection"]), torch.tensor(off["projection"])) <= 1e-5
    assert all(c["status"] == "pass" for c in grad_check.compare(off, on))


def test_plugins_that_need_full_logits_say_so():
    full = {name for name in list_algorithms() if not _reads_the_switch(name)}
    assert full == {"cj_grpo", "tracerl", "dtreerpo"}


def test_the_switch_is_out_of_dumps_at_its_default_on_at_paper_scale_and_reaches_every_trainer():
    from dare_bench.catalogue.settings import algorithm_settings
    from dare_bench.config import TrainSettings
    from dare_bench.pipeline.train import _recipe
    from dare_bench.registry import get

    assert "lm_head_chunk_tokens" not in TrainSettings(kind="none").model_dump()  # old hashes and baselines kept
    train = TrainSettings(kind="none", lm_head_chunk_tokens=64)
    assert train.model_dump()["lm_head_chunk_tokens"] == 64
    assert algorithm_settings(train)["lm_head_chunk_tokens"] == 64  # the RL plug-ins
    assert _recipe(train)["lm_head_chunk_tokens"] == 64  # SFTConfig / PreferenceConfig
    for name in ("bgpo-llada-gsm8k", "sft-dream-countdown", "vrpo-llada-gsm8k"):
        spec = get(name)
        assert spec.scales["paper"].train.lm_head_chunk_tokens == 256, name
        assert all(p.train.lm_head_chunk_tokens is None for s, p in spec.scales.items() if s != "paper"), name
