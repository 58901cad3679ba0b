"""`train.packing` changes the layout, not the numbers: packed forwards (diffusion/packing.py) give the padded path's
values and gradients (<= 1e-6 relative) for the d1 / coupled / ELBO estimators, the SFT loss, the VRPO loss and the
RL plug-ins, on tiny models of all four families and several length mixes; no token attends across sequences; the
loader refuses the switch for the plug-ins that cannot pack."""

import pytest
import torch

from dare_bench.check import gradients as grad_check
from dare_bench.diffusion.likelihood import (
    aligned_logits,
    coupled_token_logprobs,
    d1_token_logprobs,
    elbo,
    elbo_term,
)
from dare_bench.diffusion.masking import coupled_masks, d1_masks, ebpo_block_masks, espo_masks, stratified_masks
from dare_bench.diffusion.packing import PackedModel, first_fit_decreasing, pack_layout
from dare_bench.errors import DareBenchError
from dare_bench.models.io import build_model
from dare_bench.models.presets import preset_config
from dare_bench.trainers.algorithms.base import RolloutBatch, get_algorithm, list_algorithms
from dare_bench.trainers.preference import vrpo_loss
from dare_bench.trainers.sft import SFTExample, collate_own_length, sft_loss

torch.set_num_threads(1)
FAMILIES = ["llada", "dream", "sdar", "llada2"]
TOL = 1e-6
# (left padding, right padding) per row of a 6 x 24 batch, prompt length 10: prompt-side and response-side padding
# and a full row ("mixed"), rows short enough to share packed rows ("short"), rows too long to share ("similar":
# packing cannot beat padding there)
MIXES = {
    "mixed": [(0, 0), (5, 3), (2, 12), (9, 0), (0, 13), (3, 6)],
    "short": [(0, 6), (8, 10), (6, 10), (2, 10), (9, 10), (4, 10)],
    "similar": [(0, 1), (1, 0), (0, 2), (2, 0), (1, 1), (0, 0)],
}
PROMPT = 10


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def tiny(family, seed=0):
    model = build_model(preset_config(f"tiny-{family}"))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.init_weights()
    return model


def batch(model, mix, length=24):
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 200, (len(MIXES[mix]), length), generator=g)
    attn = torch.ones_like(ids)
    for r, (left, right) in enumerate(MIXES[mix]):
        attn[r, :left] = 0
        attn[r, length - right:] = 0
    return ids, attn, PROMPT


def grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def padded_and_packed(model, fn):
    """fn(m) -> tensor for m = the model and PackedModel(model); each value and the gradient of its sum."""
    out = []
    for m in (model, PackedModel(model, model.traits)):
        model.zero_grad(set_to_none=True)
        value = fn(m)
        value.float().sum().backward()
        out.append((value.detach(), grads(model)))
    return out


def assert_same(model, fn, tol=TOL):
    (v_pad, g_pad), (v_pack, g_pack) = padded_and_packed(model, fn)
    assert rel(v_pack, v_pad) <= tol and rel(g_pack, g_pad) <= tol, (rel(v_pack, v_pad), rel(g_pack, g_pad))


# --- the plan and the layout ----------------------------------------------------------------------------------

def test_first_fit_decreasing_fills_rows_in_a_fixed_order():
    bins = first_fit_decreasing([5, 9, 3, 0, 4, 6, 1], 10)
    assert bins == [[1, 6], [5, 4], [0, 2]]  # longest first, first bin with room; the empty row goes nowhere
    assert sorted(r for b in bins for r in b) == [0, 1, 2, 4, 5, 6]
    with pytest.raises(DareBenchError, match="exceeds"):
        first_fit_decreasing([11], 10)


def test_the_layout_keeps_positions_and_is_block_diagonal():
    """Rows hold at most the longest sequence (4 here); positions are the padded call's; slack sees itself."""
    ids = torch.arange(18).view(3, 6)
    valid = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 1]], dtype=torch.bool)
    pos = torch.tensor([[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]])
    lay = pack_layout(ids, valid, pos, None, pad_id=99)
    assert lay.input_ids.tolist() == [[2, 3, 4, 5], [6, 7, 8, 17]]  # 4 | 3 + 1
    assert lay.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 5]]
    m = lay.attn_mask[1, 0]
    assert m[:3, :3].all() and not m[:3, 3:].any() and not m[3:, :3].any() and m[3, 3]
    out = lay.unpack(lay.input_ids[..., None].float())[..., 0]
    assert torch.equal(out, torch.where(valid, ids, 0).float())
    short = pack_layout(ids[1:2], valid[1:2], pos[1:2], None, pad_id=99)
    assert short.input_ids.tolist() == [[6, 7, 8]]


# --- the forward ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mix", sorted(MIXES))
def test_packed_logits_equal_padded_on_the_real_tokens(family, mix):
    model = tiny(family)
    ids, attn, _ = batch(model, mix)
    with torch.no_grad():
        pad = aligned_logits(model, ids, attention_mask=attn, clean_ids=ids)
        pack = aligned_logits(PackedModel(model, model.traits), ids, attention_mask=attn, clean_ids=ids)
    real = attn.bool()
    if model.traits.logit_shift:  # Dream: row i is scored from row i-1; a sequence's first token has no real source
        real = real & torch.cat([torch.zeros_like(real[:, :1]), real[:, :-1]], dim=1)
    assert rel(pack[real], pad[real]) <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_no_attention_across_sequences(family):
    """Changing one sequence's tokens leaves every other sequence's outputs exactly as they were, although they
    share packed rows with it; and the packed rows are fewer than the padded ones."""
    model = tiny(family)
    ids, attn, _ = batch(model, "short")
    packed = PackedModel(model, model.traits)
    calls = []
    model.register_forward_hook(lambda mod, args, kwargs_out: calls.append(args[0].shape))
    with torch.no_grad():
        base = aligned_logits(packed, ids, attention_mask=attn, clean_ids=ids)
        assert calls[-1][0] < ids.shape[0]
        other = ids.clone()
        other[3] = (other[3] + 17) % 200
        moved = aligned_logits(packed, other, attention_mask=attn, clean_ids=other)
    rest = torch.ones(ids.shape[0], dtype=torch.bool)
    rest[3] = False
    real = attn.bool()
    # dense families: bit for bit; LLaDA2's MoE runs each expert over the tokens routed to it, so a changed token in
    # the same packed row moves the others' rounding (measured 1.2e-7), never their values
    tol = 1e-6 if family == "llada2" else 0.0
    assert (moved[rest][real[rest]] - base[rest][real[rest]]).abs().max() <= tol
    assert (moved[3][real[3]] - base[3][real[3]]).abs().max() > 1e-3  # the changed sequence did change


def test_a_call_it_cannot_pack_is_one_error():
    model = tiny("llada")
    with pytest.raises(DareBenchError, match="cannot pack"):
        PackedModel(model, model.traits)(torch.zeros(1, 4, dtype=torch.long), kv_cache=object())


# --- the estimators -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mix", ["mixed", "short"])
@pytest.mark.parametrize("chunk", [None, 7])
def test_d1_coupled_and_elbo_estimates_equal_packed(family, mix, chunk):
    model = tiny(family)
    ids, attn, p = batch(model, mix)
    d1 = d1_masks(attn, p, generator=torch.Generator().manual_seed(3))
    assert_same(model, lambda m: d1_token_logprobs(m, ids, d1, attention_mask=attn, head_chunk_tokens=chunk))
    cp = coupled_masks(attn, p, generator=torch.Generator().manual_seed(4))
    assert_same(model, lambda m: coupled_token_logprobs(m, ids, cp, attention_mask=attn,
                                                        head_chunk_tokens=chunk).token_logprobs)
    draw = stratified_masks(attn, p, n=2, generator=torch.Generator().manual_seed(1))
    assert_same(model, lambda m: elbo(m, ids, draw, attention_mask=attn, head_chunk_tokens=chunk).mean)
    espo = espo_masks(attn, p, n=1, generator=torch.Generator().manual_seed(8))
    assert_same(model, lambda m: elbo_term(m, ids, espo, 0, attention_mask=attn, reduce_var=True,
                                           head_chunk_tokens=chunk).total)


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_block_elbo_terms_equal_packed(family):
    model = tiny(family)
    ids, attn, p = batch(model, "mixed")
    draw = ebpo_block_masks(attn, p, block_length=model.traits.block_size, n=2,
                            generator=torch.Generator().manual_seed(2))
    assert_same(model, lambda m: elbo_term(m, ids, draw, 0, attention_mask=attn).per_block)


# --- SFT and VRPO -----------------------------------------------------------------------------------------------

def sft_examples(lengths):
    g = torch.Generator().manual_seed(11)
    return [SFTExample(torch.randint(0, 200, (pl,), generator=g).tolist(),
                       torch.randint(0, 200, (al,), generator=g).tolist()) for pl, al in lengths]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("lengths", [[(3, 5), (9, 14), (4, 2), (12, 7)], [(6, 6), (6, 7), (5, 6)]])
@pytest.mark.parametrize("chunk", [None, 5])
def test_sft_loss_equals_packed(family, lengths, chunk):
    """The own-length objective (`collate_own_length`), padded with hidden padding vs packed: same loss, gradient."""
    model = tiny(family)
    ids, plen, alen, lens = collate_own_length(sft_examples(lengths), model.traits.pad_token_id)
    (v_pad, g_pad), (v_pack, g_pack) = [_sft_value_and_grad(model, ids, plen, alen, lens, packing, chunk)
                                        for packing in (False, True)]
    assert rel(v_pack, v_pad) <= TOL and rel(g_pack, g_pad) <= TOL


def _sft_value_and_grad(model, ids, plen, alen, lens, packing, chunk):
    model.zero_grad(set_to_none=True)
    loss = sft_loss(model, ids, plen, alen, torch.Generator().manual_seed(5), head_chunk_tokens=chunk, lengths=lens,
                    packing=packing)
    loss.backward()
    return loss.detach(), grads(model)


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_the_sft_trainer_with_packing_steps_on_the_padded_own_length_loss(family):
    """train_sft with SFTConfig(packing=True): its first step's loss is the own-length objective computed padded."""
    import copy

    from dare_bench.trainers.sft import SFTConfig, train_sft

    model = tiny(family)
    reference = copy.deepcopy(model)
    examples = sft_examples([(3, 5), (9, 14), (4, 2), (12, 7), (5, 5)])
    cfg = SFTConfig(steps=1, batch_size=4, lr=1e-3, seed=3, packing=True)
    result = train_sft(model, examples, cfg)
    g = torch.Generator().manual_seed(3)
    picked = [examples[i] for i in torch.randint(len(examples), (4,), generator=g).tolist()]
    ids, plen, alen, lens = collate_own_length(picked, reference.traits.pad_token_id)
    reference.train()
    with torch.no_grad():
        padded = sft_loss(reference, ids, plen, alen, g, cfg.eps, lengths=lens, packing=False)
    assert abs(result.losses[0] - float(padded)) <= TOL * abs(float(padded))


def test_vrpo_loss_equals_packed():
    policy, reference = tiny("llada", 0), tiny("llada", 1)
    reference.requires_grad_(False)
    ids, attn, p = batch(policy, "mixed")
    attn[:, p:] = 1  # VRPO scores the responses' EOS padding: only prompt-side padding is hidden
    out = []
    for packing in (False, True):
        policy.zero_grad(set_to_none=True)
        loss = vrpo_loss(policy, reference, ids, attn, p, beta=0.2, mc_samples=2,
                         generator=torch.Generator().manual_seed(6), packing=packing)[0]
        loss.backward()
        out.append((loss.detach(), grads(policy)))
    assert rel(out[1][0], out[0][0]) <= TOL and rel(out[1][1], out[0][1]) <= TOL


# --- the RL plug-ins --------------------------------------------------------------------------------------------

def packs(name):
    return get_algorithm(name).Config.packing_refused is None


def rollout(model, mix, group=3):
    """A rollout batch with left-padded prompts of different lengths and completions ending at different EOS."""
    g = torch.Generator().manual_seed(21)
    lefts = [0, 4, 7, 2, 6, 1]
    n, plen, clen = len(lefts), 10, 12
    prompt = torch.randint(0, 10, (n, plen), generator=g)  # the micro models' digits
    pmask = torch.ones(n, plen, dtype=torch.long)
    for r, left in enumerate(lefts):
        prompt[r, :left] = model.traits.pad_token_id
        pmask[r, :left] = 0
    comp = torch.randint(0, 10, (n, clen), generator=g)
    cmask = torch.zeros(n, clen, dtype=torch.long)
    for r, end in enumerate([12, 3, 8, 5, 12, 1]):
        cmask[r, :end] = 1
        comp[r, end - 1] = model.traits.eos_token_id
        comp[r, end:] = model.traits.eos_token_id
    rewards = torch.rand(n, generator=g)
    return RolloutBatch(prompt, pmask, comp, cmask, rewards, group)


PLUGIN_CASES = [(name, fam) for name in list_algorithms() if packs(name)
                for fam, kind in (("llada", "bidirectional"), ("sdar", "block_causal"))
                if kind in get_algorithm(name).attention_kinds]


@pytest.mark.parametrize("name,family", PLUGIN_CASES, ids=[f"{a}-{b}" for a, b in PLUGIN_CASES])
def test_every_packing_plugin_has_the_same_loss_and_gradient_packed(name, family):
    """prepare (old / reference terms, μ = 2) and backward of iteration 1 on a padded batch, the models plain vs
    wrapped as the loop wraps them with train.packing."""
    policy, reference = grad_check.micro_model(family, 0), grad_check.micro_model(family, 1)
    reference.requires_grad_(False)
    algo, _ = grad_check._plugin(name, policy.traits)
    batch = rollout(policy, "mixed")
    adv = algo.advantages(batch.rewards, batch.group_size)
    algo.optimizer_step, algo.total_optimizer_steps, algo.forward_batch_size = 0, 2, batch.num_rows
    forwards, packed_calls = [], []
    policy.register_forward_hook(lambda *a: forwards.append(1))

    class Counting(PackedModel):
        def __call__(self, *args, **kwargs):
            packed_calls.append(1)
            return super().__call__(*args, **kwargs)

    out = []
    for packing in (False, True):
        forwards.clear()
        pol = Counting(policy, policy.traits) if packing else policy
        ref = Counting(reference, policy.traits) if packing else reference
        state = algo.prepare(batch, pol, ref if algo.config.kl_beta > 0 else None,
                             generator=torch.Generator().manual_seed(3), num_iterations=2)
        policy.zero_grad(set_to_none=True)
        metrics = algo.backward(pol, batch, state, adv, loss_scale=1.0, iteration=1)
        out.append((torch.tensor(metrics["loss"]), grads(policy)))
    assert forwards and len(packed_calls) >= len(forwards)  # every policy forward of the packed run was packed
    (l_pad, g_pad), (l_pack, g_pack) = out
    assert abs(float(l_pack - l_pad)) <= TOL * abs(float(l_pad)) + 1e-7 and rel(g_pack, g_pad) <= TOL, \
        (float(l_pack), float(l_pad), rel(g_pack, g_pad))


def test_plugins_that_cannot_pack_say_so_and_the_loader_refuses_the_switch():
    from dare_bench.catalogue import algorithm
    from dare_bench.config import TrainSettings

    refused = {name for name in list_algorithms() if not packs(name)}
    assert refused == {"cj_grpo", "tracerl", "dtreerpo", "mdpo"}
    train = TrainSettings(kind="none", packing=True)
    for name in refused:
        with pytest.raises(Exception, match="packing is not supported"):
            algorithm(name.replace("_", "-")).settings(train)
    assert algorithm("d1").settings(train).packing is True


def test_the_switch_is_out_of_dumps_at_its_default_and_reaches_every_trainer():
    from dare_bench.catalogue.settings import algorithm_settings
    from dare_bench.config import TrainSettings
    from dare_bench.pipeline.train import _recipe

    assert "packing" not in TrainSettings(kind="none").model_dump()  # old hashes and baselines kept
    train = TrainSettings(kind="none", packing=True)
    assert train.model_dump()["packing"] is True
    assert algorithm_settings(train)["packing"] is True  # the RL plug-ins (the loop reads it)
    assert _recipe(train)["packing"] is True  # SFTConfig / PreferenceConfig


def test_paper_rl_profiles_pack_where_the_plugin_can():
    from dare_bench import catalogue
    from dare_bench.registry import load_registry

    seen = set()
    for spec in load_registry():
        algo = catalogue.algorithm(spec.algorithm)
        if algo.kind != "rl" or "paper" not in spec.scales:
            continue
        refused = get_algorithm(algo.plugin).Config.packing_refused
        assert spec.scales["paper"].train.packing is (refused is None), spec.name
        assert all(not p.train.packing for s, p in spec.scales.items() if s != "paper"), spec.name
        seen.add(spec.algorithm)
    assert {"d1", "bgpo", "cj-grpo", "mdpo"} <= seen
