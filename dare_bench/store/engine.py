"""Engine factory and schema upgrade for the results store.

    from dare_bench.store.engine import resolve_url, open_database
    engine = open_database(resolve_url(None))      # DARE_BENCH_DB, else $DARE_BENCH_HOME/results.db

SQLite (the default) is opened in WAL mode with a busy timeout, and every transaction starts with BEGIN IMMEDIATE:
with the default deferred BEGIN, a read-then-write transaction that loses the race for the write lock fails with
"database is locked" even with a busy timeout, so several writer processes would lose rows. Any other
SQLAlchemy URL (postgresql://...) is used as given; it is the store for workers on several machines (`dare-bench
sweep --executor submitit --db postgresql+psycopg2://user@host/db`: a database server takes concurrent writers from
many hosts, an SQLite file on a network filesystem does not). A URL whose driver is missing is one StoreError.
Opening a database upgrades an older schema with the alembic migrations shipped in `dare_bench/store/migrations/`;
a schema from a newer dare-bench is refused untouched.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DatabaseError, OperationalError, SQLAlchemyError

from dare_bench.errors import StoreError
from dare_bench.fileio import dare_bench_home
from dare_bench.store.models import HEAD, REVISIONS, Base

BUSY_TIMEOUT_S = 60
READ_ONLY = "read_only"  # execution option: a transaction that only reads (deferred BEGIN on SQLite)
MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def resolve_url(db: str | None = None) -> str:
    """`--db` value, else `DARE_BENCH_DB`, else `$DARE_BENCH_HOME/results.db`; a bare path means SQLite."""
    value = db or os.environ.get("DARE_BENCH_DB") or str(dare_bench_home() / "results.db")
    if "://" in value:
        return value
    return f"sqlite:///{Path(value).expanduser().resolve()}"


def make_engine(url: str) -> Engine:
    if not url.startswith("sqlite"):
        return create_engine(url, future=True, pool_pre_ping=True)
    path = url.split(":///", 1)[1] if ":///" in url else ""
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):  # noqa: ANN001
        # Let SQLAlchemy's "begin" event issue BEGIN itself (pysqlite would otherwise emit a deferred BEGIN).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_S * 1000}")
        cur.execute("PRAGMA foreign_keys=ON")
        if path and path != ":memory:":
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):  # noqa: ANN001
        # Readers (engine.execution_options(read_only=True)) take no lock in WAL mode and never wait for writers.
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE")

    return engine


def _alembic_config(connection):  # noqa: ANN001
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


def script_head() -> str:
    """Head revision of the shipped migration scripts (a test checks it equals models.HEAD)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config(None)).get_current_head()


def upgrade_to(engine: Engine, revision: str = "head") -> None:
    """Run the migrations up to `revision` (tests use this to build an older-schema database)."""
    from alembic import command

    with engine.begin() as conn:
        command.upgrade(_alembic_config(conn), revision)


def open_database(url: str) -> Engine:
    """An engine on `url` whose schema is at HEAD; raises StoreError (and changes nothing) when it cannot be."""
    try:
        engine = make_engine(url)
    except ImportError as exc:  # postgresql:// without its driver: SQLAlchemy imports it here
        raise StoreError(f"cannot open database {_safe(url)}: its driver is not installed ({exc}; e.g. pip install "
                         "psycopg2-binary for postgresql+psycopg2://, 'psycopg[binary]' for postgresql://)") from None
    except (SQLAlchemyError, ValueError, OSError) as exc:
        raise StoreError(f"cannot open database {_safe(url)}: {exc}") from None
    try:
        with engine.begin() as conn:  # a write transaction: concurrent openers migrate one at a time
            current = _current_revision(conn)
            if current == HEAD:
                return engine
            if current is not None and current not in REVISIONS:
                raise StoreError(
                    f"database {_safe(url)} has schema revision {current!r}, newer than this dare-bench knows "
                    f"(latest {HEAD!r}); upgrade dare-bench to use it"
                )
            if current is None:
                foreign = set(inspect(conn).get_table_names()) - set(Base.metadata.tables)
                if foreign:
                    raise StoreError(
                        f"database {_safe(url)} is not a dare-bench database (it has tables {sorted(foreign)[:5]})"
                    )
            from alembic import command

            command.upgrade(_alembic_config(conn), "head")
    except StoreError:
        engine.dispose()
        raise
    except (DatabaseError, OperationalError) as exc:
        engine.dispose()
        reason = str(getattr(exc, "orig", exc)) or type(exc).__name__
        raise StoreError(f"cannot open database {_safe(url)}: {reason} (not an SQLite database, or corrupt?)") from None
    return engine


def _current_revision(conn) -> str | None:  # noqa: ANN001
    if not inspect(conn).has_table("alembic_version"):
        return None
    rows = [r[0] for r in conn.exec_driver_sql("SELECT version_num FROM alembic_version")]
    if len(rows) > 1:
        raise StoreError(f"database has several schema heads {rows}; it was not made by dare-bench")
    return rows[0] if rows else None


def _safe(url: str) -> str:
    """The URL without a password, for messages."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - a malformed URL is reported as given
        return url
