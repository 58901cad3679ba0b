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


@pytest.mark.parametrize("shape", [(1, 4, 2, 32, 320, 64), (2, 8, 2, 17, 100, 32), (1, 4, 1, 64, 1088, 64)])
@pytest.mark.parametrize("masked", [False, True])
def test_grouped_heads_without_grad_equal_the_repeated_ones(shape, masked):
    """Decoding on CPU lets SDPA read the grouped key / value heads (no n_rep-fold copy of the cache): bit for bit
    the explicit repeat, which training keeps."""
    b, h, hk, lq, lk, d = shape
    g = torch.Generator().manual_seed(lk)
    q, k, v = torch.randn(b, h, lq, d, generator=g), torch.randn(b, hk, lk, d, generator=g), torch.randn(b, hk, lk, d,
                                                                                                    generator=g)
    mask = (torch.rand(b, 1, lq, lk, generator=g) > 0.3) if masked else None
    if masked:
        mask[:, :, 0] = False  # a row that attends to nothing: 0, as with the repeat
    want = torch.nn.functional.scaled_dot_product_attention(
        q, layers.repeat_kv(k, h // hk), layers.repeat_kv(v, h // hk), attn_mask=mask | ~mask.any(-1, keepdim=True)
        if masked else None)
    if masked:
        want = want.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    with torch.no_grad():
        assert torch.equal(layers.attention(q, k, v, mask), want)
    q.requires_grad_(True)
    assert torch.equal(layers.attention(q, k, v, mask).detach(), want)  # the repeat path with grad


def test_kv_cache_appends_in_place_without_grad_as_concatenation():
    """Without grad the KV cache appends into storage with room (views, no copy of the whole cache); the keys /
    values seen and kept equal concatenation through appends, crops, in-place replacement and reorder."""
    from dare_bench.models.base import KVCache

    g = torch.Generator().manual_seed(0)
    new = lambda n, b=2: (torch.randn(b, 2, n, 8, generator=g), torch.randn(b, 2, n, 8, generator=g))  # noqa: E731
    cache, ref_k, ref_v = KVCache(1), None, None
    with torch.no_grad():
        for step, (n, update) in enumerate([(16, True), (4, False), (4, True), (8, False), (40, True), (3, False)]):
            k, v = new(n)
            got_k, got_v = cache.attend(0, k, v, update)
            want_k = k if ref_k is None else torch.cat([ref_k, k], -2)
            want_v = v if ref_v is None else torch.cat([ref_v, v], -2)
            assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v), step
            if update:
                ref_k, ref_v = want_k, want_v
            assert torch.equal(cache.keys[0], ref_k) and torch.equal(cache.values[0], ref_v), step
        cache.crop(30)
        ref_k, ref_v = ref_k[..., :30, :], ref_v[..., :30, :]
        k, v = new(5)
        cache.attend(0, k, v, update=True, replace_position=(10, 15))
        ref_k, ref_v = ref_k.clone(), ref_v.clone()
        ref_k[..., 10:15, :], ref_v[..., 10:15, :] = k, v
        k, v = new(6)
        assert torch.equal(cache.attend(0, k, v, True)[0], torch.cat([ref_k, k], -2))
        ref_k, ref_v = torch.cat([ref_k, k], -2), torch.cat([ref_v, v], -2)
        cache.reorder(torch.tensor([1]))
        k, v = new(2, b=1)
        got_k, got_v = cache.attend(0, k, v, True)
        assert torch.equal(got_k, torch.cat([ref_k[1:], k], -2)) and torch.equal(got_v, torch.cat([ref_v[1:], v], -2))
