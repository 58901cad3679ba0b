"""`dare-bench bench alignment`: does each RL algorithm's gradient point where supervised learning would go?

On the shared SFT base of tiny / micro reproductions (same backbone and task), every named algorithm's plug-in takes
its gradient on the SAME rollout batches, and each gradient is compared (cosine) with the gradient of the SFT loss
on the gold answers of the same prompts. At the small learning rates RL needs at tiny scale, an algorithm whose
gradient is nearly orthogonal to the supervised direction barely moves the accuracy in 50 steps: this is the
diagnostic behind the learning-check explanations (docs/tiny-scale-feasibility.md measured d1's the same way).

    dare-bench bench alignment d1-llada-sudoku coupled-grpo-llada-sudoku cj-grpo-llada-sudoku spg-llada-sudoku \
        bgpo-llada-sudoku --scale tiny --batches 8          # ~5 min on one core; builds the base if not cached
    dare-bench bench alignment d1-llada-sudoku bgpo-llada-sudoku --scale micro --batches 2 --json

Each batch: `batch_prompts` training prompts × `group_size` rollouts with the first reproduction's rollout sampler
(with a trajectory, for the algorithms that need one; a plug-in that generates its own rollouts, such as
d-TreeRPO's tree search, is refused). The SFT gradient averages `--sft-draws` noise draws of the
completion-only diffusion loss. Reported per algorithm: the mean single-batch cosine and the cosine of the gradients
summed over all batches (noise averages out of the sum). `--json` prints
`{"algorithms": {name: {"mean_cosine", "cosine_of_sums", "per_batch"}}, "mean_reward", "zero_std_groups",
"settings"}`.
"""

from __future__ import annotations

import json
from typing import Any

import typer


def _flat_grad(params) -> Any:
    import torch

    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def gradient_alignment(policy, tokenizer, task, plugins: dict[str, Any], sampler_settings: dict[str, Any],
                       items, gold, *, batches: int, prompts: int, group: int, grader: str, seed: int = 0,
                       sft_draws: int = 8, progress: bool = False) -> dict[str, Any]:
    """Cosines between each plug-in's gradient and the supervised gradient, on shared rollout batches.

    gold: `gold(indices)` -> one `SFTExample` (prompt + gold answer) per index into `items`.
    """
    import torch

    from dare_bench.trainers.loop import rollout_batch
    from dare_bench.trainers.sft import collate, sft_loss

    params = [p for p in policy.parameters() if p.requires_grad]
    pick = torch.Generator().manual_seed(seed)
    noise = torch.Generator().manual_seed(seed + 1)
    rollout_gen = torch.Generator().manual_seed(seed + 2)
    settings = dict(sampler_settings, return_trajectory=True)
    sums: dict[str, Any] = {}
    per_batch: dict[str, list[float]] = {name: [] for name in plugins}
    rewards, tied = [], []
    steps = range(batches)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc="alignment", unit="batch")
    for k in steps:
        idx = torch.randint(len(items), (prompts,), generator=pick).tolist()
        batch, _ = rollout_batch(policy, tokenizer, task, items, idx, group, settings, generator=rollout_gen,
                                 grader=grader)
        rewards.append(float(batch.rewards.mean()))
        tied.append(float((batch.rewards.view(-1, group).std(dim=1) == 0).float().mean()) if group > 1 else 1.0)
        policy.train()
        policy.zero_grad(set_to_none=True)
        ids, plen, alen = collate(gold(idx), policy.traits.eos_token_id)
        for _ in range(sft_draws):
            (sft_loss(policy, ids, plen, alen, noise) / sft_draws).backward()
        supervised = _flat_grad(params).clone()
        sums["sft"] = supervised + sums.get("sft", 0)
        for name, plugin in plugins.items():
            policy.zero_grad(set_to_none=True)
            adv = plugin.advantages(batch.rewards, group)
            state = plugin.prepare(batch, policy, None, generator=torch.Generator().manual_seed(seed * 1000 + k),
                                   num_iterations=1)
            plugin.backward(policy, batch, state, adv, loss_scale=1.0, iteration=0)
            grad = _flat_grad(params).clone()
            sums[name] = grad + sums.get(name, 0)
            per_batch[name].append(float(torch.nn.functional.cosine_similarity(grad, supervised, dim=0)))
    policy.zero_grad(set_to_none=True)
    cos = torch.nn.functional.cosine_similarity
    return {
        "algorithms": {name: {"mean_cosine": sum(v) / len(v), "cosine_of_sums": float(cos(sums[name], sums["sft"],
                                                                                            dim=0)),
                              "per_batch": v} for name, v in per_batch.items()},
        "mean_reward": sum(rewards) / len(rewards),
        # groups whose rollouts all got the same reward carry no advantage: a gradient of 0 there is not a verdict
        "zero_std_groups": sum(tied) / len(tied),
    }


def run_alignment(names: list[str], scale: str, *, batches: int, sft_draws: int, seed: int,
                  progress: bool = True) -> dict[str, Any]:
    """Resolve the reproductions, load (or build) their shared SFT base, and measure."""
    from dare_bench.errors import ConfigError
    from dare_bench.pipeline.base_cache import build_base
    from dare_bench.pipeline.examples import sft_examples
    from dare_bench.pipeline.plan import _answer_length, _plugin_name, _train_items_needed, resolve
    from dare_bench.tasks.tokenizer import build_task_tokenizer
    from dare_bench.trainers.algorithms.base import get_algorithm
    from dare_bench.trainers.loop import _train_settings, algorithm_settings, rollout_settings

    if scale not in ("tiny", "micro"):
        raise ConfigError(f"--scale must be tiny or micro (a CPU replica and its SFT base), got {scale!r}")
    cfgs = [resolve(name, scale, [])[1] for name in names]
    first = cfgs[0]
    for name, cfg in zip(names, cfgs):
        if cfg.profile.train.kind != "rl":
            raise ConfigError(f"{name} is not an RL reproduction (train.kind = {cfg.profile.train.kind!r})")
        if get_algorithm(_plugin_name(cfg.algorithm)).owns_rollout:
            raise ConfigError(f"{name}: {cfg.algorithm} generates its own rollouts (e.g. a tree search), and this "
                              "bench compares algorithms on shared rollout batches")
        if ((cfg.backbone, cfg.task, cfg.profile.base, cfg.profile.task_options)
                != (first.backbone, first.task, first.profile.base, first.profile.task_options)):
            raise ConfigError(f"{name} does not share {names[0]}'s SFT base (backbone, task and base recipe must "
                              "match): compare algorithms on one base at a time")
    task = first.run_task()
    train_data = task.load(split="train", limit=_train_items_needed(first))  # as the pipeline: same cached base
    items = list(train_data)
    tokenizer = build_task_tokenizer(first.task)
    policy, base_dir, _ = build_base(first, task, tokenizer, items, data_fingerprint=str(train_data.fingerprint),
                                     log=lambda m: None, progress=progress)
    plugins = {}
    for name, cfg in zip(names, cfgs):
        train = _train_settings(cfg.profile.train)
        plugins[name] = get_algorithm(_plugin_name(cfg.algorithm))(algorithm_settings(train), policy.traits)
    train = _train_settings(first.profile.train)

    def gold(idx):  # only the sampled prompts' answers are tokenized
        return sft_examples(task, tokenizer, [items[i] for i in idx], grader=first.grader, pad_to=_answer_length(first))

    result = gradient_alignment(policy, tokenizer, task, plugins, rollout_settings(train.rollout), items, gold,
                                batches=batches, prompts=int(train.batch_prompts), group=int(train.group_size),
                                grader=first.grader, seed=seed, sft_draws=sft_draws, progress=progress)
    result["settings"] = {"scale": scale, "base": str(base_dir), "batches": batches, "sft_draws": sft_draws,
                          "seed": seed, "prompts": int(train.batch_prompts), "group_size": int(train.group_size)}
    return result


def register(group: typer.Typer) -> None:
    @group.command("alignment")
    def alignment(
        names: list[str] = typer.Argument(..., help="RL reproductions sharing one SFT base (backbone, task)"),
        scale: str = typer.Option("tiny", "--scale", help="tiny | micro"),
        batches: int = typer.Option(8, "--batches", min=1, help="rollout batches (each prompts x group)"),
        sft_draws: int = typer.Option(8, "--sft-draws", min=1, help="noise draws of the supervised gradient"),
        seed: int = typer.Option(0, "--seed"),
        threads: int = typer.Option(1, "--threads", min=1, help="torch CPU threads"),
        as_json: bool = typer.Option(False, "--json", help="print the JSON result only"),
    ) -> None:
        """Cosine between each RL algorithm's gradient and the supervised gradient, on shared rollouts."""
        import torch

        torch.set_num_threads(threads)
        result = run_alignment(list(names), scale, batches=batches, sft_draws=sft_draws, seed=seed,
                               progress=not as_json)
        if as_json:
            typer.echo(json.dumps(result))
            return
        typer.echo(f"gradient alignment with the supervised (gold-answer SFT) gradient, {batches} batches of "
                   f"{result['settings']['prompts']} x {result['settings']['group_size']} rollouts "
                   f"(mean reward {result['mean_reward']:.3f}, "
                   f"{100 * result['zero_std_groups']:.0f} % of groups tied), "
                   f"base {result['settings']['base']}")
        typer.echo(f"{'reproduction':<32}{'mean cosine':>13}{'cosine of sums':>16}")
        for name, r in result["algorithms"].items():
            typer.echo(f"{name:<32}{r['mean_cosine']:>13.3f}{r['cosine_of_sums']:>16.3f}")
