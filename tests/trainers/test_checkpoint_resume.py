"""Resumable RL checkpoints: an interrupted run resumed from its last checkpoint ends exactly like an uninterrupted one.

Three interruptions: SIGKILL of a training subprocess right after its first checkpoint lands (the real thing), and
two fast in-process variants that stop the loop between steps (full fine-tuning with a KL reference; LoRA adapters).
Compared: every deterministic metric of every step (timings and memory excluded) and every weight, bit for bit.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dare_bench.trainers.checkpoint import STATE_FILE, latest_checkpoint, list_checkpoints, save_checkpoint
from dare_bench.trainers.loop import TIMING_KEYS, RLRunOptions, train_rl

from rl_fakes import CharTokenizer, ReverseTask, micro_llada, rl_settings

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

RUNNER = r"""
import json, sys, time, torch
sys.path.insert(0, {here!r})
torch.set_num_threads(1)
from rl_fakes import CharTokenizer, ReverseTask, micro_llada, rl_settings
from dare_bench.trainers.loop import RLRunOptions, train_rl
ckpt, out, resume, delay = sys.argv[1], sys.argv[2], sys.argv[3] == "1", float(sys.argv[4])
def sink(step, metrics):
    if step >= 2:  # after checkpoint 1: give the test time to kill the run; no effect on the numbers
        time.sleep(delay)
cfg = rl_settings(**json.loads({cfg!r}))
res = train_rl(micro_llada(0), CharTokenizer(), ReverseTask(), "d1", cfg,
               RLRunOptions(sink=sink, checkpoint_dir=ckpt, resume=resume, seed=5, progress=False))
torch.save({{"history": res.history, "state": res.policy.state_dict(), "resumed_from": res.resumed_from}}, out)
"""

CFG = {"steps": 4, "checkpoint_every": 1, "beta_kl": 0.05, "lr": 1e-2, "lr_schedule": "cosine", "warmup_steps": 1}


def _deterministic(history):
    return [{k: v for k, v in m.items() if k not in TIMING_KEYS} for m in history]


def _same_weights(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"weight {k} differs after resume"


def _uninterrupted(cfg, seed=5, **kw):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # same reduction order as the subprocess
    try:
        return train_rl(micro_llada(0), CharTokenizer(), ReverseTask(), "d1", rl_settings(**cfg),
                        RLRunOptions(seed=seed, progress=False, **kw))
    finally:
        torch.set_num_threads(threads)


def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.pt"
    script = tmp_path / "runner.py"
    script.write_text(RUNNER.format(here=str(HERE), cfg=json.dumps(CFG)))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, str(script), str(ckpt), str(out), "0", "3.0"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not list_checkpoints(ckpt):
            assert proc.poll() is None, f"runner died: {proc.stderr.read()[-2000:]}"
            assert time.time() < deadline, "no checkpoint within 120 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists(), "the run finished before it was killed"
    done = [s for s, _ in list_checkpoints(ckpt)]
    assert done and max(done) < 4

    # resume in this process (one thread, like the runner): a fresh model, the killed run's checkpoint directory
    got = _uninterrupted(CFG, checkpoint_dir=ckpt, resume=True)
    assert got.resumed_from == max(done)
    ref = _uninterrupted(CFG)
    assert _deterministic(got.history) == _deterministic(ref.history)
    _same_weights(got.policy.state_dict(), ref.policy.state_dict())
    assert sorted(s for s, _ in list_checkpoints(ckpt))[-1] == 4
    assert not any(p.name.startswith(".") for p in ckpt.iterdir()), "temporary checkpoint directories left behind"


@pytest.mark.parametrize("lora", [False, True], ids=["full-kl", "lora"])
def test_stop_and_resume_in_process(tmp_path, lora):
    cfg = dict(CFG, steps=3, mu=2, clip_eps=0.2)  # μ = 2: old log-probs, clipping and two updates per batch
    if lora:
        cfg["lora"] = {"r": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj", "ff_out"]}
    ref = _uninterrupted(cfg)
    first = _uninterrupted(cfg, checkpoint_dir=tmp_path, stop_after=1)
    assert first.final_step == 1 and first.optimizer_steps == 2
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1]
    second = _uninterrupted(cfg, checkpoint_dir=tmp_path, resume=True)
    assert second.resumed_from == 1 and second.final_step == 2 and second.optimizer_steps == 3
    assert _deterministic(second.history) == _deterministic(ref.history)
    _same_weights(second.policy.state_dict(), ref.policy.state_dict())
    if lora:
        assert (latest_checkpoint(tmp_path) / "model" / "adapter_model.safetensors").exists()
    else:
        assert (latest_checkpoint(tmp_path) / "model" / "config.json").exists()
    # a finished run resumed again does nothing and reports the same history
    again = _uninterrupted(cfg, checkpoint_dir=tmp_path, resume=True)
    assert again.final_step == 2 and _deterministic(again.history) == _deterministic(ref.history)


def test_incomplete_checkpoint_is_ignored(tmp_path):
    model = micro_llada(0)
    opt = torch.optim.AdamW(model.parameters())
    sch = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    good = save_checkpoint(tmp_path, 1, model=model, optimizer=opt, scheduler=sch,
                           trainer_state={"history": []}, rng={})
    bad = tmp_path / "step-000002"
    bad.mkdir()
    (bad / STATE_FILE).write_text(json.dumps({"complete": False}))
    (tmp_path / "step-000003").mkdir()  # no state file at all
    assert latest_checkpoint(tmp_path) == good
    save_checkpoint(tmp_path, 4, model=model, optimizer=opt, scheduler=sch, trainer_state={}, rng={}, keep_last=1)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4]


DIST_RUNNER = r"""
import sys, torch
sys.path.insert(0, {here!r})
torch.set_num_threads(1)
from rl_fakes import CharTokenizer, ReverseTask, micro_llada, rl_settings
from dare_bench.trainers.distributed import exit_worker, full_state_dict, init_distributed, leave_distributed
from dare_bench.trainers.loop import RLRunOptions, train_rl
info = init_distributed()
res = train_rl(micro_llada(0), CharTokenizer(), ReverseTask(), "d1", rl_settings(steps=2, checkpoint_every=1),
               RLRunOptions(checkpoint_dir=sys.argv[1], seed=3, progress=False))
# FSDP2 shards the policy: the full weights are gathered to rank 0 ({{}} on the others)
torch.save({{"state": full_state_dict(res.policy), "history": res.history}}, sys.argv[2] + f".{{info.rank}}")
leave_distributed(info)
exit_worker(0)
"""


@pytest.mark.slow
def test_torchrun_two_ranks_report_alike_and_checkpoint_once(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "dist_runner.py"
    script.write_text(DIST_RUNNER.format(here=str(HERE)))
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.pt"
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
                           str(port), str(script), str(ckpt), str(out)], env=dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (torch.load(f"{out}.{r}", weights_only=False) for r in (0, 1))
    assert r1["state"] == {}  # one sharded model: its full weights exist on rank 0 only
    from dare_bench.models.io import read_state_dict

    _same_weights(r0["state"], read_state_dict(latest_checkpoint(ckpt) / "model"))  # rank 0 wrote the full weights
    assert _deterministic(r0["history"]) == _deterministic(r1["history"])  # metrics all-reduced
    assert [s for s, _ in list_checkpoints(ckpt)] == [1, 2]
    rng = torch.load(latest_checkpoint(ckpt) / "rng.pt", weights_only=False)
    assert isinstance(rng, list) and len(rng) == 2  # one RNG record per rank


def test_resume_refuses_another_runs_checkpoint(tmp_path):
    from dare_bench.errors import ConfigError

    _uninterrupted({"steps": 1, "checkpoint_every": 1}, checkpoint_dir=tmp_path)
    with pytest.raises(ConfigError, match="another run"):
        _uninterrupted({"steps": 2, "checkpoint_every": 1}, seed=6, checkpoint_dir=tmp_path, resume=True)


def test_exception_mid_run_then_resume(tmp_path):
    """A crash inside step 2 (after its update, before its checkpoint) loses only that step's work."""
    cfg = dict(CFG, steps=3)

    def crash(step, metrics):
        if step == 2:
            raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        _uninterrupted(cfg, checkpoint_dir=tmp_path, sink=crash)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1]
    resumed = _uninterrupted(cfg, checkpoint_dir=tmp_path, resume=True)
    ref = _uninterrupted(cfg)
    assert resumed.resumed_from == 1
    assert _deterministic(resumed.history) == _deterministic(ref.history)
    _same_weights(resumed.policy.state_dict(), ref.policy.state_dict())
