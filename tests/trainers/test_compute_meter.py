"""The compute meter behind compute-matched SFT controls: tokens of every forward, priced 1x without gradients and
3x with them by the weight-matmul FLOP model; copies of the model (reference / old policy) count into it too."""

from __future__ import annotations

import copy

import torch

from dare_bench.check.gradients import micro_model
from dare_bench.models.flops import matmul_flops_per_token
from dare_bench.trainers.compute import ComputeMeter


def test_counts_forward_tokens_by_grad_mode_and_prices_them():
    model = micro_model("llada", seed=0)
    ids = torch.randint(0, 12, (3, 7))
    with ComputeMeter(model) as meter:
        with torch.no_grad():
            model(ids)                      # 21 inference tokens
        model(ids[:2]).sum().backward()     # 14 tokens with a backward
        reference = copy.deepcopy(model)    # a reference copy made inside the stage counts into the same meter
        with torch.no_grad():
            reference(ids[:1, :5])          # 5 more inference tokens
    assert (meter.token_forwards, meter.grad_token_forwards) == (26, 14)
    assert meter.flops == matmul_flops_per_token(model) * (26 + 3 * 14)
    model(ids)  # after the block: not counted
    assert meter.token_forwards == 26
    summary = meter.summary()
    assert summary["flops"] == meter.flops and "weight-matmul" in summary["counted"]


def test_stop_at_is_an_after_step_rule():
    model = micro_model("sdar", seed=0)
    with ComputeMeter(model) as meter:
        stop = meter.stop_at(matmul_flops_per_token(model) * 3 * 8)
        assert not stop(1)
        model(torch.randint(0, 12, (2, 4))).sum().backward()
        assert stop(2)
