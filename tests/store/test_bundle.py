"""Results bundles: `export --bundle` writes finished runs with their full records, `ingest` reads them back
verified, and the leaderboard layers the user's store on top of bundles (fresh install: bundles alone)."""

from __future__ import annotations

import gzip
import json

import pytest
from typer.testing import CliRunner

from dare_bench.cli import app
from dare_bench.errors import ConfigError, DataError
from dare_bench.pipeline.plan import resolve
from dare_bench.store import EvaluationRecord, SampleRecord, Store
from dare_bench.store.bundle import export_bundle, merged_database

runner = CliRunner()


def _run(store: Store, name: str, seed: int, final: float, *, base_sha: str = "a" * 64) -> int:
    _, cfg = resolve(name, "micro")
    run_id = store.start_run(cfg, seed=seed)
    for step in (1, 2):
        store.log_metrics(run_id, step, {"reward_mean": 0.1 * step, "loss": float("nan") if step == 2 else 1.0,
                                         "stage_seconds": {"rollout": 1.5}, "clip_fraction": 0.25})
    samples = [SampleRecord(idx=i, completion=f"c{i}", score=float(i % 2), correct=bool(i % 2)) for i in range(3)]
    evs = [EvaluationRecord(task=cfg.task, split="test", data_fingerprint="fp", metrics={"accuracy": v},
                            primary_metric="accuracy", checkpoint=c, samples=samples)
           for c, v in (("base", 0.1), ("final", final))]
    store.finish_run(run_id, evs, base={"weights_sha256": base_sha, "selection": {"rule": "target", "step": 70}},
                     compute={"flops": 1.5e9, "flops_per_token": 100.0, "token_forwards": 1, "grad_token_forwards": 2})
    return run_id


def test_export_then_ingest_round_trips_the_full_record(tmp_path):
    src = Store(f"sqlite:///{tmp_path / 'src.db'}")
    ids = [_run(src, "d1-llada-sudoku", s, 0.3 + 0.1 * s) for s in (0, 1)]
    _run(src, "d1-dream-sudoku", 0, 0.5)
    paths = export_bundle(src, tmp_path / "bundle", backbone="llada")
    assert len(paths) == 2 and all(p.name.startswith("d1-llada-sudoku.micro.seed") for p in paths)
    dst = Store(f"sqlite:///{tmp_path / 'dst.db'}")
    counts = dst.ingest(tmp_path / "bundle")
    assert counts["runs"] == 2 and counts["evaluations"] == 4
    for run_id in ids:
        a = src.get_run(run_id)
        (b,) = [r for r in dst.latest_runs(limit=None) if r["uid"] == a["uid"]]
        for key in ("config", "config_hash", "seed", "packages", "hardware", "base", "base_sha256", "compute"):
            assert a[key] == b[key], key
        assert [e["metrics"] for e in src.evaluations(run_id)] == [e["metrics"] for e in dst.evaluations(b["id"])]
        assert [m["reward_mean"] for m in src.metrics(run_id)] == [m["reward_mean"] for m in dst.metrics(b["id"])]
        assert dst.metrics(b["id"])[1]["extra"]["clip_fraction"] == 0.25
    assert dst.ingest(tmp_path / "bundle")["runs"] == 0  # idempotent


def test_a_selection_matching_nothing_writes_nothing(tmp_path):
    src = Store(f"sqlite:///{tmp_path / 'src.db'}")
    _run(src, "d1-llada-sudoku", 0, 0.3)
    with pytest.raises(DataError, match="no finished runs .* match .*scale tiny"):
        export_bundle(src, tmp_path / "bundle", scale="tiny")
    assert not (tmp_path / "bundle").exists()


def test_a_tampered_bundle_file_is_refused(tmp_path):
    src = Store(f"sqlite:///{tmp_path / 'src.db'}")
    _run(src, "d1-llada-sudoku", 0, 0.3)
    (path,) = export_bundle(src, tmp_path / "bundle")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    doc["run"]["config"]["profile"]["train"]["lr"] = 1.0  # a better-looking recipe, same hash
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(DataError, match="is not the hash of its config"):
        Store(f"sqlite:///{tmp_path / 'dst.db'}").ingest(tmp_path / "bundle")


def test_bundle_files_are_reproducible_gzip_and_plain_json_still_reads(tmp_path):
    src = Store(f"sqlite:///{tmp_path / 'src.db'}")
    _run(src, "d1-llada-sudoku", 0, 0.3)
    (path,) = export_bundle(src, tmp_path / "bundle")
    assert path.name.endswith(".json.gz")
    first = path.read_bytes()
    stale = path.with_suffix("")  # the same run as an older dare-bench wrote it: plain JSON
    stale.write_bytes(gzip.decompress(first))
    (again,) = export_bundle(src, tmp_path / "bundle")
    assert again.read_bytes() == first  # no timestamp in the gzip header: re-exporting changes no byte
    assert not stale.exists()  # replaced by the compressed file, not kept beside it as a duplicate
    plain = tmp_path / "plain" / "run.json"
    plain.parent.mkdir()
    plain.write_bytes(gzip.decompress(first))
    (tmp_path / "plain" / ".run.json.gz.123.tmp").write_bytes(b"half-written")  # an interrupted write: skipped
    for source in (tmp_path / "plain", plain, path):
        assert Store(f"sqlite:///{tmp_path / f'{source.name}.db'}").ingest(source)["runs"] == 1
    broken = tmp_path / "broken" / "run.json.gz"
    broken.parent.mkdir()
    broken.write_bytes(first[: len(first) // 2])
    with pytest.raises(DataError, match="run.json.gz: cannot read result file"):
        Store(f"sqlite:///{tmp_path / 'broken.db'}").ingest(broken.parent)


def test_the_users_store_is_layered_on_the_bundles(tmp_path):
    from dare_bench.leaderboard import data as L

    shipped = Store(f"sqlite:///{tmp_path / 'shipped.db'}")
    _run(shipped, "d1-llada-sudoku", 0, 0.3)
    _run(shipped, "d1-llada-sudoku", 1, 0.5)
    export_bundle(shipped, tmp_path / "bundle")
    user = Store(f"sqlite:///{tmp_path / 'user.db'}")
    _run(user, "d1-llada-sudoku", 2, 0.7)
    user.ingest(tmp_path / "bundle")  # the user already holds the bundle's runs too: each kept once
    merged = merged_database([tmp_path / "bundle"], user.url, home=tmp_path / "home")
    assert (merged["bundle_runs"], merged["user_runs"]) == (2, 3)
    cells = L.winners(L.open_reader(merged["url"]), backbone="llada", scale="micro")
    d1 = cells[cells["algorithm"] == "d1"].iloc[0]
    assert d1.n == 3 and d1["mean"] == pytest.approx(0.5)
    alone = merged_database([tmp_path / "bundle"], None, home=tmp_path / "home")
    assert alone["user_runs"] == 0 and alone["url"] != merged["url"]
    assert len(list((tmp_path / "home" / "leaderboard").glob("merged-*.db"))) == 1  # the earlier build is gone


def test_cli_export_bundle_and_its_bad_input(tmp_path):
    db = f"sqlite:///{tmp_path / 'src.db'}"
    _run(Store(db), "d1-llada-sudoku", 0, 0.3)
    ok = runner.invoke(app, ["export", "--bundle", str(tmp_path / "b"), "--db", db, "--reproduction", "d1-*"])
    assert ok.exit_code == 0 and "wrote 1 result file(s)" in ok.output
    both = runner.invoke(app, ["export", "--bundle", str(tmp_path / "c"), "--format", "csv", "--db", db])
    assert both.exit_code != 0 and "exactly one of --format" in str(both.exception)
    stray = runner.invoke(app, ["export", "--format", "csv", "--scale", "tiny", "--db", db])
    assert stray.exit_code != 0 and "select what a --bundle holds" in str(stray.exception)


def test_a_fresh_install_shows_the_bundle_alone(tmp_path, monkeypatch):
    from dare_bench.leaderboard.commands import layered_url

    monkeypatch.setenv("DARE_BENCH_HOME", str(tmp_path / "home"))
    src = Store(f"sqlite:///{tmp_path / 'src.db'}")
    _run(src, "d1-llada-sudoku", 0, 0.3)
    export_bundle(src, tmp_path / "bundle")
    url = layered_url(f"sqlite:///{tmp_path / 'never-made.db'}", [tmp_path / "bundle"], None)
    assert Store(url).latest_runs(limit=None)[0]["reproduction"] == "d1-llada-sudoku"
    from dare_bench.errors import StoreError

    with pytest.raises(StoreError, match="no database at"):  # a store named with --db must exist
        layered_url(str(tmp_path / "typo.db"), [tmp_path / "bundle"], str(tmp_path / "typo.db"))


def test_export_selects_the_runs_of_one_base(tmp_path):
    """`export --bundle --base PREFIX`: only runs that started from that SFT base (a row "task @ base" of the
    leaderboard), so one row of a store whose entry also has runs on another machine's base exports (with
    `--bases`) in one command; a prefix that is not hex is one error, one that matches nothing writes nothing."""
    src = f"sqlite:///{tmp_path / 'src.db'}"
    store = Store(src)
    _run(store, "d1-llada-sudoku", 0, 0.3, base_sha="ab" * 32)
    _run(store, "d1-llada-sudoku", 1, 0.4, base_sha="cd" * 32)
    _run(store, "d1-llada-sudoku", 2, 0.5, base_sha="cd" * 32)
    store.close()
    out = runner.invoke(app, ["export", "--bundle", str(tmp_path / "b"), "--base", "cdcd", "--db", src])
    assert out.exit_code == 0, out.output
    names = sorted(p.name for p in (tmp_path / "b").glob("*.json.gz"))
    assert [n.split(".")[2] for n in names] == ["seed1", "seed2"]
    bad = runner.invoke(app, ["export", "--bundle", str(tmp_path / "c"), "--base", "600DEEC0!", "--db", src])
    assert isinstance(bad.exception, ConfigError) and "prefix of a base's weight hash" in str(bad.exception)
    assert not (tmp_path / "c").exists()
    none = runner.invoke(app, ["export", "--bundle", str(tmp_path / "d"), "--base", "ef01", "--bases", "--db", src])
    assert isinstance(none.exception, DataError) and "base ef01" in str(none.exception)
    assert not (tmp_path / "d").exists()
    table = runner.invoke(app, ["export", "--format", "csv", "--base", "cdcd", "--db", src])
    assert isinstance(table.exception, ConfigError) and "select what a --bundle holds" in str(table.exception)
