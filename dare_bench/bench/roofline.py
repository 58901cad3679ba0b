"""How close a benchmark runs to the machine's limit: the matmul peak measured in the same run, and a FLOP model.

    from dare_bench.bench.roofline import matmul_peak, matmul_flops_per_token
    peak = matmul_peak("bfloat16", "cpu")                  # FLOP/s of a large GEMM, best of a few (AMX on this CPU)
    achieved = matmul_flops_per_token(model) * token_forwards / seconds
    print(achieved / peak["flops_per_second"])

The peak is a square GEMM in `dtype` on `device` with the current torch thread count (so a benchmark pinned to
one thread compares with one thread's peak), up to `size` x `size` (smaller where one GEMM already takes
`min_seconds`), timed `repeats` times after a warm-up, the best kept. The FLOP model counts the weight matmuls
only: 2 x (every 2-D weight a token goes through: attention and MLP projections, the LM head; routed MoE experts
counted at top-k of their experts) per token of a forward, 3x that for forward + backward. It leaves out attention
scores (4 x layers x d x context per token) and element-wise work, so the fraction it gives is a lower bound on the
machine's utilisation.
"""

from __future__ import annotations

import time
from typing import Any

# the FLOP model lives with the models: the trainers' compute meter (trainers/compute.py) counts with it too
from dare_bench.models.flops import matmul_flops_per_token


def matmul_peak(dtype: str = "bfloat16", device: str = "cpu", size: int = 2048, repeats: int = 5,
                min_seconds: float = 0.25) -> dict[str, Any]:
    """{"flops_per_second", "dtype", "size", "threads"}: the best of `repeats` timed GEMMs. The square size doubles
    from 256 up to `size` and stops at the first whose GEMM takes `min_seconds`: large enough to be compute-bound,
    and bounded where the dtype has no hardware (a CPU without bf16 units emulates it at ~1 GFLOP/s, where one
    2048^3 GEMM takes 20 s). The size used is recorded."""
    import torch

    from dare_bench.models.io import resolve_dtype

    dt = resolve_dtype(dtype)
    g = torch.Generator().manual_seed(0)

    def timed(a, b) -> float:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ b
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    n = min(256, size)
    while True:
        a = torch.randn(n, n, generator=g).to(device=device, dtype=dt)
        b = torch.randn(n, n, generator=g).to(device=device, dtype=dt)
        a @ b  # warm-up: kernel selection, first-touch allocation
        first = timed(a, b)
        if n >= size or first >= min_seconds:
            break
        n = min(2 * n, size)
    best = min([first] + [timed(a, b) for _ in range(repeats - 1)])
    return {"flops_per_second": 2.0 * n ** 3 / best, "dtype": dtype, "size": n,
            "threads": torch.get_num_threads()}


__all__ = ["matmul_flops_per_token", "matmul_peak"]
