"""How close a benchmark runs to the machine's limit: the matmul peak measured in the same run, and a FLOP model.

    from dare_bench.bench.roofline import matmul_peak, matmul_flops_per_token
    peak = matmul_peak("bfloat16", "cpu")                  # FLOP/s of a large GEMM, best of a few (AMX on this CPU)
    achieved = matmul_flops_per_token(model) * token_forwards / seconds
    print(achieved / peak["flops_per_second"])

The peak is a square `size` x `size` GEMM in `dtype` on `device` with the current torch thread count (so a
benchmark pinned to one thread compares with one thread's peak), timed `repeats` times after a warm-up, the best
kept. The FLOP model counts the weight matmuls only: 2 x (every 2-D weight a token goes through: attention and MLP
projections, the LM head; routed MoE experts counted at top-k of their experts) per token of a forward, 3x that
for forward + backward. It leaves out attention scores (4 x layers x d x context per token) and element-wise work,
so the fraction it gives is a lower bound on the machine's utilisation.
"""

from __future__ import annotations

import time
from typing import Any

# the FLOP model lives with the models: the trainers' compute meter (trainers/compute.py) counts with it too
from dare_bench.models.flops import matmul_flops_per_token


def matmul_peak(dtype: str = "bfloat16", device: str = "cpu", size: int = 2048, repeats: int = 5) -> dict[str, Any]:
    """{"flops_per_second", "dtype", "size", "threads"}: the best of `repeats` timed `size`^3 GEMMs."""
    import torch

    from dare_bench.models.io import resolve_dtype

    dt = resolve_dtype(dtype)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=g).to(device=device, dtype=dt)
    b = torch.randn(size, size, generator=g).to(device=device, dtype=dt)
    a @ b  # warm-up: kernel selection, first-touch allocation
    best = float("inf")
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ b
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return {"flops_per_second": 2.0 * size ** 3 / best, "dtype": dtype, "size": size,
            "threads": torch.get_num_threads()}


__all__ = ["matmul_flops_per_token", "matmul_peak"]
