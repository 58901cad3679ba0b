"""The results store's repository API: the only code that writes runs, metrics, evaluations and reported scores.

    from dare_bench.store import Store
    store = Store()                                   # --db / DARE_BENCH_DB / $DARE_BENCH_HOME/results.db
    with store.run(run_config, seed=0) as run_id:     # fail_run on any exception
        store.log_metrics(run_id, step, {"reward_mean": .5, "loss": .1, "stage_seconds": {"rollout": 1.2}})
        store.finish_run(run_id, evaluations=[evaluation_record])   # status + final evaluations, one transaction

Every public write is one short transaction (BEGIN IMMEDIATE on SQLite). A run becomes "finished" only in the
transaction that writes its final evaluations, so a process killed at any point leaves the run "running" (or
"failed"), never finished with missing rows. `mark_orphans_failed` turns runs whose process died on this host
into failures.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import delete, insert, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from dare_bench.errors import StoreError
from dare_bench.store import environment
from dare_bench.store.engine import READ_ONLY, open_database, resolve_url
from dare_bench.store.models import Evaluation, ReportedScoreRow, Run, Sample, StepMetric
from dare_bench.store.records import (
    EvaluationRecord,
    MetricRecord,
    ResultFile,
    RunRecord,
    SampleRecord,
    check_integrity,
    new_uid,
    read_result_file,
    utcnow,
)

METRIC_COLUMNS = ("reward_mean", "reward_std", "loss", "kl", "entropy", "tokens_per_forward", "peak_memory_mb")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str)


def _aware(dt: datetime | None) -> datetime | None:
    # SQLite returns naive datetimes; everything the store writes is UTC.
    return dt.replace(tzinfo=timezone.utc) if dt is not None and dt.tzinfo is None else dt


class Store:
    def __init__(self, url: str | None = None):
        self.url = resolve_url(url)
        self.engine = open_database(self.url)
        # `reader`: same pool, deferred BEGIN; for dashboards and other long readers (pandas.read_sql(..., reader)).
        self.reader = self.engine.execution_options(**{READ_ONLY: True})
        self._write_sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._sessions = sessionmaker(self.reader, expire_on_commit=False)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[Session]:
        """One transaction: committed on success, rolled back on any error (nothing half-written)."""
        session = self._write_sessions()
        try:
            with session.begin():
                yield session
        except SQLAlchemyError as exc:
            raise StoreError(f"database write failed ({self.url}): {getattr(exc, 'orig', exc)}") from exc
        finally:
            session.close()

    # ------------------------------------------------------------------------------------------ runs

    def start_run(
        self,
        config: Any,
        *,
        seed: int,
        uid: str | None = None,
        code_version: str | None = None,
        packages: dict[str, str] | None = None,
        hardware: dict[str, Any] | None = None,
        control_of: str | None = None,
    ) -> int:
        """Record a new run as "running"; `config` is a RunConfig (or its `to_dict()`). Returns the run id.
        `control_of`: the uid of the RL run this (compute-matched SFT) run controls."""
        cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
        for key in ("reproduction", "algorithm", "backbone", "task", "scale", "content_hash"):
            if key not in cfg:
                raise StoreError(f"start_run: config lacks {key!r} (pass a dare_bench.config.RunConfig)")
        run = Run(
            uid=uid or new_uid(), reproduction=cfg["reproduction"], algorithm=cfg["algorithm"],
            backbone=cfg["backbone"], task=cfg["task"], scale=cfg["scale"], config_json=_dumps(cfg),
            config_hash=cfg["content_hash"], modified=bool(cfg.get("modified", False)),
            overrides_json=_dumps(cfg.get("overrides", [])), seed=int(seed),
            code_version=code_version or environment.code_version(),
            packages_json=_dumps(packages if packages is not None else environment.package_versions()),
            hardware_json=_dumps(hardware if hardware is not None else environment.hardware()),
            status="running", host=socket.gethostname(), pid=os.getpid(), started_at=utcnow(), origin="local",
            control_of=control_of,
        )
        with self._tx() as s:
            s.add(run)
            s.flush()
            return run.id

    def log_metrics(self, run_id: int, step: int, metrics: dict[str, Any]) -> None:
        """Write (or replace, on resume) the metrics of one step.

        Known keys go to columns (`METRIC_COLUMNS`); `stage_seconds` is a {stage: seconds} mapping; any other
        numeric key is kept in `extra`.
        """
        row = _metric_row(step, metrics)
        with self._tx() as s:
            run = self._running(s, run_id, "log_metrics")
            s.execute(delete(StepMetric).where(StepMetric.run_id == run.id, StepMetric.step == step))
            row.run_id = run.id
            s.add(row)

    def add_evaluation(self, run_id: int, evaluation: EvaluationRecord | dict[str, Any]) -> int:
        """An evaluation of a running run (e.g. a periodic eval); final ones go through `finish_run`."""
        ev = _as_evaluation(evaluation)
        with self._tx() as s:
            run = self._get(s, run_id)
            if run.status == "failed":
                raise StoreError(f"run {run_id} failed; it takes no more evaluations")
            return _insert_evaluation(s, run, ev).id

    def finish_run(self, run_id: int, evaluations: Iterable[EvaluationRecord | dict[str, Any]] = (), *,
                   base: dict[str, Any] | None = None, compute: dict[str, Any] | None = None) -> None:
        """Mark the run finished in the same transaction that writes its final evaluations, the identity of the
        base it started from (`base`: {"weights_sha256", "selection"}, tiny / micro; None for a real checkpoint)
        and the training compute it counted (`compute`: trainers.compute.ComputeMeter.summary())."""
        evs = [_as_evaluation(e) for e in evaluations]
        with self._tx() as s:
            run = self._running(s, run_id, "finish_run")
            if base is not None:
                run.base_sha256, run.base_json = _base_hash(base), _dumps(base)
            if compute is not None:
                run.compute_json = _dumps(compute)
            for ev in evs:
                _insert_evaluation(s, run, ev)
            run.status = "finished"
            run.finished_at = utcnow()
            run.duration_s = (run.finished_at - _aware(run.started_at)).total_seconds()

    def fail_run(self, run_id: int, error: str) -> None:
        with self._tx() as s:
            run = self._get(s, run_id)
            if run.status == "finished":
                return  # a late failure (e.g. in cleanup) does not undo a recorded result
            run.status = "failed"
            run.error = error[-4000:]
            run.finished_at = utcnow()
            run.duration_s = (run.finished_at - _aware(run.started_at)).total_seconds()

    @contextlib.contextmanager
    def run(self, config: Any, *, seed: int, **kwargs: Any) -> Iterator[int]:
        """`start_run` as a context: an exception (or leaving without `finish_run`) marks the run failed."""
        run_id = self.start_run(config, seed=seed, **kwargs)
        try:
            yield run_id
        except BaseException as exc:
            self.fail_run(run_id, f"{type(exc).__name__}: {exc}")
            raise
        if self.get_run(run_id)["status"] == "running":
            self.fail_run(run_id, "the run's block ended without finish_run")

    def mark_orphans_failed(self) -> int:
        """Runs left "running" by a process of this host that no longer exists become failed. Returns count."""
        host = socket.gethostname()
        with self._tx() as s:
            runs = s.scalars(select(Run).where(Run.status == "running", Run.host == host)).all()
            n = 0
            for run in runs:
                if run.pid is not None and not _alive(run.pid):
                    run.status, run.error, run.finished_at = "failed", "process ended without finishing", utcnow()
                    n += 1
            return n

    # ------------------------------------------------------------------------------------------ reads

    def get_run(self, run_id: int) -> dict[str, Any]:
        with self._sessions() as s:
            return _run_dict(self._get(s, run_id))

    def latest_runs(
        self, *, reproduction: str | None = None, scale: str | None = None, status: str | None = None,
        limit: int | None = 50,
    ) -> list[dict[str, Any]]:
        q = select(Run).order_by(Run.id.desc())
        if reproduction:
            q = q.where(Run.reproduction == reproduction)
        if scale:
            q = q.where(Run.scale == scale)
        if status:
            q = q.where(Run.status == status)
        if limit:
            q = q.limit(limit)
        with self._sessions() as s:
            runs = s.scalars(q).all()
            out = []
            for run in runs:
                d = _run_dict(run)
                d["evaluations"] = [_eval_dict(e) for e in run.evaluations]
                if run.status == "running":
                    d["progress"] = _progress(s, d)
                out.append(d)
            return out

    def controls_of(self, uid: str, *, status: str | None = "finished") -> list[dict]:
        """The compute-matched SFT controls stored for the RL run `uid`, newest first."""
        q = select(Run).where(Run.control_of == uid).order_by(Run.id.desc())
        if status is not None:
            q = q.where(Run.status == status)
        with self._sessions() as s:
            return [_run_dict(r) for r in s.scalars(q).all()]

    def find_runs(self, *, config_hash: str, seed: int | None = None, status: str | None = "finished") -> list[dict]:
        """Runs of exactly this config (and seed / status): lets the pipeline skip work already recorded."""
        q = select(Run).where(Run.config_hash == config_hash).order_by(Run.id.desc())
        if seed is not None:
            q = q.where(Run.seed == seed)
        if status is not None:
            q = q.where(Run.status == status)
        with self._sessions() as s:
            return [_run_dict(r) for r in s.scalars(q).all()]

    def metrics(self, run_id: int) -> list[dict[str, Any]]:
        with self._sessions() as s:
            rows = s.scalars(select(StepMetric).where(StepMetric.run_id == run_id).order_by(StepMetric.step)).all()
            return [_metric_dict(m) for m in rows]

    def evaluations(self, run_id: int | None = None) -> list[dict[str, Any]]:
        q = select(Evaluation).order_by(Evaluation.id)
        if run_id is not None:
            q = q.where(Evaluation.run_id == run_id)
        with self._sessions() as s:
            return [_eval_dict(e) for e in s.scalars(q).all()]

    def samples(self, evaluation_id: int) -> list[dict[str, Any]]:
        with self._sessions() as s:
            rows = s.scalars(select(Sample).where(Sample.evaluation_id == evaluation_id).order_by(Sample.idx)).all()
            return [
                {"idx": r.idx, "item_id": r.item_id, "prompt": r.prompt, "completion": r.completion,
                 "reference": r.reference, "score": r.score, "correct": r.correct, "extra": json.loads(r.extra_json)}
                for r in rows
            ]

    # ---------------------------------------------------------------------------------- reported scores

    def sync_reported(self, specs: Iterable[Any]) -> int:
        """Replace the reported scores with those of `specs` (ReproductionSpec objects), in one transaction."""
        rows = []
        for spec in specs:
            for r in spec.reported:
                rows.append(ReportedScoreRow(
                    reproduction=spec.name, algorithm=spec.algorithm, backbone=spec.backbone, task=spec.task,
                    table_id=r.table, metric=r.metric, value=r.value, source_kind=r.source.kind,
                    source_ref=r.source.ref, source_table=r.source.table, source_file=r.source.file,
                    source_commit=r.source.commit, settings_json=_dumps(r.settings), note=r.note,
                ))
        with self._tx() as s:
            s.execute(delete(ReportedScoreRow))
            s.add_all(rows)
        return len(rows)

    def reported(self, reproduction: str | None = None) -> list[dict[str, Any]]:
        q = select(ReportedScoreRow).order_by(ReportedScoreRow.reproduction, ReportedScoreRow.id)
        if reproduction:
            q = q.where(ReportedScoreRow.reproduction == reproduction)
        with self._sessions() as s:
            return [
                {"reproduction": r.reproduction, "algorithm": r.algorithm, "backbone": r.backbone, "task": r.task,
                 "table": r.table_id, "metric": r.metric, "value": r.value,
                 "source": {"kind": r.source_kind, "ref": r.source_ref, "table": r.source_table,
                            "file": r.source_file, "commit": r.source_commit},
                 "settings": json.loads(r.settings_json), "note": r.note}
                for r in s.scalars(q).all()
            ]

    # ------------------------------------------------------------------------------------------ ingest

    def ingest(self, path: str | Path) -> dict[str, int]:
        """Load result files (a file, or every *.json / *.json.gz under a directory) in one transaction.

        Every file is validated before anything is written (`records.check_integrity`: the config hash recomputed
        from the stored config, the package / machine record present): one corrupt or edited file means nothing is
        ingested.
        Runs and evaluations already present (same uid) are skipped, so re-ingesting is a no-op.
        """
        path = Path(path)
        if path.is_dir():
            from dare_bench.store.records import result_files

            files = result_files(path)
        elif path.is_file():
            files = [path]
        else:
            from dare_bench.errors import DataError

            raise DataError(f"{path}: no such file or directory")
        return self.ingest_results([(f, f) for f in files])

    def ingest_results(self, sources: list[tuple[Any, Any]]) -> dict[str, int]:
        """`ingest` of (name, result file path or ResultFile) pairs: all verified first, then one transaction."""
        parsed = [(name, read_result_file(src) if isinstance(src, (str, Path)) else src) for name, src in sources]
        for f, result in parsed:  # an edited or incomplete run record refuses the whole ingest
            check_integrity(result, f)
        counts = {"files": len(parsed), "runs": 0, "evaluations": 0, "metrics": 0, "skipped_evaluations": 0}
        with self._tx() as s:
            for _f, result in parsed:
                _ingest_one(s, result, counts)
        return counts

    def result_file(self, run_id: int) -> ResultFile:
        """One finished run as a result file (what `ingest` reads): its full run record (config, code version,
        packages, hardware, base identity, compute, control link), step metrics and evaluations with samples."""
        with self._sessions() as s:
            run = self._get(s, run_id)
            if run.status != "finished":
                raise StoreError(f"run {run_id} is {run.status}; only finished runs are exported")
            record = RunRecord(
                uid=run.uid, reproduction=run.reproduction, algorithm=run.algorithm, backbone=run.backbone,
                task=run.task, scale=run.scale, config=json.loads(run.config_json), config_hash=run.config_hash,
                modified=run.modified, overrides=json.loads(run.overrides_json), seed=run.seed,
                code_version=run.code_version, packages=json.loads(run.packages_json),
                hardware=json.loads(run.hardware_json), base=json.loads(run.base_json or "{}"),
                compute=json.loads(run.compute_json or "{}"), control_of=run.control_of, status=run.status,
                error=run.error, host=run.host, pid=run.pid, started_at=_aware(run.started_at),
                finished_at=_aware(run.finished_at) if run.finished_at else None)
            metrics = [MetricRecord(step=m.step, values=_metric_values(m)) for m in
                       s.scalars(select(StepMetric).where(StepMetric.run_id == run.id).order_by(StepMetric.step))]
            evaluations = []
            for e in s.scalars(select(Evaluation).where(Evaluation.run_id == run.id).order_by(Evaluation.id)):
                samples = [SampleRecord(idx=x.idx, item_id=x.item_id, prompt=x.prompt, completion=x.completion,
                                        reference=x.reference, score=x.score, correct=x.correct,
                                        extra=json.loads(x.extra_json or "{}"))
                           for x in sorted(e.samples, key=lambda x: x.idx)]
                evaluations.append(EvaluationRecord(
                    uid=e.uid or f"{run.uid}-{e.id}", task=e.task, split=e.split,
                    data_fingerprint=e.data_fingerprint, sampler_preset=e.sampler_preset,
                    sampler=json.loads(e.sampler_json), metrics=json.loads(e.metrics_json),
                    primary_metric=e.primary_metric, n_items=e.n_items, checkpoint=e.checkpoint, step=e.step,
                    samples=samples))
            return ResultFile(run=record, metrics=metrics, evaluations=evaluations)

    def export_rows(self) -> list[dict[str, Any]]:
        """One flat row per evaluation joined with its run: what `dare-bench export` writes."""
        with self._sessions() as s:
            rows = []
            for ev in s.scalars(select(Evaluation).order_by(Evaluation.id)).all():
                run = ev.run
                rows.append({
                    "run_id": run.id, "run_uid": run.uid, "reproduction": run.reproduction,
                    "algorithm": run.algorithm, "backbone": run.backbone, "task": ev.task, "scale": run.scale,
                    "seed": run.seed, "status": run.status, "modified": run.modified,
                    "config_hash": run.config_hash, "code_version": run.code_version, "base_sha256": run.base_sha256,
                    "evaluation_id": ev.id, "split": ev.split, "data_fingerprint": ev.data_fingerprint,
                    "sampler_preset": ev.sampler_preset, "step": ev.step, "checkpoint": ev.checkpoint,
                    "metric": ev.primary_metric, "value": ev.primary_value, "n_items": ev.n_items,
                    "metrics": json.loads(ev.metrics_json), "created_at": _aware(ev.created_at).isoformat(),
                })
            return rows

    # ------------------------------------------------------------------------------------------ helpers

    @staticmethod
    def _get(s: Session, run_id: int) -> Run:
        run = s.get(Run, run_id)
        if run is None:
            raise StoreError(f"no run with id {run_id}")
        return run

    def _running(self, s: Session, run_id: int, what: str) -> Run:
        run = self._get(s, run_id)
        if run.status != "running":
            raise StoreError(f"{what}: run {run_id} is {run.status}, not running")
        return run


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _num(key: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)  # numpy / torch scalars
        except (TypeError, ValueError):
            raise StoreError(f"metric {key!r} must be a number, got {type(value).__name__}") from None
    value = float(value)
    # NaN/inf are information (a diverged loss) but not storable in every backend; kept as text in extra.
    return value if math.isfinite(value) else None


def _metric_row(step: int, metrics: dict[str, Any]) -> StepMetric:
    if not isinstance(step, int) or step < 0:
        raise StoreError(f"step must be a non-negative int, got {step!r}")
    cols: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    stages: dict[str, float] = {}
    for key, value in metrics.items():
        if key == "stage_seconds":
            if not isinstance(value, dict):
                raise StoreError("metric 'stage_seconds' must be a {stage: seconds} mapping")
            stages = {str(k): _num(f"stage_seconds.{k}", v) for k, v in value.items()}
        elif key in METRIC_COLUMNS:
            cols[key] = _num(key, value)
            if cols[key] is None and value is not None:
                extra[f"{key}_nonfinite"] = str(value)
        else:
            v = _num(key, value)
            extra[key] = v if v is not None or value is None else str(value)
    return StepMetric(step=step, stage_seconds_json=_dumps(stages), extra_json=_dumps(extra), logged_at=utcnow(),
                      **cols)


def _as_evaluation(ev: EvaluationRecord | dict[str, Any]) -> EvaluationRecord:
    if isinstance(ev, EvaluationRecord):
        return ev
    from pydantic import ValidationError

    try:
        return EvaluationRecord.model_validate(ev)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise StoreError(f"invalid evaluation at {'.'.join(map(str, err['loc']))}: {err['msg']}") from None


def _insert_evaluation(s: Session, run: Run, ev: EvaluationRecord) -> Evaluation:
    row = Evaluation(
        uid=ev.uid, run_id=run.id, task=ev.task, split=ev.split, data_fingerprint=ev.data_fingerprint,
        sampler_preset=ev.sampler_preset, sampler_json=_dumps(ev.sampler), metrics_json=_dumps(ev.metrics),
        primary_metric=ev.primary_metric, primary_value=ev.metrics[ev.primary_metric], n_items=ev.n_items or 0,
        checkpoint=ev.checkpoint, step=ev.step, created_at=utcnow(),
    )
    s.add(row)
    s.flush()
    if ev.samples:  # one executemany, not an ORM object per sample: a bundle's ingest holds ~half a million
        s.execute(insert(Sample), [
            {"evaluation_id": row.id, "idx": x.idx, "item_id": x.item_id, "prompt": x.prompt,
             "completion": x.completion, "reference": x.reference, "score": x.score, "correct": x.correct,
             "extra_json": _dumps(x.extra)}
            for x in ev.samples])
    return row


def _ingest_one(s: Session, result: ResultFile, counts: dict[str, int]) -> None:
    rec: RunRecord = result.run
    run = s.scalars(select(Run).where(Run.uid == rec.uid)).one_or_none()
    if run is None:
        finished = rec.finished_at or (utcnow() if rec.status != "running" else None)
        run = Run(
            uid=rec.uid, reproduction=rec.reproduction, algorithm=rec.algorithm, backbone=rec.backbone,
            task=rec.task, scale=rec.scale, config_json=_dumps(rec.config), config_hash=rec.config_hash,
            modified=rec.modified, overrides_json=_dumps(rec.overrides), seed=rec.seed,
            code_version=rec.code_version, packages_json=_dumps(rec.packages), hardware_json=_dumps(rec.hardware),
            status=rec.status, error=rec.error, host=rec.host, pid=rec.pid, started_at=rec.started_at,
            finished_at=finished, duration_s=(finished - rec.started_at).total_seconds() if finished else None,
            origin="ingest", base_sha256=_base_hash(rec.base) if rec.base else None, base_json=_dumps(rec.base),
            compute_json=_dumps(rec.compute), control_of=rec.control_of,
        )
        s.add(run)
        s.flush()
        counts["runs"] += 1
    elif run.status == "running" and rec.status != "running":
        # The file is the outcome of a run the database saw start (e.g. a fanned-out final evaluation).
        run.status, run.error = rec.status, rec.error
        run.finished_at = rec.finished_at or utcnow()
        run.duration_s = (_aware(run.finished_at) - _aware(run.started_at)).total_seconds()
    existing_steps = set(s.scalars(select(StepMetric.step).where(StepMetric.run_id == run.id)))
    rows = []
    for m in result.metrics:
        if m.step in existing_steps:
            continue
        row = _metric_row(m.step, m.values)
        rows.append({c.key: getattr(row, c.key) for c in StepMetric.__table__.columns if c.key != "id"}
                    | {"run_id": run.id})
        existing_steps.add(m.step)
    if rows:  # one executemany (see _insert_evaluation)
        s.execute(insert(StepMetric), rows)
        counts["metrics"] += len(rows)
    for ev in result.evaluations:
        if s.scalars(select(Evaluation.id).where(Evaluation.uid == ev.uid)).first() is not None:
            counts["skipped_evaluations"] += 1
            continue
        _insert_evaluation(s, run, ev)
        counts["evaluations"] += 1


# the pace of a running run is read from its last few logged steps: a resumed run's earlier rows (and the pause
# between) would otherwise slow its estimate
PACE_STEPS = 5


def _progress(s: Session, run: dict[str, Any]) -> dict[str, Any]:
    """Where a running run's training is: its last logged step and when, the planned total (`train.steps`; none for
    a compute-matched control, which stops at a FLOPs budget instead), the seconds per step of its last
    `PACE_STEPS` logged steps, and the time left at that pace. No step logged yet (building its base, or its first
    rollouts): step and pace are None."""
    rows = s.execute(select(StepMetric.step, StepMetric.logged_at).where(StepMetric.run_id == run["id"])
                     .order_by(StepMetric.step.desc()).limit(PACE_STEPS + 1)).all()
    train = run["config"].get("profile", {}).get("train", {})
    total = train.get("steps") if train.get("compute_budget_flops") is None else None
    if not rows:
        return {"step": None, "total": total, "logged_at": None, "seconds_per_step": None, "eta_seconds": None}
    last, first = rows[0], rows[-1]  # steps are unique per run, so two rows are two different steps
    pace = ((_aware(last.logged_at) - _aware(first.logged_at)).total_seconds() / (last.step - first.step)
            if len(rows) > 1 else None)
    left = pace * max(total - last.step, 0) if pace is not None and total is not None else None
    return {"step": last.step, "total": total, "logged_at": _aware(last.logged_at).isoformat(),
            "seconds_per_step": pace, "eta_seconds": left}


def _run_dict(run: Run) -> dict[str, Any]:
    return {
        "id": run.id, "uid": run.uid, "reproduction": run.reproduction, "algorithm": run.algorithm,
        "backbone": run.backbone, "task": run.task, "scale": run.scale, "config": json.loads(run.config_json),
        "config_hash": run.config_hash, "modified": run.modified, "overrides": json.loads(run.overrides_json),
        "seed": run.seed, "code_version": run.code_version, "packages": json.loads(run.packages_json),
        "hardware": json.loads(run.hardware_json), "status": run.status, "error": run.error, "host": run.host,
        "pid": run.pid, "origin": run.origin, "started_at": _aware(run.started_at).isoformat(),
        "finished_at": _aware(run.finished_at).isoformat() if run.finished_at else None,
        "duration_s": run.duration_s, "base": json.loads(run.base_json or "{}"), "base_sha256": run.base_sha256,
        "compute": json.loads(run.compute_json or "{}"), "control_of": run.control_of,
    }


def _metric_values(m: StepMetric) -> dict[str, Any]:
    """A stored step back to the flat mapping `log_metrics` took (columns, stage_seconds, the extra keys)."""
    values: dict[str, Any] = {c: getattr(m, c) for c in METRIC_COLUMNS if getattr(m, c) is not None}
    stages = json.loads(m.stage_seconds_json or "{}")
    if stages:
        values["stage_seconds"] = stages
    values.update(json.loads(m.extra_json or "{}"))  # a non-finite column's "<name>_nonfinite" text goes back as is
    return values


def _base_hash(base: dict[str, Any]) -> str:
    digest = base.get("weights_sha256")
    if not isinstance(digest, str) or len(digest) != 64:
        raise StoreError(f"base identity needs a 64-hex weights_sha256, got {digest!r}")
    return digest


def _eval_dict(e: Evaluation) -> dict[str, Any]:
    return {
        "id": e.id, "uid": e.uid, "run_id": e.run_id, "task": e.task, "split": e.split,
        "data_fingerprint": e.data_fingerprint, "sampler_preset": e.sampler_preset,
        "sampler": json.loads(e.sampler_json), "metrics": json.loads(e.metrics_json),
        "primary_metric": e.primary_metric, "value": e.primary_value, "n_items": e.n_items,
        "checkpoint": e.checkpoint, "step": e.step, "created_at": _aware(e.created_at).isoformat(),
    }


def _metric_dict(m: StepMetric) -> dict[str, Any]:
    d = {"step": m.step, **{c: getattr(m, c) for c in METRIC_COLUMNS}}
    d["stage_seconds"] = json.loads(m.stage_seconds_json)
    d["extra"] = json.loads(m.extra_json)
    return d
