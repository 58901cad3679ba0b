"""LLaDA2 backbone: exact parity with the official HF modeling code on every LLaDA2 fixture (logits, exact router
top-k, fully bidirectional and dFactory training layouts, loss), real-config names and sizes, round trip."""

import json

import pytest
import torch

from dare_bench.errors import CheckpointError
from dare_bench.models import detect_family, from_config, load_pretrained
from dare_bench.models.block import (
    dfactory_bd_loss,
    dfactory_training_inputs,
    full_attention_mask,
    inference_block_causal_mask,
    training_forward,
)

from testpaths import CHECKPOINTS, PARITY

ATOL = RTOL = 1e-4


def _family_dirs(root, family):
    if not root.exists():
        return []
    out = []
    for d in sorted(root.glob("*/")):
        cfg = d / "config.json"
        if cfg.exists():
            try:
                if detect_family(json.loads(cfg.read_text()), str(cfg)).name == family:
                    out.append(d)
            except CheckpointError:
                continue
    return out


FIXTURES = _family_dirs(PARITY, "llada2")
REAL = _family_dirs(CHECKPOINTS, "llada2")


def _close(a, b):
    torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)


def _as_bool(mask):
    return mask if mask.dtype == torch.bool else mask == 0


def _block_size_of(mask_bool):
    """The block size whose block-causal mask is the fixture's (the fixture states it only as a generate arg)."""
    L = mask_bool.shape[-1]
    for b in range(1, L + 1):
        if torch.equal(inference_block_causal_mask(L, L, b)[0, 0].expand_as(mask_bool), mask_bool):
            return b
    pytest.fail("fixture mask is not block-causal for any block size")


@pytest.mark.parametrize("fixture_dir", FIXTURES, ids=lambda d: d.name)
def test_llada2_fixture_cases(fixture_dir):
    from safetensors.torch import load_file

    meta = json.loads((fixture_dir / "cases.json").read_text())
    t = load_file(str(fixture_dir / "cases.safetensors"))
    model = load_pretrained(fixture_dir)
    # upstream passes these ids to generate(); our traits read them from config
    model.config.update(mask_token_id=meta["special_tokens"]["mask"], eos_token_id=meta["special_tokens"]["eos"])
    bias = [b for n, b in model.named_buffers() if n.endswith("expert_bias")]
    assert bias and all(b.abs().sum() > 0 for b in bias)  # the fixture's non-zero bias was loaded
    checked = []
    with torch.no_grad():
        for name in meta["cases"]:
            if name.startswith("gen"):
                continue  # generation parity lives with the samplers
            if name == "infer":
                ids, pos = t["infer_input_ids"], t["infer_position_ids"]
                # the official call of cases.json: the 4-D additive mask as attention_mask (block size != default)
                assert t["infer_attention_mask"].dtype == torch.float32
                out, routers = model(input_ids=ids, attention_mask=t["infer_attention_mask"], position_ids=pos,
                                     output_router_info=True)
                _close(out, t["infer_logits"])
                # the native keyword with the same mask gives the same logits
                assert torch.equal(model(ids, position_ids=pos, attn_mask=t["infer_attention_mask"]), out)
                expected_layers = sorted(int(k.rsplit("layer", 1)[1]) for k in t if k.startswith("infer_router_topk"))
                assert sorted(routers) == expected_layers and expected_layers
                for i in expected_layers:
                    _close(routers[i][0], t[f"infer_router_logits_layer{i}"])
                    assert torch.equal(routers[i][1], t[f"infer_router_topk_idx_layer{i}"]), f"routing layer {i}"
                # bool form of the same mask, and the default pattern with the fixture's block size
                mask = _as_bool(t["infer_attention_mask"])
                _close(model(ids, position_ids=pos, attn_mask=mask), t["infer_logits"])
                _close(model(input_ids=ids, attention_mask=mask, position_ids=pos), t["infer_logits"])
                model.config["block_size"] = _block_size_of(mask)
                _close(model(ids), t["infer_logits"])
            elif name == "full_attn":
                ids, pos = t["infer_input_ids"], t["infer_position_ids"]
                L = ids.shape[1]
                _close(model(ids, position_ids=pos, attn_mask=full_attention_mask(L)), t["full_attn_logits"])
            elif name == "train":
                clean, labels = t["train_clean_input_ids"], t["train_labels"]
                noisy = t["train_noisy_input_ids"]
                L = clean.shape[1]
                mask = _as_bool(t["train_attention_mask"])
                b = _block_size_of(mask[:, :, L:, L:])  # the clean copy is block-causal
                ids, pos, our_mask = dfactory_training_inputs(noisy, clean, b)
                assert torch.equal(ids, t["train_input_ids"]) and torch.equal(pos, t["train_position_ids"])
                assert torch.equal(our_mask.expand_as(mask), mask)
                assert torch.equal(labels, torch.where(noisy == model.traits.mask_token_id, clean, -100))
                out = model(input_ids=t["train_input_ids"], attention_mask=t["train_attention_mask"],
                            position_ids=t["train_position_ids"])  # the official call of cases.json
                _close(out, t["train_logits"])
                assert torch.equal(model(t["train_input_ids"], position_ids=t["train_position_ids"],
                                         attn_mask=t["train_attention_mask"]), out)
                model.config["block_size"] = b
                noisy_logits = training_forward(model, noisy, clean)
                _close(noisy_logits, t["train_logits"][:, :L])
                _close(dfactory_bd_loss(noisy_logits, labels).reshape(1), t["train_loss"])
            else:
                pytest.fail(f"{fixture_dir.name}: case {name!r} of cases.json is not checked by this test")
            checked.append(name)
    assert {"infer", "full_attn", "train"} <= set(checked)


@pytest.mark.parametrize("ckpt", REAL, ids=lambda d: d.name)
def test_llada2_real_config_names_and_size(ckpt):
    model = from_config(ckpt)
    ix = json.loads((ckpt / "model.safetensors.index.json").read_text())
    assert set(model.state_dict()) == set(ix["weight_map"])
    # bf16 checkpoints: total_size / 2 bytes (LLaDA2.1 stores expert_bias in fp32: +4864 values, negligible)
    published = ix["metadata"]["total_size"] / 2
    n = model.num_parameters() + sum(b.numel() for b in model.buffers())
    assert abs(n - published) / published < 0.01, (n, published)
    t = model.traits
    assert (t.block_size, t.mask_token_id, t.eos_token_id, t.pad_token_id) == (32, 156895, 156892, 156892)
    assert t.logit_shift == 0 and t.attention == "block_causal"


def test_tiny_llada2_preset_and_round_trip(tmp_path):
    from safetensors.torch import load_file, save_file

    model = load_pretrained("tiny-llada2")
    assert 1e6 <= model.num_parameters() <= 5e6
    layers = model.model.layers
    assert not layers[0].is_moe and all(layer.is_moe for layer in layers[1:])
    assert all(torch.count_nonzero(layer.mlp.gate.expert_bias) == 0 for layer in layers[1:])
    assert all(layer.mlp.gate.weight.std() > 0 for layer in layers[1:])
    model.model.layers[1].mlp.gate.expert_bias.normal_()  # must survive the round trip
    model.save_pretrained(tmp_path / "ck")
    again = load_pretrained(tmp_path / "ck")
    a, b = model.state_dict(), again.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.randint(0, 4000, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        # weights are bit-identical; BLAS may round 1 ulp differently on differently aligned buffers
        torch.testing.assert_close(model(ids), again(ids), atol=1e-6, rtol=1e-6)
    state = load_file(str(tmp_path / "ck" / "model.safetensors"))
    dropped = {k: v for k, v in state.items() if k != "model.layers.2.mlp.gate.expert_bias"}
    save_file(dropped, str(tmp_path / "ck" / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"ck.*model\.layers\.2\.mlp\.gate\.expert_bias"):
        load_pretrained(tmp_path / "ck")
    bad = dict(state)
    bad["model.layers.0.attention.query_key_value.weight"] = bad["model.layers.0.attention.query_key_value.weight"][1:]
    save_file(bad, str(tmp_path / "ck" / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"ck.*query_key_value\.weight.*shape"):
        load_pretrained(tmp_path / "ck")


def test_llada2_group_limited_routing_by_hand():
    """Group limit and bias-for-selection-only, against a direct evaluation of the rule."""
    from dare_bench.models.llada2 import LLaDA2Gate

    cfg = {"num_experts": 8, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5,
           "hidden_size": 16}
    gate = LLaDA2Gate(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        gate.weight.copy_(torch.randn(8, 16, generator=g))
        gate.expert_bias.copy_(torch.randn(8, generator=g) * 0.5)
        x = torch.randn(32, 16, generator=g)
        idx, w, logits = gate(x)
    s = torch.sigmoid(x @ gate.weight.T)
    r = s + gate.expert_bias
    for t in range(32):
        groups = r[t].view(2, 4)
        best = int(groups.topk(2, dim=-1).values.sum(-1).argmax())
        allowed = torch.full((8,), float("-inf"))
        allowed[best * 4:(best + 1) * 4] = r[t, best * 4:(best + 1) * 4]
        exp = allowed.topk(2).indices
        assert idx[t].tolist() == exp.tolist()
        ww = s[t, exp] / s[t, exp].sum() * 2.5
        torch.testing.assert_close(w[t], ww)
