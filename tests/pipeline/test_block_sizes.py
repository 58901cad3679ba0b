"""A block-diffusion model decodes at the block size it trains at (pipeline.plan._check_block_sizes): the LLaDA2
replica trains at 8, the block its samplers decode its short canvases with (`model.block_size`), where it once
trained at its preset's 32; a mismatch, or a block size where it means nothing, is refused before any work.

    OMP_NUM_THREADS=1 pytest tests/pipeline/test_block_sizes.py -q
"""

import pytest

from dare_bench.errors import ConfigError
from dare_bench.pipeline.plan import _check_block_sizes, _run_meta_model, resolve
from dare_bench.registry import load_registry


@pytest.mark.parametrize("scale", ["tiny", "micro", "paper"])
def test_every_entry_decodes_at_the_block_it_trains_at(scale):
    checked = 0
    for spec in load_registry():
        name = spec.name
        if scale not in spec.scales:
            continue
        cfg = spec.resolve(scale, [])
        _check_block_sizes(cfg)
        traits = _run_meta_model(cfg).traits
        if traits.is_block_diffusion and cfg.profile.train.kind != "wsd" and cfg.algorithm != "ar":
            assert cfg.profile.eval.sampler.block_length in (None, traits.block_size), name
            checked += 1
    assert checked > 10  # the SDAR and LLaDA2 entries of the scale


def test_the_llada2_replica_trains_at_its_decoding_block():
    _, cfg = resolve("sft-llada2-sudoku", "tiny")
    assert cfg.profile.model.block_size == 8 == cfg.profile.eval.sampler.block_length
    assert _run_meta_model(cfg).traits.block_size == 8
    _, rl = resolve("bgpo-llada2-pyfunc", "tiny")
    assert rl.profile.train.rollout.block_length == 8 == _run_meta_model(rl).traits.block_size
    # the entries whose algorithm sets the block keep the AR preset's own (block 1), not the replica's 8
    _, ar = resolve("ar-llada2-sudoku", "tiny")
    assert ar.profile.model.block_size is None and _run_meta_model(ar).traits.block_size == 1


@pytest.mark.parametrize("name, overrides, message", [
    # the replica as it was: the preset's 32 against the samplers' 8
    ("sft-llada2-sudoku", ["model.block_size=null"],
     "eval.sampler.block_length 8 is not the block size the model trains at (32, preset tiny-llada2)"),
    ("bgpo-llada2-pyfunc", ["model.block_size=4", "eval.sampler.block_length=4", "eval.sampler.steps=4"],
     "train.rollout.block_length 8 is not the block size the model trains at (4, model.block_size)"),
    ("ar-llada2-sudoku", ["model.block_size=8"], "ar sets the block size it trains at itself"),
    ("wsd-llada2-sudoku", ["model.block_size=8"], "wsd sets the block size it trains at itself"),
    ("sft-llada-sudoku", ["model.block_size=8"], "tiny-llada is not a block-diffusion model"),
])
def test_a_block_the_model_does_not_train_at_is_refused(name, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve(name, "tiny", overrides)


def test_a_block_size_on_a_real_checkpoint_is_refused():
    with pytest.raises(ConfigError, match="`block_size` applies to a tiny `preset`"):
        resolve("sft-llada2-sudoku", "paper", ["model.block_size=8"])
