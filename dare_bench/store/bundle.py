"""Results bundles: a directory of result files (one finished run each, with its full run record) that
`dare-bench ingest` reads. They are how a measured comparison is published: the tiny grid dare-bench ships
(`dare_bench/results/`, shown by `dare-bench leaderboard` on a fresh install) and a user's own runs, e.g. paper-scale
runs on their GPUs, contributed as a directory of files.

    dare-bench export --bundle results/mine --scale tiny --backbone llada      # write the selected runs
    dare-bench ingest results/mine                                            # verified, then loaded (all or none)

    from dare_bench.store.bundle import export_bundle, merged_database
    export_bundle(store, "results/mine", scale="tiny")          # -> [written paths]
    url = merged_database([SHIPPED, "results/mine"], user_db)   # a SQLite file: the bundles, the user's store on top

File names: `<reproduction>.<scale>.seed<seed>.<run uid>.json.gz`, so re-exporting a run rewrites its own file. They
are gzip-compressed JSON (a tiny run's per-item samples are ~0.5 MB of JSON, ~9x less compressed; `zcat` reads them),
written byte-reproducibly (no timestamp in the gzip header) and atomically. `ingest` reads `.json` and `.json.gz`
alike, recomputes every record's config hash and refuses a tampered one.

A bundle may also carry the SFT bases its runs started from, in `bases/` (never read as result files):
`pipeline/shared_bases.py`.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from pathlib import Path
from typing import Any

from dare_bench.errors import ConfigError, DataError
from dare_bench.store.records import BASES_DIR, result_files

#: the CPU-scale comparison shipped with the package (result files; may be empty)
SHIPPED = Path(__file__).resolve().parent.parent / "results"


def bundle_files(directory: str | Path) -> list[Path]:
    """The result files of a bundle directory, in name order; a missing directory is a DataError."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"no bundle directory at {directory}")
    return result_files(directory)


def bundle_runs(store, *, scale: str | None = None, backbone: str | None = None,
                reproduction: str | None = None, base: str | None = None) -> list[dict[str, Any]]:
    """The finished runs a bundle of these filters holds (`reproduction`: a glob; `base`: a prefix of the SFT
    base's weight hash, as the leaderboard's "task @ base" rows print it); none is a DataError."""
    if base is not None and not re.fullmatch(r"[0-9a-f]{4,64}", base):
        raise ConfigError(f"--base {base!r}: give a prefix of a base's weight hash (4 to 64 lowercase hex digits)")
    runs = [r for r in store.latest_runs(scale=scale, status="finished", limit=None)
            if (backbone is None or r["backbone"] == backbone)
            and (reproduction is None or fnmatch.fnmatchcase(r["reproduction"], reproduction))
            and (base is None or (r.get("base_sha256") or "").startswith(base))]
    if not runs:
        asked = ", ".join(f"{k} {v}" for k, v in (("scale", scale), ("backbone", backbone),
                                                   ("reproduction", reproduction), ("base", base)) if v) or "any"
        raise DataError(f"no finished runs in {store.url} match ({asked}): nothing to export")
    return runs


def export_bundle(store, directory: str | Path, *, scale: str | None = None, backbone: str | None = None,
                  reproduction: str | None = None, base: str | None = None,
                  runs: list[dict[str, Any]] | None = None) -> list[Path]:
    """Write every finished run matching the filters (`bundle_runs`; or the given `runs`, a selection already made)
    as a result file under `directory`. A selection that matches nothing is a DataError (nothing written). The SFT
    bases the runs started from go beside them with `pipeline.shared_bases.write_bases` (`export --bundle --bases`)."""
    import gzip

    from dare_bench.fileio import atomic_write_bytes

    if runs is None:
        runs = bundle_runs(store, scale=scale, backbone=backbone, reproduction=reproduction, base=base)
    directory = Path(directory)
    files = [(directory / f"{r['reproduction']}.{r['scale']}.seed{r['seed']}.{r['uid']}.json.gz",
              store.result_file(r["id"])) for r in sorted(runs, key=lambda r: r["id"])]  # all built before writing
    directory.mkdir(parents=True, exist_ok=True)
    for path, result in files:
        text = result.model_dump_json(indent=1) + "\n"
        atomic_write_bytes(path, gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0))
        path.with_suffix("").unlink(missing_ok=True)  # the same run exported uncompressed by an older dare-bench
    return [p for p, _ in files]


def _digest(paths: list[Path], user_db: str | None) -> str:
    h = hashlib.sha256()
    for p in paths:
        st = p.stat()
        h.update(f"{p}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    h.update(str(user_db).encode())
    return h.hexdigest()[:16]


def merged_database(bundles: list[str | Path], user_db: str | None, *, home: Path | None = None) -> dict[str, Any]:
    """A SQLite database holding the bundles' runs with the user's store layered on top (its runs copied in;
    a run in both is kept once, by uid). Built under `DARE_BENCH_HOME/leaderboard/` and rebuilt when an input
    changes. Returns {"url", "bundle_runs", "user_runs"}."""
    import shutil
    import tempfile

    from dare_bench.fileio import dare_bench_home
    from dare_bench.store import Store

    files = [f for b in bundles for f in bundle_files(b)]
    user = Store(user_db) if user_db else None
    user_ids = [r["id"] for r in user.latest_runs(status="finished", limit=None)] if user else []
    stamp = _digest(files, f"{user.url if user else None}|{max(user_ids, default=0)}|{len(user_ids)}")
    root = (home or dare_bench_home()) / "leaderboard"
    target = root / f"merged-{stamp}.db"
    if not target.exists():
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            staged = Path(tmp) / "merged.db"
            merged = Store(f"sqlite:///{staged}")
            if files:
                merged.ingest_results([(str(f), f) for f in files])
            if user_ids:
                merged.ingest_results([(f"{user.url} run {i}", user.result_file(i)) for i in user_ids])
            from dare_bench.registry import load_registry

            merged.sync_reported(load_registry())
            merged.close()
            shutil.move(str(staged), target)  # complete, or not there at all
        for old in root.glob("merged-*.db"):  # earlier builds
            if old != target:
                old.unlink(missing_ok=True)
    return {"url": f"sqlite:///{target}", "bundle_runs": len(files), "user_runs": len(user_ids)}


__all__ = ["BASES_DIR", "SHIPPED", "bundle_files", "bundle_runs", "export_bundle", "merged_database"]
