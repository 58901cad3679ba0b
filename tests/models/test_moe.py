"""Grouped MoE experts (`model.moe: grouped`, dare_bench/models/moe.py) equal the per-expert loop: both MoE blocks
(LLaDA2, the SDAR / Qwen3-MoE variant), forward and backward, fp32 tight and bf16 within the fixtures' tolerance,
with experts that get no token, top_k 1..3, shared experts present or absent, the portable `mm` kernel and
autocast. The official LLaDA2 fixtures (logits, routers, training loss, generation) pass with grouped experts, and
the pack never changes what is saved, loaded, adapted (LoRA) or copied."""

import copy
import importlib.util
import json

import pytest
import torch

from dare_bench.models import load_pretrained, set_moe
from dare_bench.models.llada2 import LLaDA2SparseMoe
from dare_bench.models.moe import MOE_MODES, RoutedExperts, moe_blocks
from dare_bench.models.sdar import Qwen3MoeBlock

from testpaths import REPO

pytestmark = pytest.mark.usefixtures("one_thread")

PARITY_TOL = 1e-4  # tests/models/test_llada2_parity.py: ATOL = RTOL = 1e-4
FP32_TOL = 1e-6


def _llada2_block(*, top_k=2, shared=1, experts=16, hidden=64, inter=32, n_group=2, topk_group=2, seed=0):
    cfg = {"hidden_size": hidden, "moe_intermediate_size": inter, "num_experts": experts,
           "num_experts_per_tok": top_k, "n_group": n_group, "topk_group": topk_group,
           "routed_scaling_factor": 2.5, "num_shared_experts": shared}
    return _init(LLaDA2SparseMoe(cfg), seed)


def _qwen3_block(*, top_k=2, norm=True, experts=16, hidden=64, inter=32, seed=0):
    cfg = {"hidden_size": hidden, "moe_intermediate_size": inter, "num_experts": experts,
           "num_experts_per_tok": top_k, "norm_topk_prob": norm}
    return _init(Qwen3MoeBlock(cfg), seed)


def _init(block, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in block.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) / max(p.shape[-1], 1) ** 0.5)
        for name, b in block.named_buffers():
            if name.endswith("expert_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
    return block


def _run(block, mode, x, *, backward=False):
    block.experts.set_impl(mode)
    block.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(backward)
    calls = _count_grouped(block.experts)
    out, (logits, idx) = block(x)
    n = calls()
    assert (n >= 1) if mode == "grouped" else (n == 0), block.experts.fallback_reason  # the grouped path ran
    grads = None
    if backward:
        (out.float() * torch.linspace(-1, 1, out.shape[-1], device=out.device)).sum().backward()
        grads = {"input": x.grad, **{n: p.grad for n, p in block.named_parameters()}}
    return out.detach(), logits, idx, grads


def _count_grouped(experts):
    n = [0]
    orig = experts.grouped

    def wrapped(*a, **k):
        n[0] += 1
        return orig(*a, **k)

    experts.grouped = wrapped

    def count():
        del experts.grouped
        return n[0]
    return count


def _assert_same(a, b, tol):
    out_a, logits_a, idx_a, grads_a = a
    out_b, logits_b, idx_b, grads_b = b
    assert torch.equal(idx_a, idx_b) and torch.equal(logits_a, logits_b)  # routing is shared code
    torch.testing.assert_close(out_b, out_a, atol=tol, rtol=tol)
    if grads_a is not None:
        assert grads_a.keys() == grads_b.keys()
        for name in grads_a:
            ga, gb = grads_a[name], grads_b[name]
            # an expert with no token gets no gradient in either mode (so no optimizer step moves it)
            assert (ga is None) == (gb is None), name
            if ga is not None:
                # a weight gradient sums over tokens, so its rounding scales with the largest entry, not with each
                # entry (measured on an AMD EPYC: 4e-6 on entries of ~10 under the mm kernel, 2 fp32 ulps of 17)
                scale = max(1.0, float(ga.abs().max()))
                torch.testing.assert_close(gb, ga, atol=tol * scale, rtol=tol, msg=name)


def _unused_experts(idx, n):
    return n - len(set(idx.reshape(-1).tolist()))


BLOCKS = {
    "llada2-k2-shared": lambda **k: _llada2_block(top_k=2, shared=1, **k),
    "llada2-k1-noshared": lambda **k: _llada2_block(top_k=1, shared=None, **k),
    "llada2-k3-shared2-onegroup": lambda **k: _llada2_block(top_k=3, shared=2, n_group=1, topk_group=1, **k),
    "qwen3-k2-norm": lambda **k: _qwen3_block(top_k=2, norm=True, **k),
    "qwen3-k1": lambda **k: _qwen3_block(top_k=1, norm=False, **k),
    "qwen3-k3": lambda **k: _qwen3_block(top_k=3, norm=False, **k),
}


@pytest.mark.parametrize("tokens", [1, 3, 40])
@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_grouped_equals_loop_fp32_forward_backward(kind, tokens):
    block = BLOCKS[kind]()
    x = torch.randn(1, tokens, 64, generator=torch.Generator().manual_seed(tokens))
    loop = _run(block, "loop", x, backward=True)
    grouped = _run(block, "grouped", x, backward=True)
    _assert_same(loop, grouped, FP32_TOL)
    if tokens < 8:  # 16 experts, at most 3 * 3 picks: some experts get no token (None gradients, checked above)
        assert _unused_experts(loop[2], 16) > 0
        assert any(g is None for n, g in loop[3].items() if n.startswith("experts."))


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_cpu_chunks_of_experts_equal_the_loop(kind, monkeypatch):
    """Thousands of rows on CPU run in cache-sized chunks of experts (forced here with a tiny chunk size): still the
    loop's outputs and gradients."""
    import dare_bench.models.moe as moe

    monkeypatch.setattr(moe, "CPU_CHUNK_ELEMENTS", 64 * 7)
    block = BLOCKS[kind]()
    x = torch.randn(1, 40, 64, generator=torch.Generator().manual_seed(4))
    counts = torch.bincount(block(x)[1][1].reshape(-1), minlength=16)
    assert len(moe.cpu_chunks(x.device, int(counts.sum()), 64, counts)) > 3
    _assert_same(_run(block, "loop", x, backward=True), _run(block, "grouped", x, backward=True), FP32_TOL)


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_grouped_equals_loop_bf16(kind):
    """bf16: outputs within the fixtures' tolerance (on CPU they are bit-identical); gradients no further from
    the fp32 gradients than the loop's own (Qwen3 with top_k 3 sums a token's three input-gradient parts in another
    order, one bf16 rounding apart)."""
    block = BLOCKS[kind]()
    x = torch.randn(2, 24, 64, generator=torch.Generator().manual_seed(1))
    ref = _run(block, "loop", x, backward=True)
    block = block.to(torch.bfloat16)
    loop = _run(block, "loop", x.bfloat16(), backward=True)
    grouped = _run(block, "grouped", x.bfloat16(), backward=True)
    assert grouped[0].dtype == torch.bfloat16
    assert torch.equal(loop[2], grouped[2])
    torch.testing.assert_close(grouped[0], loop[0], atol=PARITY_TOL, rtol=PARITY_TOL)
    for name, g_ref in ref[3].items():
        assert (loop[3][name] is None) == (grouped[3][name] is None) == (g_ref is None), name
        if g_ref is not None:
            err_loop = (loop[3][name].float() - g_ref).abs().max()
            err_grouped = (grouped[3][name].float() - g_ref).abs().max()
            bf16_ulp = g_ref.abs().max() * 2 ** -8
            assert err_grouped <= err_loop + bf16_ulp, name


@pytest.mark.gpu
@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_grouped_mm_on_cuda_equals_loop(kind, monkeypatch):
    """CUDA bf16, where the grouped path is `torch._grouped_mm` itself (counted): outputs within one bf16 rounding
    of the loop's, and gradients no further from the fp32 loop's (TF32 off) than the bf16 loop's own."""
    calls = [0]
    real = torch._grouped_mm

    def counted(*a, **k):
        calls[0] += 1
        return real(*a, **k)

    monkeypatch.setattr(torch, "_grouped_mm", counted)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    block = BLOCKS[kind]().cuda()
    x = torch.randn(2, 96, 64, generator=torch.Generator().manual_seed(3)).cuda()
    ref = _run(block, "loop", x, backward=True)
    block = block.to(torch.bfloat16)
    loop = _run(block, "loop", x.bfloat16(), backward=True)
    grouped = _run(block, "grouped", x.bfloat16(), backward=True)
    assert calls[0] >= 2, "the grouped path did not reach torch._grouped_mm on CUDA"
    assert torch.equal(loop[2], grouped[2])
    torch.testing.assert_close(grouped[0], loop[0], atol=2 ** -7, rtol=2 ** -7)
    for name, g_ref in ref[3].items():
        assert (loop[3][name] is None) == (grouped[3][name] is None) == (g_ref is None), name
        if g_ref is not None:
            err_loop = (loop[3][name].float() - g_ref).abs().max()
            err_grouped = (grouped[3][name].float() - g_ref).abs().max()
            assert err_grouped <= err_loop + g_ref.abs().max() * 2 ** -7, name


@pytest.mark.parametrize("kind", ["llada2-k2-shared", "qwen3-k2-norm"])
def test_grouped_under_autocast_equals_loop(kind):
    """fp32 master weights, bf16 compute (trainers/precision.py): the pack is cast as F.linear casts its weight, and
    the gradients land in fp32 on each expert's own weight."""
    block = BLOCKS[kind]()
    x = torch.randn(1, 30, 64, generator=torch.Generator().manual_seed(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loop = _run(block, "loop", x, backward=True)
        grouped = _run(block, "grouped", x, backward=True)
    assert all(g is None or g.dtype == torch.float32 for g in grouped[3].values())
    _assert_same(loop, grouped, PARITY_TOL)


@pytest.mark.parametrize("kind", ["llada2-k2-shared", "qwen3-k2-norm"])
def test_portable_mm_kernel_when_grouped_mm_cannot_run(kind):
    """An intermediate size whose rows are not 16-byte aligned: grouped mode runs one mm per expert on the pack."""
    block = BLOCKS[kind](inter=6)
    block.experts.set_impl("grouped")
    assert block.experts._pack.kernel == "mm"
    x = torch.randn(1, 20, 64, generator=torch.Generator().manual_seed(3))
    _assert_same(_run(block, "loop", x, backward=True), _run(block, "grouped", x, backward=True), FP32_TOL)


def test_float64_falls_back_to_the_loop():
    block = _llada2_block().double()
    block.experts.set_impl("grouped")
    assert block.experts.grouped_weights() is None and "float64" in block.experts.fallback_reason
    x = torch.randn(1, 5, 64, dtype=torch.float64)
    out, _ = block(x)
    block.experts.set_impl("loop")
    assert torch.equal(block(x)[0], out)


# --- the pack: views, state dict, moves, copies, loads -------------------------------------------------------------
def _packed(model) -> bool:
    blocks = moe_blocks(model)
    return bool(blocks) and all(b.grouped_weights() is not None for b in blocks)


def test_pack_keeps_the_state_dict_and_follows_moves(tmp_path):
    loop = load_pretrained("tiny-llada2")
    grouped = load_pretrained("tiny-llada2", moe="grouped")
    assert _packed(grouped) and not any(b.grouped_weights() for b in moe_blocks(loop))
    a, b = loop.state_dict(), grouped.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in b
    ids = torch.randint(0, 4000, (2, 37), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = loop(ids)
        torch.testing.assert_close(grouped(ids), ref, atol=FP32_TOL, rtol=FP32_TOL)
        # saved from the pack (weights are views of it), the checkpoint is the loop model's, tensor for tensor
        grouped.save_pretrained(tmp_path / "ck")
        again = load_pretrained(tmp_path / "ck", moe="grouped")
        assert _packed(again)
        c = again.state_dict()
        assert list(c) == list(a) and all(torch.equal(c[k], a[k]) for k in a)
        torch.testing.assert_close(again(ids), ref, atol=FP32_TOL, rtol=FP32_TOL)
        # .to() gives the weights new storage: the pack follows
        half = copy.deepcopy(grouped).to(torch.bfloat16)
        assert _packed(half) and _packed(grouped)
        assert next(iter(moe_blocks(half)))._pack.gate_up.dtype == torch.bfloat16
        # deepcopy (a KL reference, VRPO's frozen copy): its own pack over its own weights
        twin = copy.deepcopy(grouped)
        assert _packed(twin)
        w0 = twin.model.layers[1].mlp.experts[0].gate_proj.weight
        assert w0.data_ptr() != grouped.model.layers[1].mlp.experts[0].gate_proj.weight.data_ptr()
        # in-place load keeps the views; the new values are what the pack holds
        twin.load_state_dict({k: v + 1 for k, v in a.items()})
        assert _packed(twin)
        assert torch.equal(twin.model.layers[1].mlp.experts[0].gate_proj.weight, a[
            "model.layers.1.mlp.experts.0.gate_proj.weight"] + 1)
        torch.testing.assert_close(twin(ids), set_moe(twin, "loop")(ids), atol=FP32_TOL, rtol=FP32_TOL)
        # load_state_dict(assign=True) puts new tensors in place of the views: the block repacks over them
        set_moe(twin, "grouped")
        twin.load_state_dict({k: v.clone() for k, v in a.items()}, assign=True)
        assert _packed(twin)
        torch.testing.assert_close(twin(ids), ref, atol=FP32_TOL, rtol=FP32_TOL)


def test_optimizer_steps_write_through_the_pack():
    model = load_pretrained("tiny-llada2", moe="grouped").train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 4000, (2, 16), generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        opt.zero_grad()
        model(ids).float().logsumexp(-1).mean().backward()
        opt.step()
    assert _packed(model)
    with torch.no_grad():
        grouped = model(ids)
        torch.testing.assert_close(set_moe(model, "loop")(ids), grouped, atol=FP32_TOL, rtol=FP32_TOL)


def test_grouped_training_equals_loop_training():
    """A few AdamW steps from the same weights: the same weights after, loop or grouped (fp32)."""
    ids = torch.randint(0, 4000, (2, 24), generator=torch.Generator().manual_seed(0))
    finals = {}
    for mode in MOE_MODES:
        model = load_pretrained("tiny-llada2", moe=mode).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(3):
            opt.zero_grad()
            model(ids).float().logsumexp(-1).mean().backward()
            opt.step()
        finals[mode] = model.state_dict()
    for k, v in finals["loop"].items():
        torch.testing.assert_close(finals["grouped"][k], v, atol=1e-5, rtol=1e-5, msg=k)


def test_lora_adapted_experts_run_the_loop_and_match():
    """peft wraps the experts' Linears (default targets: every Linear but the head): the block falls back to the
    loop, so the adapters are applied exactly; the adapters and targets are the same in both modes."""
    from dare_bench.trainers.lora import apply_lora, default_lora_targets

    class Lora:
        r, alpha, dropout, target_modules, quant_4bit = 4, 8, 0.0, None, False

    ids = torch.randint(0, 4000, (1, 20), generator=torch.Generator().manual_seed(0))
    outs, targets = {}, {}
    for mode in MOE_MODES:
        base = load_pretrained("tiny-llada2", moe=mode)
        targets[mode] = default_lora_targets(base)
        torch.manual_seed(0)  # peft draws lora_A from the global generator
        model = apply_lora(base, Lora())
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.fill_(0.01)  # a non-zero adapter, so the experts' adapters matter
            outs[mode] = model(ids)
        blocks = moe_blocks(model)
        assert all(b.grouped_weights() is None for b in blocks)
        if mode == "grouped":
            assert all("LoRA" in b.fallback_reason for b in blocks)
    assert targets["loop"] == targets["grouped"]
    assert any(".experts.3.down_proj" in t for t in targets["grouped"])
    torch.testing.assert_close(outs["grouped"], outs["loop"], atol=0, rtol=0)


def test_set_moe_checks_and_dense_models():
    from dare_bench.errors import DareBenchError

    dense = load_pretrained("tiny-sdar", moe="grouped")  # no MoE block: nothing to do
    assert moe_blocks(dense) == []
    with pytest.raises(DareBenchError, match="unknown MoE expert mode"):
        load_pretrained("tiny-llada2", moe="fused")
    with pytest.raises(DareBenchError, match="no dare-bench backbone"):
        set_moe(torch.nn.Linear(2, 2), "grouped")


# --- the config switch ----------------------------------------------------------------------------------------------
def test_model_ref_moe_field_and_hash():
    from typing import get_args

    from dare_bench.config import ModelRef

    assert get_args(ModelRef.model_fields["moe"].annotation) == MOE_MODES
    loop = ModelRef(preset="tiny-llada2")
    assert loop.moe == "loop" and "moe" not in loop.model_dump()  # default left out: no existing hash moves
    grouped = ModelRef(preset="tiny-llada2", moe="grouped")
    assert grouped.model_dump()["moe"] == "grouped"
    with pytest.raises(ValueError):
        ModelRef(preset="tiny-llada2", moe="fused")


def test_llada2_paper_profile_runs_grouped_experts():
    from dare_bench.registry import load_registry

    specs = load_registry().select(backbone="llada2")
    assert specs
    for spec in specs:
        for scale, prof in spec.scales.items():
            # paper runs group the experts; tiny / micro (the pinned baselines) and official keep the loop
            assert prof.model.moe == ("grouped" if scale == "paper" else "loop"), (spec.name, scale)
    assert any("paper" in spec.scales for spec in specs)
    assert any("micro" in spec.scales for spec in specs)


# --- official fixtures with grouped experts -------------------------------------------------------------------------
def _grouped_loader(monkeypatch, module):
    calls = [0]
    orig = RoutedExperts.grouped

    def counted(self, *a, **k):
        calls[0] += 1
        return orig(self, *a, **k)

    monkeypatch.setattr(RoutedExperts, "grouped", counted)
    monkeypatch.setattr(module, "load_pretrained", lambda *a, **k: load_pretrained(*a, **{**k, "moe": "grouped"}))
    return calls


def test_llada2_official_fixture_with_grouped_experts(monkeypatch):
    """tests/models/test_llada2_parity.py's fixture cases (logits at atol 1e-4, exact router top-k, the dFactory
    training loss), with the model loaded grouped."""
    import test_llada2_parity as parity

    assert parity.FIXTURES
    calls = _grouped_loader(monkeypatch, parity)
    for d in parity.FIXTURES:
        parity.test_llada2_fixture_cases(d)
    assert calls[0] > 0


def _generation_module():
    path = REPO / "tests" / "diffusion" / "test_generation_parity.py"
    spec = importlib.util.spec_from_file_location("_moe_generation_parity", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_llada2_official_generation_with_grouped_experts(monkeypatch):
    """The official LLaDA2 generate() token ids (cached and recomputed), with grouped experts."""
    gen = _generation_module()
    cases = [c.values for c in gen.CASES if c.values[1] == "llada2"]
    assert cases
    calls = [0]
    orig = RoutedExperts.grouped

    def counted(self, *a, **k):
        calls[0] += 1
        return orig(self, *a, **k)

    monkeypatch.setattr(RoutedExperts, "grouped", counted)
    for fixture_dir, family, name, cache in cases:
        monkeypatch.setitem(gen._MODELS, fixture_dir, load_pretrained(fixture_dir, moe="grouped"))
        gen.test_generation_matches_official(fixture_dir, family, name, cache)
    assert calls[0] > 0


def _sdar_moe_config():
    from dare_bench.models.presets import preset_config

    cfg = preset_config("tiny-sdar")
    cfg.update(model_type="sdar_moe", architectures=["SDARMoeForCausalLM"], num_experts=8, num_experts_per_tok=2,
               moe_intermediate_size=64, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0])
    return cfg


def test_sdar_moe_model_grouped_equals_loop():
    from dare_bench.models.io import build_model

    torch.manual_seed(0)
    model = build_model(_sdar_moe_config())
    model.init_weights()
    assert len(moe_blocks(model)) == 3
    ids = torch.randint(0, 4000, (2, 33), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        loop = set_moe(model, "loop")(ids)
        grouped = set_moe(model, "grouped")(ids)
    assert _packed(model)
    torch.testing.assert_close(grouped, loop, atol=FP32_TOL, rtol=FP32_TOL)


def test_real_sdar_moe_config_names_unchanged():
    """SDAR-30B-A3B's weight map names every expert weight as before (meta device: shapes only)."""
    from dare_bench.models import from_config

    from testpaths import CHECKPOINTS

    ckpt = CHECKPOINTS / "SDAR-30B-A3B-Chat"
    model = from_config(ckpt)
    set_moe(model, "grouped")  # packing on meta is shapes only
    ix = json.loads((ckpt / "model.safetensors.index.json").read_text())
    assert set(model.state_dict()) == set(ix["weight_map"])


# --- FSDP2 (gloo, 2 ranks) ------------------------------------------------------------------------------------------
FSDP_RUNNER = r"""
import sys, torch
torch.set_num_threads(1)
from dare_bench.models import load_pretrained
from dare_bench.models.moe import moe_blocks
from dare_bench.trainers.distributed import (exit_worker, full_state_dict, gathered_for_inference, init_distributed,
                                             leave_distributed, shard_model, shard_rows)
mode, out = sys.argv[1], sys.argv[2]
info = init_distributed(device="cpu")
model = shard_model(load_pretrained("tiny-llada2", moe=mode).train(), info)
# plain SGD: an expert no token of the whole batch reached moves on neither path (one process: no gradient; two
# ranks: zero gradients, so the ranks reduce the same set), which AdamW's weight decay would not give
opt = torch.optim.SGD(model.parameters(), lr=1e-1)
ids = torch.randint(0, 4000, (4, 16), generator=torch.Generator().manual_seed(0))
rows = shard_rows(4, info)
for _ in range(2):
    opt.zero_grad()
    model(ids[rows]).float().logsumexp(-1).mean().backward()
    opt.step()
with torch.no_grad(), gathered_for_inference(model):
    logits = model(ids)
state = full_state_dict(model)
if info.rank == 0:
    torch.save({"state": state, "logits": logits,
                "fallback": [b.fallback_reason for b in moe_blocks(model)]}, out)
leave_distributed(info)
exit_worker(0)
"""


def _fsdp_run(tmp_path, nproc, mode):
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "fsdp_runner.py"
    script.write_text(FSDP_RUNNER)
    out = tmp_path / f"{mode}-{nproc}.pt"
    if nproc == 1:
        cmd = [sys.executable, str(script), mode, str(out)]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node", str(nproc), "--master_addr",
               "127.0.0.1", "--master_port", str(port), str(script), mode, str(out)]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out, weights_only=False)


@pytest.mark.slow
def test_grouped_model_under_fsdp2_equals_one_process(tmp_path):
    """`model.moe: grouped` under FSDP2: the sharded experts are not views of the pack, so the blocks fall back to
    the loop (saying why) and train, gather for inference and save as one grouped process does. Every expert gets
    a gradient on every rank (zeros where a rank routed it no token); before, the ranks' reduce-scatters differed
    in size and gloo aborted."""
    one = _fsdp_run(tmp_path, 1, "grouped")
    two = _fsdp_run(tmp_path, 2, "grouped")
    assert one["fallback"] == [None] * 3
    assert all("FSDP2" in r for r in two["fallback"])
    assert one["state"].keys() == two["state"].keys()
    for name, w in one["state"].items():
        torch.testing.assert_close(two["state"][name], w, rtol=1e-5, atol=1e-5, msg=name)
    torch.testing.assert_close(two["logits"], one["logits"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["llada2-k2-shared", "qwen3-k2-norm"])
def test_multi_rank_gives_every_expert_a_zero_gradient(kind, monkeypatch):
    """Across ranks (faked here), an expert with no token gets zeros, not None, in both modes, and the others'
    gradients are unchanged."""
    block = BLOCKS[kind]()
    x = torch.randn(1, 2, 64, generator=torch.Generator().manual_seed(5))
    single = _run(block, "loop", x, backward=True)
    monkeypatch.setattr(RoutedExperts, "every_expert_gets_a_gradient", staticmethod(lambda: True))
    for mode in MOE_MODES:
        multi = _run(block, mode, x, backward=True)
        assert all(g is not None for g in multi[3].values())
        for name, g in single[3].items():
            if g is None:
                assert not multi[3][name].any(), name
            else:
                torch.testing.assert_close(multi[3][name], g, atol=FP32_TOL, rtol=FP32_TOL, msg=name)
