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
from pathlib import Path
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
        identity = base_identity(base_dir, model)
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
        identity = None  # the real checkpoint: the run record's config names it (model.checkpoint, revision)
    return Base(model, tokenizer, task, train_data, base_dir, template, identity)


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


def base_sft_setup(cfg, task, tokenizer, train_items, *, steps: int | None = None):
    """(fresh model, SFT examples, SFT recipe) of the tiny base: the preset initialised from `base.seed`, the gold
    answers EOS-padded to the run's answer length, `steps` SFT steps (default: `base.start_step`, or the target
    rule's `max_steps`). The target rule's validation items (`validation_items`) are not among the examples. The
    base cache and the calibration scan (`pipeline.calibrate`) both start here, so a scan's step-k model is the
    checkpoint k of the base's own SFT."""
    import torch

    from dare_bench.models.io import build_model
    from dare_bench.models.presets import preset_for_tokenizer
    from dare_bench.trainers.sft import SFTConfig

    base = cfg.profile.base
    config = preset_for_tokenizer(cfg.profile.model.preset, tokenizer, **cfg.profile.model.preset_overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(base.seed)
        model = build_model(config, device="cpu", dtype=torch.float32, source=cfg.profile.model.preset)
        model.init_weights()
    sft_items = list(train_items)[:len(train_items) - len(validation_items(cfg, train_items))]
    examples = sft_examples(task, tokenizer, sft_items, grader=cfg.grader, pad_to=_answer_length(cfg))
    # The post-training start is an (under-trained) SFT checkpoint: train exactly to the chosen step.
    sft_cfg = SFTConfig(steps=steps or base.max_steps, lr=base.lr, batch_size=base.batch_size,
                        warmup_steps=base.warmup_steps, weight_decay=base.weight_decay,
                        grad_clip=base.max_grad_norm or 1e9, seed=base.seed)
    return model, examples, sft_cfg


def validation_items(cfg, train_items) -> list:
    """The target rule's held-out validation items: the last `base.target.validation_items` training items (none
    under the fixed-step rule). Drawn from the training split, never the test split, so choosing the base never
    looks at what is reported; a training set too small to spare them is a DataError."""
    held = cfg.profile.base.held_out
    if not held:
        return []
    check_held_out(cfg, len(train_items))
    return list(train_items)[-held:]


def check_held_out(cfg, n_train_items: int) -> None:
    """The target rule's validation items must leave at least as many items for the base's SFT: a DataError naming
    the knob otherwise. The dry run calls it with the row count of the training files, the base build with the
    items left after the overlong filter."""
    from dare_bench.errors import DataError

    held = cfg.profile.base.held_out if cfg.profile.base is not None else 0
    if held and n_train_items < 2 * held:
        raise DataError(f"base.target.validation_items {held} needs at least {2 * held} training items; "
                        f"{cfg.task} has {n_train_items} here (lower base.target.validation_items)")


def weights_sha256(model) -> str:
    """sha256 over the model's tensors (names, dtypes, shapes and bytes, in name order): the base's identity in the
    run record. Two bases with one hash are the same weights, whatever machine trained them."""
    import torch

    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def select_by_target(cfg, model, tokenizer, task, val_items, log: Log):
    """(after_step hook, selection dict) of the validation-target rule: the hook evaluates `val_items` at the
    rule's check steps and returns True (stop) at the first whose primary metric reaches the target."""
    from dare_bench.pipeline.evaluation import validation_metric

    target, metric = cfg.profile.base.target, cfg.profile.eval.metric
    selection: dict[str, Any] = {"rule": "target", "target": target.model_dump(), "metric": metric,
                                 "step": None, "validation": []}

    def after_step(step: int) -> bool:
        if not target.checks(step):
            return False
        value = validation_metric(model, tokenizer, task, cfg, val_items, seed=cfg.profile.base.seed)
        selection["validation"].append([step, value])
        log(f"base: step {step}: validation {metric} = {value:.3f} (target {target.value:g})")
        if value >= target.value:
            selection["step"] = step
            return True
        return False

    return after_step, selection


def recipe_fields(cfg) -> dict[str, Any]:
    """The base's cache key, less the tokenizer and data fingerprints (which need them loaded): what the config
    itself says about the base."""
    base = cfg.profile.base
    return {
        "version": BASE_RECIPE_VERSION, "preset": cfg.profile.model.preset, "task": cfg.task,
        # the fixed-step rule keys as before `target` existed (its cached bases stay valid)
        "recipe": base.model_dump(exclude={"target"} if base.target is None else set()),
        "grader": cfg.grader, "answer_length": _answer_length(cfg),
        # only when set, so the keys (and cached bases) of every preset at its own block size stay as they were
        **cfg.profile.model.preset_overrides,
    }


def build_base(cfg, task, tokenizer, train_items, *, data_fingerprint: str, log: Log, progress: bool):
    """The shared SFT base of (backbone preset, task, scale recipe): trained once, then loaded from the cache.
    Returns (model, directory, cached); `base_identity(directory)` is what the run record keeps of it."""
    from dare_bench.errors import DataError
    from dare_bench.models import load_pretrained
    from dare_bench.trainers.sft import SFTRunOptions, train_sft

    base = cfg.profile.base
    key = {**recipe_fields(cfg), "tokenizer": _tokenizer_fingerprint(tokenizer), "data": data_fingerprint}
    digest = _hash(key)[:16]
    directory = dare_bench_home() / "bases" / f"{cfg.backbone}-{cfg.task}-{cfg.scale}-{digest}"
    model_dir = directory / "model"
    if (directory / "base.json").exists() and (model_dir / "config.json").exists():
        log(f"base: cached SFT base {directory}")
        return load_pretrained(model_dir), directory, True
    model, examples, sft_cfg = base_sft_setup(cfg, task, tokenizer, train_items)
    if base.target is None:
        after_step, selection = None, {"rule": "fixed", "step": base.start_step}
        log(f"base: SFT of {cfg.profile.model.preset} on {len(examples)} {cfg.task} examples for {sft_cfg.steps} "
            "steps")
    else:
        val = validation_items(cfg, train_items)
        after_step, selection = select_by_target(cfg, model, tokenizer, task, val, log)
        log(f"base: SFT of {cfg.profile.model.preset} on {len(examples)} {cfg.task} examples until the "
            f"{cfg.profile.eval.metric} on {len(val)} held-out items reaches {base.target.value:g} (checked every "
            f"{base.target.every} steps from {base.target.from_step}, at most {base.target.max_steps})")
    result = train_sft(model, examples, sft_cfg, SFTRunOptions(progress=progress, after_step=after_step))
    if base.target is not None and selection["step"] is None:
        best_step, best = max(selection["validation"], key=lambda sv: sv[1], default=(None, float("nan")))
        raise DataError(f"base: the validation {cfg.profile.eval.metric} never reached base.target.value "
                        f"{base.target.value:g} by step {base.target.max_steps} (best {best:.3f} at step {best_step}); "
                        "lower base.target.value or raise base.target.max_steps")
    identity = {"weights_sha256": weights_sha256(model), "selection": selection, "trained_on": _training_machine()}
    with atomic_directory(directory) as tmp:
        model.save_pretrained(tmp / "model", tokenizer=tokenizer)
        atomic_write_json(tmp / "base.json", {"key": key, "identity": identity, "losses": result.losses,
                                              "seconds": result.seconds})
    model.name_or_path = str(model_dir)  # LoRA adapters record it as their base
    return model, directory, False


def _training_machine() -> dict[str, Any]:
    """What fixes a tiny base's bits, kept with its identity: a shared base (pipeline/shared_bases.py) is used on
    other machines, whose run records name theirs, not the one that trained it."""
    from dare_bench.store.environment import hardware

    info = hardware()
    return {k: info[k] for k in ("cpu", "cpu_id", "cpu_isa", "torch_threads") if k in info}


def base_weights_hash(directory) -> str:
    """A base directory's weight hash, verified: `base.json` must record an identity whose hash is the hash of the
    weights under `model/`, and the directory's name must end in the digest of `base.json`'s recipe key (the name
    `build_base` looks it up by). A DataError names the directory otherwise. How a shared base (a bundle's
    `bases/`) is checked before it enters a cache."""
    from dare_bench.errors import DataError
    from dare_bench.models import load_pretrained

    directory = Path(directory)
    try:
        record = json.loads((directory / "base.json").read_text())
        recorded, key = record["identity"]["weights_sha256"], record["key"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"base {directory}: no readable base.json with a recorded identity ({e})") from None
    if not directory.name.endswith(f"-{_hash(key)[:16]}"):
        raise DataError(f"base {directory}: its name does not end in the digest of its recipe key "
                        f"({_hash(key)[:16]}); renamed or edited")
    try:
        actual = weights_sha256(load_pretrained(directory / "model"))
    except Exception as e:  # a missing / truncated / foreign weights file: one line naming the base
        raise DataError(f"base {directory}: its weights do not load ({type(e).__name__}: {e})") from None
    if actual != recorded:
        raise DataError(f"base {directory}: its weights hash to {actual[:12]}, base.json records {recorded[:12]}; "
                        "edited or corrupt")
    return actual


def recorded_weights_hash(directory) -> str | None:
    """The weight hash a base directory's `base.json` records, unverified; None where it records none (a base
    cached before identities were recorded, or no readable base.json)."""
    try:
        return json.loads((Path(directory) / "base.json").read_text())["identity"]["weights_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def cached_bases(home: Path | None = None) -> dict[str, Path]:
    """Weight hash -> directory of every cached tiny / micro base that records its identity."""
    out: dict[str, Path] = {}
    for record_path in sorted(((home or dare_bench_home()) / "bases").glob("*/base.json")):
        sha = recorded_weights_hash(record_path.parent)
        if sha is not None:  # without a recorded hash there is nothing to share the base by
            out.setdefault(sha, record_path.parent)
    return out


def cached_base_hash(cfg, home: Path | None = None) -> str | None:
    """The weight hash of the base this machine's cache holds for `cfg`'s recipe (what its run would start from),
    found without loading data or tokenizer: the cached `base.json` keys whose recipe fields match the config's.
    None: nothing to build (paper scale), no such base cached, or several (task data that changed between them)."""
    if cfg.profile.base is None or cfg.scale in ("paper", "official"):
        return None
    want = json.loads(json.dumps(recipe_fields(cfg), default=str))  # as base.json stores them
    found = set()
    bases = (home or dare_bench_home()) / "bases"
    for record_path in bases.glob(f"{cfg.backbone}-{cfg.task}-{cfg.scale}-*/base.json"):
        try:
            key = json.loads(record_path.read_text())["key"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if all(key.get(field) == value for field, value in want.items()):
            sha = recorded_weights_hash(record_path.parent)
            if sha is not None:
                found.add(sha)
    return found.pop() if len(found) == 1 else None


def base_identity(directory, model) -> dict[str, Any]:
    """The base's identity for the run record: its weight hash and how its step was chosen (`base.json`; a base
    cached before identities were recorded gets its hash computed now, rule "fixed")."""
    record = json.loads((directory / "base.json").read_text())
    if record.get("identity"):
        return record["identity"]
    return {"weights_sha256": weights_sha256(model),
            "selection": {"rule": "fixed", "step": record["key"]["recipe"].get("start_step")}}


__all__ = ["BASE_RECIPE_VERSION", "base_identity", "base_sft_setup", "base_weights_hash", "build_base", "cached_bases",
           "check_held_out", "drop_overlong", "load_base", "recorded_weights_hash", "select_by_target",
           "validation_items", "weights_sha256"]
