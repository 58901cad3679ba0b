"""What a run record captures about where it ran: code version, package versions, hardware."""

from __future__ import annotations

import functools
import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

TRACKED_PACKAGES = (
    "torch", "transformers", "tokenizers", "safetensors", "peft", "accelerate", "datasets", "numpy",
    "flash-attn", "opencompass", "sqlalchemy", "pydantic", "dare-bench",
)


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """`git describe` of the checkout dare_bench runs from (with -dirty), else the package version."""
    root = Path(__file__).resolve().parents[2]
    if (root / ".git").exists():
        try:
            out = subprocess.run(
                ["git", "-C", str(root), "describe", "--always", "--dirty", "--tags"],
                capture_output=True, text=True, timeout=10, check=True,
            )
            if out.stdout.strip():
                return f"git:{out.stdout.strip()}"
        except (OSError, subprocess.SubprocessError):
            pass
    from dare_bench import __version__

    return f"dare-bench=={__version__}"


def package_versions() -> dict[str, str]:
    found = {}
    for name in TRACKED_PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    found["python"] = platform.python_version()
    return found


def hardware() -> dict:
    info: dict = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_name(),
        # the marketing name can hide the generation ("AMD EPYC" on a VM); family / model / stepping does not
        "cpu_id": _cpu_id(),
        "cpu_count": os.cpu_count(),
    }
    try:
        info["cpu_affinity"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    # Only ask torch when the caller already imported it: importing torch here would cost seconds.
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch_threads"] = torch.get_num_threads()
        # the vector ISA torch dispatches its CPU kernels to (e.g. AVX2, AVX512): it fixes the reduction order of
        # a matmul, so two machines with different ISAs train different bits (a tiny base's weight hash differs)
        info["cpu_isa"] = torch.backends.cpu.get_cpu_capability()
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> dict[str, str]:
    """The first processor's block of /proc/cpuinfo (x86 / arm Linux); empty where there is none."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if not key:
                break  # the first processor's block is enough
            fields.setdefault(key, value.strip())
    except OSError:
        pass
    return fields


def _cpu_id() -> str:
    """"vendor family F model M stepping S" (x86 Linux), else the platform's processor string."""
    fields = _cpuinfo()
    if "vendor_id" in fields and "cpu family" in fields:
        return (f"{fields['vendor_id']} family {fields['cpu family']} model {fields.get('model', '?')} "
                f"stepping {fields.get('stepping', '?')}")
    return platform.processor() or "unknown"


def _cpu_name() -> str:
    return _cpuinfo().get("model name") or platform.processor() or "unknown"
