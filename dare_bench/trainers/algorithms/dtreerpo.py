"""d-TreeRPO — tree-structured rollouts with bottom-up rewards, local advantages and scheduled self-distillation
(arXiv 2512.09675).

Official code: THU-BPM/d-TreeRPO @ 3eb6f21 `dtreerpo/dtreerpo_trainer.py` (`_perform_tree_search_and_compute_
advantages`, `_generate_partial`, `_get_local_transition_logps`, `_build_completion_mask`, `compute_loss`) and
`slurm_scripts/dtreerpo.yaml`. DARE (yjyddq/DARE @ 83ae8a3): `verl/workers/rollout/dtreerpo_llada_rollout.py`
(the tree search, also used for Dream with shifted logits), `verl/trainer/ppo/dtreerpo_algos.py::
compute_dtreerpo_rewards_and_segments`, `verl/workers/actor/{llada,dream}_dp_actor_dtreerpo.py`. Spec:
shared/docs/algorithms.md §10.2.

Rollout (`generate_rollouts`, the plug-in owns it: see `base.py`). Per prompt row, a tree over the S denoising steps
of the LLaDA semi-AR low-confidence sampler (gen_length, steps, block_length, temperature, remasking low_confidence
| random from `train.rollout`):
- branch points (remaining steps) B = sorted(set([S] + [S - int(k S / s) for k in 1..s]), descending), s =
  `tree_contraction_factor`; level l runs the sampler's global steps S - B[l] .. S - B[l+1] - 1 from its parent's
  canvas. The root (prompt + all masks) gets `num_tree_samples` children, every other inner node
  `tree_branch_factor` (T) children, each an independent continuation; the nodes at 0 remaining steps are the
  leaves (n0 * T^(D-1) per tree, D = len(B) - 1 levels).
- a partial run starts mid-block as the official one does: the block's transfer schedule is recomputed from its
  masks at the start of the run over the block's remaining steps (LLaDA get_num_transfer_tokens), every step
  commits min(quota, masks left in the block) top-confidence masked positions of the current block (positions
  before and after it are excluded, unlike LLaDA's generate, which keeps earlier-block leftovers eligible).
  Without mask-id proposals this is exactly the sampler's schedule, so a tree at temperature 0 has every leaf equal
  to `sampling.generate` (tested). Gumbel-max noise is drawn for the current block's logits only.
- the model is called as the family's sampler calls it (LLaDA: the 2-D padding mask; Dream: positions from the
  padding and its 4-D mask, logits shifted by one: DARE's Dream actor / rollout). Rows decode in chunks of
  `forward_batch_size` rows, step by step (on CPU the noise, hence the tree, does not depend on the chunking).
The loop grades every leaf as a rollout row (same cut and grader), so a rollout batch has one row per leaf
(`group_size` = train.group_size x leaves) and `RolloutBatch.trajectories[r]` is the leaf's `TreePath`.

Per rollout batch (`prepare`):
1. values: a leaf's value is its reward; an inner node's is the mean of its children's (the official
   `_mean_aggregate_value_vecs`, bottom-up, the root too);
2. local advantage of a non-root node c with parent p: A_c = v_c - mean(v_c' : c' sibling of c, c' != c), the
   official leave-one-out baseline (no siblings: A_c = v_c); the shared `advantage: mean` / `mean_std` give the
   group-mean (and std-normalised, singleton: A = v / (1 + 1e-6) as verl) variants over the siblings;
3. one training segment per non-root node: (parent canvas -> child canvas, A_c), grouped by parent (the official
   `group_ids` = (parent node, prompt row));
4. the active positions of a segment: completion positions masked in the parent and not in the child (official
   `changed_mask`), up to and including the child's first EOS (`_build_completion_mask`: EOS = the model's eos id);
   old (mu > 1) and reference (beta > 0) log-probs of the active tokens.

Loss (`backward`), on micro-batches of whole trees (`micro_batch_block`):
- segment log-probs: one forward of the parent canvas, l_i = log p_theta(child_i | parent) at the active
  positions; siblings share their parent, so one forward serves all of a parent's children (the official trainer
  forwards the parent once per child: same numbers);
- per segment: PPO-clip token mean  -sum_i min(rho_i A, clip(rho_i, 1 - eps, 1 + eps_high) A) / max(n_active, 1),
  rho = exp(l - l_old), plus beta * the token mean of the unclamped k3 exp(d) - d - 1, d = l_ref - l; the mean over
  the micro-batch's segments (the official `compute_loss`; a segment with no active token counts as 0);
- self-distillation (`self_distillation`): per parent group with >= 2 children, over the children with A > 0:
  w = softmax(A / tau(t)); at every completion position j where one of them is active, the target q_j is their
  tokens weighted by w (q = sum w / (sum + 1e-8)) and the term KL_j = sum_u q_u (log(q_u + 1e-8) -
  log p_theta(u | parent)_j), with gradient through the parent's forward; SD = the mean of KL_j over the
  micro-batch's (group, position) pairs; the loss adds lambda(t) * SD with
      lambda(t) = lambda_max (e^{gamma t/T} - 1) / (e^gamma - 1),   tau(t) = max(tau_max (1 - t/T)^beta, 1e-6),
  t / T clamped to [0, 1], t = the optimizer step (0-based, the official `state.global_step`), T = `sd_max_steps`
  or the run's optimizer steps (the official run: HF `max_steps` is both).
Whole-batch updates: each of the mu optimizer steps sees every segment of the rollout batch (the loop's rule). The
official trainer instead takes `num_iterations` (12) optimizer steps on each parent's children in turn
(`parents_per_step` 1) and DARE splits each of its 12 epochs into mini-batches of 2 consecutive segments per GPU
(its segments are ordered node by node, so, as we read it, siblings never share a micro-batch and its
self-distillation term is always 0; its `global_step` counts rollout batches against a default T of 30000):
neither is followed. Deviations: an active token whose log-prob is
exactly 0.0 in floating point stays counted (the official `changed_mask = new_logps != 0` drops it from the
denominators); the policy's logits are not divided by the rollout temperature (neither code does). Not
implemented: classifier-free guidance (refused), Fast-dLLM caches / threshold decoding in the tree (refused).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from dare_bench.catalogue.knobs.dtreerpo import DTreeRPOConfig
from dare_bench.errors import ConfigError, DataError
from dare_bench.trainers.algorithms.base import (
    Algorithm,
    AlgorithmState,
    PluginRollout,
    RolloutBatch,
    register_algorithm,
)

SD_EPS = 1e-8  # official q / log q epsilon
TAU_MIN = 1e-6  # official floor of tau(t)
STD_EPS = 1e-6  # verl's std epsilon (the `mean_std` variant only)
REMASKING = ("low_confidence", "random")
# sampler settings the tree search understands; anything else set to a non-default value is refused
_TREE_SETTINGS = {"gen_length", "max_new_tokens", "steps", "block_length", "temperature", "remasking", "cfg_scale",
                  "return_trajectory", "progress", "generator"}


# --- the tree's shape ----------------------------------------------------------------------------------------------

def branch_points(total_steps: int, contraction: int) -> list[int]:
    """Remaining-step counts at which the tree branches, descending from `total_steps` to 0 (the official formula
    [S] + [S - int(k * S / s) for k = 1..s], duplicates dropped)."""
    points = [total_steps] + [total_steps - int(k * total_steps / contraction) for k in range(1, contraction + 1)]
    return sorted(set(points), reverse=True)


@dataclass(frozen=True)
class TreeShape:
    """Branch points and children per level (level 0 = the root's children)."""

    points: tuple[int, ...]
    children: tuple[int, ...]

    @property
    def depth(self) -> int:
        return len(self.children)

    @property
    def leaves(self) -> int:
        return math.prod(self.children)

    def nodes_at(self, level: int) -> int:
        """Nodes per tree at `level` (0 = the root, `depth` = the leaves)."""
        return math.prod(self.children[:level])

    def node_id(self, level: int, index: int) -> int:
        """Breadth-first id of the `index`-th node (0-based, lexicographic) at `level`; the root is 0."""
        return sum(self.nodes_at(m) for m in range(level)) + index


def tree_shape(total_steps: int, config: DTreeRPOConfig) -> TreeShape:
    points = branch_points(total_steps, config.tree_contraction_factor)
    levels = len(points) - 1
    children = tuple(config.num_tree_samples if level == 0 else config.tree_branch_factor for level in range(levels))
    return TreeShape(tuple(points), children)


@dataclass
class TreePath:
    """One leaf row of a d-TreeRPO rollout: its tree's root-to-leaf path.

    `tree`: the tree (prompt row) of the rollout it belongs to; `nodes`: breadth-first node ids along the path (root
    0 first, the leaf last), unique within the tree; `states [D + 1, P + C]`: the canvases of those nodes (the root's
    is the prompt + masks, the leaf's the finished canvas); `steps`: remaining denoising steps at each node;
    `model_kwargs`: the tree's model-call keywords (`[1, ...]` tensors, shared by its leaves); `leaves`: leaf rows
    of the tree (contiguous in the batch)."""

    tree: int
    nodes: tuple[int, ...]
    states: torch.Tensor
    steps: tuple[int, ...]
    model_kwargs: dict[str, torch.Tensor] = field(default_factory=dict)
    leaves: int = 1

    @property
    def depth(self) -> int:
        return len(self.nodes) - 1


# --- rollout -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TreeSampler:
    """The sampler settings of the tree search, checked (LLaDA semi-AR, low-confidence or random remasking)."""

    gen_length: int
    steps: int
    block_length: int
    temperature: float
    remasking: str

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> "TreeSampler":
        refused = sorted(k for k, v in settings.items() if k not in _TREE_SETTINGS and v not in (None, False, "none"))
        if refused:
            raise ConfigError(f"dtreerpo: the tree search decodes with LLaDA's semi-AR sampler (gen_length, steps, "
                              f"block_length, temperature, remasking); unsupported rollout settings {refused}")
        gen = settings.get("gen_length") or settings.get("max_new_tokens") or 128
        steps = settings.get("steps") or gen
        block = settings.get("block_length") or gen
        temperature = float(settings.get("temperature") or 0.0)
        remasking = settings.get("remasking") or "low_confidence"
        if remasking not in REMASKING:
            raise ConfigError(f"dtreerpo: the tree search remasks with one of {REMASKING} (DARE: low_confidence), "
                              f"got remasking {remasking!r}")
        if float(settings.get("cfg_scale") or 0.0) != 0.0:
            raise ConfigError("dtreerpo: classifier-free guidance (cfg_scale > 0) is not supported")
        if temperature < 0:
            raise ConfigError(f"dtreerpo: temperature must be >= 0, got {temperature}")
        if gen % block:
            raise ConfigError(f"dtreerpo: gen_length {gen} is not a multiple of block_length {block}")
        if steps % (gen // block):
            raise ConfigError(f"dtreerpo: steps {steps} is not a multiple of the number of blocks {gen // block}")
        return cls(int(gen), int(steps), int(block), temperature, str(remasking))

    def record(self) -> dict[str, Any]:
        return {"sampler": "dtreerpo-tree", "token_sampler": "llada", "gen_length": self.gen_length,
                "steps": self.steps, "block_length": self.block_length, "temperature": self.temperature,
                "remasking": self.remasking}


def canvas_kwargs(traits, prompt_mask: torch.Tensor | None, n_rows: int, prompt_length: int,
                  gen_length: int, device) -> dict[str, torch.Tensor]:
    """The model-call keywords of the full canvas, as the family's sampler passes them (per prompt row)."""
    from dare_bench.diffusion.sampling.core import sampler_for
    from dare_bench.diffusion.sampling.dream import dream_window_kwargs
    from dare_bench.diffusion.sampling.llada import llada_window_kwargs

    family = sampler_for(traits)
    length = prompt_length + gen_length
    if family == "llada":
        kw = llada_window_kwargs(prompt_mask, gen_length)(0, length)
    elif family == "dream":
        kw = dream_window_kwargs(prompt_mask, n_rows, prompt_length, gen_length, device)(0, length)
    else:  # pragma: no cover - attention_kinds keeps block diffusion out
        raise ConfigError(f"dtreerpo: no tree search for the {family!r} sampler")
    return {k: (v.expand(n_rows, *v.shape[1:]) if v.shape[0] == 1 else v) for k, v in kw.items()}


def _logits(model, ids: torch.Tensor, kwargs: dict[str, torch.Tensor], shift: int,
            stats: dict[str, int] | None = None) -> torch.Tensor:
    """Logits shifted to the row convention; with `stats` (tree decoding) identical rows are computed once (a
    node's children start as copies of it; diffusion/sampling/core.py) and counted in stats["shared_rows"]."""
    from dare_bench.diffusion.sampling.core import model_logits, shared_rows_forward
    from dare_bench.models.base import shift_logits

    if stats is None:
        return shift_logits(model_logits(model, ids, **kwargs), shift)
    out, shared = shared_rows_forward(model, ids, kwargs)
    stats["shared_rows"] += shared
    return shift_logits(out, shift)


@torch.no_grad()
def denoise(model, x: torch.Tensor, kwargs: dict[str, torch.Tensor], *, first_step: int, last_step: int,
            sampler: TreeSampler, prompt_length: int, mask_id: int, shift: int, generator, chunk: int | None,
            stats: dict[str, int]) -> torch.Tensor:
    """Run the sampler's global steps first_step .. last_step - 1 on the canvases `x` [R, P + C] (a copy is
    returned): the official `_generate_partial` (schedule recomputed per block at the start of the run)."""
    from dare_bench.diffusion.sampling.core import uniform
    from dare_bench.diffusion.sampling.llada import get_num_transfer_tokens, gumbel_argmax

    x = x.clone()
    rows = x.shape[0]
    size = chunk or rows
    n_blocks = sampler.gen_length // sampler.block_length
    per_block = sampler.steps // n_blocks
    schedule, schedule_from = None, 0
    for g in range(first_step, last_step):
        block, i = divmod(g, per_block)
        start = prompt_length + block * sampler.block_length
        end = start + sampler.block_length
        if schedule is None or i == 0:  # the run's first step, or a new block
            schedule = get_num_transfer_tokens((x[:, start:end] == mask_id).sum(1), per_block - i)
            schedule_from = i
        quota = schedule[:, i - schedule_from]
        # random remasking: the step's confidences for all rows first, so the noise does not depend on the chunks
        rand_conf = (uniform((rows, end - start), torch.float32, x.device, generator)
                     if sampler.remasking == "random" else None)
        for a in range(0, rows, size):
            b = min(a + size, rows)
            logits = _logits(model, x[a:b], {k: v[a:b] for k, v in kwargs.items()}, shift, stats)[:, start:end]
            stats["forwards"] += 1
            stats["token_forwards"] += int(x[a:b].numel())
            stats["row_forwards"] += b - a
            x0 = gumbel_argmax(logits, sampler.temperature, generator)
            if sampler.remasking == "low_confidence":
                conf = torch.softmax(logits.float(), dim=-1).gather(-1, x0.unsqueeze(-1)).squeeze(-1)
            else:
                conf = rand_conf[a:b]
            window = x[a:b, start:end]
            masked = window == mask_id
            x0 = torch.where(masked, x0, window)
            conf = torch.where(masked, conf, torch.full_like(conf, -torch.inf))
            transfer = torch.zeros_like(masked)
            for j in range(b - a):
                k = min(int(quota[a + j]), int(masked[j].sum()))
                if k > 0:
                    transfer[j, torch.topk(conf[j], k=k).indices] = True
            window[transfer] = x0[transfer]
    return x


# --- values, advantages, segments ------------------------------------------------------------------------------------

def sibling_advantages(values: torch.Tensor, mode: str) -> torch.Tensor:
    """Local advantages of one parent's children from their values `[n]`: leave-one-out (official: v - mean of the
    other siblings; none: v), mean (v - mean), mean_std ((v - mean) / (std + 1e-6); one child: v / (1 + 1e-6))."""
    v = values.float()
    n = v.numel()
    if mode == "leave_one_out":
        return v.clone() if n == 1 else v - (v.sum() - v) / (n - 1)
    if mode == "mean":
        return v - v.mean()
    if mode == "mean_std":
        return v / (1 + STD_EPS) if n == 1 else (v - v.mean()) / (v.std() + STD_EPS)
    raise ConfigError(f"dtreerpo: unknown advantage {mode!r}")


@dataclass
class TreeTable:
    """The trees of a batch of leaf rows: node values, children, local advantages and segment owners."""

    values: dict[tuple[int, int], float]  # (tree, node) -> value
    children: dict[tuple[int, int], list[int]]  # (tree, node) -> child nodes, in order
    advantage: dict[tuple[int, int], float]  # (tree, non-root node) -> local advantage
    owner: dict[tuple[int, int], int]  # (tree, non-root node) -> the first row whose path holds it


def tree_table(paths: list[TreePath], rewards: torch.Tensor, mode: str = "leave_one_out") -> TreeTable:
    """Values bottom-up (leaf = reward, inner node = mean of its children), local advantages and segment owners."""
    if len(paths) != rewards.shape[0]:
        raise DataError(f"dtreerpo: {len(paths)} tree paths for {rewards.shape[0]} rewards")
    depth = paths[0].depth
    children: dict[tuple[int, int], list[int]] = {}
    owner: dict[tuple[int, int], int] = {}
    values: dict[tuple[int, int], float] = {}
    level_of: dict[tuple[int, int], int] = {}
    for r, path in enumerate(paths):
        if path.depth != depth:
            raise DataError("dtreerpo: the tree paths of a batch have different depths")
        for d in range(depth + 1):
            key = (path.tree, path.nodes[d])
            if level_of.setdefault(key, d) != d:
                raise DataError(f"dtreerpo: node {key} sits at two levels")
            if d > 0:
                owner.setdefault(key, r)
                kids = children.setdefault((path.tree, path.nodes[d - 1]), [])
                if path.nodes[d] not in kids:
                    kids.append(path.nodes[d])
        leaf = (path.tree, path.nodes[-1])
        if leaf in values:
            raise DataError(f"dtreerpo: leaf {leaf} appears in two rows")
        values[leaf] = float(rewards[r])
    for d in range(depth - 1, -1, -1):
        for key, level in level_of.items():
            if level == d:
                kids = children.get(key)
                if not kids:
                    raise DataError(f"dtreerpo: inner node {key} has no child in the batch")
                values[key] = sum(values[(key[0], c)] for c in kids) / len(kids)
    advantage: dict[tuple[int, int], float] = {}
    for (tree, parent), kids in children.items():
        adv = sibling_advantages(torch.tensor([values[(tree, c)] for c in kids], dtype=torch.float64), mode)
        for c, a in zip(kids, adv.tolist()):
            advantage[(tree, c)] = float(a)
    return TreeTable(values, children, advantage, owner)


def completion_mask(completion: torch.Tensor, mask_id: int, eos_id: int) -> torch.Tensor:
    """Official `_build_completion_mask`: 1 for decoded (non-mask) tokens up to and including the first EOS."""
    is_eos = completion == eos_id
    length = completion.shape[-1]
    first = torch.where(is_eos.any(-1), is_eos.int().argmax(-1), torch.full_like(is_eos[..., 0], length,
                                                                                 dtype=torch.long))
    upto = torch.arange(length, device=completion.device) <= first.unsqueeze(-1)
    return (completion != mask_id) & upto


def active_positions(parent: torch.Tensor, child: torch.Tensor, mask_id: int, eos_id: int) -> torch.Tensor:
    """The completion positions a segment trains: masked in the parent, decoded in the child, up to the child's
    first EOS (`[..., C]` bool, from completion canvases `[..., C]`)."""
    changed = (parent == mask_id) & (child != mask_id)
    return changed & completion_mask(child, mask_id, eos_id)


def sd_schedule(step: int, total: int, *, lambda_max: float, gamma: float, tau_max: float,
                beta: float) -> tuple[float, float]:
    """(lambda(t), tau(t)) of the official `compute_loss`, progress t / T clamped to [0, 1]."""
    progress = min(1.0, max(0.0, step / max(1, total)))
    lam = lambda_max * (math.exp(gamma * progress) - 1.0) / (math.exp(gamma) - 1.0)
    tau = max(tau_max * max(0.0, 1.0 - progress) ** beta, TAU_MIN)
    return lam, tau


def self_distillation_terms(logp_parent: torch.Tensor, tokens: torch.Tensor, active: torch.Tensor,
                            advantages: torch.Tensor, tau: float) -> tuple[torch.Tensor, int]:
    """(sum over positions of KL(q_j || p_j), number of positions) for one parent group.

    logp_parent `[C, V]`: log-softmax of the parent's forward on the completion; tokens / active `[K, C]`: the
    children's completion tokens and active positions; advantages `[K]`. Only a group of >= 2 children with a
    positive advantage contributes (the official loop over `group_ids`)."""
    zero = logp_parent.new_zeros(())
    if tokens.shape[0] <= 1:
        return zero, 0
    pos = advantages > 0
    if not bool(pos.any()):
        return zero, 0
    w = torch.softmax(advantages[pos].float() / tau, dim=0)  # [K+]
    tok, act = tokens[pos], active[pos].bool()
    weight = w[:, None] * act  # [K+, C]
    total = weight.sum(0)  # [C]
    used = act.any(0)
    same = (tok[:, None, :] == tok[None, :, :]) & act[None, :, :]  # [K, K', C]: k' active with k's token
    q = (same * weight[None, :, :]).sum(1) / (total + SD_EPS)  # [K+, C]: q of row k's token at j
    earlier = torch.tril(torch.ones(tok.shape[0], tok.shape[0], dtype=torch.bool, device=tok.device), -1)
    first = act & ~(same & earlier[:, :, None]).any(1)  # each distinct token of a position counted once
    logp = logp_parent.gather(-1, tok.t()).t()  # [K+, C]: log p(token of row k at j)
    terms = torch.where(first, q * (torch.log(q + SD_EPS) - logp), torch.zeros_like(logp))
    return terms.sum(), int(used.sum())


def segment_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, active: torch.Tensor, *,
                 clip_low: float, clip_high: float, beta: float = 0.0,
                 ref_logp: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Per-segment losses `[n]` of the official `compute_loss` (PPO clip token mean over the active positions, plus
    beta times the token mean of the unclamped k3), from log-probs `[n, C]` (0 at inactive positions)."""
    m = active.to(logp.dtype)
    count = m.sum(-1).clamp(min=1.0)
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    ratio = torch.exp(logp - old_logp)
    obj = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * adv)
    out = {"pg": -(obj * m).sum(-1) / count,
           "clipped": ((ratio * adv > torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * adv).to(m.dtype) * m).sum()}
    if beta > 0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs reference log-probs")
        d = ref_logp - logp
        out["kl"] = ((torch.exp(d) - d - 1.0) * m).sum(-1) / count
        out["loss"] = out["pg"] + beta * out["kl"]
    else:
        out["loss"] = out["pg"]
    return out


# --- the plug-in -------------------------------------------------------------------------------------------------

@dataclass
class _Group:
    """One parent and its children (segments) among a batch's rows."""

    tree: int
    level: int
    parent_row: int  # a row whose path holds the parent (its canvas is states[level])
    members: list[tuple[int, int]]  # (row, level) of each child segment, owner rows


def _groups(paths: list[TreePath], owned: torch.Tensor) -> list[_Group]:
    """The parent groups of the owned segments of these rows, each complete (else DataError)."""
    found: dict[tuple[int, int], _Group] = {}
    for r, path in enumerate(paths):
        for d in range(path.depth):
            key = (path.tree, path.nodes[d])
            group = found.get(key)
            if group is None:
                group = found[key] = _Group(path.tree, d, r, [])
            if bool(owned[r, d]):
                group.members.append((r, d))
    rows_of: dict[int, int] = {}
    for path in paths:
        rows_of[path.tree] = rows_of.get(path.tree, 0) + 1
    for path in paths:
        if rows_of[path.tree] != path.leaves:
            raise DataError(f"dtreerpo: {rows_of[path.tree]} of tree {path.tree}'s {path.leaves} leaves are in this "
                            "micro-batch (a micro-batch must hold whole trees: Algorithm.micro_batch_block)")
    return list(found.values())


@register_algorithm
class DTreeRPO(Algorithm):
    name = "dtreerpo"
    Config = DTreeRPOConfig
    # DARE wires LLaDA and Dream (dtreerpo_llada_rollout.py serves both, Dream with shifted logits); the official
    # trainer is LLaDA's. The tree search is the MDLM semi-AR sampler.
    attention_kinds = ("bidirectional",)
    owns_rollout = True

    def validate(self) -> None:
        c = self.config
        if c.mc_samples != 1:
            raise ConfigError(f"dtreerpo scores each segment with one forward of its parent (mc_samples=1); got "
                              f"{c.mc_samples}")
        modes = {None: "leave_one_out", "leave_one_out": "leave_one_out", "mean": "mean", "mean_std": "mean_std",
                 "std": "mean_std", "loo": "leave_one_out"}
        if c.advantage not in modes:
            raise ConfigError(f"dtreerpo: advantage {c.advantage!r} is not a sibling baseline (leave_one_out = the "
                              "official, mean, mean_std)")
        self.advantage_mode = modes[c.advantage]
        self.clip_high = c.clip_eps if c.clip_eps_high is None else c.clip_eps_high
        self.sampler: TreeSampler | None = None
        self.shape: TreeShape | None = None

    # --- rollout ------------------------------------------------------------------------------------------------
    def check_rollout(self, settings: dict[str, Any]) -> dict[str, Any]:
        out = super().check_rollout(settings)
        self.sampler = TreeSampler.from_settings(out)
        self.shape = tree_shape(self.sampler.steps, self.config)
        return out

    def generate_rollouts(self, policy, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None, *,
                          settings: dict[str, Any], generator: torch.Generator | None) -> PluginRollout:
        from dare_bench.diffusion.sampling.core import GenerationOutput, GenerationStats

        t0 = time.perf_counter()
        self.check_rollout(settings)
        sampler, shape = self.sampler, self.shape
        traits = policy.traits
        mask_id, shift = int(traits.mask_token_id), int(traits.logit_shift)
        device = next(policy.parameters()).device
        prompt_ids = prompt_ids.to(device)
        n, p = prompt_ids.shape
        kwargs = canvas_kwargs(traits, None if prompt_mask is None else prompt_mask.to(device), n, p,
                               sampler.gen_length, device)
        root = torch.full((n, p + sampler.gen_length), mask_id, dtype=torch.long, device=device)
        root[:, :p] = prompt_ids
        stats = {"forwards": 0, "token_forwards": 0, "row_forwards": 0, "shared_rows": 0}
        levels = [root]
        tree_of = torch.arange(n, device=device)  # tree of each row of the current level
        for level, k in enumerate(shape.children):
            tree_of = tree_of.repeat_interleave(k)
            parents = levels[-1].repeat_interleave(k, dim=0)
            levels.append(denoise(policy, parents, {key: v[tree_of] for key, v in kwargs.items()},
                                  first_step=sampler.steps - shape.points[level],
                                  last_step=sampler.steps - shape.points[level + 1], sampler=sampler,
                                  prompt_length=p, mask_id=mask_id, shift=shift, generator=generator,
                                  chunk=self.forward_batch_size, stats=stats))
        leaves = shape.leaves
        paths = []
        for r in range(n * leaves):
            tree, q = divmod(r, leaves)
            idx = [q // math.prod(shape.children[d:]) for d in range(shape.depth + 1)]  # index within each level
            states = torch.stack([levels[d][tree * shape.nodes_at(d) + idx[d]] for d in range(shape.depth + 1)])
            paths.append(TreePath(tree=tree, nodes=tuple(shape.node_id(d, idx[d]) for d in range(shape.depth + 1)),
                                  states=states, steps=shape.points,
                                  model_kwargs={key: v[tree:tree + 1] for key, v in kwargs.items()}, leaves=leaves))
        canvas = levels[-1]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        generated = int((canvas[:, p:] != mask_id).sum()) // canvas.shape[0]
        st = GenerationStats(forwards=stats["forwards"], token_forwards=stats["token_forwards"],
                             row_forwards=stats["row_forwards"], shared_rows=stats["shared_rows"],
                             generated_tokens=generated,
                             # tokens per forward along a root-to-leaf path (S forwards), as the sampler's measure
                             tokens_per_forward=generated / sampler.steps, wall_seconds=time.perf_counter() - t0)
        record = {**sampler.record(), "tree_points": list(shape.points), "tree_children": list(shape.children),
                  "mask_id": mask_id, "eos_id": int(traits.eos_token_id)}
        out = GenerationOutput(sequences=canvas, canvas=canvas, prompt_length=p, stats=st, settings=record)
        return PluginRollout(out, rows_per_prompt=leaves, trajectories=paths)

    def micro_batch_block(self, batch: RolloutBatch) -> int:
        return self._paths(batch)[0].leaves

    # --- per batch ----------------------------------------------------------------------------------------------
    @staticmethod
    def _paths(batch: RolloutBatch) -> list[TreePath]:
        paths = batch.trajectories
        if paths is None or len(paths) != batch.num_rows or not all(isinstance(t, TreePath) for t in paths):
            raise DataError("dtreerpo needs its own tree rollouts (one TreePath per row: generate_rollouts)")
        return list(paths)

    def advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        """The leaves' local advantages (metrics; the update uses every segment's, from `prepare`)."""
        if self.shape is None:
            raise ConfigError("dtreerpo: the tree shape is set by check_rollout / generate_rollouts")
        block = self.shape.children[-1]  # a leaf's siblings: the last level's children of one parent
        if rewards.shape[0] % block:
            raise ValueError(f"{rewards.shape[0]} leaves do not split into sibling groups of {block}")
        return torch.cat([sibling_advantages(g, self.advantage_mode) for g in rewards.view(-1, block)]).to(rewards)

    def _parent_logp(self, model, paths: list[TreePath], groups: list[_Group], p: int, c: int) -> torch.Tensor:
        """log-softmax `[g, C, V]` (float32) of the parents' forwards on the completion."""
        ids = torch.stack([paths[g.parent_row].states[g.level] for g in groups])
        keys = sorted(paths[groups[0].parent_row].model_kwargs)
        kw = {k: torch.cat([paths[g.parent_row].model_kwargs[k] for g in groups]).to(ids.device) for k in keys}
        logits = _logits(model, ids, kw, int(self.traits.logit_shift))[:, p:p + c]
        return torch.log_softmax(logits.float(), dim=-1)

    def _chunks(self, groups: list[_Group]) -> list[list[_Group]]:
        size = self.forward_batch_size or len(groups)
        return [groups[a:a + size] for a in range(0, len(groups), size)]

    @torch.no_grad()
    def prepare(self, batch: RolloutBatch, policy, reference, *, generator: torch.Generator,
                num_iterations: int) -> AlgorithmState:
        c = self.config
        paths = self._paths(batch)
        p, n_comp = batch.prompt_ids.shape[1], batch.completion_ids.shape[1]
        dev = batch.prompt_ids.device
        mask_id, eos_id = int(self.traits.mask_token_id), int(self.traits.eos_token_id)
        for r, path in enumerate(paths):
            if path.states.shape[-1] != p + n_comp or not torch.equal(path.states[0, :p].to(dev), batch.prompt_ids[r]):
                raise DataError(f"row {r}: the tree path's root is not the batch's prompt")
        table = tree_table(paths, batch.rewards.detach().cpu(), self.advantage_mode)
        depth = paths[0].depth
        n = batch.num_rows
        owned = torch.zeros(n, depth, dtype=torch.bool)
        adv = torch.zeros(n, depth)
        value = torch.zeros(n, depth + 1)
        for r, path in enumerate(paths):
            for d in range(depth + 1):
                value[r, d] = table.values[(path.tree, path.nodes[d])]
            for d in range(depth):
                key = (path.tree, path.nodes[d + 1])
                owned[r, d] = table.owner[key] == r
                adv[r, d] = table.advantage[key]
        states = torch.stack([path.states for path in paths]).to(dev)  # [N, D + 1, T]
        comp = states[:, :, p:p + n_comp]
        active = active_positions(comp[:, :-1], comp[:, 1:], mask_id, eos_id) & owned.to(dev).unsqueeze(-1)
        rows: dict[str, torch.Tensor] = {"owned": owned.to(dev), "adv": adv.to(dev), "value": value.to(dev),
                                         "active": active}
        need_ref = c.kl_beta > 0
        if need_ref and reference is None:
            raise ConfigError("dtreerpo with kl_beta > 0 needs a reference model")
        groups = _groups(paths, owned)
        for key, model, needed in (("old_logp", policy, num_iterations > 1), ("ref_logp", reference, need_ref)):
            if not needed:
                continue
            out = torch.zeros(n, depth, n_comp, device=dev)
            for chunk in self._chunks(groups):
                logp = self._parent_logp(model, paths, chunk, p, n_comp)
                for g, lp in zip(chunk, logp):
                    for r, d in g.members:
                        child = comp[r, d + 1]
                        out[r, d] = lp.gather(-1, child.unsqueeze(-1)).squeeze(-1) * active[r, d]
            rows[key] = out
        return AlgorithmState(rows=rows, shared={"depth": depth})

    # --- loss -----------------------------------------------------------------------------------------------------
    def backward(self, policy, batch: RolloutBatch, state: AlgorithmState, advantages: torch.Tensor, *,
                 loss_scale: float, iteration: int) -> dict[str, float]:
        """One forward + backward per chunk of parents (one graph alive); `advantages` (leaves') is unused."""
        c = self.config
        paths = self._paths(batch)
        p, n_comp = batch.prompt_ids.shape[1], batch.completion_ids.shape[1]
        st = state.rows
        groups = _groups(paths, st["owned"].cpu())
        n_seg = int(st["owned"].sum())
        dev = st["active"].device
        comp = torch.stack([path.states for path in paths]).to(dev)[:, :, p:p + n_comp]
        sd_on = c.self_distillation
        lam = tau = 0.0
        if sd_on:
            total = c.sd_max_steps or self.total_optimizer_steps
            if total is None:
                raise ConfigError("dtreerpo: the self-distillation schedule needs the run length (the loop sets "
                                  "total_optimizer_steps) or sd_max_steps")
            lam, tau = sd_schedule(self.optimizer_step + iteration, total, lambda_max=c.sd_lambda_max,
                                   gamma=c.sd_gamma, tau_max=c.sd_tau_max, beta=c.sd_beta)
        # the (group, position) pairs of the self-distillation mean, known before any forward
        n_pairs = 0
        if sd_on:
            for g in groups:
                rr, dd = [m[0] for m in g.members], [m[1] for m in g.members]
                a = st["adv"][rr, dd]
                if len(g.members) > 1 and bool((a > 0).any()):
                    n_pairs += int(st["active"][rr, dd][a > 0].any(0).sum())
        totals = {"pg": 0.0, "kl": 0.0, "sd": 0.0, "clipped": 0.0, "entropy": 0.0}
        n_active = int(st["active"].sum())
        for chunk in self._chunks(groups):
            logp_parent = self._parent_logp(policy, paths, chunk, p, n_comp)  # [g, C, V]
            loss = logp_parent.new_zeros(())
            for g, lp in zip(chunk, logp_parent):
                rr = [m[0] for m in g.members]
                dd = [m[1] for m in g.members]
                child = comp[rr, [d + 1 for d in dd]]  # [K, C]
                act = st["active"][rr, dd]
                logp = lp.gather(-1, child.t()).t() * act  # [K, C]
                old = st["old_logp"][rr, dd] if "old_logp" in st else logp.detach()
                ref = st["ref_logp"][rr, dd] if "ref_logp" in st else None
                a = st["adv"][rr, dd]
                out = segment_loss(logp, old.to(logp.dtype), a, act, clip_low=c.clip_eps, clip_high=self.clip_high,
                                   beta=c.kl_beta, ref_logp=None if ref is None else ref.to(logp.dtype))
                loss = loss + out["loss"].sum() / max(n_seg, 1)
                totals["pg"] += float(out["pg"].detach().sum())
                totals["clipped"] += float(out["clipped"])
                if "kl" in out:
                    totals["kl"] += float(out["kl"].detach().sum())
                with torch.no_grad():
                    ent = -(lp.exp() * lp).sum(-1)  # [C]
                    totals["entropy"] += float((ent.unsqueeze(0) * act).sum())
                if sd_on and n_pairs:
                    kl_sum, _ = self_distillation_terms(lp, child, act, a, tau)
                    loss = loss + lam * kl_sum / n_pairs
                    totals["sd"] += float(kl_sum.detach())
            (loss * loss_scale).backward()
        seg = max(n_seg, 1)
        metrics = {"loss": totals["pg"] / seg + c.kl_beta * totals["kl"] / seg
                   + (lam * totals["sd"] / n_pairs if n_pairs else 0.0),
                   "pg_loss": totals["pg"] / seg, "clip_frac": totals["clipped"] / max(n_active, 1),
                   "entropy": totals["entropy"] / max(n_active, 1), "segments": float(n_seg),
                   "scored_tokens": float(n_active), "tree_depth": float(state.shared["depth"]),
                   "local_advantage_abs_mean": float(st["adv"][st["owned"]].abs().mean()) if n_seg else 0.0,
                   "root_value_mean": float(st["value"][:, 0].mean()),
                   "zero_advantage_segments": float((st["adv"][st["owned"]] == 0).float().mean()) if n_seg else 0.0}
        if c.kl_beta > 0:
            metrics["kl"] = totals["kl"] / seg
        if sd_on:
            metrics.update({"sd_loss": totals["sd"] / n_pairs if n_pairs else 0.0, "sd_lambda": lam, "sd_tau": tau,
                            "sd_pairs": float(n_pairs)})
        return metrics
