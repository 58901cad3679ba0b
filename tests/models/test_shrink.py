"""Shrunk real checkpoints keep what makes them real: the config's field set and ids, the official key names (up to
layer / expert counts), the chat template and tokenizer; they load, run, and refuse bad input."""

import json
import re

import pytest
import torch

from dare_bench.errors import CheckpointError
from dare_bench.models.io import load_pretrained, load_tokenizer
from dare_bench.models.shrink import shrink_checkpoint, shrunk_config

from testpaths import CHECKPOINTS

REAL = ["LLaDA-8B-Instruct", "Dream-v0-Instruct-7B", "SDAR-4B-Chat", "SDAR-30B-A3B-Chat", "LLaDA2.0-mini"]
IDS = ("mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id", "vocab_size", "embedding_size")


def _pattern(key: str) -> str:
    return re.sub(r"\.(layers|blocks|experts)\.\d+\.", r".\1.N.", key)


@pytest.mark.parametrize("name", REAL)
def test_shrunk_checkpoint_is_the_real_architecture(name, tmp_path):
    src = CHECKPOINTS / name
    summary = shrink_checkpoint(src, tmp_path / "small", layers=2, hidden=256)
    real_cfg = json.loads((src / "config.json").read_text())
    cfg = json.loads((tmp_path / "small" / "config.json").read_text())
    assert set(cfg) == set(real_cfg)
    assert {k: cfg.get(k) for k in IDS} == {k: real_cfg.get(k) for k in IDS}
    model = load_pretrained(tmp_path / "small")
    weight_map = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    assert {_pattern(k) for k in model.state_dict()} == {_pattern(k) for k in weight_map}
    assert summary["parameters"] == model.num_parameters() < 100_000_000
    with torch.no_grad():
        logits = model(torch.randint(0, 1000, (1, 8)))
    assert logits.shape == (1, 8, real_cfg["vocab_size"]) and torch.isfinite(logits).all()
    for f in src.iterdir():  # tokenizer, chat template, generation config: copied byte for byte
        if f.name not in ("config.json", "model.safetensors.index.json"):
            assert (tmp_path / "small" / f.name).read_bytes() == f.read_bytes(), f.name


@pytest.mark.parametrize("name,mask", [("Dream-v0-Instruct-7B", "<|mask|>"), ("SDAR-4B-Chat", "<|MASK|>")])
def test_real_tokenizer_agrees_with_the_shrunk_config(name, mask, tmp_path):
    shrink_checkpoint(CHECKPOINTS / name, tmp_path / "small")
    tok = load_tokenizer(tmp_path / "small")
    cfg = json.loads((tmp_path / "small" / "config.json").read_text())
    assert tok.convert_tokens_to_ids(mask) == cfg["mask_token_id"]
    assert len(tok) <= cfg["vocab_size"] and tok.chat_template


def test_moe_routing_fields_stay_consistent():
    real = json.loads((CHECKPOINTS / "LLaDA2.0-mini" / "config.json").read_text())
    small = shrunk_config(real, "llada2", layers=2, hidden=256)
    assert small["num_experts"] == 2 * real["num_experts_per_tok"] and small["num_experts"] % real["n_group"] == 0
    assert small["first_k_dense_replace"] == 1 and small["num_attention_heads"] * small["head_dim"] == 256
    assert small["rotary_dim"] == real["rotary_dim"]  # same head_dim and partial rotary factor
    with pytest.raises(CheckpointError, match="routing groups"):
        shrunk_config(real, "llada2", experts=12)
    with pytest.raises(CheckpointError, match="head_dim"):
        shrunk_config(real, "llada2", hidden=200)


def test_bad_input_writes_nothing(tmp_path):
    with pytest.raises(CheckpointError, match="no shipped config"):
        shrink_checkpoint("No-Such-Model", tmp_path / "a")
    (tmp_path / "taken").mkdir()
    with pytest.raises(CheckpointError, match="exists"):
        shrink_checkpoint("LLaDA-8B-Instruct", tmp_path / "taken")
    assert not (tmp_path / "a").exists() and list((tmp_path / "taken").iterdir()) == []


def test_the_command_writes_the_checkpoint_and_refuses_an_existing_dir(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "small"
    cmd = [sys.executable, "-m", "dare_bench.cli", "checkpoint", "shrink", "LLaDA-8B-Instruct", str(out),
           "--layers", "1", "--hidden", "128", "--json"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["family"] == "llada" and summary["layers"] == 1 and (out / "model.safetensors").exists()
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 2 and again.stderr.strip().splitlines()[-1].startswith("error: ")
    assert json.loads(again.stdout)["status"] == "error"


@pytest.mark.parametrize("name,mask,eos,stop,template_start", [
    ("LLaDA-8B-Instruct", 126336, 126081, 126348, "<|startoftext|><|start_header_id|>user"),
    ("LLaDA2.0-mini", 156895, 156892, None, "<role>SYSTEM</role>"),
])
def test_standin_tokenizer_keeps_the_real_special_ids(name, mask, eos, stop, template_start, tmp_path):
    """LLaDA / LLaDA2 ship no tokenizer files: the shrunk dir gets a stand-in with the real ids and template."""
    summary = shrink_checkpoint(CHECKPOINTS / name, tmp_path / "small", layers=1, hidden=128)
    assert summary["tokenizer"] == "stand-in" and (tmp_path / "small" / "STANDIN_TOKENIZER.md").exists()
    tok = load_tokenizer(tmp_path / "small")
    cfg = json.loads((tmp_path / "small" / "config.json").read_text())
    traits = load_pretrained(tmp_path / "small").traits
    assert len(tok) == cfg["vocab_size"]  # every id a random model may sample decodes
    assert (traits.mask_token_id, traits.eos_token_id) == (mask, eos)
    assert tok.eos_token_id == eos and tok.pad_token_id == traits.pad_token_id
    assert tok.decode([mask]) in ("<|mdm_mask|>", "<|mask|>") and tok.convert_tokens_to_ids(tok.decode([mask])) == mask
    if stop is not None:
        assert stop in traits.stop_token_ids and tok.convert_tokens_to_ids("<|eot_id|>") == stop
    text = "Héllo wörld 你好 <|endoftext|> 12+3\n"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text and eos in ids and max(ids) < cfg["vocab_size"]
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat.startswith(template_start) and "hi" in chat
    enc = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    enc = enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc
    assert tok.decode(enc) == chat


def test_standin_tokenizer_from_a_shipped_config_name(tmp_path):
    """A name (no metadata dir) still gets the real special tokens and chat template: the package ships them."""
    shrink_checkpoint("LLaDA-8B-Instruct", tmp_path / "small", layers=1, hidden=128)
    tok = load_tokenizer(tmp_path / "small")
    assert tok.convert_tokens_to_ids("<|mdm_mask|>") == 126336 and tok.eos_token_id == 126081
    text = tok.apply_chat_template([{"role": "user", "content": "2+3?"}], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|startoftext|><|start_header_id|>user<|end_header_id|>")
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
