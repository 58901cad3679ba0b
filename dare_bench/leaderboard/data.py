"""Read-only queries behind the leaderboard (no Streamlit here, so every query is unit-testable).

    from dare_bench.leaderboard.data import open_reader, winners
    engine = open_reader("sqlite:///results.db")        # refuses to create, migrate or write anything
    cells = winners(engine, backbone="llada", scale="micro")

Every query aggregates or pages in SQL: with 10,000 runs and 1,000,000 metric rows the app must never pull whole
tables into pandas. Scores: the "final" evaluation of each finished run (the pipeline writes a "base" and a "final"
one); baseline runs are the algorithm "baseline". Our accuracies are fractions (0..1) while published numbers are
percentages, so comparisons go through `to_percent`, which says what it did.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import QueuePool

from dare_bench.config import FRACTION_METRICS, to_percent  # noqa: F401 - part of this module's API
from dare_bench.errors import StoreError
from dare_bench.store.engine import READ_ONLY, resolve_url
from dare_bench.store.models import HEAD, REVISIONS

CURVE_COLUMNS = ("reward_mean", "reward_std", "loss", "kl", "entropy", "tokens_per_forward", "peak_memory_mb")
MAX_CURVE_POINTS = 400
SAMPLE_PAGE = 25
# Metrics stored as fractions of 1 by the evaluator and published as percentages.

# Two-sided 95 % Student t quantiles for df = 1..30; beyond that the normal 1.96 is within 2 %.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t95(df: int) -> float:
    return _T95[df - 1] if 1 <= df <= len(_T95) else 1.96


# ----------------------------------------------------------------------------------------------- opening


def open_reader(url: str | None = None) -> Engine:
    """A read-only engine on a dare-bench database at schema HEAD; StoreError (one line) otherwise.

    Unlike `Store(url)`, this never creates a missing SQLite file nor migrates an old schema: the leaderboard
    only looks.
    """
    url = database_target(url)
    bare_path = "://" not in url  # kept apart from URL parsing: a file name may hold '?' or '#'
    try:
        parsed = make_url("sqlite://" if bare_path else url)
    except Exception as exc:  # noqa: BLE001 - any malformed URL is one user error
        raise StoreError(f"cannot parse database URL {url!r}: {exc}") from None
    if parsed.get_backend_name() == "sqlite":
        path = url if bare_path else (parsed.database or "")
        if not path or path == ":memory:":
            raise StoreError("the leaderboard needs a database file, not an in-memory SQLite database")
        if not Path(path).is_file():
            raise StoreError(f"no database at {path} (run `dare-bench reproduce NAME --db {path}` to create one)")
        # mode=ro: SQLite itself refuses writes, and WAL readers take no lock a writer could wait on.
        # Connect by hand: through a SQLAlchemy URL a '?', '#' or '%' in the file name would be re-parsed.
        uri = f"file:{quote(str(Path(path).resolve()))}?mode=ro"

        def _connect() -> sqlite3.Connection:
            conn = sqlite3.connect(uri, uri=True, timeout=60, check_same_thread=False)
            conn.execute("PRAGMA query_only=ON")
            return conn

        # A real pool: Streamlit serves each browser session from its own thread.
        engine = create_engine("sqlite://", creator=_connect, poolclass=QueuePool)
    else:
        try:
            engine = create_engine(url, pool_pre_ping=True)
        except (SQLAlchemyError, ValueError, ImportError) as exc:
            raise StoreError(f"cannot open database {parsed.render_as_string(hide_password=True)}: {exc}") from None
    engine = engine.execution_options(**{READ_ONLY: True})
    shown = url if bare_path else parsed.render_as_string(hide_password=True)
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            if "alembic_version" not in tables or "runs" not in tables:
                raise StoreError(f"{shown} is not a dare-bench results database (tables: {sorted(tables)[:5]})")
            revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except StoreError:
        engine.dispose()
        raise
    except SQLAlchemyError as exc:
        engine.dispose()
        reason = str(getattr(exc, "orig", exc)).splitlines()[0]
        raise StoreError(f"cannot read database {shown}: {reason} (not an SQLite database, or unreachable?)") from None
    if revision != HEAD:
        engine.dispose()
        if revision in REVISIONS:
            raise StoreError(f"database {shown} has the older schema {revision!r}; upgrade it once with "
                             f"`dare-bench runs --db {url}` (the leaderboard never writes)")
        raise StoreError(f"database {shown} has schema {revision!r}, unknown to this dare-bench (latest {HEAD!r})")
    return engine


def _df(engine: Engine, sql: str, **params: Any) -> pd.DataFrame:
    with engine.connect() as conn:
        result = conn.execute(text(sql), params)
        return pd.DataFrame(result.fetchall(), columns=list(result.keys()))


# -------------------------------------------------------------------------------------------- overview


def overview(engine: Engine) -> dict[str, Any]:
    """Counts and the distinct filter values (one GROUP BY over runs)."""
    df = _df(engine, "SELECT backbone, task, algorithm, scale, status, COUNT(*) AS n FROM runs "
                     "GROUP BY backbone, task, algorithm, scale, status")
    finished = df[df["status"] == "finished"] if len(df) else df
    values = lambda col: sorted(finished[col].unique().tolist()) if len(finished) else []  # noqa: E731
    return {
        "runs": int(df["n"].sum()) if len(df) else 0,
        "finished": int(finished["n"].sum()) if len(finished) else 0,
        "by_status": {s: int(n) for s, n in df.groupby("status")["n"].sum().items()} if len(df) else {},
        # Most-run backbone first: it is the one the page opens on.
        "backbones": (finished.groupby("backbone")["n"].sum().sort_values(ascending=False, kind="stable")
                      .index.tolist() if len(finished) else []),
        "tasks": values("task"), "algorithms": values("algorithm"),
        "scales": values("scale"),
    }


def scales_for(engine: Engine, backbone: str) -> list[str]:
    df = _df(engine, "SELECT DISTINCT scale FROM runs WHERE status = 'finished' AND backbone = :b", b=backbone)
    order = {"paper": 0, "official": 1, "tiny": 2, "micro": 3}
    return sorted(df["scale"].tolist(), key=lambda s: (order.get(s, 9), s))


def facets(engine: Engine, backbone: str, scale: str) -> dict[str, list[str]]:
    """Tasks and algorithms with finished runs of this backbone at this scale: the filter choices."""
    df = _df(engine, "SELECT DISTINCT task, algorithm FROM runs WHERE status = 'finished' AND backbone = :b "
                     "AND scale = :s", b=backbone, s=scale)
    return {"tasks": sorted(df["task"].unique().tolist()), "algorithms": sorted(df["algorithm"].unique().tolist())}


# ---------------------------------------------------------------------------------------------- winners

# The latest "final" evaluation per (run, task): a run re-evaluated later counts once, with its newest score.
_FINALS = """
    SELECT e.run_id, e.task, MAX(e.id) AS eval_id FROM evaluations e JOIN runs r ON r.id = e.run_id
    WHERE e.checkpoint = 'final' AND r.status = 'finished' AND r.backbone = :backbone AND r.scale = :scale
      AND r.algorithm != 'released' AND r.control_of IS NULL
      {modified}
    GROUP BY e.run_id, e.task
"""


# The run's latest "base" evaluation of the same task (the SFT base it started from), beside a `_FINALS` row `f`.
_BASE_VALUE = """(SELECT eb.primary_value FROM evaluations eb WHERE eb.run_id = r.id AND eb.checkpoint = 'base'
                  AND eb.task = f.task ORDER BY eb.id DESC LIMIT 1)"""


def _modified_clause(engine: Engine, include_modified: bool) -> str:
    """Only the registry's pinned recipes, unless `include_modified`: no run with key=value overrides, and no run
    of a superseded config (`superseded_hashes`)."""
    if include_modified:
        return ""
    stale = superseded_hashes(engine)
    return "AND r.modified = 0" + (f" AND r.config_hash NOT IN ({_sql_list(stale)})" if stale else "")


def _sql_list(hashes: frozenset[str]) -> str:
    """`superseded_hashes` as an SQL list (hex strings only, so quoting them is safe)."""
    return ", ".join(map(repr, sorted(hashes)))


_HEX64 = re.compile(r"[0-9a-f]{64}")
# config hash -> superseded or not: a config hash fixes its config (ingest recomputes it), so a verdict holds for the
# process's life (the registry does not change under it)
_VERDICTS: dict[str, bool] = {}


@functools.lru_cache(maxsize=4096)
def registry_recipe(reproduction: str, scale: str, overrides_json: str) -> str | None:
    """The recipe hash (`RunConfig.recipe_hash`: the config without its data fingerprints) this registry resolves
    today for a reproduction at a scale with these overrides; None where it cannot say (an entry or a scale it
    lacks, an override it no longer takes)."""
    from dare_bench.errors import DareBenchError
    from dare_bench.registry import get

    try:
        return get(reproduction).resolve(scale, json.loads(overrides_json)).recipe_hash
    except (DareBenchError, ValueError):
        return None


def _superseded(config_json: str, reproduction: str, scale: str, overrides_json: str) -> bool:
    from dare_bench.config import RunConfig
    from dare_bench.errors import DareBenchError

    now = registry_recipe(reproduction, scale, overrides_json)
    if now is None:
        return False
    try:
        return RunConfig.from_dict(json.loads(config_json)).recipe_hash != now
    except (DareBenchError, ValueError):  # a record this dare-bench cannot read back says nothing either way
        return False


def superseded_runs(engine: Engine, *, scale: str) -> dict[str, int]:
    """Finished runs at `scale` of superseded configs, per reproduction (what the winners table says it left out)."""
    stale = superseded_hashes(engine)
    if not stale:
        return {}
    df = _df(engine, f"""SELECT reproduction, COUNT(*) AS n FROM runs WHERE status = 'finished' AND scale = :scale
                          AND config_hash IN ({_sql_list(stale)}) GROUP BY reproduction""", scale=scale)
    return {r.reproduction: int(r.n) for r in df.itertuples()}


def superseded_hashes(engine: Engine) -> frozenset[str]:
    """Config hashes of stored runs whose reproduction the registry now resolves to another recipe: its pinned
    config changed after they ran (e.g. the LLaDA2 replica's training block, session 36). Compared without the data
    fingerprints, so runs on DARE's parquet files and on the task's generator are judged alike. Such runs stay in
    the store, in bundles and on the run pages; the winners and every comparison leave them out, as they leave out
    modified runs. A run the registry cannot resolve here keeps its place (nothing says it is stale)."""
    hashes = _df(engine, "SELECT config_hash, MIN(id) AS run_id FROM runs GROUP BY config_hash")
    unseen = [int(r.run_id) for r in hashes.itertuples() if r.config_hash not in _VERDICTS]
    for i in range(0, len(unseen), 500):
        ids = ", ".join(str(x) for x in unseen[i:i + 500])
        rows = _df(engine, "SELECT config_hash, config_json, reproduction, scale, overrides_json FROM runs "
                           f"WHERE id IN ({ids})")
        for r in rows.itertuples():
            _VERDICTS[r.config_hash] = _superseded(r.config_json, r.reproduction, r.scale, r.overrides_json)
    # only hex hashes go into the SQL (ingest recomputes every one, so a real run's always is)
    return frozenset(h for h in hashes["config_hash"] if _VERDICTS.get(h) and _HEX64.fullmatch(h or ""))


def winners(engine: Engine, *, backbone: str, scale: str, tasks: list[str] | None = None,
            algorithms: list[str] | None = None, include_modified: bool = False) -> pd.DataFrame:
    """One row per (algorithm, task, metric, base): n runs, mean, 95 % CI half-width over runs (seeds), and `best`.

    Aggregated in SQL (count, mean, mean of squares); only one backbone and ONE scale per call, so scales are
    never mixed. Runs that started from different tiny bases (`runs.base_sha256`) are different groups: `group` is
    the task, or "task @ <base hash>" where a task has runs on several bases, and `best` marks the highest mean per
    (group, metric) among its contenders: the entries with several runs, or all entries where none has; ties all win.
    """
    sql = f"""
        SELECT r.algorithm AS algorithm, f.task AS task, e.primary_metric AS metric,
               COALESCE(r.base_sha256, '') AS base, COUNT(*) AS n,
               AVG(e.primary_value) AS mean, AVG(e.primary_value * e.primary_value) AS mean_sq,
               MIN(e.primary_value) AS min, MAX(e.primary_value) AS max, COUNT(DISTINCT r.seed) AS seeds,
               MAX(r.id) AS latest_run
        FROM ({_FINALS.format(modified=_modified_clause(engine, include_modified))}) f
        JOIN evaluations e ON e.id = f.eval_id JOIN runs r ON r.id = f.run_id
        GROUP BY r.algorithm, f.task, e.primary_metric, COALESCE(r.base_sha256, '')
    """
    df = _df(engine, sql, backbone=backbone, scale=scale)
    if tasks:
        df = df[df["task"].isin(tasks)]
    if algorithms:
        df = df[df["algorithm"].isin(algorithms)]
    df = df.reset_index(drop=True)
    if df.empty:
        return df.assign(group=[], std=[], ci95=[], best=[], vs_base=[], vs_base_ci95=[], vs_control=[],
                         vs_control_ci95=[], controls=[])
    several = df.groupby("task")["base"].nunique().gt(1)
    df["group"] = [f"{t} @ {b[:8] or 'no base record'}" if several[t] else t for t, b in zip(df["task"], df["base"])]
    n = df["n"].astype(float)
    var = ((df["mean_sq"] - df["mean"] ** 2).clip(lower=0.0) * n / (n - 1).where(n > 1)).fillna(0.0)
    df["std"] = var.pow(0.5).where(n > 1)
    df["ci95"] = [t95(int(k) - 1) * s / math.sqrt(k) if k > 1 else float("nan") for k, s in zip(df["n"], df["std"])]
    contender = _contenders(df)
    top = df["mean"].where(contender).groupby([df["group"], df["metric"]]).transform("max")
    df["best"] = contender & ((df["mean"] - top).abs() <= 1e-12)
    df = df.merge(_gains(engine, backbone, scale, include_modified), on=["algorithm", "task", "metric", "base"],
                  how="left")
    return df.drop(columns=["mean_sq"]).sort_values(["group", "mean"], ascending=[True, False]).reset_index(drop=True)


def _contenders(cells: pd.DataFrame) -> pd.Series:
    """Which cells race for the win. One run has no interval, so it cannot stand against entries with several:
    where a (group, metric) has any entry with n > 1, only those contend; where none has, all do."""
    replicated = cells["n"] > 1
    return replicated | ~replicated.groupby([cells["group"], cells["metric"]]).transform("any")


def _mean_ci(values: pd.Series) -> tuple[float, float, int]:
    v = values.dropna().astype(float)
    k = len(v)
    if not k:
        return float("nan"), float("nan"), 0
    ci = t95(k - 1) * float(v.std(ddof=1)) / math.sqrt(k) if k > 1 else float("nan")
    return float(v.mean()), ci, k


def _gains(engine: Engine, backbone: str, scale: str, include_modified: bool) -> pd.DataFrame:
    """Per (algorithm, task, metric, base): the mean and 95 % CI over runs of final - base (`vs_base`) and of
    final - its compute-matched SFT control's final (`vs_control`, over the runs that have a finished control on
    the same base; `controls` = how many)."""
    sql = f"""
        SELECT r.algorithm AS algorithm, f.task AS task, e.primary_metric AS metric,
               COALESCE(r.base_sha256, '') AS base, e.primary_value AS final,
               {_BASE_VALUE} AS base_value,
               (SELECT ec.primary_value FROM runs c JOIN evaluations ec ON ec.run_id = c.id
                WHERE c.control_of = r.uid AND c.status = 'finished' AND ec.checkpoint = 'final'
                  AND ec.task = f.task AND COALESCE(c.base_sha256, '') = COALESCE(r.base_sha256, '')
                ORDER BY ec.id DESC LIMIT 1) AS control_value
        FROM ({_FINALS.format(modified=_modified_clause(engine, include_modified))}) f
        JOIN evaluations e ON e.id = f.eval_id JOIN runs r ON r.id = f.run_id
    """
    runs = _df(engine, sql, backbone=backbone, scale=scale)
    rows = []
    for key, g in runs.groupby(["algorithm", "task", "metric", "base"]):
        vs_base = _mean_ci(g["final"] - g["base_value"])
        vs_control = _mean_ci(g["final"] - g["control_value"])
        rows.append({**dict(zip(["algorithm", "task", "metric", "base"], key)), "vs_base": vs_base[0],
                     "vs_base_ci95": vs_base[1], "vs_control": vs_control[0], "vs_control_ci95": vs_control[1],
                     "controls": vs_control[2]})
    return pd.DataFrame(rows, columns=["algorithm", "task", "metric", "base", "vs_base", "vs_base_ci95",
                                       "vs_control", "vs_control_ci95", "controls"])


def winner_matrix(cells: pd.DataFrame) -> pd.DataFrame:
    """algorithm × task text matrix: "0.412 ± 0.031 (n=3)"; the winner of each column is starred. A task with runs
    on several bases has a column per base (`winners`' `group`)."""
    if cells.empty:
        return pd.DataFrame()
    multi = cells.groupby("group")["metric"].nunique().gt(1)
    col = cells.apply(lambda r: f"{r.group} ({r.metric})" if multi.get(r.group, False) else r.group, axis=1)

    def fmt(r: pd.Series) -> str:
        ci = f" ± {r.ci95:.3f}" if r.n > 1 and not math.isnan(r.ci95) else ""
        return f"{'★ ' if r.best else ''}{r['mean']:.3f}{ci} (n={int(r.n)})"

    out = cells.assign(column=col, cell=cells.apply(fmt, axis=1)).pivot(index="algorithm", columns="column",
                                                                         values="cell")
    out.columns.name = None
    return out.fillna("no run")


def gain_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Per cell: "final - base" and "final - compute-matched SFT control" as "+0.031 ± 0.012" (95 % CI over runs;
    "no control" where no run of the cell has one). The control column says whether RL beat spending the same
    compute on more SFT from the same base (pipeline/control.py)."""
    def fmt(mean: float, ci: float) -> str:
        if mean != mean:  # NaN
            return "no control"
        return f"{mean:+.3f}" + (f" ± {ci:.3f}" if ci == ci else "")

    rows = [{"algorithm": r.algorithm, "task": r.group, "metric": r.metric,
             "final - base": fmt(r.vs_base, r.vs_base_ci95),
             "final - SFT control": fmt(r.vs_control, r.vs_control_ci95), "controls": int(r.controls or 0)}
            for r in cells.itertuples() if r.algorithm != "baseline"]
    return pd.DataFrame(rows, columns=["algorithm", "task", "metric", "final - base", "final - SFT control",
                                       "controls"])


def task_winners(cells: pd.DataFrame) -> dict[str, list[str]]:
    """task (or "task @ base" where a task has several bases) -> the algorithm(s) with the best mean."""
    if cells.empty:
        return {}
    return {t: sorted(g.loc[g["best"], "algorithm"]) for t, g in cells.groupby("group")}


# ------------------------------------------------------------------------------------------------ overview


def base_machines(engine: Engine, *, scale: str) -> dict[str, str]:
    """Per tiny base (full weight hash): the CPU that trained it, e.g. "AMD EPYC (AuthenticAMD family 25 model 1
    stepping 1, AVX2)". A base's bits depend on the CPU's kernels, so this says why a task has several bases
    (`winners`' "task @ hash" groups). The base's identity names that CPU (`trained_on`); a base recorded before it
    did gets the CPU of its earliest run, and a record made before the family / ISA were kept gives the name."""
    sql = """
        SELECT base_sha256 AS base, base_json AS identity, hardware_json AS hardware FROM runs
        WHERE scale = :scale AND base_sha256 IS NOT NULL ORDER BY started_at, id
    """
    machines: dict[str, str] = {}
    for row in _df(engine, sql, scale=scale).itertuples():
        if row.base in machines:
            continue  # a later run of the same base: possibly another machine that used a shared base
        hw = json.loads(row.identity or "{}").get("trained_on") or json.loads(row.hardware or "{}")
        detail = ", ".join(str(hw[k]) for k in ("cpu_id", "cpu_isa") if hw.get(k))
        machines[row.base] = str(hw.get("cpu") or "unknown CPU") + (f" ({detail})" if detail else "")
    return machines


def winners_overview(engine: Engine, *, scale: str, include_modified: bool = False) -> pd.DataFrame:
    """The question at a glance, one row per backbone x task (x base group): the best algorithm (baseline and
    released checkpoints left out of the race), the runner-up, the margin, and whether their 95 % CIs separate
    ("yes" / "no"; "n/a" where either has one run, so no interval). Entries with one run enter the race only where
    no entry of the row has several.

    Algorithms with exactly the best mean share the win: the winner is the first of them by name, `tied_with`
    lists the others, and the runner-up is the best algorithm below the tie (a margin of +0.000 over a co-winner
    would say nothing)."""
    rows = []
    for backbone in facets_backbones(engine, scale):
        cells = winners(engine, backbone=backbone, scale=scale, include_modified=include_modified)
        cells = cells[cells["algorithm"] != "baseline"]
        cells = cells[_contenders(cells)]  # decided without the baseline, which is not in this race
        for (group, metric), g in cells.groupby(["group", "metric"]):
            g = g.sort_values(["mean", "algorithm"], ascending=[False, True], kind="stable")
            top = g.iloc[0]
            # equal means come from equal solve counts on one test split: compare with a tolerance for the float
            tied = g[(top["mean"] - g["mean"]).abs() <= 1e-9]
            below = g.iloc[len(tied):]
            row = {"backbone": backbone, "task": group, "metric": metric, "winner": top.algorithm,
                   "tied_with": list(tied["algorithm"].iloc[1:]),
                   "mean": top["mean"], "ci95": top.ci95, "n": int(top.n), "runner_up": None, "margin": None,
                   "separated": "n/a"}
            if len(below):
                second = below.iloc[0]
                row.update(runner_up=second.algorithm, margin=float(top["mean"] - second["mean"]))
                if top.ci95 == top.ci95 and second.ci95 == second.ci95:  # both have an interval (n > 1)
                    separated = top["mean"] - top.ci95 > second["mean"] + second.ci95
                    row["separated"] = "yes" if separated else "no"
            rows.append(row)
    return pd.DataFrame(rows, columns=["backbone", "task", "metric", "winner", "tied_with", "mean", "ci95", "n",
                                       "runner_up", "margin", "separated"])


def facets_backbones(engine: Engine, scale: str) -> list[str]:
    """Backbones with finished runs at `scale`."""
    df = _df(engine, "SELECT DISTINCT backbone FROM runs WHERE status = 'finished' AND scale = :s", s=scale)
    return sorted(df["backbone"].tolist())


# ------------------------------------------------------------------------------------------------ stability


def seed_bands(engine: Engine, *, backbone: str, task: str, scale: str, metric: str = "reward_mean",
               include_modified: bool = False) -> pd.DataFrame:
    """Per algorithm and step: the mean of `metric` over its runs (seeds), the band mean ± std, and the runs behind
    it (DARE's stability plots)."""
    if metric not in CURVE_COLUMNS:
        raise ValueError(f"unknown curve metric {metric!r}")
    sql = f"""
        SELECT r.algorithm AS algorithm, m.step AS step, AVG(m.{metric}) AS mean,
               AVG(m.{metric} * m.{metric}) AS mean_sq, COUNT(m.{metric}) AS runs
        FROM step_metrics m JOIN runs r ON r.id = m.run_id
        WHERE r.status = 'finished' AND r.backbone = :backbone AND r.task = :task AND r.scale = :scale
          AND r.control_of IS NULL {_modified_clause(engine, include_modified)}
        GROUP BY r.algorithm, m.step HAVING COUNT(m.{metric}) > 0 ORDER BY r.algorithm, m.step
    """
    df = _df(engine, sql, backbone=backbone, task=task, scale=scale)
    n = df["runs"].astype(float)
    var = ((df["mean_sq"] - df["mean"] ** 2).clip(lower=0.0) * n / (n - 1).where(n > 1)).fillna(0.0)
    std = var.pow(0.5)
    return df.drop(columns=["mean_sq"]).assign(low=df["mean"] - std, high=df["mean"] + std)


def reward_collapses(engine: Engine, *, backbone: str, task: str, scale: str, drop: float = 0.2,
                     include_modified: bool = False) -> pd.DataFrame:
    """Runs whose reward fell from its running peak by more than `drop` (absolute reward) at some step: the step
    of the largest fall, the peak before it and the value there. A collapse flag, as in DARE's analysis."""
    sql = f"""
        SELECT r.id AS run_id, r.algorithm AS algorithm, r.seed AS seed, m.step AS step, m.reward_mean AS reward
        FROM step_metrics m JOIN runs r ON r.id = m.run_id
        WHERE r.status = 'finished' AND r.backbone = :backbone AND r.task = :task AND r.scale = :scale
          AND m.reward_mean IS NOT NULL {_modified_clause(engine, include_modified)}
        ORDER BY r.id, m.step
    """
    df = _df(engine, sql, backbone=backbone, task=task, scale=scale)
    rows = []
    for (run_id, algorithm, seed), g in df.groupby(["run_id", "algorithm", "seed"], sort=False):
        peak = g["reward"].cummax()
        fall = peak - g["reward"]
        worst = int(fall.to_numpy().argmax())
        if fall.iloc[worst] > drop:
            rows.append({"run_id": int(run_id), "algorithm": algorithm, "seed": int(seed),
                         "step": int(g["step"].iloc[worst]), "peak": float(peak.iloc[worst]),
                         "reward": float(g["reward"].iloc[worst]), "drop": float(fall.iloc[worst])})
    return pd.DataFrame(rows, columns=["run_id", "algorithm", "seed", "step", "peak", "reward", "drop"])


# the knobs that set how many masks an ELBO method draws per sequence (SPG: num_t, which wins over mc_samples)
MC_KNOBS = ("train.mc_samples", "train.algorithm.num_t")


def mc_sensitivity(engine: Engine, *, backbone: str, task: str, scale: str) -> pd.DataFrame:
    """The MC-sample sensitivity of the ELBO methods (DARE's analysis of BGPO / SPG): per algorithm, base and MC
    count (column `mc_samples`), the final score's mean and 95 % CI over runs (seeds) and its gain over the base.

    The count is the masks the plug-in draws per sequence: `train.algorithm.num_t` where the config sets it (SPG
    draws num_t and ignores an `mc_samples` of 1), else `train.mc_samples`. A sensitivity sweep changes that count
    alone, so this reads the pinned runs and the runs whose overrides touch only those two knobs
    (`dare-bench sweep bgpo-llada-sudoku --set train.mc_samples=8`; SPG: `--set train.algorithm.num_t=4 --set
    train.mc_samples=4`); a run with any other override would confound the comparison and is left out. Only
    (algorithm, base) pairs measured at two or more counts are returned; `pinned` marks the registry's count."""
    sql = f"""
        SELECT r.algorithm AS algorithm, COALESCE(r.base_sha256, '') AS base, r.modified AS modified,
               r.overrides_json AS overrides_json, r.config_json AS config_json, e.primary_metric AS metric,
               e.primary_value AS final,
               {_BASE_VALUE} AS base_value
        FROM ({_FINALS.format(modified='')}) f JOIN evaluations e ON e.id = f.eval_id JOIN runs r ON r.id = f.run_id
        WHERE f.task = :task
    """
    columns = ["algorithm", "base", "metric", "mc_samples", "pinned", "n", "mean", "ci95", "vs_base", "vs_base_ci95"]
    runs = _df(engine, sql, backbone=backbone, scale=scale, task=task)
    kept = []
    for row in runs.itertuples():
        overrides = json.loads(row.overrides_json or "[]")
        if any(not str(o).startswith(tuple(k + "=" for k in MC_KNOBS)) for o in overrides):
            continue
        train = json.loads(row.config_json or "{}").get("profile", {}).get("train", {})
        mc = (train.get("algorithm") or {}).get("num_t") or train.get("mc_samples")
        if mc is None:  # the algorithm takes no MC count (its plug-in default applies): nothing to vary
            continue
        kept.append({"algorithm": row.algorithm, "base": row.base, "metric": row.metric, "mc_samples": int(mc),
                     "pinned": not bool(row.modified), "final": row.final, "gain": row.final - row.base_value
                     if row.base_value is not None else float("nan")})
    rows = []
    for (algorithm, base, metric), g in pd.DataFrame(kept, columns=["algorithm", "base", "metric", "mc_samples",
                                                                    "pinned", "final", "gain"]).groupby(
            ["algorithm", "base", "metric"]):
        if g["mc_samples"].nunique() < 2:
            continue
        for mc, at in g.groupby("mc_samples"):
            mean, ci, n = _mean_ci(at["final"])
            gain, gain_ci, _ = _mean_ci(at["gain"])
            rows.append({"algorithm": algorithm, "base": base, "metric": metric, "mc_samples": int(mc),
                         "pinned": bool(at["pinned"].any()), "n": n, "mean": mean, "ci95": ci, "vs_base": gain,
                         "vs_base_ci95": gain_ci})
    return pd.DataFrame(rows, columns=columns).sort_values(["algorithm", "base", "mc_samples"]).reset_index(drop=True)


def accuracy_vs_tpf(engine: Engine, *, backbone: str, scale: str, include_modified: bool = False) -> pd.DataFrame:
    """Every final evaluation of this backbone and scale: its primary metric against tokens per forward (the
    hardware-independent speed / quality view of d3LLM's AUP leaderboard)."""
    sql = f"""
        SELECT r.id AS run_id, r.algorithm AS algorithm, e.task AS task, e.primary_metric AS metric,
               e.primary_value AS value, e.metrics_json AS metrics_json, e.sampler_preset AS sampler
        FROM evaluations e JOIN runs r ON r.id = e.run_id
        WHERE e.checkpoint = 'final' AND r.status = 'finished' AND r.backbone = :backbone AND r.scale = :scale
          {_modified_clause(engine, include_modified)}
    """
    df = _df(engine, sql, backbone=backbone, scale=scale)
    tpf = [json.loads(m or "{}").get("tokens_per_forward") for m in df["metrics_json"]]
    return df.drop(columns=["metrics_json"]).assign(tokens_per_forward=tpf).dropna(subset=["tokens_per_forward"])


# ----------------------------------------------------------------------------------- reported vs reproduced


def reported_scores(engine: Engine, backbone: str) -> tuple[pd.DataFrame, str]:
    """Published scores for a backbone: from the store's synced table, else straight from the registry YAMLs."""
    df = _df(engine, """
        SELECT algorithm, task, table_id AS "table", metric, value, source_kind, source_ref, source_table,
               source_file, source_commit, settings_json, note
        FROM reported_scores WHERE backbone = :b ORDER BY id""", b=backbone)
    if len(df):
        return df, "store"
    try:
        from dare_bench.registry import load_registry

        rows = [
            {"algorithm": spec.algorithm, "task": spec.task, "table": r.table, "metric": r.metric, "value": r.value,
             "source_kind": r.source.kind, "source_ref": r.source.ref, "source_table": r.source.table,
             "source_file": r.source.file, "source_commit": r.source.commit,
             "settings_json": json.dumps(r.settings, sort_keys=True), "note": r.note}
            for spec in load_registry() if spec.backbone == backbone for r in spec.reported
        ]
    except Exception:  # noqa: BLE001 - a broken registry must not take the leaderboard down
        return df, "none"
    return pd.DataFrame(rows, columns=df.columns), "registry"


def source_label(row: pd.Series) -> str:
    parts = [str(row["source_ref"])]
    if row.get("source_commit"):
        parts[0] += f"@{row['source_commit']}"
    for key in ("source_file", "source_table"):
        if row.get(key):
            parts.append(str(row[key]))
    return " · ".join(parts)


PAPER_SCALES = ("paper", "official")  # the scales a published number can be compared with


def reported_vs_reproduced(cells: pd.DataFrame, reported: pd.DataFrame, table: str | None,
                           scale: str | None = None) -> pd.DataFrame:
    """One row per (algorithm, task) known to either side and per setting the table reports for it (d1's Table 1
    gives one row per generation length): reported %, reproduced %, difference, source.

    Only rows of `table` are read (None: every table, for exports): two tables score under different settings.
    Matched on (algorithm, task), not on the metric's name: a reproduction's evaluation metric is by design the
    one its reported number measures, even where the names differ (DARE calls its sudoku mean score
    "accuracy"; we record it as "score"); both names are shown. A report with our metric's name wins over
    another of the same table and settings. Reproduced values are converted by `to_percent` (column `unit` says
    so); a cell with no run or no report says which is missing instead of showing a number. `scale`: the scale of
    `cells`; below paper scale (a tiny / micro replica on a CPU-learnable stand-in) a published number is not the
    same experiment, so such a cell shows both numbers but no difference, with status "not comparable (tiny
    replica)" (None: the caller does not say, differences are shown).
    """
    comparable = scale is None or scale in PAPER_SCALES
    rep = reported if table is None else reported[reported["table"] == table]
    rep = rep.rename(columns={"metric": "reported_metric"})
    ours = cells[["algorithm", "task", "metric", "n", "mean", "ci95"]] if len(cells) else pd.DataFrame(
        columns=["algorithm", "task", "metric", "n", "mean", "ci95"])
    merged = ours.merge(rep[["algorithm", "task", "reported_metric", "value", "table", "source_kind", "source_ref",
                             "source_table", "source_file", "source_commit", "settings_json", "note"]],
                        on=["algorithm", "task"], how="outer")
    same_name = (merged["metric"] == merged["reported_metric"]).astype(int)
    merged = (merged.assign(_same=same_name).sort_values("_same", ascending=False, kind="stable")
              .drop_duplicates(["algorithm", "task", "metric", "settings_json"], keep="first"))
    rows = []
    for _, r in merged.iterrows():
        has_run = not pd.isna(r["mean"])
        has_rep = not pd.isna(r["value"])
        metric = r["metric"] if has_run else r["reported_metric"]
        repro = to_percent(float(r["mean"]), metric) if has_run else None
        ci = to_percent(float(r["ci95"]), metric) if has_run and not pd.isna(r["ci95"]) else None
        rows.append({
            "algorithm": r["algorithm"], "task": r["task"], "metric": metric,
            "reported_metric": r["reported_metric"] if has_rep else "",
            "reported": float(r["value"]) if has_rep else None,
            "reproduced": repro, "ci95": ci, "runs": int(r["n"]) if has_run else 0,
            "difference": (repro - float(r["value"])) if has_run and has_rep and comparable else None,
            "status": (("ok" if comparable else f"not comparable ({scale} replica)") if has_run and has_rep
                       else ("no run" if has_rep else "no report")),
            "unit": "percent (ours ×100)" if metric in FRACTION_METRICS else "as stored",
            "source": source_label(r) if has_rep else "",
            "table": r["table"] if has_rep else "",
            "settings": r["settings_json"] if has_rep else "",
            "note": r["note"] if has_rep and isinstance(r["note"], str) else "",
        })
    out = pd.DataFrame(rows, columns=["algorithm", "task", "metric", "reported_metric", "reported", "reproduced",
                                      "ci95", "runs", "difference", "status", "unit", "source", "table", "settings",
                                      "note"])
    # Cells with both numbers first, then ours without a report, then reported cells we have not run.
    order = out["status"].map(lambda v: {"no report": 1, "no run": 2}.get(v, 0))
    # stable: the settings of one cell keep the source's order (128, 256, 512)
    return (out.assign(_o=order).sort_values(["_o", "task", "algorithm"], kind="stable").drop(columns="_o")
            .reset_index(drop=True))


# ------------------------------------------------------------------------------------------------ curves


def curves(engine: Engine, *, backbone: str, task: str, scale: str, algorithms: list[str] | None = None,
           include_modified: bool = False, max_points: int = MAX_CURVE_POINTS) -> pd.DataFrame:
    """Step metrics averaged over the runs of each algorithm, downsampled in SQL to <= max_points per algorithm.

    Steps are bucketed by integer division with one bucket width for the whole query, so each returned point is
    the mean over all runs and steps of one bucket; `runs` says how many runs fed it.
    """
    where = (f"r.status = 'finished' AND r.backbone = :backbone AND r.task = :task AND r.scale = :scale "
             f"{_modified_clause(engine, include_modified)}")
    params: dict[str, Any] = {"backbone": backbone, "task": task, "scale": scale}
    if algorithms:
        names = {f"a{i}": a for i, a in enumerate(algorithms)}
        where += f" AND r.algorithm IN ({', '.join(':' + k for k in names)})"
        params.update(names)
    with engine.connect() as conn:
        max_step = conn.execute(text(f"SELECT MAX(m.step) FROM step_metrics m JOIN runs r ON r.id = m.run_id "
                                     f"WHERE {where}"), params).scalar()
    if max_step is None:
        return pd.DataFrame(columns=["algorithm", "step", "runs", *CURVE_COLUMNS])
    width = max(1, math.ceil((max_step + 1) / max_points))
    aggs = ", ".join(f"AVG(m.{c}) AS {c}" for c in CURVE_COLUMNS)
    sql = f"""
        SELECT r.algorithm AS algorithm, m.step / :width AS bucket, AVG(m.step) AS step,
               COUNT(DISTINCT m.run_id) AS runs, {aggs}
        FROM step_metrics m JOIN runs r ON r.id = m.run_id
        WHERE {where}
        GROUP BY r.algorithm, m.step / :width ORDER BY r.algorithm, bucket
    """
    return _df(engine, sql, width=width, **params).drop(columns=["bucket"])


def run_curve(engine: Engine, run_id: int, max_points: int = MAX_CURVE_POINTS) -> pd.DataFrame:
    with engine.connect() as conn:
        max_step = conn.execute(text("SELECT MAX(step) FROM step_metrics WHERE run_id = :r"), {"r": run_id}).scalar()
    if max_step is None:
        return pd.DataFrame(columns=["step", *CURVE_COLUMNS])
    width = max(1, math.ceil((max_step + 1) / max_points))
    aggs = ", ".join(f"AVG({c}) AS {c}" for c in CURVE_COLUMNS)
    return _df(engine, f"SELECT AVG(step) AS step, {aggs} FROM step_metrics WHERE run_id = :r "
                       f"GROUP BY step / :w ORDER BY step / :w", r=run_id, w=width)


def stage_times(engine: Engine, *, backbone: str, task: str, scale: str, algorithms: list[str] | None = None,
                include_modified: bool = False) -> pd.DataFrame:
    """Mean seconds per run spent in each trainer stage (rollout, reward, ...), per algorithm.

    SQLite unpacks the per-step JSON with json_each inside the query; other backends get the same numbers from
    a row-limited scan.
    """
    where = (f"r.status = 'finished' AND r.backbone = :backbone AND r.task = :task AND r.scale = :scale "
             f"{_modified_clause(engine, include_modified)}")
    params: dict[str, Any] = {"backbone": backbone, "task": task, "scale": scale}
    if algorithms:
        names = {f"a{i}": a for i, a in enumerate(algorithms)}
        where += f" AND r.algorithm IN ({', '.join(':' + k for k in names)})"
        params.update(names)
    if engine.dialect.name == "sqlite":
        # Two spellings reach the store: {"stage_seconds": {...}} and the RL loop's extra `time_<stage>_s`
        # keys (whose `time_step_s` is the whole step, not a stage, so it is left out).
        sql = f"""
            SELECT algorithm, stage, SUM(seconds) / COUNT(DISTINCT run_id) AS seconds_per_run,
                   COUNT(DISTINCT run_id) AS runs
            FROM (
                SELECT r.algorithm AS algorithm, m.run_id AS run_id, j.key AS stage, j.value AS seconds
                FROM step_metrics m JOIN runs r ON r.id = m.run_id, json_each(m.stage_seconds_json) j
                WHERE {where} AND j.type IN ('real', 'integer')
                UNION ALL
                SELECT r.algorithm, m.run_id, substr(j.key, 6, length(j.key) - 7), j.value
                FROM step_metrics m JOIN runs r ON r.id = m.run_id, json_each(m.extra_json) j
                WHERE {where} AND j.key LIKE 'time\\_%\\_s' ESCAPE '\\' AND j.key != 'time_step_s'
                  AND j.type IN ('real', 'integer')
            ) GROUP BY algorithm, stage ORDER BY algorithm, stage
        """
        return _df(engine, sql, **params)
    raw = _df(engine, f"SELECT r.algorithm AS algorithm, m.run_id, m.stage_seconds_json, m.extra_json "
                      f"FROM step_metrics m JOIN runs r ON r.id = m.run_id WHERE {where} LIMIT 200000", **params)
    rows = []
    for a, rid, stages, extra in raw.itertuples(index=False):
        for k, v in json.loads(stages or "{}").items():
            rows.append((a, rid, k, v))
        for k, v in json.loads(extra or "{}").items():
            if k.startswith("time_") and k.endswith("_s") and k != "time_step_s":
                rows.append((a, rid, k[5:-2], v))
    flat = pd.DataFrame([r for r in rows if isinstance(r[3], (int, float))],
                        columns=["algorithm", "run_id", "stage", "seconds"])
    if flat.empty:
        return pd.DataFrame(columns=["algorithm", "stage", "seconds_per_run", "runs"])
    g = flat.groupby(["algorithm", "stage"])
    return pd.DataFrame({"seconds_per_run": g["seconds"].sum() / g["run_id"].nunique(),
                         "runs": g["run_id"].nunique()}).reset_index()


# --------------------------------------------------------------------------------------------- drill-down


def runs_page(engine: Engine, *, backbone: str, task: str, scale: str, algorithms: list[str] | None = None,
              include_modified: bool = False, limit: int = 200) -> pd.DataFrame:
    """The newest `limit` finished runs of one backbone × task × scale, with their final score."""
    where = (f"r.status = 'finished' AND r.backbone = :backbone AND r.task = :task AND r.scale = :scale "
             f"{_modified_clause(engine, include_modified)}")
    params: dict[str, Any] = {"backbone": backbone, "task": task, "scale": scale, "limit": int(limit)}
    if algorithms:
        names = {f"a{i}": a for i, a in enumerate(algorithms)}
        where += f" AND r.algorithm IN ({', '.join(':' + k for k in names)})"
        params.update(names)
    sql = f"""
        SELECT r.id AS run_id, r.algorithm, r.seed, r.reproduction, r.modified, r.config_hash, r.started_at,
               r.duration_s,
               (SELECT e.primary_value FROM evaluations e WHERE e.run_id = r.id AND e.checkpoint = 'final'
                ORDER BY e.id DESC LIMIT 1) AS final_score,
               (SELECT e.primary_value FROM evaluations e WHERE e.run_id = r.id AND e.checkpoint = 'base'
                ORDER BY e.id DESC LIMIT 1) AS base_score
        FROM runs r WHERE {where} ORDER BY r.id DESC LIMIT :limit
    """
    df = _df(engine, sql, **params)
    return df.assign(modified=df["modified"].astype(bool))  # SQLite hands booleans back as 0/1


def run_detail(engine: Engine, run_id: int) -> dict[str, Any] | None:
    """The run record (config, code version, packages, hardware, seed) and its evaluations (no samples)."""
    df = _df(engine, "SELECT * FROM runs WHERE id = :r", r=run_id)
    if df.empty:
        return None
    run = {k: (v.item() if hasattr(v, "item") else v) for k, v in df.iloc[0].to_dict().items()}  # numpy -> JSON
    run["modified"] = bool(run["modified"])  # SQLite hands booleans back as 0/1
    for key in ("config_json", "overrides_json", "packages_json", "hardware_json"):
        run[key.removesuffix("_json")] = json.loads(run.pop(key) or "null")
    evs = _df(engine, "SELECT id, task, split, data_fingerprint, sampler_preset, sampler_json, metrics_json, "
                      "primary_metric, primary_value, n_items, checkpoint, step, created_at FROM evaluations "
                      "WHERE run_id = :r ORDER BY id", r=run_id)
    evaluations = []
    for e in evs.to_dict("records"):
        e["sampler"] = json.loads(e.pop("sampler_json") or "{}")
        e["metrics"] = json.loads(e.pop("metrics_json") or "{}")
        evaluations.append(e)
    return {"run": run, "evaluations": evaluations}


def samples_page(engine: Engine, evaluation_id: int, *, page: int = 0, page_size: int = SAMPLE_PAGE,
                 only: str = "all") -> tuple[pd.DataFrame, int]:
    """One page of per-sample outputs with verdicts, and the number of matching samples.

    `only`: "all" | "correct" | "wrong".
    """
    cond = {"all": "", "correct": "AND correct = 1", "wrong": "AND (correct = 0 OR correct IS NULL)"}[only]
    with engine.connect() as conn:
        total = conn.execute(text(f"SELECT COUNT(*) FROM samples WHERE evaluation_id = :e {cond}"),
                             {"e": evaluation_id}).scalar() or 0
    df = _df(engine, f"SELECT idx, item_id, correct, score, prompt, completion, reference FROM samples "
                     f"WHERE evaluation_id = :e {cond} ORDER BY idx LIMIT :lim OFFSET :off",
             e=evaluation_id, lim=int(page_size), off=int(page) * int(page_size))
    if len(df):
        df["verdict"] = df["correct"].map(lambda c: "correct" if c == 1 else ("wrong" if c == 0 else "n/a"))
    return df, int(total)


def display_url(target: str) -> str:
    """The database for people to read: a path as is, a URL without its password."""
    if "://" not in target:
        return target
    try:
        return make_url(target).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - shown as given when it cannot be parsed (open_reader reports why)
        return target


def database_target(db: str | None = None) -> str:
    """`--db` value, else DARE_BENCH_DB, else the default database file; a bare path is made absolute, not a URL."""
    value = db or os.environ.get("DARE_BENCH_DB") or None
    if value and "://" not in value:
        return str(Path(value).expanduser().resolve())
    if value:
        return value
    default = resolve_url(None)
    return default.split(":///", 1)[1] if default.startswith("sqlite:///") else default


@dataclass(frozen=True)
class Selection:
    backbone: str
    scale: str
    tasks: tuple[str, ...] = ()
    algorithms: tuple[str, ...] = ()
    include_modified: bool = False


# ------------------------------------------------------------------------------- evaluation reproduction

# DARE's "Evaluation Result Reproduction" table: its columns (our backbone ids) and rows (our task ids; SDAR-8B's
# MATH row is MATH-500), top to bottom. Runs are those of the `released` reproductions (the pinned OpenCompass
# settings), never the algorithm comparison's baselines: the two tables score one checkpoint under two protocols.
EVAL_TABLE = "dare-eval-reproduction"
EVAL_COLUMNS = (("llada", "LLaDA-8B"), ("dream", "Dream-7B"), ("sdar", "SDAR-8B-Chat"), ("sdar30b", "SDAR-30B-A3B"),
                ("llada2", "LLaDA2.0-mini"), ("llada2.1", "LLaDA2.1-mini"))
EVAL_ROWS = (("mmlu", "MMLU"), ("mmlupro", "MMLU-Pro"), ("hellaswag", "HellaSwag"), ("arcc", "ARC-C"),
             ("gsm8k", "GSM8K"), ("math", "MATH"), ("gpqa", "GPQA"), ("aime2024", "AIME24"), ("aime2025", "AIME25"),
             ("olympiadbench", "OlympiadBench"), ("humaneval", "HumanEval"), ("mbpp", "MBPP"))
# the sampler settings that make one protocol variant of a cell (what the DARE maintainer chose by hand)
VARIANT_KEYS = ("gen_length", "block_length", "steps", "threshold", "temperature", "use_cache", "remasking_strategy",
                "editing_threshold", "convention")


def _row_of(task: str) -> str:
    return "math" if task == "math500" else task


def released_runs(engine: Engine, *, include_modified: bool = False) -> pd.DataFrame:
    """One row per finished paper-scale run of a `released` reproduction: its latest final evaluation, percent
    value, tokens per forward and the sampler settings that identify its protocol variant."""
    sql = f"""
        SELECT r.id AS run_id, r.backbone AS backbone, r.task AS task, r.modified AS modified, r.seed AS seed,
               e.primary_metric AS metric, e.primary_value AS value, e.metrics_json AS metrics_json,
               e.sampler_json AS sampler_json, e.n_items AS n_items
        FROM runs r JOIN evaluations e ON e.id = (
            SELECT MAX(e2.id) FROM evaluations e2 WHERE e2.run_id = r.id AND e2.checkpoint = 'final')
        WHERE r.status = 'finished' AND r.algorithm = 'released' AND r.scale = 'paper'
          {_modified_clause(engine, include_modified)}
        ORDER BY r.id"""
    df = _df(engine, sql)
    rows = []
    for _, r in df.iterrows():
        sampler = json.loads(r["sampler_json"] or "{}")
        metrics = json.loads(r["metrics_json"] or "{}")
        variant = {k: sampler[k] for k in VARIANT_KEYS if sampler.get(k) is not None}
        rows.append({"run_id": int(r["run_id"]), "backbone": r["backbone"], "task": r["task"],
                     "row": _row_of(r["task"]), "modified": bool(r["modified"]), "seed": int(r["seed"]),
                     "metric": r["metric"], "percent": to_percent(float(r["value"]), r["metric"]),
                     "tokens_per_forward": metrics.get("tokens_per_forward"), "n_items": int(r["n_items"]),
                     "variant": json.dumps(variant, sort_keys=True)})
    return pd.DataFrame(rows, columns=["run_id", "backbone", "task", "row", "modified", "seed", "metric", "percent",
                                       "tokens_per_forward", "n_items", "variant"])


def eval_reproduction(engine: Engine, *, include_modified: bool = False) -> pd.DataFrame:
    """The 12 x 6 table as long rows: per (benchmark row, backbone) DARE's reported value, ours (mean over the
    runs of the cell), the spread over the protocol variants that were run (min / max of the variants' means) and
    how many variants there are."""
    runs = released_runs(engine, include_modified=include_modified)
    reported = {}
    for backbone, _ in EVAL_COLUMNS:
        rep, _origin = reported_scores(engine, backbone)
        for _, r in rep[rep["table"] == EVAL_TABLE].iterrows():
            reported[(_row_of(r["task"]), backbone)] = float(r["value"])
    out = []
    for row, row_label in EVAL_ROWS:
        for backbone, column in EVAL_COLUMNS:
            cell = runs[(runs["row"] == row) & (runs["backbone"] == backbone)]
            variants = cell.groupby("variant")["percent"].mean() if len(cell) else pd.Series(dtype=float)
            ours = float(cell["percent"].mean()) if len(cell) else None
            rep = reported.get((row, backbone))
            out.append({"row": row, "benchmark": row_label, "backbone": backbone, "model": column,
                        "reported": rep, "ours": ours, "runs": int(len(cell)),
                        "difference": None if ours is None or rep is None else ours - rep,
                        "variants": int(len(variants)),
                        "spread_min": float(variants.min()) if len(variants) else None,
                        "spread_max": float(variants.max()) if len(variants) else None,
                        "tokens_per_forward": (float(cell["tokens_per_forward"].dropna().mean())
                                               if cell["tokens_per_forward"].notna().any() else None)})
    return pd.DataFrame(out)


def eval_reproduction_matrix(cells: pd.DataFrame) -> pd.DataFrame:
    """benchmark x model text matrix: "ours / reported" (percent), "— / reported" where no run exists, and the
    spread over protocol variants in brackets when more than one was run."""
    def text_of(r) -> str:
        rep = "—" if r["reported"] is None or pd.isna(r["reported"]) else f"{r['reported']:.2f}"
        if r["ours"] is None or pd.isna(r["ours"]):
            return f"— / {rep}"
        spread = (f" [{r['spread_min']:.2f}–{r['spread_max']:.2f}, {r['variants']} variants]"
                  if r["variants"] > 1 else "")
        return f"{r['ours']:.2f} / {rep}{spread}"

    if cells.empty:
        return pd.DataFrame()
    cells = cells.assign(text=[text_of(r) for _, r in cells.iterrows()])
    matrix = cells.pivot(index="benchmark", columns="model", values="text")
    return matrix.reindex(index=[label for _, label in EVAL_ROWS], columns=[label for _, label in EVAL_COLUMNS])
