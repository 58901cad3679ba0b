"""Shared tiny bases: a results bundle may carry the SFT bases its runs started from, so that runs made on another
machine start from the same weights and join the bundle's groups.

Why: a tiny base's bits depend on the CPU's kernels. The validation-target rule picks the same kind of checkpoint
everywhere (the first SFT step whose held-out accuracy reaches the target), not the same weights, and the leaderboard
groups runs by the base's weight hash. Without the base itself, a published row can only be extended on the CPU kind
that trained it.

A bundle's `bases/<backbone>-<task>-<scale>-<recipe digest>/` holds `base.json` (recipe key, identity, SFT losses) and
`model/` (weights, ~3 MB at tiny scale); the base's cached evaluations stay behind (the ingesting machine evaluates
it again). `ingest` verifies every base (`base_cache.base_weights_hash`: the weights against base.json's hash, the
name against its recipe key) before anything is written, then installs it in the base cache, where every
reproduction of that recipe finds it. A different base already cached for the same recipe (one trained on this
machine) is kept, and the ingest says so.

    dare-bench export --bundle results/mine --scale tiny --reproduction '*-sdar-arith' --bases
    dare-bench ingest results/mine --db grid.db        # runs + bases; then `dare-bench sweep ... --db grid.db`

    from dare_bench.pipeline.shared_bases import bases_of_runs, bundle_bases, install_bases, write_bases
    write_bases(bases_of_runs(runs), "results/mine")     # the runs' cached bases -> results/mine/bases/
    install_bases(bundle_bases("results/mine"))          # verified -> DARE_BENCH_HOME/bases/
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from dare_bench.errors import DataError
from dare_bench.fileio import atomic_directory, dare_bench_home
from dare_bench.pipeline.base_cache import BASE_RECIPE_VERSION, base_weights_hash, cached_bases, recorded_weights_hash
from dare_bench.store.records import BASES_DIR


def bases_of_runs(runs: list[dict[str, Any]]) -> list[Path]:
    """The cached directory of every distinct base the runs (store run dicts) started from; paper runs have none.
    A base missing from this machine's cache is a DataError naming it and a run that used it."""
    cached = cached_bases()
    wanted = {r["base_sha256"]: r["reproduction"] for r in runs if r.get("base_sha256")}
    missing = {sha: name for sha, name in wanted.items() if sha not in cached}
    if missing:
        listed = ", ".join(f"{sha[:12]} ({name})" for sha, name in sorted(missing.items()))
        raise DataError(f"--bases: {len(missing)} base(s) the selected runs started from are not in this machine's "
                        f"base cache ({dare_bench_home() / 'bases'}): {listed}; select other runs or export without "
                        "--bases")
    return sorted({cached[sha] for sha in wanted})


def _copy_base(src: Path, dest: Path) -> None:
    """A base's record and weights, replacing `dest` atomically."""
    with atomic_directory(dest) as tmp:
        shutil.copy2(src / "base.json", tmp / "base.json")
        shutil.copytree(src / "model", tmp / "model")


def write_bases(base_dirs: list[Path], bundle: str | Path) -> list[Path]:
    """Copy cached bases into `<bundle>/bases/`; returns the written directories."""
    out = [Path(bundle) / BASES_DIR / src.name for src in base_dirs]
    for src, dest in zip(base_dirs, out):
        _copy_base(src, dest)
    return out


def bundle_bases(bundle: str | Path) -> list[tuple[Path, str]]:
    """The bases a bundle carries (`<bundle>/**/bases/<name>/`; none for a single result file), each verified:
    [(directory, weight hash)]. One edited, renamed or corrupt base is a DataError naming it."""
    bundle = Path(bundle)
    if not bundle.is_dir():
        return []
    found = sorted(p.parent for p in bundle.rglob(f"{BASES_DIR}/*/base.json") if not p.parent.name.startswith("."))
    return [(d, base_weights_hash(d)) for d in found]


def bundle_base_hashes(bundles: list[str | Path]) -> set[str]:
    """The weight hashes of the bases the bundles carry, as their base.json records them (not verified: what a
    report says ships; `bundle_bases` verifies before installing)."""
    hashes = {recorded_weights_hash(record.parent) for bundle in map(Path, bundles) if bundle.is_dir()
              for record in bundle.rglob(f"{BASES_DIR}/*/base.json")}
    return hashes - {None}  # an unreadable record: `ingest` names it when it verifies the bundle


def install_bases(bases: list[tuple[Path, str]], home: Path | None = None) -> dict[str, list[str]]:
    """Copy verified bundle bases into the base cache. A base already cached is left alone; so is a different base
    cached under the same recipe (this machine's own: `kept`), and one trained by another `BASE_RECIPE_VERSION`
    (`stale`: this dare-bench would never look it up). Returns {"installed", "present", "kept", "stale"}: names."""
    root = (home or dare_bench_home()) / "bases"
    out: dict[str, list[str]] = {"installed": [], "present": [], "kept": [], "stale": []}
    for src, sha in bases:
        dest = root / src.name
        if json.loads((src / "base.json").read_text())["key"].get("version") != BASE_RECIPE_VERSION:
            out["stale"].append(src.name)  # built by other base-training code: no recipe of this dare-bench finds it
            continue
        if (dest / "base.json").exists():  # no recorded hash: cached before identities were, this machine's own
            out["present" if recorded_weights_hash(dest) == sha else "kept"].append(src.name)
            continue
        _copy_base(src, dest)
        out["installed"].append(src.name)
    return out


__all__ = ["bases_of_runs", "bundle_base_hashes", "bundle_bases", "install_bases", "write_bases"]
