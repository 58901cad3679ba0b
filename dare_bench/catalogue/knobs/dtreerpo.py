"""d-TreeRPO: the plug-in's settings (its knobs and its defaults of the shared ones), torch-free.

The catalogue reads `ALGORITHM` to validate reproductions at load time with this very class; the plug-in
(`dare_bench/trainers/algorithms/dtreerpo.py`) is built from it at run time. See `dare_bench/catalogue/__init__.py`.
Knob names are DARE's (yjyddq/DARE @ 83ae8a3, `recipe/llada/run_dtreerpo_llada_8b_instruct.sh` and the actor
`verl/workers/actor/llada_dp_actor_dtreerpo.py::update_policy`); the official trainer's names (THU-BPM/d-TreeRPO
@ 3eb6f21, `dtreerpo/dtreerpo_config.py`, `slurm_scripts/dtreerpo.yaml`) are accepted as aliases. Defaults are the
values of both recipes (which agree); the official config class's own defaults (T = 2, s = 4, one tree sample,
self-distillation off) are not what either recipe runs.
"""

from __future__ import annotations

from pydantic import AliasChoices, Field

from dare_bench.catalogue import AlgorithmSpec
from dare_bench.catalogue.settings import AlgorithmConfig


class DTreeRPOConfig(AlgorithmConfig):
    # d-TreeRPO's loss is fixed by the official trainer and DARE's actor: per segment the token mean over its changed
    # positions, then the mean over segments (no loss_agg choice); plain PPO clip (no dual clip); the KL term is
    # always the unclamped k3 exp(d) - d - 1 (DARE's recipe sets kl_loss_type low_var_kl, which its actor ignores).
    # lm_head_chunk_tokens: its self-distillation reads the parents' whole log-softmax [g, C, V] (full logits)
    unused_shared_settings = frozenset({"loss_agg", "clip_ratio_c", "kl_estimator", "lm_head_chunk_tokens"})
    packing_refused = ("dtreerpo calls the model on its tree's denoising canvases with the sampler's "
                       "arguments, not padded training forwards")

    clip_eps: float = Field(0.4, gt=0, lt=1)  # official `epsilon`, DARE `clip_ratio` (both recipes 0.4)
    # children of every non-root node (T; official `tree_branch_factor`, recipes 4)
    tree_branch_factor: int = Field(4, gt=0)
    # s: the denoising steps are cut at S - int(k S / s), k = 1..s (official `tree_contraction_factor`, recipes 2)
    tree_contraction_factor: int = Field(2, gt=0)
    # children of the root: the independent first-level samples of a prompt (official `num_tree_samples`, recipes 4)
    num_tree_samples: int = Field(4, gt=0)
    # the time-scheduled self-distillation term (DARE `enable_self_distillation`, official
    # `enable_self_distillation_loss`; both recipes on)
    self_distillation: bool = Field(True, validation_alias=AliasChoices(
        "self_distillation", "enable_self_distillation", "enable_self_distillation_loss"))
    # lambda(t) = lambda_max (e^{gamma t/T} - 1) / (e^gamma - 1); tau(t) = max(tau_max (1 - t/T)^beta, 1e-6)
    sd_lambda_max: float = Field(3e-3, ge=0, validation_alias=AliasChoices(
        "sd_lambda_max", "self_distillation_lambda_max"))
    sd_gamma: float = Field(2.0, gt=0, validation_alias=AliasChoices("sd_gamma", "self_distillation_gamma"))
    sd_tau_max: float = Field(2.0, gt=0, validation_alias=AliasChoices("sd_tau_max", "self_distillation_tau_max"))
    sd_beta: float = Field(0.7, ge=0, validation_alias=AliasChoices("sd_beta", "self_distillation_beta"))
    # T of the schedule, in optimizer steps; None = the run's own length (the official run: HF `max_steps` 30000 is
    # both the run length and T; DARE's actor reads `max_steps` with default 30000 against its rollout-step counter)
    sd_max_steps: int | None = Field(None, gt=0, validation_alias=AliasChoices("sd_max_steps", "max_steps"))


ALGORITHM = AlgorithmSpec(name="dtreerpo", kind="rl", knobs=DTreeRPOConfig)
