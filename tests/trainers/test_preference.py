"""DPO-on-ELBO / VRPO: the official loss fixture and the §7 invariants."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from dare_bench.errors import ConfigError
from dare_bench.trainers.preference import (
    PreferenceConfig,
    PreferencePair,
    dpo_loss,
    interleave_pairs,
    train_preference,
    vrpo_loss,
)

from testpaths import LOSSES

FIXTURE = LOSSES / "dpo_vrpo"


def test_dpo_loss_matches_official_fixture():
    tensors = load_file(str(FIXTURE / "cases.safetensors"))
    cases = json.loads((FIXTURE / "cases.json").read_text())["cases"]
    assert cases
    for case in cases:
        x = {n: tensors[v["key"]].clone().requires_grad_(n in case["grads"]) for n, v in case["inputs"].items()}
        loss = dpo_loss(x["chosen_log_prob"], x["rejected_log_prob"], x["chosen_ref_log_prob"],
                        x["rejected_ref_log_prob"], **case["call_args"])
        assert torch.equal(loss.detach(), tensors[case["outputs"]["loss"]["key"]]), case["name"]
        loss.backward()
        for name, g in case["grads"].items():
            torch.testing.assert_close(x[name].grad, tensors[g["key"]], rtol=0, atol=1e-15, msg=case["name"])


def _model():
    from dare_bench.models import load_pretrained

    return load_pretrained("tiny-llada")


def _batch():
    pairs = [PreferencePair([1, 2, 3], [4, 5, 510], [6, 510]), PreferencePair([7, 8], [9, 10, 11, 510], [12, 13, 510])]
    return interleave_pairs(pairs, pad_id=510)


def test_theta_equal_ref_gives_log2():
    policy = _model()
    ids, am, plen = _batch()
    loss, metrics = vrpo_loss(policy, policy, ids, am, plen, beta=0.2, mc_samples=4,
                              generator=torch.Generator().manual_seed(0))
    assert loss.item() == pytest.approx(math.log(2), abs=1e-7)  # float32 log σ(0)
    assert metrics["reward_margin"] == 0.0


def test_antithetic_sampling_reduces_variance():
    # θ ≈ ref: with shared masks the noise in B_θ − B_ref cancels; with independent masks it does not.
    policy = _model()
    ref = _model()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # θ close to ref (init std is 0.02): the regime where shared masks cancel the noise
        for p in policy.parameters():
            p.add_(0.001 * torch.randn(p.shape, generator=g))
    ids, am, plen = _batch()

    def spread(antithetic: bool) -> float:
        vals = []
        with torch.no_grad():
            for s in range(24):
                loss, _ = vrpo_loss(policy, ref, ids, am, plen, beta=1.0, mc_samples=1,
                                    generator=torch.Generator().manual_seed(s), antithetic=antithetic)
                vals.append(loss.item())
        return torch.tensor(vals).var().item()

    assert spread(True) < spread(False)


def test_odd_micro_batch_is_refused():
    policy = _model()
    ids, am, plen = _batch()
    with pytest.raises(ConfigError, match="even"):
        vrpo_loss(policy, policy, ids[:3], am[:3], plen, beta=0.2, mc_samples=2, generator=torch.Generator())


def test_vrpo_training_raises_chosen_margin():
    policy = _model()
    pairs = [PreferencePair([1, 2, 3], [4, 5, 510], [6, 7, 510])] * 4
    result = train_preference(policy, pairs, PreferenceConfig(steps=12, lr=1e-3, batch_pairs=2, mc_samples=2))
    assert result.losses[0] == pytest.approx(math.log(2), abs=1e-6)  # starts at θ = ref
    assert sum(result.losses[-3:]) / 3 < math.log(2) - 0.02
