"""Training data the pipeline builds from a task: SFT examples (prompt + gold answer + EOS padding) and VRPO
preference pairs (gold answer vs the base's own worse sample).

    from dare_bench.pipeline.examples import preference_pairs, sft_examples
    examples = sft_examples(task, tokenizer, items, grader="dare", pad_to=64)
    pairs = preference_pairs(model, tokenizer, task, items, cfg.profile.eval.sampler, "dare", seed=0)
"""

from __future__ import annotations

from typing import Any


def sft_examples(task, tokenizer, items, template: Any = "plain", grader: str | None = None,
                 pad_to: int | None = None) -> list:
    """Prompt (plain for tiny replicas, else the chat template) + gold answer + EOS for every item.

    `pad_to`: answers are padded with EOS up to this many tokens (the generation length), as LLaDA's SFT recipe pads
    answers with <EOS> to the full length: the model then learns to fill the rest of the canvas with EOS instead of
    meeting positions at decoding time that it never saw in training."""
    from dare_bench.trainers.sft import SFTExample

    eos = tokenizer.eos_token_id
    items = list(items)
    # One batched call per side: the fast tokenizer encodes thousands of short texts in milliseconds.
    prompts = tokenizer([task.format_prompt(item, template) for item in items], add_special_tokens=False)["input_ids"]
    # The gold completion in the form the run's grader reads (the shortest one that grader accepts).
    answers = tokenizer([task.format_answer(item, grader=grader) for item in items],
                        add_special_tokens=False)["input_ids"]
    out = []
    for p, a in zip(prompts, answers):
        answer = a + [eos]
        if pad_to is not None and len(answer) < pad_to:
            answer = answer + [eos] * (pad_to - len(answer))
        out.append(SFTExample(p, answer))
    return out


def preference_pairs(model, tokenizer, task, items, sampler, grader: str, seed: int, template: Any = "plain") -> list:
    import torch

    from dare_bench.diffusion.sampling import generate
    from dare_bench.trainers.loop import rollout_settings
    from dare_bench.trainers.preference import PreferencePair

    eos = tokenizer.eos_token_id
    pairs = []
    gen = torch.Generator().manual_seed(seed)
    settings = rollout_settings(sampler)
    for item in items:
        prompt = tokenizer(task.format_prompt(item, template), add_special_tokens=False)["input_ids"]
        out = generate(model, torch.tensor([prompt]), generator=gen, **settings)
        completion_ids = out.sequences[0, len(prompt):].tolist()
        if eos in completion_ids:
            completion_ids = completion_ids[: completion_ids.index(eos) + 1]
        text = tokenizer.decode([t for t in completion_ids if t != eos], skip_special_tokens=False)
        gold_text = task.format_answer(item, grader=grader)
        if task.grade(text, item, grader).reward < task.grade(gold_text, item, grader).reward:
            gold = tokenizer(gold_text, add_special_tokens=False)["input_ids"] + [eos]
            pairs.append(PreferencePair(prompt, gold, completion_ids if completion_ids[-1:] == [eos]
                                        else completion_ids + [eos]))
    return pairs


__all__ = ["preference_pairs", "sft_examples"]
