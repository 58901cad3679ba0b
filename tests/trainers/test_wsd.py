"""LLaDA2.0's recipe (issue #20): the WSD schedule's load-time checks, document-level packed masks equal to the
documents computed one by one, the block-size-1 objective = the next-token loss, the CAP confidence loss against a
hand computation of dFactory's formula, the WSD trainer's stage boundaries, and micro runs of the registry entries
(wsd / ar / cap / vrpo on llada2 and sdar) through the real pipeline, with the per-stage evaluations in the store.

    pytest tests/trainers/test_wsd.py -q
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from dare_bench.catalogue.wsd import WsdKnobs
from dare_bench.diffusion.packing import PackedModel, first_fit_decreasing
from dare_bench.errors import ConfigError, DataError
from dare_bench.models.block import training_forward
from dare_bench.models.io import build_model
from dare_bench.models.presets import preset_config
from dare_bench.registry import Registry
from dare_bench.trainers.sft import (
    SFTConfig,
    SFTExample,
    collate_own_length,
    confidence_loss,
    sft_batch_loss,
    sft_loss,
)
from dare_bench.trainers.wsd import WsdConfig, check_documents, set_block_size, train_wsd, wsd_batch_loss

pytestmark = pytest.mark.usefixtures("one_thread")

REPRODUCTIONS = Path(__file__).resolve().parents[2] / "dare_bench" / "reproductions"
MASK, EOS, PAD = 31, 30, 29


def _model(block_size: int, seed: int = 0):
    cfg = preset_config("tiny-llada2", num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                        moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                        first_k_dense_replace=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                        rotary_dim=8, vocab_size=32, mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD,
                        block_size=block_size)
    torch.manual_seed(seed)
    model = build_model(cfg, device="cpu", dtype=torch.float32, source="test")
    model.init_weights()
    return model.eval()


def _documents(lengths=((5, 7), (3, 4), (6, 6), (4, 9), (2, 3))):
    """Documents of different lengths (prompt, answer incl. its EOS), seeded tokens below the special ids."""
    g = torch.Generator().manual_seed(1)
    out = []
    for p, a in lengths:
        ids = torch.randint(0, 28, (p + a,), generator=g).tolist()
        out.append(SFTExample(ids[:p], ids[p:-1] + [EOS]))
    return out


# ----------------------------------------------------------------------------------------------- the schedule

def _schedule(**over):
    base = dict(seq_len=16, stages=[{"phase": "warmup", "block_size": 2, "steps": 1},
                                    {"phase": "warmup", "block_size": 4, "steps": 1},
                                    {"phase": "stable", "block_size": 16, "steps": 2, "layout": "single"},
                                    {"phase": "decay", "block_size": 8, "steps": 1},
                                    {"phase": "decay", "block_size": 4, "steps": 1}])
    base.update(over)
    return WsdKnobs.model_validate(base)


def test_schedule_walks_its_stages():
    s = _schedule()
    assert s.total_steps == 6 and s.final_block_size == 4
    assert s.stage_ends() == [1, 2, 4, 5, 6]
    assert [s.stage_at(i) for i in range(6)] == [0, 1, 2, 2, 3, 4]


@pytest.mark.parametrize("stages, message", [
    ([{"phase": "warmup", "block_size": 3, "steps": 1}, {"phase": "stable", "block_size": 16, "steps": 1}],
     "block_size 3 does not divide seq_len 16"),
    ([{"phase": "stable", "block_size": 16, "steps": 1}, {"phase": "warmup", "block_size": 4, "steps": 1}],
     "a warmup stage after a stable stage"),
    ([{"phase": "stable", "block_size": 16, "steps": 1}, {"phase": "decay", "block_size": 4, "steps": 1},
      {"phase": "stable", "block_size": 16, "steps": 1}], "a stable stage after a decay stage"),
    ([{"phase": "warmup", "block_size": 8, "steps": 1}, {"phase": "warmup", "block_size": 4, "steps": 1},
      {"phase": "stable", "block_size": 16, "steps": 1}], "warmup block sizes must grow"),
    ([{"phase": "stable", "block_size": 16, "steps": 1}, {"phase": "decay", "block_size": 4, "steps": 1},
      {"phase": "decay", "block_size": 8, "steps": 1}], "decay block sizes must shrink"),
    ([{"phase": "stable", "block_size": 8, "steps": 1}], "a stable stage trains the full sequence"),
    ([{"phase": "warmup", "block_size": 4, "steps": 1}], "needs a stable (full-sequence) stage"),
    ([{"phase": "warmup", "block_size": 4, "steps": 1, "layout": "single"},
      {"phase": "stable", "block_size": 16, "steps": 1}], "layout single"),
])
def test_bad_schedules_are_refused(stages, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _schedule(stages=stages)


@pytest.fixture
def regdir(tmp_path) -> Path:
    d = tmp_path / "repros"
    d.mkdir()
    shutil.copytree(REPRODUCTIONS / "_defaults", d / "_defaults")
    for name in ("wsd-llada2-sudoku", "cap-llada2-sudoku"):
        shutil.copy(REPRODUCTIONS / f"{name}.yaml", d / f"{name}.yaml")
    return d


def _load_error(d: Path) -> str:
    with pytest.raises(ConfigError) as exc:
        Registry(d)
    msg = str(exc.value)
    assert "\n" not in msg  # one line
    return msg


def _edit_stages(d: Path, tiny_stages: str) -> None:
    f = d / "wsd-llada2-sudoku.yaml"
    f.write_text(f.read_text() + "  tiny:\n    train:\n      algorithm:\n        stages:\n" + tiny_stages)


def test_registry_refuses_a_block_size_not_dividing_the_sequence(regdir):
    _edit_stages(regdir, "          - {phase: warmup, block_size: 5, steps: 25}\n"
                         "          - {phase: stable, block_size: 96, steps: 100, layout: single}\n"
                         "          - {phase: decay, block_size: 8, steps: 50}\n")
    msg = _load_error(regdir)
    assert "wsd-llada2-sudoku.yaml" in msg and "scales.tiny.train.algorithm" in msg
    assert "block_size 5 does not divide seq_len 96" in msg


def test_registry_refuses_stages_out_of_order(regdir):
    _edit_stages(regdir, "          - {phase: stable, block_size: 96, steps: 100, layout: single}\n"
                         "          - {phase: warmup, block_size: 8, steps: 25}\n"
                         "          - {phase: decay, block_size: 8, steps: 50}\n")
    assert "a warmup stage after a stable stage" in _load_error(regdir)


def test_registry_refuses_steps_that_are_not_the_schedule(regdir):
    f = regdir / "wsd-llada2-sudoku.yaml"
    f.write_text(f.read_text() + "  tiny:\n    train:\n      steps: 100\n")
    assert "train.steps: 100 is not the schedule's 175" in _load_error(regdir)


def test_registry_refuses_a_final_block_the_evaluation_does_not_decode(regdir):
    f = regdir / "wsd-llada2-sudoku.yaml"
    f.write_text(f.read_text() + "  tiny:\n    eval:\n      sampler: {block_length: 4, steps: 4}\n")
    assert "eval.sampler.block_length: 4 is not the block size the schedule ends at (8)" in _load_error(regdir)


@pytest.mark.parametrize("algorithm", ["cap", "wsd"])
def test_registry_refuses_cap_and_wsd_on_a_masked_diffusion_backbone(regdir, algorithm):
    src = regdir / f"{algorithm}-llada2-sudoku.yaml"
    text = src.read_text().replace("llada2", "llada").replace("tiny-llada-ar", "tiny-llada")
    src.unlink()
    (regdir / f"{algorithm}-llada-sudoku.yaml").write_text(text)
    msg = _load_error(regdir)
    assert f"{algorithm} applies to block diffusion backbones only; llada is masked diffusion" in msg


def test_overrides_are_checked_the_same_way():
    from dare_bench.registry import get

    spec = get("wsd-llada2-sudoku")
    with pytest.raises(ConfigError, match="train.steps: 3 is not the schedule's 175"):
        spec.resolve("tiny", ["train.steps=3"])
    with pytest.raises(ConfigError, match="does not divide seq_len 90"):
        spec.resolve("tiny", ["train.algorithm.seq_len=90"])


# ----------------------------------------------------------------------------- packed = documents one by one

def _bd3_logits_alone(model, noisy, clean):
    """Each document alone: batch 1, no padding, the BD3 layout at the model's block size."""
    return [training_forward(model, n[None], c[None])[0] for n, c in zip(noisy, clean)]


@pytest.mark.parametrize("block_size", [1, 2, 4, 16])
def test_packed_documents_see_only_themselves(block_size):
    """The document-level mask: documents packed several to a row of seq_len (BD3 rows hold 2 x seq_len) give each
    document's noisy-copy logits exactly as the document run alone (its own positions and block grid)."""
    model = _model(block_size)
    docs = _documents()
    ids, plen, alen, lengths = collate_own_length(docs, PAD)
    from dare_bench.trainers.sft import draw_sft_noise

    noisy, masked, _ = draw_sft_noise(ids, plen, MASK, torch.Generator().manual_seed(3), lengths=lengths)
    attn = (torch.arange(ids.shape[1])[None] < lengths[:, None]).long()
    seq_len = 16
    # the plan packs: fewer rows than documents, none over capacity
    bins = first_fit_decreasing([2 * int(n) for n in lengths], 2 * seq_len)
    assert len(bins) < len(docs) and any(len(b) > 1 for b in bins)
    packed = training_forward(PackedModel(model, model.traits, capacity=2 * seq_len), noisy, ids, attention_mask=attn)
    alone = _bd3_logits_alone(model, [noisy[i, : lengths[i]] for i in range(len(docs))],
                              [ids[i, : lengths[i]] for i in range(len(docs))])
    for i, ref in enumerate(alone):
        torch.testing.assert_close(packed[i, : lengths[i]], ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("layout, block_size", [("bd3", 1), ("bd3", 4), ("bd3", 16), ("single", 16)])
def test_packed_loss_and_gradient_equal_the_unpacked(layout, block_size):
    """The WSD step's loss and gradient, packed into seq_len rows, equal the same loss computed unpacked (each
    document its own padded row, same noise)."""
    docs = _documents()
    ids, plen, alen, lengths = collate_own_length(docs, PAD)
    out = {}
    for packing in (False, True):
        model = _model(block_size).train()
        loss = sft_loss(model, ids, plen, alen, torch.Generator().manual_seed(5), lengths=lengths, packing=packing,
                        capacity=16, single_copy=layout == "single")
        loss.backward()
        grads = [p.grad.flatten() for p in model.parameters() if p.grad is not None]
        out[packing] = (float(loss.detach()), torch.cat(grads))
    assert out[True][0] == pytest.approx(out[False][0], rel=1e-5)
    torch.testing.assert_close(out[True][1], out[False][1], atol=1e-5, rtol=1e-4)


def test_single_copy_equals_bd3_at_the_full_sequence():
    """At block = seq_len no noisy token sees the clean copy, so the noisy copy alone computes the BD3 loss."""
    docs = _documents()
    ids, plen, alen, lengths = collate_own_length(docs, PAD)
    model = _model(16)
    with torch.no_grad():
        values = [float(sft_loss(model, ids, plen, alen, torch.Generator().manual_seed(7), lengths=lengths,
                                 packing=True, capacity=16, single_copy=single)) for single in (False, True)]
    assert values[1] == pytest.approx(values[0], rel=1e-5)


def test_block_size_one_is_the_next_token_loss():
    """Block size 1: every answer token masked, each predicted from the clean tokens before it, the loss the mean
    over documents of the summed next-token cross-entropy / answer length. Checked against one forward per token:
    [prefix ; MASK] under causal attention (block 1), its last logits scored against the token."""
    model = _model(1)
    docs = _documents()
    ids, plen, alen, lengths = collate_own_length(docs, PAD)
    loss = float(sft_loss(model, ids, plen, alen, torch.Generator().manual_seed(0), lengths=lengths))
    per_doc = []
    with torch.no_grad():
        for d in docs:
            seq = d.prompt_ids + d.answer_ids
            ce = 0.0
            for i in range(len(d.prompt_ids), len(seq)):
                x = torch.tensor([seq[:i] + [MASK]])
                logits = model(x)[0, -1]
                ce += float(F.cross_entropy(logits[None], torch.tensor([seq[i]])))
            per_doc.append(ce / len(d.answer_ids))
    assert loss == pytest.approx(sum(per_doc) / len(per_doc), rel=1e-5)


def test_documents_longer_than_the_row_are_refused():
    with pytest.raises(DataError, match="longest training document .* has 13"):
        check_documents(_documents(), 12)


# ------------------------------------------------------------------------------------------------------ CAP

def test_confidence_loss_is_the_mean_entropy_of_correct_masked_predictions():
    """dFactory's compute_confidence_loss by hand: positions scored (masked) and argmax == label; entropy of each."""
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0]],
                           [[1.0, 1.0, 0.5], [0.2, 0.1, 0.0], [0.0, 0.0, 0.0]]])
    targets = torch.tensor([[0, 2, 2], [0, 0, 1]])
    scored = torch.tensor([[True, True, True], [True, True, False]])
    # correct and scored: (0,0) argmax 0 = 0; (0,2) argmax 2 = 2; (1,0) argmax 0 (first of a tie) = 0;
    # (1,1) argmax 0 = 0. Not: (0,1) argmax 1 != 2; (1,2) unscored.

    def entropy(row):
        z = [math.exp(v) for v in row]
        s = sum(z)
        return -sum(p / s * math.log(p / s) for p in z)

    expected = (entropy([2, 0, 0]) + entropy([0, 0, 3]) + entropy([1, 1, 0.5]) + entropy([0.2, 0.1, 0])) / 4
    assert float(confidence_loss(logits, targets, scored)) == pytest.approx(expected, rel=1e-6)
    assert float(confidence_loss(logits, torch.full_like(targets, 1), scored & False)) == 0.0


def test_cap_loss_is_sft_plus_beta_times_the_confidence_loss():
    from dare_bench.trainers.sft import train_sft

    docs = _documents()
    model = _model(4)
    # a few SFT steps first, so that some masked tokens are predicted correctly (a random model predicts none)
    train_sft(model, docs, SFTConfig(steps=40, lr=1e-2, batch_size=5, warmup_steps=0))
    plain = float(sft_batch_loss(model, docs, SFTConfig(batch_size=5), torch.Generator().manual_seed(2)))
    cap = float(sft_batch_loss(model, docs, SFTConfig(batch_size=5, confidence_beta=2.0),
                               torch.Generator().manual_seed(2)))
    # the confidence term on the same noise, from the same forward
    from dare_bench.trainers.sft import collate, draw_sft_noise

    ids, plen, alen = collate(docs, EOS)
    noisy, masked, _ = draw_sft_noise(ids, plen, MASK, torch.Generator().manual_seed(2))
    conf = float(confidence_loss(training_forward(model, noisy, ids), ids, masked))
    assert cap == pytest.approx(plain + 2.0 * conf, rel=1e-5) and conf > 0
    with pytest.raises(ConfigError, match="chunked LM head"):
        SFTConfig(confidence_beta=1.0, lm_head_chunk_tokens=16)


# -------------------------------------------------------------------------------------------------- trainer

def test_train_wsd_steps_through_the_stages(tmp_path):
    docs = _documents() * 4
    schedule = WsdKnobs.model_validate(dict(seq_len=16, stages=[
        {"phase": "warmup", "block_size": 2, "steps": 2}, {"phase": "stable", "block_size": 16, "steps": 1,
                                                           "layout": "single"},
        {"phase": "decay", "block_size": 4, "steps": 2}]))
    model = _model(1)
    seen, logged = [], []
    cfg = WsdConfig(schedule=schedule, steps=None, lr=1e-3, batch_size=4, warmup_steps=0, log_every=1)
    from dare_bench.trainers.sft import SFTRunOptions

    out = train_wsd(model, docs, cfg, SFTRunOptions(sink=lambda s, m: logged.append((s, m["block_size"])),
                                                    checkpoint_dir=tmp_path / "ckpt"),
                    on_stage_end=lambda i, step: seen.append((i, step, model.traits.block_size, model.training)))
    assert out.steps == 5
    assert seen == [(0, 2, 2, False), (1, 3, 16, False), (2, 5, 4, False)]
    assert [b for _, b in logged] == [2.0, 2.0, 16.0, 4.0, 4.0]
    assert model.traits.block_size == 4 and model.config["block_size"] == 4
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-000002", "step-000003", "step-000005"]
    assert all(math.isfinite(x) for x in out.losses)
    # the step's loss refuses a model at another block size than its stage's
    set_block_size(model, 8)
    with pytest.raises(ConfigError, match="set_block_size first"):
        wsd_batch_loss(model, docs[:4], cfg, 0, torch.Generator())


def test_an_interrupted_conversion_resumes_at_its_stage(tmp_path):
    """Stopped inside the stable stage and resumed from its last boundary checkpoint: the same losses, boundaries
    and weights as one uninterrupted run (the block size comes back from the step)."""
    from dare_bench.trainers.sft import SFTRunOptions

    docs = _documents() * 4
    schedule = WsdKnobs.model_validate(dict(seq_len=16, stages=[
        {"phase": "warmup", "block_size": 2, "steps": 2}, {"phase": "stable", "block_size": 16, "steps": 2},
        {"phase": "decay", "block_size": 4, "steps": 2}]))

    def run(ckpt, stop_after=None, resume=False, seen=None):
        model = _model(1)
        cfg = WsdConfig(schedule=schedule, steps=None, lr=1e-3, batch_size=4, warmup_steps=0)
        out = train_wsd(model, docs, cfg, SFTRunOptions(checkpoint_dir=ckpt, resume=resume, stop_after=stop_after),
                        on_stage_end=lambda i, step: seen.append(i) if seen is not None else None)
        return model, out

    whole_seen, part_seen = [], []
    whole, ref = run(tmp_path / "a", seen=whole_seen)
    run(tmp_path / "b", stop_after=3, seen=part_seen)  # stops after step 3: inside the stable stage
    resumed, out = run(tmp_path / "b", resume=True, seen=part_seen)
    assert out.resumed_from == 2 and whole_seen == [0, 1, 2] and part_seen == [0, 1, 2]
    assert out.losses == pytest.approx(ref.losses, rel=1e-6)
    for a, b in zip(whole.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b)
    assert resumed.traits.block_size == 4


# ------------------------------------------------------------------------------------------ through the pipeline

FAST = ["base.start_step=2", "eval.limit=4"]


@pytest.mark.integration
def test_wsd_micro_run_stores_every_stage_evaluation(tmp_path):
    """`dare-bench reproduce wsd-llada2-sudoku --scale micro` (a 2-step base): the AR base, the three stages, each
    boundary evaluated at its block (accuracy + TPF) into the store, the final model at block 8."""
    from dare_bench.pipeline import reproduce
    from dare_bench.store import Store

    db = f"sqlite:///{tmp_path / 'runs.db'}"
    res = reproduce("wsd-llada2-sudoku", "micro", seed=0, db=db, overrides=FAST, progress=False, log=lambda _: None)
    assert res.status == "finished"
    evals = {e["checkpoint"]: e for e in Store(db).evaluations(res.run_id)}
    assert set(evals) == {"base", "stage-start-b1", "stage-0-warmup-b4", "stage-1-stable-b96", "stage-2-decay-b8",
                          "final", "final-thr0.9", "final-thr1"}  # + the pinned eval.thresholds (0.9, 1.0)
    for label in ("stage-start-b1", "stage-0-warmup-b4", "stage-1-stable-b96", "stage-2-decay-b8"):
        m = evals[label]["metrics"]
        assert "accuracy" in m and m["tokens_per_forward"] > 0
    assert [evals[f"stage-{i}"]["step"] for i in ("0-warmup-b4", "1-stable-b96", "2-decay-b8")] == [1, 2, 3]
    # the AR start decodes one token per forward (at most: a row that stops early commits nothing more)
    assert evals["stage-start-b1"]["metrics"]["tokens_per_forward"] <= 1.0
    import json

    final = json.loads((Path(res.final_model) / "config.json").read_text())
    assert final["block_size"] == 8


@pytest.mark.parametrize("name", ["ar-llada2-sudoku", "cap-llada2-sudoku", "cap-sdar-sudoku", "wsd-cap-llada2-sudoku",
                                  "vrpo-llada2-sudoku", "vrpo-sdar-sudoku", "bdlm-llada2-sudoku"])
@pytest.mark.integration
def test_llada2_recipe_entries_run_at_micro(name, tmp_path):
    from dare_bench.pipeline import reproduce

    res = reproduce(name, "micro", seed=0, db=f"sqlite:///{tmp_path / 'runs.db'}", overrides=FAST, progress=False,
                    log=lambda _: None)
    assert res.status == "finished" and res.metric in res.metrics
    if name.startswith("ar-"):
        import json

        assert json.loads((Path(res.final_model) / "config.json").read_text())["block_size"] == 1


def test_vrpo_entries_pin_beta_point_one():
    from dare_bench.registry import get

    for name in ("vrpo-llada2-sudoku", "vrpo-sdar-sudoku"):
        for scale in ("paper", "tiny", "micro"):
            assert get(name).knobs(scale).dpo_beta == 0.1


def test_every_training_kind_has_its_stage():
    """pipeline/train.py's TRAINERS holds one stage per trained kind of the catalogue and of TrainSettings."""
    import importlib
    from typing import get_args

    from dare_bench import catalogue
    from dare_bench.config import TrainSettings
    from dare_bench.pipeline.train import TRAINERS

    kinds = set(get_args(catalogue.Kind))
    assert kinds == set(get_args(TrainSettings.model_fields["kind"].annotation))
    assert set(TRAINERS) == kinds - {"none"}
    for target in TRAINERS.values():
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function))


def test_the_four_arms_train_equal_steps_and_documents():
    """ar / bdlm / wsd / wsd-cap (tiny): the same base steps, post-training steps, documents per step and learning
    rate (algorithms/bdlm.yaml), so the comparison differs in what is trained, not in how much."""
    from dare_bench.registry import get

    arms = {name: get(f"{name}-llada2-sudoku").scales["tiny"] for name in ("ar", "bdlm", "wsd", "wsd-cap")}
    for prof in arms.values():
        assert (prof.base.start_step, prof.base.target, prof.base.lr, prof.base.batch_size) == (275, None, 1e-3, 128)
        assert (prof.train.steps, prof.train.batch_prompts, prof.train.lr) == (175, 128, 1e-3)
    assert arms["bdlm"].model.preset == "tiny-llada2" and arms["ar"].model.preset == "tiny-llada2-ar"


def test_wsd_cap_runs_the_wsd_schedule_with_cap_in_its_decay_stages():
    """wsd-cap repeats wsd's schedule (equal compute) at every scale, and its loss adds the confidence term in the
    decay stages only."""
    from dare_bench.registry import get

    for scale in ("paper", "tiny", "micro"):
        plain, cap = get("wsd-llada2-sudoku").knobs(scale), get("wsd-cap-llada2-sudoku").knobs(scale)
        assert cap.stages == plain.stages and cap.seq_len == plain.seq_len and cap.confidence_beta == 2.0
        assert (get("wsd-llada2-sudoku").scales[scale].train.steps
                == get("wsd-cap-llada2-sudoku").scales[scale].train.steps)
    from dare_bench.trainers.sft import train_sft

    docs = _documents()
    model = _model(4)
    train_sft(model, docs, SFTConfig(steps=40, lr=1e-2, batch_size=5, warmup_steps=0))  # some correct predictions
    schedule = WsdKnobs.model_validate(dict(seq_len=16, stages=[
        {"phase": "warmup", "block_size": 4, "steps": 1}, {"phase": "stable", "block_size": 16, "steps": 1},
        {"phase": "decay", "block_size": 4, "steps": 1}]))

    def loss(stage, beta):
        cfg = WsdConfig(schedule=schedule, steps=None, batch_size=5, packing=True, confidence_beta=beta)
        with torch.no_grad():
            return float(wsd_batch_loss(model, docs, cfg, stage, torch.Generator().manual_seed(4)))

    assert loss(0, 2.0) == loss(0, 0.0)  # warmup: no confidence term
    assert loss(2, 2.0) > loss(2, 0.0)  # decay: + 2 x the (positive) confidence loss


def test_the_ar_entry_decodes_at_the_block_it_trains_at():
    from dare_bench.registry import get

    spec = get("ar-llada2-sudoku")
    assert all(spec.knobs(s).block_size == 1 == spec.scales[s].eval.sampler.block_length for s in spec.scales)
    with pytest.raises(ConfigError, match="block_length: 8 is not the block size ar trains at"):
        spec.resolve("tiny", ["eval.sampler.block_length=8", "eval.sampler.steps=8"])
