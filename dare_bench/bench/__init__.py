"""`dare-bench bench ...`: benchmarks that print ratios measured in one run (never timed tests).

    dare-bench bench rollout [--json]    # cached / accelerated vs vanilla samplers, per family
    dare-bench bench memory  [--json]    # BGPO vs naive ELBO peak memory as MC samples grow
    dare-bench bench alignment NAME...   # each RL algorithm's gradient vs the supervised one, on shared rollouts
    dare-bench bench flex    [--json]    # BD3 training-mask attention at L = 4k: dense sdpa vs FlexAttention
    dare-bench bench packing [--json]    # one training step on d1's length mix, packed (train.packing) vs padded
    dare-bench bench moe     [--json]    # MoE experts, per-expert loop vs grouped matmuls (block, training, decode)
    dare-bench bench rlstep  [--json]    # one RL step of a paper recipe on a shrunk checkpoint, plain vs fast
    dare-bench bench tinyrl  [ENTRY]     # a tiny reproduction's RL stage, as pinned vs bf16 / dual-cache rollouts
    dare-bench bench fastdllm --official DIR   # cached LLaDA decoding vs the official Fast-dLLM code, same tokens
"""

from __future__ import annotations

import importlib

import typer

BENCH_MODULES = ["dare_bench.bench.rollout", "dare_bench.bench.memory", "dare_bench.bench.alignment",
                 "dare_bench.bench.flex", "dare_bench.bench.packing", "dare_bench.bench.moe",
                 "dare_bench.bench.rlstep", "dare_bench.bench.tinyrl", "dare_bench.bench.fastdllm"]


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Benchmarks that print speed / memory ratios measured in one run.", no_args_is_help=True)
    for name in BENCH_MODULES:
        importlib.import_module(name).register(group)
    app.add_typer(group, name="bench")
