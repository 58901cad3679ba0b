"""Rank-aware helpers for the trainers and the pipeline: process-group setup from torchrun's environment (each
rank's device set from LOCAL_RANK before anything is loaded), FSDP2 sharding, row sharding, gradient and metric
reduction, full state dicts for rank-0 writes. Everything degrades to a no-op in a single process (the CPU /
one-GPU path).

Data parallelism: every rank draws the same global order, takes its contiguous share of each step's rows (whole
GRPO groups stay on one rank) and computes the mean loss of its share. Under torchrun the model is sharded with
FSDP2 (`shard_model`: `fully_shard` per decoder layer, then the root; `MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)` when the run computes in bf16, over fp32 master weights), which averages gradients in its
reduce-scatter; an unsharded model (a test's replicated ranks) averages them with `all_reduce_grads`. Generation
(rollouts, evaluation) runs inside `gathered_for_inference`: every layer's full weights are gathered once, so the
forwards issue no collectives and ranks may decode different numbers of steps or items.

    CPU (one process; everything below is a no-op):  dare-bench reproduce d1-llada-sudoku --scale tiny
    one GPU:   dare-bench reproduce d1-llada-sudoku --scale paper --checkpoint /ckpt/LLaDA-8B-Instruct --device cuda
    torchrun:  torchrun --nproc_per_node 8 -m dare_bench.cli reproduce d1-llada-sudoku --scale paper \
                   --checkpoint /ckpt/LLaDA-8B-Instruct --device cuda          # one process per GPU
    CPU check of the multi-rank path (gloo): pytest -m slow tests/trainers/test_checkpoint_resume.py -k torchrun
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Iterable, NoReturn

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


def init_distributed(backend: str | None = None, device: str | None = None) -> DistInfo:
    """Join torchrun's process group when WORLD_SIZE > 1: nccl when the run's device is CUDA (each rank's GPU pinned
    from LOCAL_RANK first), gloo on CPU."""
    import torch.distributed as dist

    info = dist_info()
    if info.world_size <= 1 or (dist.is_available() and dist.is_initialized()):
        return info
    on_cuda = device.startswith("cuda") if device is not None else torch.cuda.is_available()
    if on_cuda:
        torch.cuda.set_device(info.local_rank)
    dist.init_process_group(backend or ("nccl" if on_cuda else "gloo"))
    return dist_info()


def rank_device(device: str, info: DistInfo) -> str:
    """This rank's device: `cuda` means the GPU of LOCAL_RANK under torchrun (`cuda:<local_rank>`)."""
    if device == "cuda" and info.enabled:
        return f"cuda:{info.local_rank}"
    return device


# --- FSDP2 ----------------------------------------------------------------------------------------------------------
def decoder_layers(model) -> list[torch.nn.Module]:
    """The backbone's decoder layers: the ModuleList holding `num_layers` blocks (LLaDA's `blocks`, the others'
    `layers`), found through a PEFT wrapper too."""
    core = model.get_base_model() if hasattr(model, "get_base_model") else model
    n = core.num_layers
    for module in core.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n:
            return list(module)
    raise ConfigError(f"{type(core).__name__}: no ModuleList of its {n} decoder layers to shard")


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard_model(model, info: DistInfo, compute_dtype: str | None = None):
    """FSDP2 over the process group: `fully_shard` each decoder layer, then the root (embeddings, final norm, LM
    head). Parameters stay fp32 (the master copy, sharded with the optimizer state); with a bf16 `compute_dtype` each
    layer's weights are all-gathered in bf16 for compute and gradients reduced in fp32. No-op in one process."""
    if not info.enabled:
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from dare_bench.trainers.precision import COMPUTE_DTYPES

    dtype = COMPUTE_DTYPES[compute_dtype or "float32"]
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    # A layer's inputs keep their dtypes: the hidden states are already in the compute dtype (the root's embedding
    # runs in it), and the rotary cos / sin stay float32 as the models pass them (rope in full precision). Casting
    # them is also unsafe under activation checkpointing: FSDP2 skips its pre-forward hook, the cast included, when
    # the backward recomputes a layer, so the recompute sees float32 where the forward saw bf16 and torch.utils.
    # checkpoint refuses the mismatch (seen on an H200 with bf16 compute, issue #15 / #17's GPU script).
    layer_policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=layer_policy)
    # The root stays unsharded from its forward to its backward (FSDP2's own default for a root, made explicit so
    # `gathered_for_inference` can restore it): the chunked LM head reads the head weight after the forward returns.
    fully_shard(model, mp_policy=policy, reshard_after_forward=False)
    return model


@contextlib.contextmanager
def gathered_for_inference(model):
    """Hold every FSDP2 unit's full weights for the block (rollouts, evaluation): forwards then run without
    collectives, so ranks may take different numbers of decoding steps; resharded afterwards. No-op when unsharded."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    inner = {id(m) for unit in units for m in unit.modules() if m is not unit}
    for unit in units:
        unit.unshard()
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield model
    finally:
        for unit in units:
            unit.reshard()
            # as `shard_model` set them: layers reshard after their forward, the root does not (the chunked LM head
            # reads its weight after the forward; resharding it made that weight an empty storage under torchrun)
            unit.set_reshard_after_forward(id(unit) in inner, recurse=False)


def full_state_dict(model) -> dict[str, torch.Tensor]:
    """The model's full (unsharded) state dict on CPU: on rank 0 for a sharded model (a collective: every rank must
    call it), `{}` on the others; the plain state dict otherwise."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def full_optimizer_state_dict(model, optimizer) -> dict[str, Any]:
    """The optimizer state, unsharded, keyed by parameter name (rank 0; a collective) for a sharded model."""
    if not is_sharded(model):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer,
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def gathered_training_state(model, optimizer) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(full model state, full optimizer state) of a sharded model for a rank-0 checkpoint (collectives: every rank
    calls it); (None, None) when the model is not sharded (its own state dicts are already whole)."""
    if not is_sharded(model):
        return None, None
    return full_state_dict(model), full_optimizer_state_dict(model, optimizer)


def load_full_state(model, optimizer, model_state: dict[str, torch.Tensor], optimizer_state: dict[str, Any] | None):
    """Every rank loads the full state dicts written by `full_*_state_dict` into its shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_state, options=options)
    if optimizer is not None and optimizer_state is not None:
        set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)


def shard_rows(n: int, info: DistInfo) -> slice:
    """This rank's contiguous share of `n` items (n must divide evenly: every rank takes the same number)."""
    if n % info.world_size:
        raise ConfigError(f"{n} prompts per step do not split over {info.world_size} ranks")
    k = n // info.world_size
    return slice(info.rank * k, (info.rank + 1) * k)


def all_reduce_grads(params: Iterable[torch.nn.Parameter], info: DistInfo) -> None:
    """Average gradients over ranks (one flat all-reduce); FSDP2-sharded parameters (DTensor gradients, already
    reduce-scattered by FSDP) are left alone."""
    if not info.enabled:
        return
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None and not isinstance(p.grad, DTensor)]
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


def broadcast_object(obj: Any, info: DistInfo, src: int = 0) -> Any:
    """Rank `src`'s `obj` on every rank (rank 0 decides, e.g. the store's run id; the others follow)."""
    if not info.enabled:
        return obj
    import torch.distributed as dist

    box = [obj if info.rank == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier(info: DistInfo) -> None:
    if info.enabled:
        import torch.distributed as dist

        dist.barrier()


def leave_distributed(info: DistInfo) -> None:
    """End a rank's part in a run that finished: wait for every rank (none exits while another still talks to it),
    then leave the group. Only on the success path: a barrier after one rank failed would wait for a rank that never
    arrives. A torchrun worker then ends with `exit_worker`."""
    import torch.distributed as dist

    if info.enabled and dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def exit_worker(code: int) -> NoReturn:
    """End a torchrun worker without interpreter teardown. A gloo worker thread can still be releasing a finished
    collective that holds a Python object when the interpreter finalises; it then needs the GIL, is killed for it and
    the process aborts ("terminate called without an active exception", SIGABRT) after all its work was done: about
    one two-rank CPU run in five with FSDP2 and activation checkpointing (a core dump shows ~AsyncBarrierWork in
    ProcessGroupGloo::runLoop under Py_FinalizeEx). Every result is already written, committed and flushed here."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


__all__ = ["DistInfo", "all_reduce_grads", "all_reduce_metrics", "barrier", "broadcast_object", "decoder_layers",
           "dist_info", "exit_worker", "full_optimizer_state_dict", "full_state_dict", "gather_objects",
           "gathered_for_inference", "gathered_training_state", "init_distributed", "is_sharded", "leave_distributed",
           "load_full_state", "rank_device", "shard_model", "shard_rows"]
