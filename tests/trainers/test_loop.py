"""The shared RL loop on a micro LLaDA and a toy task: wiring, metrics, LoRA reference, schedules, data order."""

import math
import re
from pathlib import Path

import pytest
import torch

from dare_bench.errors import ConfigError
from dare_bench.trainers import loop as loop_mod
from dare_bench.trainers.loop import (
    PromptStream,
    RLRunOptions,
    algorithm_settings,
    build_scheduler,
    completion_mask,
    rollout_settings,
    train_rl,
)

from rl_fakes import EOS, CharTokenizer, ReverseTask, micro_llada, micro_sdar, rl_settings

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_loop_never_names_an_algorithm_backbone_or_task():
    src = Path(loop_mod.__file__).read_text()
    code = re.sub(r'""".*?"""', "", src, flags=re.S)  # docstrings may give example commands
    code = re.sub(r"#.*", "", code)
    for word in ("d1", "coupled", "cj_grpo", "bgpo", "ebpo", "spg", "llada", "dream", "sdar", "sudoku", "gsm8k",
                 "countdown", "math500"):
        assert not re.search(rf"\b{word}\b", code, flags=re.I), word


def test_completion_mask_up_to_first_stop():
    comp = torch.tensor([[3, EOS, 5, EOS], [1, 2, 3, 4], [EOS, EOS, EOS, EOS], [1, 9, 9, EOS]])
    m = completion_mask(comp, (EOS, 9))
    assert m.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]]


def test_settings_mapping():
    from dare_bench.config import TrainSettings

    cfg = TrainSettings(**rl_settings(beta_kl=0.04, clip_eps=0.5, clip_ratio_c=3.0, advantage="mean_std",
                                      algorithm={"p_mask_prompt": 0.1}))
    a = algorithm_settings(cfg)
    assert a == {"kl_beta": 0.04, "clip_eps": 0.5, "clip_ratio_c": 3.0, "advantage": "mean_std", "p_mask_prompt": 0.1}
    assert "advantage" not in algorithm_settings(TrainSettings(**rl_settings(advantage="algorithm")))
    # shared fields the YAML leaves unset are not passed: the plug-in's own default applies (BGPO: 16 MC samples)
    from dare_bench.catalogue.knobs.bgpo import BGPOConfig

    assert BGPOConfig(**algorithm_settings(TrainSettings(**rl_settings()))).mc_samples == 16
    assert BGPOConfig(**algorithm_settings(TrainSettings(**rl_settings(mc_samples=4)))).mc_samples == 4
    r = rollout_settings(cfg.rollout)
    assert r == {"gen_length": 4, "steps": 4, "temperature": 0.9}
    r2 = rollout_settings({"gen_length": 8, "steps": 8, "remasking": "random", "extra": {"alg": "entropy"}})
    assert r2 == {"gen_length": 8, "steps": 8, "remasking": "random", "alg": "entropy"}


def test_scheduler_shapes():
    def lrs(name, warmup=2, total=10):
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=1.0)
        sch = build_scheduler(opt, name, warmup, total)
        out = []
        for _ in range(total):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sch.step()
        return out

    assert lrs("constant") == [1.0] * 10
    assert lrs("constant_with_warmup") == [0.0, 0.5] + [1.0] * 8
    cos = lrs("cosine")
    assert cos[:3] == [0.0, 0.5, 1.0] and cos[-1] == pytest.approx(0.5 * (1 + math.cos(math.pi * 7 / 8)))
    assert lrs("linear")[2:4] == [1.0, pytest.approx(7 / 8)]
    assert min(lrs("cosine_with_min_lr", total=3)[1:]) >= 0.1 - 1e-12
    with pytest.raises(ConfigError):
        lrs("exponential")


def test_prompt_stream_order_is_seeded_and_resumable():
    a, b = PromptStream(5, seed=3), PromptStream(5, seed=3)
    first = a.take(7)
    assert first == b.take(7) and sorted(first[:5]) == list(range(5))  # one epoch is a permutation
    c = PromptStream(5, seed=3)
    c.load_state(a.state())
    assert c.take(6) == a.take(6)
    # another seed, another order (50 items: two seeds giving the same permutation would be a bug, not chance)
    assert PromptStream(50, seed=4).take(50) != PromptStream(50, seed=3).take(50)
    assert PromptStream(5, seed=4).take(5) == [0, 3, 2, 4, 1] and PromptStream(5, seed=3).take(5) == [4, 2, 1, 3, 0]


def _run(tmp_path=None, **kw):
    torch.manual_seed(0)
    records = []
    policy = micro_llada(0)
    cfg = rl_settings(**kw.pop("cfg", {}))
    res = train_rl(policy, CharTokenizer(), ReverseTask(), "d1", cfg,
                   RLRunOptions(sink=lambda s, m: records.append((s, m)), progress=False, seed=kw.pop("seed", 0), **kw))
    return res, records


def test_train_rl_d1_metrics_and_update():
    start = {k: v.clone() for k, v in micro_llada(0).state_dict().items()}
    res, records = _run(cfg={"steps": 3}, micro_batch_size=6)
    assert res.final_step == 3 and res.optimizer_steps == 3 and [s for s, _ in records] == [1, 2, 3]
    m = records[-1][1]
    for key in ("reward_mean", "reward_std", "accuracy", "loss", "pg_loss", "clip_frac", "entropy", "grad_norm",
                "lr", "tokens_per_forward", "time_rollout_s", "time_reward_s", "time_prepare_s", "time_update_s",
                "peak_memory_mb", "completion_tokens"):
        assert key in m and math.isfinite(m[key]), key
    assert 0 <= m["reward_mean"] <= 1 and m["tokens_per_forward"] > 0 and m["peak_memory_mb"] > 0
    assert m["clip_frac"] == 0.0  # μ = 1: ratio ≡ 1
    changed = [k for k, v in res.policy.state_dict().items() if not torch.equal(v, start[k])]
    assert changed, "the optimizer moved no weight"
    assert res.info["algorithm"] == "d1" and res.info["micro_batch_size"] == 6


def test_mu_iterations_count_optimizer_steps():
    res, records = _run(cfg={"steps": 3, "mu": 2, "clip_eps": 0.2})
    assert res.optimizer_steps == 3 and res.final_step == 2  # ceil(3 / 2) rollout batches, the last one with μ = 1
    assert [m["optimizer_step"] for _, m in records] == [2.0, 3.0]


def test_lora_reference_is_the_policy_with_adapters_disabled():
    base = micro_llada(0)
    base_state = {k: v.clone() for k, v in base.state_dict().items()}
    cfg = rl_settings(steps=2, lr=5e-2, beta_kl=0.1, lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    records = []
    res = train_rl(base, CharTokenizer(), ReverseTask(), "d1", cfg,
                   RLRunOptions(sink=lambda s, m: records.append(m), progress=False))
    # step 1: adapters start at B = 0, so policy == reference and the KL term is exactly 0
    assert records[0]["kl"] == 0.0
    assert records[1]["kl"] > 0.0  # after one update the adapters moved away from the reference
    peft_model = res.policy
    assert hasattr(peft_model, "disable_adapter")
    frozen = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
              for k, v in peft_model.state_dict().items() if "lora_" not in k}
    assert set(frozen) == set(base_state)
    assert all(torch.equal(frozen[k], base_state[k]) for k in base_state), "LoRA must not touch the base weights"


def test_full_finetune_kl_uses_frozen_start():
    res, records = _run(cfg={"steps": 2, "beta_kl": 0.1, "lr": 5e-2})
    assert records[0][1]["kl"] == 0.0 and records[1][1]["kl"] > 0.0


def test_bad_settings_fail_before_training():
    with pytest.raises(ConfigError, match="mc_samples"):
        _run(cfg={"mc_samples": 2})
    with pytest.raises(ConfigError, match="kind=rl|train.kind"):
        _run(cfg={"kind": "sft"})
    with pytest.raises(ConfigError, match="unknown algorithm"):
        train_rl(micro_llada(0), CharTokenizer(), ReverseTask(), "d2", rl_settings(), RLRunOptions(progress=False))
    with pytest.raises(ConfigError, match="quant_4bit"):
        _run(cfg={"lora": {"r": 2, "alpha": 4, "quant_4bit": True}})


def test_real_task_tokenizer_and_registry_config():
    """d1-llada-sudoku at micro scale through the real task, its tiny tokenizer and the tiny-llada preset."""
    from dare_bench.models.io import build_model
    from dare_bench.models.presets import preset_for_tokenizer
    from dare_bench.registry import get
    from dare_bench.tasks import get_task
    from dare_bench.tasks.tokenizer import build_task_tokenizer

    run = get("d1-llada-sudoku").resolve("micro", ["train.steps=1", "train.batch_prompts=2",
                                                   "train.rollout.gen_length=8", "train.rollout.steps=8"])
    task = get_task("sudoku")
    tok = build_task_tokenizer("sudoku")
    config = preset_for_tokenizer(run.profile.model.preset, tok, n_layers=1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build_model(config)
        model.init_weights()
    items = task.generate(8, seed=1, split="train").items
    records = []
    res = train_rl(model, tok, task, run.algorithm, run.profile.train,
                   RLRunOptions(items=items, progress=False, sink=lambda s, m: records.append(m)))
    assert res.final_step == 1 and len(records) == 1
    m = records[0]
    assert 0.0 <= m["reward_mean"] <= 1.0 and math.isfinite(m["loss"]) and m["completion_tokens"] >= 1
    assert res.info["sampler"] == {"gen_length": 8, "steps": 8, "temperature": 0.9, "return_trajectory": False}
    assert res.info["algorithm_config"]["p_mask_prompt"] == 0.15


def test_train_data_names_the_sources():
    task = ReverseTask(n=5)
    assert len(loop_mod.load_train_items(task, [])) == 5
    assert len(loop_mod.load_train_items(task, ["reverse", "reverse"])) == 10


def test_every_rl_algorithm_of_the_catalogue_with_a_plugin_resolves():
    """Reproduction YAMLs spell algorithms with hyphens (coupled-grpo); plug-ins register module-style names."""
    from dare_bench import catalogue
    from dare_bench.trainers.algorithms import get_algorithm, list_algorithms

    plugins = set(list_algorithms())
    for spec in catalogue.algorithms().values():
        if spec.plugin is not None:
            assert get_algorithm(spec.name).name == spec.plugin and spec.plugin in plugins
    assert "d1" in plugins


def _plugins():
    from dare_bench.trainers.algorithms import list_algorithms

    return list_algorithms()


@pytest.mark.parametrize("name", _plugins())
def test_every_plugin_runs_through_the_loop(name):
    """The contract end to end: each registered plug-in trains 2 rollout batches × μ = 2 on a backbone it supports."""
    from dare_bench.trainers.algorithms import get_algorithm

    kinds = get_algorithm(name).attention_kinds
    model = micro_llada(0) if "bidirectional" in kinds else micro_sdar(0)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    # the toy completion is 4 tokens long: SPG's default 2 masks per sequence need 2 mask blocks
    knobs = {"spg": {"mask_block_length": 2}}.get(name, {})
    res = train_rl(model, CharTokenizer(), ReverseTask(), name,
                   rl_settings(steps=4, mu=2, clip_eps=0.2, algorithm=knobs),
                   RLRunOptions(progress=False, micro_batch_size=8))
    assert res.optimizer_steps == 4 and res.final_step == 2
    assert all(math.isfinite(m["loss"]) for m in res.history)
    assert any(not torch.equal(v, start[k]) for k, v in res.policy.state_dict().items())


# RL algorithms that have reproductions in the registry but no plug-in yet: `dare-bench reproduce` refuses them
# ("unknown algorithm"). Named here so that none drops out of the tests unnoticed; remove a name when its plug-in lands.
RL_WITHOUT_PLUGIN: set[str] = set()


def _rl_reproductions():
    """{algorithm as the registry spells it: [reproduction specs]} for every reproduction that trains with RL."""
    from dare_bench.registry import load_registry

    out: dict[str, list] = {}
    for spec in load_registry():
        if any(spec.resolve(scale).profile.train.kind == "rl" for scale in spec.scales):
            out.setdefault(spec.algorithm, []).append(spec)
    return out


def test_every_rl_reproduction_has_a_plugin_or_is_named_as_missing():
    from dare_bench.trainers.algorithms import list_algorithms

    plugins = set(_plugins())
    missing = {a for a in _rl_reproductions() if a.replace("-", "_") not in plugins}
    assert missing == RL_WITHOUT_PLUGIN, (
        f"RL reproductions without a plug-in: {sorted(missing)}; expected exactly {sorted(RL_WITHOUT_PLUGIN)} "
        "(update RL_WITHOUT_PLUGIN when a plug-in lands or a new algorithm is added)")
    unused = sorted(p for p in list_algorithms() if p not in {a.replace("-", "_") for a in _rl_reproductions()})
    assert not unused, f"plug-ins no RL reproduction uses: {unused}"


@pytest.mark.parametrize("plugin", _plugins())
def test_every_reproduction_config_builds_its_plugin(plugin):
    """Each registered RL plug-in: every reproduction YAML that uses it, at every scale, gives settings it accepts
    (typos fail at config time) on a backbone it supports; a reproduction it cannot run fails this test by name."""
    from dare_bench.models.io import build_model
    from dare_bench.models.presets import preset_config
    from dare_bench.trainers.algorithms import get_algorithm

    specs = [s for a, group in _rl_reproductions().items() if a.replace("-", "_") == plugin for s in group]
    assert specs, f"no RL reproduction uses the plug-in {plugin!r}"
    cls = get_algorithm(plugin)
    traits = {}
    checked = 0
    for spec in specs:
        preset = f"tiny-{spec.backbone}"
        if preset not in traits:
            traits[preset] = build_model(preset_config(preset), device="meta").traits
        assert traits[preset].attention in cls.attention_kinds, (
            f"{spec.name}: {plugin} is not defined for {spec.backbone} ({traits[preset].attention} attention)")
        for scale in spec.scales:
            train = spec.resolve(scale).profile.train
            if train.kind == "rl":
                algo = cls(algorithm_settings(train), traits[preset])
                if train.rollout is not None:  # the rollout settings the plug-in requires (JustGRPO: block 1)
                    algo.check_rollout(rollout_settings(train.rollout))
                checked += 1
    assert checked > 0


@pytest.mark.slow
def test_d1_raises_the_reward_of_a_random_policy_on_the_toy_task():
    """End to end, the sign and scale of the update: 40 d1 steps lift the toy task's reward from chance.

    Measured on this machine (one thread, ~15 s): mean rollout reward 0.081 over steps 1-10 -> 0.165 over 31-40.
    """
    rewards = []
    cfg = rl_settings(steps=40, lr=3e-3, batch_prompts=8, group_size=8,
                      rollout={"gen_length": 4, "steps": 4, "temperature": 1.0})
    train_rl(micro_llada(0, n_layers=2, d_model=64, mlp_hidden_size=128), CharTokenizer(), ReverseTask(n=64), "d1",
             cfg, RLRunOptions(progress=False, sink=lambda s, m: rewards.append(m["reward_mean"])))
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.05, (first, last)


def test_gradient_checkpointing_gives_the_same_run():
    plain, _ = _run(cfg={"steps": 1})
    ckpt, _ = _run(cfg={"steps": 1}, gradient_checkpointing=True)
    assert ckpt.policy.gradient_checkpointing
    for (k, a), b in zip(plain.policy.state_dict().items(), ckpt.policy.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=k)


def test_eval_every_evaluates_mid_training_without_changing_the_run():
    calls = []

    def evaluate(policy, step):
        assert not policy.training and not torch.is_grad_enabled()
        torch.rand(100)  # an evaluator that draws from the global RNG must not shift training's draws
        calls.append(step)
        return {"accuracy": 0.25, "score": 0.5}

    plain, _ = _run(cfg={"steps": 5, "eval_every": 2})
    evaluated, records = _run(cfg={"steps": 5, "eval_every": 2}, evaluate=evaluate)
    assert calls == [2, 4]  # not at the last step: the pipeline's final evaluation covers it
    assert [s for s, m in records if "eval_accuracy" in m] == [2, 4]
    assert records[1][1]["eval_score"] == 0.5 and evaluated.policy.training
    for (k, a), b in zip(plain.policy.state_dict().items(), evaluated.policy.state_dict().values()):
        assert torch.equal(a, b), k


def test_a_plugin_that_owns_its_rollouts_gets_its_rows_graded_by_the_loop():
    """The contract extension on its own (no real plug-in): `generate_rollouts` makes 3 rows of each prompt row
    (here: the sampler's completion and two copies with the first token changed); the loop grades every row with the
    task's grader, repeats the prompts, multiplies the group size and keeps the per-row trajectories."""
    from dare_bench.diffusion.sampling import generate
    from dare_bench.trainers.algorithms import PluginRollout

    class ThreeEach:
        name, owns_rollout = "three-each", True

        def generate_rollouts(self, policy, prompt_ids, prompt_mask, *, settings, generator):
            assert not policy.training and not torch.is_grad_enabled()
            out = generate(policy, prompt_ids, prompt_mask, generator=generator, **settings)
            rows = out.canvas.repeat_interleave(3, dim=0).clone()
            p = prompt_ids.shape[1]
            rows[1::3, p], rows[2::3, p] = 0, 1
            out.canvas = out.sequences = rows
            return PluginRollout(out, rows_per_prompt=3, trajectories=[("row", r) for r in range(rows.shape[0])])

    model, task, tok = micro_llada(0), ReverseTask(n=4), CharTokenizer()
    batch, info = loop_mod.rollout_batch(model, tok, task, task.items, [0, 1], 2, {"gen_length": 4, "steps": 4},
                                         generator=torch.Generator().manual_seed(0), algorithm=ThreeEach())
    assert model.training  # the loop restores the mode
    assert batch.num_rows == 12 and batch.group_size == 6 and batch.trajectories == [("row", r) for r in range(12)]
    assert torch.equal(batch.prompt_ids[:6], batch.prompt_ids[:1].expand(6, -1))
    for r in range(12):
        kept = []
        for t in batch.completion_ids[r].tolist():
            if t == EOS:
                break
            kept.append(t)
        assert float(batch.rewards[r]) == pytest.approx(task.grade(tok.decode(kept), task.items[r // 6]).reward)
    assert len(info["correct"]) == 12


def test_micro_batches_keep_a_plugins_row_blocks_together():
    assert loop_mod._micro_slices(12, 5, 1) == [slice(0, 5), slice(5, 10), slice(10, 12)]
    assert loop_mod._micro_slices(12, 5, 3) == [slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 12)]
    assert loop_mod._micro_slices(12, 2, 6) == [slice(0, 6), slice(6, 12)]  # at least one block
    with pytest.raises(ConfigError):
        loop_mod._micro_slices(10, 4, 3)
