"""`dare-bench bench rollout`: vanilla vs accelerated diffusion samplers, per family, ratios measured in one run.

    dare-bench bench rollout                                  # all families, gen lengths 256 and 1024, CPU
    dare-bench bench rollout --json --families sdar,llada --gen-lengths 256
    dare-bench bench rollout --device cuda --dtype bfloat16   # one GPU
    (no torchrun mode: a rollout benchmark is per device)

For each family a benchmark-sized model is built from the registered tiny preset with the width scaled to
`--d-model` (>= 256 by default) and a "peaked" random init (fan-in scaled matrices, unit embeddings, an output head
`--head-scale` times sharper, like the parity fixtures) so that confidences spread like a trained model's rather than
sitting at 1/V: the default 10 gives about 3 tokens per forward at threshold 0.9 on LLaDA, the figure Fast-dLLM
reports for LLaDA-8B on GSM8K. It is still a random model: the speed ratios are meaningful, the text is not.
Paths, all on the same prompts in the same process:

- MDLM (LLaDA): vanilla = official semi-AR generate (steps = gen_length, block 32, no cache); `threshold` =
  Fast-dLLM parallel decoding; `prefix+threshold`, `dual+threshold` = with the Fast-dLLM caches.
- MDLM (Dream): vanilla = official diffusion_generate (steps = gen_length, maskgit_plus); `dual+threshold`.
- Block diffusion (SDAR, LLaDA2): vanilla = recompute every step over the whole prefix (the official LLaDA2
  sampler); `exact_cache` = committed blocks served from the exact KV cache. `--block-sampling greedy` (default,
  `top_k=1`: every confidence is 1, one step per block) or `official` (each family's default sampling: SDAR
  temperature 1 / threshold 0.85, LLaDA2 temperature 0 (which still samples) / threshold 0.95; several steps per
  block), every path drawing from an identically seeded generator.

Each row reports tokens/s (generated tokens per wall second), forwards, tokens per forward, token-forwards (sum of
query tokens: a hardware-free FLOP proxy) and agreement of the output tokens with the vanilla path; the table adds
the speed ratio to vanilla, and how close each path runs to the machine's limit (issue #15 item 7): its achieved
weight-matmul FLOP/s (`bench/roofline.py`: token-forwards x 2 x the matmul weights a token passes, a lower bound)
as a fraction of a bf16 GEMM's FLOP/s measured in the same run at the same thread count (AMX on this CPU; on a GPU
the same against its bf16 peak). `--json` prints `{"rows": [...]}` only.
"""

from __future__ import annotations

import json
import math
from typing import Any

import typer

FAMILY_PRESETS = {"llada": "tiny-llada", "dream": "tiny-dream", "sdar": "tiny-sdar", "llada2": "tiny-llada2"}
WIDTH_KEYS = ("d_model", "hidden_size")
SCALED_KEYS = ("mlp_hidden_size", "intermediate_size", "moe_intermediate_size", "head_dim")


def bench_config(family: str, d_model: int, max_len: int) -> dict[str, Any]:
    """The family's tiny preset with every width scaled to `d_model` (heads, layers and vocabulary kept)."""
    from dare_bench.errors import DareBenchError
    from dare_bench.models.presets import preset_config

    if family not in FAMILY_PRESETS:
        raise DareBenchError(f"unknown family {family!r}; use some of {sorted(FAMILY_PRESETS)}")
    cfg = preset_config(FAMILY_PRESETS[family])
    width_key = next(k for k in WIDTH_KEYS if k in cfg)
    factor = d_model / cfg[width_key]
    if factor != int(factor) and factor < 1:
        raise DareBenchError(f"--d-model {d_model} must be a multiple of the preset width {cfg[width_key]}")
    cfg[width_key] = d_model
    for key in SCALED_KEYS:
        if cfg.get(key):
            cfg[key] = int(cfg[key] * factor)
    for key in ("max_position_embeddings", "max_sequence_length"):
        if key in cfg:
            cfg[key] = max(int(cfg[key]), max_len)
    return cfg


def peaked_init(model, seed: int = 0, head_scale: float = 10.0) -> None:
    """Fixture-style random weights: matrices N(0, 1/fan_in), embeddings N(0, 1), output head `head_scale` x
    sharper, norms 1, biases 0 (peaked logits, so confidences are not all ~1/V)."""
    import torch
    from torch import nn

    g = torch.Generator().manual_seed(seed)
    head = None
    if hasattr(model, "lm_head"):
        head = model.lm_head.weight
    else:
        tr = getattr(getattr(model, "model", None), "transformer", None)
        if tr is not None and "ff_out" in tr:
            head = tr["ff_out"].weight
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    # every parameter, not only nn.Linear ones: custom modules (e.g. an MoE router) may start as torch.empty
    with torch.no_grad():
        for name, p in model.named_parameters():
            if id(p) in embeddings:
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.dim() >= 2:
                scale = (head_scale if p is head else 1.0) / math.sqrt(p.shape[-1])
                p.copy_(torch.randn(p.shape, generator=g) * scale)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)


def build_model(family: str, d_model: int, max_len: int, seed: int, device: str, dtype: str,
                head_scale: float = 10.0):
    from dare_bench.models.io import build_model as _build
    from dare_bench.models.io import resolve_dtype

    model = _build(bench_config(family, d_model, max_len), device="cpu", source=f"bench {family}")
    peaked_init(model, seed, head_scale)
    return model.to(device=device, dtype=resolve_dtype(dtype)).eval()


def paths_for(model, gen_length: int, threshold: float, block_sampling: str = "greedy"
              ) -> list[tuple[str, dict[str, Any]]]:
    """(path name, generate settings); the first is the vanilla baseline."""
    traits = model.traits
    if traits.is_block_diffusion:
        b = traits.block_size or 32
        base = {"gen_length": gen_length, "block_length": b, "denoising_steps": b}
        if block_sampling == "greedy":
            base["top_k"] = 1
        return [("vanilla", {**base, "use_cache": "none"}), ("exact_cache", {**base, "use_cache": "exact"})]
    block = min(32, gen_length)
    if traits.logit_shift == 1:
        return [
            ("vanilla", {"gen_length": gen_length, "steps": gen_length, "alg": "maskgit_plus", "temperature": 0.0}),
            ("dual+threshold", {"gen_length": gen_length, "alg": "maskgit_plus", "temperature": 0.0,
                                "block_length": block, "threshold": threshold, "use_cache": "dual"}),
        ]
    base = {"gen_length": gen_length, "block_length": block}
    return [
        ("vanilla", {**base, "steps": gen_length}),
        ("threshold", {**base, "threshold": threshold}),
        ("prefix+threshold", {**base, "threshold": threshold, "use_cache": "prefix"}),
        ("dual+threshold", {**base, "threshold": threshold, "use_cache": "dual"}),
    ]


def run_benchmark(families: list[str], gen_lengths: list[int], *, d_model: int = 256, prompt_length: int = 64,
                  batch: int = 1, threshold: float = 0.9, seed: int = 0, device: str = "cpu",
                  dtype: str = "float32", head_scale: float = 10.0, threads: int | None = 1, warmup: bool = True,
                  block_sampling: str = "greedy", echo=None) -> list[dict[str, Any]]:
    import torch

    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _run(families, gen_lengths, d_model, prompt_length, batch, threshold, seed, device, dtype, head_scale,
                    warmup, block_sampling, echo)
    finally:
        torch.set_num_threads(old_threads)


def _run(families, gen_lengths, d_model, prompt_length, batch, threshold, seed, device, dtype, head_scale, warmup,
         block_sampling, echo):
    import torch

    from dare_bench.bench.roofline import matmul_flops_per_token, matmul_peak
    from dare_bench.diffusion.sampling import generate

    # the machine's limit, measured in this run at this thread count: AMX bf16 on this CPU, and the run's dtype
    peaks = {d: matmul_peak(d, device)["flops_per_second"] for d in dict.fromkeys(("bfloat16", dtype))}
    rows: list[dict[str, Any]] = []
    for family in families:
        model = build_model(family, d_model, prompt_length + max(gen_lengths) + 64, seed, device, dtype, head_scale)
        flops_per_token = matmul_flops_per_token(model)
        vocab = model.config.get("vocab_size") or model.config.get("embedding_size")
        special = {model.traits.mask_token_id, model.traits.eos_token_id, model.traits.pad_token_id}
        g = torch.Generator().manual_seed(seed + 1)
        prompt = torch.randint(0, vocab, (batch, prompt_length), generator=g)
        for bad in special:  # keep special ids out of the prompt
            prompt[prompt == bad] = 1
        prompt = prompt.to(device)
        if warmup:  # first-call allocations and kernel selection are not part of any path
            generate(model, prompt, **paths_for(model, min(gen_lengths), threshold, block_sampling)[-1][1])
        for gen_length in gen_lengths:
            vanilla_out = None
            for name, settings in paths_for(model, gen_length, threshold, block_sampling):
                # every path draws the same random numbers (sampled block decoding, Gumbel / Dream sampling)
                rng = torch.Generator(device=device).manual_seed(seed + 2)
                out = generate(model, prompt, generator=rng, **settings)
                gen_part = out.canvas[:, prompt_length:prompt_length + gen_length]
                if vanilla_out is None:
                    vanilla_out = gen_part
                agreement = float((gen_part == vanilla_out).float().mean().item())
                st = out.stats
                row = {
                    "family": family,
                    "gen_length": gen_length,
                    "path": name,
                    "tokens_per_second": st.generated_tokens * batch / st.wall_seconds if st.wall_seconds else 0.0,
                    "forwards": st.forwards,
                    "tokens_per_forward": st.tokens_per_forward,
                    "token_forwards": st.token_forwards,
                    "wall_seconds": st.wall_seconds,
                    "agreement_with_vanilla": agreement,
                }
                achieved = flops_per_token * st.token_forwards / st.wall_seconds if st.wall_seconds else 0.0
                row.update(achieved_flops_per_second=achieved, fraction_of_bf16_peak=achieved / peaks["bfloat16"],
                           fraction_of_dtype_peak=achieved / peaks[dtype], bf16_peak_flops_per_second=peaks["bfloat16"])
                rows.append(row)
                if echo is not None:
                    echo(row)
    base = {(r["family"], r["gen_length"]): r for r in rows if r["path"] == "vanilla"}
    for r in rows:
        v = base[(r["family"], r["gen_length"])]
        r["speedup_vs_vanilla"] = r["tokens_per_second"] / v["tokens_per_second"] if v["tokens_per_second"] else 0.0
        r["token_forward_ratio"] = v["token_forwards"] / r["token_forwards"] if r["token_forwards"] else 0.0
    return rows


def _format(rows: list[dict[str, Any]]) -> str:
    head = (f"{'family':8} {'gen':>5} {'path':18} {'tok/s':>9} {'fwd':>6} {'tok/fwd':>8} {'agree':>7} "
            f"{'speedup':>8} {'tokfwd ratio':>12} {'GFLOP/s':>8} {'of peak':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['family']:8} {r['gen_length']:>5} {r['path']:18} {r['tokens_per_second']:>9.1f} "
                     f"{r['forwards']:>6} {r['tokens_per_forward']:>8.2f} {r['agreement_with_vanilla']:>7.1%} "
                     f"{r['speedup_vs_vanilla']:>7.2f}x {r['token_forward_ratio']:>11.1f}x "
                     f"{r['achieved_flops_per_second'] / 1e9:>8.1f} {r['fraction_of_bf16_peak']:>7.1%}")
    if rows:
        lines.append(f"GFLOP/s: weight matmuls only (bench/roofline.py, a lower bound); of peak: against a bf16 GEMM "
                     f"measured in this run at this thread count ({rows[0]['bf16_peak_flops_per_second'] / 1e9:.0f} "
                     "GFLOP/s)")
    return "\n".join(lines)


def _csv(value: str, cast, name: str) -> list:
    from dare_bench.errors import DareBenchError

    try:
        items = [cast(v.strip()) for v in value.split(",") if v.strip()]
    except ValueError:
        raise DareBenchError(f"--{name}: cannot parse {value!r}") from None
    if not items:
        raise DareBenchError(f"--{name} is empty")
    return items


def register(group: typer.Typer) -> None:
    @group.command("rollout")
    def rollout(
        json_out: bool = typer.Option(False, "--json", help="Print only the JSON result."),
        families: str = typer.Option("llada,dream,sdar,llada2", "--families", help="Comma-separated families."),
        gen_lengths: str = typer.Option("256,1024", "--gen-lengths", help="Comma-separated generation lengths."),
        d_model: int = typer.Option(256, "--d-model", help="Model width (the tiny preset's widths scaled to it)."),
        prompt_length: int = typer.Option(64, "--prompt-length"),
        batch: int = typer.Option(1, "--batch"),
        threshold: float = typer.Option(0.9, "--threshold", help="Fast-dLLM confidence threshold."),
        seed: int = typer.Option(0, "--seed"),
        device: str = typer.Option("cpu", "--device"),
        dtype: str = typer.Option("float32", "--dtype"),
        head_scale: float = typer.Option(10.0, "--head-scale",
                                         help="Output-head sharpness of the random model (10: ~3 tokens per "
                                              "forward at threshold 0.9, as Fast-dLLM reports for LLaDA-8B)."),
        threads: int = typer.Option(1, "--threads", help="torch CPU threads (1 avoids oversubscription)."),
        block_sampling: str = typer.Option("greedy", "--block-sampling",
                                           help="Block diffusion: 'greedy' (top_k=1) or 'official' (each family's "
                                                "default sampling, same generator on every path)."),
    ) -> None:
        """Vanilla vs cached / parallel diffusion sampling: tokens/s, forwards, tokens per forward, agreement."""
        import torch

        from dare_bench.errors import DareBenchError

        fams = _csv(families, str, "families")
        unknown = [f for f in fams if f not in FAMILY_PRESETS]
        if unknown:
            raise DareBenchError(f"unknown families {unknown}; use some of {sorted(FAMILY_PRESETS)}")
        lengths = _csv(gen_lengths, int, "gen-lengths")
        if block_sampling not in ("greedy", "official"):
            raise DareBenchError(f"--block-sampling must be 'greedy' or 'official', got {block_sampling!r}")
        if any(n < 1 for n in lengths) or prompt_length < 1 or batch < 1 or d_model < 1:
            raise DareBenchError("--gen-lengths, --prompt-length, --batch and --d-model must be positive")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise DareBenchError("--device cuda requested but no CUDA device is available")
        echo = None if json_out else (lambda r: typer.echo(
            f"  {r['family']} gen {r['gen_length']} {r['path']}: {r['tokens_per_second']:.1f} tok/s, "
            f"{r['forwards']} forwards", err=True))
        rows = run_benchmark(fams, lengths, d_model=d_model, prompt_length=prompt_length, batch=batch,
                             threshold=threshold, seed=seed, device=device, dtype=dtype, head_scale=head_scale,
                             threads=threads, block_sampling=block_sampling, echo=echo)
        if json_out:
            typer.echo(json.dumps({"rows": rows}, indent=2))
        else:
            typer.echo(_format(rows))
