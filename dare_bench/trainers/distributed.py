"""Rank-aware helpers for the RL loop: process-group setup from torchrun's environment, prompt sharding, gradient
and metric all-reduce. Everything degrades to a no-op in a single process (the CPU / one-GPU path).

Data parallelism is plain and explicit: every rank draws the same global prompt order, takes its contiguous share
of each step's prompts (whole GRPO groups stay on one rank), accumulates gradients locally and averages them with
one all-reduce before the optimizer step, so weights and optimizer states stay identical on every rank. There is
no FSDP2 sharding yet (issue #17): each rank holds the whole model, so a model must fit one device.

    CPU (one process; everything below is a no-op):  dare-bench reproduce d1-llada-sudoku --scale tiny
    one GPU:   dare-bench reproduce d1-llada-sudoku --scale paper --checkpoint /ckpt/LLaDA-8B-Instruct --device cuda
    torchrun:  torchrun --nproc_per_node 8 -m dare_bench.cli reproduce d1-llada-sudoku --scale paper \
                   --checkpoint /ckpt/LLaDA-8B-Instruct --device cuda          # one process per GPU
    CPU check of the multi-rank path (gloo): pytest -m slow tests/trainers/test_checkpoint_resume.py -k torchrun
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from dare_bench.errors import ConfigError


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def dist_info() -> DistInfo:
    """Rank / world size from an initialised process group, else from torchrun's environment, else single."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
    return DistInfo(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                    int(os.environ.get("LOCAL_RANK", 0)))


def init_distributed(backend: str | None = None) -> DistInfo:
    """Join torchrun's process group when WORLD_SIZE > 1 (nccl on CUDA, else gloo); pin this rank's GPU."""
    import torch.distributed as dist

    info = dist_info()
    if info.world_size <= 1 or (dist.is_available() and dist.is_initialized()):
        return info
    if torch.cuda.is_available():
        torch.cuda.set_device(info.local_rank)
    dist.init_process_group(backend or ("nccl" if torch.cuda.is_available() else "gloo"))
    return dist_info()


def shard_rows(n: int, info: DistInfo) -> slice:
    """This rank's contiguous share of `n` items (n must divide evenly: every rank takes the same number)."""
    if n % info.world_size:
        raise ConfigError(f"{n} prompts per step do not split over {info.world_size} ranks")
    k = n // info.world_size
    return slice(info.rank * k, (info.rank + 1) * k)


def all_reduce_grads(params: Iterable[torch.nn.Parameter], info: DistInfo) -> None:
    """Average gradients over ranks (one flat all-reduce)."""
    if not info.enabled:
        return
    import torch.distributed as dist

    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= info.world_size
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def all_reduce_metrics(metrics: dict[str, float], info: DistInfo) -> dict[str, float]:
    """Mean of each numeric metric over ranks (keys must agree across ranks)."""
    if not info.enabled:
        return metrics
    import torch.distributed as dist

    keys = sorted(k for k, v in metrics.items() if isinstance(v, (int, float)))
    t = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    t = (t / info.world_size).cpu()
    out = dict(metrics)
    out.update({k: float(v) for k, v in zip(keys, t.tolist())})
    return out


def gather_objects(obj: Any, info: DistInfo) -> list[Any]:
    """Every rank's `obj` (a picklable value), in rank order, on every rank."""
    if not info.enabled:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(info: DistInfo) -> None:
    if info.enabled:
        import torch.distributed as dist

        dist.barrier()


__all__ = ["DistInfo", "all_reduce_grads", "all_reduce_metrics", "barrier", "dist_info", "gather_objects",
           "init_distributed", "shard_rows"]
