"""dLLM-aware evaluation: decode a task's prompts with a pinned sampler preset, grade them, aggregate.

What it does: loads a backbone (checkpoint directory or model preset) and its tokenizer, formats each item's prompt
(the tokenizer's chat template with the task's official messages, or the task's plain prompt for tiny models),
decodes in batches with the diffusion sampler of the backbone (`dare_bench.diffusion.sampling.generate`) using a
pinned preset (`dare_bench.evaluators.presets`), grades every completion with the task's grader (code runs in the
sandbox, inside the task's grader), and returns per-sample records plus aggregate metrics (accuracy = pass@1,
mean score, mean reward, tokens per forward, wall time). It never touches the store: results go to the caller and,
as they happen, to an optional sink (`sink(event, payload)`; events "batch" and "evaluation", the latter's payload
shaped like `dare_bench.store.EvaluationRecord`).

    dare-bench eval --model tiny-llada --task sudoku --limit 8                # CPU, random-init tiny replica
    dare-bench eval --model /ckpt/LLaDA-8B-Instruct --task gsm8k --preset d1-llada --device cuda --json
    torchrun: not needed (evaluation runs in one process; shard with --limit / --data for fan-out)

    from dare_bench.evaluators.evaluator import evaluate, score_predictions
    res = evaluate("tiny-llada", "sudoku", limit=8, seed=0)
    res.metrics["accuracy"], res.records[0]["completion"]

Deterministic under a seed: each batch reseeds the global torch RNG (inside `fork_rng`, so the caller's RNG is
untouched) from (seed, batch number), and batches are formed the same way for the same items.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from dare_bench.errors import CheckpointError, ConfigError, DareBenchError, DataError
from dare_bench.evaluators.presets import SamplerPreset, default_preset, get_preset, sampler_kind

log = logging.getLogger(__name__)

Sink = Callable[[str, dict], Any]



# --------------------------------------------------------------------------------------------------------------
# results


@dataclass
class EvalResult:
    task: str
    model: str
    preset: str
    split: str
    source: str
    fingerprint: str
    grader: str | None
    sampler: dict[str, Any]
    metrics: dict[str, float]
    records: list[dict[str, Any]]
    primary_metric: str = "accuracy"
    checkpoint: str | None = None

    def to_json(self, completions: bool = True) -> dict[str, Any]:
        keep = ("index", "correct", "reward", "score", "extracted") + (("completion",) if completions else ())
        return {
            "task": self.task,
            "model": self.model,
            "preset": self.preset,
            "metrics": dict(self.metrics),
            "items": [{k: r.get(k) for k in keep} for r in self.records],
            "split": self.split,
            "source": self.source,
            "fingerprint": self.fingerprint,
            "grader": self.grader,
            "sampler": self.sampler,
        }

    def evaluation_record(self) -> dict[str, Any]:
        """A dict `dare_bench.store.EvaluationRecord(**d)` accepts (the store is not imported here)."""
        return {
            "task": self.task,
            "split": self.split,
            "data_fingerprint": self.fingerprint,
            "sampler_preset": self.preset,
            "sampler": self.sampler,
            "metrics": {k: float(v) for k, v in self.metrics.items() if _finite(v)},
            "primary_metric": self.primary_metric,
            "n_items": len(self.records),
            "checkpoint": self.checkpoint,
            "samples": [
                {
                    "idx": i,
                    "item_id": str(r["index"]),
                    "prompt": r.get("prompt"),
                    "completion": r["completion"],
                    "reference": r.get("reference"),
                    "score": float(r["score"]),
                    "correct": bool(r["correct"]),
                    "extra": {"reward": r["reward"], "extracted": r["extracted"], **r.get("details", {})},
                }
                for i, r in enumerate(self.records)
            ],
        }


@dataclass
class ScoreResult:
    task: str
    items: list[dict[str, Any]]
    metrics: dict[str, float]
    source: str = ""
    fingerprint: str = ""
    grader: str | None = None

    def to_json(self) -> dict[str, Any]:
        keep = ("index", "correct", "reward", "extracted")
        return {"task": self.task, "items": [{k: r.get(k) for k in keep} for r in self.items],
                "metrics": dict(self.metrics)}


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


# --------------------------------------------------------------------------------------------------------------
# tasks, models, grading


def resolve_task(task):
    """A Task object from a name (or pass one through)."""
    if not isinstance(task, str):
        return task
    try:
        from dare_bench.tasks import get_task
    except ImportError as exc:  # pragma: no cover - tasks ship with the package
        raise ConfigError(f"the task registry is unavailable: {exc}") from exc
    return get_task(task)


def check_grader(task, grader: str | None) -> None:
    if grader is not None and grader not in list(task.graders):
        raise ConfigError(f"grader {grader!r} does not exist for task {task.name!r}; "
                          f"available: {', '.join(task.graders)}")


def grade_one(task, item, completion: Any, grader: str | None) -> dict[str, Any]:
    """Grade one completion; a malformed completion or a grader crash is scored wrong and logged, never raised."""
    try:
        if not isinstance(completion, str):
            raise TypeError(f"completion is {type(completion).__name__}, not a string")
        g = task.grade(completion, item, grader) if grader is not None else task.grade(completion, item)
        details = _plain(getattr(g, "details", {}) or {})
        rec = {
            "correct": bool(g.correct),
            "reward": float(g.reward),
            "score": float(g.score if getattr(g, "score", None) is not None else bool(g.correct)),
            "extracted": None if g.extracted is None else str(g.extracted),
            "details": details if isinstance(details, dict) else {"details": details},
        }
    except DareBenchError:
        raise  # configuration problems (unknown grader, ...) are the caller's to fix
    except Exception as exc:
        rec = {"correct": False, "reward": 0.0, "score": 0.0, "extracted": None,
               "details": {"error": f"{type(exc).__name__}: {exc}"}}
        # only a crash is logged: a grader's own "error" detail (no code found, a failing assert) is its verdict
        log.warning("%s item %s scored wrong: %s", getattr(task, "name", "task"), getattr(item, "index", "?"),
                    rec["details"]["error"])
    if not math.isfinite(rec["reward"]):
        rec["reward"] = 0.0
    return rec


def _plain(obj: Any) -> Any:
    try:
        return json.loads(json.dumps(obj, default=str))
    except (TypeError, ValueError):
        return {"repr": repr(obj)}


def aggregate(records: Sequence[dict[str, Any]], task=None) -> dict[str, float]:
    n = len(records)
    if n == 0:
        raise DataError("nothing to score: no items")
    acc = sum(bool(r["correct"]) for r in records) / n
    metrics = {
        "n": float(n),
        "accuracy": acc,
        "pass@1": acc,  # one decoded sample per item: pass@1 is the fraction of items judged correct
        "score": sum(float(r["score"]) for r in records) / n,
        "mean_reward": sum(float(r["reward"]) for r in records) / n,
    }
    return metrics


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    name: str
    tiny: bool
    checkpoint: str | None = None


def load_model(model_ref, task, *, device: str = "cpu", dtype: str = "float32", seed: int = 0,
               tokenizer=None) -> LoadedModel:
    """A backbone plus its tokenizer.

    A checkpoint directory brings its own tokenizer; a model preset (`tiny-llada`, ...) is built with the task's
    tokenizer (`dare_bench.tasks.tokenizer.build_task_tokenizer`) and a seeded random init.
    """
    if not isinstance(model_ref, (str, os.PathLike)):
        if tokenizer is None:
            raise ConfigError("a model object needs its tokenizer (tokenizer=...)")
        name = getattr(model_ref, "name_or_path", type(model_ref).__name__)
        return LoadedModel(model_ref, tokenizer, str(name), is_task_replica(tokenizer), None)
    ref = os.fspath(model_ref)
    path = Path(ref).expanduser()
    import torch

    from dare_bench.models import load_pretrained, load_tokenizer

    if path.is_dir() and (path / "adapter_config.json").exists():
        model, base_dir = load_adapter_checkpoint(path, dtype=dtype, device=device)
        tok_dir = path if ((path / "tokenizer.json").exists() or (path / "vocab.json").exists()) else base_dir
        tok = tokenizer if tokenizer is not None else load_tokenizer(str(tok_dir))
        return LoadedModel(model, tok, ref, is_task_replica(tok), str(path.resolve()))
    if path.is_dir():
        model = load_pretrained(str(path), dtype=dtype, device=device)
        tok = tokenizer if tokenizer is not None else load_tokenizer(str(path))
        return LoadedModel(model, tok, ref, is_task_replica(tok), str(path.resolve()))
    if path.exists():
        raise CheckpointError(f"{path}: expected a checkpoint directory")
    from dare_bench.models.io import build_model, resolve_dtype
    from dare_bench.models.presets import PRESETS, preset_for_tokenizer

    if ref not in PRESETS:
        # let the models package phrase the error (unknown preset with a hint, or missing directory)
        load_pretrained(ref, dtype=dtype, device=device)
    tok = tokenizer if tokenizer is not None else _task_tokenizer(task)
    config = preset_for_tokenizer(ref, tok)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(config, device="cpu", dtype=torch.float32, source=ref)
        model.init_weights()
    model = model.to(device=device, dtype=resolve_dtype(dtype)).eval()
    model.name_or_path = ref
    return LoadedModel(model, tok, ref, True, None)


def load_adapter_checkpoint(path: Path, *, dtype: str = "float32", device: str = "cpu"):
    """A PEFT (LoRA) adapter directory: its base checkpoint (`base_model_name_or_path`, a local directory) with the
    adapters applied. Returns (model, base directory)."""
    from dare_bench.models import load_pretrained

    try:
        adapter_cfg = json.loads((path / "adapter_config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path / 'adapter_config.json'}: unreadable adapter config ({exc})") from None
    base = adapter_cfg.get("base_model_name_or_path")
    if not base or not Path(base).is_dir():
        raise CheckpointError(f"{path / 'adapter_config.json'}: base_model_name_or_path {base!r} is not a local "
                              "checkpoint directory")
    from peft import PeftModel

    model = PeftModel.from_pretrained(load_pretrained(base, dtype=dtype, device=device), str(path))
    return model.eval(), Path(base)


def _task_tokenizer(task):
    try:
        from dare_bench.tasks.tokenizer import build_task_tokenizer
    except ImportError as exc:
        raise ConfigError(f"cannot build a tokenizer for task {task.name!r}: {exc}") from exc
    return build_task_tokenizer(getattr(task, "name", task))


def is_task_replica(tokenizer) -> bool:
    """A model whose tokenizer has no chat template is a tiny replica trained on a task tokenizer's plain prompts,
    whatever its size; a real checkpoint (or a shrunk copy of one) brings its chat template. Decides the default
    preset: `tiny` for replicas, the pinned paper preset otherwise."""
    return not getattr(tokenizer, "chat_template", None)


def resolve_preset(preset: str | SamplerPreset | None, family: str, task_name: str, tiny: bool) -> SamplerPreset:
    if isinstance(preset, SamplerPreset):
        return preset
    if preset is None:
        return default_preset(family, task_name, tiny)
    return get_preset(preset)


# --------------------------------------------------------------------------------------------------------------
# generation


def _encode(tokenizer, text: str) -> list[int]:
    enc = tokenizer(text, add_special_tokens=False)
    ids = enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc
    ids = list(ids)
    if ids and isinstance(ids[0], list):  # some tokenizers return a batch
        ids = ids[0]
    return [int(i) for i in ids]


def _batches(lengths: Sequence[int], batch_size: int, equal_length: bool) -> list[list[int]]:
    """Item positions per batch. Block samplers need equal lengths (their block grid is absolute); MDLM batches
    are formed from length-sorted items so left padding stays small."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    out: list[list[int]] = []
    if equal_length:
        groups: dict[int, list[int]] = {}
        for i in order:
            groups.setdefault(lengths[i], []).append(i)
        for idx in groups.values():
            out.extend(idx[j:j + batch_size] for j in range(0, len(idx), batch_size))
    else:
        out = [order[j:j + batch_size] for j in range(0, len(order), batch_size)]
    return out


def decode_completion(tokenizer, tokens: Sequence[int], stop_ids: Iterable[int], drop_ids: Iterable[int]) -> str:
    """Cut at the first stop token (eos / end-of-turn), drop leftover mask / pad ids, detokenize."""
    stop, drop = set(int(t) for t in stop_ids), set(int(t) for t in drop_ids)
    kept: list[int] = []
    for t in tokens:
        t = int(t)
        if t in stop:
            break
        if t not in drop:
            kept.append(t)
    return tokenizer.decode(kept, skip_special_tokens=True)


class ForwardBudgetExceeded(RuntimeError):
    pass


def forward_budget(settings: dict[str, Any], block_size: int | None = None) -> int:
    """Model calls one generate() may make before it is declared stuck: four times an upper bound on what any
    sampler needs for these settings (every step commits at least one token, plus one committing pass per block)."""
    gen = int(settings.get("gen_length") or settings.get("max_new_tokens") or 128)
    steps = int(settings.get("steps") or settings.get("denoising_steps") or gen)
    block = int(settings.get("block_length") or block_size or gen)
    return 4 * (gen + steps * max(1, -(-gen // block))) + 64


@contextlib.contextmanager
def _forward_budget(model, budget: int):
    count = [0]

    def hook(module, args):
        count[0] += 1
        if count[0] > budget:
            raise ForwardBudgetExceeded(f"generation did not finish within {budget} model calls")

    handle = model.register_forward_pre_hook(hook) if hasattr(model, "register_forward_pre_hook") else None
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()


def generate_completions(model, tokenizer, prompts: Sequence[str], settings: dict[str, Any], *, batch_size: int,
                         seed: int = 0, progress: bool = True, on_batch: Callable[[dict], Any] | None = None,
                         generate_fn: Callable | None = None) -> tuple[list[str], dict[str, Any]]:
    """Decode every prompt; returns completions (input order) and generation statistics."""
    import torch

    if generate_fn is None:
        from dare_bench.diffusion.sampling import generate as generate_fn
    traits = model.traits
    kind = sampler_kind(traits)
    encoded = [_encode(tokenizer, p) for p in prompts]
    for i, ids in enumerate(encoded):
        if not ids:
            raise DataError(f"prompt {i} tokenizes to nothing")
    pad_id = int(traits.pad_token_id)
    stop_ids = (int(traits.eos_token_id), *map(int, traits.stop_token_ids))
    drop_ids = (int(traits.mask_token_id), pad_id)
    device = next(model.parameters()).device
    completions: list[str | None] = [None] * len(prompts)
    errors: dict[int, str] = {}
    budget = forward_budget(settings, getattr(traits, "block_size", None))
    totals = {"forwards": 0, "row_forwards": 0, "row_tokens": 0, "generation_seconds": 0.0}
    resolved: dict[str, Any] = {}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(prompts), desc="generate", unit="item", leave=False)
    try:
        for b, idx in enumerate(_batches([len(e) for e in encoded], max(1, batch_size), kind == "block")):
            width = max(len(encoded[i]) for i in idx)
            ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            for row, i in enumerate(idx):
                ids[row, width - len(encoded[i]):] = torch.tensor(encoded[i])
                mask[row, width - len(encoded[i]):] = 1
            attention = mask if bool((mask == 0).any()) else None
            devices = [device] if device.type == "cuda" else []
            try:
                with torch.random.fork_rng(devices=devices), _forward_budget(model, budget):
                    torch.manual_seed(seed * 1_000_003 + b)
                    out = generate_fn(model, ids.to(device), None if attention is None else attention.to(device),
                                      **settings)
            except ForwardBudgetExceeded as exc:
                # a decode that never finishes (e.g. a model that keeps committing the mask token) fails its
                # items, not the evaluation
                log.warning("batch %d: %s; its %d item(s) are scored wrong", b, exc, len(idx))
                for i in idx:
                    completions[i] = ""
                    errors[i] = str(exc)
                totals["forwards"] += budget
                totals["row_forwards"] += budget * len(idx)
                if bar is not None:
                    bar.update(len(idx))
                continue
            gen = out.sequences[:, out.prompt_length:].tolist()
            for row, i in enumerate(idx):
                completions[i] = decode_completion(tokenizer, gen[row], stop_ids, drop_ids)
            st = out.stats
            totals["forwards"] += int(st.forwards)
            totals["row_forwards"] += int(st.forwards) * len(idx)
            totals["row_tokens"] += int(st.generated_tokens) * len(idx)
            totals["generation_seconds"] += float(st.wall_seconds)
            if not resolved:
                resolved = _plain({k: v for k, v in dict(out.settings).items() if k not in ("progress",)})
            if bar is not None:
                bar.update(len(idx))
            if on_batch is not None:
                on_batch({"batch": b, "items": len(idx), "forwards": int(st.forwards),
                          "tokens_per_forward": float(st.tokens_per_forward), "wall_seconds": float(st.wall_seconds)})
    finally:
        if bar is not None:
            bar.close()
    stats = {
        "forwards": float(totals["forwards"]),
        "tokens_per_forward": totals["row_tokens"] / totals["row_forwards"] if totals["row_forwards"] else 0.0,
        "generated_tokens_per_item": totals["row_tokens"] / len(prompts) if prompts else 0.0,
        "generation_seconds": totals["generation_seconds"],
        "sampler": resolved,
        "sampler_kind": kind,
        "errors": errors,
    }
    return [c or "" for c in completions], stats


# --------------------------------------------------------------------------------------------------------------
# entry points


def evaluate(model, task, *, preset: str | SamplerPreset | None = None, tokenizer=None, limit: int | None = None,
             split: str = "test", source: str | os.PathLike | None = None, grader: str | None = None, seed: int = 0,
             batch_size: int | None = None, device: str = "cpu", dtype: str = "float32", progress: bool = True,
             sink: Sink | None = None, overrides: dict[str, Any] | None = None,
             generate_fn: Callable | None = None, shard: tuple[int, int] | None = None,
             repeats: int = 1, items: Sequence[Any] | None = None) -> EvalResult:
    """Evaluate `model` (checkpoint dir, model preset or a loaded DiffusionLM + `tokenizer`) on `task`.

    `shard=(k, n)`: only the k-th of n contiguous shares of the items (data-parallel evaluation; the ranks'
    results are joined with `merge_shards`). `repeats=k`: every item is decoded k times, one record per sample
    with its `repeat`, and the metrics average all of them, as OpenCompass' repeatN datasets do (the mean of k
    samples, not pass@k). `items`: evaluate these task items instead of loading `split` (the tiny base's held-out
    validation items, `pipeline.base_cache`)."""
    t_start = time.perf_counter()
    task = resolve_task(task)
    check_grader(task, grader)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"--limit must be a positive integer, got {limit!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats must be a positive integer, got {repeats!r}")
    if items is None:
        dataset = task.load(split=split, source=source, limit=limit)
    else:
        from dare_bench.tasks.base import TaskDataset, sha256_items

        given = list(items)[:limit] if limit else list(items)
        dataset = TaskDataset(task.name, split, given, source="given items", fingerprint=sha256_items(given))
    items = list(dataset)
    if not items:
        raise DataError(f"task {task.name!r} ({split}) has no items to evaluate")
    if shard is not None:
        k, n = shard
        items = items[len(items) * k // n: len(items) * (k + 1) // n]
    loaded = load_model(model, task, device=device, dtype=dtype, seed=seed, tokenizer=tokenizer)
    traits = loaded.model.traits
    chosen = resolve_preset(preset, traits.family, task.name, loaded.tiny)
    settings = chosen.settings_for(sampler_kind(traits))
    settings.update(overrides or {})
    template = "plain" if chosen.template == "plain" else loaded.tokenizer
    prompts = [task.format_prompt(item, template) for item in items]

    # the repeats decode in one pass over `repeats` copies of the prompts: one seeded stream of batches, so sample r
    # of item i is a fresh draw (identical under greedy settings), and the generation statistics cover them all
    n_items = len(items)
    items, prompts = items * repeats, prompts * repeats
    completions, gen_stats = generate_completions(
        loaded.model, loaded.tokenizer, prompts, settings, batch_size=batch_size or chosen.batch_size, seed=seed,
        progress=progress, on_batch=(lambda p: sink("batch", p)) if sink else None, generate_fn=generate_fn,
    )

    t_grade = time.perf_counter()
    records: list[dict[str, Any]] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(items), desc="grade", unit="item", leave=False)
    try:
        for pos, (item, prompt, completion) in enumerate(zip(items, prompts, completions)):
            rec = {"index": item.index, "prompt": prompt, "completion": completion,
                   "reference": getattr(item, "ground_truth", None)}
            if repeats > 1:
                rec["repeat"] = pos // n_items
            rec.update(grade_one(task, item, completion, grader))
            if pos in gen_stats["errors"]:
                rec.update(correct=False, reward=0.0, score=0.0, extracted=None)
                rec["details"] = {**rec["details"], "generation_error": gen_stats["errors"][pos]}
            records.append(rec)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    metrics = aggregate(records, task) if records else {}  # an empty shard: merge_shards scores the whole set
    metrics["generation_errors"] = float(len(gen_stats["errors"]))
    metrics.update({
        "tokens_per_forward": gen_stats["tokens_per_forward"],
        "forwards": gen_stats["forwards"],
        "generated_tokens_per_item": gen_stats["generated_tokens_per_item"],
        "generation_seconds": gen_stats["generation_seconds"],
        "grading_seconds": time.perf_counter() - t_grade,
        "wall_seconds": time.perf_counter() - t_start,
    })
    result = EvalResult(
        task=task.name, model=loaded.name, preset=chosen.name, split=split, source=str(dataset.source),
        fingerprint=str(dataset.fingerprint), grader=grader, sampler=gen_stats["sampler"], metrics=metrics,
        records=records, checkpoint=loaded.checkpoint,
    )
    if sink is not None:
        sink("evaluation", result.evaluation_record())
    return result


def merge_shards(shards: Sequence[EvalResult], task) -> EvalResult:
    """One result from the shards of a data-parallel evaluation (`evaluate(..., shard=(k, n))`, in shard order):
    records concatenated, the metrics recomputed over all of them; forwards, errors and seconds summed (the wall
    time is the slowest shard's), tokens per forward re-derived from the totals."""
    task = resolve_task(task)
    records = [r for part in shards for r in part.records]
    metrics = aggregate(records, task)
    total = lambda key: sum(float(part.metrics.get(key, 0.0)) for part in shards)  # noqa: E731
    # tokens per forward = generated tokens / row-forwards; a shard's row-forwards = its tokens / its ratio
    tokens = [float(p.metrics.get("generated_tokens_per_item", 0.0)) * len(p.records) for p in shards]
    row_forwards = sum(t / float(p.metrics["tokens_per_forward"]) for t, p in zip(tokens, shards)
                       if float(p.metrics.get("tokens_per_forward", 0.0)) > 0)
    metrics.update({
        "generation_errors": total("generation_errors"),
        "tokens_per_forward": sum(tokens) / row_forwards if row_forwards else 0.0,
        "forwards": total("forwards"),
        "generated_tokens_per_item": sum(tokens) / len(records),
        "generation_seconds": max(float(p.metrics.get("generation_seconds", 0.0)) for p in shards),
        "grading_seconds": max(float(p.metrics.get("grading_seconds", 0.0)) for p in shards),
        "wall_seconds": max(float(p.metrics.get("wall_seconds", 0.0)) for p in shards),
    })
    first = shards[0]
    return dataclasses.replace(first, metrics=metrics, records=records)


def read_predictions(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Lines of `{"index": int, "completion": str}` (optionally `"task"`: the benchmark they answer, checked by
    `score_predictions`); a bad completion is kept (scored wrong), a bad line is not."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read predictions {p}: {exc}") from exc
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{p}:{n}: not a JSON object: {exc.msg}") from exc
        if not isinstance(row, dict):
            raise DataError(f"{p}:{n}: expected a JSON object with 'index' and 'completion'")
        index = row.get("index")
        if isinstance(index, bool) or not isinstance(index, int):
            raise DataError(f"{p}:{n}: 'index' must be an integer, got {index!r}")
        task_name = row.get("task")
        if task_name is not None and not isinstance(task_name, str):
            raise DataError(f"{p}:{n}: 'task' must be a task name, got {task_name!r}")
        rows.append({"index": index, "completion": row.get("completion"), "line": n, "task": task_name})
    if not rows:
        raise DataError(f"{p}: no predictions")
    return rows


def score_predictions(task, predictions: str | os.PathLike | Sequence[dict[str, Any]], *,
                      data: str | os.PathLike | None = None, grader: str | None = None, split: str = "test",
                      progress: bool = False) -> ScoreResult:
    """Grade existing completions (no model): one result per prediction, in input order."""
    task = resolve_task(task)
    check_grader(task, grader)
    rows = read_predictions(predictions) if isinstance(predictions, (str, os.PathLike)) else list(predictions)
    wrong = next((r for r in rows if r.get("task") not in (None, task.name)), None)
    if wrong is not None:  # e.g. MMLU predictions scored as ARC-C: same indices, meaningless verdicts
        where = f"line {wrong['line']}: " if "line" in wrong else ""
        raise DataError(f"predictions are for task {wrong['task']!r}, not {task.name!r} ({where}wrong predictions "
                        "file?)")
    dataset = task.load(split=split, source=data)
    by_index: dict[int, Any] = {}
    for item in dataset:
        if item.index in by_index:
            raise DataError(f"{dataset.source}: item index {item.index} appears twice; predictions would be ambiguous")
        by_index[item.index] = item
    missing = sorted({r["index"] for r in rows if r["index"] not in by_index})
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        raise DataError(f"predictions refer to {len(missing)} index(es) not in {dataset.source}: {shown}")
    items: list[dict[str, Any]] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(rows), desc="grade", unit="item", leave=False)
    try:
        for r in rows:
            rec = {"index": r["index"], "completion": r.get("completion")}
            rec.update(grade_one(task, by_index[r["index"]], r.get("completion"), grader))
            items.append(rec)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return ScoreResult(task=task.name, items=items, metrics=aggregate(items, task), source=str(dataset.source),
                       fingerprint=str(dataset.fingerprint), grader=grader)


