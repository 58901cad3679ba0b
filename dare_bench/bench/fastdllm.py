"""`dare-bench bench fastdllm`: our cached LLaDA decoding against the official Fast-dLLM code, side by side.

Issue #15 item 6 asks for cached decoding ahead of the official code, not level with it, and a reproducible way to
measure that. This mode times both on one checkpoint, in one process, interleaved, and checks that they commit
the same tokens. The official code is not a dependency and is never copied here: you point `--official` at a clone
of NVlabs/Fast-dLLM and run the command in a virtual environment whose transformers the official model code
supports (it was written for 4.46):

    git clone https://github.com/NVlabs/Fast-dLLM /tmp/Fast-dLLM
    python -m venv /tmp/fastdllm-venv
    /tmp/fastdllm-venv/bin/pip install torch==2.13.0 transformers==4.46.3 einops accelerate -e .
    OMP_NUM_THREADS=1 /tmp/fastdllm-venv/bin/dare-bench bench fastdllm --official /tmp/Fast-dLLM --json

Protocol:
- The checkpoint: `--checkpoint DIR` (a LLaDA checkpoint in the official format), else a shrunk LLaDA-8B-Instruct
  (the real config and vocabulary, `--layers` x `--hidden`) with peaked random weights (bench/rollout.py
  `peaked_init`, so that confidences spread and threshold decoding commits several tokens in some forwards),
  saved to a temporary directory. Both sides load the same files: ours with `dare_bench.models.load_pretrained`,
  the official with `llada/model/modeling_llada.py`'s `LLaDAModelLM.from_pretrained` (float32, eval); their
  logits on one input are compared first.
- Settings: for each cache (prefix, dual) and each `--gen-lengths`, threshold decoding (`--threshold`) and the
  fixed schedule (steps = gen length), block 32, temperature 0; at `--batches` 1 and 8. The official cached
  generators take one prompt (`x = torch.full((1, ...))`), so at batch B the official side decodes the B prompts
  one after another, as a user of that code must; ours decodes them as one batch.
- Timing: `--rounds` rounds, each running ours and the official once on the same prompts, the order alternating
  between rounds; the median wall time of each. `--threads` torch threads (default 1). Reported: tokens/s of
  each, official seconds / our seconds, forwards of each, and whether every committed token is the same.

Where ours gains (the code is in diffusion/sampling/llada.py and models/base.py): at temperature 0 a step computes
the LM head and the float64 confidence softmax only at the positions it may commit, where the official code
computes them over its whole window (the whole canvas at each block's first step, the block and everything after
it under the prefix cache); the dual cache writes the block's keys / values in place, as the official does, and
keeps them post-RoPE (the official re-applies RoPE to every cached key at every step). A shrunk model's LM head is a
much larger share of a forward than in the 8B original, so these ratios are an upper bound of what an 8B model gains.
`--vocab N` builds the other extreme, a checkpoint whose layers are the bulk of a forward (e.g. `--layers 3 --hidden
1024 --vocab 4096`, 49M parameters, as in 8B where the head is ~7 % of a forward's FLOPs).

Measured (1 thread, machine shared with one training job, gen 128, identical tokens everywhere; at batch 1 equal
forwards):
- real vocabulary, 2 layers, hidden 256 (66.5M): prefix 4.97-7.75x, dual 2.36-3.77x the official tokens/s
  (batch 1 and 8, threshold and fixed schedule);
- vocabulary 4096, 3 layers, hidden 1024 (49.3M), fixed schedule: batch 1 dual 1.04x, prefix 1.07x; batch 8 dual
  1.47x (one batched call against eight). At batch 1 both sides run the same matmuls on the same rows; what ours
  drops (the head and softmax outside the committable positions, RoPE over the cache, the official per-position
  threshold loop) is a few per cent of such a forward, so >= 1.3x there would need less arithmetic, not less
  overhead. The one exact cut left is the last layer's queries / MLP at positions no step reads (at most 1 / layers
  of the work).

Output: a table; `--json` prints `{"rows": [...], "settings": {...}}`.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import typer

from dare_bench.errors import DareBenchError

CACHES = ("prefix", "dual")
BLOCK = 32


def load_official(official: str | Path):
    """(LLaDAModelLM class, generate module) of a Fast-dLLM clone; one DareBenchError naming what is missing."""
    import importlib

    root = Path(official).expanduser() / "llada"
    if not (root / "model" / "modeling_llada.py").is_file() or not (root / "generate.py").is_file():
        raise DareBenchError(f"--official {official}: no llada/model/modeling_llada.py and llada/generate.py "
                             "(a clone of https://github.com/NVlabs/Fast-dLLM)")
    sys.path.insert(0, str(root))
    _forget_official_modules()  # a module of that name imported before (another clone) would shadow this one
    try:
        modeling = importlib.import_module("model.modeling_llada")
        generate = importlib.import_module("generate")
    except Exception as exc:  # an import of research code fails in many ways (transformers API moves, einops)
        import transformers

        raise DareBenchError(f"the official Fast-dLLM code does not import here ({type(exc).__name__}: {exc}); run "
                             f"this in a venv with transformers 4.46 (this one has {transformers.__version__}), "
                             "see `dare-bench bench fastdllm --help`") from None
    finally:
        sys.path.remove(str(root))
        _forget_official_modules()  # the generic names `model` / `generate` stay out of sys.modules
    for name in ("generate_with_prefix_cache", "generate_with_dual_cache"):
        if not hasattr(generate, name):
            raise DareBenchError(f"--official {official}: llada/generate.py has no {name}")
    return modeling.LLaDAModelLM, generate


def _forget_official_modules() -> None:
    for name in [n for n in sys.modules if n in ("model", "generate") or n.startswith("model.")]:
        del sys.modules[name]


def write_checkpoint(out: Path, *, layers: int, hidden: int, seed: int, vocab: int | None = None) -> Path:
    """A shrunk LLaDA-8B-Instruct (real config; the real vocabulary, or `vocab` rows with the mask / eos ids at
    its end) with peaked random weights, saved to `out`."""
    import torch

    from dare_bench.bench.rollout import peaked_init
    from dare_bench.models.io import build_model
    from dare_bench.models.llada import adapt_vocab
    from dare_bench.models.real_configs import real_config
    from dare_bench.models.shrink import shrunk_config

    config = shrunk_config(real_config("LLaDA-8B-Instruct")[1], "llada", layers=layers, hidden=hidden)
    if vocab is not None:
        config = adapt_vocab(config, vocab_size=vocab, mask_token_id=vocab - 1, eos_token_id=vocab - 2,
                             pad_token_id=vocab - 2)
    model = build_model(config, device="cpu", dtype=torch.float32, source="bench fastdllm")
    peaked_init(model, seed=seed, head_scale=10.0)
    model.save_pretrained(out)
    return out


def _prompts(vocab: int, batch: int, length: int, special: set[int], seed: int):
    import torch

    ids = torch.randint(1, min(vocab, 100_000), (batch, length), generator=torch.Generator().manual_seed(seed))
    for bad in special:
        ids[ids == bad] = 1
    return ids


def measure(official: str | Path, *, checkpoint: str | None = None, layers: int = 2, hidden: int = 256,
            vocab: int | None = None, gen_lengths: tuple[int, ...] = (128,), batches: tuple[int, ...] = (1, 8),
            threshold: float = 0.9, prompt_length: int = 64, rounds: int = 3, seed: int = 0,
            echo=None) -> dict[str, Any]:
    import torch

    from dare_bench.diffusion.sampling import generate
    from dare_bench.models import load_pretrained

    official_cls, official_gen = load_official(official)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(checkpoint) if checkpoint else write_checkpoint(Path(tmp) / "llada", layers=layers,
                                                                    hidden=hidden, seed=seed, vocab=vocab)
        ours_model = load_pretrained(str(ckpt)).float().eval()
        if ours_model.family != "llada":
            raise DareBenchError(f"--checkpoint {ckpt}: a {ours_model.family} checkpoint; Fast-dLLM's cached "
                                 "generators here are LLaDA's")
        theirs_model = official_cls.from_pretrained(str(ckpt), torch_dtype=torch.float32).eval()
    traits = ours_model.traits
    vocab = int(ours_model.config.get("vocab_size") or ours_model.config["embedding_size"])
    special = {traits.mask_token_id, traits.eos_token_id, traits.pad_token_id}
    probe = _prompts(vocab, 1, prompt_length, special, seed)
    with torch.no_grad():
        logit_diff = float((ours_model(probe) - theirs_model(probe).logits).abs().max())
    rows: list[dict[str, Any]] = []
    for batch in batches:
        prompts = _prompts(vocab, batch, prompt_length, special, seed + batch)
        for gen_length in gen_lengths:
            for cache in CACHES:
                for schedule in ("threshold", "steps"):
                    thr = threshold if schedule == "threshold" else None
                    ours_kw = dict(gen_length=gen_length, block_length=BLOCK, use_cache=cache, threshold=thr,
                                   steps=gen_length)
                    fn = getattr(official_gen, f"generate_with_{cache}_cache")

                    def run_ours():
                        out = generate(ours_model, prompts, **ours_kw)
                        return out.sequences[:, out.prompt_length:], out.stats.forwards

                    def run_theirs():
                        seqs, nfe = [], 0
                        for row in prompts:  # the official generators take one prompt
                            x, n = fn(theirs_model, row[None], steps=gen_length, gen_length=gen_length,
                                      block_length=BLOCK, temperature=0.0, threshold=thr,
                                      mask_id=traits.mask_token_id)
                            seqs.append(x[:, prompt_length:])
                            nfe += n
                        return torch.cat(seqs), nfe

                    times: dict[str, list[float]] = {"ours": [], "official": []}
                    outputs: dict[str, Any] = {}
                    for r in range(rounds):
                        order = (("ours", run_ours), ("official", run_theirs))
                        for name, fn_run in (order if r % 2 == 0 else order[::-1]):
                            t0 = time.perf_counter()
                            outputs[name] = fn_run()
                            times[name].append(time.perf_counter() - t0)
                    ours_s, theirs_s = statistics.median(times["ours"]), statistics.median(times["official"])
                    tokens = batch * gen_length
                    row = {"cache": cache, "schedule": schedule, "batch": batch, "gen_length": gen_length,
                           "ours_tokens_per_second": tokens / ours_s,
                           "official_tokens_per_second": tokens / theirs_s,
                           "speedup": theirs_s / ours_s,
                           "ours_forwards": outputs["ours"][1], "official_forwards": outputs["official"][1],
                           "same_tokens": bool(torch.equal(outputs["ours"][0], outputs["official"][0]))}
                    rows.append(row)
                    if echo is not None:
                        echo(row)
    return {"rows": rows, "settings": {
        "checkpoint": checkpoint or (f"shrunk LLaDA-8B-Instruct, {layers} layers, hidden {hidden}, "
                                     f"{'the real vocabulary' if vocab is None else f'vocabulary {vocab}'}, "
                                     "peaked init"),
        "parameters": ours_model.num_parameters(), "prompt_length": prompt_length, "block_length": BLOCK,
        "threshold": threshold, "rounds": rounds, "threads": torch.get_num_threads(),
        "max_abs_logit_difference": logit_diff}}


def _table(out: dict[str, Any]) -> str:
    s = out["settings"]
    lines = [f"{s['checkpoint']} ({s['parameters'] / 1e6:.1f}M parameters), prompt {s['prompt_length']}, block "
             f"{s['block_length']}, {s['threads']} thread(s), median of {s['rounds']} interleaved rounds; "
             f"max |logit difference| {s['max_abs_logit_difference']:.1e}",
             f"{'cache':<7}{'schedule':<10}{'batch':>6}{'gen':>6}{'ours tok/s':>12}{'official':>10}{'speed-up':>10}"
             f"{'fwd ours/off':>14}{'same tokens':>13}"]
    for r in out["rows"]:
        lines.append(f"{r['cache']:<7}{r['schedule']:<10}{r['batch']:>6}{r['gen_length']:>6}"
                     f"{r['ours_tokens_per_second']:>12.1f}{r['official_tokens_per_second']:>10.1f}"
                     f"{r['speedup']:>9.2f}x{r['ours_forwards']:>7}/{r['official_forwards']:<6}"
                     f"{'yes' if r['same_tokens'] else 'NO':>13}")
    return "\n".join(lines)


def register(group: typer.Typer) -> None:
    @group.command("fastdllm")
    def fastdllm(
        official: str = typer.Option(..., "--official", help="a clone of NVlabs/Fast-dLLM (see --help's venv)"),
        checkpoint: str = typer.Option(None, "--checkpoint", help="a LLaDA checkpoint dir (default: a shrunk "
                                                                  "LLaDA-8B-Instruct with peaked random weights)"),
        layers: int = typer.Option(2, "--layers", min=1, help="layers of the shrunk checkpoint"),
        hidden: int = typer.Option(256, "--hidden", min=128, help="hidden size of the shrunk checkpoint"),
        vocab: int = typer.Option(None, "--vocab", min=16, help="vocabulary rows of the shrunk checkpoint (default: "
                                                                "the real 126,464; a small one makes the layers, "
                                                                "not the LM head, the bulk of a forward, as in 8B)"),
        gen_lengths: str = typer.Option("128", "--gen-lengths", help="comma-separated generation lengths "
                                                                     "(multiples of 32)"),
        batches: str = typer.Option("1,8", "--batches", help="comma-separated batch sizes"),
        threshold: float = typer.Option(0.9, "--threshold", min=0.0, max=1.0, help="threshold decoding's value"),
        rounds: int = typer.Option(3, "--rounds", min=1, help="interleaved timing rounds (the median is kept)"),
        threads: int = typer.Option(1, "--threads", min=1, help="torch CPU threads"),
        as_json: bool = typer.Option(False, "--json", help="print JSON"),
    ):
        """Our cached LLaDA decoding vs the official Fast-dLLM code on one checkpoint: tokens/s, same tokens."""
        import torch

        from dare_bench.bench.rollout import _csv

        lengths, sizes = _csv(gen_lengths, int, "gen-lengths"), _csv(batches, int, "batches")
        bad = [g for g in lengths if g <= 0 or g % BLOCK]
        if any(b < 1 for b in sizes):
            raise DareBenchError(f"--batches {sizes}: each must be >= 1")
        if bad:
            raise DareBenchError(f"--gen-lengths {bad}: each must be a positive multiple of the block length {BLOCK}")
        if checkpoint and vocab is not None:
            raise DareBenchError("--vocab shapes the shrunk checkpoint; it does not apply to --checkpoint")
        torch.set_num_threads(threads)

        def progress(row):  # a run takes minutes: one line per setting on stderr, the table at the end
            typer.echo(f"{row['cache']} {row['schedule']} batch {row['batch']} gen {row['gen_length']}: "
                       f"{row['speedup']:.2f}x", err=True)

        out = measure(official, checkpoint=checkpoint, layers=layers, hidden=hidden, vocab=vocab,
                      gen_lengths=tuple(lengths), batches=tuple(sizes), threshold=threshold, rounds=rounds,
                      echo=progress)
        typer.echo(json.dumps(out, indent=2) if as_json else _table(out))


__all__ = ["CACHES", "load_official", "measure", "register", "write_checkpoint"]
