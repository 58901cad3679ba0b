"""`dare-bench bench flex`: bad sizes are one-line errors; (slow: it compiles FlexAttention, ~30 s) a small run's
JSON, with the compiled kernel equal to sdpa on the dense BD3 mask and, on CPU, no flex backward claimed."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from dare_bench.cli import app
from dare_bench.errors import ConfigError


@pytest.mark.parametrize("args", [["--seq-len", "0"], ["--dtype", "float16"], ["--repeats", "0"]])
def test_bench_flex_rejects_bad_arguments(args):
    result = CliRunner().invoke(app, ["bench", "flex", "--json", *args])
    assert isinstance(result.exception, ConfigError) and result.exception.exit_code == 2  # the CLI's one line, exit 2


@pytest.mark.slow
def test_bench_flex_json():
    result = CliRunner().invoke(app, ["bench", "flex", "--json", "--seq-len", "160", "--block-size", "16",
                                      "--repeats", "1", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    res = json.loads(result.stdout.strip().splitlines()[-1])
    dense, flex = res["paths"]["sdpa"], res["paths"]["flex"]
    assert res["max_abs_err"] <= 1e-5 and res["settings"]["rows"] == 320
    assert dense["forward"]["seconds"] > 0 and flex["forward"]["seconds"] > 0 and dense["forward_backward"]
    assert res["ratios"]["mask_bytes"] > 1 and res["ratios"]["forward_time"] > 0
    assert flex["forward_backward"] is None and "no FlexAttention backward on CPU" in flex["forward_backward_skipped"]
    assert res["ratios"]["forward_backward_time"] is None and torch.__version__ in res["notes"][0]
