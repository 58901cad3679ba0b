"""Opening databases: migrations on open, newer schemas and non-databases refused, URL resolution."""

import sqlite3

import pytest
from sqlalchemy import inspect

from dare_bench.errors import StoreError
from dare_bench.store import Store, resolve_url
from dare_bench.store.engine import make_engine, script_head, upgrade_to
from dare_bench.store.models import HEAD, REVISIONS, Base


def test_models_head_matches_migration_scripts():
    assert script_head() == HEAD
    assert len(set(REVISIONS)) == len(REVISIONS)


def test_migrated_schema_matches_orm(db_url):
    store = Store(db_url)
    insp = inspect(store.engine)
    for table in Base.metadata.sorted_tables:
        cols = {c["name"] for c in insp.get_columns(table.name)}
        assert cols == {c.name for c in table.columns}, table.name
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    with store.engine.connect() as conn:  # types, indexes, constraints: the migrations build exactly the ORM
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    with sqlite3.connect(db_url.split(":///")[1]) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_older_schema_upgrades_on_open(tmp_path, spec):
    path = tmp_path / "old.db"
    engine = make_engine(f"sqlite:///{path}")
    upgrade_to(engine, "0001")
    engine.dispose()
    with sqlite3.connect(path) as con:
        assert con.execute("SELECT version_num FROM alembic_version").fetchone()[0] == "0001"
        con.execute(
            "INSERT INTO runs (uid, reproduction, algorithm, backbone, task, scale, config_json, config_hash, modified,"
            " overrides_json, seed, code_version, packages_json, hardware_json, status, started_at)"
            " VALUES ('u1', 'd1-llada-sudoku', 'd1', 'llada', 'sudoku', 'micro', '{}', 'h', 0, '[]', 0, 'v', '{}',"
            " '{}', 'finished', '2026-01-01 00:00:00')"
        )
    store = Store(str(path))
    with sqlite3.connect(path) as con:
        assert con.execute("SELECT version_num FROM alembic_version").fetchone()[0] == HEAD
    (old,) = store.latest_runs()
    assert old["uid"] == "u1" and old["origin"] == "local"
    assert store.sync_reported([spec]) == 0  # the table added by 0002 exists


def test_newer_schema_is_refused_untouched(tmp_path):
    path = tmp_path / "new.db"
    Store(str(path)).close()
    with sqlite3.connect(path) as con:
        con.execute("UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(StoreError, match="newer than this dare-bench"):
        Store(str(path))
    with sqlite3.connect(path) as con:
        assert con.execute("SELECT version_num FROM alembic_version").fetchone()[0] == "9999"


def test_file_that_is_not_a_database(tmp_path):
    path = tmp_path / "junk.db"
    junk = b"this is not sqlite" * 100
    path.write_bytes(junk)
    with pytest.raises(StoreError, match="not an SQLite database"):
        Store(str(path))
    assert path.read_bytes() == junk


def test_foreign_sqlite_database_is_refused(tmp_path):
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE customers (id INTEGER)")
    with pytest.raises(StoreError, match="not a dare-bench database"):
        Store(str(path))
    with sqlite3.connect(path) as con:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"customers"}


def test_url_resolution(tmp_path, monkeypatch):
    assert resolve_url("postgresql://u:p@h/db") == "postgresql://u:p@h/db"
    assert resolve_url(str(tmp_path / "a.db")) == f"sqlite:///{tmp_path / 'a.db'}"
    monkeypatch.setenv("DARE_BENCH_DB", str(tmp_path / "env.db"))
    assert resolve_url(None).endswith("env.db")
    monkeypatch.delenv("DARE_BENCH_DB")
    assert resolve_url(None).endswith("dare_home/results.db")


def test_a_database_url_whose_driver_is_missing_is_one_store_error(monkeypatch):
    import sys

    from dare_bench.errors import StoreError
    from dare_bench.store import Store

    monkeypatch.setitem(sys.modules, "pg8000", None)  # `import pg8000` now fails, installed or not
    with pytest.raises(StoreError, match="driver is not installed"):
        Store("postgresql+pg8000://user@localhost/dare")
