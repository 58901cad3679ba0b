"""scripts/gpu_check.py (the prepared GPU check, not CI) imports and its CPU smoke path runs."""

import json
import subprocess
import sys

import pytest

from testpaths import REPO

SCRIPT = REPO / "scripts" / "gpu_check.py"


@pytest.mark.integration
def test_cpu_smoke_writes_the_summary(tmp_path):
    """The rollout's rates come out as fractions of the ceilings measured in the same run (issue #15 item 7)."""
    out = tmp_path / "summary.json"
    res = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--only", "roofline,rollout", "--out",
                          str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads(out.read_text())
    roof, rollout = summary["checks"]["roofline"], summary["checks"]["rollout"]
    assert summary["ok"] and rollout["tokens_per_s"] > 0
    assert roof["copy_bytes_per_second"] > 0 and roof["matmul_peak"]["flops_per_second"] > 0
    assert rollout["fraction_of_copy_bandwidth"] == pytest.approx(
        rollout["forwards"] * rollout["weight_bytes"] / rollout["seconds"] / roof["copy_bytes_per_second"])
    assert 0 < rollout["fraction_of_matmul_peak"]


@pytest.mark.slow
def test_cpu_smoke_all_checks(tmp_path):
    """flex vs sdpa, the FSDP2 worker under torchrun (gloo), the rollout: every check on CPU."""
    out = tmp_path / "summary.json"
    res = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    checks = json.loads(out.read_text())["checks"]
    assert checks["attention"]["flex"]["pass"] and checks["fsdp2_step"]["plan"]["per_rank_total"] > 0
