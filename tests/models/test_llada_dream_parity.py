"""Logit parity of LLaDA and Dream against the official-code fixtures in shared/fixtures/parity/.

Every fixture directory whose config.json is of these families is checked (hidden fixtures of other sizes are
dropped in the same way), every `fwd_*` case of its cases.json: float32 logits within 1e-4 of the official ones.
Generation cases (`gen_*`, `fastdllm_*`) belong to the sampler tests.
"""

import json

import pytest
import torch

from testpaths import PARITY

FAMILIES = {"llada", "dream"}


def _family(config):
    # by the official config's own markers, so a fixture of these families can never be skipped silently
    kinds = {str(config.get("model_type", "")).lower()} | {a.lower() for a in config.get("architectures") or ()}
    if kinds & {"llada", "lladamodellm"}:
        return "llada"
    if kinds & {"dream", "dreammodel"}:
        return "dream"
    return None


def _fixture_dirs():
    out = []
    if PARITY.exists():
        for d in sorted(PARITY.glob("*/")):
            cfg = d / "config.json"
            if cfg.exists() and _family(json.loads(cfg.read_text())) in FAMILIES:
                out.append(d)
    return out


def _forward_cases():
    params = []
    for d in _fixture_dirs():
        cases = json.loads((d / "cases.json").read_text())["cases"]
        params += [pytest.param(d, name, id=f"{d.name}-{name}") for name in cases if name.startswith("fwd_")]
    assert params, f"no LLaDA/Dream forward cases in {PARITY}"
    return params


_MODELS = {}


def _model(d):
    from dare_bench.models import load_pretrained

    if d not in _MODELS:
        _MODELS[d] = load_pretrained(d, dtype="float32")
    return _MODELS[d]


@pytest.mark.parametrize("fixture_dir,case", _forward_cases())
def test_forward_logits_match_official(fixture_dir, case):
    from safetensors.torch import load_file

    tensors = load_file(str(fixture_dir / "cases.safetensors"))
    t = {k[len(case) + 1:]: v for k, v in tensors.items() if k.startswith(case + ".")}
    assert "input_ids" in t and "logits" in t, f"{case}: fixture lacks input_ids / logits"
    model = _model(fixture_dir)
    inputs = ("input_ids", "attention_mask", "position_ids")
    with torch.no_grad():
        # the official call of the case: 2-D padding mask and explicit positions when the fixture stores them
        # (Dream's 4-D mask is m[:,None,None,:] & m[:,None,:,None], which the model derives from the 2-D mask)
        got = {"logits": model(t["input_ids"], t.get("attention_mask"), t.get("position_ids"))}
        # the same ids with no mask at all (older LLaDA HF file that ignored attention_mask)
        if "logits_mask_ignored" in t:
            got["logits_mask_ignored"] = model(t["input_ids"])
        if "attention_mask" in t and model.family == "dream":
            # the exact official call of the case: the 4-D bool mask the sampler builds, as attention_mask
            m = t["attention_mask"].bool()
            mask4 = m[:, None, None, :] & m[:, None, :, None]
            official = model(t["input_ids"], mask4, t.get("position_ids"))
            assert torch.equal(official, got["logits"])
            # its additive float form (0 = attend, -inf = blocked; all-blocked pad rows give 0 too) is the same
            additive = torch.zeros(mask4.shape).masked_fill(~mask4, float("-inf"))
            torch.testing.assert_close(model(t["input_ids"], additive, t.get("position_ids")), official, atol=1e-6,
                                       rtol=1e-6)
        elif "attention_mask" in t:
            # LLaDA: the official call is the 2-D mask; its [B, 1, 1, L] view (which upstream flattens) is the same,
            # and the pattern it stands for, given as the official attention_bias, too
            m = t["attention_mask"]
            assert torch.equal(model(t["input_ids"], m[:, None, None, :]), got["logits"])
            bias = m.bool()[:, None, None, :].expand(-1, 1, m.shape[1], -1)
            torch.testing.assert_close(model(t["input_ids"], attention_bias=bias), got["logits"], atol=1e-6,
                                       rtol=1e-6)
    unknown = set(t) - set(inputs) - set(got)
    assert not unknown, f"{case}: fixture tensors {sorted(unknown)} are not understood by this test"
    for name, out in got.items():
        ref = t[name]
        assert out.shape == ref.shape and out.dtype == torch.float32
        assert not torch.isnan(out).any()
        diff = (out - ref).abs().max().item()
        assert diff <= 1e-4, f"{fixture_dir.name}/{case}.{name}: max abs diff {diff:.3g} > 1e-4"
