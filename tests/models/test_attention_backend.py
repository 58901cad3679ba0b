"""The attention backend is chosen in one place (config `model.attention`, `load_pretrained(attention=)`,
`set_attention`, `dare-bench eval --attention`) and reaches every attention call; a backend that cannot run here is
one line naming what to install."""

import importlib.util
import json
import subprocess
import sys
import typing

import pytest
import torch

from dare_bench.config import ModelRef
from dare_bench.errors import DareBenchError
from dare_bench.models import layers, load_pretrained, set_attention

no_flash = pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="flash-attn is installed")


def test_config_names_are_the_layer_backends():
    assert typing.get_args(ModelRef.model_fields["attention"].annotation) == layers.BACKENDS
    ref = ModelRef(preset="tiny-llada")
    assert ref.attention == "sdpa" and "attention" not in ref.model_dump()  # old config hashes unchanged
    assert ModelRef(preset="tiny-llada", attention="flex").model_dump()["attention"] == "flex"
    with pytest.raises(ValueError):
        ModelRef(preset="tiny-llada", attention="xformers")


@no_flash
def test_missing_flash_attn_names_the_extra():
    with pytest.raises(DareBenchError) as info:
        load_pretrained("tiny-llada", attention="flash_attn")
    msg = str(info.value)
    assert "\n" not in msg and "flash-attn" in msg and "dare-bench[gpu]" in msg
    with pytest.raises(DareBenchError, match="unknown attention backend"):
        set_attention(load_pretrained("tiny-llada"), "xformers")


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_selection_reaches_the_attention_layers(backend, monkeypatch):
    """Every block's attention call receives the chosen backend (LLaDA, LLaDA2 import `attention` by name)."""
    seen = []
    real = layers.attention

    def spy(*args, **kw):
        seen.append(kw.get("backend"))
        return real(*args, **kw)

    from dare_bench.models import llada, llada2

    monkeypatch.setattr(llada, "attention", spy)
    monkeypatch.setattr(llada2, "attention", spy)
    for preset in ("tiny-llada", "tiny-llada2"):
        model = load_pretrained(preset, attention=backend)
        seen.clear()
        with torch.no_grad():
            model(torch.randint(0, 500, (1, 8)))
        assert seen and set(seen) == {backend}, preset


def test_flex_logits_match_sdpa_on_cpu():
    ids = torch.randint(0, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    pad = torch.ones(2, 12, dtype=torch.long)
    pad[1, :3] = 0
    model = load_pretrained("tiny-llada")
    with torch.no_grad():
        ref = model(ids, attention_mask=pad)
        got = set_attention(model, "flex")(ids, attention_mask=pad)
    assert (ref - got).abs().max() <= 1e-4


def test_set_attention_reaches_a_wrapped_backbone():
    model = load_pretrained("tiny-llada")
    wrapper = torch.nn.Sequential(model)
    assert set_attention(wrapper, "flex") is wrapper and model.attn_backend == "flex"
    with pytest.raises(DareBenchError, match="holds no dare-bench backbone"):
        set_attention(torch.nn.Linear(2, 2), "sdpa")


@no_flash
def test_eval_attention_option_missing_extra_is_one_line_exit_2():
    cmd = [sys.executable, "-m", "dare_bench.cli", "eval", "--model", "tiny-llada", "--task", "sudoku", "--limit",
           "1", "--attention", "flash_attn"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "dare-bench[gpu]" in lines[0], res.stderr


def test_eval_attention_flex_runs(tmp_path):
    from typer.testing import CliRunner

    from dare_bench.cli import app

    res = CliRunner().invoke(app, ["eval", "--model", "tiny-llada", "--task", "sudoku", "--limit", "1",
                                   "--set", "gen_length=8", "--set", "steps=8", "--set", "block_length=8",
                                   "--attention", "flex", "--json"])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.output.strip().splitlines()[-1])
    assert payload["attention"] == "flex" and payload["model"] == "tiny-llada"
