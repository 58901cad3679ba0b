"""Run untrusted, model-written Python (HumanEval / MBPP completions) and report whether it passed.

A ground-floor service (standard library only): the code graders in `dare_bench.tasks.graders` and the evaluators
above them both use it.

What it does: each program runs in a fresh `python -I` child in its own session, with a wall-clock timeout,
rlimits (address space, CPU seconds, processes, file size, open files, no core dumps), a private temporary
working directory that is also its HOME and TMPDIR, an environment holding only PATH/LANG/HOME/TMPDIR, and its
whole process group (and, when it ran under its own uid, every process of that uid) SIGKILLed afterwards.

Layers, strongest first (`isolation()` says which ones this machine grants; all are probed once, then cached):

* **own uid** (when the evaluator runs as root): the child drops to a fresh, random, unprivileged uid, so it cannot
  signal the evaluator or any other process, cannot write anything owned by someone else, and RLIMIT_NPROC really
  caps its process count (the kernel exempts root from RLIMIT_NPROC, so without this a fork storm is unbounded).
* **network namespace** (`unshare(CLONE_NEWNET)`): the child sees only a down loopback device, so no connection of
  any kind leaves it.
* **mount namespace**: every mount is read-only except the private working directory; `/tmp`, `/var/tmp`,
  `/home`, `/root`, `/run/user` (other users' files and secrets) and any directory an unprivileged uid cannot
  traverse on the way to the interpreter are covered by empty tmpfs mounts, with only the interpreter's prefixes
  and the working directory bound back in.
* **audit hook** (always, PEP 578): installed before the program runs; refuses sockets, fork/exec/spawn/subprocess,
  kill of other processes, ctypes calls and writes outside the working directory. It is the only network/process
  guard when the OS layers are unavailable (not root) and a second line of defence otherwise.

A program passes only when it runs to its end and exits 0 within the limits: an early `sys.exit(0)` /
`os._exit(0)` (a cheap reward hack) does not count, because the trusted bootstrap prints a per-run nonce only after
the program returned normally.

    from dare_bench.sandbox import run_code, run_many, isolation
    run_code("assert 1 + 1 == 2").passed                  # True
    run_code("while True: pass", timeout=1).status          # "timeout"
    run_many([p1, p2, p3], timeout=5, workers=2)           # results in input order
    python -m dare_bench.sandbox                           # print the isolation layers this machine grants
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Sequence

STATUSES = ("ok", "error", "timeout", "killed", "memory")

# Exit codes the bootstrap uses to explain itself; a hostile program could fake them, but only to its own detriment.
_EXIT_MEMORY = 97
_EXIT_EARLY = 98
_EXIT_SETUP = 99

MAX_OUTPUT_CHARS = 64_000
MAX_PROCESSES = 32
MAX_FILE_MB = 16
MAX_OPEN_FILES = 128
# Covered by empty read-only tmpfs mounts inside the sandbox's mount namespace (the working directory and the
# interpreter are bound back in when they live below one of them).
HIDDEN_DIRS = ("/tmp", "/var/tmp", "/home", "/root", "/run/user")


@dataclass(frozen=True)
class SandboxResult:
    passed: bool
    status: str  # one of STATUSES
    stdout: str
    stderr: str
    seconds: float
    returncode: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


# The trusted bootstrap. It starts privileged (when the caller is root), reads its configuration and the program
# from stdin, isolates itself, drops privileges for good, and only then compiles and runs the program.
_BOOTSTRAP = r'''
import json, os, sys
cfg = json.loads(sys.stdin.buffer.read().decode("utf-8"))
_fd = os.open(os.devnull, os.O_RDONLY); os.dup2(_fd, 0); os.close(_fd)

def _setup(cfg):
    work = cfg["workdir"]
    if cfg["netns"] or cfg["mountns"]:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        def _check(rc, what):
            if rc != 0:
                e = ctypes.get_errno()
                raise OSError(e, os.strerror(e), what)
        flags = (0x40000000 if cfg["netns"] else 0) | (0x00020000 if cfg["mountns"] else 0)
        _check(libc.unshare(flags), "unshare")
        if cfg["mountns"]:
            MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
            def mount(src, tgt, fstype, fl, data=None):
                enc = lambda s: None if s is None else s.encode()
                _check(libc.mount(enc(src), enc(tgt), enc(fstype), ctypes.c_ulong(fl), enc(data)), "mount " + tgt)
            mount(None, "/", None, MS_REC | MS_PRIVATE)
            # Cover temp and home directories (other users' files, secrets) and any directory "others" cannot
            # traverse on the way to the interpreter with empty tmpfs mounts, then bind back in only what the
            # program needs: the interpreter's prefixes and its own working directory.
            import stat
            roots = sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix, sys.prefix)})
            hide = {d for d in cfg["hide"] if os.path.isdir(d) and not os.path.islink(d)}
            for root in roots:
                parts = root.strip("/").split("/")
                for i in range(1, len(parts) + 1):
                    anc = "/" + "/".join(parts[:i])
                    if not (os.stat(anc).st_mode & stat.S_IXOTH):
                        hide.add(anc)
                        break
            under = lambda p, d: p == d or p.startswith(d.rstrip("/") + "/")
            hide = sorted(d for d in hide if not any(o != d and under(d, o) for o in hide))  # outermost only
            expose = {}
            for path in roots + [work]:
                for d in hide:
                    if under(path, d) and path != d:
                        expose.setdefault(d, []).append((path, os.open(path, os.O_PATH | os.O_DIRECTORY)))
            for d in hide:
                mount("tmpfs", d, "tmpfs", 0, "mode=0755,size=64k")
                for path, fd in expose.get(d, []):
                    os.makedirs(path, mode=0o755, exist_ok=True)
                    mount("/proc/self/fd/%d" % fd, path, None, MS_BIND | MS_REC)
                    os.close(fd)
            if not os.path.ismount(work):
                mount(work, work, None, MS_BIND)
            # Everything read-only (one recursive mount_setattr), then the working directory writable again.
            class _Attr(ctypes.Structure):
                _fields_ = [("set", ctypes.c_uint64), ("clr", ctypes.c_uint64), ("prop", ctypes.c_uint64), ''' \
r'''("userns", ctypes.c_uint64)]
            ro = _Attr(1, 0, 0, 0)
            _check(libc.syscall(442, -100, b"/", 0x8000, ctypes.byref(ro), ctypes.sizeof(ro)), "mount_setattr /")
            rw = _Attr(0, 1, 0, 0)
            _check(libc.syscall(442, -100, work.encode(), 0, ctypes.byref(rw), ctypes.sizeof(rw)), "mount_setattr work")
            if os.path.ismount("/dev"):  # device nodes (/dev/null) must stay writable; /dev itself is root-owned
                _check(libc.syscall(442, -100, b"/dev", 0, ctypes.byref(rw), ctypes.sizeof(rw)), "mount_setattr /dev")
                if os.path.isdir("/dev/shm"):
                    mount("tmpfs", "/dev/shm", "tmpfs", MS_RDONLY, "size=4k")
    if cfg["uid"] is not None:
        os.setgroups([])
        os.setresgid(cfg["uid"], cfg["uid"], cfg["uid"])
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
    os.chdir(work)
    import resource
    for name, value in cfg["rlimits"].items():
        lim = getattr(resource, name)
        soft, hard = value if isinstance(value, list) else (value, value)
        resource.setrlimit(lim, (soft, hard))

try:
    _setup(cfg)
except Exception as exc:
    sys.stderr.write("sandbox setup failed: %r\n" % (exc,))
    sys.stderr.flush()
    os._exit(__EXIT_SETUP__)

_nonce = cfg.pop("nonce")
_program = cfg.pop("program")
_work = os.path.realpath(cfg["workdir"])
_guard = cfg["guard"]
del cfg

if _guard:
    _blocked = frozenset((
        "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
        "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg",
        "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen",
        "pty.spawn", "os.startfile", "os.killpg", "signal.pthread_kill",
        "ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.call_function", "ctypes.cdata",
        "os.chown", "os.lchown", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr",
    ))
    _path_events = frozenset((
        "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.symlink", "os.link", "os.truncate",
        "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile", "shutil.copytree",
    ))
    # `subprocess` stays importable (pandas, logging.handlers... import it) but cannot start anything: its C
    # helper has no audit event of its own, so it is disarmed here and re-importing a fresh copy is refused.
    import _posixsubprocess

    def _no_fork_exec(*args, **kwargs):
        raise PermissionError("sandbox: starting processes is not allowed")

    _posixsubprocess.fork_exec = _no_fork_exec
    _no_import = frozenset(("_posixsubprocess", "_xxsubinterpreters", "_xxinterpchannels"))
    _WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    _realpath, _fspath, _getpid, _sep = os.path.realpath, os.fspath, os.getpid, os.sep

    def _inside(p):
        try:
            p = _fspath(p)
        except TypeError:
            return True  # an fd or dir_fd-relative call: nothing to resolve here
        if isinstance(p, bytes):
            p = p.decode("utf-8", "surrogateescape")
        if p in ("/dev/null", "/dev/stdout", "/dev/stderr"):
            return True
        r = _realpath(p)
        return r == _work or r.startswith(_work + _sep)

    def _hook(event, args):
        if event in _blocked:
            raise PermissionError("sandbox: %s is not allowed" % event)
        if event == "open":
            path, mode, flags = args
            writing = (flags or 0) & _WRITE or (isinstance(mode, str) and any(c in mode for c in "wax+"))
            if writing and path is not None and not _inside(path):
                raise PermissionError("sandbox: writing outside the working directory is not allowed: %r" % (path,))
        elif event in _path_events:
            for a in args:
                if isinstance(a, (str, bytes)) or hasattr(a, "__fspath__"):
                    if not _inside(a):
                        raise PermissionError("sandbox: %s outside the working directory: %r" % (event, a))
        elif event == "os.kill":
            if args[0] not in (0, _getpid()):
                raise PermissionError("sandbox: signalling other processes is not allowed")
        elif event == "import" and args[0] in _no_import:
            raise ImportError("sandbox: module %s is not allowed" % args[0])

    sys.addaudithook(_hook)

import linecache
linecache.cache["<program>"] = (len(_program), None, _program.splitlines(True), "<program>")
_globals = {"__name__": "__main__", "__builtins__": __builtins__, "__file__": "<program>"}
_code = 0
try:
    exec(compile(_program, "<program>", "exec"), _globals)
except SystemExit as exc:
    if exc.code in (0, None):
        sys.stderr.write("sandbox: the program exited before running to its end\n")
        _code = __EXIT_EARLY__
    elif isinstance(exc.code, int):
        _code = exc.code
    else:
        sys.stderr.write("%s\n" % (exc.code,))
        _code = 1
except MemoryError:
    import traceback
    traceback.print_exc()
    _code = __EXIT_MEMORY__
except BaseException:
    import traceback
    traceback.print_exc()
    _code = 1
try:
    sys.stdout.flush()
except BaseException:
    pass
if _code == 0:
    sys.stderr.write("\n" + _nonce + "\n")
try:
    sys.stderr.flush()
except BaseException:
    pass
os._exit(_code)
'''
_BOOTSTRAP = (_BOOTSTRAP.replace("__EXIT_SETUP__", str(_EXIT_SETUP)).replace("__EXIT_EARLY__", str(_EXIT_EARLY))
              .replace("__EXIT_MEMORY__", str(_EXIT_MEMORY)))


@dataclass(frozen=True)
class Isolation:
    own_uid: bool
    network_namespace: bool
    mount_namespace: bool
    audit_hook: bool = True

    def describe(self) -> str:
        on = [n for n, v in (("own uid", self.own_uid), ("network namespace", self.network_namespace),
                             ("read-only mount namespace", self.mount_namespace), ("audit hook", self.audit_hook)) if v]
        return ", ".join(on)


_ISOLATION: Isolation | None = None
_ISOLATION_LOCK = threading.Lock()


def isolation(interpreter: str | None = None) -> Isolation:
    """The layers this machine grants, probed once with a trivial program (each layer separately)."""
    global _ISOLATION
    with _ISOLATION_LOCK:
        if _ISOLATION is None:
            root = os.geteuid() == 0 and sys.platform.startswith("linux")
            if not root:
                _ISOLATION = Isolation(False, False, False)
            else:
                probe = "pass"
                full = _run(probe, 10.0, 256, interpreter, True, True, True, True)
                if full.passed:
                    _ISOLATION = Isolation(True, True, True)
                else:
                    # grant what works on its own; the uid drop needs the mount namespace when the interpreter
                    # lives somewhere an unprivileged uid cannot read
                    net = _run(probe, 10.0, 256, interpreter, False, True, False, True).passed
                    uid = _run(probe, 10.0, 256, interpreter, True, False, False, True).passed
                    _ISOLATION = Isolation(uid, net, False)
        return _ISOLATION


def run_code(
    program: str,
    timeout: float = 5.0,
    memory_mb: int = 1024,
    *,
    interpreter: str | None = None,
    guard: bool = True,
) -> SandboxResult:
    """Run `program` in the sandbox; never raises for anything the program does.

    `guard=False` leaves out the audit hook (tests use it to show that the OS layers hold on their own).
    """
    if not isinstance(program, str):
        program = "" if program is None else str(program)
    iso = isolation(interpreter)
    return _run(program, float(timeout), int(memory_mb), interpreter, iso.own_uid, iso.network_namespace,
                iso.mount_namespace, guard)


def run_many(
    programs: Sequence[str] | Iterable[str],
    timeout: float = 5.0,
    memory_mb: int = 1024,
    *,
    workers: int | None = None,
    progress: bool | Callable[[int], None] = False,
    guard: bool = True,
) -> list[SandboxResult]:
    """Run many programs concurrently (threads each waiting on one child); results in input order."""
    programs = list(programs)
    if not programs:
        return []
    isolation()  # probe once, before the threads race for it
    workers = max(1, workers or min(len(programs), os.cpu_count() or 1))
    bar = None
    if progress is True:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(programs), desc="sandbox", unit="prog", leave=False)
    results: list[SandboxResult | None] = [None] * len(programs)

    def one(i: int) -> None:
        results[i] = run_code(programs[i], timeout, memory_mb, guard=guard)
        if bar is not None:
            bar.update(1)
        elif callable(progress):
            progress(1)

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(one, range(len(programs))))
    finally:
        if bar is not None:
            bar.close()
    return [r for r in results if r is not None]


def _rlimits(timeout: float, memory_mb: int, own_uid: bool) -> dict:
    cpu = int(math.ceil(timeout)) + 1
    limits = {
        "RLIMIT_AS": memory_mb * 1024 * 1024,
        # SIGXCPU at the soft limit, SIGKILL one second later: a busy loop dies even if wall-clock kill failed
        "RLIMIT_CPU": [cpu, cpu + 1],
        "RLIMIT_FSIZE": MAX_FILE_MB * 1024 * 1024,
        "RLIMIT_NOFILE": MAX_OPEN_FILES,
        "RLIMIT_CORE": 0,
    }
    if own_uid:
        # Counted per uid: meaningful only for a uid of our own (root is exempt, a shared uid counts strangers).
        limits["RLIMIT_NPROC"] = MAX_PROCESSES
    return limits


def _child_env(workdir: str) -> dict:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
        # numeric libraries reserve per-thread arenas that would eat the address-space limit
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _kill_uid(uid: int) -> None:
    """SIGKILL every process running as `uid`: `kill -1` as that uid is one atomic sweep of the process table."""
    kill = shutil.which("kill", path="/usr/bin:/bin")
    for _ in range(3):
        if kill:
            try:
                subprocess.run([kill, "-s", "KILL", "--", "-1"], user=uid, group=uid, extra_groups=[],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={"PATH": "/usr/bin:/bin"}, cwd="/", timeout=5)
            except (OSError, subprocess.SubprocessError):
                pass
        left = _pids_of_uid(uid)
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def _pids_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real uid is `uid`; zombies are already dead and get reaped by init."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                state = None
                for line in f:
                    if line.startswith("State:"):
                        state = line.split()[1]
                    elif line.startswith("Uid:"):
                        if int(line.split()[1]) == uid and state not in ("Z", "X"):
                            pids.append(int(name))
                        break
        except (OSError, ValueError, IndexError):
            continue
    return pids


def _read_capped(f) -> str:
    f.seek(0)
    data = f.read(MAX_OUTPUT_CHARS * 4)
    return data.decode("utf-8", "replace")[:MAX_OUTPUT_CHARS]


def _run(program: str, timeout: float, memory_mb: int, interpreter: str | None, own_uid: bool, netns: bool,
         mountns: bool, guard: bool) -> SandboxResult:
    python = interpreter or sys.executable
    uid = 1_000_000 + secrets.randbelow(1_000_000_000) if own_uid else None
    nonce = "DARE-SANDBOX-DONE-" + secrets.token_hex(16)
    workdir = tempfile.mkdtemp(prefix="dare-sandbox-")
    start = time.monotonic()
    timed_out = False
    proc = None
    try:
        if uid is not None:
            os.chown(workdir, uid, uid)
        os.chmod(workdir, 0o700)
        payload = json.dumps({
            "workdir": os.path.realpath(workdir), "uid": uid, "netns": netns, "mountns": mountns, "guard": guard,
            "rlimits": _rlimits(timeout, memory_mb, own_uid), "nonce": nonce, "program": program,
            "hide": list(HIDDEN_DIRS),
        }).encode("utf-8")
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(
                    [python, "-I", "-c", _BOOTSTRAP], stdin=subprocess.PIPE, stdout=out, stderr=err,
                    cwd=workdir, env=_child_env(os.path.realpath(workdir)), start_new_session=True, close_fds=True,
                )
            except OSError as exc:
                return SandboxResult(False, "error", "", f"sandbox: cannot start {python}: {exc}", 0.0, None)
            try:
                proc.communicate(input=payload, timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            except (BrokenPipeError, OSError):
                try:
                    proc.wait(timeout=max(0.0, timeout - (time.monotonic() - start)))
                except subprocess.TimeoutExpired:
                    timed_out = True
            finally:
                _kill_group(proc.pid)
                if uid is not None:
                    _kill_uid(uid)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            seconds = time.monotonic() - start
            stdout, stderr = _read_capped(out), _read_capped(err)
            # the marker is the last thing written: look for it at the end, however much came before
            err.seek(max(0, err.seek(0, os.SEEK_END) - 256))
            tail = err.read().decode("utf-8", "replace")
        rc = proc.returncode
        finished = rc == 0 and tail.rstrip("\n").endswith(nonce)
        stderr = stderr.replace("\n" + nonce + "\n", "").replace(nonce, "")
        if timed_out:
            status = "timeout"
        elif finished:
            status = "ok"
        elif rc == _EXIT_MEMORY or (rc != 0 and rc is not None and rc > 0 and "MemoryError" in stderr):
            status = "memory"
        elif rc is not None and rc < 0:
            # SIGXCPU / a SIGKILL at the CPU hard limit are the CPU-time flavour of a timeout
            cpu_limit = -rc == signal.SIGXCPU or (-rc == signal.SIGKILL and seconds >= timeout * 0.9)
            status = "timeout" if cpu_limit else "killed"
        else:
            status = "error"
        return SandboxResult(status == "ok", status, stdout, stderr, round(seconds, 4), rc)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def main() -> None:  # pragma: no cover - a diagnostic for people
    iso = isolation()
    print(f"sandbox isolation on this machine: {iso.describe()}")
    r = run_code("import sys; print('hello from', sys.version.split()[0])")
    print(f"smoke program: status={r.status} passed={r.passed} seconds={r.seconds} stdout={r.stdout.strip()!r}")


if __name__ == "__main__":
    main()
