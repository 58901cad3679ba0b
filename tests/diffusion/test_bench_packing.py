"""`dare-bench bench packing`: runs small through the CLI; JSON shape; the packed step's loss equals the padded one."""

import json

import pytest
from typer.testing import CliRunner

from testpaths import DARE_DATA

GSM8K = DARE_DATA / "rl" / "test" / "gsm8k_1.parquet"


@pytest.mark.integration
def test_bench_packing_json_small():
    from dare_bench.cli import app

    args = ["bench", "packing", "--json", "--family", "llada,sdar", "--layout", "elbo,d1", "--rows", "8",
            "--gen-length", "64", "--d-model", "32", "--layers", "1", "--heads", "2", "--steps", "1",
            "--threads", "1", "--data", str(GSM8K)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output.strip().splitlines()[-1])
    assert [(r["family"], r["layout"]) for r in data["results"]] == [("llada", "elbo"), ("llada", "d1"),
                                                                    ("sdar", "elbo"), ("sdar", "d1")]
    for r in data["results"]:
        assert r["padded_s"] > 0 and r["packed_s"] > 0 and r["speedup"] > 0
        assert r["max_loss_diff"] <= 1e-6, r  # same draws, same numbers
        assert r["real_tokens"] < r["padded_tokens"] and r["bound"] > 1
        assert r["packed_rows"] <= r["padded_rows"] == 8
        # above 1 where bf16 has no hardware (an AVX2 CPU emulates it slower than this fp32 step runs)
        assert r["padded_fraction_of_bf16_peak"] > 0 and r["packed_fraction_of_bf16_peak"] > 0
        # the same useful work in less time is a larger fraction
        assert r["packed_fraction_of_bf16_peak"] / r["padded_fraction_of_bf16_peak"] == \
            pytest.approx(r["speedup"])
    s = data["settings"]
    assert len(s["prompt_lengths"]) == len(s["completion_lengths"]) == 8
    assert all(16 <= c <= 64 for c in s["completion_lengths"]) and s["data"].endswith("gsm8k_1.parquet")


def test_bench_packing_help_and_bad_flags():
    from dare_bench.cli import app

    res = CliRunner().invoke(app, ["bench", "packing", "--help"])
    assert res.exit_code == 0 and "--layout" in res.output
    res = CliRunner().invoke(app, ["bench", "packing", "--family", "gpt2"])
    assert res.exit_code != 0 and "--family" in (res.output + str(res.exception))
