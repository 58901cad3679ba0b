"""`dare-bench reproduce NAME`: base model -> trainer with one algorithm plug-in -> evaluator -> store.

What it does, at `tiny` / `micro` scale (CPU): builds the task tokenizer and the backbone's tiny preset, trains the
shared **base** (an SFT of the preset on the task's training data, cached under `DARE_BENCH_HOME/bases/` by content
hash, so every algorithm of a backbone x task x scale starts from the same weights), evaluates it, post-trains it
with the reproduction's algorithm (RL through `trainers.loop.train_rl`, SFT / LoRA through `trainers.sft`,
VRPO through `trainers.preference`), evaluates the result on the same items, and records everything in the store:
the run (resolved config + hash, seed, code / package versions, hardware), per-step metrics, and the base and final
evaluations with per-sample records. At `paper` scale the base is the real checkpoint (`--checkpoint DIR` or
`$DARE_BENCH_CHECKPOINTS/<name>`) and a GPU is required; `--dry-run` prints the plan without running it.

    dare-bench reproduce d1-llada-sudoku                      # tiny (the default without a GPU)
    dare-bench reproduce d1-llada-sudoku --scale micro --json # seconds; what CI runs
    dare-bench reproduce bgpo-llada-sudoku --scale paper --checkpoint /ckpt/LLaDA-8B-Instruct --dry-run
    torchrun: the paper-scale launcher prints its command with --dry-run (single-process execution otherwise)

    from dare_bench.pipeline import reproduce
    result = reproduce("d1-llada-sudoku", scale="micro", db="sqlite:///runs.db")
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from dare_bench.errors import CheckpointError, ConfigError, DareBenchError
from dare_bench.fileio import atomic_directory, atomic_write_json, dare_bench_home

# Bump when the base-training code changes in a way that changes the weights: cached bases are then rebuilt.
BASE_RECIPE_VERSION = 1

Log = Callable[[str], Any]


@dataclass
class ReproduceResult:
    run_id: int | None
    name: str
    scale: str
    status: str  # finished | failed | skipped | dry-run
    base_metrics: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    wall_seconds: float = 0.0
    db: str = ""
    stage_seconds: dict[str, float] = field(default_factory=dict)
    reward_curve: list[float] = field(default_factory=list)
    seed: int = 0
    config_hash: str = ""
    modified: bool = False
    message: str = ""
    plan: dict[str, Any] = field(default_factory=dict)
    final_model: str | None = None  # directory of the trained model (HF checkpoint, or PEFT adapters for LoRA)

    def to_json(self) -> dict[str, Any]:
        keys = ("run_id", "name", "scale", "status", "base_metrics", "metrics", "wall_seconds", "db")
        out = {k: getattr(self, k) for k in keys}
        out.update(seed=self.seed, config_hash=self.config_hash, modified=self.modified,
                   stage_seconds=self.stage_seconds, reward_curve=self.reward_curve, final_model=self.final_model)
        if self.message:
            out["message"] = self.message
        if self.plan:
            out["plan"] = self.plan
        return out


def default_scale() -> str:
    import torch

    return "paper" if torch.cuda.is_available() else "tiny"


# --------------------------------------------------------------------------------------------------- resolution

def resolve(name: str, scale: str, overrides: list[str] | tuple[str, ...] = ()):
    from dare_bench.registry import get

    spec = get(name)
    cfg = spec.resolve(scale, list(overrides))
    _check_algorithm_backbone(cfg)
    return spec, cfg


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


def _plugin_name(algorithm: str) -> str:
    """The RL plug-in of a reproduction's algorithm (registry ids use dashes, coupled-grpo; plug-ins coupled_grpo)."""
    from dare_bench import catalogue

    return catalogue.algorithm(algorithm).plugin or algorithm


# --------------------------------------------------------------------------------------------------- base model

def sampler_preset_from_config(sampler, template: str = "plain", batch_size: int = 16):
    """A SamplerPreset holding exactly the reproduction's pinned decoding settings, for every sampler kind."""
    from dare_bench.evaluators.presets import SAMPLER_KINDS, SamplerPreset
    from dare_bench.trainers.loop import rollout_settings

    settings = rollout_settings(sampler)
    return SamplerPreset(name=sampler.name or "reproduction", settings={k: dict(settings) for k in SAMPLER_KINDS},
                         source="reproduction config (eval.sampler)", template=template, batch_size=batch_size)


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _tokenizer_fingerprint(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items())
    specials = [tokenizer.mask_token, tokenizer.pad_token, tokenizer.eos_token, tokenizer.bos_token]
    return _hash([vocab, specials])


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


def _answer_length(cfg) -> int:
    """Completion length the run decodes (evaluation and rollouts): the SFT answers are EOS-padded to it."""
    lengths = [cfg.profile.eval.sampler.gen_length]
    if cfg.profile.train.rollout is not None:
        lengths.append(cfg.profile.train.rollout.gen_length)
    return max(lengths)


def build_base(cfg, task, tokenizer, train_items, *, data_fingerprint: str, log: Log, progress: bool):
    """The shared SFT base of (backbone preset, task, scale recipe): trained once, then loaded from the cache."""
    import torch

    from dare_bench.models import load_pretrained
    from dare_bench.models.io import build_model
    from dare_bench.models.presets import preset_for_tokenizer
    from dare_bench.trainers.sft import SFTConfig, train_sft

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
    log(f"base: SFT of {cfg.profile.model.preset} on {len(examples)} {cfg.task} examples for {sft_cfg.steps} steps")
    result = train_sft(model, examples, sft_cfg, progress=progress)
    with atomic_directory(directory) as tmp:
        model.save_pretrained(tmp / "model", tokenizer=tokenizer)
        atomic_write_json(tmp / "base.json", {"key": key, "losses": result.losses, "seconds": result.seconds})
    model.name_or_path = str(model_dir)  # LoRA adapters record it as their base
    return model, directory, False


# --------------------------------------------------------------------------------------------------- evaluation

def evaluate_model(model, tokenizer, task, cfg, *, seed: int, progress: bool, label: str, step: int):
    from dare_bench.evaluators.evaluator import evaluate

    ev = cfg.profile.eval
    from dare_bench.store.records import EvaluationRecord

    template = "plain" if cfg.scale in ("tiny", "micro") else "chat"
    preset = sampler_preset_from_config(ev.sampler, template=template, batch_size=ev.batch_size)
    result = evaluate(model, task, preset=preset, tokenizer=tokenizer, limit=ev.limit, split=ev.split,
                      grader=cfg.grader, seed=seed, batch_size=ev.batch_size, progress=progress)
    record = EvaluationRecord(**{**result.evaluation_record(), "checkpoint": label, "step": step,
                                 "primary_metric": ev.metric})
    return result, record


# --------------------------------------------------------------------------------------------------- main entry

def reproduce(name: str, scale: str | None = None, *, seed: int | None = None, db: str | None = None,
              resume: bool = False, dry_run: bool = False, overrides: list[str] | tuple[str, ...] = (),
              force: bool = False, checkpoint: str | None = None, device: str | None = None,
              progress: bool = True, log: Log = print) -> ReproduceResult:
    start = time.perf_counter()
    chosen_scale = scale or default_scale()
    if scale is None and chosen_scale == "tiny":
        log("no GPU found: running the `tiny` scale (use --scale paper with a GPU and --checkpoint for the recipe)")
    spec, cfg = resolve(name, chosen_scale, overrides)
    run_seed = cfg.profile.seeds[0] if seed is None else int(seed)
    common = dict(name=spec.name, scale=chosen_scale, seed=run_seed, config_hash=cfg.content_hash,
                  modified=cfg.modified)

    if chosen_scale in ("paper", "official"):
        plan = paper_plan(cfg, checkpoint)
        if dry_run:
            return ReproduceResult(run_id=None, status="dry-run", plan=plan, db="", **common)
        _require_gpu_and_checkpoint(plan)
    elif dry_run:
        plan = {"config": cfg.to_dict(), "base": cfg.profile.base.model_dump() if cfg.profile.base else None,
                "model_preset": cfg.profile.model.preset}
        return ReproduceResult(run_id=None, status="dry-run", plan=plan, db="", **common)
    paper_dir = Path(plan["checkpoint_dir"]) if chosen_scale in ("paper", "official") else None

    from dare_bench.store import Store

    store = Store(db)
    store.mark_orphans_failed()
    if not force:
        done = store.find_runs(config_hash=cfg.content_hash, seed=run_seed)
        if done:
            prev = done[0]
            evals = store.evaluations(prev["id"])
            finals = [e for e in evals if e.get("checkpoint") == "final"]
            bases = [e for e in evals if e.get("checkpoint") == "base"]
            return ReproduceResult(
                run_id=prev["id"], status="skipped", db=store.url, wall_seconds=time.perf_counter() - start,
                metrics=finals[0]["metrics"] if finals else {}, base_metrics=bases[0]["metrics"] if bases else {},
                message="an identical finished run exists (use --force to run again)", **common)

    run_id = store.start_run(cfg, seed=run_seed)
    result = ReproduceResult(run_id=run_id, status="running", db=store.url, **common)
    try:
        _run(cfg, store, run_id, result, seed=run_seed, resume=resume,
             device=device or ("cuda" if paper_dir is not None else "cpu"), progress=progress, log=log,
             paper_dir=paper_dir)
    except BaseException as exc:
        store.fail_run(run_id, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}")
        raise
    result.status = "finished"
    result.wall_seconds = time.perf_counter() - start
    return result


def _run(cfg, store, run_id: int, result: ReproduceResult, *, seed: int, resume: bool, device: str,
         progress: bool, log: Log, paper_dir: Path | None = None) -> None:
    """tiny / micro: SFT base from the preset. paper: the real checkpoint is the base (chat template prompts)."""
    import torch

    from dare_bench.tasks import get_task

    stages = result.stage_seconds
    task = get_task(cfg.task)
    t0 = time.perf_counter()
    train_data = task.load(split="train", limit=_train_items_needed(cfg))
    if paper_dir is None:
        from dare_bench.tasks.tokenizer import build_task_tokenizer

        tokenizer = build_task_tokenizer(cfg.task)
        model, base_dir, _ = build_base(cfg, task, tokenizer, list(train_data),
                                        data_fingerprint=str(train_data.fingerprint), log=log, progress=progress)
        template = "plain"
    else:  # untested without a GPU: the same stages on the real checkpoint
        from dare_bench.models import load_pretrained, load_tokenizer

        model = load_pretrained(paper_dir, dtype=cfg.profile.model.dtype, device=device)
        tokenizer = load_tokenizer(paper_dir)
        base_dir = dare_bench_home() / "bases" / f"paper-{cfg.backbone}-{cfg.task}-{cfg.content_hash[:16]}"
        base_dir.mkdir(parents=True, exist_ok=True)
        template = tokenizer
    stages["base"] = time.perf_counter() - t0
    model = model.to(device)

    t0 = time.perf_counter()
    base_eval, base_record = _cached_base_eval(model, tokenizer, task, cfg, base_dir, seed=seed, progress=progress)
    result.base_metrics = dict(base_eval["metrics"])
    stages["base_eval"] = time.perf_counter() - t0
    log(f"base: {cfg.profile.eval.metric} = {result.base_metrics.get(cfg.profile.eval.metric)}")

    train = cfg.profile.train
    run_dir = dare_bench_home() / "runs" / f"{cfg.reproduction}-{cfg.scale}-{cfg.content_hash[:12]}-seed{seed}"
    sink = _metrics_sink(store, run_id, result)
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    if train.kind == "rl":
        from dare_bench.trainers import loop

        if not resume:  # a fresh run must never resume later from a previous run's checkpoints
            import shutil

            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        out = loop.train_rl(model, tokenizer, task, _plugin_name(cfg.algorithm), train, sink=sink,
                       checkpoint_dir=run_dir / "checkpoints", resume=resume, seed=seed, progress=progress,
                       items=list(train_data), grader=cfg.grader, prompt_template=template,
                       evaluate=_mid_training_eval(tokenizer, task, cfg, seed, store, run_id))
        model = out.policy
        final_step = out.optimizer_steps
        if out.resumed_from:  # steps trained before the interruption belong to this run's curve too
            for step, metrics in enumerate(out.history[: out.resumed_from], start=1):
                store.log_metrics(run_id, step, metrics)
        result.reward_curve = [float(h["reward_mean"]) for h in out.history if "reward_mean" in h]
    elif train.kind == "sft":
        model, final_step = _continue_sft(model, task, tokenizer, train_data, train, seed, sink, progress, template,
                                          cfg.grader, _answer_length(cfg))
    elif train.kind == "preference":
        model, final_step = _train_vrpo(model, task, tokenizer, train_data, cfg, seed, sink, progress, template)
    else:  # "none": evaluate the base as it is
        final_step = 0
    stages["train"] = time.perf_counter() - t0
    if train.kind != "none":
        save_final_model(model, tokenizer, run_dir / "final")
        result.final_model = str(run_dir / "final")

    t0 = time.perf_counter()
    if train.kind == "none":
        final_record = base_record.model_copy(update={"checkpoint": "final", "uid": _new_uid()})
        result.metrics = dict(result.base_metrics)
    else:
        final_eval, final_record = evaluate_model(model, tokenizer, task, cfg, seed=seed, progress=progress,
                                                  label="final", step=final_step)
        result.metrics = dict(final_eval.metrics)
    stages["final_eval"] = time.perf_counter() - t0
    store.finish_run(run_id, [base_record.model_copy(update={"uid": _new_uid()}), final_record])


def _train_items_needed(cfg) -> int | None:
    """Tiny / micro runs draw at most this many training items (a micro base needs ~1k, not a 20k-item set)."""
    if cfg.profile.base is None:
        return None
    train = cfg.profile.train
    needed = max(cfg.profile.base.start_step * cfg.profile.base.batch_size,
                 (train.steps or 1) * (train.batch_prompts or 1), 256)
    return needed if needed < 20000 else None


def save_final_model(model, tokenizer, directory: Path) -> None:
    """The trained model, atomically: a Hugging Face checkpoint dir, or PEFT-format adapters for LoRA runs (both load
    with `dare-bench eval --model DIR`)."""
    with atomic_directory(directory) as tmp:
        if hasattr(model, "peft_config"):
            model.save_pretrained(str(tmp))
            tokenizer.save_pretrained(str(tmp))
        else:
            model.save_pretrained(tmp, tokenizer=tokenizer)


def _new_uid() -> str:
    from dare_bench.store.records import new_uid

    return new_uid()


def _cached_base_eval(model, tokenizer, task, cfg, base_dir: Path, *, seed: int, progress: bool):
    """The base's evaluation is shared by every algorithm on it: cached beside the base, keyed by eval settings."""
    from dare_bench.store.records import EvaluationRecord

    key = _hash({"eval": cfg.profile.eval.model_dump(), "grader": cfg.grader, "seed": seed})[:16]
    path = base_dir / f"eval-{key}.json"
    if path.exists():
        record = EvaluationRecord.model_validate_json(path.read_text())
        return {"metrics": record.metrics}, record
    res, record = evaluate_model(model, tokenizer, task, cfg, seed=seed, progress=progress, label="base", step=0)
    atomic_write_json(path, json.loads(record.model_dump_json()))
    return {"metrics": res.metrics}, record


def _mid_training_eval(tokenizer, task, cfg, seed: int, store, run_id: int):
    """`train.eval_every`: the final evaluation's settings on the current policy, stored as evaluation `step-N`;
    its primary metric and score also join the step's metrics as `eval_*` (the RL gain at tiny scale peaks early,
    so the curve matters)."""
    metric = cfg.profile.eval.metric

    def run(policy, step: int) -> dict[str, float]:
        res, record = evaluate_model(policy, tokenizer, task, cfg, seed=seed, progress=False, label=f"step-{step}",
                                     step=step)
        store.add_evaluation(run_id, record)
        return {k: res.metrics[k] for k in dict.fromkeys((metric, "score")) if k in res.metrics}

    return run


def _metrics_sink(store, run_id: int, result: ReproduceResult):
    def sink(step: int, metrics: dict) -> None:
        store.log_metrics(run_id, int(step), metrics)
        if "reward_mean" in metrics:
            result.reward_curve.append(float(metrics["reward_mean"]))

    return sink


def _continue_sft(model, task, tokenizer, train_data, train, seed, sink, progress, template, grader, pad_to):
    from dare_bench.trainers.lora import apply_lora
    from dare_bench.trainers.sft import SFTConfig, train_sft

    if train.lora is not None:
        model = apply_lora(model, train.lora)
    steps = train.steps or 1
    cfg = SFTConfig(steps=steps, lr=train.lr, batch_size=train.batch_prompts or 32, warmup_steps=train.warmup_steps,
                    weight_decay=train.weight_decay, grad_clip=train.max_grad_norm or 1e9, seed=seed + 1)
    train_sft(model, sft_examples(task, tokenizer, train_data, template, grader, pad_to), cfg, sink=sink, progress=progress)
    return model, steps


def _train_vrpo(model, task, tokenizer, train_data, cfg, seed, sink, progress, template):
    """VRPO at tiny scale: preference pairs from the base's own rollouts (chosen = the gold answer, rejected = the
    base's lowest-reward sample when it is worse than gold)."""
    from dare_bench.trainers.preference import PreferenceConfig, PreferencePair, train_preference

    train = cfg.profile.train
    knobs = train.algorithm or {}
    # VRPO has no rollouts of its own (rollout: null): the base answers with the pinned evaluation sampler.
    sampler = train.rollout or cfg.profile.eval.sampler
    pairs = preference_pairs(model, tokenizer, task, list(train_data)[: max(8, (train.batch_prompts or 8) * 4)],
                             sampler, cfg.grader, seed, template)
    if not pairs:
        raise DareBenchError("VRPO: the base model solved every training prompt; no preference pair to learn from")
    pcfg = PreferenceConfig(steps=train.steps or 10, lr=train.lr, batch_pairs=max(1, (train.batch_prompts or 4)),
                            beta=float(knobs.get("dpo_beta", 0.2)), mc_samples=train.mc_samples, seed=seed)
    train_preference(model, pairs, pcfg, sink=sink, progress=progress)
    return model, pcfg.steps


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


# --------------------------------------------------------------------------------------------------- paper scale

def paper_plan(cfg, checkpoint: str | None) -> dict[str, Any]:
    """What a paper-scale run would do: checkpoint, parameter count and memory budget from a meta-device model."""
    from dare_bench.models import from_config
    from dare_bench.models.real_configs import real_config

    ckpt_id = cfg.profile.model.checkpoint
    ckpt_dir = _checkpoint_dir(ckpt_id, checkpoint)
    if ckpt_dir is not None:
        from dare_bench.models.base import detect_family
        from dare_bench.models.io import read_config

        config_source = str(ckpt_dir / "config.json")
        family = detect_family(read_config(ckpt_dir)[0], config_source).name
        if family != cfg.backbone:
            raise CheckpointError(f"{config_source}: a {family} checkpoint, but {cfg.reproduction} needs a "
                                  f"{cfg.backbone} backbone ({ckpt_id})")
        model = from_config(ckpt_dir)
    else:
        config_source, config = real_config(ckpt_id)
        model = from_config(config)
    n = model.num_parameters()
    train = cfg.profile.train
    lora = train.lora is not None
    bytes_weights = 2 * n  # bf16 weights
    trainable = _lora_params(model, train.lora) if lora else n
    bytes_train = trainable * (2 + 4 + 4 + 4)  # bf16 grads, fp32 master + Adam m, v
    gpus = train.gpus or 1
    plan = {
        "reproduction": cfg.reproduction, "scale": cfg.scale, "checkpoint": ckpt_id,
        "revision": cfg.profile.model.revision, "checkpoint_dir": str(ckpt_dir) if ckpt_dir else None,
        "config_source": config_source, "parameters": n, "trainable_parameters": trainable,
        "memory_gib": {
            "weights_bf16": round(bytes_weights / 2**30, 2),
            "optimizer_and_grads": round(bytes_train / 2**30, 2),
            "reference_model": round(bytes_weights / 2**30, 2) if (train.beta_kl > 0 and not lora) else 0.0,
            "per_gpu_fsdp": round((bytes_weights + bytes_train) / gpus / 2**30, 2),
        },
        "gpus": gpus,
        "command": (f"torchrun --nproc_per_node {gpus} -m dare_bench.cli reproduce {cfg.reproduction} --scale "
                    f"{cfg.scale} --checkpoint {ckpt_dir or '$DARE_BENCH_CHECKPOINTS/' + ckpt_id.split('/')[-1]}"
                    " --device cuda"),
        "config": cfg.to_dict(),
    }
    return plan


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


def _require_gpu_and_checkpoint(plan: dict[str, Any]) -> None:
    import torch

    if plan["checkpoint_dir"] is None:
        raise CheckpointError(f"--scale paper needs the checkpoint {plan['checkpoint']}: pass --checkpoint DIR or set "
                              "DARE_BENCH_CHECKPOINTS to a directory holding it")
    if not torch.cuda.is_available():
        raise DareBenchError("--scale paper needs a CUDA GPU; use --scale tiny (or micro) on this machine, or "
                             "--dry-run to see the plan")


def summary_lines(result: ReproduceResult, metric: str = "accuracy") -> list[str]:
    """The one-screen summary printed at the end of `dare-bench reproduce`."""
    lines = [f"{result.name} [{result.scale}, seed {result.seed}] -> {result.status}"
             + (f" (run {result.run_id}, {result.db})" if result.run_id else "")]
    if result.message:
        lines.append(result.message)
    if result.base_metrics or result.metrics:
        b, f = result.base_metrics.get(metric), result.metrics.get(metric)
        delta = f"  ({f - b:+.3f})" if isinstance(b, float) and isinstance(f, float) else ""
        lines.append(f"{metric}: base {b}  ->  final {f}{delta}")
    if result.reward_curve:
        lines.append("reward: " + sparkline(result.reward_curve)
                     + f"  {result.reward_curve[0]:.3f} -> {result.reward_curve[-1]:.3f}")
    if result.stage_seconds:
        lines.append("time: " + ", ".join(f"{k} {v:.1f}s" for k, v in result.stage_seconds.items())
                     + f"; total {result.wall_seconds:.1f}s")
    return lines


def sparkline(values: list[float]) -> str:
    bars = "▁▂▃▄▅▆▇█"
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    step = max(1, len(values) // 60)
    return "".join(bars[min(7, int((v - lo) / span * 7.999))] for v in values[::step])


__all__ = ["ReproduceResult", "reproduce", "resolve", "paper_plan", "summary_lines", "default_scale"]
