"""How much compute a training stage spent, counted the same way for every trainer: the compute-matched SFT control
(issue #16) gives an SFT continuation the FLOPs its RL run used.

    from dare_bench.trainers.compute import ComputeMeter
    with ComputeMeter(model) as meter:
        train_rl(model, ...)                  # or train_sft / train_preference: whatever calls the model
    meter.flops, meter.summary()              # {"flops", "token_forwards", "grad_token_forwards", "counted"}

A forward hook on the model counts the tokens of every forward (`input_ids.numel()`, or for a sampler forward that
computed identical rows once, every row it stands for: `models.flops.counted_tokens`; rollout decoding, likelihood
estimates, reference / old-policy copies made with deepcopy keep the hook and count too) and prices them with the
weight-matmul FLOP model (`models.flops.matmul_flops_per_token`): 1x for a forward under no_grad, 3x for one with
gradients on (its backward is 2x). Attention scores, element-wise work and the optimizer are left out, for RL and
SFT alike, so the two sides of a control are counted by the same rule.
"""

from __future__ import annotations

from typing import Any, Callable

COUNTED = "weight-matmul FLOPs (models/flops.py): 1x per no-grad forward token, 3x per forward token with gradients"


class ComputeMeter:
    """Counts a model's forward tokens while entered (module doc); `stop_at(budget)` is an `after_step` rule."""

    def __init__(self, model):
        from dare_bench.models.flops import matmul_flops_per_token

        self.model = model
        self.flops_per_token = matmul_flops_per_token(model)
        self.token_forwards = 0
        self.grad_token_forwards = 0
        self.continued_from: dict[str, Any] | None = None  # `carry`: the earlier stretch this run continued
        self.flops_before_last_step: float | None = None  # kept by the `stop_at` hook
        self._handle = None

    def __enter__(self) -> "ComputeMeter":
        import torch

        from dare_bench.models.flops import counted_tokens

        meter = self

        # A plain closure, not a bound method: deepcopy keeps functions as they are, so a reference / old-policy
        # copy of the model made inside counts into this meter (a bound method would be copied with a new meter).
        def count(module, args, kwargs, output) -> None:
            ids = args[0] if args else kwargs.get("input_ids")
            if ids is None:
                return
            tokens = counted_tokens(ids)  # a forward over shared rows counts every row it stands for
            if torch.is_grad_enabled():
                meter.grad_token_forwards += tokens
            else:
                meter.token_forwards += tokens

        self._handle = self.model.register_forward_hook(count, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()  # deepcopies made inside keep their own copy of the hook; they are gone by now
            self._handle = None

    @property
    def flops(self) -> float:
        return self.flops_per_token * (self.token_forwards + 3 * self.grad_token_forwards)

    def carry(self, earlier: dict[str, Any], source: dict[str, Any]) -> None:
        """Add the counts of an earlier stretch of this training (a `summary()`) that this run continues from
        (`TrainRunOptions.continue_from`), priced the same way; `source` (which stretch) joins the summary as
        `continued_from`."""
        if earlier["flops_per_token"] != self.flops_per_token:
            raise ValueError(f"the earlier stretch priced a token at {earlier['flops_per_token']} FLOPs, this model "
                             f"at {self.flops_per_token}")
        self.token_forwards += int(earlier["token_forwards"])
        self.grad_token_forwards += int(earlier["grad_token_forwards"])
        self.continued_from = dict(source)

    def stop_at(self, budget_flops: float) -> Callable[[int], bool]:
        """An `after_step` hook: True (stop) once the counted FLOPs reach `budget_flops`. It also keeps the count
        before the latest step (`flops_before_last_step`): a budget between the two stops at that step."""
        now = [self.flops]

        def stop(step: int) -> bool:
            self.flops_before_last_step, now[0] = now[0], self.flops
            return now[0] >= budget_flops

        return stop

    def summary(self) -> dict[str, Any]:
        out = {"flops": self.flops, "token_forwards": self.token_forwards,
               "grad_token_forwards": self.grad_token_forwards, "flops_per_token": self.flops_per_token,
               "counted": COUNTED}
        if self.continued_from is not None:
            out["continued_from"] = self.continued_from
        return out


__all__ = ["COUNTED", "ComputeMeter"]
