"""Shared SFT bases in a bundle (issue #16, machine-stable bases): `export --bundle --bases` writes the bases the
runs started from, `ingest` verifies and installs them, and a reproduction on the ingesting machine then starts from
those exact weights (its run joins the bundle's base group). Edited, renamed or missing bases are one error each,
with nothing written."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from typer.testing import CliRunner

from dare_bench.cli import app
from dare_bench.errors import DataError
from dare_bench.pipeline.shared_bases import bundle_bases, install_bases
from dare_bench.store import Store
from dare_bench.store.bundle import BASES_DIR, export_bundle

runner = CliRunner()
NAME = "sft-llada-sudoku"
QUICK = ["train.steps=1"]


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A micro run made in one home, exported with its base: (bundle directory, the run, its home)."""
    from dare_bench.pipeline import reproduce

    root = tmp_path_factory.mktemp("published")
    mp = pytest.MonkeyPatch()
    mp.setenv("DARE_BENCH_HOME", str(root / "home"))
    try:
        db = f"sqlite:///{root / 'src.db'}"
        result = reproduce(NAME, "micro", seed=0, db=db, overrides=QUICK, log=lambda _: None, progress=False)
        out = runner.invoke(app, ["export", "--bundle", str(root / "bundle"), "--scale", "micro", "--bases",
                                  "--db", db])
        run = Store(db).get_run(result.run_id)
    finally:
        mp.undo()
    assert out.exit_code == 0 and "wrote 1 result file(s) and 1 SFT base(s)" in out.output, out.output
    return root / "bundle", run, root / "home"


def test_export_writes_the_base_record_and_weights_only(published):
    bundle, run, home = published
    (base,) = (bundle / BASES_DIR).iterdir()
    assert sorted(p.name for p in base.iterdir()) == ["base.json", "model"]  # not the cached evaluations
    assert list((home / "bases" / base.name).glob("eval-*.json"))  # which the source cache does hold
    assert json.loads((base / "base.json").read_text())["identity"]["weights_sha256"] == run["base_sha256"]
    assert bundle_bases(bundle) == [(base, run["base_sha256"])]


def test_ingest_installs_the_base_and_a_new_run_starts_from_it(published, tmp_path, monkeypatch):
    from dare_bench.pipeline import reproduce
    from dare_bench.pipeline.base_cache import cached_bases

    bundle, run, _ = published
    monkeypatch.setenv("DARE_BENCH_HOME", str(tmp_path / "other-machine"))
    db = f"sqlite:///{tmp_path / 'mine.db'}"
    out = runner.invoke(app, ["ingest", str(bundle), "--db", db])
    assert out.exit_code == 0, out.output
    assert "ingested 1 file(s): 1 new run(s)" in out.output  # the base's JSON files are not read as results
    assert "bases: 1 installed in the base cache, 0 already there" in out.output
    assert run["base_sha256"] in cached_bases()

    logs: list[str] = []
    mine = reproduce(NAME, "micro", seed=1, db=db, overrides=QUICK, log=logs.append, progress=False)
    assert any(line.startswith("base: cached SFT base") for line in logs)  # not trained again here
    assert Store(db).get_run(mine.run_id)["base_sha256"] == run["base_sha256"]  # the bundle's group

    again = runner.invoke(app, ["ingest", str(bundle), "--db", db])
    assert again.exit_code == 0 and "bases: 0 installed in the base cache, 1 already there" in again.output


def test_a_different_cached_base_of_the_same_recipe_is_kept(published, tmp_path):
    bundle, _, _ = published
    (base,) = (bundle / BASES_DIR).iterdir()
    mine = tmp_path / "bases" / base.name
    shutil.copytree(base, mine)
    record = json.loads((mine / "base.json").read_text())
    record["identity"]["weights_sha256"] = "f" * 64  # stands for a base this machine trained itself
    (mine / "base.json").write_text(json.dumps(record))
    placed = install_bases(bundle_bases(bundle), home=tmp_path)
    assert placed == {"installed": [], "present": [], "kept": [base.name], "stale": []}
    assert json.loads((mine / "base.json").read_text())["identity"]["weights_sha256"] == "f" * 64


@pytest.mark.parametrize("damage, message", [
    ("weights", "its weights hash to .*base.json records .*edited or corrupt"),
    ("rename", "its name does not end in the digest of its recipe key"),
    ("record", "no readable base.json"),
])
def test_an_edited_base_refuses_the_whole_ingest(published, tmp_path, monkeypatch, damage, message):
    bundle, _, _ = published
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    (base,) = (copy / BASES_DIR).iterdir()
    if damage == "weights":
        weights = base / "model" / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0xFF  # one byte of the last tensor
        weights.write_bytes(bytes(data))
    elif damage == "rename":
        base.rename(base.with_name(base.name[:-1] + ("0" if base.name[-1] != "0" else "1")))
    else:
        (base / "base.json").write_text("{}")
    monkeypatch.setenv("DARE_BENCH_HOME", str(tmp_path / "home"))
    db = tmp_path / "mine.db"
    out = runner.invoke(app, ["ingest", str(copy), "--db", f"sqlite:///{db}"])
    assert out.exit_code != 0 and isinstance(out.exception, DataError)
    assert re.search(message, str(out.exception))
    assert not db.exists() or not Store(f"sqlite:///{db}").latest_runs(limit=None)  # no run ingested
    assert not (tmp_path / "home" / "bases").exists()  # no base installed


def test_export_of_a_base_not_in_this_cache_writes_nothing(published, tmp_path, monkeypatch):
    bundle, run, _ = published
    src = Store(f"sqlite:///{tmp_path / 'src.db'}")
    src.ingest(bundle)
    monkeypatch.setenv("DARE_BENCH_HOME", str(tmp_path / "empty-home"))
    out = runner.invoke(app, ["export", "--bundle", str(tmp_path / "out"), "--bases", "--db",
                              f"sqlite:///{tmp_path / 'src.db'}"])
    assert out.exit_code != 0 and isinstance(out.exception, DataError)
    assert re.search(f"1 base.* not in this machine's base cache .*{run['base_sha256'][:12]} \\({NAME}\\)",
                     str(out.exception))
    assert not (tmp_path / "out").exists()
    export_bundle(src, tmp_path / "plain")  # without --bases the same runs export
    assert not (tmp_path / "plain" / BASES_DIR).exists()
    out = runner.invoke(app, ["export", "--format", "csv", "--bases", "--db", f"sqlite:///{tmp_path / 'src.db'}"])
    assert out.exit_code != 0 and "select what a --bundle holds" in str(out.exception)


def test_a_base_of_another_base_training_version_is_not_installed(published, tmp_path, monkeypatch):
    from dare_bench.pipeline import shared_bases

    bundle, _, _ = published
    monkeypatch.setattr(shared_bases, "BASE_RECIPE_VERSION", shared_bases.BASE_RECIPE_VERSION + 1)
    (base,) = (bundle / BASES_DIR).iterdir()
    placed = install_bases(bundle_bases(bundle), home=tmp_path)
    assert placed == {"installed": [], "present": [], "kept": [], "stale": [base.name]}
    assert not (tmp_path / "bases").exists()
