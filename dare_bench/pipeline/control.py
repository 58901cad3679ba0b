"""The compute-matched SFT control of an RL run (issue #16): an SFT continuation from the same base, for the same
counted training compute, stored linked to its RL run. At tiny scale 75 more SFT steps can move Sudoku by tens of
points while 50 RL steps move it by a few; RL - control says whether RL beat spending its compute on SFT.

    dare-bench reproduce d1-llada-sudoku --control          # each seed's RL run, then its control
    dare-bench reproduce d1-llada-sudoku --scale micro --seed 0 --control --json

    from dare_bench.pipeline.control import run_control
    control = run_control(rl_result, log=print, progress=False)   # a ReproduceResult of sft-<backbone>-<task>

The control is the registry's `sft-<backbone>-<task>` entry at the RL run's scale and seed (same base recipe, so the
same cached base: the two base weight hashes are checked equal), with `train.compute_budget_flops` = the FLOPs the
RL run counted (trainers/compute.py: rollouts, likelihoods, reference forwards and backward passes, by one rule)
and `train.steps` a cap it cannot reach first: each SFT step trains at least batch x answer-length tokens.

Controls of one row share a trajectory. The controls of every RL algorithm on one base and seed are the same SFT run
stopped at different budgets: a length-free LR schedule, batches and noise drawn from the seed, the same start. So a
budgeted SFT run keeps its final trainer state under `DARE_BENCH_HOME/control-stretches/<trajectory>/` and a later
one with a larger budget continues from the longest kept stretch below it (`TrainRunOptions.continue_from`) instead
of training from step 0: the same weights and step metrics bit for bit (tests/pipeline/test_control.py), in the time
of the difference. A budget that stops where a kept stretch ends (equal budgets: RL algorithms that count the same
FLOPs) takes that stretch with no step at all. The trajectory key (`trajectory_key`) holds everything that moves the
bits: the recipe without its length, seed, base weights, torch version, thread count and device. The run record's
compute says which stretch it continued (`continued_from`). `dare-bench sweep --controls` runs every control after
the RL runs, in order of budget, so each continues the previous one. The folder is a cache: deleting it costs time,
not results.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dare_bench.errors import ConfigError, DataError

STRETCHES = "control-stretches"  # under DARE_BENCH_HOME
STRETCH_FILE = "stretch.json"  # beside the trainer checkpoint: where the stretch ends and what it counted


def control_name(backbone: str, task: str) -> str:
    return f"sft-{backbone}-{task}"


def control_overrides(compute: dict, sft_cfg) -> list[str]:
    """`train.compute_budget_flops` = the RL run's count, `train.steps` = a cap above the steps it can take."""
    from dare_bench.pipeline.plan import _answer_length

    flops, per_token = float(compute["flops"]), float(compute["flops_per_token"])
    batch = sft_cfg.profile.train.batch_prompts or 32
    least_per_step = 3 * per_token * batch * _answer_length(sft_cfg)  # forward + backward of the answer tokens alone
    cap = math.ceil(flops / least_per_step) + 1
    return [f"train.compute_budget_flops={flops!r}", f"train.steps={cap}"]


def run_control(rl, *, db: str | None = None, log=print, progress: bool = True, force: bool = False):
    """The control of `rl` (a finished or skipped RL `ReproduceResult` with its store record)."""
    from dare_bench.pipeline import reproduce
    from dare_bench.pipeline.plan import resolve
    from dare_bench.registry import get
    from dare_bench.store import Store

    store = Store(rl.db or db)
    run = store.get_run(rl.run_id)
    if run["config"]["profile"]["train"]["kind"] != "rl":
        raise ConfigError(f"{rl.name}: --control applies to RL reproductions (this one trains with "
                          f"kind {run['config']['profile']['train']['kind']})")
    compute = run.get("compute") or {}
    if not compute.get("flops"):
        raise DataError(f"run {rl.run_id} ({rl.name}) has no compute record (recorded before controls existed): "
                        "run it again with --force to count it")
    name = control_name(run["backbone"], run["task"])
    try:
        get(name)
    except Exception:  # noqa: BLE001 - an unknown entry is the one error below
        raise ConfigError(f"{rl.name}: no {name} entry to control it with") from None
    _, sft_cfg = resolve(name, run["scale"], [])
    overrides = control_overrides(compute, sft_cfg)
    log(f"control: {name} seed {run['seed']} for {compute['flops']:.3e} FLOPs (what {rl.name} counted)")
    control = reproduce(name, run["scale"], seed=run["seed"], db=store.url, overrides=overrides, force=force,
                        progress=progress, log=log, control_of=run["uid"])
    mine = store.get_run(control.run_id)
    if mine.get("base_sha256") != run.get("base_sha256"):
        # the control must start where the RL run did, or RL - control measures the bases too
        raise DataError(f"the control of run {rl.run_id} started from base {str(mine.get('base_sha256'))[:12]}, "
                        f"the RL run from {str(run.get('base_sha256'))[:12]}: the two entries' base recipes differ")
    return control


# ------------------------------------------------------------------------------- one trajectory, many budgets

@dataclass
class Stretch:
    """A kept end of a budgeted SFT run: its trainer checkpoint, step, meter summary and the run that wrote it."""

    checkpoint: Path
    step: int
    compute: dict[str, Any]
    run_uid: str | None
    flops_before: float | None = None  # the count before its last step: a budget in (flops_before, flops] ends here


def trajectory_key(cfg, seed: int, base_sha256: str, device: str) -> str:
    """What fixes a budgeted SFT run's trajectory apart from where it stops: the resolved recipe without its
    length (`train.steps`, `train.compute_budget_flops`), the seed, the base weights, and what moves the bits of a
    step (torch version, thread count, device)."""
    import hashlib

    import torch

    from dare_bench.config import canonical_json

    recipe = cfg.semantic_dict()
    for length in ("steps", "compute_budget_flops"):
        recipe["profile"]["train"].pop(length, None)
    key = {"recipe": recipe, "seed": int(seed), "base": base_sha256, "torch": torch.__version__,
           "threads": torch.get_num_threads(), "device": str(device)}
    return hashlib.sha256(canonical_json(key).encode()).hexdigest()


def stretches_dir(key: str) -> Path:
    from dare_bench.fileio import dare_bench_home

    return dare_bench_home() / STRETCHES / key[:32]


def kept_stretches(key: str) -> list[Stretch]:
    """The complete stretches kept for `key`, shortest first (an unreadable one is skipped: it is a cache)."""
    found = []
    root = stretches_dir(key)
    for sub in sorted(root.glob("step-*")) if root.is_dir() else []:
        try:
            meta = json.loads((sub / STRETCH_FILE).read_text())
            found.append(Stretch(sub, int(meta["step"]), dict(meta["compute"]), meta.get("run_uid"),
                                 meta.get("flops_before")))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(found, key=lambda s: s.step)


def longest_stretch_below(key: str, budget_flops: float) -> Stretch | None:
    """The kept stretch a run with `budget_flops` continues: the longest whose count is below the budget (a run
    from step 0 would have gone past its end)."""
    below = [s for s in kept_stretches(key) if float(s.compute["flops"]) < budget_flops]
    return below[-1] if below else None


def stretch_ending_at(key: str, budget_flops: float) -> Stretch | None:
    """A kept stretch that ends exactly where a run with `budget_flops` stops (the budget was not reached before
    its last step and is after it: equal budgets, e.g. two RL algorithms that count the same FLOPs). That run is
    this stretch: it needs no step."""
    for s in kept_stretches(key):
        if s.flops_before is not None and float(s.flops_before) < budget_flops <= float(s.compute["flops"]):
            return s
    return None


def keep_stretch(key: str, checkpoint: str | Path, step: int, compute: dict[str, Any], run_uid: str | None,
                 flops_before: float | None = None) -> Path:
    """Copy a finished budgeted run's final trainer checkpoint into the trajectory's stretches (atomically)."""
    from dare_bench.fileio import atomic_directory

    dest = stretches_dir(key) / f"step-{int(step):08d}"
    if dest.is_dir():
        return dest  # the same trajectory's same step: the same bits, already kept
    counts = {k: compute[k] for k in ("flops", "token_forwards", "grad_token_forwards", "flops_per_token")}
    with atomic_directory(dest) as tmp:
        shutil.copytree(checkpoint, tmp, dirs_exist_ok=True)
        (tmp / STRETCH_FILE).write_text(json.dumps({"step": int(step), "compute": counts, "run_uid": run_uid,
                                                  "flops_before": flops_before}) + "\n")
    return dest


__all__ = ["Stretch", "control_name", "control_overrides", "keep_stretch", "kept_stretches", "longest_stretch_below",
           "run_control", "stretch_ending_at", "stretches_dir", "trajectory_key"]
