"""`dare-bench bench memory`: peak memory of one policy update as the number of Monte-Carlo samples grows.

Compares BGPO (`trainers/algorithms/bgpo.py`: one backward per MC sample, so memory should not grow with the number
of samples) with a naive ELBO objective that keeps every sample's graph until one backward over their mean
(−A·exp(B − B_old), B = mean_k e_k — what BGPO bounds). Same tiny LLaDA backbone, same stratified masks.
Each point (method × MC samples) runs in a fresh Python process, so allocator caches and earlier peaks never leak
into a measurement:
- CPU: peak resident-set growth during the update — the kernel's high-water mark (VmHWM) is reset through
  /proc/self/clear_refs right before the update and read after it (falls back to ru_maxrss growth elsewhere);
- GPU: torch.cuda.max_memory_allocated() − memory_allocated() before the update.
The no-grad old-policy pass (`prepare`) runs before the measurement window.

    dare-bench bench memory                     # CPU, d_model 384, sequence 256, 4 rows, MC 1,2,4,8,16
    dare-bench bench memory --json --mc-samples 1,2,4 --d-model 64 --seq-len 64 --rows 2
    dare-bench bench memory --device cuda       # one GPU (torchrun is not needed: one process per point)
    dare-bench bench memory --plan LLaDA-8B-Instruct --layers 2 --d-model 256 --rows 2 --seq-len 256 --threads 1
                                                # the memory plan (trainers/memory_plan.py) vs a measured step

Output: a table and the ratios BGPO(max)/BGPO(min) (goal ≤ 1.10) and naive(max)/BGPO(max) (goal ≥ 4);
`--json` prints `{"points": [{"method", "mc_samples", "peak_bytes"}, ...], "ratios": {...}, "settings": {...}}`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Optional

import typer

METHODS = ("bgpo", "naive")
GOAL_FLAT = 1.10
GOAL_GAP = 4.0


# --- one point (runs in a child process) --------------------------------------------------------------------------

def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return _status_kib("VmHWM") is not None
    except OSError:
        return False


def measure_point(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the backbone and batch of `spec`, run one update of `spec['method']`, return its peak memory growth."""
    import resource

    import torch

    from dare_bench.models.io import build_model
    from dare_bench.models.llada import adapt_vocab
    from dare_bench.models.presets import preset_config
    from dare_bench.trainers.algorithms import RolloutBatch, get_algorithm

    torch.set_num_threads(int(spec.get("threads", 2)))
    device = torch.device(spec["device"])
    d, heads = spec["d_model"], spec["heads"]
    vocab = spec["vocab"]
    cfg = preset_config("tiny-llada", d_model=d, n_layers=spec["layers"], n_heads=heads, n_kv_heads=heads,
                        mlp_hidden_size=4 * d, max_sequence_length=max(4096, spec["seq_len"]))
    cfg = adapt_vocab(cfg, vocab_size=vocab, mask_token_id=vocab - 1, eos_token_id=vocab - 2, pad_token_id=vocab - 3)
    model = build_model(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model.init_weights()
    model.to(device)
    g = torch.Generator().manual_seed(0)
    n, L = spec["rows"], spec["seq_len"]
    P = max(1, L // 8)
    prompt = torch.randint(0, vocab - 3, (n, P), generator=g)
    comp = torch.randint(0, vocab - 3, (n, L - P), generator=g)
    batch = RolloutBatch(prompt.to(device), torch.ones_like(prompt).to(device), comp.to(device),
                         torch.ones_like(comp).to(device), torch.linspace(0, 1, n).to(device), group_size=n)
    k = spec["mc_samples"]
    algo = get_algorithm("bgpo")({"mc_samples": k}, model.traits)
    adv = algo.advantages(batch.rewards, batch.group_size)
    state = algo.prepare(batch, model, None, generator=torch.Generator().manual_seed(1), num_iterations=1)
    # Outside the window: gradient buffers (both methods need them alike) and one warm-up forward + backward of
    # one copy, so one-time allocations (kernel workspaces, autograd threads) are not charged to the first point.
    algo.copy_elbo(model, batch, state.rows, 0).sum().backward()
    for prm in model.parameters():
        prm.grad.zero_()

    def naive_update():
        terms = [algo.copy_elbo(model, batch, state.rows, c) for c in range(k)]  # every graph kept alive
        B = torch.stack(terms, dim=1).mean(dim=1)
        cm = batch.completion_mask.to(B.dtype)
        loss = (-(adv[:, None] * torch.exp(B - B.detach())[:, None]) * cm).sum() / cm.sum()
        loss.backward()

    def bgpo_update():
        algo.backward(model, batch, state, adv, loss_scale=1.0, iteration=0)

    run = bgpo_update if spec["method"] == "bgpo" else naive_update
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        run()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        how = "cuda max_memory_allocated"
    elif _reset_peak():
        base_kib = _status_kib("VmHWM")
        run()
        peak = (_status_kib("VmHWM") - base_kib) * 1024
        how = "VmHWM growth (clear_refs reset)"
    else:  # pragma: no cover - non-Linux fallback
        base_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        run()
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_kib) * 1024
        how = "ru_maxrss growth"
    return {"method": spec["method"], "mc_samples": k, "peak_bytes": int(peak), "measure": how}


# --- the memory plan against a measured training step (`--plan`; runs in a child process) ----------------------

def measure_training_step(spec: dict[str, Any]) -> dict[str, Any]:
    """One steady-state SFT step of a shrunk real checkpoint (fp32, replicated, one process): `micro_batches`
    forward + backward passes of the masked-diffusion loss (trainers.sft.sft_loss) and an AdamW step. A first
    step runs before the window, so AdamW's states exist (as in every later step) and one-time allocations are not
    charged; the peak is the VmHWM growth over the resident set after it (weights and optimizer states included
    in the baseline, gradients set to None by zero_grad as the trainers do)."""
    import torch

    from dare_bench.models.families import detect_family
    from dare_bench.models.io import build_model
    from dare_bench.models.real_configs import real_config
    from dare_bench.models.shrink import shrunk_config
    from dare_bench.trainers.sft import sft_loss

    torch.set_num_threads(int(spec.get("threads", 1)))
    config = real_config(spec["checkpoint"])[1]
    family = detect_family(config, spec["checkpoint"]).name
    small = shrunk_config(config, family, layers=spec["layers"], hidden=spec["hidden"])
    torch.manual_seed(0)
    model = build_model(small, dtype=torch.float32)
    model.init_weights()
    model.train()
    if spec["gradient_checkpointing"]:
        model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    rows, seq = spec["rows"], spec["seq_len"]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1000, (rows, seq), generator=g)
    prompt = torch.full((rows,), seq // 4)
    answer = seq - prompt

    def step():
        for _ in range(spec["micro_batches"]):
            (sft_loss(model, ids, prompt, answer, g) / spec["micro_batches"]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    if not _reset_peak():  # pragma: no cover - needs Linux /proc
        raise RuntimeError("measuring the peak needs /proc/self/clear_refs (Linux)")
    base = _status_kib("VmHWM")
    step()
    return {"peak_bytes": (_status_kib("VmHWM") - base) * 1024, "parameters": model.num_parameters(),
            "measure": "VmHWM growth over the steady state (clear_refs reset)"}


def compare_plan(checkpoint: str = "LLaDA-8B-Instruct", *, layers: int = 2, hidden: int = 256, rows: int = 2,
                 seq_len: int = 256, micro_batches: int = 2, threads: int = 1,
                 timeout: float = 600) -> dict[str, Any]:
    """The memory plan's prediction vs a measured step, with and without gradient checkpointing. The measured part
    is what the step allocates beyond weights and optimizer states (exact counts in both): gradients,
    activations, logits, compute copies and AdamW's temporaries."""
    from dare_bench.models.families import detect_family
    from dare_bench.models.io import build_model
    from dare_bench.models.real_configs import real_config
    from dare_bench.models.shrink import shrunk_config
    from dare_bench.trainers.memory_plan import estimate_training_memory

    config = real_config(checkpoint)[1]
    small = shrunk_config(config, detect_family(config, checkpoint).name, layers=layers, hidden=hidden)
    meta = build_model(small, device="meta")
    points = []
    for ckpt in (False, True):
        spec = {"kind": "plan", "checkpoint": checkpoint, "layers": layers, "hidden": hidden, "rows": rows,
                "seq_len": seq_len, "micro_batches": micro_batches, "gradient_checkpointing": ckpt,
                "threads": threads}
        measured = _run_child(spec, timeout)
        est = estimate_training_memory(meta, world_size=1, strategy="replicated", rows=rows, seq_len=seq_len,
                                       gradient_checkpointing=ckpt, compute_dtype="float32", device="cpu")
        predicted = est["per_rank_total"] - est["master_weights"] - est["optimizer"] - est["reference_model"]
        points.append({"gradient_checkpointing": ckpt, "predicted_bytes": predicted,
                       "measured_bytes": measured["peak_bytes"], "ratio": predicted / max(measured["peak_bytes"], 1),
                       "terms": est})
    return {"checkpoint": checkpoint, "settings": {"layers": layers, "hidden": hidden, "rows": rows,
                                                   "seq_len": seq_len, "micro_batches": micro_batches,
                                                   "dtype": "float32", "strategy": "replicated"},
            "parameters": meta.num_parameters(), "points": points, "measure": measured["measure"]}


# --- driver -------------------------------------------------------------------------------------------------------

def _run_point(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    return _run_child(spec, timeout)


def _run_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = dict(os.environ)
    threads = str(spec.get("threads", 2))
    # a fixed mmap threshold makes glibc return freed tensors to the OS, so the resident set follows live memory
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, MALLOC_MMAP_THRESHOLD_="65536")
    proc = subprocess.run([sys.executable, "-m", "dare_bench.bench.memory", json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"memory point {spec} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_benchmark(mc_samples: list[int], *, d_model: int, layers: int, heads: int, seq_len: int, rows: int,
                  vocab: int, device: str, threads: int = 2, timeout: float = 1800) -> dict[str, Any]:
    settings = {"d_model": d_model, "layers": layers, "heads": heads, "seq_len": seq_len, "rows": rows,
                "vocab": vocab, "device": device, "threads": threads}
    points = []
    for method in METHODS:
        for k in mc_samples:
            points.append(_run_point({**settings, "method": method, "mc_samples": k}, timeout))
    by = {(p["method"], p["mc_samples"]): p["peak_bytes"] for p in points}
    lo, hi = min(mc_samples), max(mc_samples)
    ratios = {
        f"bgpo({hi})/bgpo({lo})": by[("bgpo", hi)] / max(by[("bgpo", lo)], 1),
        f"naive({hi})/bgpo({hi})": by[("naive", hi)] / max(by[("bgpo", hi)], 1),
    }
    return {"points": [{k: p[k] for k in ("method", "mc_samples", "peak_bytes")} for p in points],
            "ratios": ratios, "goals": {f"bgpo({hi})/bgpo({lo})": f"<= {GOAL_FLAT}",
                                        f"naive({hi})/bgpo({hi})": f">= {GOAL_GAP}"},
            "settings": settings, "measure": points[0]["measure"] if points else None}


def register(group: typer.Typer) -> None:
    @group.command("memory")
    def memory(
        mc_samples: str = typer.Option("1,2,4,8,16", "--mc-samples", help="comma-separated MC sample counts"),
        d_model: int = typer.Option(384, "--d-model"),
        layers: int = typer.Option(2, "--layers"),
        heads: int = typer.Option(4, "--heads"),
        seq_len: int = typer.Option(256, "--seq-len", help="prompt + completion tokens per row"),
        rows: int = typer.Option(4, "--rows", help="completions in the micro-batch"),
        vocab: int = typer.Option(2048, "--vocab"),
        device: str = typer.Option("auto", "--device", help="auto | cpu | cuda"),
        threads: int = typer.Option(2, "--threads", help="CPU threads per measuring process"),
        as_json: bool = typer.Option(False, "--json", help="print the JSON result only"),
        plan: Optional[str] = typer.Option(
            None, "--plan", help="instead: the memory plan (trainers/memory_plan.py) vs a measured SFT step of this "
                                 "shipped real checkpoint shrunk to --layers / --d-model (e.g. LLaDA-8B-Instruct); "
                                 "uses --rows, --seq-len, --threads"),
    ) -> None:
        """Peak memory of one BGPO update vs a naive all-graphs ELBO objective as MC samples grow (or, with --plan,
        the memory plan's estimate vs a measured training step)."""
        from dare_bench.errors import ConfigError

        if plan is not None:
            if device not in ("auto", "cpu"):
                raise ConfigError("--plan measures on CPU (the resident set); drop --device")
            res = compare_plan(plan, layers=layers, hidden=d_model, rows=rows, seq_len=seq_len, threads=threads)
            if as_json:
                typer.echo(json.dumps(res))
                return
            typer.echo(f"memory plan vs measured ({res['measure']}), {res['checkpoint']} shrunk, {res['settings']}")
            typer.echo(f"{'grad ckpt':<11}{'estimate MiB':>14}{'measured MiB':>14}{'ratio':>8}")
            for p in res["points"]:
                typer.echo(f"{str(p['gradient_checkpointing']):<11}{p['predicted_bytes'] / 2**20:>14.1f}"
                           f"{p['measured_bytes'] / 2**20:>14.1f}{p['ratio']:>8.3f}")
            return

        try:
            ks = sorted({int(x) for x in mc_samples.split(",") if x.strip()})
        except ValueError:
            raise ConfigError(f"--mc-samples must be comma-separated integers, got {mc_samples!r}") from None
        if not ks or ks[0] < 1:
            raise ConfigError(f"--mc-samples needs positive integers, got {mc_samples!r}")
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device not in ("cpu", "cuda"):
            raise ConfigError(f"--device must be auto, cpu or cuda, got {device!r}")
        if d_model % heads:
            raise ConfigError(f"--d-model {d_model} is not a multiple of --heads {heads}")
        if seq_len < 2 or rows < 1 or vocab < 8:
            raise ConfigError("need --seq-len >= 2, --rows >= 1, --vocab >= 8")
        result = run_benchmark(ks, d_model=d_model, layers=layers, heads=heads, seq_len=seq_len, rows=rows,
                               vocab=vocab, device=device, threads=threads)
        if as_json:
            typer.echo(json.dumps(result))
            return
        typer.echo(f"peak memory of one update ({result['measure']}), settings {result['settings']}")
        typer.echo(f"{'method':<8}{'MC':>5}{'peak MiB':>12}")
        for p in result["points"]:
            typer.echo(f"{p['method']:<8}{p['mc_samples']:>5}{p['peak_bytes'] / 2**20:>12.1f}")
        for name, value in result["ratios"].items():
            typer.echo(f"{name} = {value:.3f}   (goal {result['goals'][name]})")


if __name__ == "__main__":  # a child process measuring one point: argv[1] is the JSON spec
    _spec = json.loads(sys.argv[1])
    typer.echo(json.dumps(measure_training_step(_spec) if _spec.get("kind") == "plan" else measure_point(_spec)))
