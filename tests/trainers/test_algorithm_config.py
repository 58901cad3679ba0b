"""Shared hyper-parameter ranges are validated once, in AlgorithmConfig, for every plug-in."""

import pytest

from dare_bench.errors import ConfigError
from dare_bench.models.base import ModelTraits
from dare_bench.trainers.algorithms.base import get_algorithm, list_algorithms
from dare_bench.trainers.algorithms.common import FIXED_MASK_SEED, iteration_mask_seeds

MDLM = ModelTraits("llada", mask_token_id=9, eos_token_id=8, pad_token_id=8, logit_shift=0, attention="bidirectional")
BDLM = ModelTraits("sdar", mask_token_id=9, eos_token_id=8, pad_token_id=8, logit_shift=0, attention="block_causal",
                   block_size=4)


@pytest.mark.parametrize("name", list_algorithms())
@pytest.mark.parametrize("bad, message", [
    ({"clip_ratio_c": 0.5}, "clip_ratio_c must be > 1"),
    ({"kl_beta": -0.1}, "kl_beta must be >= 0"),
    ({"clip_eps_high": 0.0}, "clip_eps_high must be > 0"),
])
def test_shared_ranges_are_refused_by_every_plugin(name, bad, message):
    cls = get_algorithm(name)
    traits = MDLM if "bidirectional" in cls.attention_kinds else BDLM
    with pytest.raises(ConfigError, match=message):
        cls(bad, traits)


def test_iteration_mask_seeds():
    import torch

    assert iteration_mask_seeds(torch.Generator(), 3, random_masking=False) == [FIXED_MASK_SEED] * 3
    a = iteration_mask_seeds(torch.Generator().manual_seed(1), 4, random_masking=True)
    assert a == iteration_mask_seeds(torch.Generator().manual_seed(1), 4, random_masking=True)
    assert len(set(a)) > 1 and all(0 <= s < 4096 for s in a)
