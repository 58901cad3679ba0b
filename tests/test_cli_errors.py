"""What CI relies on: failing commands report one line on stderr and exit 2, with `--json` also a JSON error
object on stdout, and leave nothing behind; the suite's DARE_BENCH_FAIL_ON_SKIP switch fails lost fixtures."""

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


def test_fail_on_skip_switch_fails_every_skip_but_the_allowed_markers(tmp_path):
    """CI's DARE_BENCH_FAIL_ON_SKIP=1 (tests/conftest.py): a skip fails the run unless the test is marked gpu /
    extra / browser; without the switch a skip stays a skip."""
    probe = tmp_path / "test_probe.py"
    probe.write_text("import pytest\n\n"
                     "def test_lost_fixture():\n    pytest.skip('fixture absent')\n\n"
                     "@pytest.mark.gpu\ndef test_needs_cuda():\n    pytest.skip('needs CUDA')\n")
    tests_dir = os.path.dirname(os.path.abspath(__file__))

    def run(strict):
        env = {**os.environ, "PYTHONPATH": tests_dir, "DARE_BENCH_FAIL_ON_SKIP": "1" if strict else "0"}
        return subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q",
                               "-rfs", str(probe)], capture_output=True, text=True, env=env, cwd=tmp_path)

    strict, lenient = run(True), run(False)
    assert strict.returncode == 1 and "1 failed, 1 skipped" in strict.stdout, strict.stdout
    assert "DARE_BENCH_FAIL_ON_SKIP" in strict.stdout and "fixture absent" in strict.stdout
    assert lenient.returncode == 0 and "2 skipped" in lenient.stdout, lenient.stdout


@pytest.mark.parametrize(("args", "code"), [(["--version"], 0), (["check", "no-such-reproduction"], 2)])
def test_a_torchrun_worker_ends_through_exit_worker_with_the_commands_code(args, code, monkeypatch):
    """Under torchrun (WORLD_SIZE > 1) the CLI ends with `exit_worker` (os._exit after flushing: gloo can abort an
    interpreter teardown) and the exit code the command would give; outside torchrun it raises SystemExit as usual."""
    from dare_bench import cli
    from dare_bench.trainers import distributed

    ended = []

    def fake_exit_worker(c):
        ended.append(c)
        raise RuntimeError("ended")  # stands in for os._exit, which would end the test process

    monkeypatch.setattr(distributed, "exit_worker", fake_exit_worker)
    monkeypatch.setattr(sys, "argv", ["dare-bench", *args])
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="ended"):
        cli.main()
    assert ended == [code]
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == code and ended == [code]


def test_no_command_prints_the_help_and_exits_2():
    res = subprocess.run([sys.executable, "-m", "dare_bench.cli"], capture_output=True, text=True)
    assert res.returncode == 2 and "Commands" in res.stdout
