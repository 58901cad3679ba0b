"""SFT and VRPO take the whole `train.*` recipe: every optimizer / schedule field, epochs → steps, LoRA, and
`--resume` that ends exactly like an uninterrupted run (weights, optimizer, scheduler, data position, RNG)."""

import copy
import math

import pytest
import torch

from dare_bench.config import TrainSettings
from dare_bench.errors import CheckpointError, ConfigError
from dare_bench.pipeline.train import _recipe
from dare_bench.trainers import sft as sft_mod
from dare_bench.trainers.checkpoint import checkpoint_path, list_checkpoints
from dare_bench.trainers.loop import build_scheduler
from dare_bench.trainers.lora import apply_lora
from dare_bench.trainers.preference import (
    PreferenceConfig,
    PreferencePair,
    PreferenceRunOptions,
    interleave_pairs,
    train_preference,
    vrpo_loss,
)
from dare_bench.trainers.sft import (
    LoraSettings,
    SFTConfig,
    SFTExample,
    SFTRunOptions,
    collate,
    run_length,
    sft_loss,
    train_sft,
)

from rl_fakes import EOS, micro_llada


def examples(n=10):
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        p = torch.randint(0, 10, (2 + i % 3,), generator=g).tolist()
        out.append(SFTExample(p, p[::-1] + [EOS] * (1 + i % 2)))
    return out


def pairs(n=6):
    g = torch.Generator().manual_seed(2)
    out = []
    for i in range(n):
        p = torch.randint(0, 10, (2 + i % 2,), generator=g).tolist()
        out.append(PreferencePair(p, p[::-1] + [EOS], torch.randint(0, 10, (1 + i % 3,), generator=g).tolist() + [EOS]))
    return out


def same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), f"{k} differs"


RECIPE = dict(lr=3e-3, betas=(0.8, 0.95), weight_decay=0.1, lr_schedule="cosine", warmup_steps=1, grad_clip=0.05)


def _replica(model, cfg, loss_fn, steps):
    """The recipe by hand: AdamW(lr, betas, weight_decay) + loop.build_scheduler + clip at grad_clip (None: none)."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    sched = build_scheduler(opt, cfg.lr_schedule, cfg.warmup_steps, steps)
    gen = torch.Generator().manual_seed(cfg.seed)
    losses, lrs = [], []
    model.train()
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        loss = loss_fn(model, gen)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip is not None else float("inf"))
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    return losses, lrs


@pytest.mark.parametrize("grad_clip", [0.05, None])
def test_sft_honours_every_optimizer_and_schedule_field(grad_clip):
    ex = examples()
    cfg = SFTConfig(steps=4, batch_size=4, seed=3, log_every=1, **dict(RECIPE, grad_clip=grad_clip))
    a, b = micro_llada(0), micro_llada(0)
    res = train_sft(a, ex, cfg)

    def loss_fn(model, gen):
        idx = torch.randint(len(ex), (4,), generator=gen).tolist()
        ids, plen, alen = collate([ex[i] for i in idx], EOS)
        return sft_loss(model, ids, plen, alen, gen, cfg.eps)

    losses, lrs = _replica(b, cfg, loss_fn, 4)
    assert res.losses == losses
    same_state(a, b)
    # HF cosine with one warmup step over 4 steps: 0, then 0.5 (1 + cos(pi k / 3)) for k = 0, 1, 2
    expect = [0.0] + [cfg.lr * 0.5 * (1 + math.cos(math.pi * k / 3)) for k in range(3)]
    assert [m["lr"] for _, m in res.logged] == pytest.approx(expect, abs=1e-12) == lrs


def test_vrpo_honours_every_optimizer_and_schedule_field():
    pr = pairs()
    cfg = PreferenceConfig(steps=3, batch_pairs=2, mc_samples=2, seed=4, **RECIPE)
    a, b = micro_llada(0), micro_llada(0)
    res = train_preference(a, pr, cfg)
    ref = copy.deepcopy(b).eval().requires_grad_(False)

    def loss_fn(model, gen):
        idx = torch.randint(len(pr), (2,), generator=gen).tolist()
        ids, am, plen = interleave_pairs([pr[i] for i in idx], EOS)
        return vrpo_loss(model, ref, ids, am, plen, beta=cfg.beta, mc_samples=2, generator=gen)[0]

    losses, _ = _replica(b, cfg, loss_fn, 3)
    assert res.losses == losses
    same_state(a, b)


def test_vrpo_with_lora_uses_the_disabled_adapters_as_reference():
    torch.manual_seed(0)
    policy = apply_lora(micro_llada(0), LoraSettings(r=4, alpha=8))
    res = train_preference(policy, pairs(), PreferenceConfig(steps=3, lr=1e-2, batch_pairs=2, mc_samples=2))
    assert res.losses[0] == pytest.approx(math.log(2), abs=1e-6)  # B = 0: policy == reference at step 0
    assert res.losses[-1] != pytest.approx(math.log(2), abs=1e-4)  # the adapters learned
    base = [n for n, p in policy.named_parameters() if "lora_" not in n]
    assert base and not any(p.requires_grad for n, p in policy.named_parameters() if "lora_" not in n)


def test_epochs_become_steps_and_steps_win():
    assert run_length(None, 3, 10, 4) == 9  # ceil(3 × ceil(10 / 4))
    assert run_length(None, 1.5, 10, 4) == 5  # ceil(1.5 × 3)
    assert run_length(7, 3, 10, 4) == 7
    res = train_sft(micro_llada(0), examples(10), SFTConfig(steps=None, epochs=1.5, lr=1e-3, batch_size=4))
    assert res.steps == len(res.losses) == 5
    res = train_preference(micro_llada(0), pairs(6), PreferenceConfig(steps=None, epochs=2, batch_pairs=4,
                                                                     mc_samples=1))
    assert res.steps == len(res.losses) == 4  # ceil(2 × ceil(6 / 4))
    assert train_sft(micro_llada(0), examples(10), SFTConfig(steps=2, epochs=3, batch_size=4)).steps == 2
    with pytest.raises(ConfigError, match="steps or epochs"):
        SFTConfig(steps=None)


def test_epoch_order_visits_every_example_once_per_pass(monkeypatch):
    seen = []
    real = sft_mod.collate
    monkeypatch.setattr(sft_mod, "collate", lambda ex, eos: (seen.extend(id(e) for e in ex), real(ex, eos))[1])
    ex = examples(8)
    train_sft(micro_llada(0), ex, SFTConfig(steps=None, epochs=2, lr=1e-3, batch_size=4, order="epochs"))
    assert len(seen) == 16
    for epoch in (seen[:8], seen[8:]):
        assert sorted(epoch) == sorted(id(e) for e in ex)


def test_pipeline_maps_every_recipe_field():
    train = TrainSettings(kind="sft", lr=1e-5, lr_schedule="cosine_with_min_lr", warmup_steps=7, weight_decay=0.1,
                          adam_betas=(0.8, 0.9), max_grad_norm=None, epochs=3, batch_prompts=64)
    r = _recipe(train)
    assert r == {"steps": None, "epochs": 3, "lr": 1e-5, "betas": (0.8, 0.9), "weight_decay": 0.1,
                 "lr_schedule": "cosine_with_min_lr", "warmup_steps": 7, "grad_clip": None, "order": "epochs",
                 "lm_head_chunk_tokens": None, "packing": False}
    # both configs accept the whole mapping (a field renamed on either side fails here)
    SFTConfig(**r)
    PreferenceConfig(**r)
    assert _recipe(train.model_copy(update={"steps": 5}))["order"] == "with_replacement"


# --- resume ---------------------------------------------------------------------------------------------------------
def _sft(model, ckpt, **opts):
    cfg = SFTConfig(steps=5, batch_size=4, seed=3, log_every=2, order="epochs", **RECIPE)
    return train_sft(model, examples(), cfg, SFTRunOptions(checkpoint_dir=ckpt, checkpoint_every=2, **opts))


def _vrpo(model, ckpt, **opts):
    cfg = PreferenceConfig(steps=5, batch_pairs=2, mc_samples=2, seed=4, log_every=2, **RECIPE)
    return train_preference(model, pairs(), cfg, PreferenceRunOptions(checkpoint_dir=ckpt, checkpoint_every=2, **opts))


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("runner", [_sft, _vrpo], ids=["sft", "vrpo"])
def test_stop_and_resume_equals_an_uninterrupted_run(tmp_path, runner, lora):
    def model():
        torch.manual_seed(0)
        m = micro_llada(0)
        return apply_lora(m, LoraSettings(r=4, alpha=8)) if lora else m

    full_model = model()
    full = runner(full_model, tmp_path / "full")
    sunk = []
    first = runner(model(), tmp_path / "ckpt", stop_after=3, sink=lambda s, m: sunk.append(s))
    assert first.steps == 3 and [s for s, _ in list_checkpoints(tmp_path / "ckpt")] == [2]
    resumed_model = model()  # a fresh process: the start model again, then the checkpoint
    torch.manual_seed(123)  # the global RNG is restored from the checkpoint, whatever it was
    second = runner(resumed_model, tmp_path / "ckpt", resume=True, sink=lambda s, m: sunk.append(s))
    assert second.resumed_from == 2
    assert second.losses == full.losses
    assert second.logged == full.logged
    same_state(resumed_model, full_model)
    # the interrupted call sank steps 0 and 2; the resumed one re-runs step 2 and sinks 2 and 4: the pipeline
    # re-logs the resumed run's earlier entries (steps < resumed_from) from `logged`
    assert sunk == [0, 2, 2, 4]
    assert [s for s, _ in second.logged if s < second.resumed_from] == [0]
    assert [s for s, _ in list_checkpoints(tmp_path / "ckpt")] == [2, 4, 5]


def test_resume_refuses_another_runs_checkpoint(tmp_path):
    _sft(micro_llada(0), tmp_path / "ckpt", stop_after=2)
    cfg = SFTConfig(steps=5, batch_size=4, seed=9, **RECIPE)
    with pytest.raises(ConfigError, match="belongs to another run"):
        train_sft(micro_llada(0), examples(), cfg, SFTRunOptions(checkpoint_dir=tmp_path / "ckpt", resume=True))


# --- continuing another run's trajectory (compute-budgeted controls, pipeline/control.py) ----------------------------
def _constant_sft(model, ckpt, steps, **opts):
    cfg = SFTConfig(steps=steps, batch_size=4, seed=3, log_every=2, lr=1e-2, warmup_steps=2, lr_schedule=None)
    return train_sft(model, examples(), cfg, SFTRunOptions(checkpoint_dir=ckpt, **opts))


def test_a_longer_run_continues_a_shorter_runs_end_like_a_run_from_step_0(tmp_path):
    full_model = micro_llada(0)
    full = _constant_sft(full_model, tmp_path / "full", 7, after_step=lambda step: step >= 6)
    short = _constant_sft(micro_llada(0), tmp_path / "short", 9, after_step=lambda step: step >= 3)
    assert short.steps == 3 and short.checkpoint == checkpoint_path(tmp_path / "short", 3)
    longer_model = micro_llada(0)
    longer = _constant_sft(longer_model, tmp_path / "longer", 40, continue_from=short.checkpoint,
                           after_step=lambda step: step >= 6)
    assert longer.resumed_from == 3 and longer.steps == full.steps == 6
    assert longer.losses == full.losses and longer.logged == full.logged
    same_state(longer_model, full_model)


def test_continuing_needs_a_length_free_schedule_and_the_same_run(tmp_path):
    short = _constant_sft(micro_llada(0), tmp_path / "short", 9, after_step=lambda step: step >= 3)
    cosine = SFTConfig(steps=9, batch_size=4, seed=3, log_every=2, lr_schedule="cosine")
    with pytest.raises(ConfigError, match="does not read the run length"):
        train_sft(micro_llada(0), examples(), cosine, SFTRunOptions(continue_from=short.checkpoint))
    other_seed = SFTConfig(steps=9, batch_size=4, seed=4, log_every=2, lr=1e-2, warmup_steps=2)
    with pytest.raises(ConfigError, match="belongs to another run"):
        train_sft(micro_llada(0), examples(), other_seed, SFTRunOptions(continue_from=short.checkpoint))
    with pytest.raises(ConfigError, match="not before this run's last"):
        _constant_sft(micro_llada(0), tmp_path / "shorter", 3, continue_from=short.checkpoint)
    (short.checkpoint / "model" / "model.safetensors").write_bytes(b"torn")  # a kept stretch damaged on disk
    with pytest.raises(CheckpointError, match="a cache: delete .* and rerun"):
        _constant_sft(micro_llada(0), tmp_path / "again", 9, continue_from=short.checkpoint)
