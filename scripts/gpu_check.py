"""GPU check for issue #17 (paper scale): attention backends, one FSDP2 step vs the memory plan, rollout speed.

Not part of CI. Nothing is downloaded: every model is a shrunk checkpoint of a shipped real config
(dare_bench/models/checkpoint_configs/) with random weights. On one CUDA GPU, in about 5 minutes:

    python scripts/gpu_check.py --out "$OUT/gpu_check.json"          # CUDA: all three checks
    python scripts/gpu_check.py --device cpu --out /tmp/gpu_check.json  # CPU smoke (what tests/scripts test runs)

(a) `attention`: logits of a shrunk LLaDA-8B-Instruct (bf16, 2 layers, hidden 256, padded batch) under flex and
    flash_attn (when importable) vs sdpa: max abs diff, pass when <= 2e-2 x max|sdpa logits| (the tolerance of
    tests/models/test_mdlm_backbones.py's GPU tests). On CPU: flex in float32 at 1e-4.
(b) `fsdp2_step`: `torchrun --nproc_per_node 1` (nccl; gloo on CPU) runs this file with --fsdp-worker: LLaDA-8B
    width (hidden 4096, 32 heads, 2 layers, real vocabulary), `fully_shard` per decoder block + root with
    MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32), fp32 masters, AdamW; a steady-state step
    (2 micro-batches of masked-diffusion SFT loss, gradient checkpointing on) measured with
    torch.cuda.max_memory_allocated vs trainers/memory_plan.py's per_rank_total (ratio reported, no pass/fail: the
    plan's FSDP2 terms are modeled, not yet calibrated on a GPU). CPU smoke: hidden 256, peak not measured.
(c) `rollout`: tokens/s of the pinned sampler preset dare-llada-math (evaluators/presets.py) on the shrunk 8B-width
    model, 4 prompts of 64 tokens (stand-in ids), after one warm-up call.
(d) `roofline` (runs first; issue #15 item 7): the machine's ceilings measured in the same run, a device-to-device
    copy (bytes read + written per second, 2 GiB) and the bf16 GEMM peak (bench/roofline.py, up to 8192^3). The
    rollout then reports its weight-read bytes/s (forwards x the model's weight bytes: a lower bound, since KV and
    activations are left out) as a fraction of the copy bandwidth, and its weight-matmul FLOP/s (models/flops.py, a
    lower bound) as a fraction of the GEMM peak; the FSDP2 step reports 3 x its weight-matmul FLOPs per second
    against the same peak.

The JSON summary goes to --out (default $OUT/gpu_check.json when $OUT is set, else ./gpu_check.json); the exit code
is 1 when a pass/fail check failed, 0 otherwise; a check that crashed records its error and the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without an install


def _shrunk(checkpoint: str, layers: int, hidden: int, device: str, dtype):
    import torch

    from dare_bench.models.families import detect_family
    from dare_bench.models.io import build_model
    from dare_bench.models.real_configs import real_config
    from dare_bench.models.shrink import shrunk_config

    config = real_config(checkpoint)[1]
    small = shrunk_config(config, detect_family(config, checkpoint).name, layers=layers, hidden=hidden)
    torch.manual_seed(0)
    model = build_model(small, device="cpu", dtype=torch.float32)
    model.init_weights()
    return model.to(device=device, dtype=dtype)


def check_attention(device: str) -> dict:
    import importlib.util

    import torch

    from dare_bench.models import set_attention

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = _shrunk("LLaDA-8B-Instruct", 2, 256, device, dtype).eval()
    ids = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(1)).to(device)
    pad = torch.ones_like(ids)
    pad[1, :9] = 0
    backends = ["flex"] + (["flash_attn"] if device == "cuda" and importlib.util.find_spec("flash_attn") else [])
    out = {"dtype": str(dtype), "skipped": [] if "flash_attn" in backends else ["flash_attn (not importable or CPU)"]}
    with torch.no_grad():
        ref = set_attention(model, "sdpa")(ids, attention_mask=pad).float()
        for b in backends:
            got = set_attention(model, b)(ids, attention_mask=pad).float()
            diff = float((got - ref).abs().max())
            tol = 2e-2 * float(ref.abs().max()) if device == "cuda" else 1e-4
            out[b] = {"max_abs_diff": diff, "tolerance": tol, "pass": diff <= tol}
    return out


def check_roofline(device: str) -> dict:
    import torch

    from dare_bench.bench.roofline import matmul_peak

    out = {"matmul_peak": matmul_peak("bfloat16", device, size=8192 if device == "cuda" else 1024)}
    n = (1 << 30) if device == "cuda" else (1 << 24)  # bf16 elements: 2 GiB on the GPU (several times its L2)
    src = torch.empty(n, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(6):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src)
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    out["copy_bytes_per_second"] = 2.0 * n * src.element_size() / best  # read + write
    out["copy_gib"] = n * src.element_size() / 2 ** 30
    return out


def fsdp_worker(args) -> None:
    """Runs under torchrun: one FSDP2 steady-state step; rank 0 writes the JSON result to args.worker_out."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from dare_bench.trainers.memory_plan import estimate_training_memory
    from dare_bench.trainers.sft import sft_loss

    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    hidden = 4096 if cuda else 256
    rows, seq = (2, 512) if cuda else (1, 64)
    model = _shrunk("LLaDA-8B-Instruct", 2, hidden, str(device), torch.float32)
    meta_params = model.num_parameters()
    model.train()
    model.gradient_checkpointing_enable()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    # the layers keep their inputs' dtypes, as trainers/distributed.py shard_model does (why: there)
    layer_mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)
    for block in model.model.transformer["blocks"]:
        fully_shard(block, mp_policy=layer_mp)
    fully_shard(model, mp_policy=mp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, 1000, (rows, seq), generator=g)
    prompt = torch.full((rows,), seq // 4)

    def step():
        for _ in range(2):
            (sft_loss(model, ids, prompt, seq - prompt, g) / 2).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # AdamW states exist from here on, as in every later step
    result = {"world_size": world, "hidden": hidden, "rows": rows, "seq_len": seq, "parameters": meta_params}
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        result["step_s"] = time.perf_counter() - t
        result["measured_peak_bytes"] = torch.cuda.max_memory_allocated()
        from dare_bench.models.flops import matmul_flops_per_token

        # 2 micro-batches, forward + backward (3x), plus the checkpointed forward's recompute (4x in all)
        flops = 4 * matmul_flops_per_token(model) * rows * seq * 2
        result["weight_matmul_flops"] = flops
        result["flops_per_second"] = flops / result["step_s"]
    else:
        step()
    from dare_bench.models.io import build_model

    est = estimate_training_memory(build_model(model.config, device="meta"), world_size=world, strategy="fsdp2",
                                   rows=rows, seq_len=seq, gradient_checkpointing=True, compute_dtype="bfloat16",
                                   device=args.device)
    result["plan"] = est
    if "measured_peak_bytes" in result:
        result["ratio_plan_over_measured"] = est["per_rank_total"] / result["measured_peak_bytes"]
    if rank == 0:
        Path(args.worker_out).write_text(json.dumps(result))
    dist.destroy_process_group()


def check_fsdp2(device: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        res_file = Path(tmp) / "fsdp.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", __file__,
               "--fsdp-worker", "--device", device, "--worker-out", str(res_file)]
        env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode != 0 or not res_file.exists():
            raise RuntimeError(f"torchrun exited {proc.returncode}: {proc.stderr[-3000:]}")
        return json.loads(res_file.read_text())


def check_rollout(device: str) -> dict:
    import torch

    from dare_bench.diffusion.sampling import generate
    from dare_bench.evaluators.presets import get_preset, sampler_kind

    cuda = device == "cuda"
    model = _shrunk("LLaDA-8B-Instruct", 2, 4096 if cuda else 256, device,
                    torch.bfloat16 if cuda else torch.float32).eval()
    preset = get_preset("dare-llada-math")
    settings = preset.settings_for(sampler_kind(model.traits))
    if not cuda:  # smoke: same sampler, a few steps
        settings.update(gen_length=16, steps=4, block_length=16)
    prompts = torch.randint(0, 1000, (4, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        generate(model, prompts, **{**settings, "gen_length": settings["gen_length"]})  # warm-up
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = generate(model, prompts, **settings)
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t
    tokens = prompts.shape[0] * settings["gen_length"]
    from dare_bench.models.flops import matmul_flops_per_token

    stats = out.stats
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    extra = {"weight_bytes": weight_bytes, "token_forwards": getattr(stats, "token_forwards", None),
             "weight_read_bytes_per_second": stats.forwards * weight_bytes / dt,
             "weight_matmul_flops_per_second": matmul_flops_per_token(model) * stats.token_forwards / dt}
    return {**extra, "preset": preset.name,
            "settings": {k: v for k, v in settings.items() if isinstance(v, (int, float, str))},
            "rows": prompts.shape[0], "generated_tokens": tokens, "seconds": dt, "tokens_per_s": tokens / dt,
            "forwards": getattr(out.stats, "forwards", None)}


def _fractions(checks: dict) -> None:
    """Each measured rate as a fraction of the ceiling `roofline` measured in the same run (issue #15 item 7)."""
    roof = checks.get("roofline", {})
    peak = roof.get("matmul_peak", {}).get("flops_per_second")
    bandwidth = roof.get("copy_bytes_per_second")
    rollout, step = checks.get("rollout", {}), checks.get("fsdp2_step", {})
    if bandwidth and "weight_read_bytes_per_second" in rollout:
        rollout["fraction_of_copy_bandwidth"] = rollout["weight_read_bytes_per_second"] / bandwidth
    if peak and "weight_matmul_flops_per_second" in rollout:
        rollout["fraction_of_matmul_peak"] = rollout["weight_matmul_flops_per_second"] / peak
    if peak and "flops_per_second" in step:
        step["fraction_of_matmul_peak"] = step["flops_per_second"] / peak


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    ap.add_argument("--out", default=None, help="JSON summary path (default $OUT/gpu_check.json or ./gpu_check.json)")
    ap.add_argument("--only", default="roofline,attention,fsdp2_step,rollout", help="comma-separated checks to run")
    ap.add_argument("--fsdp-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    import torch

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA GPU is visible", file=sys.stderr)
        return 2
    if args.fsdp_worker:
        fsdp_worker(args)
        return 0
    out = Path(args.out or Path(os.environ.get("OUT", ".")) / "gpu_check.json")
    summary = {"device": args.device, "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None, "checks": {}}
    checks = {"roofline": lambda: check_roofline(args.device),
              "attention": lambda: check_attention(args.device),
              "fsdp2_step": lambda: check_fsdp2(args.device, timeout=300),
              "rollout": lambda: check_rollout(args.device)}
    failed = False
    for name in [c.strip() for c in args.only.split(",") if c.strip()]:
        if name not in checks:
            print(f"error: unknown check {name!r}; use {', '.join(checks)}", file=sys.stderr)
            return 2
        t = time.perf_counter()
        try:
            summary["checks"][name] = checks[name]()
        except Exception as exc:  # record and go on: one crashed check must not hide the others' numbers
            summary["checks"][name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            failed = True
        summary["checks"][name]["wall_s"] = round(time.perf_counter() - t, 2)
        verdicts = [v["pass"] for v in summary["checks"][name].values() if isinstance(v, dict) and "pass" in v]
        failed |= not all(verdicts)
        print(f"{name}: {json.dumps(summary['checks'][name], default=str)[:600]}", flush=True)
    _fractions(summary["checks"])
    summary["ok"] = not failed
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2, default=str))
    print(f"wrote {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
