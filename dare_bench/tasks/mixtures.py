"""Training-data mixtures: what `train.data` names, resolved to sources with fingerprints, loaded in order, and
verl's over-long prompt filter.

An entry of `train.data` is one of

- the task's own name (the registry's `"{task}"`): its standard train split (`Task.load("train")`: DARE's file under
  `$DARE_BENCH_DATA`, else the task's seeded generator where it has one);
- a DARE data name (`gsm8k`, `math`, `countdown-n20000`, `sudoku-n20000`, ...): DARE's file
  `$DARE_BENCH_DATA/rl/train/<name>_1.parquet` (DARE's layout; a file without the `_1` suffix is accepted too);
- a file path (`.parquet`, `.jsonl`, `.json`, `.csv`, or anything with a `/`);
- `hf:<id>[:<config>]@<revision>` (a `datasets` id, revision required) or `generator[:<seed>]`.

Entries concatenate in the listed order (DARE trains one model on GSM8K + MATH: `data: [gsm8k, math]`). Resolving
touches no row: a missing file is one DataError naming the entry, the path tried, `$DARE_BENCH_DATA` and the
`dare-bench data get ...` that fetches it (for DARE's code RL sets lcbv5-K8 / primeintellect-K8 / taco-K8: all three
files and where DARE gets them; `tasks/data_manifest.yaml` pins them), raised when the pipeline plans the run
(`pipeline.plan.resolve`), before anything is written. Each resolved source carries the fingerprint that goes into
the run's config hash: the sha256 of the file; for `hf:` sources the pinned id and revision (a Hub commit pins the
content); for generators the generator call (task, seed, size, split; deterministic code) — the content
fingerprint of the loaded items is recorded with the run's evaluations as before.

    from dare_bench.tasks import get_task
    from dare_bench.tasks.mixtures import resolve_sources, load_mixture, filter_overlong, check_rows
    task = get_task("gsm8k")
    [s.record() for s in resolve_sources(task, ["gsm8k", "math"])]   # [{entry, source, fingerprint}, ...]
    ds = load_mixture(task, ["gsm8k", "math"])                       # 7473 + 7474 items, in that order
    kept, dropped = filter_overlong(task, ds.items, tokenizer, tokenizer, max_len=512)
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from dare_bench.errors import ConfigError, DataError
from dare_bench.tasks.base import DATA_ENV, Item, Task, TaskDataset, parse_hf_source, sha256_file

FILE_SUFFIXES = (".parquet", ".jsonl", ".json", ".csv")
# DARE's preprocessed train files are `<name>_1.parquet` (gsm8k_1, math_1, countdown-n20000_1, sudoku-n20000_1);
# the plain `<name>.parquet` form is what its other sets (aime2024.parquet) use.
DARE_NAME_FORMS = ("{name}_1.parquet", "{name}.parquet")


@dataclass(frozen=True)
class DataSource:
    """One resolved `train.data` entry. `task` parses its rows (for a DARE name, the task whose standard split the
    file is, so MATH rows are read by the MATH task in a GSM8K run); `limit` is the generator size, if any."""

    entry: str
    kind: str  # task | dare | file | hf | generator
    source: str
    fingerprint: str
    task: Task
    seed: int | None = None
    rows: int | None = None  # a generator's size (known without generating); files: counted when read

    def record(self) -> dict[str, str]:
        """What the run config (and its hash) keeps of this source."""
        return {"entry": self.entry, "source": self.source, "fingerprint": self.fingerprint}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _dare_owner(filename: str, default: Task) -> Task:
    """The registered task whose standard train split is `filename` (MATH's math_1.parquet -> math500), else
    `default`: its check of a row (a GSM8K gold must be a number) then fits the rows."""
    from dare_bench.tasks import get_task, list_tasks

    for name in list_tasks():
        if get_task(name).dare_files.get("train") == filename:
            return get_task(name)
    return default


def _get_hint(name: str) -> str:
    """The `dare-bench data get ...` that fetches a missing DARE file (for the code RL sets: all three files, and
    where DARE gets them), from the pinned data manifest; "" for a name it does not pin."""
    from dare_bench.tasks.data import missing_hint

    return missing_hint(name)


def _file_source(entry: str, path: Path, task: Task, kind: str) -> DataSource:
    if not path.is_file():
        raise DataError(f"train.data entry {entry!r}: no file at {path} (${DATA_ENV}="
                        f"{os.environ.get(DATA_ENV) or '<unset>'})")
    return DataSource(entry, kind, str(path.resolve()), sha256_file(path), task)


def _generated(entry: str, task: Task, seed: int, n: int) -> DataSource:
    # Generators are deterministic code: the call pins the content without generating 20k puzzles at plan time.
    knobs = "".join(f",{k}={getattr(task, k)}" for k in sorted(getattr(task, "option_defaults", {})))  # task_options
    call = f"generator:{task.name}(seed={seed},n={n},split=train{knobs})"
    return DataSource(entry, "generator", call, _sha(call), task, seed=seed, rows=n)


def _refuse_unknown_name(entry: str, task: Task) -> None:
    """A bare name that is neither the task's own, nor one DARE ships (the data manifest), nor present under
    `$DARE_BENCH_DATA`: a typo or a task name in the wrong run. One error with the closest known name."""
    import difflib

    from dare_bench.tasks import list_tasks
    from dare_bench.tasks.data import find_file, load_manifest

    known = find_file(entry, "train")
    if known is not None and known.split == "train":
        return  # a DARE name: the caller says where the file should be and how to get it
    dare_names = sorted({f.name for f in load_manifest().files if f.split == "train"})
    if entry in list_tasks():
        raise DataError(f"train.data entry {entry!r}: a task's own split can only train that task (this run trains "
                        f"{task.name!r}); name a DARE data name ({', '.join(dare_names)}), a file or hf:<id>@<rev>")
    close = difflib.get_close_matches(entry, [task.name, *dare_names], n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise DataError(f"train.data entry {entry!r}: unknown: not this task's name ({task.name!r}), a DARE data name "
                    f"({', '.join(dare_names)}), a file, hf:<id>@<revision> or generator[:seed]{hint}")


def resolve_entry(task: Task, entry: str, limit: int | None = None) -> DataSource:
    """Where one `train.data` entry's rows come from (see the module docstring); reads no rows."""
    entry = str(entry).strip()
    if not entry:
        raise ConfigError("train.data: an empty entry")
    def n() -> int:
        return task.default_generated_size("train") if limit is None else limit

    if entry == task.name:
        path = task.dare_path("train")
        if path is not None:
            return _file_source(entry, path, task, "task")
        if task.has_generator:
            return _generated(entry, task, 0, n())
        fname = task.dare_files.get("train")
        if fname is None:
            raise DataError(f"train.data entry {entry!r}: task {task.name!r} has no standard train split; "
                            "name a file, a DARE data name or hf:<id>@<revision>")
        root = os.environ.get(DATA_ENV)
        tried = Path(root).expanduser() / "rl" / "train" / fname if root else f"${DATA_ENV}/rl/train/{fname}"
        raise DataError(f"train.data entry {entry!r}: no file at {tried} (${DATA_ENV}={root or '<unset>'})"
                        f"{_get_hint(fname)}")
    if entry.startswith("hf:"):
        dataset_id, config, revision = parse_hf_source(entry)
        return DataSource(entry, "hf", entry, _sha(f"hf:{dataset_id}:{config or ''}@{revision}"), task)
    if entry == "generator" or entry.startswith("generator:"):
        try:
            seed = int(entry.partition(":")[2] or 0)
        except ValueError as e:
            raise ConfigError(f"train.data entry {entry!r}: expected generator or generator:<integer seed>") from e
        if not task.has_generator:
            raise DataError(f"train.data entry {entry!r}: task {task.name!r} has no procedural generator")
        return _generated(entry, task, seed, n())
    if entry.lower().endswith(FILE_SUFFIXES) or "/" in entry or entry.startswith("~"):
        return _file_source(entry, Path(entry).expanduser(), task, "file")
    root = os.environ.get(DATA_ENV)
    forms = [f.format(name=entry) for f in DARE_NAME_FORMS]
    present = root and any((Path(root).expanduser() / "rl" / "train" / f).is_file() for f in forms)
    if not present:
        _refuse_unknown_name(entry, task)
    if not root:
        raise DataError(f"train.data entry {entry!r}: a DARE data name, but ${DATA_ENV} is unset (it would be "
                        f"${DATA_ENV}/rl/train/{forms[0]}); set it to a directory laid out like DARE's data"
                        f"{_get_hint(entry)}")
    base = Path(root).expanduser() / "rl" / "train"
    for form in forms:
        if (base / form).is_file():
            return _file_source(entry, base / form, _dare_owner(form, task), "dare")
    raise DataError(f"train.data entry {entry!r}: no file at {base / forms[0]} (nor {forms[1]}; "
                    f"${DATA_ENV}={root}){_get_hint(entry)}")


def resolve_sources(task: Task, entries: Sequence[str], limit: int | None = None) -> list[DataSource]:
    """Every entry of `train.data`, in order; none means the task's standard train split."""
    return [resolve_entry(task, e, limit) for e in (list(entries) or [task.name])]


def load_sources(task: Task, sources: Sequence[DataSource], limit: int | None = None) -> TaskDataset:
    """The items of `sources`, concatenated in order (the first `limit` of them). The dataset's `source` lists the
    sources; its fingerprint is the sha256 of their content fingerprints in order."""
    items: list[Item] = []
    parts: list[str] = []
    for src in sources:
        if limit is not None and len(items) >= limit:
            break
        reader = src.task
        if src.kind == "generator":
            n = reader.default_generated_size("train") if limit is None else limit - len(items)
            ds = reader.generate(n, seed=int(src.seed or 0), split="train")
        else:
            ds = reader.load("train", source=src.source)
        items.extend(ds.items)
        parts.append(ds.fingerprint)
    if limit is not None:
        items = items[:limit]
    fingerprint = parts[0] if len(parts) == 1 else hashlib.sha256("\n".join(parts).encode()).hexdigest()
    return TaskDataset(task.name, "train", items, source=" + ".join(s.source for s in sources),
                       fingerprint=fingerprint, limit=limit)


def check_rows(task: Task, sources: Sequence[DataSource], limit: int | None = None) -> int | None:
    """Parse every row of the file sources (a DARE file, a local file), as loading will: a file with the wrong
    columns, or a code row without tests, is one DataError naming the file and row, raised at plan time so that a
    run never starts (or writes a store row) on data it cannot read. Generators and hf: sources are not read here
    (deterministic code; the Hub is only reached when the run loads). Returns how many training items loading
    gives (at most `limit`, as `load_sources`), or None when an hf: source leaves it unknown until the run."""
    total: int | None = 0
    for src in sources:
        if src.kind not in ("task", "dare", "file"):
            total = None if total is None or src.rows is None else total + src.rows
            continue
        # a file whose content (sha256) this task's parser already read without error reads the same again: a
        # sweep's dry run (or `list --runnable`) plans many cells on the same few files
        knobs = tuple((k, repr(getattr(src.task, k, None))) for k in sorted(getattr(src.task, "option_defaults", {})))
        key = (type(src.task).__module__, type(src.task).__qualname__, src.task.name, knobs, src.fingerprint)
        if key not in _ROWS_READ_CLEANLY:
            _ROWS_READ_CLEANLY[key] = len(src.task.load("train", source=src.source).items)
        total = None if total is None else total + _ROWS_READ_CLEANLY[key]
    return total if total is None or limit is None else min(total, limit)


#: (task parser, its knobs, file sha256) -> row count, for every training file `check_rows` parsed without error
#: in this process
_ROWS_READ_CLEANLY: dict[tuple, int] = {}


def load_mixture(task: Task, entries: Sequence[str], limit: int | None = None) -> TaskDataset:
    """`train.data` resolved and loaded: the run's training items."""
    return load_sources(task, resolve_sources(task, entries, limit), limit)


def prompt_token_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a prompt without added special tokens (templated prompts already carry theirs): how the RL loop
    encodes prompts (trainers.loop.encode) and what the overlong filter counts."""
    if callable(tokenizer):
        enc = tokenizer(text, add_special_tokens=False)
        ids = enc["input_ids"] if hasattr(enc, "keys") else enc
    else:
        ids = tokenizer.encode(text, add_special_tokens=False)
    ids = list(ids)
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return ids


def _n_tokens(tokenizer: Any, text: str) -> int:
    return len(prompt_token_ids(tokenizer, text))


def filter_overlong(task: Task, items: Sequence[Item], tokenizer: Any, template: Any,
                    max_len: int | None) -> tuple[list[Item], int]:
    """verl's `filter_overlong_prompts`: drop the items whose prompt, as the run renders it (`template`: "plain"
    or the chat tokenizer) and tokenises it, is longer than `max_len` tokens (`train.max_prompt_length`).
    Returns (kept items in order, number dropped); `max_len` None keeps everything."""
    if max_len is None:
        return list(items), 0
    kept = [it for it in items if _n_tokens(tokenizer, task.format_prompt(it, template)) <= max_len]
    return kept, len(items) - len(kept)


__all__ = ["DARE_NAME_FORMS", "DataSource", "filter_overlong", "load_mixture", "load_sources", "prompt_token_ids",
           "resolve_entry", "resolve_sources"]
