"""tiny / micro runs default to one torch thread unless OMP_NUM_THREADS is set (issue #16: an OpenMP pool per core
on a shared machine ran a tiny SFT 18x slower, and the thread count moved the tiny base's numerics)."""

from __future__ import annotations

import pytest
import torch

from dare_bench.pipeline import TINY_THREADS, default_threads, reproduce


@pytest.fixture
def two_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)


@pytest.mark.parametrize("scale,inside", [("tiny", TINY_THREADS), ("micro", TINY_THREADS), ("paper", 2)])
def test_default_threads_by_scale(two_threads, scale, inside):
    with default_threads(scale):
        assert torch.get_num_threads() == inside
    assert torch.get_num_threads() == 2


def test_omp_num_threads_wins(two_threads, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    with default_threads("tiny"):
        assert torch.get_num_threads() == 2


@pytest.mark.integration
def test_a_micro_run_records_the_thread_count_it_ran_with(two_threads, tmp_path, monkeypatch):
    from dare_bench.store import Store

    monkeypatch.setenv("DARE_BENCH_HOME", str(tmp_path / "home"))
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    result = reproduce("baseline-llada-sudoku", "micro", db=db, progress=False, log=lambda *_: None)
    assert Store(db).get_run(result.run_id)["hardware"]["torch_threads"] == TINY_THREADS
    assert torch.get_num_threads() == 2  # restored after the run
