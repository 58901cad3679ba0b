"""Hostile programs are contained by the sandbox and scored as failures while the caller carries on."""

import os
import sys

import pytest

from dare_bench import sandbox
from dare_bench.sandbox import isolation, run_code, run_many

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sandbox targets Linux")


def test_passing_and_failing_programs():
    ok = run_code("def f(x):\n    return x * 2\nassert f(3) == 6\nprint('done')")
    assert ok.passed and ok.status == "ok" and ok.stdout.strip() == "done" and ok.returncode == 0
    bad = run_code("assert 1 + 1 == 3")
    assert not bad.passed and bad.status == "error" and "AssertionError" in bad.stderr
    syntax = run_code("def broken(:\n")
    assert not syntax.passed and syntax.status == "error" and "SyntaxError" in syntax.stderr


def test_early_exit_is_not_a_pass():
    for program in ("import sys\nsys.exit(0)\nassert False", "import os\nos._exit(0)\nassert False"):
        r = run_code(program)
        assert not r.passed and r.status == "error", program


def test_infinite_loop_times_out():
    r = run_code("while True:\n    pass", timeout=1.0)
    assert not r.passed and r.status == "timeout"
    assert 0.9 <= r.seconds < 2.5


def test_huge_allocation_is_a_memory_failure():
    r = run_code("x = bytearray(8 * 1024 ** 3)\nprint('allocated')", memory_mb=512)
    assert not r.passed and r.status == "memory" and "allocated" not in r.stdout


@pytest.mark.parametrize("guard", [True, False])
def test_fork_storm_is_contained_and_reaped(guard):
    # print our uid first, then fork forever; each child keeps forking too
    program = (
        "import os, sys\nprint(os.getuid(), flush=True)\n"
        "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    r = run_code(program, timeout=1.5, guard=guard)
    assert not r.passed and r.status in ("error", "timeout")
    if isolation().own_uid:
        uid = int(r.stdout.split()[0])
        assert uid != 0 and sandbox._pids_of_uid(uid) == []


def test_escaped_background_children_are_killed_afterwards():
    if not isolation().own_uid:
        pytest.skip("reaping beyond the process group needs an own uid")
    # the child leaves the process group (setsid) and would outlive a killpg; the program itself passes
    program = (
        "import os, time\npid = os.fork()\nif pid == 0:\n    os.setsid()\n    time.sleep(60)\n    os._exit(0)\n"
        "print(pid, flush=True)\n"
    )
    r = run_code(program, guard=False)
    assert r.passed, r.stderr
    child = int(r.stdout.split()[0])
    try:
        with open(f"/proc/{child}/status") as f:
            state = [line.split()[1] for line in f if line.startswith("State:")][0]
        assert state in ("Z", "X")  # dead, waiting to be reaped by init
    except FileNotFoundError:
        pass


@pytest.mark.parametrize("guard", [True, False])
def test_write_outside_workdir_is_refused(guard, tmp_path):
    if not guard and not (isolation().mount_namespace or isolation().own_uid):
        pytest.skip("no OS-level file isolation without root")
    target = tmp_path / "pwned.txt"
    tmp_target = f"/tmp/dare-sandbox-pwned-{os.getpid()}-{guard}"
    program = f"open({str(target)!r}, 'w').write('x')\nopen({tmp_target!r}, 'w').write('x')"
    r = run_code(program)
    assert not r.passed and r.status == "error"
    assert not target.exists() and not os.path.exists(tmp_target)
    inside = run_code("open('scratch.txt', 'w').write('fine')\nimport tempfile\ntempfile.TemporaryFile().write(b'x')",
                      guard=guard)
    assert inside.passed, inside.stderr


@pytest.mark.parametrize("guard", [True, False])
def test_network_is_unreachable(guard):
    if not guard and not isolation().network_namespace:
        pytest.skip("no network namespace here")
    program = "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)\nprint('connected')"
    r = run_code(program, guard=guard)
    assert not r.passed and r.status == "error" and "connected" not in r.stdout


@pytest.mark.parametrize("guard", [True, False])
def test_cannot_kill_the_parent(guard):
    if not guard and not isolation().own_uid:
        pytest.skip("without an own uid only the audit hook stops this")
    program = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(1, signal.SIGTERM)"
    r = run_code(program, guard=guard)
    assert not r.passed and r.status == "error"
    assert os.getpid() > 0  # still here


def test_environment_is_minimal_and_private():
    os.environ["DARE_SECRET_TOKEN"] = "hunter2"
    try:
        r = run_code("import os\nprint(sorted(os.environ))\nprint(os.getcwd() == os.path.expanduser('~'))")
    finally:
        del os.environ["DARE_SECRET_TOKEN"]
    assert r.passed
    keys = eval(r.stdout.splitlines()[0])
    assert "DARE_SECRET_TOKEN" not in keys and set(keys) <= {"PATH", "LANG", "HOME", "TMPDIR", "OMP_NUM_THREADS",
                                                            "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}
    assert r.stdout.splitlines()[1] == "True"


def test_temp_and_home_directories_are_hidden(tmp_path):
    if not isolation().mount_namespace:
        pytest.skip("no mount namespace here")
    secret = tmp_path / "secret.txt"
    secret.write_text("token")
    program = (f"import os, sys\nprint(os.path.exists({str(secret)!r}))\n"
               "allowed = {os.path.basename(os.getcwd())} | {os.path.realpath(p).split('/')[2] for p in "
               "(sys.prefix, sys.base_prefix) if os.path.realpath(p).startswith('/tmp/')}\n"
               "print(set(os.listdir('/tmp')) <= allowed)")
    r = run_code(program)
    # /tmp holds only its own working directory (and the interpreter, when a venv lives there)
    assert r.passed and r.stdout.split() == ["False", "True"], r.stderr


def test_hook_only_fallback_blocks_network_and_writes(tmp_path):
    # the path a non-root machine takes: no uid, no namespaces, only the audit hook
    target = tmp_path / "x.txt"
    w = sandbox._run(f"open({str(target)!r}, 'w')", 5.0, 512, None, False, False, False, True)
    s = sandbox._run("import socket\nsocket.socket()", 5.0, 512, None, False, False, False, True)
    f = sandbox._run("import subprocess\nsubprocess.run(['true'])", 5.0, 512, None, False, False, False, True)
    assert [w.status, s.status, f.status] == ["error"] * 3 and not target.exists()
    assert "sandbox:" in w.stderr and "sandbox:" in s.stderr and "sandbox:" in f.stderr


def test_process_start_is_refused_even_through_the_c_helper():
    direct = run_code("import _posixsubprocess\n_posixsubprocess.fork_exec(*([None] * 20))")
    reimport = run_code("import sys, _posixsubprocess\ndel sys.modules['_posixsubprocess']\nimport _posixsubprocess")
    assert direct.status == reimport.status == "error"
    assert "sandbox:" in direct.stderr and "sandbox:" in reimport.stderr


def test_output_is_capped():
    r = run_code("import sys\nfor _ in range(2000):\n    sys.stdout.write('x' * 1000)\n    sys.stderr.write('y' * 100)")
    assert r.passed and len(r.stdout) == len(r.stderr) == sandbox.MAX_OUTPUT_CHARS


def test_run_many_keeps_order_and_isolates_failures():
    programs = ["print(1)", "while True: pass", "raise ValueError", "print(4)"]
    results = run_many(programs, timeout=1.0, workers=2)
    assert [r.status for r in results] == ["ok", "timeout", "error", "ok"]
    assert results[0].stdout.strip() == "1" and results[3].stdout.strip() == "4"
