"""Mixed precision keeps fp32 master weights: a 5e-7 step (DARE's learning rate) changes them, where stepping bf16
weights directly rounds the same update away; float32 / None leaves training bit-identical."""

import copy

import torch

from dare_bench.config import TrainSettings
from dare_bench.models.io import load_pretrained
from dare_bench.trainers.loop import RLRunOptions, train_rl
from dare_bench.trainers.sft import SFTConfig, SFTExample, SFTRunOptions, train_sft

from rl_fakes import CharTokenizer, ReverseTask, micro_llada, rl_settings


def _examples(model):
    eos = model.traits.eos_token_id
    return [SFTExample([5 + i % 7, 6], [7 + i % 5, 8, eos]) for i in range(16)]


def _changed_fraction(before, after):
    changed = total = 0
    for (name, a), b in zip(before.items(), after.values()):
        changed += int((a.float() != b.float()).sum())
        total += a.numel()
    return changed / total


def _sft_step(model, compute_dtype):
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    cfg = SFTConfig(steps=1, lr=5e-7, batch_size=8, warmup_steps=0, weight_decay=0.0, seed=0)
    train_sft(model, _examples(model), cfg, SFTRunOptions(compute_dtype=compute_dtype))
    return before, {k: v.detach() for k, v in model.state_dict().items()}


def test_a_5e_7_step_changes_fp32_master_weights_and_not_bf16_weights():
    mixed = load_pretrained("tiny-llada")
    before, after = _sft_step(mixed, "bfloat16")
    assert all(p.dtype == torch.float32 for p in mixed.parameters())  # master weights stay fp32
    assert _changed_fraction(before, after) > 0.5

    pure_bf16 = load_pretrained("tiny-llada", dtype="bfloat16")
    before, after = _sft_step(pure_bf16, None)
    assert all(p.dtype == torch.bfloat16 for p in pure_bf16.parameters())
    assert _changed_fraction(before, after) < 0.05  # the same step rounds to nothing in bf16


def test_bf16_weights_given_to_a_mixed_run_become_fp32_masters():
    model = load_pretrained("tiny-llada", dtype="bfloat16")
    _sft_step(model, "bfloat16")
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_float32_compute_is_bit_identical_to_no_option():
    a, b = load_pretrained("tiny-llada"), load_pretrained("tiny-llada")
    cfg = SFTConfig(steps=3, lr=1e-3, batch_size=8, warmup_steps=0, seed=0)
    ra = train_sft(a, _examples(a), cfg)
    rb = train_sft(b, _examples(b), cfg, SFTRunOptions(compute_dtype="float32"))
    assert ra.losses == rb.losses
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_rl_loop_keeps_fp32_masters_under_bf16_compute():
    # two steps: the first bf16 rollout batch of this toy may tie every reward (zero advantage, zero gradient)
    model = micro_llada(0)
    start = copy.deepcopy(model.state_dict())
    train_rl(model, CharTokenizer(), ReverseTask(), "d1", TrainSettings(**rl_settings(steps=2, lr=5e-7)),
             options=RLRunOptions(progress=False, compute_dtype="bfloat16"))
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert _changed_fraction(start, model.state_dict()) > 0.5
