"""`dare-bench bench memory`: runs small through the CLI; JSON shape; BGPO memory grows less than the naive one."""

import json

import pytest
from typer.testing import CliRunner


@pytest.mark.integration
def test_bench_memory_json_small():
    from dare_bench.cli import app

    args = ["bench", "memory", "--json", "--mc-samples", "1,4", "--d-model", "64", "--layers", "1", "--heads", "4",
            "--seq-len", "96", "--rows", "2", "--vocab", "256", "--device", "cpu", "--threads", "1"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output.strip().splitlines()[-1])
    pts = data["points"]
    assert [(p["method"], p["mc_samples"]) for p in pts] == [("bgpo", 1), ("bgpo", 4), ("naive", 1), ("naive", 4)]
    assert all(isinstance(p["peak_bytes"], int) and p["peak_bytes"] > 0 for p in pts)
    by = {(p["method"], p["mc_samples"]): p["peak_bytes"] for p in pts}
    # the naive objective keeps 4 graphs; BGPO frees each copy's graph before the next forward
    assert by[("naive", 4)] - by[("naive", 1)] > 2 * max(by[("bgpo", 4)] - by[("bgpo", 1)], 0)
    assert by[("naive", 4)] > 1.5 * by[("bgpo", 4)]
    assert set(data["ratios"]) == {"bgpo(4)/bgpo(1)", "naive(4)/bgpo(4)"}


def test_bench_memory_refuses_bad_flags():
    from dare_bench.cli import app

    res = CliRunner().invoke(app, ["bench", "memory", "--mc-samples", "1,x"])
    assert res.exit_code != 0
    assert "mc-samples" in (res.output + str(res.exception))
    import subprocess

    from dare_bench.bench.memory import run_benchmark

    # a point that cannot finish is an error, never a silent zero
    with pytest.raises(subprocess.TimeoutExpired):
        run_benchmark([1], d_model=64, layers=1, heads=4, seq_len=8, rows=1, vocab=64, device="cpu",
                      timeout=0.001)


@pytest.mark.integration
def test_bench_memory_head_small():
    """`--head` at a CPU-test size: both peaks measured, the chunked head far below materialised logits, and its
    log-probs / gradients equal to fp32 rounding (the full-size figures are in the module doc's command)."""
    from dare_bench.cli import app

    args = ["bench", "memory", "--head", "--json", "--vocab", "32000", "--tokens", "512", "--d-model", "32",
            "--chunk", "32", "--device", "cpu", "--threads", "1"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output.strip().splitlines()[-1])
    assert data["logits_bytes"] == 512 * 32000 * 4
    assert data["peak_bytes"]["full"] > data["logits_bytes"]  # at least the float32 logits are materialised
    assert data["ratios"]["working"] >= 5 and data["ratios"]["peak"] > 1
    assert all(v <= 1e-5 for v in data["errors"].values()), data["errors"]


def test_bench_memory_head_refuses_bad_flags():
    from dare_bench.cli import app

    res = CliRunner().invoke(app, ["bench", "memory", "--head", "--dtype", "float64"])
    assert res.exit_code != 0 and "--dtype" in (res.output + str(res.exception))
