"""The real data, one command away: DARE's verl-format parquet files, pinned in `data_manifest.yaml`, written to the
layout the loaders read (`$DARE_BENCH_DATA/rl/<split>/<file>`, see `Task.load` and `tasks.mixtures`).

Where each file comes from (`dare-bench data list` shows it per file):

- DARE's repository at the pinned commit (yjyddq/DARE @ 83ae8a3, folder `data/preprocessed/rl/`): downloaded from
  GitHub raw (the default; the only network use is inside this command), or copied from a local DARE checkout /
  folder (`--from PATH`). Checked byte for byte: sha256 (or, for the code RL sets whose sha256 we never had, DARE's git
  blob id of the file at that commit).
- the task's public Hugging Face data (`--hf`; gsm8k, math500, humaneval, mbpp), converted to exactly DARE's rows
  (prompt text, ground truth, extra_info) by the converters below, which follow DARE's
  `verl/utils/preprocess/preprocess.py`. Checked by the rows pin (`rows_sha256`, the sha256 of the rows' canonical
  JSON): parquet bytes differ across pyarrow versions, the rows must not.
- a local raw file (`--from FILE`: .jsonl / .json / .parquet / .csv with the raw columns, e.g. gsm8k's question +
  answer), converted and checked the same way; a verl-format file (prompt, reward_model) is checked as a DARE copy.

sudoku and countdown are DARE's own generated sets: DARE's files only (their loaders fall back to the seeded
generator without them). arith and pyfunc are procedural: they need no files. DARE's code RL sets (lcbv5-K8,
primeintellect-K8, taco-K8) are K=8-sampled selections that need DARE's unpublished samples: DARE's files only.

Every write is atomic (fetch, convert and check everything first, then rename into place) and leaves
`<file>.source.json` beside the file: source, revision, converter and its version, sha256, rows, written-at.

    dare-bench data list [--json] [--dir DIR]
    dare-bench data get gsm8k math500                      # DARE's files, from GitHub raw at the pinned commit
    dare-bench data get all --from ~/src/DARE              # every file, from a DARE checkout (or its rl/ folder)
    dare-bench data get humaneval mbpp --hf [--revision REV]   # the HF datasets, converted to DARE's rows
    dare-bench data get math --from data/math/math.json    # the MATH test set from OpenCompass's file (or --hf)
    dare-bench data get rl/test/gsm8k_1.parquet --from gsm8k_test.jsonl --out /data/dare
    dare-bench data get lcbv5-K8 primeintellect-K8 taco-K8 --dry-run
    dare-bench data verify [--json] [--dir DIR]            # exit != 0 when a present file differs from its pin

    from dare_bench.tasks import data
    data.select(["gsm8k"])                                 # [DataFile(rl/test/gsm8k_1.parquet), ...]
    data.get(["gsm8k"], from_path="~/src/DARE", out="/data/dare")
    data.convert_rows(data.select(["rl/test/gsm8k_1.parquet"])[0], raw_rows, where="rows.jsonl")
"""

from __future__ import annotations

import difflib
import hashlib
import io
import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

from dare_bench.errors import DataError
from dare_bench.tasks.base import DATA_ENV, canonical_json, plain, read_rows

MANIFEST_PATH = Path(__file__).with_name("data_manifest.yaml")
#: bump when a converter's output changes; recorded in every provenance file
CONVERTER_VERSION = 1
PROVENANCE_SUFFIX = ".source.json"
VERL_COLUMNS = ("data_source", "prompt", "reward_model", "extra_info")


# ---------------------------------------------------------------------------------------------------- the manifest
@dataclass(frozen=True)
class DataFile:
    """One pinned file of the manifest (see the comments at the top of data_manifest.yaml)."""

    path: str  # rl/<split>/<file>, relative to the data root
    tasks: tuple[str, ...]
    rows: int | None
    sha256: str | None
    rows_sha256: str | None
    git_blob: str | None
    license: str
    converter: dict[str, Any] | None = None
    hf: dict[str, Any] | None = None
    problems_from: str | None = None
    #: "dare" (a file of DARE's repository) or "opencompass" (a benchmark DARE evaluates through OpenCompass: no DARE
    #: file, only dare-bench's conversion of the public data, checked by its row count where that is known)
    origin: str = "dare"

    @property
    def from_dare(self) -> bool:
        return self.origin == "dare"

    @property
    def split(self) -> str:
        return self.path.split("/")[1]

    @property
    def filename(self) -> str:
        return self.path.rsplit("/", 1)[1]

    @property
    def name(self) -> str:
        """DARE's data name, as `train.data` spells it (gsm8k, countdown-n20000, lcbv5-K8)."""
        stem = self.filename[: -len(".parquet")]
        return stem[:-2] if stem.endswith("_1") else stem

    @property
    def pinned(self) -> bool:
        return bool(self.sha256 or self.git_blob)

    def sources(self) -> list[str]:
        out = ["dare"] if self.from_dare else []
        if self.hf:
            configs = self.hf.get("configs") or ([self.hf["config"]] if self.hf.get("config") else [])
            out.append(f"hf:{self.hf['id']}" + (f":{'+'.join(configs)}" if configs else "") + f" ({self.hf['split']})")
        if self.converter:
            out.append("raw file")
        return out


@dataclass(frozen=True)
class Manifest:
    dare: dict[str, str]
    procedural: tuple[str, ...]
    files: tuple[DataFile, ...]

    def dare_path(self, f: DataFile) -> str:
        """The file's path inside DARE's repository."""
        return f"{self.dare['folder']}/{f.split}/{f.filename}"

    def dare_url(self, f: DataFile) -> str:
        return self.dare["raw_url"].format(commit=self.dare["commit"], folder=self.dare["folder"], split=f.split,
                                           file=f.filename)

    @property
    def dare_ref(self) -> str:
        return f"{self.dare['repo']}@{self.dare['commit'][:7]}"


@lru_cache(maxsize=1)
def load_manifest(path: str | None = None) -> Manifest:
    import yaml

    raw = yaml.safe_load(Path(path or MANIFEST_PATH).read_text(encoding="utf-8"))
    files = tuple(
        DataFile(path=e["path"], tasks=tuple(e.get("tasks") or ()), rows=e.get("rows"), sha256=e.get("sha256"),
                 rows_sha256=e.get("rows_sha256"), git_blob=e.get("git_blob"), license=e.get("license", "unknown"),
                 converter=e.get("converter"), hf=e.get("hf"), problems_from=e.get("problems_from"),
                 origin=e.get("origin", "dare"))
        for e in raw["files"]
    )
    return Manifest(dare=dict(raw["dare"]), procedural=tuple(raw.get("procedural") or ()), files=files)


def code_rl_files() -> list[DataFile]:
    """DARE's code RL training sets (the files only DARE ships: built from its own samples)."""
    return [f for f in load_manifest().files if f.name.endswith("-K8")]


def find_file(name: str, split: str = "train") -> DataFile | None:
    """The manifest file a DARE data name / file name / path denotes (the `split` one when a name has two)."""
    hits = [f for f in load_manifest().files if name in (f.path, f.filename, f.name)]
    return next((f for f in hits if f.split == split), hits[0] if hits else None)


def select(names: Sequence[str]) -> tuple[list[DataFile], list[str]]:
    """Names -> (manifest files in manifest order, procedural task names). A name is `all`, a task, a DARE data name
    (`gsm8k` = both gsm8k files, `countdown-n20000`, `lcbv5-K8`), a file name or a path `rl/<split>/<file>`; a
    task name means its task's files (`math`: the MATH test set, not DARE's math_1.parquet of task math500).
    An unknown name is one DataError with the closest known name."""
    m = load_manifest()
    chosen: set[str] = set()
    procedural: list[str] = []
    vocabulary: list[str] = ["all", *m.procedural]
    for f in m.files:
        vocabulary += [f.path, f.filename, f.name, *f.tasks]
    vocabulary = sorted(set(vocabulary))
    for raw in names:
        name = str(raw).strip()
        if name == "all":
            chosen |= {f.path for f in m.files}
            continue
        if name in m.procedural:
            procedural.append(name)
            continue
        # a task name denotes its task's files: `math` is the MATH test set (task math), not DARE's MATH train
        # file whose data name is also math (task math500: `data get math500` or `math_1.parquet`)
        hits = {f.path for f in m.files if name in f.tasks and not f.name.endswith("-K8")} or \
            {f.path for f in m.files if name in (f.path, f.filename, f.name)}
        if not hits:
            close = difflib.get_close_matches(name, vocabulary, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            tasks = sorted({t for f in m.files for t in f.tasks} | set(m.procedural))
            raise DataError(f"unknown data name {name!r}{hint} (a task: {', '.join(tasks)}; a DARE data name: "
                            f"{', '.join(sorted({f.name for f in m.files}))}; a file rl/<split>/<file>; or all)")
        chosen |= hits
    return [f for f in m.files if f.path in chosen], procedural


def data_root(out: str | os.PathLike | None) -> Path:
    """Where the files live: `out`, else $DARE_BENCH_DATA (the loaders read only that)."""
    if out:
        return Path(out).expanduser()
    env = os.environ.get(DATA_ENV)
    if not env:
        raise DataError(f"no data directory: set ${DATA_ENV} (where the loaders read DARE's layout rl/<split>/) "
                        "or pass --out DIR / --dir DIR")
    return Path(env).expanduser()


# ---------------------------------------------------------------------------------------------------- content pins
def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git_blob_id(data: bytes) -> str:
    """git's object id of a file (`git hash-object`): how DARE's tree names its files' content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def rows_sha256(rows: Sequence[dict[str, Any]]) -> str:
    """The rows pin: sha256 of the canonical JSON of the rows (as plain Python values)."""
    return hashlib.sha256(canonical_json([plain(r) for r in rows])).hexdigest()


def parquet_rows(data: bytes, where: str) -> list[dict[str, Any]]:
    try:
        import pandas as pd

        return [plain(r) for r in pd.read_parquet(io.BytesIO(data)).to_dict(orient="records")]
    except Exception as e:  # pyarrow raises many types for a corrupt file
        raise DataError(f"{where}: not a readable parquet file: {type(e).__name__}: {e}") from e


def rows_to_parquet(rows: Sequence[dict[str, Any]]) -> bytes:
    import pandas as pd

    buf = io.BytesIO()
    pd.DataFrame(list(rows)).to_parquet(buf, index=False)
    return buf.getvalue()


def check_verl_columns(rows: Sequence[dict[str, Any]], where: str) -> None:
    missing = [c for c in VERL_COLUMNS if rows and c not in rows[0]]
    if not rows or missing:
        got = ", ".join(sorted(rows[0])) if rows else "no rows"
        raise DataError(f"{where}: not a verl-format file: needs columns {', '.join(VERL_COLUMNS)} (got: {got})")


def check_bytes(f: DataFile, data: bytes, where: str) -> dict[str, Any]:
    """A copy of DARE's file: its bytes must be the pinned ones (sha256, else DARE's git blob id)."""
    if not f.pinned:
        raise DataError(f"{f.path}: no pin is known for this file (neither sha256 nor DARE's git blob id), so a "
                        f"copy cannot be checked; refusing to write it")
    sha = sha256_bytes(data)
    if f.sha256 and sha != f.sha256:
        raise DataError(f"{f.path}: sha256 mismatch for {where}: expected {f.sha256}, got {sha}; nothing written")
    if not f.sha256:
        blob = git_blob_id(data)
        if blob != f.git_blob:
            raise DataError(f"{f.path}: git blob id mismatch for {where}: expected {f.git_blob} (DARE's tree at "
                            f"{load_manifest().dare_ref}), got {blob}; nothing written")
    rows = parquet_rows(data, where)
    check_verl_columns(rows, where)
    return {"sha256": sha, "git_blob": git_blob_id(data), "rows": len(rows), "rows_sha256": rows_sha256(rows),
            "checked_by": "sha256" if f.sha256 else "git_blob"}


def check_rows(f: DataFile, data: bytes, where: str) -> dict[str, Any]:
    """A conversion: the written file's rows must be exactly DARE's (rows_sha256); for a benchmark DARE evaluates
    through OpenCompass (no DARE file, no rows pin) the row count, where the manifest knows it."""
    if not f.from_dare and not f.rows_sha256:
        rows = parquet_rows(data, where)
        if f.rows is not None and len(rows) != f.rows:
            raise DataError(f"{f.path}: {len(rows)} rows from {where}, the benchmark has {f.rows}; nothing written")
        return {"sha256": sha256_bytes(data), "git_blob": git_blob_id(data), "rows": len(rows),
                "rows_sha256": rows_sha256(rows), "checked_by": "rows" if f.rows is not None else "unchecked"}
    if not f.rows_sha256:
        raise DataError(f"{f.path}: no rows pin is known, so a conversion cannot be checked; refusing to write it")
    rows = parquet_rows(data, where)
    got = rows_sha256(rows)
    if got != f.rows_sha256:
        raise DataError(f"{f.path}: rows sha256 mismatch for {where} ({len(rows)} rows, pinned {f.rows}): expected "
                        f"{f.rows_sha256}, got {got}; the converted rows are not DARE's; nothing written")
    return {"sha256": sha256_bytes(data), "git_blob": git_blob_id(data), "rows": len(rows), "rows_sha256": got,
            "checked_by": "rows_sha256"}


# ---------------------------------------------------------------------------------------------------- converters
# Each turns one raw row (the public dataset's columns) into DARE's verl row, as DARE's
# verl/utils/preprocess/preprocess.py::process_single_example builds it.
def _column(row: dict[str, Any], names: Sequence[str], task: str, where: str) -> Any:
    for n in names:
        if n in row and row[n] is not None:
            return row[n]
    raise DataError(f"{where}: {task} raw rows need a {' or '.join(names)!s} column (columns: "
                    f"{', '.join(sorted(row)) or 'none'})")


def _verl(data_source: str, messages: list[dict[str, str]], ground_truth: str | None, split: str, index: int,
          kind: str) -> dict[str, Any]:
    return {"data_source": data_source, "prompt": messages,
            "reward_model": {"style": "rule", "ground_truth": ground_truth},
            "extra_info": {"split": split, "index": index, "task": kind}}


def _gsm8k(row: dict[str, Any], index: int, split: str, data_source: str, where: str) -> dict[str, Any]:
    # the bare question as the user turn; the gold is the text after "####" of the worked answer
    question = _column(row, ("question", "problem"), "gsm8k", where)
    answer = str(_column(row, ("answer", "solution"), "gsm8k", where))
    return _verl(data_source, [{"role": "user", "content": str(question)}], answer.split("####")[-1].strip(),
                 split, index, "math")


def _math(row: dict[str, Any], index: int, split: str, data_source: str, where: str) -> dict[str, Any]:
    problem = _column(row, ("problem",), "math", where)
    if "answer" in row:  # DARE keeps the answer column as it is, a missing answer too (2 of its MATH train rows)
        answer = row["answer"]
    else:
        from dare_bench.tasks.graders.dare import extract_answer

        answer = extract_answer(str(_column(row, ("solution",), "math", where)))
        if answer is None:
            raise DataError(f"{where}: the solution has no \\boxed{{}} answer")
    return _verl(data_source, [{"role": "user", "content": str(problem)}], None if answer is None else str(answer),
                 split, index, "math")


def _humaneval(row: dict[str, Any], index: int, split: str, data_source: str, where: str) -> dict[str, Any]:
    from dare_bench.tasks.humaneval import HUMANEVAL_PREFIX

    prompt = _column(row, ("prompt",), "humaneval", where)
    test = _column(row, ("test", "tests"), "humaneval", where)
    if not str(test).strip():
        raise DataError(f"{where}: a humaneval row with no tests (empty 'test')")
    return _verl(data_source, [{"role": "user", "content": HUMANEVAL_PREFIX + str(prompt)}], str(test), split,
                 index, "code")


def _mbpp(row: dict[str, Any], index: int, split: str, data_source: str, where: str) -> dict[str, Any]:
    from dare_bench.tasks import get_task

    text = _column(row, ("text", "prompt", "problem"), "mbpp", where)
    tests = _column(row, ("test_list", "tests"), "mbpp", where)
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except ValueError as e:
            raise DataError(f"{where}: mbpp 'test_list' is neither a list nor a JSON list of asserts") from e
    if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
        raise DataError(f"{where}: mbpp 'test_list' must be a list of assert strings")
    if not tests:
        raise DataError(f"{where}: an mbpp row with no tests (empty 'test_list')")
    messages = get_task("mbpp").make_messages(str(text), tests)
    return _verl(data_source, messages, json.dumps(tests), split, index, "code")


CONVERTERS: dict[str, Callable[..., dict[str, Any]]] = {
    "gsm8k": _gsm8k, "math": _math, "humaneval": _humaneval, "mbpp": _mbpp,
}


# ---------------------------------------------------------------------------------------------------- OpenCompass sets
# The benchmarks DARE evaluates through OpenCompass have no DARE file: these converters write verl rows whose prompt
# is the chat OpenCompass's dataset config builds (the task files say which config), ground truth = the gold letter
# and extra_info.options = the (letter, text) pairs shown. They take the whole table: an MMLU question needs its
# subject's dev questions, GPQA shuffles row after row from one seed, ARC drops rows.
def _choice_row(data_source: str, prompt: str | list[dict[str, str]], gold: str, options: list[tuple[str, str]],
                split: str, index: int, where: str, **extra: Any) -> dict[str, Any]:
    if not options or not all(str(text).strip() for _, text in options):
        raise DataError(f"{where}: a multiple-choice row with no options (or an empty one)")
    if gold not in [letter for letter, _ in options]:
        raise DataError(f"{where}: gold {gold!r} is not one of the options {''.join(x for x, _ in options)}")
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    row = _verl(data_source, messages, gold, split, index, "choice")
    row["extra_info"].update(options=[[letter, str(text)] for letter, text in options], **extra)
    return row


def _letter(answer: Any, n: int, where: str) -> str:
    """A gold given as a 0-based position or as a letter."""
    if isinstance(answer, str) and len(answer) == 1 and answer.isalpha():
        return answer.upper()
    try:
        pos = int(answer)
    except (TypeError, ValueError):
        raise DataError(f"{where}: cannot read the gold answer {answer!r}") from None
    if not 0 <= pos < n:
        raise DataError(f"{where}: gold position {pos} outside the {n} options")
    return "ABCDEFGHIJKLMNOP"[pos]


def _choices(row: dict[str, Any], where: str) -> list[str]:
    choices = row.get("choices")
    if not isinstance(choices, list) or not choices:
        raise DataError(f"{where}: a multiple-choice row with no options ('choices' is {choices!r})")
    return [str(c) for c in choices]


def _mmlu(rows, split, data_source, where, fewshot_rows=None):
    from dare_bench.tasks import get_task

    if fewshot_rows is None:
        raise DataError(f"{where}: MMLU's 5-shot prompt needs the dev split's rows (fewshot_rows); run "
                        "`dare-bench data get mmlu --hf`")
    shots: dict[str, list] = {}
    for j, r in enumerate(fewshot_rows):  # FixKRetriever(fix_id_list=[0..4]) over the subject's dev split
        choices = _choices(r, f"{where} (dev row {j})")
        shots.setdefault(str(r["subject"]), []).append((str(r["question"]), choices,
                                                        _letter(r["answer"], len(choices), f"dev row {j}")))
    task = get_task("mmlu")
    out = []
    for i, r in enumerate(rows):
        at = f"{where}: row {i}"
        subject = str(_column(r, ("subject",), "mmlu", at))
        choices = _choices(r, at)
        if len(choices) != 4:
            raise DataError(f"{at}: MMLU rows have four choices, got {len(choices)}")
        if len(shots.get(subject, [])) < 5:
            raise DataError(f"{at}: subject {subject!r} has {len(shots.get(subject, []))} dev questions, needs 5")
        gold = _letter(_column(r, ("answer",), "mmlu", at), 4, at)
        messages = task.make_messages(subject, str(_column(r, ("question",), "mmlu", at)), choices,
                                      shots[subject][:5])
        out.append(_choice_row(data_source, messages, gold, list(zip("ABCD", choices)), split, i, at,
                               subject=subject))
    return out


def _mmlupro(rows, split, data_source, where, fewshot_rows=None):
    from dare_bench.tasks import get_task
    from dare_bench.tasks.mmlupro import N_SHOTS, fewshot_entry, options_str

    # the validation split (`--hf`): each category's first five questions, the shots of mmlu_pro_few_shot_gen_bfaf90,
    # stored in the category's rows' extra_info (the default prompt does not read them)
    shots: dict[str, list] | None = None
    if fewshot_rows is not None:
        shots = {}
        for j, r in enumerate(fewshot_rows):
            at = f"{where} (validation row {j})"
            entry = {c: _column(r, (c,), "mmlupro", at) for c in ("question", "options", "answer", "category")}
            shots.setdefault(str(entry["category"]), []).append(fewshot_entry(entry))
    task = get_task("mmlupro")
    out = []
    for i, r in enumerate(rows):
        at = f"{where}: row {i}"
        options = _column(r, ("options",), "mmlupro", at)
        if not isinstance(options, list) or not options:
            raise DataError(f"{at}: a multiple-choice row with no options ('options' is {options!r})")
        text, shown = options_str(options)
        gold = _letter(_column(r, ("answer",), "mmlupro", at), len(options), at)
        category = str(r.get("category", ""))
        extra = {}
        if shots is not None:
            if len(shots.get(category, [])) < N_SHOTS:
                raise DataError(f"{at}: category {category!r} has {len(shots.get(category, []))} validation "
                                f"questions, the few-shot config needs {N_SHOTS}")
            extra["fewshot"] = shots[category][:N_SHOTS]
        out.append(_choice_row(data_source, task.make_prompt(str(_column(r, ("question",), "mmlupro", at)), text),
                               gold, shown, split, i, at, category=category, question_id=r.get("question_id"),
                               **extra))
    return out


def _hellaswag_text(text: str) -> str:
    # lm-evaluation-harness hellaswag `preprocess`, which OpenCompass's hellaswag.jsonl carries
    import re

    text = text.strip().replace(" [title]", ". ")
    return re.sub("\\[.*?\\]", "", text).replace("  ", " ")


def _hellaswag(rows, split, data_source, where, fewshot_rows=None):
    from dare_bench.tasks import get_task
    from dare_bench.tasks.hellaswag import N_SHOTS

    extra = {}
    if fewshot_rows is not None:  # OpenCompass's hellaswag_train_sampled25.jsonl: the 10-shot config's first ten rows
        if len(fewshot_rows) < N_SHOTS:
            raise DataError(f"{where}: the 10-shot config needs {N_SHOTS} shot rows, got {len(fewshot_rows)}")
        shots = []
        for j, r in enumerate(fewshot_rows[:N_SHOTS]):
            at = f"{where} (shot row {j})"
            choices = [str(c) for c in _column(r, ("choices",), "hellaswag", at)]
            if len(choices) != 4:
                raise DataError(f"{at}: a shot needs four choices, got {len(choices)}")
            shots.append({"query": str(_column(r, ("query",), "hellaswag", at)), "choices": choices,
                          "gold": "ABCD".index(_letter(_column(r, ("gold",), "hellaswag", at), 4, at))})
        extra["fewshot"] = shots
    task = get_task("hellaswag")
    out = []
    for i, r in enumerate(rows):
        at = f"{where}: row {i}"
        if "query" in r:  # OpenCompass's jsonl: query, choices, gold
            query, endings, gold = str(r["query"]), [str(c) for c in r.get("choices") or []], r.get("gold")
        else:  # Rowan/hellaswag
            ctx = str(_column(r, ("ctx_a",), "hellaswag", at)) + " " + str(r.get("ctx_b", "")).capitalize()
            query = _hellaswag_text(str(_column(r, ("activity_label",), "hellaswag", at)) + ": " + ctx)
            endings = [_hellaswag_text(str(e)) for e in r.get("endings") or []]
            gold = _column(r, ("label",), "hellaswag", at)
        if len(endings) != 4:
            raise DataError(f"{at}: a multiple-choice row with no options (HellaSwag needs four endings, got "
                            f"{len(endings)})")
        ctx_shown = query.split(": ", 1)[-1]  # HellaswagDataset_V2
        out.append(_choice_row(data_source, task.make_prompt(ctx_shown, endings), _letter(gold, 4, at),
                               list(zip("ABCD", endings)), split, i, at, **extra))
    return out


def _arcc(rows, split, data_source, where, fewshot_rows=None):
    from dare_bench.tasks import get_task

    task = get_task("arcc")
    out = []
    for i, r in enumerate(rows):
        at = f"{where}: row {i}"
        question = _column(r, ("question",), "arcc", at)
        if isinstance(question, dict):  # the ARC jsonl: question {stem, choices: [{label, text}]}
            stem, choices = str(question.get("stem", "")), question.get("choices") or []
            labels, texts = [str(c["label"]) for c in choices], [str(c["text"]) for c in choices]
        else:  # allenai/ai2_arc: question, choices {text, label}
            choices = r.get("choices") or {}
            stem, labels, texts = str(question), [str(x) for x in choices.get("label") or []], \
                [str(x) for x in choices.get("text") or []]
        if not texts:
            raise DataError(f"{at}: a multiple-choice row with no options")
        if len(texts) != 4:  # ARCDataset skips them
            continue
        key = str(_column(r, ("answerKey",), "arcc", at))
        if key not in labels:
            raise DataError(f"{at}: answerKey {key!r} is not one of the labels {labels}")
        gold = "ABCD"[labels.index(key)]
        out.append(_choice_row(data_source, task.make_prompt(stem, texts), gold, list(zip("ABCD", texts)), split,
                               len(out), at, source_index=i, id=r.get("id")))
    if not out:
        raise DataError(f"{where}: no ARC question with four choices")
    return out


def _gpqa(rows, split, data_source, where, fewshot_rows=None):
    import random

    from dare_bench.tasks import get_task

    task = get_task("gpqa")
    rng = random.Random(0)  # GPQADataset_: random.seed(0), then one shuffle per row in file order
    out = []
    for i, r in enumerate(rows):
        at = f"{where}: row {i}"
        names = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
        texts = [r.get(n) for n in names]
        if any(t is None for t in texts):
            raise DataError(f"{at}: a multiple-choice row with no options (needs {', '.join(names)})")
        texts = [str(t) for t in texts]
        correct = texts[0]
        rng.shuffle(texts)
        gold = "ABCD"[texts.index(correct)]
        out.append(_choice_row(data_source, task.make_prompt(str(_column(r, ("Question",), "gpqa", at)), texts),
                               gold, list(zip("ABCD", texts)), split, i, at, record_id=r.get("Record ID")))
    return out


def _olympiadbench(rows, split, data_source, where, fewshot_rows=None):
    from dare_bench.tasks.olympiadbench import make_prompt

    out = []
    for i, r in enumerate(rows):
        at = f"{where}: row {i}"
        final = _column(r, ("final_answer",), "olympiadbench", at)
        if not isinstance(final, list) or not final or final[0] is None:
            raise DataError(f"{at}: an OlympiadBench row needs final_answer (a non-empty list)")
        fields = {k: r.get(k) for k in ("language", "subject", "question_type", "answer_type", "unit")}
        multiple = bool(r.get("is_multiple_answer"))
        try:
            prompt = make_prompt(str(_column(r, ("question",), "olympiadbench", at)), str(fields["language"]),
                                 str(fields["subject"]), str(fields["question_type"]),
                                 str(fields["answer_type"] or ""), multiple, fields["unit"])
        except ValueError as e:
            raise DataError(f"{at}: {e}") from e
        row = _verl(data_source, [{"role": "user", "content": prompt}], str(final[0]), split, i, "math")
        row["extra_info"].update(category=r.get("hf_config"), id=r.get("id"), is_multiple_answer=multiple,
                                 **{k: (None if v is None else str(v)) for k, v in fields.items()})
        out.append(row)
    return out


def _opencompass_math(rows, split, data_source, where, fewshot_rows=None):
    # MATHDataset: the problem as it is (the protocol builds the chat), gold = extract_boxed_answer(solution). A
    # solution without a box keeps its row with gold None, as there (counted, never right); the solution stays in
    # extra_info, where the protocols' graders read their gold.
    from dare_bench.tasks.graders.opencompass_protocols import extract_boxed_answer

    out = []
    for i, r in enumerate(rows):
        at = f"{where}: row {i}"
        solution = str(_column(r, ("solution",), "math", at))
        row = _verl(data_source, [{"role": "user", "content": str(_column(r, ("problem",), "math", at))}],
                    extract_boxed_answer(solution), split, i, "math")
        row["extra_info"].update(solution=solution,
                                 **{k: (None if r.get(k) is None else str(r[k])) for k in ("level", "type")})
        out.append(row)
    return out


def _read_math(path: Path) -> list[dict[str, Any]]:
    from dare_bench.tasks.math import read_math_rows

    return read_math_rows(path)


#: converters over a whole table: (rows, split, data_source, where, fewshot_rows) -> verl rows
TABLE_CONVERTERS: dict[str, Callable[..., list[dict[str, Any]]]] = {
    "mmlu": _mmlu, "mmlupro": _mmlupro, "hellaswag": _hellaswag, "arcc": _arcc, "gpqa": _gpqa,
    "olympiadbench": _olympiadbench, "opencompass_math": _opencompass_math,
}
#: `--from FILE` readers of the converters whose public file is not one record per row (others: base.read_rows):
#: OpenCompass's data/math/math.json is one object {id: record}
RAW_READERS: dict[str, Callable[[Path], list[dict[str, Any]]]] = {"opencompass_math": _read_math}


def convert_table(name: str, raw_rows: Sequence[dict[str, Any]], split: str, data_source: str, where: str,
                  fewshot_rows: Sequence[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Raw rows of an OpenCompass-evaluated benchmark -> verl rows (what `data get <task> --hf` writes and what the
    task loads from a raw file)."""
    if not raw_rows:
        raise DataError(f"{where}: no rows")
    fewshot = [plain(dict(r)) for r in fewshot_rows] if fewshot_rows is not None else None
    return TABLE_CONVERTERS[name]([plain(dict(r)) for r in raw_rows], split, data_source, where, fewshot)


def convert_rows(f: DataFile, raw_rows: Sequence[dict[str, Any]], where: str,
                 fewshot_rows: Sequence[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Raw rows of the task's public data -> DARE's verl rows for file `f` (index = the row's position)."""
    if not f.converter:
        raise DataError(f"{f.path} comes from DARE's repository only (no converter from raw rows): run "
                        f"`dare-bench data get {f.name}` (GitHub) or `--from <DARE checkout>`")
    if not raw_rows:
        raise DataError(f"{where}: no rows")
    if f.converter["name"] in TABLE_CONVERTERS:
        return convert_table(f.converter["name"], raw_rows, f.split, f.converter["data_source"], where,
                             fewshot_rows)
    fn = CONVERTERS[f.converter["name"]]
    return [fn(plain(dict(r)), i, f.split, f.converter["data_source"], f"{where}: row {i}")
            for i, r in enumerate(raw_rows)]


# ---------------------------------------------------------------------------------------------------- fetching
@dataclass
class Prepared:
    """A file fetched or converted and checked, ready to be renamed into place."""

    file: DataFile
    data: bytes
    source: dict[str, Any]
    info: dict[str, Any] = field(default_factory=dict)


def _dare_candidates(root: Path, f: DataFile) -> list[Path]:
    m = load_manifest()
    return [root / m.dare_path(f), root / "preprocessed" / "rl" / f.split / f.filename,
            root / "rl" / f.split / f.filename, root / f.split / f.filename]


def _from_dare_dir(f: DataFile, root: Path) -> Prepared:
    m = load_manifest()
    for cand in _dare_candidates(root, f):
        if cand.is_file():
            data = cand.read_bytes()
            info = check_bytes(f, data, str(cand))
            return Prepared(f, data, {"kind": "dare-local", "path": str(cand.resolve()), "repo": m.dare["repo"],
                                      "commit": m.dare["commit"], "dare_path": m.dare_path(f)}, info)
    tried = ", ".join(str(c) for c in _dare_candidates(root, f)[:3])
    raise DataError(f"{f.path}: not found in {root} (tried {tried}, ...); give a DARE checkout, its "
                    f"data/preprocessed/rl folder or a folder laid out rl/<split>/")


def _from_file(f: DataFile, path: Path) -> Prepared:
    rows = RAW_READERS.get((f.converter or {}).get("name"), read_rows)(path)
    if rows and "prompt" in rows[0] and "reward_model" in rows[0] and not f.from_dare:  # a written conversion
        data = rows_to_parquet(rows) if path.suffix.lower() != ".parquet" else path.read_bytes()
        info = check_rows(f, data, str(path))
        return Prepared(f, data, {"kind": "local-verl", "path": str(path.resolve())}, info)
    if rows and "prompt" in rows[0] and "reward_model" in rows[0]:  # a verl file: a DARE copy
        if path.suffix.lower() != ".parquet":
            raise DataError(f"{path}: a verl-format copy of DARE's file must be DARE's .parquet itself")
        data = path.read_bytes()
        info = check_bytes(f, data, str(path))
        m = load_manifest()
        return Prepared(f, data, {"kind": "dare-local", "path": str(path.resolve()), "repo": m.dare["repo"],
                                  "commit": m.dare["commit"], "dare_path": m.dare_path(f)}, info)
    verl = convert_rows(f, rows, str(path))
    data = rows_to_parquet(verl)
    info = check_rows(f, data, f"the conversion of {path}")
    return Prepared(f, data, {"kind": "local-raw", "path": str(path.resolve()), "converter": f.converter["name"],
                              "converter_version": CONVERTER_VERSION}, info)


def _opencompass_files(f: DataFile, root: Path) -> tuple[Path, Path] | None:
    """(rows, shots) of OpenCompass's data folder for a converter that names them (`opencompass_files` in the
    manifest: hellaswag's hellaswag.jsonl + hellaswag_train_sampled25.jsonl), in `root` or `root/<task>/`."""
    names = (f.converter or {}).get("opencompass_files")
    if not names:
        return None
    for folder in (root, *(root / t for t in f.tasks)):
        if all((folder / n).is_file() for n in (names["rows"], names["fewshot"])):
            return folder / names["rows"], folder / names["fewshot"]
    return None


def _from_opencompass_dir(f: DataFile, rows_path: Path, shots_path: Path) -> Prepared:
    verl = convert_rows(f, read_rows(rows_path), str(rows_path), fewshot_rows=read_rows(shots_path))
    data = rows_to_parquet(verl)
    info = check_rows(f, data, f"the conversion of {rows_path}")
    return Prepared(f, data, {"kind": "opencompass-local", "path": str(rows_path.resolve()),
                              "fewshot_path": str(shots_path.resolve()),
                              "fewshot_sha256": sha256_bytes(shots_path.read_bytes()),
                              "converter": f.converter["name"], "converter_version": CONVERTER_VERSION}, info)


def _download(url: str, progress: bool, label: str) -> bytes:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 - a pinned https URL
            total = int(resp.headers.get("Content-Length") or 0) or None
            from tqdm import tqdm

            chunks = []
            with tqdm(total=total, unit="B", unit_scale=True, desc=label, disable=not progress, leave=False) as bar:
                for chunk in iter(lambda: resp.read(1 << 16), b""):
                    chunks.append(chunk)
                    bar.update(len(chunk))
            return b"".join(chunks)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise DataError(f"cannot download {url}: {type(e).__name__}: {e}") from e


def _from_github(f: DataFile, progress: bool) -> Prepared:
    m = load_manifest()
    url = m.dare_url(f)
    data = _download(url, progress, f.filename)
    info = check_bytes(f, data, url)
    return Prepared(f, data, {"kind": "dare-github", "url": url, "repo": m.dare["repo"], "commit": m.dare["commit"],
                              "dare_path": m.dare_path(f)}, info)


def _from_hf(f: DataFile, revision: str | None) -> Prepared:
    hf = f.hf or {}
    rev = revision or hf.get("revision") or "main"
    configs = hf.get("configs") or [hf.get("config")]
    where = f"hf:{hf['id']}" + (f":{'+'.join(configs)}" if configs != [None] else "") + f"@{rev} ({hf['split']})"
    try:
        import datasets
    except ImportError as e:  # pragma: no cover - a core dependency
        raise DataError("the 'datasets' package is needed for --hf") from e

    def load(config: str | None, split: str) -> list[dict[str, Any]]:
        try:
            rows = [dict(r) for r in datasets.load_dataset(hf["id"], config, split=split, revision=rev)]
        except Exception as e:
            gated = (f" ({hf['id']} is gated: accept its terms at https://huggingface.co/datasets/{hf['id']} and "
                     "log in with `huggingface-cli login`)") if hf.get("gated") else ""
            raise DataError(f"cannot load {where}: {type(e).__name__}: {e}{gated}") from e
        if hf.get("configs"):  # several configs into one file: each row says which it came from
            for r in rows:
                r["hf_config"] = config
        return rows

    raw = [r for config in configs for r in load(config, hf["split"])]
    fewshot = [r for config in configs for r in load(config, hf["fewshot_split"])] if hf.get("fewshot_split") \
        else None
    commit = None
    try:
        from huggingface_hub import HfApi

        commit = HfApi().dataset_info(hf["id"], revision=rev).sha
    except Exception:  # the data loaded; the exact commit is a nicety of the provenance record
        pass
    verl = convert_rows(f, raw, where, fewshot_rows=fewshot)
    data = rows_to_parquet(verl)
    info = check_rows(f, data, f"the conversion of {where}")
    return Prepared(f, data, {"kind": "hf", "id": hf["id"], "config": hf.get("config"),
                              "configs": hf.get("configs"), "fewshot_split": hf.get("fewshot_split"),
                              "split": hf["split"],
                              "revision": rev, "commit": commit, "converter": f.converter["name"],
                              "converter_version": CONVERTER_VERSION}, info)


# ---------------------------------------------------------------------------------------------------- get
def _plan_source(f: DataFile, from_path: Path | None, hf: bool, revision: str | None) -> str:
    m = load_manifest()
    if hf:
        h = f.hf or {}
        configs = h.get("configs") or ([h["config"]] if h.get("config") else [])
        return f"hf:{h['id']}" + (f":{'+'.join(configs)}" if configs else "") + \
            f"@{revision or h.get('revision') or 'main'} ({h['split']}) via converter {f.converter['name']}"
    if from_path is None:
        return m.dare_url(f)
    if from_path.is_dir() and _opencompass_files(f, from_path):
        return " + ".join(map(str, _opencompass_files(f, from_path))) + f" (OpenCompass's files, converter " \
            f"{f.converter['name']})"
    if from_path.is_dir():
        return f"{from_path} (DARE checkout / folder)"
    return f"{from_path} (a local file)"


def _check_request(files: list[DataFile], from_path: Path | None, hf: bool) -> None:
    """Everything that can be refused before any work (network, reading, writing)."""
    if hf and from_path is not None:
        raise DataError("--hf and --from are exclusive: one source per run")
    if hf:
        none = [f.path for f in files if not f.hf]
        if none:
            raise DataError(f"no Hugging Face source for {', '.join(none)}: these come from DARE's repository "
                            "only (drop --hf, or --from <DARE checkout>)")
    if from_path is not None and not from_path.exists():
        raise DataError(f"--from {from_path}: no such file or directory")
    if from_path is not None and from_path.is_file() and len(files) != 1:
        raise DataError(f"--from {from_path}: a file fills exactly one data file; name one of "
                        f"{', '.join(f.path for f in files)}")
    if from_path is None and not hf:
        not_dare = [f for f in files if not f.from_dare]
        if not_dare:
            names = " ".join(sorted({t for f in not_dare for t in f.tasks}))
            raise DataError(f"{', '.join(f.path for f in not_dare)}: not in DARE's repository (DARE evaluates these "
                            f"benchmarks through OpenCompass): convert the public data with "
                            f"`dare-bench data get {names} --hf`")
        unpinned = [f.path for f in files if not f.pinned]
        if unpinned:
            raise DataError(f"no pin is known for {', '.join(unpinned)}; refusing to download unchecked data")


def present_status(f: DataFile, root: Path) -> dict[str, Any]:
    """Is the file at `root` and is it the pinned one? status: missing | ok | ok-rows (a conversion with DARE's
    rows) | mismatch | unreadable."""
    path = root / f.path
    out: dict[str, Any] = {"file": f.path, "path": str(path), "present": path.is_file()}
    if not path.is_file():
        return {**out, "status": "missing"}
    data = path.read_bytes()
    sha = sha256_bytes(data)
    out["sha256"] = sha
    if (f.sha256 and sha == f.sha256) or (not f.sha256 and f.git_blob and git_blob_id(data) == f.git_blob):
        return {**out, "status": "ok"}
    try:
        rows = parquet_rows(data, str(path))
    except DataError as e:
        return {**out, "status": "unreadable", "error": str(e)}
    if f.rows_sha256 and rows_sha256(rows) == f.rows_sha256:
        return {**out, "status": "ok-rows"}
    if not f.from_dare and not f.rows_sha256 and (f.rows is None or len(rows) == f.rows):
        return {**out, "status": "ok-rows"}  # dare-bench's own conversion: only its row count is pinned
    expected = f.sha256 or (f"git blob {f.git_blob}" if f.git_blob else f"{f.rows} rows")
    return {**out, "status": "mismatch", "expected": expected, "rows": len(rows)}


def get(names: Sequence[str], *, from_path: str | os.PathLike | None = None, hf: bool = False,
        out: str | os.PathLike | None = None, dry_run: bool = False, revision: str | None = None,
        progress: bool = False, log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Fetch / convert, check and write the named files (see the module docstring). Nothing is written unless every
    file checks out. Returns {"root", "dry_run", "procedural", "files": [{file, action, source, ...}]}."""
    files, procedural = select(names)
    src = Path(from_path).expanduser() if from_path is not None else None
    skipped: list[DataFile] = []
    if "all" in names and not hf:  # `all` from DARE: the OpenCompass benchmarks' conversions need --hf
        skipped = [f for f in files if not f.from_dare]
        files = [f for f in files if f.from_dare]
    if files:
        _check_request(files, src, hf)
    root = data_root(out) if files else (Path(out).expanduser() if out else None)
    report: dict[str, Any] = {"root": str(root) if root else None, "dry_run": dry_run, "procedural": procedural,
                              "files": [{"file": f.path, "path": str(root / f.path) if root else f.path,
                                         "action": "skipped",
                                         "source": f"not in DARE's repository: dare-bench data get {f.name} --hf"}
                                        for f in skipped]}
    todo: list[DataFile] = []
    for f in files:
        state = present_status(f, root)
        entry = {"file": f.path, "path": state["path"], "source": _plan_source(f, src, hf, revision)}
        if state["status"] in ("ok", "ok-rows"):
            report["files"].append({**entry, "action": "present", "status": state["status"]})
        else:
            report["files"].append({**entry, "action": "would write" if dry_run else "write",
                                    "replaces": state["status"] if state["present"] else None})
            todo.append(f)
    if dry_run or not todo:
        return report
    prepared: list[Prepared] = []
    for f in todo:
        log(f"{f.path}: from {_plan_source(f, src, hf, revision)}")
        if hf:
            prepared.append(_from_hf(f, revision))
        elif src is None:
            prepared.append(_from_github(f, progress))
        elif src.is_dir() and _opencompass_files(f, src):
            prepared.append(_from_opencompass_dir(f, *_opencompass_files(f, src)))
        elif src.is_dir():
            prepared.append(_from_dare_dir(f, src))
        else:
            prepared.append(_from_file(f, src))
    from dare_bench import __version__
    from dare_bench.fileio import atomic_write_bytes, atomic_write_json

    for p in prepared:  # every file checked: now rename them into place, each with its provenance
        target = root / p.file.path
        atomic_write_bytes(target, p.data)
        _readable(target)
        record = {"file": p.file.path, "tasks": list(p.file.tasks), "source": p.source,
                  "converter_version": p.source.get("converter_version"), "sha256": p.info["sha256"],
                  "git_blob": p.info["git_blob"], "rows": p.info["rows"], "rows_sha256": p.info["rows_sha256"],
                  "checked_by": p.info["checked_by"], "license": p.file.license,
                  "written_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "dare_bench": __version__}
        atomic_write_json(target.with_name(target.name + PROVENANCE_SUFFIX), record)
        _readable(target.with_name(target.name + PROVENANCE_SUFFIX))
        for e in report["files"]:
            if e["file"] == p.file.path:
                e.update(action="written", sha256=p.info["sha256"], rows=p.info["rows"],
                         checked_by=p.info["checked_by"])
    return report


# ---------------------------------------------------------------------------------------------------- list / verify
def _readable(path: Path) -> None:
    """Data files are for every user of the machine (the temp file behind an atomic write is private)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def listing(root: Path | None) -> dict[str, Any]:
    """Every manifest file with where it comes from and, when `root` is known, whether it is there and pinned."""
    m = load_manifest()
    rows = []
    for f in m.files:
        entry: dict[str, Any] = {
            "file": f.path, "name": f.name, "tasks": list(f.tasks), "split": f.split, "rows": f.rows,
            "sha256": f.sha256, "rows_sha256": f.rows_sha256, "git_blob": f.git_blob, "license": f.license,
            "sources": f.sources(), "dare": f"{m.dare_ref}:{m.dare_path(f)}" if f.from_dare else None,
            "hf": f.hf, "converter": (f.converter or {}).get("name"),
        }
        if root is not None:
            st = present_status(f, root)
            entry.update(present=st["present"], status=st["status"])
            prov = root / (f.path + PROVENANCE_SUFFIX)
            if prov.is_file():
                try:
                    entry["provenance"] = json.loads(prov.read_text(encoding="utf-8")).get("source")
                except ValueError:
                    entry["provenance"] = "unreadable"
        rows.append(entry)
    return {"root": str(root) if root else None, "dare": dict(m.dare), "procedural": list(m.procedural),
            "files": rows}


def verify(root: Path) -> dict[str, Any]:
    """Status of every manifest file at `root`; `status` is "mismatch" when a present file is not the pinned one."""
    files = [present_status(f, root) for f in load_manifest().files]
    bad = [f for f in files if f["status"] in ("mismatch", "unreadable")]
    return {"root": str(root), "status": "mismatch" if bad else "ok", "files": files,
            "mismatched": [f["file"] for f in bad]}


def missing_hint(entry: str) -> str:
    """What to run for a missing DARE data name (appended to tasks.mixtures' one-line DataError), or ""."""
    f = find_file(entry)
    if f is None:
        return ""
    if f.name.endswith("-K8"):
        m = load_manifest()
        sets = code_rl_files()
        return (f"; DARE's code RL recipes need {', '.join(g.path for g in sets)} (K=8-sampled LiveCodeBench v5 / "
                f"PrimeIntellect / TACO problems kept by DARE's verl/utils/preprocess/preprocess_sampled.py, shipped "
                f"only in {m.dare_ref} {m.dare['folder']}/train/): "
                f"dare-bench data get {' '.join(g.name for g in sets)}")
    # the data name, unless it denotes other files (math = the MATH test task): then the file name
    name = f.name if f in select([f.name])[0] else f.filename
    return f"; get it with: dare-bench data get {name}"


__all__ = ["CONVERTERS", "CONVERTER_VERSION", "DataFile", "Manifest", "code_rl_files", "convert_rows", "data_root",
           "find_file", "get", "git_blob_id", "listing", "load_manifest", "missing_hint", "present_status",
           "rows_sha256", "rows_to_parquet", "select", "verify"]
