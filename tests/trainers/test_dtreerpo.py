"""d-TreeRPO plug-in (shared/docs/algorithms.md §10.2; THU-BPM/d-TreeRPO `dtreerpo/dtreerpo_trainer.py`, DARE
`dtreerpo_llada_rollout.py` / `dtreerpo_algos.py` / `llada_dp_actor_dtreerpo.py`): the branching schedule and the
tree the rollout builds, bottom-up values and local advantages on a hand-computed tree, the active positions, segment
log-probs against a direct forward of the parent, the self-distillation term against a transcription of the official
loop and its time schedule, the gradient on a micro LLaDA against a hand-written objective, and the contract
extension (plug-in rollouts graded by the loop, micro-batches of whole trees, training progress)."""

import math

import pytest
import torch

from dare_bench import catalogue
from dare_bench.catalogue.knobs.dtreerpo import DTreeRPOConfig
from dare_bench.diffusion.sampling import generate
from dare_bench.diffusion.sampling.llada import get_num_transfer_tokens
from dare_bench.errors import ConfigError, DataError
from dare_bench.models.base import ModelTraits
from dare_bench.trainers.algorithms import RolloutBatch, get_algorithm
from dare_bench.trainers.algorithms.dtreerpo import (
    TreePath,
    active_positions,
    branch_points,
    completion_mask,
    sd_schedule,
    self_distillation_terms,
    sibling_advantages,
    tree_shape,
    tree_table,
)
from dare_bench.trainers.loop import RLRunOptions, _micro_slices, rollout_batch, train_rl

from rl_fakes import EOS, MASK, PAD, CharTokenizer, ReverseTask, micro_dream, micro_llada, rl_settings

TRAITS = ModelTraits(family="llada", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logit_shift=0,
                     attention="bidirectional")
SAMPLED = {"gen_length": 4, "steps": 4, "temperature": 0.9}


def _algo(traits=TRAITS, **knobs):
    return get_algorithm("dtreerpo")(knobs, traits)


def _no_mask_proposals(model):
    """The model with its mask-token logit pushed down (a random micro model proposes the mask id now and then,
    which leaves a position masked: the tree's bookkeeping tests want every quota filled)."""
    model.register_forward_hook(lambda module, args, out: out.index_fill(-1, torch.tensor([MASK]), -1e4))
    return model


def _tree_batch(model, *, knobs=None, settings=None, prompts=2, group=1, seed=0, algo=None):
    """A graded d-TreeRPO rollout batch of the toy task through the loop's `rollout_batch`."""
    algo = algo or _algo(model.traits, **(knobs or {}))
    settings = algo.check_rollout(dict(settings or SAMPLED))
    task = ReverseTask(n=8, seed=seed)
    idx = list(range(prompts))
    batch, info = rollout_batch(model, CharTokenizer(), task, task.items, idx, group, settings,
                                generator=torch.Generator().manual_seed(seed), algorithm=algo)
    return algo, batch, info, task


# --- branching schedule and tree construction ----------------------------------------------------------------------

def test_branch_points_are_the_official_formula():
    assert branch_points(128, 2) == [128, 64, 0]  # both recipes: 128 steps, s = 2
    assert branch_points(24, 2) == [24, 12, 0]
    assert branch_points(128, 4) == [128, 96, 64, 32, 0]
    assert branch_points(10, 3) == [10, 7, 4, 0]  # 10 - int(10/3), 10 - int(20/3)
    assert branch_points(4, 8) == [4, 3, 2, 1, 0]  # duplicates dropped (the official set())
    assert branch_points(5, 1) == [5, 0]  # no inner level: the root's children are the leaves
    for total in range(1, 33):
        for s in range(1, 10):  # the official expression, transcribed
            official = sorted(list(set([total] + [total - int(k * total / s) for k in range(1, s + 1)])), reverse=True)
            assert branch_points(total, s) == official


def test_tree_shape_levels_leaves_and_node_ids():
    shape = tree_shape(128, DTreeRPOConfig())
    assert shape.points == (128, 64, 0) and shape.children == (4, 4)  # num_tree_samples at the root, then T
    assert shape.leaves == 16 and [shape.nodes_at(d) for d in range(3)] == [1, 4, 16]  # 21 nodes, as DARE's
    assert shape.node_id(0, 0) == 0 and shape.node_id(1, 3) == 4 and shape.node_id(2, 0) == 5
    assert shape.node_id(2, 15) == 20
    deep = tree_shape(12, DTreeRPOConfig(tree_contraction_factor=3, num_tree_samples=2, tree_branch_factor=3))
    assert deep.children == (2, 3, 3) and deep.leaves == 18


def test_the_rollout_builds_the_tree_level_by_level():
    """Sampled tree (temperature 0.9, two blocks, a mid-block branch): rows, paths, shared ancestors, kept tokens,
    and the number of tokens each level commits = the sampler's schedule over its global steps."""
    model = _no_mask_proposals(micro_llada(0))
    settings = {"gen_length": 8, "steps": 8, "block_length": 4, "temperature": 0.9}
    algo, batch, info, _ = _tree_batch(model, knobs={"tree_contraction_factor": 3, "num_tree_samples": 2,
                                                     "tree_branch_factor": 3}, settings=settings, prompts=2)
    shape = algo.shape
    assert shape.points == (8, 6, 3, 0) and shape.children == (2, 3, 3)
    leaves = shape.leaves
    assert batch.num_rows == 2 * leaves and batch.group_size == leaves
    assert algo.micro_batch_block(batch) == leaves
    paths = batch.trajectories
    p = batch.prompt_ids.shape[1]
    # LLaDA's schedule: 4 steps per block, 1 token per step; masks left after the global steps 0..1, 0..4, 0..7
    per_block = get_num_transfer_tokens(torch.tensor([4]), 4)[0].tolist()
    assert per_block == [1, 1, 1, 1]
    masks_left = [8, 6, 3, 0]
    for r, path in enumerate(paths):
        assert isinstance(path, TreePath) and path.tree == r // leaves and path.leaves == leaves
        assert path.steps == shape.points and path.states.shape == (4, p + 8)
        assert torch.equal(path.states[0, :p], batch.prompt_ids[r]) and bool((path.states[0, p:] == MASK).all())
        assert torch.equal(path.states[-1], info["output"].canvas[r])
        q = r % leaves
        assert path.nodes == (0, 1 + q // 9, 3 + q // 3, 9 + q)  # breadth-first ids along the path
        for d in range(3):
            parent, child = path.states[d], path.states[d + 1]
            kept = parent != MASK
            assert torch.equal(child[kept], parent[kept])  # a decoded token is never changed
            assert int((child[p:] == MASK).sum()) == masks_left[d + 1]
    # level 1 (global steps 2..4) finishes block 0 and starts block 1; level 0 only touched block 0
    for path in paths:
        assert bool((path.states[1, p + 4:] == MASK).all())
        assert not bool((path.states[2, p:p + 4] == MASK).any())
    # children of one parent share its canvas and (sampled) differ
    for tree in range(2):
        rows = [paths[r] for r in range(tree * leaves, (tree + 1) * leaves)]
        for a in rows:
            for b in rows:
                if a.nodes[2] == b.nodes[2]:
                    assert torch.equal(a.states[2], b.states[2])
        assert len({tuple(r.states[-1].tolist()) for r in rows}) > 1
    stats = info["output"].stats
    assert stats.generated_tokens == 8 and stats.tokens_per_forward == 1.0
    # each level decodes every row of the level at once: 2 + 3 + 3 global steps
    assert stats.forwards == 8


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("settings", [
    {"gen_length": 8, "steps": 8, "temperature": 0.0},
    {"gen_length": 8, "steps": 4, "temperature": 0.0},  # 2 tokens a step, branches mid-block (4 -> 3 -> 2 -> 0)
    {"gen_length": 12, "steps": 6, "block_length": 4, "temperature": 0.0},
])
def test_a_greedy_tree_has_every_leaf_equal_to_the_sampler(family, settings):
    """At temperature 0 every continuation is the sampler's: each leaf equals `generate` (LLaDA's semi-AR
    low-confidence sampler; for Dream on its shifted logits, as DARE's tree rollout), padded prompts included."""
    model = (micro_llada if family == "llada" else micro_dream)(0)
    model.eval()
    prompts = torch.randint(0, 10, (3, 5), generator=torch.Generator().manual_seed(1))
    pmask = torch.ones_like(prompts)
    prompts[1, :2], pmask[1, :2] = PAD, 0
    algo = _algo(model.traits, tree_contraction_factor=3)
    own = algo.generate_rollouts(model, prompts, pmask, settings=dict(settings), generator=None)
    ref = generate(model, prompts, pmask, sampler="llada", **settings)
    assert not bool((ref.canvas == MASK).any())  # no mask-id proposals: the two rules then coincide
    leaves = own.output.canvas.view(3, own.rows_per_prompt, -1)
    assert own.rows_per_prompt == 64
    for i in range(3):
        assert all(torch.equal(leaves[i, j], ref.canvas[i]) for j in range(own.rows_per_prompt))


@pytest.mark.parametrize("remasking", ["low_confidence", "random"])
def test_the_tree_does_not_depend_on_the_rollout_chunking(remasking):
    """Rows decode `forward_batch_size` at a time, step by step: on CPU the same noise, hence the same tree."""
    model = micro_llada(0)
    model.eval()
    prompts = torch.randint(0, 10, (3, 5), generator=torch.Generator().manual_seed(1))
    settings = {"gen_length": 8, "steps": 8, "temperature": 0.9, "remasking": remasking}
    trees = []
    for chunk in (None, 3, 7):
        algo = _algo(model.traits)
        algo.forward_batch_size = chunk
        own = algo.generate_rollouts(model, prompts, None, settings=settings,
                                     generator=torch.Generator().manual_seed(5))
        trees.append(torch.stack([t.states for t in own.trajectories]))
    assert all(torch.equal(trees[0], t) for t in trees[1:])


def test_rows_are_graded_by_the_loop_as_its_own_rollouts():
    model = micro_llada(0)
    algo, batch, info, task = _tree_batch(model, prompts=2, group=2)
    leaves = algo.shape.leaves
    assert batch.num_rows == 2 * 2 * leaves and batch.group_size == 2 * leaves
    tok = CharTokenizer()
    for r in range(batch.num_rows):
        item = task.items[r // (2 * leaves)]  # prompt rows: 2 copies of each prompt, each its own tree
        assert batch.trajectories[r].tree == r // leaves
        kept = []
        for t in batch.completion_ids[r].tolist():
            if t == EOS:
                break
            kept.append(t)
        assert float(batch.rewards[r]) == pytest.approx(task.grade(tok.decode(kept), item).reward)
    assert len(info["correct"]) == batch.num_rows


# --- values, local advantages, active positions ----------------------------------------------------------------------

def _hand_tree():
    """Tree 0 with n0 = 2, T = 3: node 1 -> leaves 3, 4, 5 (rewards 1, 0, 0); node 2 -> leaves 6, 7, 8 (1, 1, 1)."""
    paths = []
    for q in range(6):
        states = torch.full((3, 4), MASK)
        states[:, 0] = 7
        paths.append(TreePath(tree=0, nodes=(0, 1 + q // 3, 3 + q), states=states, steps=(4, 2, 0), leaves=6))
    return paths, torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])


def test_values_and_local_advantages_on_a_hand_tree():
    paths, rewards = _hand_tree()
    t = tree_table(paths, rewards)
    assert t.values[(0, 1)] == pytest.approx(1 / 3) and t.values[(0, 2)] == pytest.approx(1.0)
    assert t.values[(0, 0)] == pytest.approx(2 / 3)  # the root: mean of its children's values
    assert t.children[(0, 0)] == [1, 2] and t.children[(0, 1)] == [3, 4, 5]
    # leave-one-out among siblings (official `value - mean(other siblings)`)
    want = {1: 1 / 3 - 1.0, 2: 1.0 - 1 / 3, 3: 1.0, 4: -0.5, 5: -0.5, 6: 0.0, 7: 0.0, 8: 0.0}
    assert {k[1]: v for k, v in t.advantage.items()} == pytest.approx(want)
    assert t.owner[(0, 1)] == 0 and t.owner[(0, 2)] == 3 and t.owner[(0, 5)] == 2
    mean = tree_table(paths, rewards, "mean").advantage
    assert mean[(0, 1)] == pytest.approx(-1 / 3) and mean[(0, 3)] == pytest.approx(2 / 3)
    std = tree_table(paths, rewards, "mean_std").advantage
    assert std[(0, 1)] == pytest.approx(-(2 / 3) / 2 / ((2 / 3) / math.sqrt(2) + 1e-6))
    # no siblings: the official baseline is 0, A = v
    assert sibling_advantages(torch.tensor([0.25]), "leave_one_out").tolist() == [0.25]
    assert sibling_advantages(torch.tensor([0.25]), "mean").tolist() == [0.0]


def test_prepare_puts_segments_on_their_owner_rows():
    paths, rewards = _hand_tree()
    batch = RolloutBatch(torch.full((6, 1), 7), torch.ones(6, 1, dtype=torch.long), torch.zeros(6, 3, dtype=torch.long),
                         torch.ones(6, 3, dtype=torch.long), rewards, group_size=6, trajectories=paths)
    algo = _algo()
    st = algo.prepare(batch, None, None, generator=torch.Generator(), num_iterations=1).rows
    assert st["owned"].tolist() == [[True, True], [False, True], [False, True],
                                    [True, True], [False, True], [False, True]]
    assert st["adv"][:, 0].tolist() == pytest.approx([-2 / 3] * 3 + [2 / 3] * 3)
    assert st["adv"][:, 1].tolist() == pytest.approx([1.0, -0.5, -0.5, 0.0, 0.0, 0.0])
    assert st["value"][:, 0].tolist() == pytest.approx([2 / 3] * 6)
    assert int(st["owned"].sum()) == 8  # one segment per non-root node
    # a micro-batch cutting the tree is refused
    with pytest.raises(DataError, match="whole trees"):
        algo.backward(micro_llada(0), batch.select(slice(0, 3)), algo.prepare(
            batch, None, None, generator=torch.Generator(), num_iterations=1).select(slice(0, 3)),
            torch.zeros(3), loss_scale=1.0, iteration=0)


def test_completion_mask_and_active_positions_by_hand():
    parent = torch.tensor([MASK, MASK, 3, MASK, MASK, MASK])
    child = torch.tensor([5, EOS, 3, MASK, 7, EOS])
    # decoded and up to (including) the first EOS: positions 0, 1
    assert completion_mask(child, MASK, EOS).tolist() == [True, True, False, False, False, False]
    # changed = masked in the parent, decoded in the child: 0, 1, 4, 5; cut at the first EOS
    assert active_positions(parent, child, MASK, EOS).tolist() == [True, True, False, False, False, False]
    no_eos = torch.tensor([5, 6, 3, MASK, 7, 8])
    assert completion_mask(no_eos, MASK, EOS).tolist() == [True, True, True, False, True, True]
    assert active_positions(parent, no_eos, MASK, EOS).tolist() == [True, True, False, False, True, True]


def test_segment_logprobs_are_one_forward_of_the_parent():
    model, ref = micro_llada(0), micro_llada(1)
    algo, batch, _, _ = _tree_batch(model, prompts=2, knobs={"kl_beta": 0.05})
    p = batch.prompt_ids.shape[1]
    st = algo.prepare(batch, model, ref, generator=torch.Generator(), num_iterations=2).rows
    checked = 0
    with torch.no_grad():
        for r, path in enumerate(batch.trajectories):
            for d in range(path.depth):
                if not bool(st["owned"][r, d]):
                    assert not bool(st["active"][r, d].any()) and not bool(st["old_logp"][r, d].any())
                    continue
                parent, child = path.states[d], path.states[d + 1]
                act = active_positions(parent[p:], child[p:], MASK, EOS)
                assert torch.equal(st["active"][r, d], act)
                for key, m in (("old_logp", model), ("ref_logp", ref)):
                    logits = m(parent[None], **path.model_kwargs)
                    lp = torch.log_softmax(logits[0, p:].float(), -1).gather(-1, child[p:, None])[:, 0]
                    assert torch.allclose(st[key][r, d], lp * act, atol=1e-6)
                checked += 1
    assert checked == int(st["owned"].sum()) == 2 * (4 + 16)


# --- self-distillation ------------------------------------------------------------------------------------------------

def test_the_schedule_by_hand():
    kw = dict(lambda_max=3e-3, gamma=2.0, tau_max=2.0, beta=0.7)
    assert sd_schedule(0, 100, **kw) == (0.0, 2.0)  # off at the start, the softest weights
    lam, tau = sd_schedule(100, 100, **kw)
    assert lam == pytest.approx(3e-3) and tau == 1e-6  # full weight at the end; tau floored at 1e-6
    lam, tau = sd_schedule(50, 100, **kw)
    assert lam == pytest.approx(3e-3 * (math.exp(1.0) - 1) / (math.exp(2.0) - 1))
    assert tau == pytest.approx(2.0 * 0.5 ** 0.7)
    assert sd_schedule(250, 100, **kw) == sd_schedule(100, 100, **kw)  # progress clamped to [0, 1]
    assert sd_schedule(5, 0, **kw) == sd_schedule(1, 1, **kw)  # T floored at 1 (official max(1, T))


def _official_sd(logp_parent, tokens, active, adv, tau):
    """The official group loop (`compute_loss`, self-distillation branch) for one group, transcribed."""
    total, count = torch.tensor(0.0), 0
    if tokens.shape[0] <= 1:
        return total, count
    pos = adv > 0
    if pos.sum().item() == 0:
        return total, count
    w = torch.softmax(adv[pos] / tau, dim=0)
    group_active, toks = active[pos] > 0, tokens[pos]
    for j in range(tokens.shape[1]):
        act = group_active[:, j]
        if not act.any():
            continue
        uniq, inv = torch.unique(toks[act, j], return_inverse=True)
        qw = torch.zeros_like(uniq, dtype=torch.float32)
        qw.index_add_(0, inv, w[act].float())
        q = qw / (qw.sum() + 1e-8)
        total = total + torch.sum(q * (torch.log(q + 1e-8) - logp_parent[j].gather(0, uniq)))
        count += 1
    return total, count


@pytest.mark.parametrize("seed", range(6))
def test_self_distillation_term_matches_the_official_loop(seed):
    g = torch.Generator().manual_seed(seed)
    k, c, v = 5, 7, 6
    logp = torch.log_softmax(torch.randn(c, v, generator=g), -1)
    tokens = torch.randint(0, 3, (k, c), generator=g)  # few distinct tokens: duplicates at most positions
    active = torch.rand(k, c, generator=g) > 0.4
    adv = torch.randn(k, generator=g)
    got, n = self_distillation_terms(logp, tokens, active, adv, tau=0.7)
    want, m = _official_sd(logp, tokens, active, adv, 0.7)
    assert n == m and torch.allclose(got, want, atol=1e-6)
    assert self_distillation_terms(logp, tokens[:1], active[:1], adv[:1].abs(), 0.7)[1] == 0  # one child
    assert self_distillation_terms(logp, tokens, active, -adv.abs() - 0.1, 0.7)[1] == 0  # none positive


# --- the loss ---------------------------------------------------------------------------------------------------------

def _hand_objective(model, batch, old, ref_logp, *, eps_low, eps_high, beta, lam, tau):
    """The official `compute_loss` on every segment of `batch`, written out: one forward of the parent per segment,
    the official leave-one-out advantages from the rewards, the self-distillation loop with one representative
    parent forward per group."""
    paths, p = batch.trajectories, batch.prompt_ids.shape[1]
    # values and advantages, independently of the plug-in
    nodes = {}
    for r, path in enumerate(paths):
        for d in range(path.depth + 1):
            nodes.setdefault((path.tree, path.nodes[d]), {"level": d, "state": path.states[d], "children": [],
                                                          "parent": None if d == 0 else (path.tree, path.nodes[d - 1]),
                                                          "row": r})
    for key, node in nodes.items():
        if node["parent"] is not None and key not in nodes[node["parent"]]["children"]:
            nodes[node["parent"]]["children"].append(key)
    for r, path in enumerate(paths):
        nodes[(path.tree, path.nodes[-1])]["value"] = float(batch.rewards[r])
    for d in range(paths[0].depth - 1, -1, -1):
        for node in nodes.values():
            if node["level"] == d:
                node["value"] = sum(nodes[c]["value"] for c in node["children"]) / len(node["children"])
    segs = []
    for key, node in nodes.items():
        if node["parent"] is None:
            continue
        sib = [nodes[s]["value"] for s in nodes[node["parent"]]["children"] if s != key]
        adv = node["value"] - (sum(sib) / len(sib) if sib else 0.0)
        segs.append((key, node["parent"], adv))
    policy, groups = 0.0, {}
    for key, parent, adv in segs:
        pstate, cstate = nodes[parent]["state"], nodes[key]["state"]
        row, level = nodes[key]["row"], nodes[parent]["level"]
        kw = paths[row].model_kwargs
        lp_all = torch.log_softmax(model(pstate[None], **kw)[0, p:].float(), -1)
        comp_p, comp_c = pstate[p:], cstate[p:]
        changed = (comp_p == MASK) & (comp_c != MASK)
        eos = (comp_c == EOS).nonzero()
        cut = int(eos[0]) if len(eos) else comp_c.numel()
        act = (changed & (comp_c != MASK) & (torch.arange(comp_c.numel()) <= cut)).float()
        logp = lp_all.gather(-1, comp_c[:, None])[:, 0] * act
        ratio = torch.exp(logp - old[(row, level)])
        obj = torch.min(ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv)
        n_act = act.sum().clamp(min=1)
        seg = -(obj * act).sum() / n_act
        delta = ref_logp[(row, level)] - logp
        seg = seg + beta * ((torch.exp(delta) - delta - 1) * act).sum() / n_act
        policy = policy + seg
        groups.setdefault(parent, []).append((comp_c, act, adv))
    policy = policy / len(segs)
    sd_sum, sd_count = torch.tensor(0.0), 0
    for parent, members in groups.items():
        row = nodes[parent]["row"]
        lp_parent = torch.log_softmax(model(nodes[parent]["state"][None], **paths[row].model_kwargs)[0, p:].float(), -1)
        toks = torch.stack([m[0] for m in members])
        acts = torch.stack([m[1] for m in members])
        advs = torch.tensor([m[2] for m in members])
        s, n = _official_sd(lp_parent, toks, acts, advs, tau)
        sd_sum, sd_count = sd_sum + s, sd_count + n
    return policy + lam * sd_sum / max(sd_count, 1)


def test_gradient_matches_the_hand_written_objective():
    model, ref = micro_llada(0), micro_llada(1)
    knobs = {"kl_beta": 0.05, "clip_eps": 0.2, "clip_eps_high": 0.3, "sd_lambda_max": 0.5, "sd_gamma": 2.0,
             "sd_tau_max": 2.0, "sd_beta": 0.7}
    algo, batch, _, _ = _tree_batch(model, prompts=2, knobs=knobs, settings={"gen_length": 4, "steps": 4,
                                                                             "temperature": 1.5})
    assert float(batch.rewards.std()) > 0
    state = algo.prepare(batch, model, ref, generator=torch.Generator(), num_iterations=2)
    noise = torch.randn(state.rows["old_logp"].shape, generator=torch.Generator().manual_seed(3)) * 0.4
    state.rows["old_logp"] = state.rows["old_logp"] + noise * state.rows["active"]  # ratios off 1: clipping
    algo.optimizer_step, algo.total_optimizer_steps = 3, 10
    model.zero_grad()
    metrics = algo.backward(model, batch, state, algo.advantages(batch.rewards, batch.group_size), loss_scale=1.0,
                            iteration=1)
    got = [p.grad.clone() for p in model.parameters()]
    lam, tau = sd_schedule(4, 10, lambda_max=0.5, gamma=2.0, tau_max=2.0, beta=0.7)
    assert metrics["sd_lambda"] == pytest.approx(lam) and metrics["sd_pairs"] > 0 and metrics["clip_frac"] > 0
    old = {(r, d): state.rows["old_logp"][r, d] for r in range(batch.num_rows) for d in range(2)}
    refs = {(r, d): state.rows["ref_logp"][r, d] for r in range(batch.num_rows) for d in range(2)}
    model.zero_grad()
    want = _hand_objective(model, batch, old, refs, eps_low=0.2, eps_high=0.3, beta=0.05, lam=lam, tau=tau)
    want.backward()
    assert metrics["loss"] == pytest.approx(float(want.detach()), rel=1e-5, abs=1e-7)
    for a, p in zip(got, model.parameters()):
        assert torch.allclose(a, p.grad, atol=1e-6, rtol=1e-4)


def test_whole_trees_make_micro_batches_that_sum_to_the_batch():
    """Without self-distillation (its mean runs over a micro-batch's pairs) every tree has as many segments, so two
    micro-batches of one tree each at loss scale 1/2 give the whole batch's gradient."""
    model = micro_llada(0)
    algo, batch, _, _ = _tree_batch(model, prompts=2, knobs={"self_distillation": False})
    leaves = algo.micro_batch_block(batch)
    state = algo.prepare(batch, model, None, generator=torch.Generator(), num_iterations=1)
    adv = algo.advantages(batch.rewards, batch.group_size)
    model.zero_grad()
    algo.backward(model, batch, state, adv, loss_scale=1.0, iteration=0)
    full = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    for sl in _micro_slices(batch.num_rows, 3, leaves):  # 3 rows asked: rounded up to one tree
        assert sl.stop - sl.start == leaves
        algo.backward(model, batch.select(sl), state.select(sl), adv[sl], loss_scale=0.5, iteration=0)
    for a, p in zip(full, model.parameters()):
        assert torch.allclose(a, p.grad, atol=1e-7)
    assert _micro_slices(32, 40, 16) == [slice(0, 32)]
    with pytest.raises(ConfigError):
        _micro_slices(30, 8, 16)


def test_leaf_advantages_for_the_metrics():
    algo = _algo()
    algo.check_rollout({"gen_length": 4, "steps": 4})
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0] * 4)  # sibling blocks of T = 4 leaves
    assert algo.advantages(rewards, 16).tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3] * 4)


# --- through the loop -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [micro_llada, micro_dream])
def test_trains_through_the_shared_loop(make):
    model = make(0)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    history = []
    res = train_rl(model, CharTokenizer(), ReverseTask(), "dtreerpo",
                   rl_settings(steps=4, mu=2, group_size=1, batch_prompts=2, beta_kl=0.02, advantage="algorithm"),
                   RLRunOptions(progress=False, micro_batch_size=5, sink=lambda s, m: history.append(m)))
    assert res.optimizer_steps == 4 and res.final_step == 2
    assert all(math.isfinite(m["loss"]) for m in history)
    assert history[0]["segments"] == 20 and history[0]["tree_depth"] == 2
    assert history[-1]["sd_lambda"] > 0 and history[0]["optimizer_step"] == 2
    assert any(not torch.equal(v, start[k]) for k, v in res.policy.state_dict().items())


def test_a_lora_policy_trains_with_the_adapters_off_as_reference():
    """The paper recipe's shape: LoRA, a KL term (reference = adapters disabled), mu > 1."""
    res = train_rl(micro_llada(0), CharTokenizer(), ReverseTask(), "dtreerpo",
                   rl_settings(steps=2, mu=2, group_size=1, batch_prompts=2, beta_kl=0.05, lora={"r": 4, "alpha": 8}),
                   RLRunOptions(progress=False))
    assert res.optimizer_steps == 2 and math.isfinite(res.history[-1]["kl"]) and res.history[-1]["kl"] >= 0


# --- settings ---------------------------------------------------------------------------------------------------------

def test_settings_are_checked():
    with pytest.raises(ConfigError, match="mc_samples"):
        _algo(mc_samples=2)
    with pytest.raises(ConfigError, match="sibling baseline"):
        _algo(advantage="nope")
    algo = _algo()
    for bad, match in (({"threshold": 0.9}, "unsupported"), ({"use_cache": "prefix"}, "unsupported"),
                       ({"cfg_scale": 1.0}, "guidance"), ({"remasking": "entropy"}, "remasks"),
                       ({"gen_length": 8, "block_length": 4, "steps": 3}, "multiple"),
                       ({"gen_length": 6, "block_length": 4}, "multiple")):
        with pytest.raises(ConfigError, match=match):
            algo.check_rollout({"gen_length": 4, **bad})
    out = algo.check_rollout({"gen_length": 4, "steps": 4, "remasking": "random", "return_trajectory": True})
    assert out["gen_length"] == 4 and algo.sampler.remasking == "random"


def test_the_catalogue_knobs_are_the_plugins_with_official_aliases():
    spec = catalogue.algorithm("dtreerpo")
    assert spec.plugin == "dtreerpo" and spec.knobs is DTreeRPOConfig is get_algorithm("dtreerpo").Config
    c = DTreeRPOConfig()
    assert (c.tree_branch_factor, c.tree_contraction_factor, c.num_tree_samples) == (4, 2, 4)
    assert (c.self_distillation, c.sd_lambda_max, c.sd_gamma, c.sd_tau_max, c.sd_beta) == (True, 3e-3, 2.0, 2.0, 0.7)
    assert c.clip_eps == 0.4 and c.sd_max_steps is None
    official = DTreeRPOConfig(enable_self_distillation_loss=False, self_distillation_lambda_max=0.1, max_steps=7)
    dare = DTreeRPOConfig(enable_self_distillation=False, sd_lambda_max=0.1, sd_max_steps=7)
    assert official == dare and not dare.self_distillation
    assert {"enable_self_distillation", "max_steps"} <= set(spec.knob_names)


def test_the_paper_scale_is_dares_script():
    from dare_bench.registry import get

    for name in ("dtreerpo-llada-sudoku", "dtreerpo-llada-gsm8k", "dtreerpo-dream-countdown"):
        train = get(name).scales["paper"].train
        assert (train.lr, train.batch_prompts, train.group_size, train.mu, train.beta_kl, train.clip_eps) == (
            3e-5, 16, 1, 12, 0.01, 0.4)
        assert (train.weight_decay, tuple(train.adam_betas), train.max_grad_norm, train.epochs) == (0.1, (0.9, 0.99),
                                                                                                     0.2, 10)
        assert (train.lora.r, train.lora.alpha, train.lora.dropout) == (128, 64, 0.05)
        r = train.rollout
        assert (r.gen_length, r.steps, r.block_length, r.temperature, r.remasking) == (256, 128, 32, 0.9,
                                                                                       "low_confidence")
    micro = get("dtreerpo-dream-sudoku").scales["micro"].train
    assert micro.group_size == 1 and micro.rollout.remasking == "low_confidence" and micro.mu == 2


def test_bench_alignment_refuses_plugin_rollouts():
    from dare_bench.bench.alignment import run_alignment

    with pytest.raises(ConfigError, match="own rollouts"):
        run_alignment(["dtreerpo-llada-sudoku"], "micro", batches=1, sft_draws=1, seed=0, progress=False)
