"""Small stand-ins shared by the RL trainer tests: a micro LLaDA, a character tokenizer and a toy task.

The toy task "reverse": the prompt is 3 digits, the right completion is them reversed; the reward is the fraction
of the 3 positions right (a dense reward, so GRPO groups rarely tie).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch

from dare_bench.check.gradients import CharTokenizer, micro_model  # noqa: F401  (one copy of each)

PAD, EOS, MASK = 13, 14, 15
VOCAB = 16


def micro_llada(seed: int = 0, **overrides):
    """A 1-layer LLaDA (official module layout) with a 16-token vocabulary, seeded init."""
    return micro_model("llada", seed, **overrides)


def micro_dream(seed: int = 0):
    """A 1-layer Dream (shifted logits) with the same 16-token vocabulary, seeded init."""
    from dare_bench.models.dream import adapt_vocab
    from dare_bench.models.io import build_model
    from dare_bench.models.presets import preset_config

    cfg = adapt_vocab(preset_config("tiny-dream", num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                                    num_attention_heads=2, num_key_value_heads=1),
                      vocab_size=VOCAB, mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD)
    model = build_model(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.init_weights()
    return model


def micro_sdar(seed: int = 0, **overrides):
    """A 1-layer SDAR (block diffusion, block size 4) with the same 16-token vocabulary, seeded init."""
    return micro_model("sdar", seed, **overrides)


@dataclass(frozen=True)
class ToyItem:
    index: int
    digits: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToyGrade:
    correct: bool
    reward: float


class ReverseTask:
    name = "reverse"
    option_defaults: dict[str, Any] = {}  # no task options (tasks.base.Task.option_defaults)

    def __init__(self, n: int = 64, seed: int = 0):
        rng = random.Random(seed)
        self.items = [ToyItem(i, "".join(rng.choice("0123456789") for _ in range(3))) for i in range(n)]

    # the Task surface `train.data` resolution uses (tasks.mixtures): no DARE file, a generator of these items
    has_generator = True
    dare_files: dict = {}

    def dare_path(self, split: str):
        return None

    def default_generated_size(self, split: str) -> int:
        return len(self.items)

    def generate(self, n: int, seed: int = 0, split: str = "train"):
        from dare_bench.tasks.base import TaskDataset

        return TaskDataset(self.name, split, self.items[:n], source=f"reverse(n={n})", fingerprint=f"reverse-{n}")

    def load(self, split: str = "train", source=None, limit=None):
        return self.items[:limit] if limit else list(self.items)

    def format_prompt(self, item: ToyItem, template: Any = "plain") -> str:
        return item.digits + ":"

    def grade(self, completion: str, item: ToyItem, grader: str = "dare") -> ToyGrade:
        target = item.digits[::-1]
        hits = sum(a == b for a, b in zip(completion[:3], target))
        return ToyGrade(completion[:3] == target, hits / 3)


def rl_settings(**overrides) -> dict:
    """A TrainSettings dict for a few-second CPU run on the toy task."""
    cfg = {
        "kind": "rl", "lr": 1e-3, "steps": 4, "batch_prompts": 4, "group_size": 4, "mu": 1,
        "advantage": "mean", "clip_eps": 0.2, "max_grad_norm": 1.0, "adam_betas": (0.9, 0.99),
        "rollout": {"gen_length": 4, "steps": 4, "temperature": 0.9},
    }
    cfg.update(overrides)
    return cfg


def toy_rollout_batch(n_prompts=2, g=3, p=5, c=6, seed=0, pad_second_group=True, first_end=2):
    """A hand-made RolloutBatch: the second group has one left pad (unless `pad_second_group` is False);
    row r's completion has `first_end + r % (c - first_end + 1)` scored tokens, the last of them EOS."""
    from dare_bench.trainers.algorithms import RolloutBatch

    gen = torch.Generator().manual_seed(seed)
    n = n_prompts * g
    prompt = torch.randint(0, 10, (n, p), generator=gen)
    pmask = torch.ones(n, p, dtype=torch.long)
    if pad_second_group:
        prompt[g:, 0] = PAD
        pmask[g:, 0] = 0
    comp = torch.randint(0, 10, (n, c), generator=gen)
    cmask = torch.ones(n, c, dtype=torch.long)
    for r in range(n):
        end = first_end + r % (c - first_end + 1)
        comp[r, end - 1:] = EOS
        cmask[r, end:] = 0
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.2, 0.9, 0.1])[:n]
    return RolloutBatch(prompt, pmask, comp, cmask, rewards, group_size=g)
