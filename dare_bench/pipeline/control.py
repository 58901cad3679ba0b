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
"""

from __future__ import annotations

import math

from dare_bench.errors import ConfigError, DataError


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


__all__ = ["control_name", "control_overrides", "run_control"]
