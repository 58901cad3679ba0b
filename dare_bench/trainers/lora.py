"""LoRA adapters through peft, shared by SFT, preference training and the RL loop.

    from dare_bench.trainers.lora import apply_lora
    model = apply_lora(model, run_config.profile.train.lora)     # any object with r / alpha / dropout / target_modules

The adapters start with B = 0, so the wrapped model equals the base at step 0; `model.disable_adapter()` gives the
reference model without a second copy of the weights; `model.save_pretrained(dir)` writes PEFT-format adapters.
"""

from __future__ import annotations

from typing import Any

import torch

from dare_bench.errors import ConfigError


def default_lora_targets(model) -> list[str]:
    """Every Linear except the output head (a Linear whose outputs are the vocabulary). Full module names, so LLaDA's
    block `ff_out` is not confused with its LM head `transformer.ff_out`."""
    vocab = {m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    targets = [name for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and m.out_features not in vocab]
    if not targets:
        raise ConfigError("no nn.Linear modules found for LoRA")
    return targets


def apply_lora(model, lora) -> Any:
    """Wrap `model` with LoRA adapters (peft)."""
    if getattr(lora, "quant_4bit", False):
        raise ConfigError("train.lora.quant_4bit (a 4-bit quantised base) needs bitsandbytes on CUDA and is not "
                          "implemented; override train.lora.quant_4bit=false to train LoRA on the full-precision base")
    import peft

    targets = list(lora.target_modules) if lora.target_modules else default_lora_targets(model)
    config = peft.LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets)
    return peft.get_peft_model(model, config)
