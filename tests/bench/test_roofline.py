"""bench/roofline.py: the FLOP model counts exactly the weight matmuls a token passes through."""

from __future__ import annotations

import torch

from dare_bench.bench.roofline import matmul_flops_per_token, matmul_peak


def _by_hand(model, expert_share: float = 1.0) -> float:
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    total = 0.0
    for name, p in model.named_parameters():
        if p.dim() != 2 or id(p) in embeddings:
            continue
        total += p.numel() * (expert_share if ".experts." in name else 1.0)
    return 2.0 * total


def test_dense_model_counts_every_weight_matrix_but_the_input_embedding():
    from dare_bench.models.io import build_model
    from dare_bench.models.presets import preset_config

    model = build_model(preset_config("tiny-llada"))
    assert matmul_flops_per_token(model) == _by_hand(model)
    hidden, vocab = model.config["d_model"], model.config["vocab_size"]
    assert matmul_flops_per_token(model) > 2 * hidden * vocab  # the LM head's matmul is in
    heads = [p for n, p in model.named_parameters() if p.shape == (model.config.get("embedding_size") or vocab, hidden)]
    assert heads  # the LM head is a 2-D weight of its own (LLaDA does not tie it)


def test_moe_experts_count_at_top_k_over_experts():
    from dare_bench.models.io import build_model
    from dare_bench.models.presets import preset_config

    model = build_model(preset_config("tiny-llada2"))
    share = model.config["num_experts_per_tok"] / model.config["num_experts"]
    assert share < 1
    assert matmul_flops_per_token(model) == _by_hand(model, share)


def test_peak_is_a_positive_rate_at_the_current_thread_count():
    peak = matmul_peak("float32", "cpu", size=128, repeats=2)
    assert peak["flops_per_second"] > 0 and peak["threads"] == torch.get_num_threads() and peak["size"] == 128


def test_peak_size_stops_growing_once_a_gemm_takes_the_minimum_time():
    """Where a dtype has no hardware (bf16 on an AVX2 CPU: ~1 GFLOP/s) the GEMM stays small instead of taking
    20 s a call; where it is fast the size grows to `size`."""
    slow = matmul_peak("float32", "cpu", size=1024, repeats=1, min_seconds=0.0)
    assert slow["size"] == 256  # the first GEMM already took the minimum time
    fast = matmul_peak("float32", "cpu", size=512, repeats=1, min_seconds=1e9)
    assert fast["size"] == 512  # never slow enough: up to the cap
