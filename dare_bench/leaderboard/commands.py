"""`dare-bench leaderboard`: serve the Streamlit leaderboard over a results database (read-only).

    dare-bench leaderboard                                  # the shipped bundle + your store (DARE_BENCH_DB, else
                                                            # $DARE_BENCH_HOME/results.db) layered on top
    dare-bench leaderboard --db results.db --port 8501      # http://127.0.0.1:8501
    dare-bench leaderboard --bundle results/mine            # another bundle too (repeatable)
    dare-bench leaderboard --no-bundle --db postgresql://host/db --host 0.0.0.0   # your store alone, exposed

With bundles (the default: dare-bench's committed CPU-scale comparison, `dare_bench/results/`), the page reads a
SQLite file built from them with your store's finished runs copied in (`store/bundle.py`: rebuilt when an input
changes, under $DARE_BENCH_HOME/leaderboard/); a fresh install without a store shows the bundle alone.

The database is checked before the server starts (missing file, not a dare-bench database, old schema: one
error line, exit 2). The app file ships inside the package (`dare_bench/leaderboard/app.py`), so a normal
install and an editable checkout serve the same thing; `leaderboard/app.py` is a thin entry for `streamlit run`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from dare_bench.fileio import DB_HELP
from dare_bench.store.bundle import SHIPPED, bundle_files

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


def layered_url(user_url: str, bundles: list, db_option: str | None) -> str:
    """The merged database of `bundles` and the user's store (`store.bundle.merged_database`); the user's store
    alone when there are no bundles. A store that does not exist yet (a fresh install) adds nothing, unless it was
    named with --db (then a missing file is the usual one-line error)."""
    if not bundles:
        return user_url
    from sqlalchemy.engine import make_url

    from dare_bench.leaderboard.data import open_reader
    from dare_bench.store.bundle import merged_database

    user: str | None = user_url
    parsed = make_url(user_url) if "://" in user_url else None
    missing = (parsed is None and not Path(user_url).is_file()) or (
        parsed is not None and parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").is_file())
    if missing and db_option is None:
        user = None  # the default store of a fresh install, not made yet: the bundles alone
    else:
        open_reader(user_url).dispose()  # a named or existing store must open (one-line error otherwise)
    merged = merged_database(bundles, user)
    typer.echo(f"leaderboard: {merged['bundle_runs']} bundled run(s) + {merged['user_runs']} of your own", err=True)
    return merged["url"]


def register(app: typer.Typer) -> None:
    @app.command("leaderboard")
    def leaderboard_cmd(
        db: Optional[str] = typer.Option(None, "--db", help=DB_HELP, show_default=False),
        port: int = typer.Option(8501, "--port", min=1, max=65535, help="TCP port to serve on."),
        host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (localhost by default)."),
        bundles: Optional[List[Path]] = typer.Option(None, "--bundle", help="A results bundle directory to show "
                                                     "as well (repeatable; the shipped one is always included)."),
        no_bundle: bool = typer.Option(False, "--no-bundle", help="Show your store alone, not layered on the "
                                       "shipped results bundle."),
    ) -> None:
        """Serve the leaderboard: winners per backbone, reported vs reproduced, curves, run drill-down."""
        from dare_bench.leaderboard.data import database_target, open_reader

        url = database_target(db)
        if not no_bundle:
            shipped = [SHIPPED] if SHIPPED.is_dir() and bundle_files(SHIPPED) else []
            url = layered_url(url, [*shipped, *(bundles or [])], db)
        open_reader(url).dispose()  # fail here, in one line, rather than in the browser
        argv, env = streamlit_command(url, port=port, host=host)
        from dare_bench.leaderboard.data import display_url

        typer.echo(f"leaderboard on http://{host}:{port} (database {display_url(url)}); Ctrl-C stops it", err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        # exec: the server replaces this process, so signals (Ctrl-C, a test's kill) reach Streamlit directly.
        os.execve(sys.executable, argv, env)

    @app.command("winners")
    def winners_cmd(
        scale: str = typer.Option("tiny", "--scale", help="The scale ranked (scales are never mixed)."),
        bundles: Optional[List[Path]] = typer.Option(None, "--bundle", help="Results bundle directories (default: "
                                                     "the shipped one, dare_bench/results/)."),
        db: Optional[str] = typer.Option(None, "--db", help="Rank a store instead of bundles.", show_default=False),
        readme: Optional[Path] = typer.Option(None, "--readme", help="Rewrite the winners block of this README "
                                              "(between its markers) with the table."),
        image: Optional[Path] = typer.Option(None, "--image", help="Also write the table as a PNG here (linked "
                                             "from the README block, relative to the README)."),
        as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
    ) -> None:
        """The winners table (backbone x task -> winner ± CI, margin, CI separation, vs SFT control), generated."""
        import json
        import os

        from dare_bench.errors import ConfigError
        from dare_bench.leaderboard.report import (
            markdown_table,
            superseded_counts,
            update_readme,
            winners_rows,
            write_image,
        )
        from dare_bench.store.bundle import merged_database

        if db is not None and bundles:
            raise ConfigError("rank either --db or --bundle directories, not both")
        if db is not None:
            url = db if "://" in db else f"sqlite:///{db}"
        else:
            url = merged_database(bundles or [SHIPPED], None)["url"]
        from dare_bench.pipeline.shared_bases import bundle_base_hashes

        rows = winners_rows(url, scale=scale, shipped_bases=bundle_base_hashes(bundles or [SHIPPED]))
        if as_json:
            typer.echo(json.dumps(rows))
            return
        markdown = markdown_table(rows, scale, superseded_counts(url, scale=scale))
        link = None
        if image is not None:
            write_image(rows, image, f"dare-bench winners, {scale} scale")
            link = os.path.relpath(image, readme.parent) if readme is not None else str(image)
        if readme is not None:
            changed = update_readme(readme, markdown, link)
            typer.echo(f"{readme}: winners block {'updated' if changed else 'already current'}", err=True)
        else:
            typer.echo(markdown, nl=False)

