"""FSDP2 with bf16 compute and activation checkpointing (trainers/distributed.py `shard_model`): each decoder layer
receives its inputs in the dtypes the model passes (hidden states in bf16 from the root's embedding, the rotary
cos / sin in float32), in the forward and in the backward's recompute, and the step runs. With FSDP2's default
input cast the layers saw bf16 cos / sin in the forward and float32 in the recompute (FSDP2 skips its pre-forward
hook there), which torch.utils.checkpoint refused on an H200 (scripts/gpu_check.py's FSDP2 step)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

RUNNER = r"""
import json, sys, torch
sys.path.insert(0, {here!r})
torch.set_num_threads(1)
from rl_fakes import micro_llada
from dare_bench.trainers.distributed import (decoder_layers, exit_worker, init_distributed, leave_distributed,
                                             shard_model)
info = init_distributed(device="cpu")
model = micro_llada(0, n_layers=2).train()
model.gradient_checkpointing_enable()
seen = []

def record(module, args):
    seen.append([str(a.dtype) for a in args[:3]])

model = shard_model(model, info, compute_dtype="bfloat16")
for layer in decoder_layers(model):
    layer.register_forward_pre_hook(record)
ids = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(info.rank))
model(ids).float().logsumexp(-1).mean().backward()
grads = [p.grad is not None for p in model.parameters()]
if info.rank == 0:
    json.dump({{"seen": seen, "all_grads": all(grads)}}, open(sys.argv[1], "w"))
leave_distributed(info)
exit_worker(0)
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_layers_keep_input_dtypes_in_forward_and_recompute(tmp_path):
    script = tmp_path / "runner.py"
    script.write_text(RUNNER.format(here=str(HERE)))
    out = tmp_path / "seen.json"
    cmd = [str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_port()), str(script), str(out)]
    proc = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    # two layers, each called in the forward and again in the backward's recompute
    assert len(result["seen"]) == 4
    assert all(s == ["torch.bfloat16", "torch.float32", "torch.float32"] for s in result["seen"]), result["seen"]
    assert result["all_grads"]
