"""`dare-bench bench flex`: the BD3 training-mask attention, dense sdpa vs a FlexAttention block mask, at L = 4k.

One attention op over the dFactory `[x_t ; x_0]` layout (2L rows and keys, the mask of `models/block.py`), not a
model: q, k, v `[batch, heads, 2L, head_dim]`, the inputs allocated before any measurement window.
- `sdpa`: the reference path as `training_forward` runs it: the dense bool `[2L, 2L]` mask (`bd3_attention_mask`,
  built on every forward), then `layers.attention` (sdpa).
- `flex`: `bd3_block_mask` (create_block_mask with the BD3 rule as mask_mod, built once per shape) and the compiled
  FlexAttention kernel (`torch.compile(flex_attention)`; the compile is timed on its own, outside the windows).
Each path runs in a fresh Python process, so no allocator cache or earlier peak leaks into its numbers. Peak memory:
CPU, growth of the kernel's high-water mark (VmHWM reset through /proc/self/clear_refs, as `bench memory`); GPU,
torch.cuda.max_memory_allocated() growth. Times: the median of `--repeats` runs after one warm-up.
torch 2.13 has no FlexAttention backward on CPU: there the forward + backward of `flex` is reported as not run (null),
with the reason, and the ratios are forward only; on CUDA both. The same run checks the flex output against sdpa
(max abs error).

    dare-bench bench flex                        # CPU, L 4096 (2L = 8192), block 32, 2 heads x 64, float32, ~2 min
    dare-bench bench flex --json --seq-len 512 --repeats 1
    dare-bench bench flex --device cuda --heads 16 --head-dim 128 --dtype bfloat16     # one GPU

Output: a table per path (mask build, forward, forward + backward: seconds and peak MiB) and the ratios sdpa / flex;
`--json` prints `{"settings", "paths": {"sdpa": {...}, "flex": {...}}, "ratios": {...}, "max_abs_err", "notes"}`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Optional

import typer

PATHS = ("sdpa", "flex")


def _peak_window(device: str):
    """(start, stop) closures: stop() returns the peak memory growth in bytes since start()."""
    import torch

    from dare_bench.bench.memory import _reset_peak, _status_kib

    if device.startswith("cuda"):
        state = {}

        def start():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            state["base"] = torch.cuda.memory_allocated()

        def stop():
            torch.cuda.synchronize()
            return int(torch.cuda.max_memory_allocated() - state["base"])

        return start, stop, "cuda max_memory_allocated growth"
    if not _reset_peak():  # pragma: no cover - needs Linux /proc
        raise RuntimeError("measuring the peak needs /proc/self/clear_refs (Linux)")
    state = {}

    def start():
        _reset_peak()
        state["base"] = _status_kib("VmHWM")

    def stop():
        return (_status_kib("VmHWM") - state["base"]) * 1024

    return start, stop, "VmHWM growth (clear_refs reset)"


def _measure(fn, device: str, repeats: int) -> dict[str, Any]:
    """Median seconds of `fn()` over `repeats` runs (after a warm-up) and the peak memory growth of one run."""
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    start, stop, _ = _peak_window(device)
    start()
    fn()
    return {"seconds": statistics.median(times), "peak_bytes": stop()}


def _inputs(spec: dict[str, Any]):
    import torch

    g = torch.Generator().manual_seed(0)
    shape = (spec["batch"], spec["heads"], 2 * spec["seq_len"], spec["head_dim"])
    dtype = getattr(torch, spec["dtype"])
    return [torch.randn(shape, generator=g).to(spec["device"], dtype).requires_grad_() for _ in range(3)]


def _block_mask_bytes(block_mask) -> int:
    import torch

    return sum(t.numel() * t.element_size() for t in vars(block_mask).values() if isinstance(t, torch.Tensor))


def measure_path(spec: dict[str, Any]) -> dict[str, Any]:
    """Mask build, forward and forward + backward of one path (`spec['path']`), in this process."""
    import warnings

    import torch

    from dare_bench.models.block import _bd3_structure, bd3_attention_mask, bd3_block_mask
    from dare_bench.models.layers import attention

    torch.set_num_threads(int(spec["threads"]))
    device, n, bs, reps = spec["device"], spec["seq_len"], spec["block_size"], spec["repeats"]
    q, k, v = _inputs(spec)
    qd, kd, vd = (x.detach() for x in (q, k, v))  # forward-only runs (FlexAttention on CPU refuses grad inputs)
    scale = spec["head_dim"] ** -0.5
    out: dict[str, Any] = {"path": spec["path"], "measure": _peak_window(device)[2]}
    if spec["path"] == "sdpa":
        out["mask_build"] = _measure(lambda: bd3_attention_mask(n, bs, device=device), device, reps)
        mask = bd3_attention_mask(n, bs, device=device)
        out["mask_bytes"] = mask.numel() * mask.element_size()

        def forward(q=qd, k=kd, v=vd):
            return attention(q, k, v, mask, scale=scale)
    else:
        from torch.nn.attention.flex_attention import flex_attention

        def build():
            _bd3_structure.cache_clear()  # time the real build, not the cache hit
            return bd3_block_mask(n, bs, device=device)

        out["mask_build"] = _measure(build, device, reps)
        block_mask = bd3_block_mask(n, bs, device=device)
        out["mask_bytes"] = _block_mask_bytes(block_mask)
        out["sparsity_percent"] = float(block_mask.sparsity())
        kernel = torch.compile(flex_attention)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            kernel(qd, kd, vd, block_mask=block_mask, scale=scale)
            out["compile_seconds"] = time.perf_counter() - t0

        def forward(q=qd, k=kd, v=vd):
            return kernel(q, k, v, block_mask=block_mask, scale=scale)

    with torch.no_grad():
        out["forward"] = _measure(forward, device, reps)
    if spec["path"] == "flex" and device == "cpu":
        out["forward_backward"] = None
        out["forward_backward_skipped"] = f"torch {torch.__version__} has no FlexAttention backward on CPU"
    else:
        grad = torch.randn_like(q)

        def forward_backward():
            torch.autograd.grad(forward(q, k, v), (q, k, v), grad)

        out["forward_backward"] = _measure(forward_backward, device, reps)
    if spec["path"] == "flex":  # the output against the dense reference, after the windows
        with torch.no_grad():
            ref = attention(qd, kd, vd, bd3_attention_mask(n, bs, device=device), scale=scale)
            out["max_abs_err"] = float((forward() - ref).abs().max())
    return out


def _run_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = dict(os.environ)
    threads = str(spec["threads"])
    # a fixed mmap threshold makes glibc return freed tensors to the OS, so the resident set follows live memory
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, MALLOC_MMAP_THRESHOLD_="65536")
    proc = subprocess.run([sys.executable, "-m", "dare_bench.bench.flex", json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"flex bench path {spec['path']} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_benchmark(*, seq_len: int = 4096, block_size: int = 32, batch: int = 1, heads: int = 2, head_dim: int = 64,
                  dtype: str = "float32", device: str = "cpu", threads: int = 1, repeats: int = 3,
                  timeout: float = 900) -> dict[str, Any]:
    settings = {"seq_len": seq_len, "rows": 2 * seq_len, "block_size": block_size, "batch": batch, "heads": heads,
                "head_dim": head_dim, "dtype": dtype, "device": device, "threads": threads, "repeats": repeats}
    paths = {p: _run_child({**settings, "path": p}, timeout) for p in PATHS}
    dense, flex = paths["sdpa"], paths["flex"]

    def ratio(part, key):
        a, b = dense.get(part), flex.get(part)
        return None if a is None or b is None else a[key] / max(b[key], 1e-30 if key == "seconds" else 1)

    ratios = {"forward_time": ratio("forward", "seconds"), "forward_peak": ratio("forward", "peak_bytes"),
              "forward_backward_time": ratio("forward_backward", "seconds"),
              "forward_backward_peak": ratio("forward_backward", "peak_bytes"),
              "mask_bytes": dense["mask_bytes"] / max(flex["mask_bytes"], 1)}
    notes = []
    if flex.get("forward_backward_skipped"):
        notes.append(flex["forward_backward_skipped"] + ": forward + backward measured for sdpa only")
    notes.append("the dense mask is rebuilt on every forward (training_forward); the block mask once per shape")
    return {"settings": settings, "paths": paths, "ratios": ratios, "max_abs_err": flex["max_abs_err"],
            "notes": notes, "measure": dense["measure"]}


def _fmt(part: Optional[dict[str, Any]]) -> str:
    if part is None:
        return f"{'not run':>22}"
    return f"{part['seconds']:>9.3f} s {part['peak_bytes'] / 2**20:>8.1f} MiB"


def register(group: typer.Typer) -> None:
    @group.command("flex")
    def flex(
        seq_len: int = typer.Option(4096, "--seq-len", help="L: tokens per copy (the layout has 2L rows)"),
        block_size: int = typer.Option(32, "--block-size", help="diffusion block size of the BD3 mask"),
        batch: int = typer.Option(1, "--batch"),
        heads: int = typer.Option(2, "--heads"),
        head_dim: int = typer.Option(64, "--head-dim"),
        dtype: str = typer.Option("float32", "--dtype", help="float32 | bfloat16"),
        device: str = typer.Option("auto", "--device", help="auto | cpu | cuda"),
        threads: int = typer.Option(1, "--threads", help="CPU threads of each measuring process"),
        repeats: int = typer.Option(3, "--repeats", help="timed runs per measurement (the median)"),
        as_json: bool = typer.Option(False, "--json", help="print the JSON result only"),
    ):
        """BD3 training-mask attention: dense sdpa vs FlexAttention block mask, time and peak memory (one run)."""
        import torch

        from dare_bench.errors import ConfigError
        from dare_bench.models.layers import check_backend

        check_backend("flex")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype not in ("float32", "bfloat16") or min(seq_len, block_size, batch, heads, head_dim, repeats) < 1:
            raise ConfigError("bench flex: --dtype float32 | bfloat16, and positive sizes / --repeats")
        res = run_benchmark(seq_len=seq_len, block_size=block_size, batch=batch, heads=heads, head_dim=head_dim,
                            dtype=dtype, device=device, threads=threads, repeats=repeats)
        if as_json:
            typer.echo(json.dumps(res))
            return
        typer.echo(f"BD3 [noisy; clean] attention, 2L = {2 * seq_len} ({res['measure']}), settings {res['settings']}")
        typer.echo(f"{'path':<6}{'mask build':>23}{'forward':>23}{'forward + backward':>23}{'mask MiB':>10}")
        for name, p in res["paths"].items():
            typer.echo(f"{name:<6}{_fmt(p['mask_build'])}{_fmt(p['forward'])}{_fmt(p['forward_backward'])}"
                       f"{p['mask_bytes'] / 2**20:>10.3f}")
        fl = res["paths"]["flex"]
        typer.echo(f"flex: {fl['sparsity_percent']:.1f}% of 128x128 tiles skipped, compile "
                   f"{fl['compile_seconds']:.1f} s, max |flex - sdpa| = {res['max_abs_err']:.2e}")
        typer.echo("sdpa / flex: " + ", ".join(f"{k} {v:.2f}x" for k, v in res["ratios"].items() if v is not None))
        for note in res["notes"]:
            typer.echo(f"note: {note}")


if __name__ == "__main__":  # a child process measuring one path: argv[1] is the JSON spec
    typer.echo(json.dumps(measure_path(json.loads(sys.argv[1]))))
