"""Atomic writes: a reader (or a resumed run) never sees a half-written file or directory."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, **kwargs: Any) -> None:
    kwargs.setdefault("indent", 2)
    atomic_write_text(path, json.dumps(obj, **kwargs) + "\n")


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces `path` in one rename.

    An existing `path` is moved aside first and deleted only after the new one is in place, so a crash leaves
    either the old or the new directory, never a mix.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        yield tmp
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old.{os.getpid()}")
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# The one help text of every command's `--db` (store.engine.resolve_url reads the same order).
DB_HELP = ("Database path or SQLAlchemy URL (default: $DARE_BENCH_DB, else $DARE_BENCH_HOME/results.db; "
           "DARE_BENCH_HOME defaults to ~/.cache/dare-bench).")


def dare_bench_home() -> Path:
    """Where cached bases, checkpoints and run artefacts live (`DARE_BENCH_HOME`, default: the user cache dir)."""
    env = os.environ.get("DARE_BENCH_HOME")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dare-bench"
