"""`dare-bench bench tinyrl`: the RL stage of a tiny reproduction, as pinned vs with each candidate speed setting.

Issue #16 item 4 asks for a tiny RL stage fast enough for a grid. A profile of `d1-llada-sudoku` at tiny scale
(py-spy, one thread) put 83 % of the RL stage in the rollout's forwards (`Linear.forward` alone 61 %: the vanilla
sampler recomputes the whole canvas, prompt included, at every denoising step) and 17 % in the update. The paths
measured here: the reference, what the pinned profile does now, and candidates that are each a setting a
reproduction config already has (so a run that uses one records it):

- `reference`: the tiny profile with every rollout row computed (`computing_every_row`): the path every grid
  run before session 26 took;
- `pinned`: the tiny profile as it is (float32, the vanilla sampler), whose sampler forwards compute identical
  canvas rows once (diffusion/sampling/core.py: the group's copies of a prompt start identical, and a trained
  policy sampling at T < 1 keeps many of them identical for many steps). No setting changes: the logits are the
  same bits on CPU, so the policy after the timed steps must equal the reference path's (`same_as_reference`);
- `bf16`: `model.dtype=bfloat16`: fp32 master weights, bf16 autocast for rollouts and log-prob forwards
  (trainers/precision.py; AVX512-bf16 or AMX on x86 CPUs);
- `dual`: Fast-dLLM's dual cache for MDLM rollouts (`train.rollout.extra.use_cache=dual`,
  `train.rollout.block_length=--block`): the prompt and the other blocks' keys / values are reused within a block.
  It is Fast-dLLM's approximation: other tokens than the vanilla sampler, as DARE's own rollouts accept;
- `fast`: `bf16` and `dual` together;
- `threshold`: `bf16` and Fast-dLLM's confidence-threshold parallel decoding (`train.rollout.threshold=--threshold`,
  default 0.9): every masked token whose confidence passes the threshold is unmasked at once (at least one per
  forward), over the profile's own canvas and blocks, no cache. Fewer forwards per rollout, the same low-confidence
  order; also DARE's own rollout setting.
Block-diffusion backbones (SDAR, LLaDA2) already decode their tiny rollouts with the exact block KV cache, so only
`reference`, `pinned`, `bf16` and `threshold` apply to them. The cache's forwards share rows on SDAR (each row's
canvas tells its cache state); LLaDA2's routed experts never share (pinned = reference there), nor does bf16: rows
are shared only where their bits cannot depend on the batch (diffusion/sampling/core.py `shared_rows_forward`).

Protocol, all in one process, `--threads` torch threads (default 1, the tiny default): the entry's tiny profile, its
plug-in settings unchanged; the policy is the tiny preset initialised from `base.seed` and SFT-trained for
`--base-steps` steps (0: the initialisation). The fixed-step samplers run the same forwards whatever the weights,
but the rows they share, and the `threshold` path's forward count, grow as the policy grows confident: time them
from a trained policy (`--base-steps` near the entry's base step: 260 for LLaDA sudoku).
`--steps` timed RL steps after one warm-up step, each on the profile's batch (`batch_prompts` x `group_size`); no
evaluation or checkpoints. Reported: the median seconds of rollout, prepare, update and the whole step per path, the
rollout forwards per step, the share of rollout rows shared, whether the policy equals the reference path's after
the timed steps, and reference (else pinned) / path ratios. Whether a path that changes numerics keeps a learning
check's result is not measured here: that needs the check's seeds run on it
(`dare-bench reproduce d1-llada-sudoku --seed S model.dtype=bfloat16 train.rollout.threshold=0.9`).

Measured (session 26, one thread, one other tiny run on the 2 cores; `--paths reference,pinned,bf16 --base-steps
260`, d1-llada-sudoku): step 5.54 s reference, 1.68 s pinned (3.30x; rollout 4.74x, 80 % of rollout rows shared;
the same policy after the timed steps, bit for bit), 1.55 s bf16 (3.58x, rows then shared under bf16 too). Session
27, bf16 no longer sharing rows (two other tiny runs on the 2 cores): 8.46 s reference, 2.56 s pinned (3.30x;
rollout 4.59x, 80 % shared, the same policy), 5.42 s bf16 (1.56x). SDAR under the exact block cache
(`tracerl-sdar-sudoku --paths reference,pinned --base-steps 190`): 61 % of rollout rows shared, rollout 0.71 ->
0.45 s (1.59x), the same policy bit for bit, but the step stays 23.3 s: TraceRL's prepare (12.2 s) and update
(10.2 s) replay the trajectory, and the rollout is 3 % of it. The pinned path changes no setting and no
bit, so every learning-check result holds on it: rerunning bundle cells gives their finals exactly (the session-26
note). Session 22, before rows were shared (`--paths pinned,bf16,threshold`): step 5.07 s pinned, 2.46 s bf16
(2.06x), 1.35 s threshold (3.75x; rollout 4.84x, 11 forwards instead of 24). The learning checks on the threshold
path (`reproduce NAME --seed S model.dtype=bfloat16 train.rollout.threshold=0.9`, the shared base at 20.2 %, 3 seeds,
exact solve on the 500 test puzzles, mean +- 95 % CI; pinned from the bundle):
    d1            .232 .224 .234 -> .230 +- .013   pinned .226 +- .023   whole reproduce 100-112 s vs ~330 s
    coupled-grpo  .248 .290 .254 -> .264 +- .056   pinned .273 +- .022
    bgpo          .224 .262 .224 -> .237 +- .055   pinned .267 +- .022
    cj-grpo       .270 .234 .296 -> .267 +- .077   pinned .310 +- .026
d1 and Coupled-GRPO keep their result; BGPO and CJ-GRPO lose 3-4 points and their gain over the base is no longer
outside the 3-seed CI, and the row's order changes. So the threshold path is not pinned: it is an override for a
quick look (runs marked modified), not the grid's recipe. bf16 also needs bf16 hardware (AMX / AVX512-bf16): where
it is emulated it is slower than float32.

    dare-bench bench tinyrl                                   # d1-llada-sudoku, every path, 3 timed steps
    dare-bench bench tinyrl --paths reference,pinned --base-steps 260      # issue #16 item 4's ratio
    dare-bench bench tinyrl --paths pinned,threshold --base-steps 260
    dare-bench bench tinyrl bgpo-sdar-sudoku --steps 2 --json
    dare-bench bench tinyrl d1-llada-arith --block 8 --base-steps 100

Output: a table; `--json` prints `{"rows": [...], "ratios": [...], "settings": {...}}`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import statistics
from typing import Any

import typer

PATHS = ("reference", "pinned", "bf16", "dual", "fast", "threshold")
TIMES = ("time_rollout_s", "time_prepare_s", "time_update_s", "time_step_s")


def path_train(train, path: str, *, block: int, threshold: float = 0.9):
    """(TrainSettings, compute dtype) of one path (module doc)."""
    from dare_bench.errors import ConfigError

    rollout = train.rollout
    if path == "threshold":
        rollout = rollout.model_copy(update={"threshold": threshold})
    if path in ("dual", "fast"):
        length = rollout.block_length or block
        if rollout.gen_length % length:
            raise ConfigError(f"--block {length} does not divide the rollout's gen_length {rollout.gen_length}")
        blocks = rollout.gen_length // length
        steps = max(blocks, rollout.steps - rollout.steps % blocks)  # a whole number of steps per block
        rollout = rollout.model_copy(update={"block_length": length, "steps": steps,
                                             "extra": {**rollout.extra, "use_cache": "dual"}})
    train = train.model_copy(update={"rollout": rollout, "checkpoint_every": None, "eval_every": None})
    return train, ("bfloat16" if path in ("bf16", "fast", "threshold") else None)


def _same_weights(a, b) -> bool:
    import torch

    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def measure(entry: str, *, scale: str = "tiny", steps: int = 3, block: int = 8, base_steps: int = 0,
            paths: tuple[str, ...] = PATHS, threshold: float = 0.9) -> dict[str, Any]:
    import torch

    from dare_bench.catalogue import backbone as backbone_spec
    from dare_bench.diffusion.sampling.core import computing_every_row
    from dare_bench.errors import ConfigError
    from dare_bench.pipeline.base_cache import base_sft_setup
    from dare_bench.pipeline.plan import _plugin_name, _train_items_needed
    from dare_bench.registry import load_registry
    from dare_bench.tasks.mixtures import load_mixture
    from dare_bench.tasks.tokenizer import build_task_tokenizer
    from dare_bench.trainers.loop import RLRunOptions, train_rl
    from dare_bench.trainers.sft import SFTRunOptions, train_sft

    cfg = load_registry().get(entry).resolve(scale)
    train = cfg.profile.train
    if train.kind != "rl":
        raise ConfigError(f"{entry}: train.kind is {train.kind!r}; `bench tinyrl` times an RL stage")
    if cfg.profile.model.preset is None:
        raise ConfigError(f"{entry} at {scale} has no tiny preset; `bench tinyrl` runs tiny / micro profiles")
    block_causal = backbone_spec(cfg.backbone).attention == "block_causal"
    if block_causal:  # their tiny rollouts already use the exact block cache
        paths = tuple(p for p in paths if p in ("reference", "pinned", "bf16", "threshold"))
    task = cfg.run_task()
    tokenizer = build_task_tokenizer(cfg.task)
    items = list(load_mixture(task, train.data, _train_items_needed(cfg)))  # the run's own training items
    # a bad --block fails before any work
    plans = {path: path_train(train, path, block=block, threshold=threshold) for path in paths}
    base_model, examples, sft_cfg = base_sft_setup(cfg, task, tokenizer, items, steps=max(base_steps, 1))
    if base_steps:
        train_sft(base_model, examples, sft_cfg, SFTRunOptions(progress=False))
    rows = []
    reference_policy = None
    for path, (settings, dtype) in plans.items():
        settings = settings.model_copy(update={"steps": steps + 1})
        policy = copy.deepcopy(base_model)  # every path starts from the same weights
        with computing_every_row() if path == "reference" else contextlib.nullcontext():
            out = train_rl(policy, tokenizer, task, _plugin_name(cfg.algorithm), settings,
                           RLRunOptions(seed=0, progress=False, items=items, prompt_template="plain",
                                        grader=cfg.grader, compute_dtype=dtype))
        timed = out.history[1:]  # step 1 warms up (allocator, kernels, the prompt cache)
        row = {"entry": entry, "path": path, "dtype": dtype or "float32",
               "use_cache": settings.rollout.extra.get("use_cache") or ("exact" if block_causal else "none"),
               "block_length": settings.rollout.block_length, "rollout_steps": settings.rollout.steps,
               "threshold": settings.rollout.threshold,
               "rollout_forwards": statistics.median(h["rollout_forwards"] for h in timed),
               "rows_per_step": train.batch_prompts * train.group_size, "threads": torch.get_num_threads(),
               "reward_mean": statistics.mean(h["reward_mean"] for h in timed),
               # the share of rollout rows an identical row's forward served
               "shared_rows": (sum(h["rollout_shared_rows"] for h in timed)
                               / max(sum(h["rollout_row_forwards"] for h in timed), 1.0)),
               "same_as_reference": None}
        row.update({k: statistics.median(h[k] for h in timed) for k in TIMES})
        if path == "reference":
            reference_policy = policy
        elif reference_policy is not None:
            row["same_as_reference"] = _same_weights(policy, reference_policy)
        rows.append(row)
        del out
    # ratios against the slowest baseline measured: the reference path, else the pinned one
    base = next((r for name in ("reference", "pinned") for r in rows if r["path"] == name), None)
    ratios = [] if base is None else [
        {"path": r["path"], "over": base["path"],
         **{k.replace("time_", "").replace("_s", ""): base[k] / r[k] for k in TIMES}}
        for r in rows if r is not base]
    settings_out = {"entry": entry, "scale": scale, "timed_steps": steps, "block": block, "base_steps": base_steps,
                    "threshold": threshold,
                    "threads": torch.get_num_threads()}
    return {"rows": rows, "ratios": ratios, "settings": settings_out}


def _table(out: dict[str, Any]) -> str:
    s = out["settings"]
    lines = [f"the RL stage of {s['entry']} at {s['scale']} scale: median of {s['timed_steps']} timed steps after one "
             f"warm-up, {s['threads']} thread(s), policy = the preset after {s['base_steps']} SFT steps",
             f"{'path':9} {'dtype':9} {'cache':6} {'block':>5} {'steps':>5} {'thresh':>6} {'fwds':>5} {'rows':>4} "
             f"{'shared':>6} {'rollout s':>9} {'prepare s':>9} {'update s':>9} {'step s':>8} {'= ref':>5}"]
    for r in out["rows"]:
        lines.append(f"{r['path']:9} {r['dtype']:9} {r['use_cache']:6} {str(r['block_length'] or '-'):>5} "
                     f"{r['rollout_steps']:5d} {str(r['threshold'] or '-'):>6} {r['rollout_forwards']:5.0f} "
                     f"{r['rows_per_step']:4d} {r['shared_rows']:6.1%} {r['time_rollout_s']:9.2f} "
                     f"{r['time_prepare_s']:9.2f} {r['time_update_s']:9.2f} {r['time_step_s']:8.2f} "
                     f"{ {True: 'yes', False: 'no', None: '-'}[r['same_as_reference']]:>5}")
    if out["ratios"]:
        lines.append(f"speed-up, {out['ratios'][0]['over']} / path seconds "
                     "(= ref: the policy after the timed steps equals the reference path's, bit for bit):")
        for r in out["ratios"]:
            lines.append(f"  {r['path']:9} rollout {r['rollout']:5.2f}x  prepare {r['prepare']:5.2f}x  update "
                         f"{r['update']:5.2f}x  step {r['step']:5.2f}x")
    return "\n".join(lines)


def register(group: typer.Typer) -> None:
    @group.command("tinyrl")
    def tinyrl(
        entry: str = typer.Argument("d1-llada-sudoku", help="an RL reproduction with a tiny (or micro) profile"),
        scale: str = typer.Option("tiny", "--scale", help="tiny | micro"),
        steps: int = typer.Option(3, "--steps", min=1, help="timed RL steps per path (after one warm-up step)"),
        block: int = typer.Option(8, "--block", min=1, help="rollout block length of the dual-cache paths when the "
                                                            "profile has none"),
        base_steps: int = typer.Option(0, "--base-steps", min=0, help="SFT steps before the RL stage (0: the "
                                                                      "initialised preset)"),
        paths: str = typer.Option(",".join(PATHS), "--paths", help=f"comma-separated: {', '.join(PATHS)}"),
        threads: int = typer.Option(1, "--threads", min=1, help="torch CPU threads"),
        threshold: float = typer.Option(0.9, "--threshold", min=0.0, max=1.0,
                                        help="confidence threshold of the `threshold` path's rollouts"),
        as_json: bool = typer.Option(False, "--json", help="print JSON"),
    ):
        """The RL stage of a tiny reproduction: every row computed vs pinned (shared rows) vs bf16 / Fast-dLLM
        dual-cache / threshold rollouts (ratios)."""
        import torch

        from dare_bench.errors import ConfigError

        chosen = tuple(p.strip() for p in paths.split(",") if p.strip())
        unknown = [p for p in chosen if p not in PATHS]
        if unknown or not chosen:
            raise ConfigError(f"--paths: unknown {unknown or 'empty'}; choose from {', '.join(PATHS)}")
        if scale not in ("tiny", "micro"):
            raise ConfigError(f"--scale {scale!r}: `bench tinyrl` runs tiny or micro profiles")
        torch.set_num_threads(threads)
        out = measure(entry, scale=scale, steps=steps, block=block, base_steps=base_steps, paths=chosen,
                      threshold=threshold)
        typer.echo(json.dumps(out, indent=2) if as_json else _table(out))


__all__ = ["PATHS", "measure", "path_train", "register"]
