import os

import pytest
import torch

# Skips that a complete checkout may still show: no CUDA, an optional extra not installed, no system browser.
# Under DARE_BENCH_FAIL_ON_SKIP=1 (set by .ci/run) any other skip fails, so a lost fixture, data file or sandbox
# isolation cannot pass unseen as "skipped".
ALLOWED_SKIP_MARKERS = ("gpu", "extra", "browser")

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


@pytest.fixture
def one_thread():
    """Torch on one thread for the test: the tiny models' small matmuls run ~10x faster on one thread than on two
    on a shared 2-core machine. A module opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or os.environ.get("DARE_BENCH_FAIL_ON_SKIP") != "1":
        return
    if getattr(report, "wasxfail", None) is not None or any(m in item.keywords for m in ALLOWED_SKIP_MARKERS):
        return
    reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (f"skipped under DARE_BENCH_FAIL_ON_SKIP=1 "
                       f"(only {', '.join(ALLOWED_SKIP_MARKERS)} tests may skip): {reason}")
