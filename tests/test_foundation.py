"""The package foundation: CLI wiring, atomic writes, strict checkpoint IO errors."""

import json

import pytest
from typer.testing import CliRunner

from dare_bench.cli import app
from dare_bench.errors import CheckpointError
from dare_bench.fileio import atomic_directory, atomic_write_json


def test_cli_help_lists_commands():
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "dare-bench" in result.output or "Usage" in result.output


def test_atomic_write_json_replaces_whole_file(tmp_path):
    p = tmp_path / "r.json"
    atomic_write_json(p, {"a": 1})
    atomic_write_json(p, {"b": 2})
    assert json.loads(p.read_text()) == {"b": 2}
    assert [f.name for f in tmp_path.iterdir()] == ["r.json"]


def test_atomic_directory_keeps_old_on_failure(tmp_path):
    d = tmp_path / "ckpt"
    with atomic_directory(d) as tmp:
        (tmp / "x").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_directory(d) as tmp:
            (tmp / "x").write_text("new")
            raise RuntimeError("killed")
    assert (d / "x").read_text() == "old"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["ckpt"]


def test_load_pretrained_rejects_dir_without_config(tmp_path):
    from dare_bench.models import load_pretrained

    with pytest.raises(CheckpointError, match="config.json"):
        load_pretrained(tmp_path)


def test_unknown_family_is_named(tmp_path):
    from dare_bench.models import load_pretrained

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(CheckpointError, match="unknown model family"):
        load_pretrained(tmp_path)
