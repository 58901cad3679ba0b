"""`reproduce --nproc N`: the same reproduction under torchrun, one process per GPU (or per CPU core, gloo).

The parent composes the torchrun command (`--dry-run` prints it), runs it and waits; inside, every rank runs
`pipeline.reproduce` and rank 0 alone writes: the store row, the metrics, checkpoints, the final model, and this
call's result (a JSON file named by `$DARE_BENCH_RESULT_FILE`), which the parent returns. A failed job gives one
error naming its exit status and its last error line; its run row is marked failed (by rank 0, or, when the job
was killed, by the next `reproduce`, which finds the dead process).

    dare-bench reproduce d1-llada-gsm8k --scale paper --checkpoint /ckpt/LLaDA-8B-Instruct --nproc 8
    dare-bench reproduce d1-llada-gsm8k --scale paper --checkpoint SHRUNK --device cpu --nproc 2 --dry-run

    from dare_bench.pipeline import reproduce
    result = reproduce("d1-llada-gsm8k", "paper", checkpoint="/tmp/shrunk", device="cpu", nproc=2,
                       overrides=["train.steps=2", "eval.limit=4"])
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
from collections import deque
from pathlib import Path

from dare_bench.errors import ConfigError, DareBenchError
from dare_bench.pipeline.context import Log
from dare_bench.pipeline.summary import ReproduceResult

RESULT_ENV = "DARE_BENCH_RESULT_FILE"


def under_torchrun() -> bool:
    """This process is one rank of a torchrun job (torchrun sets WORLD_SIZE for every rank)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def available_workers(device: str) -> tuple[int, str]:
    """(how many ranks this machine can hold, what they are) for the run's device."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.device_count(), "CUDA devices"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores, "CPU cores"


def check_nproc(nproc: int, device: str, cfg) -> None:
    """Refuse, before any work, more ranks than the machine has, or a global batch the ranks cannot share."""
    if nproc < 1:
        raise ConfigError(f"--nproc must be >= 1, got {nproc}")
    have, what = available_workers(device)
    if nproc > have:
        raise ConfigError(f"--nproc {nproc}: this machine has {have} {what} for --device {device}")
    batch = cfg.profile.train.batch_prompts
    if batch is not None and batch % nproc:
        raise ConfigError(f"--nproc {nproc} does not divide train.batch_prompts {batch}: every rank takes an equal "
                          "share of each step's prompts")


def torchrun_command(*, nproc: int, name: str, scale: str, seed: int | None, db: str | None, resume: bool,
                     overrides: list[str], force: bool, checkpoint: str | None, device: str,
                     master_port: int | None = None) -> list[str]:
    """The torchrun command line of this reproduction (single node, `nproc` ranks)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr",
           "127.0.0.1", "--master_port", str(master_port or 29500), "-m", "dare_bench.cli", "reproduce", name,
           *overrides, "--scale", scale, "--device", device]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    if db is not None:
        cmd += ["--db", db]
    if checkpoint is not None:
        cmd += ["--checkpoint", str(checkpoint)]
    cmd += ["--resume"] * resume + ["--force"] * force
    return cmd


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_torchrun(*, nproc: int, progress: bool, log: Log, **launcher) -> ReproduceResult:
    """Run the torchrun job, relaying its output to stderr; rank 0's result, or one error if the job failed."""
    cmd = torchrun_command(nproc=nproc, master_port=_free_port(), **launcher)
    log("torchrun: " + " ".join(shlex.quote(c) for c in cmd))
    with tempfile.TemporaryDirectory(prefix="dare-bench-launch-") as tmp:
        result_file = Path(tmp) / "result.json"
        env = dict(os.environ, **{RESULT_ENV: str(result_file)})
        env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default; ranks share the cores
        tail: deque[str] = deque(maxlen=400)  # torchrun's own report follows the ranks' errors
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if progress:
                sys.stderr.write(line)
        code = proc.wait()
        if code != 0 or not result_file.exists():
            raise DareBenchError(f"the torchrun job ({nproc} ranks) failed with exit status {code}: "
                                 f"{_last_error(tail)}")
        data = json.loads(result_file.read_text())
    return ReproduceResult(**data)


def _last_error(lines) -> str:
    """The job's own one-line error (a rank's `error: ...`) when one printed it, else the last exception line."""
    lines = [line.strip() for line in lines if line.strip()]
    for wanted in (lambda x: x.startswith("error:"), lambda x: "Error:" in x):
        hit = next((line for line in reversed(lines) if wanted(line)), None)
        if hit is not None:
            return hit.removeprefix("error:").strip()
    return lines[-1] if lines else "no output"


def write_result(result: ReproduceResult) -> bool:
    """Rank 0 of a job launched by `--nproc`: the result for the parent (`$DARE_BENCH_RESULT_FILE`), which reports
    it. False when this process was not launched so (it reports itself)."""
    path = os.environ.get(RESULT_ENV)
    if path:
        from dare_bench.fileio import atomic_write_json

        atomic_write_json(Path(path), result.to_json())
    return bool(path)


__all__ = ["RESULT_ENV", "available_workers", "check_nproc", "launch_torchrun", "torchrun_command", "under_torchrun",
           "write_result"]
