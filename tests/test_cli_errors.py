"""Failing commands report one line on stderr and exit 2; with `--json` they also print a JSON error object on
stdout (CI parses stdout), and leave nothing behind."""

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("args", [
    ["reproduce", "d1-llada-sudokku", "--scale", "micro", "--json"],
    ["check", "no-such-reproduction", "--json"],
])
def test_json_commands_print_an_error_object(args, tmp_path):
    db = tmp_path / "runs.db"
    res = subprocess.run([sys.executable, "-m", "dare_bench.cli", *args, "--db", str(db)], capture_output=True,
                         text=True, env={**os.environ, "DARE_BENCH_HOME": str(tmp_path / "home")})
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith("error: ")
    payload = json.loads(res.stdout.strip().splitlines()[-1])
    assert payload["status"] == "error" and payload["exit_code"] == 2 and payload["error_type"] == "ConfigError"
    assert "did you mean" in payload["error"] or "no-such-reproduction" in payload["error"]
    assert not db.exists()


def test_without_json_stdout_stays_empty(tmp_path):
    res = subprocess.run([sys.executable, "-m", "dare_bench.cli", "check", "no-such-reproduction"],
                         capture_output=True, text=True, env={**os.environ, "DARE_BENCH_HOME": str(tmp_path)})
    assert res.returncode == 2 and res.stdout == "" and len(res.stderr.strip().splitlines()) == 1
