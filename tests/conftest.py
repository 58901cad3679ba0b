import pytest
import torch

from testpaths import CHECKPOINTS, DARE_DATA, LOSSES, PARITY, REPO, SHARED  # noqa: F401  (re-exported)

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
