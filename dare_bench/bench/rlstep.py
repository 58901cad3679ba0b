"""`dare-bench bench rlstep`: one full RL step (rollout + prepare + update) of a paper recipe, plain vs fast.

The end-to-end figure of issue #15 (DARE reports ~4x for its MDLM RL pipeline and >14x for BDLM, without a protocol).
Protocol, per family, all in one process:
- Model: a shrunk real-architecture checkpoint (`models/shrink.py`: the real config with `--layers` decoder layers
  and `--hidden` width, the real vocabulary, special ids and tokenizer (or its byte-level stand-in), random weights
  from seed 0), written to a temporary directory and loaded afresh for every run, so both paths start from the same
  weights.
- Recipe: the registry entry's paper profile (`d1-llada-gsm8k`, `bgpo-sdar-gsm8k`, `d1-dream-gsm8k`,
  `bgpo-llada2-gsm8k`), its plug-in settings unchanged, shrunk only in size: `--prompts` prompts x `--group`
  completions of `--gen-length` tokens, the entry's rollout steps per token and block length (capped at the
  generation length), one rollout unit, `--steps` timed RL steps after one warm-up step, no evaluation or
  checkpoints. Prompts: GSM8K test questions in DARE's prompt and the checkpoint's chat template (DARE's gsm8k
  parquet, as `bench packing`; their mean token count is printed). The shrunk model's LM head is a much larger
  share of its compute than in the 7-8B original (hidden 256 against a 126-157k vocabulary), which favours the
  paths that compute fewer logits (the caches, the chunked head): a caveat on comparing these ratios with DARE's.
- plain: rollouts without a cache (`use_cache: none`), padded update forwards (`train.packing` off), materialised
  `[tokens, vocab]` logits (`train.lm_head_chunk_tokens` unset), the per-expert MoE loop (`model.moe: loop`).
- fast: the entry's pinned paper settings: Fast-dLLM's prefix cache for MDLM rollouts (DARE's recipes) or the
  exact block KV cache for BDLM, packing, the 256-token chunked LM head, and its `model.moe` (grouped experts on
  LLaDA2; dense backbones have no experts). FlexAttention is not in the fast path on CPU (torch 2.13 has no CPU
  backward for it); `--attention flex` puts it in both paths on a GPU.
- Both paths compute in `--dtype` (the paper profiles' bfloat16 by default: fp32 master weights, bf16 autocast;
  AMX on this CPU) with `--threads` torch threads.
Reported per path: the median seconds of rollout, prepare (old / reference terms), update (backward + AdamW) and
the whole step, the rollout forwards and tokens per forward; then fast / plain ratios. The rollout of an MDLM under
the prefix cache is Fast-dLLM's approximation (other tokens than the plain path; DARE's recipes accept it); the
exact block cache, packing and the chunked head are equal to the plain path (their tests:
tests/bench/test_rlstep.py, tests/diffusion/test_packing.py, tests/models/test_lm_head.py).

    dare-bench bench rlstep --threads 2                        # llada + sdar: d1 and BGPO paper recipes, CPU
    dare-bench bench rlstep --families sdar --gen-length 64 --steps 1 --json
    dare-bench bench rlstep --device cuda --layers 8 --hidden 1024 --gen-length 256 --prompts 4 --group 8

Output: a table; `--json` prints `{"rows": [...], "ratios": [...], "settings": {...}}`.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path
from typing import Any, Optional

import typer

# family -> (the registry entry whose paper recipe runs, the shipped real config it shrinks)
FAMILIES = {"llada": ("d1-llada-gsm8k", "LLaDA-8B-Instruct"), "dream": ("d1-dream-gsm8k", "Dream-v0-Instruct-7B"),
            "sdar": ("bgpo-sdar-gsm8k", "SDAR-8B-Chat"), "llada2": ("bgpo-llada2-gsm8k", "LLaDA2.0-mini")}
DARE_REFERENCE = {"bidirectional": "~4x (DARE, MDLM RL pipeline)", "block_causal": ">14x (DARE, BDLM RL pipeline)"}
PATHS = ("plain", "fast")
TIMES = ("time_rollout_s", "time_prepare_s", "time_update_s", "time_step_s")


def path_settings(train, pinned_moe: str, path: str) -> tuple[Any, str]:
    """(TrainSettings, model.moe) of one path: `fast` is the recipe as pinned (its rollout cache, packing, chunked
    head and `model.moe`), `plain` switches every speed setting off (no cache, padded, full logits, the expert
    loop)."""
    if path == "fast":
        return train, pinned_moe
    rollout = train.rollout.model_copy(update={"extra": {**train.rollout.extra, "use_cache": "none"}})
    return train.model_copy(update={"rollout": rollout, "packing": False, "lm_head_chunk_tokens": None}), "loop"


def shrunk_recipe(train, *, block_diffusion: bool, prompts: int, group: int, gen_length: int, steps: int):
    """The paper TrainSettings at CPU size (module doc): only sizes change, the plug-in's settings do not. Block
    diffusion counts steps per block (kept); an MDLM keeps its steps per generated token, a whole number per block."""
    rollout = train.rollout
    block = min(rollout.block_length, gen_length) if rollout.block_length else None
    if block and gen_length % block:
        block = gen_length
    new_steps = rollout.steps
    if not block_diffusion:
        blocks = gen_length // block if block else 1
        new_steps = max(blocks, round(rollout.steps * gen_length / rollout.gen_length))
        new_steps -= new_steps % blocks
    rollout = rollout.model_copy(update={"gen_length": gen_length, "block_length": block, "steps": new_steps})
    return train.model_copy(update={"rollout": rollout, "steps": steps + 1, "epochs": None, "batch_prompts": prompts,
                                    "group_size": group, "checkpoint_every": None, "eval_every": None,
                                    "max_prompt_length": None})


def measure_family(family: str, *, layers: int, hidden: int, prompts: int, group: int, gen_length: int, steps: int,
                   dtype: str, device: str, attention: str, data: str | None, workdir: Path) -> list[dict[str, Any]]:
    """Both paths of one family (module doc), plain first; one row per path."""
    import torch

    from dare_bench.bench.packing import gsm8k_file
    from dare_bench.catalogue import backbone as backbone_spec
    from dare_bench.models import load_pretrained, load_tokenizer
    from dare_bench.models.moe import moe_blocks
    from dare_bench.models.shrink import shrink_checkpoint
    from dare_bench.pipeline.plan import _plugin_name
    from dare_bench.registry import load_registry
    from dare_bench.trainers.loop import RLRunOptions, load_train_items, train_rl

    entry, real = FAMILIES[family]
    cfg = load_registry().get(entry).resolve("paper")
    kind = backbone_spec(cfg.backbone).attention
    train = shrunk_recipe(cfg.profile.train, block_diffusion=kind == "block_causal", prompts=prompts, group=group,
                          gen_length=gen_length, steps=steps)
    ckpt = workdir / family
    shrink_checkpoint(real, ckpt, layers=layers, hidden=hidden, seed=0, dtype="float32")
    tokenizer = load_tokenizer(ckpt)
    task = cfg.run_task()
    items = load_train_items(task, [str(gsm8k_file(data))])[: prompts * (steps + 1)]  # one batch per RL step
    prompt_tokens = _mean_prompt_tokens(task, items[:prompts], tokenizer)
    rows = []
    for path in PATHS:
        settings, moe = path_settings(train, cfg.profile.model.moe, path)
        torch.manual_seed(0)
        model = load_pretrained(ckpt, dtype="float32", device=device, attention=attention, moe=moe)
        out = train_rl(model, tokenizer, task, _plugin_name(cfg.algorithm), settings,
                       RLRunOptions(seed=0, progress=False, items=items, prompt_template=tokenizer,
                                    grader=cfg.grader, compute_dtype=None if dtype == "float32" else dtype))
        timed = out.history[1:]  # step 1 warms up (allocator, kernels, the prompt cache)
        # what the sampler ran: a block-diffusion rollout without the setting uses its default, the exact cache
        cache = settings.rollout.extra.get("use_cache") or ("exact" if kind == "block_causal" else "none")
        row = {"family": family, "entry": entry, "algorithm": cfg.algorithm, "path": path,
               "moe": moe if moe_blocks(model) else "dense", "use_cache": cache, "packing": bool(settings.packing),
               "lm_head_chunk_tokens": settings.lm_head_chunk_tokens,
               "attention_kind": kind,
               "rollout_forwards": statistics.median(h["rollout_forwards"] for h in timed),
               "tokens_per_forward": statistics.median(h["tokens_per_forward"] for h in timed),
               "completion_tokens": statistics.median(h["completion_tokens"] for h in timed),
               "prompt_tokens": prompt_tokens}
        row.update({k: statistics.median(h[k] for h in timed) for k in TIMES})
        rows.append(row)
        del model, out
    return rows


def _mean_prompt_tokens(task, items, tokenizer) -> float:
    from dare_bench.trainers.loop import encode

    return sum(len(encode(tokenizer, task.format_prompt(i, tokenizer))) for i in items) / len(items)


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """plain / fast seconds per part of the step, per family (> 1: the fast path is faster)."""
    out = []
    for family in dict.fromkeys(r["family"] for r in rows):
        plain, fast = (next(r for r in rows if r["family"] == family and r["path"] == p) for p in PATHS)
        out.append({"family": family, "attention_kind": plain["attention_kind"],
                    **{k.replace("time_", "").replace("_s", ""): plain[k] / fast[k] for k in TIMES},
                    "dare_reference": DARE_REFERENCE[plain["attention_kind"]]})
    return out


def run_benchmark(families: list[str], *, layers: int = 2, hidden: int = 256, prompts: int = 1, group: int = 2,
                  gen_length: int = 32, steps: int = 1, dtype: str = "bfloat16", device: str = "cpu",
                  attention: str = "sdpa", data: str | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dare-bench-rlstep-") as tmp:
        rows = [r for f in families for r in measure_family(
            f, layers=layers, hidden=hidden, prompts=prompts, group=group, gen_length=gen_length, steps=steps,
            dtype=dtype, device=device, attention=attention, data=data, workdir=Path(tmp))]
    settings = {"layers": layers, "hidden": hidden, "prompts": prompts, "group": group, "gen_length": gen_length,
                "timed_steps": steps, "dtype": dtype, "device": device, "attention": attention}
    return {"rows": rows, "ratios": ratios(rows), "settings": settings}


def _table(out: dict[str, Any]) -> str:
    s = out["settings"]
    lines = [f"one RL step of each family's paper recipe on a shrunk checkpoint ({s['layers']} layers, hidden "
             f"{s['hidden']}, real vocabulary), {s['prompts']} prompts x {s['group']} completions of "
             f"{s['gen_length']} tokens, {s['dtype']} compute on {s['device']} / {s['attention']}; median of "
             f"{s['timed_steps']} timed steps",
             f"{'family':7} {'entry':18} {'path':5} {'cache':6} {'pack':4} {'head':5} {'moe':7} {'prompt':>6} "
             f"{'rollout s':>9} {'prepare s':>9} {'update s':>9} {'step s':>8} {'fwd':>5} {'tok/fwd':>7}"]
    for r in out["rows"]:
        lines.append(f"{r['family']:7} {r['entry']:18} {r['path']:5} {str(r['use_cache']):6} "
                     f"{'on' if r['packing'] else 'off':4} {str(r['lm_head_chunk_tokens'] or 'full'):5} "
                     f"{r['moe']:7} {r['prompt_tokens']:6.0f} {r['time_rollout_s']:9.2f} {r['time_prepare_s']:9.2f} "
                     f"{r['time_update_s']:9.2f} {r['time_step_s']:8.2f} {r['rollout_forwards']:5.0f} "
                     f"{r['tokens_per_forward']:7.2f}")
    lines.append("speed-up, plain / fast seconds:")
    for r in out["ratios"]:
        lines.append(f"  {r['family']:7} rollout {r['rollout']:5.2f}x  prepare {r['prepare']:5.2f}x  update "
                     f"{r['update']:5.2f}x  step {r['step']:5.2f}x   (beside {r['dare_reference']})")
    return "\n".join(lines)


def register(group: typer.Typer) -> None:
    @group.command("rlstep")
    def rlstep(
        families: str = typer.Option("llada,sdar", "--families", help=f"comma-separated: {', '.join(FAMILIES)}"),
        layers: int = typer.Option(2, "--layers", help="decoder layers of the shrunk checkpoint"),
        hidden: int = typer.Option(256, "--hidden", help="hidden size of the shrunk checkpoint"),
        prompts: int = typer.Option(1, "--prompts", help="prompts per RL step"),
        group_size: int = typer.Option(2, "--group", help="completions per prompt"),
        gen_length: int = typer.Option(32, "--gen-length", help="rollout tokens (the recipes': 256-512; CPU-sized "
                                                                "default: the plain MDLM path computes every "
                                                                "position's logits at every step)"),
        steps: int = typer.Option(1, "--steps", help="timed RL steps per path (after one warm-up step)"),
        dtype: str = typer.Option("bfloat16", "--dtype", help="compute dtype of both paths: bfloat16 | float32"),
        device: str = typer.Option("cpu", "--device", help="cpu | cuda"),
        attention: str = typer.Option("sdpa", "--attention", help="sdpa | flash_attn (GPU) | flex (GPU)"),
        threads: Optional[int] = typer.Option(None, "--threads", help="torch CPU threads (default: torch's)"),
        data: Optional[str] = typer.Option(None, "--data", help="the gsm8k parquet (default: "
                                                                "$DARE_BENCH_DATA/rl/test/gsm8k_1.parquet)"),
        as_json: bool = typer.Option(False, "--json", help="print the JSON result only"),
    ) -> None:
        """One full RL step (rollout + prepare + update) of a paper recipe on a shrunk checkpoint, plain vs fast."""
        from dare_bench.errors import ConfigError

        chosen = [f for f in families.split(",") if f]
        if not chosen or any(f not in FAMILIES for f in chosen):
            raise ConfigError(f"--families must list some of {', '.join(FAMILIES)}, got {families!r}")
        if dtype not in ("bfloat16", "float32"):
            raise ConfigError(f"--dtype must be bfloat16 or float32, got {dtype!r}")
        if min(layers, prompts, group_size, steps) < 1 or gen_length < 8 or hidden < 8:
            raise ConfigError("need --layers, --prompts, --group, --steps >= 1, --gen-length >= 8, --hidden >= 8")
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        out = run_benchmark(chosen, layers=layers, hidden=hidden, prompts=prompts, group=group_size,
                            gen_length=gen_length, steps=steps, dtype=dtype, device=device, attention=attention,
                            data=data)
        typer.echo(json.dumps(out) if as_json else _table(out))
