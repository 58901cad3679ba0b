"""GDPO: the plug-in's settings (its knobs and its defaults of the shared ones), torch-free.

The catalogue reads `ALGORITHM` to validate reproductions at load time with this very class; the plug-in
(`dare_bench/trainers/algorithms/gdpo.py`) is built from it at run time. See `dare_bench/catalogue/__init__.py`.
Knob names and defaults are those of the official code (KevinRojas1499/GDPO @ 1918683: `gdpo/gdpo_config.py`,
`gdpo/slurm_scripts/train.yaml`, `gdpo/slurm_scripts/countdown_base.sbatch`, `gdpo/likelihood_estimators.py`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dare_bench.catalogue import AlgorithmSpec
from dare_bench.catalogue.settings import AlgorithmConfig, KlEstimator

# The official `logp_estimator` values of the semi-deterministic estimator: an N-point Gauss-Legendre rule over the
# diffusion time. (Upstream also names 'simpson', which its estimator class cannot build (KeyError), and 'mc' / 'd1',
# the LLaDA and d1 estimators of other plug-ins: not GDPO's estimator, not offered.)
QUADRATURE_RULES = ("gauss-1", "gauss-2", "gauss-3", "gauss-4", "gauss-5")
Quadrature = Literal[QUADRATURE_RULES]


class GDPOConfig(AlgorithmConfig):
    # one sequence-level ratio per completion and a mean over sequences (official `loss.mean()`): no token
    # aggregation, so loss_agg is accepted from the shared recipes and not used
    unused_shared_settings = frozenset({"loss_agg"})

    mc_samples: int = Field(1, ge=1)  # random masks per quadrature node (official `mc_batch_size`, default 1)
    kl_estimator: KlEstimator = "k3"  # official: k3 on the RAW sequence ELBOs (exp(E_ref - E) - (E_ref - E) - 1)
    # time quadrature: countdown_base.sbatch ESTIMATOR default gauss-3 (gdpo_config.py's default is gauss-2)
    quadrature: Quadrature = "gauss-3"
    # official `random_masking`: fresh mask seeds U{0..4095} per update iteration; false = seed 42 for every one
    random_masking: bool = True
    # which positions the ELBO masks and scores: "canvas" = the whole generated completion, post-EOS tokens included
    # (official: every `logits_to_keep` position, L = the completion length); "completion" = the tokens up to and
    # including the first EOS (the other ELBO plug-ins' layout: later positions are padding, never attended to)
    elbo_span: Literal["canvas", "completion"] = "canvas"


ALGORITHM = AlgorithmSpec(name="gdpo", kind="rl", knobs=GDPOConfig)
