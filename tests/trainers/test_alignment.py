"""`dare-bench bench alignment`: RL gradients vs the supervised gradient on shared rollouts (toy task, micro LLaDA)."""

import math

import pytest
import torch
from typer.testing import CliRunner

from rl_fakes import EOS, CharTokenizer, ReverseTask, micro_llada, rl_settings


class NoGradient:
    """A plug-in stand-in whose update touches nothing: its cosine with any direction must read 0."""

    def advantages(self, rewards, group):
        return torch.zeros_like(rewards)

    def prepare(self, batch, policy, reference, *, generator, num_iterations):
        return None

    def backward(self, policy, batch, state, advantages, *, loss_scale, iteration):
        return {}


def _gold(task, tok):
    from dare_bench.trainers.sft import SFTExample

    def gold(idx):
        items = [task.items[i] for i in idx]
        return [SFTExample(tok.encode(task.format_prompt(it)), tok.encode(it.digits[::-1]) + [EOS]) for it in items]

    return gold


def test_alignment_measures_every_plugin_on_the_same_rollouts_and_leaves_the_model_alone():
    from dare_bench.bench.alignment import gradient_alignment
    from dare_bench.trainers.algorithms.base import get_algorithm
    from dare_bench.trainers.loop import _train_settings, algorithm_settings, rollout_settings

    policy, tok, task = micro_llada(0), CharTokenizer(), ReverseTask(n=32)
    train = _train_settings(rl_settings())
    plugins = {name: get_algorithm(name)(algorithm_settings(train), policy.traits) for name in ("d1", "bgpo")}
    plugins["none"] = NoGradient()
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    out = gradient_alignment(policy, tok, task, plugins, rollout_settings(train.rollout), task.items,
                             _gold(task, tok), batches=2, prompts=4, group=4, grader="dare", sft_draws=2)
    assert set(out["algorithms"]) == {"d1", "bgpo", "none"}
    for name, r in out["algorithms"].items():
        assert len(r["per_batch"]) == 2 and all(-1 <= c <= 1 and math.isfinite(c) for c in r["per_batch"])
        assert r["mean_cosine"] == pytest.approx(sum(r["per_batch"]) / 2)
    assert out["algorithms"]["none"]["per_batch"] == [0.0, 0.0]
    assert any(c != 0 for c in out["algorithms"]["d1"]["per_batch"])  # the toy reward varies inside groups
    assert 0 <= out["zero_std_groups"] < 1 and 0 <= out["mean_reward"] <= 1
    assert all(torch.equal(v, before[k]) for k, v in policy.state_dict().items())
    assert all(p.grad is None for p in policy.parameters())


@pytest.mark.parametrize("args,message", [
    (["d1-llada-sudoku", "d1-llada-countdown"], "does not share"),
    (["d1-llada-sudoku", "sft-llada-sudoku"], "not an RL reproduction"),
    (["d1-llada-sudoku", "--scale", "paper"], "must be tiny or micro"),
])
def test_alignment_bad_input_fails_before_any_work(args, message):
    from dare_bench.cli import app
    from dare_bench.errors import ConfigError

    res = CliRunner().invoke(app, ["bench", "alignment", *args])  # main() prints it as one line, exits non-zero
    assert isinstance(res.exception, ConfigError) and message in str(res.exception), res.output
