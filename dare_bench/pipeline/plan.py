"""Stage 1, the plan: resolve a reproduction's config, check its algorithm against its backbone, size the run.

`resolve` gives (spec, resolved config) and refuses an algorithm on a backbone it is not defined for before any
work; `paper_plan` is what `--scale paper --dry-run` prints (checkpoint, parameter count, memory budget from a
meta-device model, the torchrun command); `local_plan` the tiny / micro dry run.

    dare-bench reproduce d1-llada-sudoku --scale micro --dry-run
    dare-bench reproduce bgpo-llada-sudoku --scale paper --checkpoint /ckpt/LLaDA-8B-Instruct --dry-run

    from dare_bench.pipeline.plan import paper_plan, resolve
    spec, cfg = resolve("bgpo-llada-sudoku", "paper")
    paper_plan(cfg, None)["memory_gib"]
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from dare_bench.errors import CheckpointError, ConfigError, DareBenchError, SamplerError

# The only preference data the VRPO stage builds: pairs from the base's own samples on the task (gold = chosen);
# declared once, beside the registry's runnability check
from dare_bench.registry.runnable import TASK_PAIRS


def default_scale() -> str:
    import torch

    return "paper" if torch.cuda.is_available() else "tiny"


def resolve(name: str, scale: str, overrides: list[str] | tuple[str, ...] = ()):
    from dare_bench.registry import get

    spec = get(name)
    cfg = spec.resolve(scale, list(overrides))
    _check_algorithm_backbone(cfg)
    _check_preference_data(cfg)
    _check_threshold_samplers(cfg)
    _check_block_sizes(cfg)
    # then the data: a missing training file, or one whose rows the task cannot read, fails here, before the
    # pipeline writes anything
    resolved = spec.resolve(scale, list(overrides), with_data=True)
    _check_training_rows(resolved)
    resolved.check_evaluation_items()  # the benchmark's data and protocol, likewise
    return spec, resolved


def _check_training_rows(cfg) -> None:
    """Every row of the run's training files parses (tasks.mixtures.check_rows), and there are enough of them for
    the tiny base's held-out validation items; a baseline reads none."""
    if cfg.profile.train.kind == "none" and cfg.profile.base is None:
        return
    from dare_bench.config import train_items_needed
    from dare_bench.pipeline.base_cache import check_held_out
    from dare_bench.tasks.mixtures import check_rows, resolve_sources

    task = cfg.run_task()
    limit = train_items_needed(cfg.profile, cfg.scale)
    rows = check_rows(task, resolve_sources(task, cfg.profile.train.data, limit), limit)
    if rows is not None:  # an hf: source is counted when the run loads it
        check_held_out(cfg, rows)




def _check_preference_data(cfg) -> None:
    """VRPO trains on `train.algorithm.preference_data`; refuse, before any work, a source the stage cannot build."""
    if cfg.profile.train.kind != "preference":
        return
    from dare_bench import catalogue

    knobs = catalogue.algorithm(cfg.algorithm).settings(cfg.profile.train)
    if knobs.preference_data != TASK_PAIRS:
        raise ConfigError(f"{cfg.reproduction}: VRPO on preference_data {knobs.preference_data!r} is not implemented "
                          f"(only {TASK_PAIRS!r}: pairs from the base's own samples; set "
                          f"train.algorithm.preference_data={TASK_PAIRS})")


def _check_unread_overrides(cfg, plugin) -> None:
    """An override of a shared `train.*` setting that the plug-in ignores under its other settings (SPG's
    `mc_samples` once `num_t` is set) is refused: the run would be marked modified and change nothing."""
    from dare_bench.catalogue.settings import SHARED_TRAIN_FIELDS

    unread = plugin.unread_settings()
    for item in cfg.overrides:
        key = item.partition("=")[0].strip()
        train_name = key.removeprefix("train.") if key.startswith("train.") else None
        why = unread.get(SHARED_TRAIN_FIELDS.get(train_name or "", ""))
        if why:
            raise ConfigError(f"override {item!r} is not read: {why}")


def _check_algorithm_backbone(cfg) -> None:
    """Refuse an algorithm on a backbone it is not defined for before any work (e.g. EBPO on an MDLM)."""
    if cfg.profile.train.kind != "rl":
        return
    from dare_bench import catalogue
    from dare_bench.trainers.algorithms.base import get_algorithm

    algo = get_algorithm(cfg.algorithm)
    attention = catalogue.backbone(cfg.backbone).attention
    if attention not in algo.attention_kinds:
        raise ConfigError(f"{cfg.algorithm} is not defined for {cfg.backbone} ({attention} attention backbones); "
                          f"it supports {list(algo.attention_kinds)}")
    # the plug-in itself, as the loop will build it: its cross-field checks (e.g. coupled-grpo pairs != 1) fail here,
    # before any store write, not at the first training step
    from dare_bench.catalogue.settings import algorithm_settings
    from dare_bench.trainers.loop import rollout_settings

    meta_model = _run_meta_model(cfg)
    plugin = algo(algorithm_settings(cfg.profile.train), meta_model.traits)
    _check_unread_overrides(cfg, plugin)
    if cfg.profile.train.rollout is not None:  # the sampler settings it needs (JustGRPO: block length 1)
        settings = rollout_settings(cfg.profile.train.rollout)
        settings.update(plugin.rollout_overrides)
        settings = plugin.check_rollout(settings)
        if not plugin.owns_rollout:  # the sampler's own checks (a cache it lacks, cache + CFG ...), no forward
            import torch

            from dare_bench.diffusion.sampling import resolve_settings

            resolve_settings(meta_model, torch.zeros(1, 1, dtype=torch.long), None,
                             {**settings, "return_trajectory": bool(plugin.needs_trajectory)})


def _check_threshold_samplers(cfg) -> None:
    """Each `eval.thresholds` value decodes with the evaluation sampler at that threshold: refuse, before any work, a
    combination the sampler rejects (e.g. LLaDA's `ass` step plan, which fixes its own quotas), by the sampler's own
    checks on the run's model without weights."""
    if not cfg.profile.eval.thresholds:
        return
    below_one = [t for t in cfg.profile.eval.thresholds if t < 1.0]
    if below_one and cfg.profile.eval.sampler.top_k == 1:
        # the samplers' confidence is the probability after the top-k filter: 1.0 for every token under top_k 1, so
        # a threshold below 1 would commit whole blocks at once and measure nothing
        raise ConfigError(f"{cfg.reproduction}: eval.thresholds {below_one} with eval.sampler.top_k 1: every token's "
                          f"confidence is then 1.0; set eval.sampler.top_k to null (or > 1)")
    import torch

    from dare_bench.diffusion.sampling import resolve_settings
    from dare_bench.pipeline.evaluation import threshold_sampler
    from dare_bench.trainers.loop import rollout_settings

    meta_model = _run_meta_model(cfg)
    for t in cfg.profile.eval.thresholds:
        try:
            resolve_settings(meta_model, torch.zeros(1, 1, dtype=torch.long), None,
                             rollout_settings(threshold_sampler(cfg.profile.eval.sampler, t)))
        except SamplerError as exc:
            raise ConfigError(f"{cfg.reproduction}: eval.thresholds {t}: {exc}") from None


def _check_block_sizes(cfg) -> None:
    """A block-diffusion model decodes at the block size it trains at: the evaluation sampler's and the rollouts'
    `block_length` equal the model's block size (the real config's, or the preset's unless `model.block_size` sets
    it). Every real recipe does (LLaDA2 32, SDAR 4); a replica that trained at 32 and decoded its short canvases at
    8 would be evaluated on an attention pattern it never trained on. Algorithms that set the block themselves are
    checked by `config.profile_problem` instead (WSD's final block, `ar`'s pinned block)."""
    from dare_bench import catalogue

    model_ref, train = cfg.profile.model, cfg.profile.train
    knobs = catalogue.algorithm(cfg.algorithm).settings(train)
    if train.kind == "wsd" or getattr(knobs, "block_size", None) is not None:
        if model_ref.block_size is not None:
            raise ConfigError(f"{cfg.reproduction}: model.block_size {model_ref.block_size}: {cfg.algorithm} sets the "
                              "block size it trains at itself (train.algorithm); set model.block_size to null")
        return
    traits = _run_meta_model(cfg).traits
    if not traits.is_block_diffusion:
        if model_ref.block_size is not None:
            raise ConfigError(f"{cfg.reproduction}: model.block_size {model_ref.block_size}: {model_ref.preset} is "
                              "not a block-diffusion model (it has no block size)")
        return
    source = ("model.block_size" if model_ref.block_size is not None
              else f"preset {model_ref.preset}" if model_ref.preset else f"checkpoint {model_ref.checkpoint}")
    decoders = {"eval.sampler": cfg.profile.eval.sampler.block_length}
    if train.kind == "rl" and train.rollout is not None:
        decoders["train.rollout"] = train.rollout.block_length
    for where, block_length in decoders.items():
        if block_length is not None and block_length != traits.block_size:
            hint = "; set model.block_size" if model_ref.preset else ""
            raise ConfigError(f"{cfg.reproduction}: {where}.block_length {block_length} is not the block size the "
                              f"model trains at ({traits.block_size}, {source}){hint}")


def _run_meta_model(cfg):
    """The run's model on the meta device (its traits: mask id, attention kind, block size ...), from its real
    config (paper) or tiny preset (tiny / micro): no weights. Only read (traits, sampler checks), so shared."""
    model = cfg.profile.model
    return _meta_model(model.checkpoint, model.preset, tuple(sorted(model.preset_overrides.items())))


@functools.lru_cache(maxsize=32)
def _meta_model(checkpoint: str | None, preset: str | None, preset_overrides: tuple = ()):
    # building LLaDA2's 256-expert layers takes ~1 s even without weights; `list --runnable` plans every entry
    from dare_bench.models import from_config
    from dare_bench.models.presets import preset_config
    from dare_bench.models.real_configs import real_config

    config = real_config(checkpoint)[1] if preset is None else preset_config(preset, **dict(preset_overrides))
    return from_config(config)


def _plugin_name(algorithm: str) -> str:
    """The RL plug-in of a reproduction's algorithm (registry ids use dashes, coupled-grpo; plug-ins coupled_grpo)."""
    from dare_bench import catalogue

    return catalogue.algorithm(algorithm).plugin or algorithm


def local_plan(cfg) -> dict[str, Any]:
    """What a tiny / micro run would do (`--dry-run`): the resolved config, the base recipe, the model preset."""
    return {"config": cfg.to_dict(), "base": cfg.profile.base.model_dump() if cfg.profile.base else None,
            "model_preset": cfg.profile.model.preset, "data": data_sources(cfg)}


def _answer_length(cfg) -> int:
    """Completion length the run decodes (evaluation and rollouts): the SFT answers are EOS-padded to it."""
    lengths = [cfg.profile.eval.sampler.gen_length]
    if cfg.profile.train.rollout is not None:
        lengths.append(cfg.profile.train.rollout.gen_length)
    return max(lengths)


def _train_items_needed(cfg) -> int | None:
    """Micro runs draw at most this many training items (config.train_items_needed)."""
    from dare_bench.config import train_items_needed

    return train_items_needed(cfg.profile, cfg.scale)


def check_checkpoint_option(scale: str, checkpoint: str | None) -> None:
    """`--checkpoint` names real weights: refuse it at a scale that trains a tiny replica from scratch."""
    if checkpoint is not None and scale not in ("paper", "official"):
        raise ConfigError(f"--checkpoint applies to --scale paper or official; --scale {scale} trains a tiny "
                          "replica from scratch (drop --checkpoint, or use --scale paper)")


def data_sources(cfg) -> list[dict[str, str]]:
    """The resolved training data of a dry-run plan: entry, source, fingerprint, in training order."""
    return [d.model_dump() for d in cfg.data]


def paper_plan(cfg, checkpoint: str | None) -> dict[str, Any]:
    """What a paper-scale run would do: checkpoint, parameter count and memory budget from a meta-device model."""
    from dare_bench.models import from_config
    from dare_bench.models.real_configs import real_config
    from dare_bench.trainers.memory_plan import paper_memory_gib

    ckpt_id = cfg.profile.model.checkpoint
    ckpt_dir = _checkpoint_dir(ckpt_id, checkpoint)
    if ckpt_dir is not None:
        from dare_bench.models.families import detect_family
        from dare_bench.models.io import read_config

        config_source = str(ckpt_dir / "config.json")
        ckpt_config = read_config(ckpt_dir)[0]
        family = detect_family(ckpt_config, config_source).name
        from dare_bench import catalogue

        expected = catalogue.backbone(cfg.backbone).family  # sdar30b is an SDAR, llada2.1 a LLaDA2
        if family != expected:
            raise CheckpointError(f"{config_source}: a {family} checkpoint, but {cfg.reproduction} needs a "
                                  f"{expected} checkpoint ({ckpt_id})")
        _check_tokenizer(ckpt_dir, ckpt_config)
        model = from_config(ckpt_dir)
    else:
        config_source, config = real_config(ckpt_id)
        model = from_config(config)
    n = model.num_parameters()
    train = cfg.profile.train
    lora = train.lora is not None
    trainable = _lora_params(model, train.lora) if lora else n
    gpus = train.gpus or 1
    plan = {
        "reproduction": cfg.reproduction, "scale": cfg.scale, "checkpoint": ckpt_id,
        "revision": cfg.profile.model.revision, "checkpoint_dir": str(ckpt_dir) if ckpt_dir else None,
        "config_source": config_source, "data": data_sources(cfg), "parameters": n,
        "trainable_parameters": trainable,
        "memory_gib": paper_memory_gib(cfg, model),
        "gpus": gpus,
        "command": (f"torchrun --nproc_per_node {gpus} -m dare_bench.cli reproduce {cfg.reproduction} --scale "
                    f"{cfg.scale} --checkpoint {ckpt_dir or '$DARE_BENCH_CHECKPOINTS/' + ckpt_id.split('/')[-1]}"
                    " --device cuda"),
        "config": cfg.to_dict(),
    }
    return plan


def _check_tokenizer(ckpt_dir: Path, config: dict[str, Any]) -> None:
    """The checkpoint's tokenizer loads and fits its embedding: every token id below the config's vocab_size
    (a tokenizer from another model would index past the embedding, or decode garbage, without an error)."""
    from dare_bench.models import load_tokenizer

    try:
        tokenizer = load_tokenizer(ckpt_dir)
    except Exception as exc:  # transformers raises many types for missing / corrupt tokenizer files
        raise CheckpointError(f"{ckpt_dir}: no usable tokenizer ({type(exc).__name__}: {exc})") from None
    if not getattr(tokenizer, "chat_template", None):  # paper prompts are the real chat, rendered by the checkpoint
        raise CheckpointError(f"{ckpt_dir}: the tokenizer has no chat template, which paper-scale prompts are "
                              "rendered with (tokenizer_config.json `chat_template` or chat_template.jinja)")
    vocab = config.get("vocab_size")
    if vocab is not None and len(tokenizer) > int(vocab):
        raise CheckpointError(f"{ckpt_dir}: the tokenizer has {len(tokenizer)} tokens but config.json's vocab_size "
                              f"is {vocab}: the tokenizer does not belong to this checkpoint")


def _lora_params(model, lora) -> int:
    import torch

    total = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            if lora.target_modules and not any(name.endswith(t) for t in lora.target_modules):
                continue
            total += lora.r * (module.in_features + module.out_features)
    return total


def _checkpoint_dir(ckpt_id: str | None, given: str | None) -> Path | None:
    if given:
        p = Path(given).expanduser()
        if not (p / "config.json").exists():
            raise CheckpointError(f"{p}: not a checkpoint directory (no config.json)")
        return p
    root = os.environ.get("DARE_BENCH_CHECKPOINTS")
    if root and ckpt_id:
        p = Path(root).expanduser() / ckpt_id.split("/")[-1]
        if (p / "config.json").exists():
            return p
    return None


def _require_gpu_and_checkpoint(plan: dict[str, Any], device: str = "cuda") -> None:
    """A paper run needs its checkpoint, and a GPU unless `--device cpu` was asked for explicitly."""
    import torch

    if plan["checkpoint_dir"] is None:
        raise CheckpointError(f"--scale paper needs the checkpoint {plan['checkpoint']}: pass --checkpoint DIR or set "
                              "DARE_BENCH_CHECKPOINTS to a directory holding it")
    if device == "cpu":
        return
    if not device.startswith("cuda"):
        raise ConfigError(f"--device {device!r}: use cuda, or cpu (the paper recipe on CPU, for shrunk checkpoints)")
    if not torch.cuda.is_available():
        raise DareBenchError("--scale paper needs a CUDA GPU; use --scale tiny (or micro) on this machine, --device "
                             "cpu to run the recipe on CPU (with a shrunk checkpoint), or --dry-run to see the plan")


__all__ = ["check_checkpoint_option", "data_sources", "default_scale", "local_plan", "paper_plan", "resolve"]
