import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DARE_BENCH_SHARED", REPO.parent / "shared"))
PARITY = SHARED / "fixtures" / "parity"
LOSSES = SHARED / "fixtures" / "losses"
DARE_DATA = SHARED / "data" / "dare"
CHECKPOINTS = SHARED / "data" / "checkpoints"

# Tiny models: one thread is as fast as two and does not collapse when cores are shared (OpenMP spin-waits).
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    """Tests never touch the user's cache or database."""
    monkeypatch.setenv("DARE_BENCH_HOME", str(tmp_path / "dare_home"))
    monkeypatch.delenv("DARE_BENCH_DB", raising=False)
