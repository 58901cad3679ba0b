"""SFT and VRPO under torchrun (gloo, 2 CPU processes) equal one process on the same global batch: the same losses
and the same updated weights (fp32, rtol 1e-5), one checkpoint writer, one RNG record per rank. The ranks hold
FSDP2 shards of the model (and of the VRPO reference)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dare_bench.trainers.checkpoint import latest_checkpoint, list_checkpoints

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# One script for both sides: under torchrun it trains data-parallel; run in-process (`run(kind, ckpt)`) it is the
# single-process reference.
RUNNER = r"""
import sys, torch
sys.path.insert(0, {here!r})
torch.set_num_threads(1)
from rl_fakes import EOS, micro_llada
from dare_bench.trainers.preference import PreferenceConfig, PreferencePair, PreferenceRunOptions, train_preference
from dare_bench.trainers.sft import SFTConfig, SFTExample, SFTRunOptions, train_sft


def run(kind, ckpt):
    g = torch.Generator().manual_seed(1)
    model = micro_llada(0)
    rows = []  # rows of each policy forward: a rank computes only its share of the global batch
    model.register_forward_pre_hook(lambda m, args: rows.append(int(args[0].shape[0])))
    recipe = dict(lr=3e-3, betas=(0.8, 0.95), weight_decay=0.1, lr_schedule="cosine", warmup_steps=1,
                  grad_clip=0.5, steps=3)
    if kind == "sft":
        ex = []
        for i in range(12):
            p = torch.randint(0, 10, (2 + i % 3,), generator=g).tolist()
            ex.append(SFTExample(p, p[::-1] + [EOS] * (1 + i % 2)))
        res = train_sft(model, ex, SFTConfig(batch_size=4, seed=3, order="epochs", **recipe),
                        SFTRunOptions(checkpoint_dir=ckpt, checkpoint_every=2))
    else:
        pr = []
        for i in range(8):
            p = torch.randint(0, 10, (2 + i % 2,), generator=g).tolist()
            pr.append(PreferencePair(p, p[::-1] + [EOS], torch.randint(0, 10, (1 + i % 3,), generator=g).tolist()
                                     + [EOS]))
        res = train_preference(model, pr, PreferenceConfig(batch_pairs=4, mc_samples=2, seed=4, **recipe),
                               PreferenceRunOptions(checkpoint_dir=ckpt, checkpoint_every=2))
    from dare_bench.trainers.distributed import full_state_dict

    return res.losses, full_state_dict(model), rows  # under torchrun: FSDP2 shards, gathered on rank 0


if __name__ == "__main__":
    from dare_bench.trainers.distributed import exit_worker, init_distributed, leave_distributed

    info = init_distributed()
    losses, state, rows = run(sys.argv[1], sys.argv[2])
    torch.save({{"losses": losses, "state": state, "rows": rows}}, sys.argv[3] + f".{{info.rank}}")
    leave_distributed(info)
    exit_worker(0)
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sft", "vrpo"])
def test_two_ranks_equal_one_process(tmp_path, kind):
    script = tmp_path / "runner.py"
    script.write_text(RUNNER.format(here=str(HERE)))
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.pt"
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
                           str(_port()), str(script), kind, str(ckpt), str(out)],
                          env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (torch.load(f"{out}.{r}", weights_only=False) for r in (0, 1))

    namespace: dict = {}
    exec(compile(script.read_text(), str(script), "exec"), namespace)  # the single-process reference, in-process
    threads = torch.get_num_threads()
    try:
        losses, state, rows = namespace["run"](kind, tmp_path / "ckpt-single")
    finally:
        torch.set_num_threads(threads)

    assert r0["rows"] == r1["rows"] == [n // 2 for n in rows] and rows  # each rank: half the global batch
    assert r0["losses"] == r1["losses"]  # metrics all-reduced: every rank reports the global mean
    torch.testing.assert_close(torch.tensor(r0["losses"]), torch.tensor(losses), rtol=1e-5, atol=0)
    assert r1["state"] == {}  # the full weights are gathered to rank 0 only
    for k in state:
        torch.testing.assert_close(r0["state"][k], state[k], rtol=1e-5, atol=1e-7, msg=k)
    assert any(not torch.equal(state[k], v) for k, v in __import__("rl_fakes").micro_llada(0).state_dict().items())
    assert [s for s, _ in list_checkpoints(ckpt)] == [2, 3]  # rank 0 wrote each once
    rng = torch.load(latest_checkpoint(ckpt) / "rng.pt", weights_only=False)
    assert isinstance(rng, list) and len(rng) == 2  # every rank's RNG, gathered to rank 0
