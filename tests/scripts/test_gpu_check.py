"""scripts/gpu_check.py (the prepared GPU check, not CI) imports and its CPU smoke path runs."""

import json
import subprocess
import sys

import pytest

from testpaths import REPO

SCRIPT = REPO / "scripts" / "gpu_check.py"


def test_cpu_smoke_writes_the_summary(tmp_path):
    out = tmp_path / "summary.json"
    res = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--only", "rollout", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads(out.read_text())
    assert summary["ok"] and summary["checks"]["rollout"]["tokens_per_s"] > 0


@pytest.mark.slow
def test_cpu_smoke_all_checks(tmp_path):
    """flex vs sdpa, the FSDP2 worker under torchrun (gloo), the rollout: every check on CPU."""
    out = tmp_path / "summary.json"
    res = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    checks = json.loads(out.read_text())["checks"]
    assert checks["attention"]["flex"]["pass"] and checks["fsdp2_step"]["plan"]["per_rank_total"] > 0
