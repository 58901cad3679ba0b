"""The catalogue is the one list of algorithms, backbones and tasks; the registry validates with its schemas."""

import subprocess
import sys
from pathlib import Path

import pytest

from dare_bench import catalogue
from dare_bench.errors import ConfigError
from dare_bench.registry import get

DEFAULTS = Path(__file__).resolve().parents[2] / "dare_bench" / "reproductions" / "_defaults"


def test_catalogue_and_registry_load_without_torch():
    code = ("import sys\nfrom dare_bench import catalogue\nfrom dare_bench.registry import load_registry\n"
            "load_registry()\nassert [s.knob_names for s in catalogue.algorithms().values()]\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_defaults_layer_names_a_catalogue_entry_and_back():
    stems = lambda sub: {p.stem for p in (DEFAULTS / sub).glob("*.yaml")}  # noqa: E731
    assert stems("algorithms") == set(catalogue.algorithm_names())
    assert stems("backbones") == set(catalogue.backbone_names())
    assert stems("tasks") == set(catalogue.task_names())
    assert stems("kinds") == {s.kind for s in catalogue.algorithms().values()}
    for path in (DEFAULTS / "algorithm-backbones").glob("*.yaml"):
        assert any(path.stem == f"{a}-{b}" for a in catalogue.algorithm_names() for b in catalogue.backbone_names())


def test_backbone_facts_equal_the_model_traits():
    from dare_bench.models import FAMILIES  # importing the package registers every family
    from dare_bench.models.io import build_model
    from dare_bench.models.presets import preset_config

    assert set(FAMILIES) == {b.family for b in catalogue.BACKBONES}
    for spec in catalogue.BACKBONES:
        traits = build_model(preset_config(f"tiny-{spec.family}"), device="meta").traits
        assert (traits.family, traits.attention) == (spec.family, spec.attention)
        assert spec.diffusion == ("block" if traits.is_block_diffusion else "masked")


def test_lookups_suggest():
    assert catalogue.algorithm("coupled_grpo") is catalogue.algorithm("coupled-grpo")
    with pytest.raises(ConfigError, match="did you mean 'bgpo'"):
        catalogue.algorithm("bgp0")
    with pytest.raises(ConfigError, match="did you mean 'sdar'"):
        catalogue.backbone("sdr")


@pytest.mark.parametrize("name, override", [
    ("d1-llada-sudoku", "train.algorithm.kl_variant=dare"),
    ("coupled-grpo-llada-sudoku", "train.algorithm.random_masking=false"),
    ("coupled-grpo-llada-sudoku", "train.algorithm.kl_variant=dare"),
    ("spg-llada-sudoku", "train.algorithm.variant=zero"),
    ("ebpo-sdar-sudoku", "train.algorithm.block_length=4"),
])
def test_knobs_the_plugins_read_are_accepted(name, override):
    cfg = get(name).resolve("tiny", [override])
    key, value = override.split("=")
    assert str(cfg.profile.train.algorithm[key.rsplit(".", 1)[1]]).lower() == value


def test_load_time_bounds_are_the_plugins():
    # the plug-in refuses eos_gamma_min = 0 (gt=0); the loader used to accept it (ge=0)
    with pytest.raises(ConfigError, match=r"train.algorithm.eos_gamma_min: Input should be greater than 0"):
        get("cj-grpo-llada-sudoku").resolve("tiny", ["train.algorithm.decoding=eoser",
                                                     "train.algorithm.eos_gamma_min=0"])
    # a shared setting the plug-in bounds itself is reported where the YAML sets it
    with pytest.raises(ConfigError, match=r"train.clip_eps: Input should be less than 1"):
        get("d1-llada-sudoku").resolve("tiny", ["train.clip_eps=1.5"])


def test_plugin_defaults_of_shared_settings_apply_when_unset():
    spec = get("bgpo-llada-sudoku")
    train = spec.scales["tiny"].train.model_copy(update={"mc_samples": None})
    assert catalogue.algorithm("bgpo").settings(train).mc_samples == 16
    assert spec.knobs("tiny").mc_samples == 4  # what bgpo.yaml sets


def test_a_shared_setting_under_train_algorithm_points_to_its_place(tmp_path):
    import shutil

    from dare_bench.registry import Registry

    repo = DEFAULTS.parent
    shutil.copytree(DEFAULTS, tmp_path / "_defaults")
    text = (repo / "bgpo-llada-sudoku.yaml").read_text()
    edited = text.replace("task: sudoku\n",
                          "task: sudoku\nscales:\n  tiny:\n    train:\n      algorithm: {mc_samples: 8}\n", 1)
    assert edited != text
    (tmp_path / "bgpo-llada-sudoku.yaml").write_text(edited)
    with pytest.raises(ConfigError, match=r"scales.tiny.train.mc_samples: a shared setting, set it there"):
        Registry(tmp_path)
