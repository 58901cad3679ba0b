"""`dare-bench leaderboard`: serve the Streamlit leaderboard over a results database (read-only).

    dare-bench leaderboard                                  # DARE_BENCH_DB, else $DARE_BENCH_HOME/results.db
    dare-bench leaderboard --db results.db --port 8501      # http://127.0.0.1:8501
    dare-bench leaderboard --db postgresql://host/db --host 0.0.0.0   # only when you mean to expose it

The database is checked before the server starts (missing file, not a dare-bench database, old schema: one
error line, exit 2). The app file ships inside the package (`dare_bench/leaderboard/app.py`), so a normal
install and an editable checkout serve the same thing; `leaderboard/app.py` is a thin entry for `streamlit run`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from dare_bench.fileio import DB_HELP

APP = Path(__file__).resolve().parent / "app.py"


def streamlit_command(url: str, *, port: int, host: str) -> tuple[list[str], dict[str, str]]:
    """argv and environment of the server: headless, no usage statistics, no file watcher, no Deploy toolbar."""
    argv = [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.headless", "true",
        "--server.address", host,
        "--server.port", str(port),
        "--browser.gatherUsageStats", "false",
        # The default watcher walks the app's directory tree (site-packages or the repo) and can overflow inotify.
        "--server.fileWatcherType", "none",
        "--client.toolbarMode", "viewer",
    ]
    env = dict(os.environ, DARE_BENCH_DB=url, STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    return argv, env


def register(app: typer.Typer) -> None:
    @app.command("leaderboard")
    def leaderboard_cmd(
        db: Optional[str] = typer.Option(None, "--db", help=DB_HELP, show_default=False),
        port: int = typer.Option(8501, "--port", min=1, max=65535, help="TCP port to serve on."),
        host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (localhost by default)."),
    ) -> None:
        """Serve the leaderboard: winners per backbone, reported vs reproduced, curves, run drill-down."""
        from dare_bench.leaderboard.data import database_target, open_reader

        url = database_target(db)
        open_reader(url).dispose()  # fail here, in one line, rather than in the browser
        argv, env = streamlit_command(url, port=port, host=host)
        from dare_bench.leaderboard.data import display_url

        typer.echo(f"leaderboard on http://{host}:{port} (database {display_url(url)}); Ctrl-C stops it", err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        # exec: the server replaces this process, so signals (Ctrl-C, a test's kill) reach Streamlit directly.
        os.execve(sys.executable, argv, env)
