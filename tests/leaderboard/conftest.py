import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dare_bench.registry import load_registry  # noqa: E402
from dare_bench.store import Store  # noqa: E402

from lb_helpers import add_run  # noqa: E402


@pytest.fixture(scope="session")
def winners_db(tmp_path_factory) -> str:
    """llada/sudoku at micro: d1 wins (2 seeds), sft and baseline behind; a tiny-scale run where sft would win
    (must never leak into the micro table); a modified d1 run (hidden by default); dream runs (other backbone)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('lb') / 'winners.db'}"
    store = Store(url)
    add_run(store, "baseline", 0.10, seed=0)
    add_run(store, "sft", 0.20, seed=0)
    add_run(store, "sft", 0.30, seed=1)
    add_run(store, "d1", 0.40, seed=0, n_samples=30)
    add_run(store, "d1", 0.50, seed=1)
    add_run(store, "d1", 0.99, seed=2, modified=True)
    add_run(store, "sft", 0.95, seed=0, scale="tiny")
    add_run(store, "d1", 0.05, seed=0, scale="tiny")
    add_run(store, "d1", 0.70, seed=0, backbone="dream", task="gsm8k")
    store.sync_reported(load_registry())
    store.close()
    return url


@pytest.fixture
def empty_db(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    Store(url).close()
    return url
