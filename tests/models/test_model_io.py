"""Checkpoint IO of LLaDA and Dream: official names and field sets, bit-exact round trips, strict loading errors,
meta-device sizes of the real checkpoints, tiny presets and vocabulary adaptation."""

import copy
import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from dare_bench.errors import CheckpointError, ConfigError
from dare_bench.models import from_config, load_pretrained
from dare_bench.models.io import save_pretrained
from dare_bench.models.presets import preset_config, preset_for_tokenizer

from testpaths import CHECKPOINTS, PARITY

FIXTURE = {"llada": PARITY / "llada", "dream": PARITY / "dream"}
PRESET = {"llada": "tiny-llada", "dream": "tiny-dream"}


def _fixture(family):
    d = FIXTURE[family]
    return d


def _assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("max_shard_bytes", [4 * 1024**3, 200_000])
def test_round_trip_is_bit_exact(tmp_path, family, max_shard_bytes):
    model = load_pretrained(PRESET[family], seed=3)
    out = tmp_path / "ckpt"
    save_pretrained(model, out, max_shard_bytes=max_shard_bytes)
    sharded = (out / "model.safetensors.index.json").exists()
    assert sharded == (max_shard_bytes < 4 * 1024**3)
    if sharded:
        index = json.loads((out / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) > 1
        assert set(index["weight_map"]) == set(model.state_dict())
    again = load_pretrained(out)
    _assert_same_weights(model, again)
    assert again.config == model.config
    ids = torch.randint(0, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(ids), again(ids))


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_saved_directory_has_official_names(tmp_path, family):
    d = _fixture(family)
    official_cfg = json.loads((d / "config.json").read_text())
    official_keys = set(load_file(str(d / "model.safetensors")))
    # the fixture reloaded and saved again: identical config, identical tensors
    model = load_pretrained(d)
    save_pretrained(model, tmp_path / "a")
    assert json.loads((tmp_path / "a" / "config.json").read_text()) == official_cfg
    saved = load_file(str(tmp_path / "a" / "model.safetensors"))
    ref = load_file(str(d / "model.safetensors"))
    assert set(saved) == set(ref) and all(torch.equal(saved[k], ref[k]) for k in ref)
    # a preset saves the official field set and key names (up to layer numbers: 4 layers vs the fixture's 2)
    preset = load_pretrained(PRESET[family])
    save_pretrained(preset, tmp_path / "b")
    cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    assert set(cfg) == set(official_cfg)
    saved_keys = set(load_file(str(tmp_path / "b" / "model.safetensors")))

    def layerless(keys):
        return {".".join("{i}" if p.isdigit() else p for p in k.split(".")) for k in keys}

    assert layerless(saved_keys) == layerless(official_keys)


def test_dream_companion_generation_config(tmp_path):
    d = _fixture("dream")
    model = load_pretrained("tiny-dream")
    save_pretrained(model, tmp_path / "ckpt")
    gen = json.loads((tmp_path / "ckpt" / "generation_config.json").read_text())
    official = json.loads((d / "generation_config.json").read_text())
    assert set(gen) == set(official)
    assert gen["alg"] == "origin" and gen["steps"] == 512 and gen["eps"] == 0.001 and gen["mask_token_id"] is None
    assert gen["eos_token_id"] == gen["pad_token_id"] == gen["bos_token_id"] == 510
    # a loaded checkpoint's own generation_config.json is carried over unchanged
    loaded = load_pretrained(d)
    save_pretrained(loaded, tmp_path / "again")
    assert json.loads((tmp_path / "again" / "generation_config.json").read_text()) == official


@pytest.mark.parametrize("name,published", [("LLaDA-8B-Instruct", 8.02e9), ("Dream-v0-Instruct-7B", 7.62e9)])
def test_real_checkpoint_names_and_sizes_on_meta(name, published):
    d = CHECKPOINTS / name
    model = from_config(d)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    assert set(model.state_dict()) == set(index["weight_map"])
    n = model.num_parameters()
    assert abs(n - published) / published < 0.01
    assert n * 2 == index["metadata"]["total_size"]  # bf16 weights: 2 bytes each
    assert all(p.device.type == "meta" for p in model.parameters())


def test_real_checkpoint_traits():
    llada = from_config(CHECKPOINTS / "LLaDA-8B-Instruct").traits
    assert ((llada.mask_token_id, llada.eos_token_id, llada.pad_token_id, llada.logit_shift)
            == (126336, 126081, 126081, 0))
    assert llada.stop_token_ids == (126348,) and llada.attention == "bidirectional"
    dream = from_config(CHECKPOINTS / "Dream-v0-Instruct-7B").traits
    assert ((dream.mask_token_id, dream.eos_token_id, dream.pad_token_id, dream.logit_shift)
            == (151666, 151643, 151643, 1))
    assert dream.stop_token_ids == (151645,) and dream.bos_token_id == 151643


# --- strict loading ------------------------------------------------------------------------------------------

def _saved_tiny(tmp_path, family="llada"):
    out = tmp_path / "ckpt"
    save_pretrained(load_pretrained(PRESET[family]), out)
    return out


def test_missing_weight_is_named(tmp_path):
    out = _saved_tiny(tmp_path)
    state = load_file(str(out / "model.safetensors"))
    del state["model.transformer.blocks.1.up_proj.weight"]
    save_file(state, str(out / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"ckpt.*missing weight.*blocks\.1\.up_proj\.weight"):
        load_pretrained(out)


def test_unexpected_weight_is_named(tmp_path):
    out = _saved_tiny(tmp_path, "dream")
    state = load_file(str(out / "model.safetensors"))
    state["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(128)
    save_file(state, str(out / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"ckpt.*unexpected weight.*o_proj\.bias"):
        load_pretrained(out)


def test_wrong_shape_is_named(tmp_path):
    out = _saved_tiny(tmp_path)
    state = load_file(str(out / "model.safetensors"))
    state["model.transformer.wte.weight"] = torch.zeros(100, 128)
    save_file(state, str(out / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"ckpt.*wte\.weight.*\(100, 128\).*\(512, 128\)"):
        load_pretrained(out)


def test_truncated_safetensors_is_named(tmp_path):
    out = _saved_tiny(tmp_path)
    f = out / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*corrupt"):
        load_pretrained(out)


def test_missing_shard_and_config_are_named(tmp_path):
    out = tmp_path / "sharded"
    save_pretrained(load_pretrained("tiny-dream"), out, max_shard_bytes=300_000)
    shard = sorted(out.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=shard.name):
        load_pretrained(out)
    (out / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"sharded.*config\.json"):
        load_pretrained(out)


def test_absent_fields_take_the_official_defaults(tmp_path):
    d = _fixture("llada")
    cfg = json.loads((d / "config.json").read_text())
    # LLaDAConfig fills a missing block_type with OLMo's "sequential", which is not a LLaDA block
    del cfg["block_type"]
    with pytest.raises(CheckpointError, match="block_type='sequential'"):
        from_config(cfg)
    # a missing weight_tying defaults to True: no separate output head, logits from the embedding
    cfg = json.loads((d / "config.json").read_text())
    del cfg["weight_tying"]
    tied = from_config(cfg, device="cpu")
    assert "model.transformer.ff_out.weight" not in tied.state_dict()
    tied.init_weights()
    ids = torch.tensor([[1, 2, 3]])
    hidden = []
    tied.model.transformer.ln_f.register_forward_hook(lambda mod, inp, out: hidden.append(out))
    with torch.no_grad():
        logits = tied(ids)
    assert logits.shape == (1, 3, 320)
    assert torch.equal(logits, torch.nn.functional.linear(hidden[0], tied.model.transformer.wte.weight))
    # LLaDA's defaults also turn dropout on (0.1) when the fields are absent
    for f in ("attention_dropout", "residual_dropout", "embedding_dropout"):
        del cfg[f]
    m = from_config(cfg, device="cpu")
    assert m.emb_drop.p == 0.1 and m.model.transformer.blocks[0].dropout.p == 0.1
    # use_cache true makes every official forward fail: refuse it up front
    cfg["use_cache"] = True
    with pytest.raises(CheckpointError, match="use_cache"):
        from_config(cfg)


def test_dream_defaults_and_rejections():
    d = _fixture("dream")
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_scaling"] = {"type": "linear", "factor": 2.0}
    with pytest.raises(CheckpointError, match="rope_scaling"):
        from_config(cfg)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["num_key_value_heads"], cfg["rope_theta"]  # DreamConfig defaults: 32 kv heads (needs 32 | heads), theta 1e4
    with pytest.raises(CheckpointError, match="kv heads 32"):
        from_config(cfg)


# --- presets --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["llada", "dream"])
def test_tiny_presets(family):
    model = load_pretrained(PRESET[family])
    assert 1_000_000 <= model.num_parameters() <= 5_000_000
    t = model.traits
    vocab = model.config["vocab_size"]
    assert t.family == family and t.mask_token_id < vocab and t.eos_token_id < vocab and t.pad_token_id < vocab
    assert t.mask_token_id not in (t.eos_token_id, t.pad_token_id)
    assert not model.training
    # seeded: the same seed gives the same weights, another seed others
    _assert_same_weights(model, load_pretrained(PRESET[family]))
    other = load_pretrained(PRESET[family], seed=1)
    assert not torch.equal(next(iter(other.parameters())), next(iter(model.parameters())))


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_preset_adapts_to_a_tokenizer(family):
    class Tok(SimpleNamespace):
        def __len__(self):
            return 100

    registered = copy.deepcopy(preset_config(PRESET[family]))
    tok = Tok(mask_token_id=97, eos_token_id=3, pad_token_id=0, bos_token_id=2)
    cfg = preset_for_tokenizer(PRESET[family], tok)
    model = from_config(cfg, device="cpu")
    t = model.traits
    assert (t.mask_token_id, t.eos_token_id, t.pad_token_id) == (97, 3, 0)
    emb = model.model.transformer.wte if family == "llada" else model.model.embed_tokens
    assert emb.weight.shape[0] == 100
    if family == "dream":
        assert t.bos_token_id == 2
    assert preset_config(PRESET[family]) == registered  # adapting to a tokenizer leaves the registered preset as it was
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        preset_for_tokenizer(PRESET[family], Tok(mask_token_id=100, eos_token_id=3, pad_token_id=0, bos_token_id=2))
    with pytest.raises(ConfigError, match="must differ"):
        preset_for_tokenizer(PRESET[family], Tok(mask_token_id=3, eos_token_id=3, pad_token_id=0, bos_token_id=2))


def test_saving_into_a_checkpoint_dir_keeps_its_other_files(tmp_path):
    """As Hugging Face's save_pretrained: tokenizer / template files stay; old weight shards do not."""
    model = load_pretrained("tiny-llada")
    save_pretrained(model, tmp_path / "ckpt", max_shard_bytes=1_000_000)  # sharded
    (tmp_path / "ckpt" / "tokenizer_config.json").write_text('{"chat_template": "x"}')
    (tmp_path / "ckpt" / "chat_template.jinja").write_text("x")
    save_pretrained(model, tmp_path / "ckpt")  # one file now
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert "tokenizer_config.json" in names and "chat_template.jinja" in names
    assert [n for n in names if n.endswith(".safetensors")] == ["model.safetensors"]
    assert "model.safetensors.index.json" not in names
    _assert_same_weights(model, load_pretrained(tmp_path / "ckpt"))
