"""LLaDA2.1 joint threshold decoding (block convention "llada2.1"): token and forward-count parity with the official
`LLaDA2MoeModelLM.generate` of inclusionAI/LLaDA2.1-mini (fixture tests/fixtures/llada21/, made by its
make_fixture.py from the official file), batches against the official one-prompt-at-a-time outputs, the settings'
flow from `SamplerSettings.extra` and their checks.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python -m pytest tests/diffusion/test_sampling_llada21.py -q
"""

from __future__ import annotations

import json

import pytest
import torch

from dare_bench.diffusion.sampling import Llada21Settings, generate, resolve_settings
from dare_bench.errors import SamplerError

from testpaths import CHECKPOINTS, FIXTURES, PARITY

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

FIXTURE = json.loads((FIXTURES / "llada21" / "cases.json").read_text())
# official generate() arguments recorded per case, passed under the same names
ARGS = ("temperature", "block_length", "steps", "gen_length", "top_p", "top_k", "eos_early_stop", "minimal_topk",
        "threshold", "editing_threshold", "max_post_steps", "num_to_transfer", "eos_id")
PAD = 302  # parity checkpoint pad_token_id: rows of different cut lengths are right-padded with it


@pytest.fixture(scope="module")
def parity_model():
    from dare_bench.models import load_pretrained

    return load_pretrained(PARITY / "llada2").eval()


@pytest.fixture()
def scaled(parity_model):
    """The parity model with lm_head scaled as a case says (a power of two: exact), restored afterwards."""
    head = parity_model.lm_head.weight.detach().clone()

    def set_scale(scale: float):
        with torch.no_grad():
            parity_model.lm_head.weight.copy_(head * scale)
        return parity_model

    yield set_scale
    with torch.no_grad():
        parity_model.lm_head.weight.copy_(head)


def _settings(case: dict) -> dict:
    return {"convention": "llada2.1", "mask_id": FIXTURE["mask_id"],
            **{k: case[k] for k in ARGS if case.get(k) is not None}}


def _prompt(name: str) -> torch.Tensor:
    return torch.tensor([FIXTURE["prompts"][name]])


ROWS = [pytest.param(case, row, id=f"{case}-{row}") for case, c in FIXTURE["cases"].items() for row in c["rows"]]


@pytest.mark.parametrize("case,row", ROWS)
def test_tokens_and_forwards_equal_the_official_generate(scaled, case, row):
    c = FIXTURE["cases"][case]
    model = scaled(c["lm_head_scale"])
    if c["seed"] is not None:
        torch.manual_seed(c["seed"])  # sampled cases draw from torch's global RNG in the official order
    out = generate(model, _prompt(row), **_settings(c))
    official = c["rows"][row]
    assert out.sequences[0].tolist() == official["output_ids"]
    assert out.stats.forwards == official["forwards"]


def test_the_fixture_exercises_editing_and_early_stop():
    """Guards the fixture itself: T2T editing changes tokens and eos_early_stop saves forwards on some row."""
    cases = FIXTURE["cases"]
    edit, no_edit = cases["s_mode"]["rows"], cases["s_mode_no_edit"]["rows"]
    assert any(edit[r]["output_ids"] != no_edit[r]["output_ids"] for r in edit)
    on, off = cases["eos_stop_on"]["rows"], cases["eos_stop_off"]["rows"]
    assert all(on[r]["output_ids"] == off[r]["output_ids"] for r in on)  # the return value does not change
    assert any(on[r]["forwards"] < off[r]["forwards"] for r in on)
    assert any(len(on[r]["output_ids"]) < cases["eos_stop_on"]["gen_length"] for r in on)  # an eos cut


def _official_rows(case: str, rows: list[str]) -> list[list[int]]:
    return [FIXTURE["cases"][case]["rows"][r]["output_ids"] for r in rows]


def _left_padded(rows: list[str]):
    prompts = [FIXTURE["prompts"][r] for r in rows]
    width = max(map(len, prompts))
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    am = torch.zeros((len(rows), width), dtype=torch.long)
    for j, p in enumerate(prompts):
        ids[j, width - len(p):] = torch.tensor(p)
        am[j, width - len(p):] = 1
    return ids, am


@pytest.mark.parametrize("case", ["dare_pinned_sharp", "s_mode", "eos_stop_on", "two_per_step"])
def test_batches_give_the_official_tokens_of_each_prompt_alone(scaled, case):
    """The official function takes one prompt (DARE calls it prompt by prompt): an equal-length batch and a
    left-padded batch give each row the official tokens of that prompt alone (right-padded with the pad id)."""
    c = FIXTURE["cases"][case]
    model = scaled(c["lm_head_scale"])
    rows = list(c["rows"])
    ids, am = _left_padded(rows)
    got = generate(model, ids, am, **_settings(c)).sequences.tolist()
    for j, official in enumerate(_official_rows(case, rows)):
        assert got[j][:len(official)] == official and set(got[j][len(official):]) <= {PAD}
    same = [r for r in ("p6a", "p6b") if r in c["rows"]]
    if len(same) == 2:
        batch = torch.tensor([FIXTURE["prompts"][r] for r in same])
        got = generate(model, batch, **_settings(c)).sequences.tolist()
        for j, official in enumerate(_official_rows(case, same)):
            assert got[j][:len(official)] == official and set(got[j][len(official):]) <= {PAD}


def test_stop_at_eos_keeps_the_tokens_and_saves_forwards(scaled):
    c = FIXTURE["cases"]["eos_stop_off"]
    model = scaled(c["lm_head_scale"])
    official = c["rows"]["p9"]
    out = generate(model, _prompt("p9"), **_settings(c), stop_at_eos=True)
    assert out.sequences[0].tolist() == official["output_ids"] and out.stats.forwards < official["forwards"]


class AlwaysMask(torch.nn.Module):
    """Wraps a model so that the mask token is always the argmax (upstream would loop forever)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    @property
    def traits(self):
        return self.inner.traits

    def forward(self, *a, **kw):
        logits = self.inner(*a, **kw).clone()
        logits[..., FIXTURE["mask_id"]] += 1e4
        return logits


def test_a_model_that_keeps_drawing_the_mask_token_ends(parity_model):
    from dare_bench.diffusion.sampling.llada21 import MAX_FORWARDS_FACTOR

    out = generate(AlwaysMask(parity_model), _prompt("p5"), convention="llada2.1", mask_id=FIXTURE["mask_id"],
                   gen_length=8, block_length=4, max_post_steps=2)
    blocks = (5 + 8 + 3) // 4 - 5 // 4
    assert out.stats.forwards == blocks * MAX_FORWARDS_FACTOR * (4 + 2)
    assert out.stats.generated_tokens == 0  # every block left masked


def test_settings_flow_from_sampler_settings_extra(scaled):
    """`SamplerSettings.extra` carries the convention's knobs to generate(); a misspelled one is an error."""
    from dare_bench.config import SamplerSettings
    from dare_bench.trainers.loop import rollout_settings

    c = FIXTURE["cases"]["dare_pinned_sharp"]
    model = scaled(c["lm_head_scale"])
    extra = {"convention": "llada2.1", "editing_threshold": 0.9, "max_post_steps": 16, "num_to_transfer": 1,
             "minimal_topk": 1, "eos_early_stop": False, "mask_id": FIXTURE["mask_id"], "eos_id": c["eos_id"]}
    cfg = SamplerSettings(gen_length=12, steps=4, block_length=4, temperature=0.0, threshold=0.95, extra=extra)
    out = generate(model, _prompt("p9"), **rollout_settings(cfg))
    assert out.sequences[0].tolist() == c["rows"]["p9"]["output_ids"]
    assert {k: out.settings[k] for k in ("convention", "editing_threshold", "max_post_steps", "num_to_transfer",
                                         "threshold", "use_cache", "remasking_strategy")} == {
        "convention": "llada2.1", "editing_threshold": 0.9, "max_post_steps": 16, "num_to_transfer": 1,
        "threshold": 0.95, "use_cache": "none", "remasking_strategy": "joint_threshold"}
    typo = SamplerSettings(gen_length=12, steps=4, block_length=4, extra={**extra, "editing_treshold": 0.5})
    with pytest.raises(SamplerError, match="editing_treshold"):
        generate(model, _prompt("p9"), **rollout_settings(typo))


def _resolve(model, **settings):
    return resolve_settings(model, _prompt("p5"), None, dict(gen_length=8, block_length=4, **settings))


def test_official_defaults_and_bad_settings(parity_model):
    s = _resolve(parity_model, convention="llada2.1")
    assert isinstance(s, Llada21Settings)
    assert (s.threshold, s.editing_threshold, s.max_post_steps, s.num_to_transfer, s.temperature, s.use_cache,
            s.stop_at_eos, s.eos_early_stop) == (0.95, 0.9, 16, 1, 0.0, "none", False, False)
    # editing knobs belong to llada2.1 only
    for conv in ("llada2", "sdar"):
        with pytest.raises(SamplerError, match="llada2.1"):
            _resolve(parity_model, convention=conv, editing_threshold=0.5)
    bad = [dict(editing_threshold=1.5), dict(editing_threshold=True), dict(max_post_steps=-1),
           dict(num_to_transfer=0), dict(max_post_steps=2.0), dict(use_cache="exact"),
           dict(return_trajectory=True), dict(remasking_strategy="low_confidence_static")]
    for kw in bad:
        with pytest.raises(SamplerError):
            _resolve(parity_model, convention="llada2.1", **kw)
    assert _resolve(parity_model, convention="llada2.1", editing_threshold=0.0).editing_threshold == 0.0
    # eos_early_stop: any batch for llada2.1, batch 1 for llada2
    batch = torch.tensor([FIXTURE["prompts"]["p6a"], FIXTURE["prompts"]["p6b"]])
    assert resolve_settings(parity_model, batch, None, dict(gen_length=8, block_length=4, convention="llada2.1",
                                                            eos_early_stop=True)).eos_early_stop
    with pytest.raises(SamplerError, match="batch 1"):
        resolve_settings(parity_model, batch, None, dict(gen_length=8, block_length=4, convention="llada2",
                                                         eos_early_stop=True))
    # DARE's LLaDA2.0 configs pass minimal_topk 1.0
    assert _resolve(parity_model, convention="llada2", minimal_topk=1.0).minimal_topk == 1
    with pytest.raises(SamplerError):
        _resolve(parity_model, convention="llada2", minimal_topk=1.5)


def test_shrunk_llada21_mini_decodes_with_the_editing_convention(tmp_path):
    """LLaDA2.1-mini's real config (the same fields as LLaDA2.0-mini) loads as the llada2 family; a shrunk copy runs
    the convention end to end."""
    from dare_bench.models import load_pretrained
    from dare_bench.models.shrink import shrink_checkpoint

    src = CHECKPOINTS / "LLaDA2.1-mini"
    assert json.loads((src / "config.json").read_text()) == json.loads(
        (CHECKPOINTS / "LLaDA2.0-mini" / "config.json").read_text())
    shrink_checkpoint(src, tmp_path / "small", layers=2, hidden=256)
    model = load_pretrained(tmp_path / "small").eval()
    assert model.traits.family == "llada2" and model.traits.attention == "block_causal"
    out = generate(model, torch.randint(0, 1000, (1, 7)), convention="llada2.1", gen_length=16, block_length=8)
    assert out.settings["convention"] == "llada2.1" and out.stats.forwards > 0
    assert 1 <= out.sequences.shape[1] <= 16
