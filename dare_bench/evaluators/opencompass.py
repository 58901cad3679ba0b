"""OpenCompass plug-in: any dare-bench backbone + sampler preset as an OpenCompass model, our tasks as datasets and
evaluators, and a runner that performs a real OpenCompass evaluation (infer task + eval task) offline on CPU.

Needs the optional extra (it pins numpy<2, so keep it in its own environment):
    pip install 'dare-bench[opencompass]'

    dare-bench eval --model tiny-llada --task sudoku --limit 4 --engine opencompass [--work-dir out/oc]
    # the run's OpenCompass config is written to <work-dir>/dare_eval_config.py; the CLI route works too:
    PYTHONPATH=. HF_HUB_OFFLINE=1 opencompass <work-dir>/dare_eval_config.py [--debug]

    from dare_bench.evaluators.opencompass import run_opencompass_eval
    res = run_opencompass_eval("tiny-llada", "sudoku", preset="micro", limit=4)   # an EvalResult

Pieces (all importable by dotted path, as OpenCompass' subprocess tasks require):
- `DareDiffusionModel` (OpenCompass `BaseModel`, gen mode): loads the backbone and tokenizer exactly as the native
  evaluator does and decodes with the same pinned preset and the same batching / seeding code
  (`dare_bench.evaluators.evaluator.generate_completions`).
- `DareTaskDataset` (`BaseDataset`): the task's items with the prompt text the native evaluator would build; the
  reference column is the item index.
- `DareTaskEvaluator` (`BaseEvaluator`): grades each prediction with the task's grader (code in the sandbox), so a
  verdict is the native verdict; accuracy is reported in percent (OpenCompass convention) with per-item details.

The native evaluator and this route give the same verdicts for the same completions by construction (one grading
function); the completions themselves match when the batches match (one batch of the same items here and there:
`--batch-size` >= the number of items), which `tests/evaluators/test_opencompass_plugin.py` checks on a tiny model.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from dare_bench.errors import ConfigError, DareBenchError, missing_extra

try:  # the extra is optional: importing this module without it only fails when a run is asked for
    import datasets as _hf_datasets
    from opencompass.datasets.base import BaseDataset as _OCBaseDataset
    from opencompass.models.base import BaseModel as _OCBaseModel
    from opencompass.openicl.icl_evaluator import BaseEvaluator as _OCBaseEvaluator

    HAVE_OPENCOMPASS = True
except ImportError:  # pragma: no cover - depends on the environment
    HAVE_OPENCOMPASS = False
    _OCBaseModel = _OCBaseDataset = _OCBaseEvaluator = object  # type: ignore[misc,assignment]

MODEL_ABBR = "dare-dllm"


def require_opencompass() -> None:
    if not HAVE_OPENCOMPASS:
        raise missing_extra("opencompass", "opencompass")


class DareDiffusionModel(_OCBaseModel):  # type: ignore[misc,valid-type]
    """A dare-bench backbone decoded with a pinned sampler preset (generation only)."""

    is_api = False

    def __init__(self, path: str, task: str, preset: str | None = None, seed: int = 0, device: str = "cpu",
                 dtype: str = "float32", dare_batch_size: int | None = None, stats_path: str | None = None,
                 max_seq_len: int = 4096, generate_fn=None, settings: dict | None = None,
                 task_options: dict | None = None, **kwargs: Any):
        super().__init__(path=path, max_seq_len=max_seq_len, **kwargs)
        from dare_bench.evaluators.evaluator import load_model, resolve_preset, resolve_task
        from dare_bench.evaluators.presets import sampler_kind

        task_obj = resolve_task(task).with_options(task_options or {})
        self.loaded = load_model(path, task_obj, device=device, dtype=dtype, seed=seed)
        traits = self.loaded.model.traits
        if settings is not None:  # a reproduction's pinned sampler (`eval.sampler`), not a preset's numbers
            from dare_bench.evaluators.presets import SamplerPreset

            self.preset = SamplerPreset(name=preset or "reproduction", settings={sampler_kind(traits): dict(settings)},
                                        source="reproduction config (eval.sampler)",
                                        batch_size=int(dare_batch_size or 1))
        else:
            self.preset = resolve_preset(preset, traits.family, task_obj.name, self.loaded.tiny)
        self.settings = self.preset.settings_for(sampler_kind(traits))
        self.seed = int(seed)
        self.dare_batch_size = int(dare_batch_size or self.preset.batch_size)
        self.stats_path = stats_path
        self.generate_fn = generate_fn  # a stand-in sampler (tests); None: dare_bench.diffusion.sampling.generate
        self._stats = {"forwards": 0.0, "row_forwards": 0.0, "row_tokens": 0.0, "generation_seconds": 0.0,
                       "items": 0, "calls": 0, "sampler": {}}

    def generate(self, inputs: list, max_out_len: int, **kwargs: Any) -> list[str]:
        from dare_bench.evaluators.evaluator import generate_completions

        prompts = [p if isinstance(p, str) else str(p) for p in inputs]
        # The preset fixes the generation length (a diffusion canvas), so OpenCompass' max_out_len is not used.
        completions, st = generate_completions(self.loaded.model, self.loaded.tokenizer, prompts, self.settings,
                                               batch_size=self.dare_batch_size, seed=self.seed, progress=False,
                                               generate_fn=self.generate_fn)
        s = self._stats
        s["calls"] += 1
        s["items"] += len(prompts)
        s["forwards"] += st["forwards"]
        # generate_completions reports per-row means; weight them back into sums
        s["row_tokens"] += st["generated_tokens_per_item"] * len(prompts)
        s["row_forwards"] += (st["generated_tokens_per_item"] / st["tokens_per_forward"] * len(prompts)
                              if st["tokens_per_forward"] else 0.0)
        s["generation_seconds"] += st["generation_seconds"]
        s["sampler"] = st["sampler"]
        if self.stats_path:
            from dare_bench.fileio import atomic_write_json

            atomic_write_json(self.stats_path, {**s, "preset": self.preset.name})
        return completions

    def get_token_len(self, prompt: str) -> int:
        from dare_bench.evaluators.evaluator import _encode

        return len(_encode(self.loaded.tokenizer, prompt if isinstance(prompt, str) else str(prompt)))

    def get_ppl(self, inputs, mask_length=None):  # pragma: no cover - gen mode only
        raise NotImplementedError("DareDiffusionModel supports generation (gen) evaluations only")

    def encode(self, prompt: str):  # pragma: no cover
        return self.loaded.tokenizer(prompt, add_special_tokens=False)["input_ids"]

    def decode(self, tokens):  # pragma: no cover
        return self.loaded.tokenizer.decode(tokens, skip_special_tokens=True)


def _prompt_template(template: str):
    """'plain' or a tokenizer directory whose chat template formats the task's messages."""
    if template == "plain":
        return "plain"
    from dare_bench.models import load_tokenizer

    return load_tokenizer(template)


class DareTaskDataset(_OCBaseDataset):  # type: ignore[misc,valid-type]
    """A dare-bench task's items: columns `prompt` (as the native evaluator builds it) and `index` (reference)."""

    @staticmethod
    def load(path: str, split: str = "test", source: str | None = None, limit: int | None = None,
             template: str = "plain", task_options: dict | None = None, repeats: int = 1, **kwargs: Any):
        from dare_bench.evaluators.evaluator import resolve_task

        task = resolve_task(path).with_options(task_options or {})
        tpl = _prompt_template(template)
        items = list(task.load(split=split, source=source, limit=limit))
        # repeats: every item k times, as the native evaluator does (the metric is the mean over all samples)
        rows = [{"prompt": task.format_prompt(item, tpl), "index": int(item.index)}
                for _ in range(int(repeats)) for item in items]
        return _hf_datasets.Dataset.from_list(rows)


class DareTaskEvaluator(_OCBaseEvaluator):  # type: ignore[misc,valid-type]
    """Grades predictions with the task's own grader; references are item indices."""

    def __init__(self, task: str, split: str = "test", source: str | None = None, limit: int | None = None,
                 grader: str | None = None, task_options: dict | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.task_name, self.split, self.source, self.limit, self.grader = task, split, source, limit, grader
        self.task_options = dict(task_options or {})

    def score(self, predictions: list, references: list) -> dict:
        from dare_bench.evaluators.evaluator import grade_one, resolve_task

        if len(predictions) != len(references):
            return {"error": f"{len(predictions)} predictions for {len(references)} references"}
        task = resolve_task(self.task_name).with_options(self.task_options)
        by_index = {int(it.index): it for it in task.load(split=self.split, source=self.source, limit=self.limit)}
        details = []
        for pred, ref in zip(predictions, references):
            rec = grade_one(task, by_index[int(ref)], pred, self.grader)
            details.append({"index": int(ref), "pred": pred, "answer": str(ref), "correct": rec["correct"],
                            "reward": rec["reward"], "score": rec["score"], "extracted": rec["extracted"]})
        n = max(1, len(details))
        return {
            "accuracy": 100.0 * sum(d["correct"] for d in details) / n,
            "score": 100.0 * sum(d["score"] for d in details) / n,
            "mean_reward": sum(d["reward"] for d in details) / n,
            "details": details,
        }


def build_configs(model: str, task: str, *, preset: str | None, limit: int | None, grader: str | None,
                  source: str | None, split: str, seed: int, batch_size: int | None, device: str, dtype: str,
                  template: str, stats_path: str | None, settings: dict | None = None,
                  task_options: dict | None = None, repeats: int = 1) -> tuple[dict, dict]:
    """OpenCompass model and dataset configs (plain dicts with class objects as `type`)."""
    from opencompass.openicl.icl_inferencer import GenInferencer
    from opencompass.openicl.icl_prompt_template import PromptTemplate
    from opencompass.openicl.icl_retriever import ZeroRetriever

    n_batch = int(batch_size or 1_000_000)  # default: one OpenCompass batch, re-batched by the preset inside
    model_cfg = dict(
        type=DareDiffusionModel, abbr=MODEL_ABBR, path=str(model), task=task, preset=preset, seed=seed,
        device=device, dtype=dtype, dare_batch_size=batch_size, stats_path=stats_path, max_seq_len=4096,
        max_out_len=4096, batch_size=n_batch, run_cfg=dict(num_gpus=0, num_procs=1), settings=settings,
        task_options=task_options,
    )
    dataset_cfg = dict(
        abbr=f"dare_{task}", type=DareTaskDataset, path=task, split=split, source=source, limit=limit,
        template=template, task_options=task_options, repeats=repeats,
        reader_cfg=dict(input_columns=["prompt"], output_column="index"),
        infer_cfg=dict(prompt_template=dict(type=PromptTemplate, template="{prompt}"),
                       retriever=dict(type=ZeroRetriever), inferencer=dict(type=GenInferencer)),
        eval_cfg=dict(evaluator=dict(type=DareTaskEvaluator, task=task, split=split, source=source, limit=limit,
                                     grader=grader, task_options=task_options)),
    )
    return model_cfg, dataset_cfg


def _config_source(model_cfg: dict, dataset_cfg: dict, work_dir: Path) -> str:
    """The same evaluation as a python config for the `opencompass` CLI."""

    def lit(d: dict) -> str:
        parts = []
        for k, v in d.items():
            if isinstance(v, type):
                parts.append(f"{k}={v.__name__}")
            elif isinstance(v, dict):
                parts.append(f"{k}={lit(v)}")
            else:
                parts.append(f"{k}={v!r}")
        return "dict(" + ", ".join(parts) + ")"

    return (
        "# Written by dare_bench.evaluators.opencompass; run: opencompass <this file> [--debug]\n"
        "from opencompass.openicl.icl_inferencer import GenInferencer\n"
        "from opencompass.openicl.icl_prompt_template import PromptTemplate\n"
        "from opencompass.openicl.icl_retriever import ZeroRetriever\n"
        "from opencompass.partitioners import NaivePartitioner\n"
        "from opencompass.runners import LocalRunner\n"
        "from opencompass.tasks import OpenICLEvalTask, OpenICLInferTask\n"
        "from dare_bench.evaluators.opencompass import DareDiffusionModel, DareTaskDataset, DareTaskEvaluator\n\n"
        f"models = [{lit(model_cfg)}]\n"
        f"datasets = [{lit(dataset_cfg)}]\n"
        "infer = dict(partitioner=dict(type=NaivePartitioner),\n"
        "             runner=dict(type=LocalRunner, max_num_workers=1, task=dict(type=OpenICLInferTask)))\n"
        "eval = dict(partitioner=dict(type=NaivePartitioner),\n"
        "            runner=dict(type=LocalRunner, max_num_workers=1,\n"
        "                        task=dict(type=OpenICLEvalTask, dump_details=True)))\n"
        f"work_dir = {str(work_dir / 'cli')!r}\n"
    )


def run_opencompass_eval(model: str, task: str, *, preset: str | None = None, limit: int | None = None,
                         grader: str | None = None, source: str | None = None, split: str = "test", seed: int = 0,
                         batch_size: int | None = None, device: str = "cpu", dtype: str = "float32",
                         work_dir: str | os.PathLike | None = None, template: str | None = None,
                         generate_fn=None, settings: dict | None = None, task_options: dict | None = None,
                         repeats: int = 1):
    """Run OpenCompass' infer and eval tasks in this process; return an `EvalResult` like the native evaluator.

    `settings` (generate() keyword arguments, e.g. a reproduction's `eval.sampler`) replace the preset's numbers;
    `task_options` (e.g. an OpenCompass `protocol`) and `repeats` (k samples per item) as in the native evaluator."""
    require_opencompass()
    from mmengine.config import ConfigDict
    from opencompass.tasks import OpenICLEvalTask, OpenICLInferTask

    from dare_bench.evaluators.evaluator import EvalResult, aggregate, resolve_task
    from dare_bench.fileio import atomic_write_text, dare_bench_home

    t0 = time.perf_counter()
    task_obj = resolve_task(task).with_options(task_options or {})
    if grader is not None:
        from dare_bench.evaluators.evaluator import check_grader

        check_grader(task_obj, grader)
    if template is None:
        # the preset decides, as in the native evaluator; resolving it needs the model's family and size
        template = _template_for(model, task_obj, preset, seed)
    if source is not None:
        source = str(Path(source).resolve()) if Path(str(source)).exists() else str(source)
    wd = Path(work_dir) if work_dir else dare_bench_home() / "opencompass" / time.strftime("%Y%m%d_%H%M%S")
    wd = wd.resolve()
    wd.mkdir(parents=True, exist_ok=True)
    stats_path = wd / "dare_generation_stats.json"
    # OpenCompass skips inference when a predictions file exists: never let a reused work dir serve stale answers
    for stale in [stats_path, *(wd / "predictions" / MODEL_ABBR).glob(f"*dare_{task_obj.name}*.json"),
                  *(wd / "results" / MODEL_ABBR).glob(f"*dare_{task_obj.name}*.json")]:
        stale.unlink(missing_ok=True)
    model_cfg, dataset_cfg = build_configs(model, task_obj.name, preset=preset, limit=limit, grader=grader,
                                           source=source, split=split, seed=seed, batch_size=batch_size,
                                           device=device, dtype=dtype, template=template,
                                           stats_path=str(stats_path), settings=settings,
                                           task_options=task_options, repeats=repeats)
    atomic_write_text(wd / "dare_eval_config.py", _config_source(model_cfg, dataset_cfg, wd))
    if generate_fn is not None:
        model_cfg["generate_fn"] = generate_fn  # in-process only; not part of the written config
    task_cfg = ConfigDict(models=[model_cfg], datasets=[[dataset_cfg]], work_dir=str(wd),
                          eval=dict(runner=dict(task=dict(dump_details=True))))
    try:
        with _stdout_to_stderr():  # OpenCompass logs to stdout; keep stdout for the result (`--json`)
            OpenICLInferTask(task_cfg).run()
            OpenICLEvalTask(task_cfg).run()
    except DareBenchError:
        raise
    except Exception as exc:
        raise DareBenchError(f"OpenCompass run failed ({type(exc).__name__}: {exc}); logs under {wd}") from exc
    ds_abbr = dataset_cfg["abbr"]
    results_file = wd / "results" / MODEL_ABBR / f"{ds_abbr}.json"
    preds_file = wd / "predictions" / MODEL_ABBR / f"{ds_abbr}.json"
    if not results_file.exists():
        raise DareBenchError(f"OpenCompass wrote no results ({results_file} missing); see logs under {wd}")
    results = json.loads(results_file.read_text())
    if "error" in results:
        raise DareBenchError(f"OpenCompass evaluation error: {results['error']}")
    preds = json.loads(preds_file.read_text()) if preds_file.exists() else {}
    records = []
    for i, d in enumerate(results.get("details", [])):
        d = _unlist(d)
        pred = preds.get(str(i), {})
        records.append({
            "index": int(d["index"]), "prompt": pred.get("origin_prompt"), "completion": d.get("pred"),
            "correct": bool(d["correct"]), "reward": float(d["reward"]), "score": float(d["score"]),
            "extracted": d.get("extracted"), "details": {},
        })
    metrics = aggregate(records, task_obj)
    stats = json.loads(stats_path.read_text()) if stats_path.exists() else {}
    metrics.update({
        "opencompass_accuracy": float(results.get("accuracy", 0.0)),
        "tokens_per_forward": (stats["row_tokens"] / stats["row_forwards"]) if stats.get("row_forwards") else 0.0,
        "forwards": float(stats.get("forwards", 0.0)),
        "generation_seconds": float(stats.get("generation_seconds", 0.0)),
        "wall_seconds": time.perf_counter() - t0,
    })
    dataset = task_obj.load(split=split, source=source, limit=limit)
    return EvalResult(task=task_obj.name, model=str(model), preset=str(stats.get("preset", preset)), split=split,
                      source=str(dataset.source), fingerprint=str(dataset.fingerprint), grader=grader,
                      sampler=stats.get("sampler", {}), metrics=metrics, records=records,
                      checkpoint=str(model) if Path(str(model)).is_dir() else None)


@contextlib.contextmanager
def _stdout_to_stderr():
    """Send both Python-level and fd-level stdout to stderr (loggers may hold the original stdout stream)."""
    sys.stdout.flush()
    saved = None
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no real fd 1 (embedded interpreters): the Python-level redirect still applies
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def _template_for(model: str, task_obj, preset: str | None, seed: int) -> str:
    """The prompt template the native evaluator would use: 'plain' or the checkpoint dir (its chat template)."""
    from dare_bench.evaluators.evaluator import is_task_replica, load_model, resolve_preset

    path = Path(str(model)).expanduser()
    if path.is_dir():
        from dare_bench.models import from_config, load_tokenizer

        meta = from_config(str(path))  # meta device: the family without reading weights
        tiny = is_task_replica(load_tokenizer(str(path)))
        chosen = resolve_preset(preset, meta.traits.family, task_obj.name, tiny)
        return "plain" if chosen.template == "plain" else str(path.resolve())
    probe = load_model(str(model), task_obj, device="cpu", dtype="float32", seed=seed)  # a tiny preset model
    chosen = resolve_preset(preset, probe.model.traits.family, task_obj.name, probe.tiny)
    if chosen.template != "plain":
        raise ConfigError(f"preset {chosen.name!r} formats prompts with a chat template; with --engine opencompass "
                          "that needs a checkpoint directory holding the tokenizer")
    return "plain"


def _unlist(d: dict) -> dict:
    """OpenCompass may wrap each detail value in a one-element list (its n-sample layout)."""
    return {k: (v[0] if isinstance(v, list) and len(v) == 1 else v) for k, v in d.items()}
