"""`dare-bench list` and `dare-bench show` through the real Typer app (the JSON shapes CI relies on)."""

import json
import sys

from typer.testing import CliRunner

from dare_bench.cli import app
from dare_bench.errors import ConfigError
from dare_bench.registry import load_registry

runner = CliRunner()


def test_list_json_shape_and_filters():
    result = runner.invoke(app, ["list", "--json", "--backbone", "llada", "--task", "sudoku"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    registry = load_registry()
    assert {r["name"] for r in rows} >= {"bgpo-llada-sudoku", "baseline-llada-sudoku", "vrpo-llada-sudoku"}
    for r in rows:
        assert set(r) == {"name", "algorithm", "backbone", "task", "scales", "reported"}
        assert r["backbone"] == "llada" and r["task"] == "sudoku"
        assert r["scales"] == list(registry.get(r["name"]).scales)
        # the reported scores the registry holds, no more, no less (the DARE cells are checked by the coverage test)
        assert [x["value"] for x in r["reported"]] == [x.value for x in registry.get(r["name"]).reported], r["name"]
        for rep in r["reported"]:
            assert set(rep) >= {"value", "metric", "source", "settings"}
    everything = json.loads(runner.invoke(app, ["list", "--json"]).output)
    assert len(everything) >= 116


def test_list_catalogue_json_is_the_catalogue():
    from dare_bench import catalogue

    result = runner.invoke(app, ["list", "--catalogue", "--json"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.output)
    assert [a["name"] for a in d["algorithms"]] == list(catalogue.algorithm_names())
    coupled = next(a for a in d["algorithms"] if a["name"] == "coupled-grpo")
    assert coupled["kind"] == "rl" and coupled["plugin"] == "coupled_grpo" and "random_masking" in coupled["knobs"]
    assert {b["name"]: b["diffusion"] for b in d["backbones"]}["sdar"] == "block"
    assert d["tasks"] == list(catalogue.task_names())
    assert "sdar" in runner.invoke(app, ["list", "--catalogue"]).output


def test_list_table():
    result = runner.invoke(app, ["list", "--algorithm", "justgrpo"])
    assert result.exit_code == 0 and "justgrpo-llada-gsm8k" in result.output and "(gen 512)" in result.output


def test_show_json_bgpo_llada_sudoku():
    result = runner.invoke(app, ["show", "bgpo-llada-sudoku", "--json"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.output)
    assert (d["name"], d["algorithm"], d["backbone"], d["task"]) == ("bgpo-llada-sudoku", "bgpo", "llada", "sudoku")
    assert set(d["scales"]) >= {"paper", "tiny", "micro"}
    assert d["scales"]["paper"]["model"]["checkpoint"] == "GSAI-ML/LLaDA-8B-Instruct"
    assert d["scales"]["paper"]["train"]["mc_samples"] == 16
    (r,) = d["reported"]
    assert r["value"] == 42.6 and r["source"]["ref"] == "yjyddq/DARE" and r["settings"]["row"] == "Sudoku"


def test_show_text_has_score_and_source():
    result = runner.invoke(app, ["show", "bgpo-llada-sudoku", "--scale", "paper"])
    assert result.exit_code == 0
    assert "42.6 accuracy" in result.output and "yjyddq/DARE" in result.output and "scale paper" in result.output
    assert "scale tiny" not in result.output


def test_unknown_names_suggest():
    result = runner.invoke(app, ["show", "bgpo-lada-sudoku"])
    assert isinstance(result.exception, ConfigError) and "did you mean bgpo-llada-sudoku" in str(result.exception)
    result = runner.invoke(app, ["list", "--algorithm", "bgp"])
    assert isinstance(result.exception, ConfigError) and "did you mean 'bgpo'" in str(result.exception)


def test_entry_point_prints_one_error_and_exits_2(tmp_path, monkeypatch, capsys):
    import pytest

    from dare_bench.cli import main

    bad = tmp_path / "r"
    bad.mkdir()
    (bad / "x.yaml").write_text("name: [unclosed\n")
    monkeypatch.setattr(sys, "argv", ["dare-bench", "list", "--reproductions", str(bad)])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "malformed YAML" in err and "x.yaml:" in err and "Traceback" not in err
    for cmd in (["list", "--help"], ["show", "--help"]):
        assert runner.invoke(app, cmd).exit_code == 0
