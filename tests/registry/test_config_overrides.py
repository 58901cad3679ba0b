"""RunConfig: content hash (semantic fields only) and key=value overrides with type checks and the modified flag."""

import pytest

from dare_bench.config import RunConfig
from dare_bench.errors import ConfigError
from dare_bench.registry import get


@pytest.fixture
def spec():
    return get("d1-llada-sudoku")


def test_hash_is_stable_and_semantic(spec):
    a, b = spec.resolve("tiny"), spec.resolve("tiny")
    assert a.content_hash == b.content_hash and not a.modified
    assert spec.resolve("micro").content_hash != a.content_hash
    described = a.apply_overrides(["description=another text", "hardware=laptop"])
    assert described.content_hash == a.content_hash and not described.modified
    assert RunConfig.from_dict(a.to_dict()).content_hash == a.content_hash


def test_override_changes_hash_and_marks_modified(spec):
    base = spec.resolve("tiny")
    cfg = spec.resolve("tiny", ["train.lr=1e-5", "eval.limit=32", "seeds=[0, 1]", "train.algorithm.p_mask_prompt=0.3"])
    assert cfg.profile.train.lr == 1e-5 and isinstance(cfg.profile.train.lr, float)
    assert cfg.profile.eval.limit == 32 and cfg.profile.seeds == [0, 1]
    assert spec.knobs("tiny").p_mask_prompt == 0.15 and cfg.profile.train.algorithm["p_mask_prompt"] == 0.3
    assert cfg.modified and cfg.content_hash != base.content_hash and cfg.pinned_hash == base.content_hash
    assert cfg.overrides[0] == "train.lr=1e-5"
    same = spec.resolve("tiny", [f"train.lr={base.profile.train.lr}"])
    assert not same.modified and same.content_hash == base.content_hash
    twice = cfg.apply_overrides(["eval.limit=8"])
    assert twice.pinned_hash == base.content_hash and len(twice.overrides) == 5


@pytest.mark.parametrize("override, message", [
    ("train.lrr=1e-5", "did you mean 'lr'"),
    ("trian.lr=1e-5", "did you mean 'train'"),
    ("train.steps=many", "valid integer"),
    ("train.lr=-1", "greater than 0"),
    ("train.algorithm.p_mask_promt=0.1", "did you mean 'p_mask_prompt'"),
    ("train.algorithm.p_mask_prompt=2", "less than 1"),
    ("train.lora.r=8", "not set at this scale"),
    ("train.lr.x=1", "is a value, not a section"),
    ("eval.limit", "not key=value"),
])
def test_bad_overrides(spec, override, message):
    with pytest.raises(ConfigError, match=message):
        spec.resolve("tiny", [override])


def test_unknown_scale(spec):
    with pytest.raises(ConfigError, match="did you mean 'tiny'"):
        spec.resolve("tinny")
