"""`dare-bench check`: CI regression checks of scores against pinned baselines (dare_bench/reproductions/baselines/).

What it does: compares finished runs of reproductions with the baselines recorded for them and exits 0 when every
check holds, 1 when any score / curve moved beyond its statistical tolerance (or a run crashed), 2 when it could not
check (no baseline for a named reproduction, no matching run in the store, config hash mismatch, bad input). It
never records anything: a baseline changes only through `--record`, whose output is a reviewed diff.

    dare-bench check --run                                   # run every baselined micro reproduction, then compare
    dare-bench check sft-llada-sudoku d1-llada-sudoku --run --junit check.xml
    dare-bench check --db sqlite:///runs.db --json           # compare the latest matching runs already in the store
    dare-bench check --record sft-llada-sudoku --seeds 3     # (re-)record a baseline: 3 seeds, always afresh,
                                                             # keeping the overrides it pins (-o key=value: new ones)
    dare-bench check --record-gradients                      # (re-)record every algorithm's gradient snapshot
    git diff dare_bench/reproductions/baselines/             # review the recorded change before committing it

CPU only (micro / tiny scales run on CPU); one GPU or torchrun: not needed, the checks run the CPU scales.

`--run` and `--record` run in a fresh temporary DARE_BENCH_HOME (unless `--reuse-cache`): the cached SFT bases and
base evaluations are keyed by recipe, not by code, so reusing them would hide a change to the SFT loss, the model,
the sampler or the grader. Runs are forced (an identical finished run in the store is not reused), run on one torch
thread (`--threads`: the reduction order then does not depend on the machine's core count) with the overrides the
baseline pins (the committed micro baselines pin a 160-step base: the default 40-step micro base answers `333...`
to every puzzle, so every score, reward and RL gradient is 0 and nothing could regress), and land in the store
given by `--db` (default: the usual store).

What is compared (per reproduction): the final and the base evaluation's accuracy, score and mean_reward (the base
evaluation exercises the sampler and grader even when post-training moves nothing), and the logged step curves
reward_mean (RL) and loss (every trainer): the mean residual against the recorded mean curve, and the sign split of
the residuals. A micro base can score 0 accuracy on every item; score / mean_reward (continuous) and the curves
still move, which is why they are checked too.

Gradient snapshots (check/gradients.py, baselines/gradients.json): every trained algorithm's (each RL plug-in,
sft, lora, vrpo) loss, gradient norm and a 64-dim projection of its gradient on a pinned micro batch, compared on
every check (`--no-gradients` skips; `--record-gradients` re-records): a sign-flipped or rescaled loss moves no
micro score, but fails here.

The tolerance rule, and why:
* A baseline holds K >= 2 seeds of the same config (default 3). A check run on another machine differs from the
  recorded one by floating-point noise, which after sampling with temperature and a few optimizer steps acts at
  worst like another seed. So the null hypothesis is "the new run is one more draw from the recorded seeds'
  distribution", and its standard deviation about the recorded mean is sigma = s * sqrt(1 + 1/K) (prediction
  interval of one new draw given K; the 1/K term is the uncertainty of the recorded mean).
* s^2 = max(seed-to-seed variance of the metric, mean per-item variance / n). With K = 3 the seed variance is a
  poor estimate (and exactly 0 for a deterministic base evaluation); the item term is the binomial / bootstrap
  standard error of a mean over the n evaluated items, i.e. what resampling which items come out right does to the
  score. Taking the larger avoids counting the same noise twice (the seed spread already contains it).
* For 0/1 items (accuracy) the item variance is Laplace-smoothed, p~(1 - p~) with p~ = (x + 1)/(n + 2) (one
  pseudo-item of each outcome): a metric that is 0 (or 1) on every item still has a standard error, of about one
  item in n, so a perfectly deterministic baseline tolerates cross-machine flips of an item or two but not a real
  shift. Continuous items (score, mean_reward) use their sample variance (the bootstrap standard error), with the
  same Laplace floor only when every item has the same value. Curves get the per-step within-batch floor
  reward_std^2 / rollouts, and a numeric floor (1e-4 relative, 1e-6 absolute) for values that do not depend on the
  seed (e.g. a GRPO loss that is 0 by construction).
* Fail when |current - recorded mean| > z * sigma with z = Phi^-1(1 - alpha / 2m), m = the number of tests in this
  invocation (Bonferroni): the chance that *any* check of an unchanged tree fails is below alpha (`--alpha`,
  default 0.01), whatever the size of the CI set. Both directions fail: an unexplained rise is also a change to
  review (and to re-record).
* Curves: the mean residual over T steps is z-tested with sigma = sqrt(sum_t sigma_t^2 (1 + 1/K)) / T, and the
  number of steps above vs below the recorded mean is sign-tested (two-sided binomial, level alpha / m); with the
  3 steps of a micro run the sign test can never reject, at tiny scale (50 steps) it catches a curve that drifts
  consistently within the mean tolerance.

    from dare_bench.check import run_check
    report = run_check(["sft-llada-sudoku"], scale="micro", run=True)   # report["exit_code"], report["reproductions"]
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional

import typer

from dare_bench.errors import ConfigError, DareBenchError, print_error
from dare_bench.fileio import DB_HELP

# one copy of the thread pin: recording and checking at the same thread count keeps the reduction order independent
# of the machine's core count (and tiny models run as fast on one thread, without collapsing on shared cores)
from dare_bench.pipeline import pinned_threads  # re-exported: check's callers and tests use it

DEFAULT_ALPHA = 0.01
DEFAULT_SEEDS = 3
DEFAULT_THREADS = 1
EXIT = {"pass": 0, "fail": 1, "error": 2}

Log = Callable[[str], Any]


@contextlib.contextmanager
def fresh_home(enabled: bool) -> Iterator[None]:
    """A temporary DARE_BENCH_HOME for the duration (no cached base or base evaluation from older code)."""
    if not enabled:
        yield
        return
    old = os.environ.get("DARE_BENCH_HOME")
    with tempfile.TemporaryDirectory(prefix="dare-bench-check-") as tmp:
        os.environ["DARE_BENCH_HOME"] = tmp
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("DARE_BENCH_HOME", None)
            else:
                os.environ["DARE_BENCH_HOME"] = old


def _resolve_db(db: str | None) -> str:
    # Resolved before any home swap: the default store lives under the user's DARE_BENCH_HOME, not the temporary one.
    from dare_bench.store.engine import resolve_url

    return resolve_url(db)


def _config(name: str, scale: str, overrides=()):
    # The registry alone (no torch): comparing runs already in the store stays instant. With the data, as the
    # pipeline resolves it: the training data's fingerprints are part of the config hash.
    from dare_bench.registry import get

    return get(name).resolve(scale, list(overrides), with_data=True)


def base_group(doc: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """Whether the run started from the tiny base the baseline's runs did (weight hashes): "same", "other" (another
    machine's numerics or recipe built other weights: the scores are compared across bases, which the report says),
    or "unrecorded" (a baseline recorded before bases had identities)."""
    recorded = sorted({r.get("base_sha256") for r in doc.get("runs", []) if r.get("base_sha256")})
    now = current.get("base_sha256")
    group = "unrecorded" if not recorded or not now else ("same" if now in recorded else "other")
    return {"group": group, "baseline": recorded, "current": now}


def _environment_changes(doc: dict[str, Any]) -> dict[str, list]:
    """Tracked packages / CPU that differ from the recording: context for a failure, never a failure itself."""
    from dare_bench.store import environment

    now = environment.package_versions()
    recorded = doc.get("packages") or {}
    changes = {k: [recorded.get(k), now.get(k)] for k in sorted(set(recorded) | set(now))
               if k != "dare-bench" and recorded.get(k) != now.get(k)}
    recorded_hw, now_hw = doc.get("hardware") or {}, environment.hardware()
    for key in ("cpu", "cpu_id", "cpu_isa"):  # older recordings lack cpu_id / cpu_isa: nothing to compare
        if recorded_hw.get(key) and now_hw.get(key) and recorded_hw[key] != now_hw[key]:
            changes[key] = [recorded_hw[key], now_hw[key]]
    return changes


def _names(names: list[str], directory: Path, scale: str, gradients_only_ok: bool = False) -> list[str]:
    from dare_bench.check import baseline as bl

    if names:
        return list(dict.fromkeys(names))
    found = bl.available(directory, scale)
    if not found and not gradients_only_ok:
        raise DareBenchError(f"no baselines at scale {scale!r} in {directory}; record one with "
                             f"`dare-bench check --record NAME --scale {scale}`")
    return found


def _latest_run(store, name: str, scale: str, config_hash: str) -> tuple[int | None, str]:
    runs = store.find_runs(config_hash=config_hash)
    if runs:
        return runs[0]["id"], ""
    others = store.latest_runs(reproduction=name, scale=scale, status="finished", limit=1)
    if others:
        return None, (f"config hash mismatch: the latest finished {scale} run of {name} (run {others[0]['id']}) has "
                      f"config hash {others[0]['config_hash'][:12]}, the reproduction now resolves to "
                      f"{config_hash[:12]}; run it again (dare-bench check --run {name})")
    return None, f"missing run: no finished {scale} run of {name} in {store.url} (use --run)"


def run_check(names: list[str] | None = None, *, scale: str = "micro", db: str | None = None, run: bool = False,
              baselines: str | None = None, alpha: float = DEFAULT_ALPHA, reuse_cache: bool = False,
              threads: int | None = DEFAULT_THREADS, gradients: bool = True, log: Log = print) -> dict[str, Any]:
    """Check `names` (default: every reproduction with a baseline at `scale`) and, with `gradients`, every
    trained algorithm's gradient snapshot (baselines/gradients.json, see check/gradients.py); returns the JSON
    report."""
    from dare_bench.check import baseline as bl
    from dare_bench.check import compare as cmp
    from dare_bench.check import stats
    if not 0.0 < alpha < 1.0:
        raise ConfigError(f"--alpha must be in (0, 1), got {alpha}")
    started = time.perf_counter()
    directory = bl.baselines_directory(baselines)
    from dare_bench.check import gradients as gr

    names = _names(list(names or []), directory, scale, gradients and gr.path_in(directory).exists())
    docs = {}
    for name in names:
        _config(name, scale)  # an unknown reproduction or scale is bad input: one error before any work
        path = bl.baseline_path(directory, name, scale)
        if not path.exists():
            raise DareBenchError(f"{name}: no baseline at scale {scale!r} ({path}); record one with "
                                 f"`dare-bench check --record {name} --scale {scale}`")
        doc = bl.load(path)
        # The baseline's own overrides (e.g. a longer micro base) are part of what was recorded and checked.
        cfg = _config(name, scale, doc.get("overrides", []))
        docs[name] = (path, doc, cfg)
    m = sum(cmp.plan_checks(doc) for _, doc, _ in docs.values())
    z_crit = stats.bonferroni_z(alpha, m)
    alpha_each = alpha / max(1, m)
    url = _resolve_db(db)

    from dare_bench.store import Store

    entries = []
    with fresh_home(run and not reuse_cache), pinned_threads(threads if run else None):
        store = Store(url)
        for name, (path, doc, cfg) in docs.items():
            entry = {"name": name, "scale": scale, "baseline": str(path), "status": "error", "run_id": None,
                     "seed": None, "config_hash": None, "baseline_config_hash": doc["config_hash"],
                     "wall_seconds": None, "message": "", "checks": []}
            entries.append(entry)
            entry["environment_changes"] = _environment_changes(doc)
            entry["config_hash"] = cfg.content_hash
            if cfg.content_hash != doc["config_hash"]:
                entry["message"] = (f"config hash mismatch: baseline recorded for {doc['config_hash'][:12]}, {name} "
                                    f"now resolves to {cfg.content_hash[:12]}; review the config change, then "
                                    f"re-record (dare-bench check --record {name} --scale {scale})")
                continue
            if run:
                seed = int(doc.get("seeds", [doc["runs"][0]["seed"]])[0])
                t0 = time.perf_counter()
                try:
                    from dare_bench.pipeline import reproduce

                    log(f"check: running {name} [{scale}] seed {seed}")
                    result = reproduce(name, scale, seed=seed, db=url, force=True, progress=False, log=log,
                                       overrides=list(doc.get("overrides", [])))
                except DareBenchError as exc:
                    entry["message"] = f"could not run: {exc}"
                    continue
                except Exception as exc:  # a crash caused by the code under test is a regression, not bad input
                    entry.update(status="fail", message=f"the run crashed: {type(exc).__name__}: {exc}",
                                 wall_seconds=round(time.perf_counter() - t0, 2))
                    continue
                entry["wall_seconds"] = round(time.perf_counter() - t0, 2)
                run_id = result.run_id
            else:
                run_id, why = _latest_run(store, name, scale, cfg.content_hash)
                if run_id is None:
                    entry["message"] = why
                    continue
            current = bl.observe(store, run_id)
            entry.update(run_id=run_id, seed=current["seed"])
            if current.get("final") is None:
                entry.update(status="fail", message=f"run {run_id} has no final evaluation")
                continue
            entry["base"] = base_group(doc, current)
            entry["checks"] = cmp.compare(doc, current, z_crit, alpha_each)
            failed = [c["name"] for c in entry["checks"] if c["status"] != "pass"]
            entry["status"] = "fail" if failed else "pass"
            entry["message"] = ("moved beyond tolerance: " + ", ".join(failed)) if failed else ""
        store.close()
    grad_entries = []
    if gradients:
        with pinned_threads(threads):  # recorded at --threads (1): the same reduction order
            grad_entries = gr.check(directory, log=log)
    statuses = {e["status"] for e in entries + grad_entries}
    # A found regression is the more specific news: it wins over "could not check" for the exit code.
    overall = "fail" if "fail" in statuses else ("error" if "error" in statuses else "pass")
    return {"status": overall, "exit_code": EXIT[overall], "scale": scale, "alpha": alpha, "tests": m,
            "z_critical": z_crit, "run": run, "db": url, "wall_seconds": round(time.perf_counter() - started, 2),
            "reproductions": entries, "gradients": grad_entries}


def record_gradients(*, baselines: str | None = None, threads: int | None = DEFAULT_THREADS,
                     log: Log = print) -> Path:
    """Record every algorithm's gradient snapshot into <baselines>/gradients.json; returns its path."""
    from dare_bench.check import baseline as bl
    from dare_bench.check import gradients as gr

    path = gr.path_in(bl.baselines_directory(baselines))
    with pinned_threads(threads):
        doc = gr.record(log=log)
    gr.write(path, doc)
    log(f"recorded {path} ({len(doc['entries'])} snapshots); review it with `git diff {path}` before committing")
    return path


def record_baselines(names: list[str], *, scale: str = "micro", seeds: int = DEFAULT_SEEDS, db: str | None = None,
                     baselines: str | None = None, reuse_cache: bool = False, overrides: list[str] | None = None,
                     threads: int | None = DEFAULT_THREADS, log: Log = print) -> list[Path]:
    """Run each reproduction with `seeds` seeds and write its baseline file; returns the written paths."""
    from dare_bench.check import baseline as bl
    from dare_bench.pipeline import resolve

    if not names:
        raise DareBenchError("--record needs the reproductions to record, e.g. "
                             "`dare-bench check --record sft-llada-sudoku`")
    if seeds < 2:
        raise ConfigError(f"--seeds must be at least 2 (the tolerance needs a seed-to-seed spread), got {seeds}")
    directory = bl.baselines_directory(baselines)
    plans = []
    for name in dict.fromkeys(names):
        pinned = list(overrides or [])
        existing = bl.baseline_path(directory, name, scale)
        if overrides is None and existing.exists():
            pinned = list(bl.load(existing).get("overrides", []))  # re-recording keeps what the baseline pinned
        _, cfg = resolve(name, scale, pinned)
        first = list(cfg.profile.seeds)
        plans.append((name, pinned, (first + [s for s in range(max(first) + 1, max(first) + 1 + seeds)])[:seeds]))
    url = _resolve_db(db)
    written = []
    with fresh_home(not reuse_cache), pinned_threads(threads):
        for name, pinned, seed_list in plans:
            doc = bl.record(name, scale, seed_list, db=url, log=log, overrides=pinned)
            path = bl.baseline_path(directory, name, scale)
            bl.write(path, doc)
            log(f"recorded {path} (seeds {seed_list}); review it with `git diff {path}` before committing")
            written.append(path)
    return written


# ---------------------------------------------------------------------------------------------- reports

def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def table_lines(report: dict[str, Any]) -> list[str]:
    header = ("reproduction", "check", "baseline", "current", "delta", "tolerance", "z", "status")
    rows = []
    everything = report["reproductions"] + report.get("gradients", [])
    for e in everything:
        if not e["checks"]:
            rows.append((e["name"], "-", "-", "-", "-", "-", "-", e["status"].upper()))
        for c in e["checks"]:
            rows.append((e["name"], c["name"], _fmt(c["baseline"]), _fmt(c["current"]), _fmt(c["delta"]),
                         _fmt(c["tolerance"]), "-" if c["z"] is None else f"{c['z']:+.2f}", c["status"].upper()))
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    lines.append("")
    for e in everything:
        where = ("pinned micro batch" if e.get("kind") == "gradient" else
                 f"run {e['run_id']}, seed {e['seed']}" if e["run_id"] is not None else "no run")
        took = f", {e['wall_seconds']:.1f}s" if e["wall_seconds"] is not None else ""
        lines.append(f"{e['status'].upper():5} {e['name']} [{e['scale']}] ({where}{took})"
                     + (f": {e['message']}" if e["message"] else ""))
        base = e.get("base") or {}
        if base.get("group") == "other":
            lines.append(f"      started from another base (weights {base['current'][:12]}; the baseline's "
                         f"{', '.join(h[:12] for h in base['baseline'])}): compared across bases, not within one")
        if e.get("environment_changes") and e["status"] != "pass":
            lines.append("      recorded on another environment: " + ", ".join(
                f"{k} {a} -> {b}" for k, (a, b) in e["environment_changes"].items()))
    grads = report.get("gradients", [])
    lines.append(f"{report['status'].upper()}: {len(report['reproductions'])} reproduction(s), {report['tests']} "
                 f"tests, family-wise alpha {report['alpha']:g} (|z| <= {report['z_critical']:.2f}); "
                 f"{len(grads)} gradient snapshot(s); {report['wall_seconds']:.0f}s")
    return lines


def junit_xml(report: dict[str, Any]) -> str:
    """JUnit XML: one testsuite per reproduction, one testcase per check (an unrunnable one is an <error>)."""
    suites = ET.Element("testsuites", name="dare-bench check")
    for e in report["reproductions"] + report.get("gradients", []):
        checks = e["checks"] or [{"name": "run", "status": e["status"], "detail": e["message"]}]
        suite = ET.SubElement(suites, "testsuite", name=f"{e['name']}[{e['scale']}]", tests=str(len(checks)),
                              failures=str(sum(c["status"] == "fail" for c in checks)),
                              errors=str(sum(c["status"] == "error" for c in checks)),
                              time=f"{e['wall_seconds'] or 0.0:.2f}")
        for c in checks:
            case = ET.SubElement(suite, "testcase", classname=e["name"], name=c["name"])
            if c["status"] == "pass":
                continue
            text = c.get("detail") or e["message"]
            if c.get("baseline") is not None:
                text = (f"baseline {_fmt(c['baseline'])}, current {_fmt(c['current'])}, delta {_fmt(c['delta'])}, "
                        f"tolerance {_fmt(c['tolerance'])}; {text}")
            ET.SubElement(case, "failure" if c["status"] == "fail" else "error", message=text or c["status"]).text = \
                e["message"] or text
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


# ---------------------------------------------------------------------------------------------- command

def register(app: typer.Typer) -> None:
    @app.command("check")
    def check_cmd(
        names: Optional[List[str]] = typer.Argument(None, help="Reproductions to check (default: every one with a "
                                                               "baseline at --scale)."),
        scale: str = typer.Option("micro", "--scale", help="micro | tiny: the scale the baselines were recorded at."),
        db: Optional[str] = typer.Option(None, "--db", help=DB_HELP, show_default=False),
        run: bool = typer.Option(False, "--run", help="Run the reproductions (afresh) before comparing; without it "
                                                      "the latest matching runs in the store are compared."),
        as_json: bool = typer.Option(False, "--json", help="Print the JSON report on stdout instead of the table."),
        junit: Optional[Path] = typer.Option(None, "--junit", help="Also write a JUnit XML report to this file."),
        record: bool = typer.Option(False, "--record", help="Record the named reproductions' baselines instead of "
                                                            "checking (runs each with --seeds seeds)."),
        seeds: int = typer.Option(DEFAULT_SEEDS, "--seeds", help="Seeds per baseline when recording."),
        override: Optional[List[str]] = typer.Option(None, "--override", "-o", help="key=value override pinned "
                                                     "into the recorded baseline (repeatable; --record only; "
                                                     "default: the overrides the existing baseline pins)."),
        alpha: float = typer.Option(DEFAULT_ALPHA, "--alpha", help="Family-wise false-alarm rate of the checks."),
        baselines: Optional[str] = typer.Option(None, "--baselines", help="Baseline directory (default: "
                                                                          "$DARE_BENCH_BASELINES or "
                                                                          "dare_bench/reproductions/baselines)."),
        threads: int = typer.Option(DEFAULT_THREADS, "--threads", help="torch threads for --run / --record "
                                                                      "(recorded with the baseline's hardware)."),
        reuse_cache: bool = typer.Option(False, "--reuse-cache", help="Reuse cached SFT bases and base evaluations "
                                                                      "(faster; blind to changes below them)."),
        gradients: bool = typer.Option(True, "--gradients/--no-gradients", help="Also compare every trained "
                                       "algorithm's gradient snapshot on its pinned micro batch with "
                                       "<baselines>/gradients.json (loss, gradient norm, cosine of a 64-dim "
                                       "projection; seconds)."),
        record_grads: bool = typer.Option(False, "--record-gradients", help="Record every algorithm's gradient "
                                          "snapshot into <baselines>/gradients.json instead of checking."),
    ) -> None:
        """CI regression check: compare runs with the pinned baselines (exit 0 pass, 1 regression, 2 unchecked)."""
        log = lambda msg: typer.echo(msg, err=True)  # noqa: E731 - stdout carries only the table / JSON
        try:
            if record_grads:
                if record or names:
                    raise ConfigError("--record-gradients records every algorithm's snapshot; it takes no names "
                                      "and no --record")
                typer.echo(str(record_gradients(baselines=baselines, threads=threads, log=log)))
                return
            if record:
                for path in record_baselines(list(names or []), scale=scale, seeds=seeds, db=db,
                                             baselines=baselines, reuse_cache=reuse_cache,
                                             overrides=override or None, threads=threads, log=log):
                    typer.echo(str(path))
                return
            if override:
                raise ConfigError("--override is for --record (a check uses the overrides its baseline pins)")
            report = run_check(list(names or []), scale=scale, db=db, run=run, baselines=baselines, alpha=alpha,
                               reuse_cache=reuse_cache, threads=threads, gradients=gradients, log=log)
            if junit is not None:
                from dare_bench.fileio import atomic_write_text

                atomic_write_text(junit, junit_xml(report))
        except DareBenchError as exc:
            print_error(exc, as_json=as_json)
            raise typer.Exit(exc.exit_code) from None
        if as_json:
            typer.echo(json.dumps(report, indent=1, default=str))
        else:
            for line in table_lines(report):
                typer.echo(line)
        sys.stdout.flush()
        raise typer.Exit(report["exit_code"])


__all__ = ["register", "run_check", "record_baselines", "record_gradients", "table_lines", "junit_xml", "fresh_home"]
