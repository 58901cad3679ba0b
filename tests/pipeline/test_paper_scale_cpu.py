"""The paper path end to end on CPU (`--scale paper --device cpu`) with shrunk real-architecture checkpoints.

- Real data: a shrunk Dream (the real Qwen2 tokenizer and chat template) runs d1 on DARE's GSM8K parquet for 2 steps
  and is evaluated on 4 test items with the real grader; one run row, its metrics once, a final dir that reloads.
- torchrun (slow): `reproduce(..., nproc=2)` equals one process on the same global batch (fp32): step losses and
  final weights; one run row; and a SIGKILLed 2-process run resumed with `--resume` ends like an uninterrupted one.
- Bad input: each refused with one error and no run row.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from testpaths import CHECKPOINTS, DARE_DATA

REPO = Path(__file__).resolve().parents[2]
# Short everything: 2 optimizer steps, 2 prompts x 2 completions of 8 tokens, 4 evaluation items.
SHORT = ["train.steps=2", "train.batch_prompts=2", "train.group_size=2", "train.rollout.gen_length=8",
         "train.rollout.steps=4", "eval.limit=4", "eval.batch_size=4", "eval.sampler.gen_length=8",
         "eval.sampler.steps=4"]


@pytest.fixture(scope="module")
def shrunk_dream(tmp_path_factory) -> Path:
    from dare_bench.models.shrink import shrink_checkpoint

    out = tmp_path_factory.mktemp("ckpt") / "dream"
    shrink_checkpoint(CHECKPOINTS / "Dream-v0-Instruct-7B", out, layers=2, hidden=128, dtype="float32")
    return out


@pytest.fixture
def dare_data(monkeypatch):
    monkeypatch.setenv("DARE_BENCH_DATA", str(DARE_DATA))


def _rows(db_file: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db_file) as con:
        return con.execute(sql).fetchall()


@pytest.mark.integration
def test_shrunk_dream_d1_on_dare_gsm8k_end_to_end(shrunk_dream, dare_data, tmp_path):
    from dare_bench.models import load_pretrained
    from dare_bench.pipeline import reproduce

    db_file = tmp_path / "runs.db"
    with pytest.warns(UserWarning, match="paper recipe on CPU"):
        result = reproduce("d1-dream-gsm8k", "paper", checkpoint=str(shrunk_dream), device="cpu",
                           db=f"sqlite:///{db_file}", overrides=SHORT, progress=False, log=lambda m: None)
    assert result.status == "finished"
    assert _rows(db_file, "select count(*) from runs") == [(1,)]
    assert _rows(db_file, "select step from step_metrics order by step") == [(1,), (2,)]
    samples = _rows(db_file, "select e.checkpoint, s.prompt, s.reference from samples s "
                             "join evaluations e on s.evaluation_id = e.id")
    assert sorted(c for c, _, _ in samples) == ["base"] * 4 + ["final"] * 4
    # the real prompt: DARE's messages through the checkpoint's own chat template (Qwen2's im_start turns)
    assert all("<|im_start|>user" in p and p.rstrip().endswith("<|im_start|>assistant") for _, p, _ in samples)
    assert all(ref for _, _, ref in samples)  # GSM8K gold answers from the parquet: the real grader's input
    reloaded = load_pretrained(result.final_model)
    assert reloaded.config["vocab_size"] == 152064 and reloaded.num_layers == 2


def test_paper_without_a_gpu_needs_device_cpu(shrunk_dream, dare_data, tmp_path):
    from dare_bench.errors import DareBenchError
    from dare_bench.pipeline import reproduce

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")  # gpu-marked machines only; CPU CI always runs it
    with pytest.raises(DareBenchError, match="--device cpu"):
        reproduce("d1-dream-gsm8k", "paper", checkpoint=str(shrunk_dream), db=f"sqlite:///{tmp_path / 'r.db'}",
                  overrides=SHORT, progress=False, log=lambda m: None)
    assert not (tmp_path / "r.db").exists()


@pytest.mark.parametrize("make_bad,message", [
    ("nproc", "this machine has"),
    ("family", "a dream checkpoint, but"),
    ("vocab", "does not belong to this checkpoint"),
    ("checkpoint_at_tiny", "--checkpoint applies to --scale paper"),
    ("attention", "dare-bench\\[gpu\\]"),
    ("no_chat_template", "no chat template"),  # flash-attn is not installed: the error names the extra
])
def test_bad_paper_input_is_refused_without_a_run_row(make_bad, message, shrunk_dream, dare_data, tmp_path):
    import json
    import shutil

    from dare_bench.errors import DareBenchError
    from dare_bench.pipeline import reproduce

    name, scale, ckpt, kw = "d1-dream-gsm8k", "paper", shrunk_dream, {"device": "cpu"}
    if make_bad == "nproc":
        kw["nproc"] = (os.cpu_count() or 1) + 1
    elif make_bad == "family":
        name = "d1-llada-gsm8k"
    elif make_bad == "vocab":
        ckpt = tmp_path / "bad"
        shutil.copytree(shrunk_dream, ckpt)
        config = json.loads((ckpt / "config.json").read_text())
        config["vocab_size"] = 1000
        (ckpt / "config.json").write_text(json.dumps(config))
    elif make_bad == "no_chat_template":
        ckpt = tmp_path / "bad"
        shutil.copytree(shrunk_dream, ckpt)
        tok_cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
        del tok_cfg["chat_template"]
        (ckpt / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    elif make_bad == "checkpoint_at_tiny":  # gsm8k has no tiny scale: the same algorithm x backbone on sudoku
        name, scale = "d1-dream-sudoku", "tiny"
    overrides = SHORT if name == "d1-dream-gsm8k" and scale == "paper" else []
    if make_bad == "attention":
        overrides = [*overrides, "model.attention=flash_attn"]
    db_file = tmp_path / "runs.db"
    with pytest.raises(DareBenchError, match=message):
        reproduce(name, scale, checkpoint=str(ckpt), db=f"sqlite:///{db_file}", overrides=overrides, progress=False,
                  log=lambda m: None, **kw)
    assert not db_file.exists()


def test_nproc_dry_run_prints_the_torchrun_command(shrunk_dream, dare_data):
    from dare_bench.pipeline import reproduce

    plan = reproduce("d1-dream-gsm8k", "paper", checkpoint=str(shrunk_dream), device="cpu", nproc=2, dry_run=True,
                     overrides=SHORT).plan
    cmd = plan["command"]
    assert "torch.distributed.run --nproc_per_node 2" in cmd and "-m dare_bench.cli reproduce d1-dream-gsm8k" in cmd
    assert "--device cpu" in cmd and f"--checkpoint {shrunk_dream}" in cmd and "train.steps=2" in cmd


# --- torchrun: 1 process == 2 processes, kill + resume ----------------------------------------------------------
def _cli(args: list[str], home: Path, **popen) -> subprocess.Popen:
    env = dict(os.environ, DARE_BENCH_HOME=str(home), DARE_BENCH_DATA=str(DARE_DATA), OMP_NUM_THREADS="1",
               PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "dare_bench.cli", "reproduce", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            **popen)


def _finish(proc: subprocess.Popen, timeout: int = 900) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-4000:]
    return out


def _final_weights(home: Path) -> dict[str, torch.Tensor]:
    from dare_bench.models.io import read_state_dict

    (final,) = list((home / "runs").glob("*/final"))
    return read_state_dict(final)


FP32 = ["model.dtype=float32"]  # exact comparison: no bf16 compute


# (reproduction, shrunk source, overrides): d1 on a shrunk Dream (real tokenizer) and on a shrunk LLaDA (stand-in
# tokenizer at the real special ids), both on DARE's MATH + GSM8K data; SFT on a shrunk LLaDA (DARE sudoku data);
# EBPO on a shrunk SDAR (block diffusion). A random shrunk model earns no reward on these real tasks, so its RL
# updates are zero: the RL cases check the rank-aware pipeline (one writer, sharded evaluation, equal metrics), the
# SFT case also equal non-trivial updates; equal RL updates on a task with rewards: tests/trainers/test_fsdp_*.py.
TORCHRUN_CASES = {
    "d1-dream": ("d1-dream-gsm8k", "Dream-v0-Instruct-7B", SHORT),
    "d1-llada": ("d1-llada-gsm8k", "LLaDA-8B-Instruct",
                 [*SHORT, "train.max_prompt_length=4096", "train.rollout.block_length=8",
                  "eval.sampler.block_length=8"]),
    # the stand-in tokenizer spells text byte by byte (~4x the real token count): prompts get a longer limit
    "sft-llada": ("sft-llada-sudoku", "LLaDA-8B-Instruct",
                  ["train.steps=2", "train.batch_prompts=2", "train.max_prompt_length=4096", "eval.limit=4",
                   "eval.batch_size=4",
                   "eval.sampler.gen_length=8", "eval.sampler.steps=8", "eval.sampler.block_length=8"]),
    "ebpo-sdar": ("ebpo-sdar-gsm8k", "SDAR-4B-Chat",
                  [*SHORT, "train.rollout.block_length=4", "eval.sampler.block_length=4"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(TORCHRUN_CASES))
def test_two_processes_equal_one_on_a_shrunk_paper_run(case, tmp_path):
    from dare_bench.models.shrink import shrink_checkpoint

    name, source, overrides = TORCHRUN_CASES[case]
    ckpt = tmp_path / "ckpt"
    shrink_checkpoint(CHECKPOINTS / source, ckpt, layers=2, hidden=128, dtype="float32")
    args = [name, *overrides, *FP32, "--scale", "paper", "--device", "cpu", "--checkpoint", str(ckpt)]
    homes = {n: tmp_path / f"home{n}" for n in (1, 2)}
    for n, home in homes.items():
        _finish(_cli([*args, "--db", f"sqlite:///{home / 'runs.db'}", *(["--nproc", "2"] if n == 2 else [])], home))
    losses = {n: _rows(h / "runs.db", "select step, loss, reward_mean from step_metrics order by step")
              for n, h in homes.items()}
    assert _rows(homes[2] / "runs.db", "select count(*), min(status) from runs") == [(1, "finished")]
    assert len(losses[2]) == len(losses[1]) >= 2  # one row per logged step: only rank 0 writes
    for (s1, loss1, reward1), (s2, loss2, reward2) in zip(losses[1], losses[2], strict=True):
        assert s1 == s2 and loss2 == pytest.approx(loss1, rel=1e-5, abs=1e-8) and reward2 == reward1
    w1, w2 = _final_weights(homes[1]), _final_weights(homes[2])
    for key, t in w1.items():
        torch.testing.assert_close(w2[key], t, rtol=1e-5, atol=1e-5, msg=key)
    if name.startswith("sft-"):
        from dare_bench.models.io import read_state_dict

        start = read_state_dict(ckpt)
        assert any(not torch.equal(start[k], w1[k]) for k in w1)  # the comparison is of real updates
    assert _rows(homes[2] / "runs.db", "select count(*) from evaluations") == [(2,)]  # base + final, once


@pytest.mark.slow
def test_killed_two_process_run_resumes_to_the_uninterrupted_result(tmp_path):
    """SFT on a shrunk LLaDA, so every step moves the weights (a random model's RL rewards on real tasks are 0)."""
    from dare_bench.models.shrink import shrink_checkpoint

    name, source, overrides = TORCHRUN_CASES["sft-llada"]
    ckpt = tmp_path / "ckpt"
    shrink_checkpoint(CHECKPOINTS / source, ckpt, layers=2, hidden=128, dtype="float32")
    args = [name, *overrides, *FP32, "train.steps=3", "train.checkpoint_every=1", "--scale", "paper",
            "--device", "cpu", "--checkpoint", str(ckpt), "--nproc", "2"]
    full_home, cut_home = tmp_path / "full", tmp_path / "cut"
    _finish(_cli([*args, "--db", f"sqlite:///{full_home / 'runs.db'}"], full_home))
    db = f"sqlite:///{cut_home / 'runs.db'}"
    proc = _cli([*args, "--db", db], cut_home)
    deadline = time.time() + 600
    while not list(cut_home.glob("runs/*/checkpoints/step-000001/trainer_state.json")):
        assert proc.poll() is None and time.time() < deadline, "the run ended before its first checkpoint"
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher and both ranks
    proc.wait()
    _finish(_cli([*args, "--db", db, "--resume"], cut_home))
    import json

    def final_metrics(home):
        rows = _rows(home / "runs.db", "select e.metrics_json from evaluations e join runs r on e.run_id = r.id "
                                       "where r.status = 'finished' and e.checkpoint = 'final'")
        assert len(rows) == 1
        m = json.loads(rows[0][0])
        return {k: v for k, v in m.items() if not k.endswith("_seconds")}

    assert final_metrics(cut_home) == final_metrics(full_home)
    statuses = _rows(cut_home / "runs.db", "select status from runs order by id")
    assert statuses == [("failed",), ("finished",)]  # the killed row is marked failed by the resumed run
    w_full, w_cut = _final_weights(full_home), _final_weights(cut_home)
    for name, t in w_full.items():
        torch.testing.assert_close(w_cut[name], t, rtol=0, atol=0, msg=name)
