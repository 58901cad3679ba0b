"""`dare-bench bench packing`: wall time of one training step on d1's length mix, packed (`train.packing`) vs padded.

One micro-batch of `--rows` completions with d1's GSM8K lengths: prompt lengths from DARE's gsm8k test parquet
(`rl/test/gsm8k_1.parquet`: characters / 4 + 30 template tokens per prompt, an estimate, as no tokenizer ships with
the package), completions of `--gen-length` slots (d1's gsm8k recipe: 256) whose first EOS falls at a length drawn
from a normal of mean 0.55 and sd 0.2 of the slots, clipped to [16, slots] (an assumed distribution: DARE does not
publish its rollout lengths). Rows are left-padded prompts followed by the completion slots, as the RL loop lays
them out. Two layouts of the same rows:
- `elbo`: the ELBO plug-ins' (`bgpo.elbo_layout`, DARE's verl attention mask): positions after the first EOS are
  padding. Loss: one stratified MC copy of the ELBO (`likelihood.elbo_term`) / R.
- `d1`: the d1 plug-in's (upstream d1: the model sees every completion slot): only the prompts' left padding is
  padding. Loss: d1's one-step mean-field log-probs (`likelihood.d1_token_logprobs`), token mean.
The LM head is the paper profiles' (`train.lm_head_chunk_tokens` 256: scored tokens only; `--head-chunk 0`: the
materialised [tokens, vocab] logits, which the packed path must move back to the padded grid). Per family x layout:
two copies of one small model (same init), one stepping padded and one packed (forward,
backward, AdamW) on the same rows and masks, interleaved; the median step time of each, their ratio, the largest
|loss difference| over the steps, and the bound packing can reach (padded tokens / real tokens).

    dare-bench bench packing --threads 1             # CPU: llada + sdar, d_model 128, 2 layers, 16 rows, 3 steps
    dare-bench bench packing --json --family llada --rows 8 --steps 2
    dare-bench bench packing --device cuda --d-model 1024 --layers 8 --rows 64 --attention flash_attn   # one GPU

Output: a table; `--json` prints `{"results": [{"family", "layout", "padded_s", "packed_s", "speedup",
"bound", "max_loss_diff", "padded_rows", "packed_rows", "real_tokens", "padded_tokens",
"padded_fraction_of_bf16_peak", "packed_fraction_of_bf16_peak", "bf16_peak_flops_per_second"}], "settings": {...}}`;
a fraction of peak is the step's useful FLOP/s (3 x the weight matmuls of the real tokens, `bench/roofline.py`)
against a bf16 GEMM measured in the same run (issue #15 item 7).
Goal (issue #15 item 3): speedup >= 2 with the loss equal (<= 1e-6).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any, Optional

import typer

GOAL_SPEEDUP = 2.0
GOAL_LOSS = 1e-6
TEMPLATE_TOKENS = 30  # chat template + role tokens around a GSM8K question (estimate)
CHARS_PER_TOKEN = 4.0  # BPE on English text (estimate)
LAYOUTS = ("elbo", "d1")
SIZES = {  # preset, its size fields for (d_model, layers, heads)
    "llada": ("tiny-llada", lambda d, n, h: dict(d_model=d, n_layers=n, n_heads=h, n_kv_heads=h,
                                                 mlp_hidden_size=4 * d)),
    "dream": ("tiny-dream", lambda d, n, h: dict(hidden_size=d, num_hidden_layers=n, num_attention_heads=h,
                                                 num_key_value_heads=h, intermediate_size=4 * d)),
    "sdar": ("tiny-sdar", lambda d, n, h: dict(hidden_size=d, num_hidden_layers=n, num_attention_heads=h,
                                               num_key_value_heads=h, head_dim=d // h, intermediate_size=4 * d,
                                               max_window_layers=n)),
}


def gsm8k_file(data: str | None) -> Path:
    """`data`, else $DARE_BENCH_DATA/rl/test/gsm8k_1.parquet, else the copy in a checkout's test fixtures."""
    from dare_bench.errors import DataError

    candidates = [Path(data)] if data else []
    if not data and os.environ.get("DARE_BENCH_DATA"):
        candidates.append(Path(os.environ["DARE_BENCH_DATA"]).expanduser() / "rl" / "test" / "gsm8k_1.parquet")
    if not data:
        candidates.append(Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "data" / "dare" / "rl" / "test"
                          / "gsm8k_1.parquet")
    for path in candidates:
        if path.is_file():
            return path
    raise DataError(f"no gsm8k parquet at {', '.join(map(str, candidates)) or '?'}; run `dare-bench data get gsm8k` "
                    "(it writes $DARE_BENCH_DATA/rl/test/gsm8k_1.parquet) or pass --data FILE")


def length_mix(path: Path, rows: int, gen_length: int, seed: int) -> tuple[list[int], list[int]]:
    """(prompt token lengths, completion lengths up to and including the first EOS) of `rows` rollouts."""
    import pyarrow.parquet as pq
    import torch

    prompts = pq.read_table(path, columns=["prompt"]).column("prompt").to_pylist()
    g = torch.Generator().manual_seed(seed)
    picked = torch.randperm(len(prompts), generator=g)[:rows].tolist()
    plen = [TEMPLATE_TOKENS + math.ceil(sum(len(m["content"]) for m in prompts[i]) / CHARS_PER_TOKEN) for i in picked]
    draws = torch.randn(rows, generator=g) * 0.2 + 0.55
    clen = [int(min(max(round(float(x) * gen_length), 16), gen_length)) for x in draws]
    return plen, clen


def _model(family: str, d_model: int, layers: int, heads: int, device: str, attention: str):
    import torch

    from dare_bench.models.io import build_model
    from dare_bench.models.presets import preset_config

    preset, sizes = SIZES[family]
    model = build_model(preset_config(preset, **sizes(d_model, layers, heads)))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model.init_weights()
    model.set_attention_backend(attention)
    return model.to(device).train()


def _rows(model, plen: list[int], clen: list[int], gen_length: int, layout: str, seed: int):
    """input_ids, attention mask, prompt width and the mask draw of the micro-batch (one draw for both paths)."""
    import torch

    from dare_bench.diffusion.masking import d1_masks, stratified_masks

    g = torch.Generator().manual_seed(seed)
    n, width = len(plen), max(plen)
    ids = torch.randint(0, 500, (n, width + gen_length), generator=g)
    attn = torch.zeros(n, width + gen_length, dtype=torch.long)
    for r, (p, c) in enumerate(zip(plen, clen)):
        attn[r, width - p:width] = 1
        attn[r, width:width + (c if layout == "elbo" else gen_length)] = 1
        ids[r, :width - p] = model.traits.pad_token_id
    if layout == "elbo":
        draw = stratified_masks(attn, width, n=1, generator=g)
    else:
        draw = d1_masks(attn, width, generator=g)
    return ids, attn, width, draw


def _loss(model, ids, attn, width, draw, layout: str, gen_length: int, head_chunk: int | None):
    from dare_bench.diffusion.likelihood import d1_token_logprobs, elbo_term

    if layout == "elbo":
        term = elbo_term(model, ids, draw, 0, attention_mask=attn, head_chunk_tokens=head_chunk)
        return term.total.sum() / (gen_length * ids.shape[0])
    lp = d1_token_logprobs(model, ids, draw, attention_mask=attn, head_chunk_tokens=head_chunk)
    return lp.sum() / draw.loss_mask.sum()


def measure(family: str, layout: str, plen: list[int], clen: list[int], *, gen_length: int, d_model: int,
            layers: int, heads: int, steps: int, device: str, attention: str, peak_flops: float,
            head_chunk: int | None = 256, seed: int = 0) -> dict[str, Any]:
    """One family x layout: padded and packed training steps, interleaved (module doc); `peak_flops`: the bf16
    GEMM FLOP/s the step's useful FLOP/s is a fraction of."""
    import torch

    from dare_bench.bench.roofline import matmul_flops_per_token
    from dare_bench.diffusion.packing import PackedModel, first_fit_decreasing

    padded_model = _model(family, d_model, layers, heads, device, attention)
    packed_model = _model(family, d_model, layers, heads, device, attention)
    ids, attn, width, draw = _rows(padded_model, plen, clen, gen_length, layout, seed)
    ids, attn = ids.to(device), attn.to(device)
    if device != "cpu":
        draw = dataclasses.replace(draw, **{k: v.to(device) for k, v in vars(draw).items()
                                            if isinstance(v, torch.Tensor)})
    runs = {"padded": (padded_model, padded_model), "packed": (packed_model, PackedModel(packed_model,
                                                                                         packed_model.traits))}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, (m, _) in runs.items()}
    times: dict[str, list[float]] = {"padded": [], "packed": []}
    losses: dict[str, list[float]] = {"padded": [], "packed": []}
    for step in range(steps + 1):  # step 0 warms up (allocator, kernels); its loss still counts
        for kind in ("padded", "packed") if step % 2 == 0 else ("packed", "padded"):
            model, call = runs[kind]
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            opts[kind].zero_grad(set_to_none=True)
            loss = _loss(call, ids, attn, width, draw, layout, gen_length, head_chunk)
            loss.backward()
            opts[kind].step()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            if step > 0:
                times[kind].append(time.perf_counter() - t0)
            losses[kind].append(float(loss.detach()))
    real = [p + (c if layout == "elbo" else gen_length) for p, c in zip(plen, clen)]
    blocks = 2 if padded_model.traits.is_block_diffusion else 1  # the BD3 layout doubles every row
    padded_s, packed_s = statistics.median(times["padded"]), statistics.median(times["packed"])
    # how close to the machine's limit (issue #15 item 7): the useful work, 3 x the forward's weight matmuls (forward
    # + backward) over the real tokens, per second, against a bf16 GEMM measured once per run (`run_benchmark`)
    useful = 3 * matmul_flops_per_token(padded_model) * blocks * sum(real)
    return {"family": family, "layout": layout, "padded_s": padded_s, "packed_s": packed_s,
            "padded_fraction_of_bf16_peak": useful / padded_s / peak_flops,
            "packed_fraction_of_bf16_peak": useful / packed_s / peak_flops, "bf16_peak_flops_per_second": peak_flops,
            "speedup": padded_s / packed_s, "bound": len(real) * (width + gen_length) / sum(real),
            "max_loss_diff": max(abs(a - b) for a, b in zip(losses["padded"], losses["packed"])),
            "padded_rows": len(real), "packed_rows": len(first_fit_decreasing(real, max(real))),
            "real_tokens": blocks * sum(real), "padded_tokens": blocks * len(real) * (width + gen_length)}


def run_benchmark(families: list[str], layouts: list[str], *, rows: int, gen_length: int, d_model: int,
                  layers: int, heads: int, steps: int, device: str, attention: str, data: str | None,
                  head_chunk: int | None = 256, seed: int = 0) -> dict[str, Any]:
    from dare_bench.bench.roofline import matmul_peak

    path = gsm8k_file(data)
    plen, clen = length_mix(path, rows, gen_length, seed)
    peak = matmul_peak("bfloat16", device)["flops_per_second"]  # the machine's limit, at this thread count
    results = [measure(f, lay, plen, clen, gen_length=gen_length, d_model=d_model, layers=layers, heads=heads,
                       steps=steps, device=device, attention=attention, peak_flops=peak, head_chunk=head_chunk,
                       seed=seed)
               for f in families for lay in layouts]
    settings = {"rows": rows, "gen_length": gen_length, "d_model": d_model, "layers": layers, "heads": heads,
                "steps": steps, "device": device, "attention": attention, "head_chunk": head_chunk,
                "data": str(path),
                "prompt_lengths": plen, "completion_lengths": clen, "goal_speedup": GOAL_SPEEDUP,
                "goal_loss_diff": GOAL_LOSS}
    return {"results": results, "settings": settings}


def _table(out: dict[str, Any]) -> str:
    s = out["settings"]
    lines = [f"one training step (forward + backward + AdamW), {s['rows']} rows, d1's gsm8k mix (prompts "
             f"{min(s['prompt_lengths'])}-{max(s['prompt_lengths'])} tokens, completions "
             f"{min(s['completion_lengths'])}-{max(s['completion_lengths'])} of {s['gen_length']}), d_model "
             f"{s['d_model']}, {s['layers']} layers, {s['device']} / {s['attention']}, LM head "
             f"{'chunked ' + str(s['head_chunk']) if s['head_chunk'] else 'materialised'}",
             f"{'family':8} {'layout':6} {'padded s':>9} {'packed s':>9} {'speedup':>8} {'bound':>6} "
             f"{'rows':>7} {'|dloss|':>9} {'of peak':>15}"]
    for r in out["results"]:
        lines.append(f"{r['family']:8} {r['layout']:6} {r['padded_s']:9.3f} {r['packed_s']:9.3f} "
                     f"{r['speedup']:7.2f}x {r['bound']:5.2f}x {r['padded_rows']:>3}->{r['packed_rows']:<3} "
                     f"{r['max_loss_diff']:9.1e} {r['padded_fraction_of_bf16_peak']:6.1%} -> "
                     f"{r['packed_fraction_of_bf16_peak']:6.1%}")
    if out["results"]:
        lines.append("of peak: useful FLOP/s (3 x the weight matmuls over the real tokens, bench/roofline.py) against "
                     f"a bf16 GEMM measured in this run ({out['results'][0]['bf16_peak_flops_per_second'] / 1e9:.0f} "
                     "GFLOP/s), padded -> packed")
    lines.append(f"goal: speedup >= {GOAL_SPEEDUP}x with |dloss| <= {GOAL_LOSS:g}; bound = padded / real tokens "
                 "(what removing all padding could give)")
    return "\n".join(lines)


def register(group: typer.Typer) -> None:
    @group.command("packing")
    def packing(
        family: str = typer.Option("llada,sdar", "--family", help="comma-separated: llada, dream, sdar"),
        layout: str = typer.Option("elbo,d1", "--layout", help="comma-separated: elbo (post-EOS is padding), "
                                                               "d1 (the whole completion is attended)"),
        rows: int = typer.Option(16, "--rows", help="completions in the micro-batch"),
        gen_length: int = typer.Option(256, "--gen-length", help="completion slots (d1's gsm8k: 256)"),
        d_model: int = typer.Option(128, "--d-model"),
        layers: int = typer.Option(2, "--layers"),
        heads: int = typer.Option(4, "--heads"),
        steps: int = typer.Option(3, "--steps", help="timed steps per path (after one warm-up step)"),
        device: str = typer.Option("cpu", "--device", help="cpu | cuda"),
        attention: str = typer.Option("sdpa", "--attention", help="sdpa | flash_attn (GPU) | flex"),
        head_chunk: int = typer.Option(256, "--head-chunk", help="train.lm_head_chunk_tokens (the paper profiles' "
                                                                 "256); 0: materialised logits"),
        threads: Optional[int] = typer.Option(None, "--threads", help="torch CPU threads (default: torch's)"),
        data: Optional[str] = typer.Option(None, "--data", help="the gsm8k parquet (default: "
                                                                "$DARE_BENCH_DATA/rl/test/gsm8k_1.parquet)"),
        as_json: bool = typer.Option(False, "--json", help="print the JSON result only"),
    ) -> None:
        """Wall time of one training step on d1's length mix, packed vs padded, with the loss difference."""
        from dare_bench.errors import ConfigError

        families = [f for f in family.split(",") if f]
        layouts = [x for x in layout.split(",") if x]
        if not families or any(f not in SIZES for f in families):
            raise ConfigError(f"--family must list some of {', '.join(SIZES)}, got {family!r}")
        if not layouts or any(x not in LAYOUTS for x in layouts):
            raise ConfigError(f"--layout must list some of {', '.join(LAYOUTS)}, got {layout!r}")
        if head_chunk < 0:
            raise ConfigError(f"--head-chunk must be >= 0 (0: materialised logits), got {head_chunk}")
        if rows < 1 or gen_length < 16 or steps < 1 or d_model < heads or d_model % heads:
            raise ConfigError("need --rows >= 1, --gen-length >= 16, --steps >= 1 and --d-model a multiple of --heads")
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        out = run_benchmark(families, layouts, rows=rows, gen_length=gen_length, d_model=d_model, layers=layers,
                            heads=heads, steps=steps, device=device, attention=attention, data=data,
                            head_chunk=head_chunk or None)
        typer.echo(json.dumps(out) if as_json else _table(out))
