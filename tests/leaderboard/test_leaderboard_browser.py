"""ONE end-to-end check: `dare-bench leaderboard` serves the real page, headless Chromium (Playwright) renders it.

Needs the system browser (Debian: `apt-get install -y chromium`) and the `playwright` Python package; skipped
with the reason when either is missing, or failed when DARE_BENCH_REQUIRE_BROWSER=1 (CI). Playwright's own browser
download is never used. Screenshots go to
`artifacts/leaderboard*.png` (git-ignored; CI keeps them as artifacts); the path is printed.
"""

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dare_bench.registry import load_registry
from dare_bench.store import Store

from lb_helpers import REPO, add_run, free_port, wait_healthy

pytestmark = [pytest.mark.browser, pytest.mark.integration]

CHROMIUM = os.environ.get("DARE_BENCH_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# Flags that work as root on a CI box (no sandbox, no GPU, no background network). Playwright gives the browser
# a fresh temporary profile itself (it refuses --user-data-dir in `args`).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = REPO / "artifacts"
TIMEOUT_MS = 120_000  # the shared 2-core machine can take a while to start Streamlit and Chromium


def _command() -> list[str]:
    script = Path(sys.executable).parent / "dare-bench"
    return [str(script)] if script.exists() else [sys.executable, "-m", "dare_bench.cli"]


@pytest.fixture
def two_algorithms_db(tmp_path) -> str:
    """llada × sudoku at micro: d1 (2 seeds) beats sft (2 seeds), BGPO at two MC counts and the baseline; reported
    scores synced."""
    url = f"sqlite:///{tmp_path / 'browser.db'}"
    store = Store(url)
    add_run(store, "baseline", 0.10)
    for seed, (sft, d1) in enumerate([(0.20, 0.40), (0.30, 0.50)]):
        add_run(store, "bgpo", 0.15 + seed / 20, seed=seed, steps=12, mc_samples=2)
        add_run(store, "bgpo", 0.25 + seed / 20, seed=seed, steps=12, mc_samples=8, overrides=["train.mc_samples=8"])
        add_run(store, "sft", sft, seed=seed, steps=12)
        add_run(store, "d1", d1, seed=seed, steps=12, n_samples=30)  # the newest run: the drill-down opens on it
    store.sync_reported(load_registry())
    store.close()
    return url


@pytest.fixture
def server(two_algorithms_db):
    port = free_port()
    log = open(Path(two_algorithms_db.split("///", 1)[1]).with_suffix(".log"), "w")
    proc = subprocess.Popen([*_command(), "leaderboard", "--no-bundle", "--db", two_algorithms_db,
                             "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
    try:
        wait_healthy(port, proc)
        yield f"http://127.0.0.1:{port}/"
    finally:
        # The command execs Streamlit, so its process group is the whole server.
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()


def _missing(reason: str) -> None:
    # CI sets DARE_BENCH_REQUIRE_BROWSER=1 so that a lost browser install fails instead of quietly skipping.
    if os.environ.get("DARE_BENCH_REQUIRE_BROWSER") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture
def sync_api():
    """Checked before the server starts, so a missing browser costs nothing."""
    if not Path(CHROMIUM).exists():
        _missing(f"no system Chromium at {CHROMIUM} (Debian: apt-get install -y chromium)")
    try:
        from playwright import sync_api
    except ImportError:
        _missing("the playwright Python package is not installed (pip install -e '.[dev]')")
    return sync_api


def test_real_server_in_headless_chromium_shows_the_winner(sync_api, server):
    ARTIFACTS.mkdir(exist_ok=True)
    shots = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True, timeout=TIMEOUT_MS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1700})
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(server, wait_until="domcontentloaded")
            page.locator("h3", has_text="Which algorithm wins — every backbone, micro scale").wait_for()
            page.locator("[data-testid=stDataFrame]:visible").first.wait_for()  # the overview (the first tab)
            shots.append(_shot(page, "leaderboard-overview.png"))

            page.get_by_role("tab", name="Winners").click()
            best = page.get_by_text("Best per task")
            best.wait_for()
            assert "sudoku: d1 (0.450)" in best.inner_text()
            page.locator("h3", has_text="Winners — llada, micro scale").wait_for()
            shots.append(_shot(page, "leaderboard.png"))

            page.get_by_role("tab", name="Reported vs reproduced").click()
            page.get_by_text("reproduced = ours × 100").wait_for()
            shots.append(_shot(page, "leaderboard-reported.png"))

            page.get_by_role("tab", name="Curves").click()
            charts = page.locator("[data-testid=stVegaLiteChart]:visible")  # this tab's, not the hidden ones'
            charts.nth(4).wait_for()  # reward, loss, KL, tokens per forward, stage times
            assert charts.count() == 5
            shots.append(_shot(page, "leaderboard-curves.png"))

            page.get_by_role("tab", name="Stability").click()
            page.get_by_text("Reward collapses").wait_for()
            page.get_by_text("MC-sample sensitivity").wait_for()
            # reward with seed bands, then BGPO's final score per MC count
            page.locator("[data-testid=stVegaLiteChart]:visible").nth(1).wait_for()
            shots.append(_shot(page, "leaderboard-stability.png"))

            page.get_by_role("tab", name="Run drill-down").click()
            page.get_by_text("Resolved config").wait_for()
            page.get_by_text("test-version").first.wait_for()
            shots.append(_shot(page, "leaderboard-run.png"))
            page_info = page.get_by_text("30 samples (all); showing 25.")
            page_info.wait_for()
            page_info.scroll_into_view_if_needed()  # Streamlit scrolls its own container, not the document
            shots.append(_shot(page, "leaderboard-samples.png"))
        finally:
            browser.close()
    for shot in shots:
        print(f"screenshot: {shot}")
        assert shot.stat().st_size > 10_000


def _shot(page, name: str) -> Path:
    path = ARTIFACTS / name
    page.wait_for_timeout(1200)  # let charts and the data grid finish drawing
    page.screenshot(path=str(path), full_page=True)
    return path
