"""Mixed precision for the trainers: master weights and optimizer state in fp32, compute in bf16 / fp16.

Stepping bf16 weights directly loses small updates: bf16 keeps 8 significant bits, so near |w| = 0.01 its spacing
is ~6e-5 and an AdamW step of lr 5e-7 rounds to nothing (DARE's recipes use 5e-7 .. 1e-6). The trainers therefore
keep the parameters in fp32 and run their forwards under `torch.autocast` in the compute dtype, the single-device
form of FSDP2's `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`.

    from dare_bench.trainers.precision import compute_precision, master_weights
    model = master_weights(model)                       # fp32 parameters (a no-op when they already are)
    with compute_precision(model, "bfloat16"):          # forward + backward in bf16, gradients land in fp32
        loss = ...; loss.backward()
"""

from __future__ import annotations

import contextlib

import torch

from dare_bench.errors import ConfigError

COMPUTE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype(name: str | None) -> torch.dtype:
    if name is None:
        return torch.float32
    if name not in COMPUTE_DTYPES:
        raise ConfigError(f"compute dtype {name!r} is not one of {', '.join(COMPUTE_DTYPES)}")
    return COMPUTE_DTYPES[name]


def master_weights(model):
    """The model with fp32 floating-point parameters (the optimizer then keeps fp32 state too)."""
    if any(p.is_floating_point() and p.dtype != torch.float32 for p in model.parameters()):
        model = model.float()
    return model


def compute_precision(model, compute_dtype: str | None):
    """`torch.autocast` in `compute_dtype` on the model's device; nothing for float32 / None (the numbers of an
    all-fp32 run, bit for bit)."""
    dtype = _dtype(compute_dtype)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    device = next(model.parameters()).device.type
    return torch.autocast(device_type=device, dtype=dtype)
