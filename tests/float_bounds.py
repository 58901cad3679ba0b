"""Comparisons against official fixtures that hold on every CPU the suite runs on.

A fixture made by the official code on one CPU and recomputed on another agrees to the last bit only where both
run the same kernels: float64 log-softmax / logsumexp reductions differ by 1-2 ulps between AVX-512 and AVX2
builds of the same torch (measured: 8.9e-16 on log-probs of about -4, 1.4e-17 on gradients of about 1e-2). A bound
of a few ulps of the larger magnitude keeps that noise and still fails on any real drift (a wrong mask, weight or
reduction moves these numbers by 1e-3 or more).
"""

from __future__ import annotations

import torch

ULPS = 8


def assert_same_up_to_ulps(actual: torch.Tensor, expected: torch.Tensor, ulps: int = ULPS, what: str = "") -> None:
    """|actual - expected| <= ulps x eps(dtype) x max(|expected|, 1) elementwise, same shape and dtype."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, (what, actual.shape, expected.shape)
    eps = torch.finfo(expected.dtype).eps
    bound = ulps * eps * expected.abs().clamp_min(1.0)
    diff = (actual - expected).abs()
    assert bool((diff <= bound).all()), f"{what}: max |diff| {float(diff.max()):.3g} over the {ulps}-ulp bound"
