"""Stage 2, the base: the model every algorithm of a backbone x task x scale starts from.

Both load the run's training items from `train.data` (tasks.mixtures: the listed sources in order, over-long prompts
dropped on `train.max_prompt_length` as verl does). tiny / micro: an SFT of the backbone's tiny preset on them,
trained once and cached under `DARE_BENCH_HOME/bases/<backbone>-<task>-<scale>-<hash>/` (the hash covers the recipe,
tokenizer, data, grader and answer length; bump `BASE_RECIPE_VERSION` when the base-training code changes the
weights). paper: the real checkpoint (`--checkpoint DIR` or `$DARE_BENCH_CHECKPOINTS/<name>`), loaded on the run's
device.

    dare-bench reproduce sft-llada-sudoku --scale micro     # builds (or reuses) the llada x sudoku micro base

    from dare_bench.pipeline.base_cache import build_base
    model, directory, cached = build_base(cfg, task, tokenizer, items, data_fingerprint=fp, log=print, progress=False)
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from dare_bench.fileio import atomic_directory, atomic_write_json, dare_bench_home
from dare_bench.pipeline.context import Base, Log, RunContext
from dare_bench.pipeline.examples import sft_examples
from dare_bench.pipeline.plan import _answer_length, _train_items_needed

# Bump when the base-training code changes in a way that changes the weights: cached bases are then rebuilt.
BASE_RECIPE_VERSION = 1


def load_base(ctx: RunContext) -> Base:
    """tiny / micro: the cached SFT base (built on first use). paper: the real checkpoint (chat template prompts)."""
    from dare_bench.tasks.mixtures import load_mixture

    cfg = ctx.cfg
    task = cfg.run_task()
    # `train.data` in order (the base SFT of tiny / micro and the post-training read the same items); a paper
    # baseline trains on nothing
    needs_data = cfg.profile.train.kind != "none" or cfg.profile.base is not None
    train_data = load_mixture(task, cfg.profile.train.data, _train_items_needed(cfg)) if needs_data else []
    if ctx.paper_dir is None:
        from dare_bench.tasks.tokenizer import build_task_tokenizer

        tokenizer = build_task_tokenizer(cfg.task)
        train_data = drop_overlong(cfg, ctx.log, task, train_data, tokenizer, "plain")
        model, base_dir, _ = build_base(cfg, task, tokenizer, list(train_data),
                                        data_fingerprint=str(train_data.fingerprint), log=ctx.log,
                                        progress=ctx.progress)
        from dare_bench.models.io import set_attention

        set_attention(model, cfg.profile.model.attention)  # the post-training backend (the base trains in sdpa)
        from dare_bench.models.moe import set_moe

        set_moe(model, cfg.profile.model.moe)  # likewise the MoE expert path (the base trains with the loop)
        template = "plain"
    else:  # the real checkpoint (a shrunk one on CPU in the tests)
        from dare_bench.models import load_pretrained, load_tokenizer

        model = load_pretrained(ctx.paper_dir, dtype=cfg.profile.model.dtype, device=ctx.device,
                                attention=cfg.profile.model.attention, moe=cfg.profile.model.moe)
        tokenizer = load_tokenizer(ctx.paper_dir)
        train_data = drop_overlong(cfg, ctx.log, task, train_data, tokenizer, tokenizer)
        base_dir = dare_bench_home() / "bases" / f"paper-{cfg.backbone}-{cfg.task}-{cfg.content_hash[:16]}"
        base_dir.mkdir(parents=True, exist_ok=True)
        template = tokenizer
    return Base(model, tokenizer, task, train_data, base_dir, template)


def drop_overlong(cfg, log: Log, task, train_data, tokenizer, template):
    """verl's filter_overlong_prompts on `train.max_prompt_length` (tasks.mixtures.filter_overlong), logged."""
    from dare_bench.tasks.mixtures import filter_overlong

    max_len = cfg.profile.train.max_prompt_length
    if max_len is None or not train_data:
        return train_data
    kept, dropped = filter_overlong(task, train_data.items, tokenizer, template, max_len)
    if not kept:  # nothing would train: say why here, not as an empty batch deep in a trainer
        from dare_bench.errors import DataError

        raise DataError(f"every one of the {len(train_data)} training prompts is longer than train.max_prompt_length "
                        f"{max_len} tokens with this tokenizer; raise it (train.max_prompt_length=N)")
    if dropped:
        log(f"data: dropped {dropped} of {len(train_data)} training prompts longer than {max_len} tokens "
                "(train.max_prompt_length)")
        from dare_bench.tasks.base import sha256_items

        # what was kept is what trains (and what the cached base's key must name)
        train_data.items, train_data.fingerprint = kept, sha256_items(kept)
    return train_data


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _tokenizer_fingerprint(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items())
    specials = [tokenizer.mask_token, tokenizer.pad_token, tokenizer.eos_token, tokenizer.bos_token]
    return _hash([vocab, specials])


def base_sft_setup(cfg, task, tokenizer, train_items):
    """(fresh model, SFT examples, SFT recipe) of the tiny base: the preset initialised from `base.seed`, the gold
    answers EOS-padded to the run's answer length, `base.start_step` steps. The base cache and the calibration scan
    (`pipeline.calibrate`) both start here, so a scan's step-k model is the base a `start_step: k` recipe builds."""
    import torch

    from dare_bench.models.io import build_model
    from dare_bench.models.presets import preset_for_tokenizer
    from dare_bench.trainers.sft import SFTConfig

    base = cfg.profile.base
    config = preset_for_tokenizer(cfg.profile.model.preset, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(base.seed)
        model = build_model(config, device="cpu", dtype=torch.float32, source=cfg.profile.model.preset)
        model.init_weights()
    examples = sft_examples(task, tokenizer, train_items, grader=cfg.grader, pad_to=_answer_length(cfg))
    # The post-training start is an (under-trained) SFT checkpoint: train exactly to `start_step`.
    sft_cfg = SFTConfig(steps=base.start_step, lr=base.lr, batch_size=base.batch_size,
                        warmup_steps=base.warmup_steps, weight_decay=base.weight_decay,
                        grad_clip=base.max_grad_norm or 1e9, seed=base.seed)
    return model, examples, sft_cfg


def build_base(cfg, task, tokenizer, train_items, *, data_fingerprint: str, log: Log, progress: bool):
    """The shared SFT base of (backbone preset, task, scale recipe): trained once, then loaded from the cache."""
    from dare_bench.models import load_pretrained
    from dare_bench.trainers.sft import SFTRunOptions, train_sft

    base = cfg.profile.base
    key = {
        "version": BASE_RECIPE_VERSION, "preset": cfg.profile.model.preset, "task": cfg.task,
        "recipe": base.model_dump(), "tokenizer": _tokenizer_fingerprint(tokenizer), "data": data_fingerprint,
        "grader": cfg.grader, "answer_length": _answer_length(cfg),
    }
    digest = _hash(key)[:16]
    directory = dare_bench_home() / "bases" / f"{cfg.backbone}-{cfg.task}-{cfg.scale}-{digest}"
    model_dir = directory / "model"
    if (directory / "base.json").exists() and (model_dir / "config.json").exists():
        log(f"base: cached SFT base {directory}")
        return load_pretrained(model_dir), directory, True
    model, examples, sft_cfg = base_sft_setup(cfg, task, tokenizer, train_items)
    log(f"base: SFT of {cfg.profile.model.preset} on {len(examples)} {cfg.task} examples for {sft_cfg.steps} steps")
    result = train_sft(model, examples, sft_cfg, SFTRunOptions(progress=progress))
    with atomic_directory(directory) as tmp:
        model.save_pretrained(tmp / "model", tokenizer=tokenizer)
        atomic_write_json(tmp / "base.json", {"key": key, "losses": result.losses, "seconds": result.seconds})
    model.name_or_path = str(model_dir)  # LoRA adapters record it as their base
    return model, directory, False


__all__ = ["BASE_RECIPE_VERSION", "base_sft_setup", "build_base", "drop_overlong", "load_base"]
