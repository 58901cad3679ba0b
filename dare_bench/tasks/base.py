"""Task contract: items, datasets with a data fingerprint, grading results, and the shared data loading.

A task (one file per task in this package) subclasses :class:`Task` and says

- where its standard data lives (DARE's verl parquet file names per split),
- how a row of any supported source becomes an :class:`Item` (verl parquet rows are read the same way for every task;
  other layouts — d1's CSV / JSONL, Hugging Face rows — through ``Task.row_to_item``),
- its plain prompt for tiny runs and its gold completion (``format_answer``),
- its graders: named functions ``(completion, item) -> GradeResult`` (see ``dare_bench.tasks.graders``).

Usage::

    from dare_bench.tasks import get_task
    task = get_task("sudoku")
    ds = task.load(split="test", limit=8)            # DARE parquet via $DARE_BENCH_DATA, else the seeded generator
    print(ds.source, ds.fingerprint)
    res = task.grade("<answer>3142243142131324</answer>", ds[0], grader="d1")
    results = task.grade_many(completions, ds.items, grader="dare")   # code tasks grade concurrently

Sources accepted by ``Task.load(source=...)``: a path to ``.parquet`` / ``.jsonl`` / ``.json`` / ``.csv``;
``"hf:<id>[:<config>]@<revision>"`` (online only; the revision is required so the fingerprint means something);
``"generator[:<seed>]"`` for the tasks that have a procedural generator; or None for the task's standard source.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from dare_bench.errors import ConfigError, DataError

SPLITS = ("train", "test")
DATA_ENV = "DARE_BENCH_DATA"


@dataclass(frozen=True)
class Item:
    """One problem. ``prompt_messages`` is the chat the official recipe feeds the model (DARE's text)."""

    index: int
    prompt_messages: list[dict[str, str]]
    ground_truth: str
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class GradeResult:
    """What one grader says about one completion.

    ``reward`` is the grader's training reward (official scale: e.g. d1's GSM8K reward sums to at most 3.5+),
    ``correct`` its evaluation verdict, ``score`` the per-item evaluation metric the official evaluator averages
    (``float(correct)`` except where the official metric is finer, e.g. d1's Sudoku cell accuracy).
    """

    correct: bool
    reward: float
    extracted: str | None
    details: dict[str, Any] = field(default_factory=dict)
    score: float | None = None

    def __post_init__(self) -> None:
        if self.score is None:
            object.__setattr__(self, "score", float(bool(self.correct)))


GraderFn = Callable[[str, Item], GradeResult]


@dataclass
class TaskDataset:
    """Items plus where they came from: ``source`` (what was resolved) and ``fingerprint`` (sha256)."""

    task: str
    split: str
    items: list[Item]
    source: str
    fingerprint: str
    limit: int | None = None

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Item]:
        return iter(self.items)

    def __getitem__(self, i: int) -> Item:
        return self.items[i]


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_json_default).encode()


def _json_default(o: Any) -> Any:
    # numpy scalars / arrays arrive from parquet and datasets rows
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def sha256_items(items: Sequence[Item]) -> str:
    return hashlib.sha256(canonical_json([it.to_json() for it in items])).hexdigest()


_PLAIN_TYPES = frozenset({str, int, float, bool, bytes, type(None)})


def plain(obj: Any) -> Any:
    """numpy / pyarrow containers from parquet rows -> plain Python (lists, dicts, str, int, float)."""
    kind = type(obj)
    if kind in _PLAIN_TYPES:  # most leaves: skips the ABC checks below, the cost of reading a large parquet
        return obj
    if kind is dict or isinstance(obj, Mapping):
        return {str(k): plain(v) for k, v in obj.items()}
    if kind is list or kind is tuple or isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return plain(obj.tolist())
    return obj


@functools.lru_cache(maxsize=8)
def _file_rows(path: str, mtime_ns: int, size: int) -> tuple[list[dict[str, Any]], str]:
    """A data file's rows and sha256, read once per process and file version: planning every registry entry
    (`list --runnable`, a sweep's dry run) loads the same few files hundreds of times. The rows are shared: the
    converters copy what they keep (`plain(dict(r))`, `dict(extra_info)`), none writes to them."""
    return read_rows(Path(path)), sha256_file(Path(path))


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a parquet / jsonl / json / csv file as plain dicts; any failure is one DataError."""
    if not path.exists():
        raise DataError(f"data file not found: {path}")
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            import pandas as pd

            return [plain(r) for r in pd.read_parquet(path).to_dict(orient="records")]
        if suffix == ".csv":
            import pandas as pd

            # keep puzzle strings like "0321..." as text: leading zeros matter
            return [plain(r) for r in pd.read_csv(path, dtype=str, keep_default_na=False).to_dict(orient="records")]
        if suffix in (".jsonl", ".json"):
            text = path.read_text(encoding="utf-8")
            if suffix == ".json" and text.lstrip().startswith("["):
                rows = json.loads(text)
            else:
                rows = [json.loads(line) for line in text.splitlines() if line.strip()]
            if not all(isinstance(r, dict) for r in rows):
                raise DataError(f"{path}: every record must be a JSON object")
            return rows
    except DataError:
        raise
    except Exception as e:  # pyarrow / pandas / json raise many types for a corrupt file
        raise DataError(f"cannot read {path}: {type(e).__name__}: {e}") from e
    raise DataError(f"unsupported data file type {suffix!r} ({path}); use .parquet, .jsonl, .json or .csv")


def parse_hf_source(source: str) -> tuple[str, str | None, str]:
    """``hf:<id>[:<config>]@<revision>`` -> (id, config, revision)."""
    body = source[3:]
    if "@" not in body:
        raise ConfigError(f"{source!r}: a Hugging Face source needs a pinned revision: hf:<id>[:<config>]@<revision>")
    ref, revision = body.rsplit("@", 1)
    if not ref or not revision:
        raise ConfigError(f"{source!r}: expected hf:<id>[:<config>]@<revision>")
    dataset_id, _, config = ref.partition(":")
    return dataset_id, (config or None), revision


class Task:
    """Base class; subclasses set the class attributes and implement the hooks."""

    name: str = ""
    #: DARE file names per split under ``$DARE_BENCH_DATA/rl/<split>/``
    dare_files: dict[str, str] = {}
    #: ``datasets`` id for the task's original data (documentation + error messages; loading needs a revision)
    hf_hint: str = ""
    has_generator: bool = False
    #: The scales a reproduction on this task can have. A real benchmark a tiny replica cannot learn (GSM8K,
    #: HumanEval, ...) offers `paper` only and names its CPU-scale stand-in; dare-bench's procedural CPU tasks offer
    #: `tiny` / `micro` only (no published recipe or real checkpoint trains on them). The registry drops the other
    #: scales its defaults layers would give, and asking for one raises `scale_refusal`'s message.
    scales: tuple[str, ...] = ("paper", "tiny", "micro")
    #: The generator's difficulty knobs a reproduction may set (`task_options` of a scale; name -> default). A task
    #: without a generator takes none. `with_options` returns the configured copy the run uses.
    option_defaults: dict[str, Any] = {}
    #: DARE's task kind (`extra_info.task` of its verl rows): "math" (answer extraction) or "code" (sandbox tests)
    kind: str = "math"
    #: (stand-in task, what kind of RL it stands in for, why this task has no tiny scale); None: no stand-in
    cpu_stand_in: tuple[str, str, str] | None = None

    def __init__(self) -> None:
        self._graders: dict[str, GraderFn] = self.build_graders()

    # ------------------------------------------------------------------ hooks for subclasses
    def build_graders(self) -> dict[str, GraderFn]:
        raise NotImplementedError

    def row_to_item(self, row: dict[str, Any], index: int, split: str) -> Item:
        """A non-verl row (d1 CSV/JSONL, Hugging Face) -> Item. Tasks override for their raw layouts."""
        raise DataError(f"{self.name}: unrecognised row layout with columns {sorted(row)}")

    def plain_prompt(self, item: Item) -> str:
        raise NotImplementedError

    def format_answer(self, item: Item, grader: str | None = None) -> str:
        """A gold completion every grader accepts (SFT target for tiny runs); ``grader`` may select a shorter form
        that only that grader needs."""
        raise NotImplementedError

    def generate(self, n: int, seed: int = 0, split: str = "test") -> TaskDataset:
        raise DataError(f"task {self.name!r} has no procedural generator; give a data source")

    def check_options(self, options: dict[str, Any]) -> None:
        """Refuse out-of-range values (ConfigError); `options` has every knob (defaults filled in)."""

    # ------------------------------------------------------------------ public API
    def with_options(self, options: dict[str, Any] | None) -> "Task":
        """This task with the generator knobs `options` set (a copy; the registered instance is not changed).
        An unknown knob, or a value out of range, is one ConfigError."""
        if not options:
            return self
        unknown = sorted(set(options) - set(self.option_defaults))
        if unknown:
            takes = ", ".join(sorted(self.option_defaults)) or "none"
            raise ConfigError(f"task {self.name!r} has no option {unknown[0]!r} (its task_options: {takes})")
        merged = {**self.option_defaults, **options}
        self.check_options(merged)
        import copy

        configured = copy.copy(self)
        for key, value in merged.items():
            setattr(configured, key, value)
        return configured

    def offers_scale(self, scale: str) -> bool:
        """Whether a reproduction on this task can have `scale` (`official` goes with `paper`)."""
        return (scale if scale != "official" else "paper") in self.scales

    def scale_refusal(self, scale: str, algorithm: str, backbone: str) -> str:
        """The one-line reason there is no `scale` for this task, naming what to run instead."""
        if self.cpu_stand_in is not None:
            stand_in, kind, why = self.cpu_stand_in
            return (f"{self.name} has no {scale} scale ({why}); for CPU-scale {kind} RL use `{stand_in}`: "
                    f"dare-bench reproduce {algorithm}-{backbone}-{stand_in}")
        offered = ", ".join(self.scales)
        return (f"{self.name} has no {scale} scale ({self.name} is dare-bench's procedural CPU-scale task: no "
                f"published recipe or real checkpoint trains on it); its scales: {offered}")

    @property
    def graders(self) -> list[str]:
        return sorted(self._graders)

    def grade(self, completion: str, item: Item, grader: str = "dare") -> GradeResult:
        """Grade one completion. Never raises for a bad completion: anything unparseable is scored wrong."""
        fn = self._graders.get(grader)
        if fn is None:
            raise ConfigError(
                f"grader {grader!r} does not exist for task {self.name!r}; available: {', '.join(self.graders)}"
            )
        if not isinstance(completion, str):
            return GradeResult(False, 0.0, None, {"error": f"completion is {type(completion).__name__}, not str"})
        try:
            return fn(completion, item)
        except Exception as e:  # a single malformed completion must never abort a whole evaluation
            return GradeResult(False, 0.0, None, {"error": f"{type(e).__name__}: {e}"})

    #: graders that wait on a subprocess (code execution) are run from a thread pool by ``grade_many``
    parallel_grading: bool = False

    def grade_many(self, completions: Sequence[str], items: Sequence[Item], grader: str = "dare",
                   workers: int | None = None) -> list[GradeResult]:
        """Grade ``completions[i]`` against ``items[i]``; results in input order.

        Code tasks run concurrently (each grade waits on a sandboxed child); the others run in the calling thread,
        where the sympy time limit (a SIGALRM on the main thread) stays effective.
        """
        if len(completions) != len(items):
            raise ConfigError(f"{len(completions)} completions for {len(items)} items")
        if grader not in self._graders:
            self.grade("", items[0] if items else Item(0, [], ""), grader)  # raises the ConfigError
        if not self.parallel_grading or len(items) < 2:
            return [self.grade(c, it, grader) for c, it in zip(completions, items)]
        from concurrent.futures import ThreadPoolExecutor

        # A program is graded once per item however often it was sampled: an RL group often repeats a completion,
        # and each sandbox run costs a fresh interpreter (the verdict of the same program on the same tests).
        keys = [(c, it.index, it.ground_truth) for c, it in zip(completions, items)]
        unique = list(dict.fromkeys(keys))
        first = {key: (completions[i], items[i]) for i, key in reversed(list(enumerate(keys)))}
        workers = max(1, workers or min(len(unique), os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            graded = dict(zip(unique, pool.map(lambda key: self.grade(first[key][0], first[key][1], grader),
                                               unique)))
        return [graded[key] for key in keys]

    #: d1's evaluation instruction (``eval/<task>.py`` system prompt), for tasks d1 evaluates
    d1_eval_prompt: str | None = None

    def d1_eval_question(self, item: Item) -> str:
        """The question text d1's evaluation puts after its instruction."""
        return item.prompt_messages[-1]["content"]

    def messages(self, item: Item, style: str = "dare") -> list[dict[str, str]]:
        """The chat to send: ``"dare"`` = DARE's messages (training and DARE's evaluation); ``"d1"`` = d1's
        evaluation prompt (instruction + "\\n\\n" + question as one user turn; it asks for ``\\boxed{}`` inside
        ``<answer>``, which d1's evaluation parser expects)."""
        if style == "dare":
            return item.prompt_messages
        if style == "d1":
            if self.d1_eval_prompt is None:
                raise ConfigError(f"d1 has no evaluation prompt for task {self.name!r}")
            return [{"role": "user", "content": self.d1_eval_prompt + "\n\n" + self.d1_eval_question(item)}]
        raise ConfigError(f"unknown prompt style {style!r}; use 'dare' or 'd1'")

    def format_prompt(self, item: Item, template: Any = "plain", style: str = "dare") -> str:
        """``"plain"``: the short tiny-run prompt; a tokenizer with a chat template: the real checkpoint's prompt.

        ``style="d1"`` renders d1's evaluation prompt and appends ``<reasoning>`` after the generation prompt, as
        d1's ``eval/gsm8k.py`` does (``add_reasoning=True``)."""
        if isinstance(template, str):
            if template == "plain" and style == "dare":
                return self.plain_prompt(item)
            if template == "plain":
                raise ConfigError("the plain tiny-run template has no d1 style; pass a tokenizer")
            raise ConfigError(f"unknown prompt template {template!r}; use 'plain' or pass a tokenizer")
        apply = getattr(template, "apply_chat_template", None)
        if apply is None or not getattr(template, "chat_template", None):
            raise ConfigError("prompt template must be 'plain' or a tokenizer that has a chat template")
        messages = self.messages(item, style)
        if messages and messages[-1].get("role") == "assistant":
            # DARE's MBPP prompts end with a pre-filled assistant turn ("[BEGIN]\n"): continue it, do not close it
            return apply(messages, tokenize=False, continue_final_message=True)
        text = apply(messages, tokenize=False, add_generation_prompt=True)
        return text + "<reasoning>" if style == "d1" else text

    def load(self, split: str = "test", source: str | os.PathLike | None = None,
             limit: int | None = None) -> TaskDataset:
        if split not in SPLITS:
            raise ConfigError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise ConfigError(f"limit must be a non-negative integer, got {limit!r}")
        if source is None:
            ds = self._load_default(split, limit)
        else:
            src = os.fspath(source)
            if src.startswith("hf:"):
                ds = self._load_hf(src, split)
            elif src == "generator" or src.startswith("generator:"):
                try:
                    seed = int(src.partition(":")[2] or 0)
                except ValueError as e:
                    raise ConfigError(f"{src!r}: expected generator or generator:<integer seed>") from e
                ds = self.generate(self.default_generated_size(split) if limit is None else limit, seed, split)
            else:
                ds = self._load_file(Path(src), split)
        if limit is not None:
            ds.items = ds.items[:limit]
            ds.limit = limit
        return ds

    # ------------------------------------------------------------------ loading internals
    def default_generated_size(self, split: str) -> int:
        return 500

    def dare_path(self, split: str) -> Path | None:
        root = os.environ.get(DATA_ENV)
        fname = self.dare_files.get(split)
        if not root or not fname:
            return None
        path = Path(root).expanduser() / "rl" / split / fname
        return path if path.exists() else None

    def _load_default(self, split: str, limit: int | None) -> TaskDataset:
        path = self.dare_path(split)
        if path is not None:
            return self._load_file(path, split)
        if self.has_generator:
            n = self.default_generated_size(split) if limit is None else limit
            return self.generate(n, seed=0, split=split)
        if split not in self.dare_files:
            raise DataError(f"task {self.name!r} has no standard {split!r} split; give a data source")
        raise DataError(
            f"no data for {self.name!r} ({split}): get it with `{self.data_get_command()}` (it writes "
            f"${DATA_ENV}/rl/{split}/{self.dare_files[split]}), or pass source=<file>"
            + (f" / 'hf:{self.hf_hint}@<revision>'" if self.hf_hint else "")
        )

    def data_get_command(self) -> str:
        """The `dare-bench data get` that writes this task's standard files (`--hf` when DARE has no file)."""
        from dare_bench.tasks import data

        files = [f for f in data.load_manifest().files if self.name in f.tasks and not f.name.endswith("-K8")]
        hf = bool(files) and all(not f.from_dare for f in files)
        return f"dare-bench data get {self.name}" + (" --hf" if hf else "")

    def _load_file(self, path: Path, split: str) -> TaskDataset:
        if not path.is_file():
            read_rows(path)  # its one error for a missing file
        stat = path.stat()
        rows, fingerprint = _file_rows(str(path.resolve()), stat.st_mtime_ns, stat.st_size)
        items = self.rows_to_items(rows, split, where=str(path))
        return TaskDataset(self.name, split, items, source=str(path.resolve()), fingerprint=fingerprint)

    def _load_hf(self, source: str, split: str) -> TaskDataset:
        dataset_id, config, revision = parse_hf_source(source)
        try:
            import datasets
        except ImportError as e:  # pragma: no cover - datasets is a core dependency
            raise DataError("the 'datasets' package is needed for hf: sources") from e
        try:
            hf = datasets.load_dataset(dataset_id, config, split=split, revision=revision)
        except Exception as e:
            raise DataError(f"cannot load {source}: {type(e).__name__}: {e}") from e
        rows = [plain(dict(r)) for r in hf]
        items = self.rows_to_items(rows, split, where=source)
        # no single file to hash: hash the rows themselves, which pins content whatever the cache layout
        fp = hashlib.sha256(canonical_json(rows)).hexdigest()
        return TaskDataset(self.name, split, items, source=source, fingerprint=fp)

    #: a converter of `tasks.data.TABLE_CONVERTERS` that turns a whole table of the task's raw public rows into verl
    #: rows (the benchmarks DARE evaluates through OpenCompass): a raw file then loads as `data get --hf` writes it
    raw_converter: str = ""

    def rows_to_items(self, rows: list[dict[str, Any]], split: str, where: str) -> list[Item]:
        if not rows:
            raise DataError(f"{where}: no rows")
        if self.raw_converter and not ("prompt" in rows[0] and "reward_model" in rows[0]):
            from dare_bench.tasks import data

            rows = data.convert_table(self.raw_converter, rows, split, self.name, where)
        items = []
        for i, row in enumerate(rows):
            try:
                if "prompt" in row and "reward_model" in row:
                    items.append(self.verl_row_to_item(row, i))
                else:
                    items.append(self.row_to_item(row, i, split))
            except DataError as e:
                raise DataError(f"{where}: row {i}: {e}") from e
            except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
                raise DataError(
                    f"{where}: row {i} has the wrong shape for task {self.name!r}: {type(e).__name__}: {e}"
                ) from e
        return items

    def verl_row_to_item(self, row: dict[str, Any], i: int) -> Item:
        messages = row["prompt"]
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and "role" in m and "content" in m for m in messages
        ):
            raise DataError("'prompt' must be a list of {role, content} messages")
        rm = row["reward_model"]
        if not isinstance(rm, dict) or "ground_truth" not in rm:
            raise DataError("'reward_model' must be a mapping with 'ground_truth'")
        extra = dict(row.get("extra_info") or {})
        extra.setdefault("data_source", row.get("data_source"))
        index = extra.get("index", i)
        item = Item(
            index=int(index) if index is not None else i,
            prompt_messages=[{"role": str(m["role"]), "content": str(m["content"])} for m in messages],
            ground_truth=str(rm["ground_truth"]),
            extra=extra,
        )
        self.check_item(item)
        return item

    def check_item(self, item: Item) -> None:
        """Raise DataError when an item lacks what the task's graders need."""
