"""Bad reproduction files fail with one message naming file, line and the closest valid choice."""

import shutil
from pathlib import Path

import pytest

from dare_bench.errors import ConfigError
from dare_bench.registry import Registry, default_directory, load_registry

REPO_REPRODUCTIONS = Path(__file__).resolve().parents[2] / "dare_bench" / "reproductions"
GOOD = "bgpo-llada-sudoku"


@pytest.fixture
def regdir(tmp_path) -> Path:
    """A small registry: the real defaults and one real reproduction file."""
    d = tmp_path / "repros"
    d.mkdir()
    shutil.copytree(REPO_REPRODUCTIONS / "_defaults", d / "_defaults")
    shutil.copy(REPO_REPRODUCTIONS / f"{GOOD}.yaml", d / f"{GOOD}.yaml")
    return d


def _edit(path: Path, old: str, new: str) -> int:
    text = path.read_text()
    assert old in text
    text = text.replace(old, new, 1)
    path.write_text(text)
    return text[: text.index(new)].count("\n") + 1  # line of the edit


def _error(d: Path) -> str:
    with pytest.raises(ConfigError) as exc:
        Registry(d)
    return str(exc.value)


def test_small_registry_loads(regdir):
    reg = Registry(regdir)
    assert reg.names() == [GOOD]


def test_unknown_key_names_file_line_and_suggestion(regdir):
    f = regdir / f"{GOOD}.yaml"
    line = _edit(f, "task: sudoku\n", "task: sudoku\nscales:\n  tiny:\n    train:\n      lrr: 1.0e-5\n") + 4
    msg = _error(regdir)
    assert f"{f}:{line}" in msg and "lrr" in msg and "did you mean 'lr'" in msg


def test_wrong_type(regdir):
    f = regdir / f"{GOOD}.yaml"
    line = _edit(f, "task: sudoku\n", "task: sudoku\nscales:\n  micro:\n    train:\n      steps: many\n") + 4
    msg = _error(regdir)
    assert f"{f}:{line}" in msg and "scales.micro.train.steps" in msg and "integer" in msg


def test_unknown_algorithm_suggests(regdir):
    f = regdir / f"{GOOD}.yaml"
    _edit(f, "algorithm: bgpo", "algorithm: bgp0")
    msg = _error(regdir)
    assert f"{f}:" in msg and "did you mean 'bgpo'" in msg


def test_knob_typo_suggests(regdir):
    f = regdir / f"{GOOD}.yaml"
    f.write_text(f.read_text().replace("bgpo", "d1")
                 + "scales:\n  paper:\n    train:\n      algorithm: {p_mask_promt: 0.1}\n")
    f.rename(regdir / "d1-llada-sudoku.yaml")
    msg = _error(regdir)
    assert "p_mask_promt" in msg and "did you mean 'p_mask_prompt'" in msg and "d1-llada-sudoku.yaml:" in msg


def test_malformed_yaml(regdir):
    f = regdir / f"{GOOD}.yaml"
    line = _edit(f, "task: sudoku\n", "task: sudoku\nscales: [unclosed\n")
    msg = _error(regdir)
    assert "malformed YAML" in msg and f"{f}:" in msg
    assert int(msg.split(f"{f}:")[1].split(":")[0]) >= line


def test_duplicate_key(regdir):
    f = regdir / f"{GOOD}.yaml"
    line = _edit(f, "task: sudoku\n", "task: sudoku\ntask: gsm8k\n") + 1
    msg = _error(regdir)
    assert f"{f}:{line}" in msg and "duplicate key 'task'" in msg


def test_duplicate_reproduction_names(regdir):
    shutil.copy(regdir / f"{GOOD}.yaml", regdir / "a-copy.yaml")
    msg = _error(regdir)
    assert "duplicate reproduction name 'bgpo-llada-sudoku'" in msg


def test_file_name_must_match(regdir):
    (regdir / f"{GOOD}.yaml").rename(regdir / "other.yaml")
    assert "file name must be the reproduction name" in _error(regdir)


def test_error_in_a_defaults_file_points_there(regdir):
    f = regdir / "_defaults" / "algorithms" / "bgpo.yaml"
    line = _edit(f, "      mc_samples: 16\n", "      mc_samples: zero\n")
    msg = _error(regdir)
    assert f"{f}:{line}" in msg and "mc_samples" in msg


def test_missing_identity(regdir):
    f = regdir / f"{GOOD}.yaml"
    _edit(f, "backbone: llada\n", "")
    assert "`backbone` must be set" in _error(regdir)


def test_directory_choice(regdir, monkeypatch):
    monkeypatch.setenv("DARE_BENCH_REPRODUCTIONS", str(regdir))
    assert default_directory() == regdir
    assert load_registry().names() == [GOOD]
    monkeypatch.delenv("DARE_BENCH_REPRODUCTIONS")
    assert default_directory() == REPO_REPRODUCTIONS
    with pytest.raises(ConfigError, match="does not exist"):
        Registry(regdir / "nope")


def test_unknown_name_and_filters_suggest(regdir):
    reg = Registry(regdir)
    with pytest.raises(ConfigError, match="did you mean bgpo-llada-sudoku"):
        reg.get("bgpo-lada-sudoku")
    with pytest.raises(ConfigError, match="did you mean 'llada'"):
        reg.select(backbone="lada")
    assert reg.select(task="gsm8k") == []


@pytest.mark.parametrize("section, key, why", [
    ("eval", "checkpoint: best", "selection on the test set"),
    ("base", "steps: 300", "trains exactly `start_step` steps (or up to `target.max_steps`)"),
    ("base", "checkpoint_every: 25", "only its chosen checkpoint"),
])
def test_a_removed_field_fails_with_why_it_went(regdir, section, key, why):
    f = regdir / f"{GOOD}.yaml"
    _edit(f, "task: sudoku\n", f"task: sudoku\nscales:\n  tiny:\n    {section}:\n      {key}\n")
    msg = _error(regdir)
    name = key.split(":")[0]
    assert f"`{name}` was removed from the schema" in msg and why in msg and str(f) in msg
