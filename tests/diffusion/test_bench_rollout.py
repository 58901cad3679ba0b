"""`dare-bench bench rollout --json` at a toy size through the CLI: JSON shape, and cached block decoding agrees
100% with full recompute."""

from __future__ import annotations

import json

import pytest


@pytest.mark.integration
def test_bench_rollout_cli_json():
    from typer.testing import CliRunner

    from dare_bench.cli import app

    result = CliRunner().invoke(app, ["bench", "rollout", "--json", "--families", "sdar,llada", "--gen-lengths", "16",
                                      "--d-model", "128", "--prompt-length", "8"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    keys = {"family", "gen_length", "path", "tokens_per_second", "forwards", "tokens_per_forward",
            "agreement_with_vanilla"}
    assert rows and all(keys <= set(r) for r in rows)
    by = {(r["family"], r["path"]): r for r in rows}
    assert {f for f, _ in by} == {"sdar", "llada"}
    for family in ("sdar", "llada"):
        assert by[(family, "vanilla")]["agreement_with_vanilla"] == 1.0
        assert all(r["gen_length"] == 16 and r["forwards"] > 0 and r["tokens_per_second"] > 0
                   for r in rows if r["family"] == family)
    assert by[("sdar", "exact_cache")]["agreement_with_vanilla"] == 1.0
    assert by[("sdar", "exact_cache")]["token_forwards"] < by[("sdar", "vanilla")]["token_forwards"]
    assert {"threshold", "prefix+threshold", "dual+threshold"} <= {p for f, p in by if f == "llada"}
    for r in rows:  # how close to the machine's limit (issue #15 item 7): a fraction of a peak measured in the run
        # of the bf16 peak: above 1 where bf16 has no hardware (AVX2); of the run's own dtype's peak: below 1
        assert r["bf16_peak_flops_per_second"] > 0 and r["fraction_of_bf16_peak"] > 0
        assert 0 < r["fraction_of_dtype_peak"] < 1
        assert r["achieved_flops_per_second"] == pytest.approx(r["fraction_of_bf16_peak"] *
                                                               r["bf16_peak_flops_per_second"])


@pytest.mark.parametrize("args", [["--families", "gpt2"], ["--gen-lengths", "x"], ["--gen-lengths", "0"]])
def test_bench_rollout_rejects_bad_arguments(args):
    from typer.testing import CliRunner

    from dare_bench.cli import app

    result = CliRunner().invoke(app, ["bench", "rollout", "--json", *args])
    assert result.exit_code != 0
