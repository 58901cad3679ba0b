"""`dare-bench bench moe` at a toy size through the CLI: --help, the JSON shape, grouped equal to the loop in every
section (outputs, losses, gradients, decoded tokens), and refused flags."""

import json

from typer.testing import CliRunner

SMALL = ["--tokens", "1,8", "--d-model", "128", "--train-batch", "1", "--train-len", "16", "--gen-length", "32",
         "--prompt-length", "8", "--repeats", "1"]


def test_bench_moe_help():
    from dare_bench.cli import app

    res = CliRunner().invoke(app, ["bench", "moe", "--help"])
    assert res.exit_code == 0, res.output
    for flag in ("--json", "--tokens", "--experts", "--gen-length", "--clock", "--block-sampling", "--sections"):
        assert flag in res.output


def test_bench_moe_json_small():
    from dare_bench.cli import app

    res = CliRunner().invoke(app, ["bench", "moe", "--json", *SMALL])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert set(data) == {"block", "train", "decode", "where", "settings"}
    assert [(r["family"], r["tokens"]) for r in data["block"]] == [("llada2", 1), ("llada2", 8), ("sdar_moe", 1),
                                                                    ("sdar_moe", 8)]
    for r in data["block"]:
        assert r["block_loop_s"] > 0 and r["block_grouped_s"] > 0 and r["block_ratio"] > 0
        assert r["max_abs_diff"] <= 1e-6
    t = data["train"]
    assert t["tokens"] == 16 and t["ratio"] > 0
    assert abs(t["loss_loop"] - t["loss_grouped"]) <= 1e-5 and t["max_abs_grad_diff"] <= 1e-5
    d = data["decode"]
    assert {(p["moe"], p["path"]) for p in d["paths"]} == {(m, p) for m in ("loop", "grouped")
                                                          for p in ("vanilla", "exact_cache")}
    assert all(p["agreement_with_loop_vanilla"] == 1.0 for p in d["paths"])
    for key in ("cache_vs_recompute_loop", "cache_vs_recompute_grouped", "token_forward_ratio",
                "cache_vs_recompute_if_experts_were_free"):
        assert d[key] > 0
    assert d["goal"] == 10.0
    w = data["where"]["grouped"]["exact_cache"]
    assert w["total"] > 0 and 0 < w["routed_experts"] <= w["moe_block"]
    assert data["where"]["loop"]["exact_cache"]["routed_experts"] > 0


def test_bench_moe_sections_and_refusals():
    from dare_bench.cli import app

    res = CliRunner().invoke(app, ["bench", "moe", "--sections", "block", "--tokens", "2", "--d-model", "128",
                                   "--repeats", "1", "--experts", "16", "--top-k", "4"])
    assert res.exit_code == 0, res.output
    assert "(a) one MoE block" in res.output and "(c)" not in res.output
    for bad, word in ((["--sections", "blocks"], "sections"), (["--tokens", "0"], "positive"),
                      (["--clock", "gpu"], "clock"), (["--block-sampling", "fast"], "block-sampling"),
                      (["--threads", "2"], "--clock cpu")):
        res = CliRunner().invoke(app, ["bench", "moe", *bad])
        assert res.exit_code != 0
        assert word in (res.output + str(res.exception)), bad
