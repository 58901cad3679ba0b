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
    dare-bench bench memory --head --threads 1  # the loss head at vocab 126464, 2048 tokens, width 256, chunk 64:
                                                # materialised logits vs models/lm_head.py (goal: >= 20x lower peak)
    dare-bench bench memory --head --device cuda --d-model 4096 --tokens 16384 --chunk 256 --dtype bfloat16

Output: a table and the ratios BGPO(max)/BGPO(min) (goal ≤ 1.10) and naive(max)/BGPO(max) (goal ≥ 4);
`--json` prints `{"points": [{"method", "mc_samples", "peak_bytes"}, ...], "ratios": {...}, "settings": {...}}`.
`--head`: the peak of one forward + backward of each loss head in its own process (inputs, head weight and
gradient buffers allocated before the window), full/chunked of the peak and of the working memory (the peak less the
gradients both heads return, weight [V, d] + hidden [N, d]: goal >= 20), and the chunked path's max relative error
of the log-probs and of the gradients wrt hidden states and weight, measured in the same run.
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
GOAL_HEAD = 20.0  # materialised / chunked peak memory of the loss head (issue #15 item 2)


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


# --- the LM head: materialised logits vs the chunked head (`--head`; runs in child processes) -------------------

def _head_inputs(spec: dict[str, Any]):
    """hidden `[N, d]` and the head weight `[V, d]` (leaf tensors with gradients), targets `[N]`, seeded."""
    import torch

    from dare_bench.models.lm_head import OutputHead

    dtype = getattr(torch, spec["dtype"])
    g = torch.Generator().manual_seed(0)
    n, d, v = spec["tokens"], spec["d_model"], spec["vocab"]
    hidden = torch.randn(n, d, generator=g).to(spec["device"], dtype).requires_grad_()
    weight = (torch.randn(v, d, generator=g) * d ** -0.5).to(spec["device"], dtype).requires_grad_()
    targets = torch.randint(v, (n,), generator=g).to(spec["device"])
    return hidden, OutputHead(weight), targets


def _head_logprobs(path: str, hidden, head, targets, chunk: int):
    """Per-token log p(target) `[N]` float32 the estimators' way: materialised logits + `likelihood.token_logprobs`
    (path "full") or `lm_head.chunked_token_logprobs` (path "chunked")."""
    from dare_bench.diffusion.likelihood import token_logprobs
    from dare_bench.models.lm_head import chunked_token_logprobs

    if path == "full":
        return token_logprobs(head.logits(hidden), targets)
    return chunked_token_logprobs(hidden, head, targets, chunk_tokens=chunk)


def measure_head(spec: dict[str, Any]) -> dict[str, Any]:
    """Peak memory growth of one forward + backward of the loss head (`spec['path']`) from the hidden states of
    `spec['tokens']` tokens. Outside the window: the inputs, the head weight and both gradient buffers (allocated by
    a warm-up on 8 tokens, then zeroed in place), so the window holds what the loss head itself allocates."""
    import torch

    torch.set_num_threads(int(spec.get("threads", 1)))
    hidden, head, targets = _head_inputs(spec)
    _head_logprobs(spec["path"], hidden[:8], head, targets[:8], spec["chunk"]).sum().backward()
    hidden.grad.zero_()
    head.weight.grad.zero_()

    def run():
        _head_logprobs(spec["path"], hidden, head, targets, spec["chunk"]).sum().backward()

    if spec["device"].startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run()
        torch.cuda.synchronize()
        return {"path": spec["path"], "peak_bytes": int(torch.cuda.max_memory_allocated() - base),
                "measure": "cuda max_memory_allocated"}
    if not _reset_peak():  # pragma: no cover - needs Linux /proc
        raise RuntimeError("measuring the peak needs /proc/self/clear_refs (Linux)")
    base_kib = _status_kib("VmHWM")
    run()
    return {"path": spec["path"], "peak_bytes": (_status_kib("VmHWM") - base_kib) * 1024,
            "measure": "VmHWM growth (clear_refs reset)"}


def head_errors(spec: dict[str, Any]) -> dict[str, Any]:
    """Both paths on the same inputs in one process: max |chunked - full| / max |full| of the log-probs and of the
    gradients wrt the hidden states and the head weight."""
    import torch

    torch.set_num_threads(int(spec.get("threads", 1)))
    hidden, head, targets = _head_inputs(spec)
    upstream = torch.randn(targets.shape[0], generator=torch.Generator().manual_seed(1)).to(hidden.device)
    out = {}
    for path in ("full", "chunked"):
        lp = _head_logprobs(path, hidden, head, targets, spec["chunk"])
        gh, gw = torch.autograd.grad((lp * upstream).sum(), [hidden, head.weight])
        out[path] = (lp.detach(), gh, gw)
        del lp, gh, gw

    def rel(i):
        a, b = out["chunked"][i].double(), out["full"][i].double()
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))

    return {"logprob_max_rel_err": rel(0), "grad_hidden_max_rel_err": rel(1), "grad_weight_max_rel_err": rel(2)}


def compare_head(*, vocab: int = 126464, tokens: int = 2048, d_model: int = 256, chunk: int = 64,
                 dtype: str = "float32", device: str = "cpu", threads: int = 1,
                 timeout: float = 900) -> dict[str, Any]:
    """Peak memory of the loss head, materialised logits vs chunked (each in a fresh process), their ratio, and the
    chunked path's value / gradient errors against the materialised one (a third process)."""
    settings = {"vocab": vocab, "tokens": tokens, "d_model": d_model, "chunk": chunk, "dtype": dtype,
                "device": device, "threads": threads}
    peaks = {path: _run_child({**settings, "kind": "head", "path": path}, timeout) for path in ("full", "chunked")}
    errors = _run_child({**settings, "kind": "head_errors"}, timeout)
    # The gradients wrt the weight [V, d] and the hidden states [N, d] are the head's outputs: any implementation
    # returns them (the weight's is sized by the model, not by the tokens). Without them, what is left is the loss
    # head's own working memory (logits, softmax, their gradients), the part that grows with tokens x vocab.
    grad_bytes = (vocab + tokens) * d_model * (4 if dtype == "float32" else 2)
    peak = {k: v["peak_bytes"] for k, v in peaks.items()}
    working = {k: max(v - grad_bytes, 0) for k, v in peak.items()}
    return {"settings": settings, "peak_bytes": peak, "gradient_output_bytes": grad_bytes, "working_bytes": working,
            "logits_bytes": tokens * vocab * 4,
            "ratios": {"peak": peak["full"] / max(peak["chunked"], 1),
                       "working": working["full"] / max(working["chunked"], 1)},
            "goal": f"working >= {GOAL_HEAD}", "errors": errors, "measure": peaks["full"]["measure"]}


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
        vocab: Optional[int] = typer.Option(None, "--vocab", help="default 2048 (126464, LLaDA's, with --head)"),
        device: str = typer.Option("auto", "--device", help="auto | cpu | cuda"),
        threads: int = typer.Option(2, "--threads", help="CPU threads per measuring process"),
        as_json: bool = typer.Option(False, "--json", help="print the JSON result only"),
        plan: Optional[str] = typer.Option(
            None, "--plan", help="instead: the memory plan (trainers/memory_plan.py) vs a measured SFT step of this "
                                 "shipped real checkpoint shrunk to --layers / --d-model (e.g. LLaDA-8B-Instruct); "
                                 "uses --rows, --seq-len, --threads"),
        head: bool = typer.Option(False, "--head", help="instead: peak memory of the loss head (forward + backward "
                                                        "from --tokens hidden states of width --d-model), "
                                                        "materialised logits vs the chunked head"),
        tokens: int = typer.Option(2048, "--tokens", help="--head: scored tokens"),
        chunk: int = typer.Option(64, "--chunk", help="--head: tokens of logits per chunk"),
        dtype: str = typer.Option("float32", "--dtype", help="--head: float32 | bfloat16"),
    ) -> None:
        """Peak memory of one BGPO update vs a naive all-graphs ELBO objective as MC samples grow (or, with --plan,
        the memory plan's estimate vs a measured training step; with --head, the loss head's)."""
        from dare_bench.errors import ConfigError

        if head:
            if plan is not None:
                raise ConfigError("--head and --plan are two different benchmarks; pass one")
            if dtype not in ("float32", "bfloat16"):
                raise ConfigError(f"--dtype must be float32 or bfloat16, got {dtype!r}")
            if tokens < 8 or chunk < 1 or d_model < 1:
                raise ConfigError("need --tokens >= 8, --chunk >= 1, --d-model >= 1")
            if device == "auto":
                import torch

                device = "cuda" if torch.cuda.is_available() else "cpu"
            res = compare_head(vocab=vocab or 126464, tokens=tokens, d_model=d_model, chunk=chunk, dtype=dtype,
                               device=device, threads=threads)
            if as_json:
                typer.echo(json.dumps(res))
                return
            typer.echo(f"loss head forward + backward ({res['measure']}), settings {res['settings']}")
            typer.echo(f"  float32 logits alone: {res['logits_bytes'] / 2**20:.1f} MiB; gradient outputs (weight + "
                       f"hidden, in both peaks): {res['gradient_output_bytes'] / 2**20:.1f} MiB")
            for path, peak in res["peak_bytes"].items():
                typer.echo(f"  {path:<8} peak {peak / 2**20:>10.1f} MiB   working (peak - gradient outputs) "
                           f"{res['working_bytes'][path] / 2**20:>10.1f} MiB")
            typer.echo(f"full/chunked: peak {res['ratios']['peak']:.1f}x, working {res['ratios']['working']:.1f}x"
                       f"   (goal {res['goal']})")
            typer.echo("max relative error chunked vs full: " + ", ".join(f"{k} {v:.2e}"
                                                                           for k, v in res["errors"].items()))
            return
        vocab = vocab or 2048

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
    _measure = {"plan": measure_training_step, "head": measure_head, "head_errors": head_errors}
    typer.echo(json.dumps(_measure.get(_spec.get("kind"), measure_point)(_spec)))
