"""Gradient snapshots: every trained algorithm's loss and gradient on a pinned batch, for `dare-bench check`.

Why: at micro scale a sign-flipped RL loss passes the score / curve checks (the GRPO loss is 0 at mu = 1, the grad
norm keeps its size, and 3 steps move scores by about one item). A snapshot of the gradient itself does not: a flip
turns it around (cosine -1), a rescale changes its norm.

What, RL: for each plug-in x backbone (one backbone per attention kind the plug-in declares: LLaDA for bidirectional,
SDAR for block-causal), a micro model from a fixed seed, a toy "reverse the 3 digits" task with a dense reward, one
rollout batch through the loop's own `rollout_batch` (so trajectories, graders and plug-in-owned rollouts are what
the loop hands over) with a fixed generator, then `advantages` -> `prepare` -> `backward` (mu = 1, iteration 0;
with a KL term to a second micro model where the plug-in takes one). Recorded: the loss, the gradient norm, a
64-dim fixed random projection of the flattened gradient (Gaussian rows drawn chunk-wise from a seeded
torch.Generator: no D x 64 matrix is materialised), and a fingerprint of the rollout batch (a failure with a changed
fingerprint means the sampler, the model or the task moved, not necessarily the loss).

The catalogue's trained algorithms without a plug-in (SUPERVISED) on both backbones (ar, cap, wsd, wsd-cap: on SDAR
only, block diffusion being all they apply to), through the per-batch loss their trainer steps with: sft
(`sft.sft_batch_loss`: the masked-diffusion SFT loss; on SDAR the BD3 `[noisy; clean]` layout) on the gold reversals
as the pipeline builds them (`sft_examples`, EOS-padded to 8), 16 rows; lora the same on the micro model wrapped by
`trainers.lora.apply_lora` (r 8, alpha 16), the adapters' gradient only; vrpo (`preference.preference_batch_loss`:
DPO on the ELBO, 2 MC samples, antithetic masks, beta 0.2) on 8 fixed pairs (chosen the reversal, rejected the
digits copied) against a second micro model as the reference. Noise and masks from a fixed generator; the
fingerprint is of the collated batch. ar: sft's loss at block size 1 (the next-token loss); cap: sft's + 2.0 x the
confidence loss; wsd: the WSD trainer's step loss at its warmup stage (block 2), the documents packed two to a row;
wsd-cap: the decay stage (block 4) with the confidence loss. `tests/check/test_gradient_snapshots.py` enumerates the
catalogue, so an algorithm that trains without a snapshot fails there.

    dare-bench check                          # compares every snapshot (with the score checks); --no-gradients skips
    dare-bench check --record-gradients       # (re-)records dare_bench/reproductions/baselines/gradients.json
    python -c "from dare_bench.check.gradients import noise; import json; print(json.dumps(noise(), indent=1))"

CPU only (micro models, about a second per snapshot on one thread); one GPU or torchrun: not needed.
"""

from __future__ import annotations

import hashlib
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from dare_bench.errors import DataError

FORMAT = "dare-bench-gradients"
VERSION = 1
FILENAME = "gradients.json"
BACKBONES = {"bidirectional": "llada", "block_causal": "sdar"}  # one micro backbone per attention kind
PRESETS = {"llada": ("tiny-llada", dict(n_layers=1, d_model=32, n_heads=2, n_kv_heads=2, mlp_hidden_size=64)),
           "sdar": ("tiny-sdar", dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                      num_key_value_heads=1, head_dim=16, intermediate_size=64, max_window_layers=1))}
PAD, EOS, MASK, VOCAB = 13, 14, 15, 16
POLICY_SEED, REFERENCE_SEED, ROLLOUT_SEED, PREPARE_SEED, PROJECTION_SEED = 0, 1, 2, 3, 4
PROMPTS, GROUP = 4, 4  # 16 rows
SAMPLER = {"gen_length": 8, "steps": 8, "temperature": 0.9}
KL_BETA = 0.04  # exercises the reference branch where the plug-in takes a KL term (spg, wd1, tracerl refuse one)
MC_SAMPLES = 2  # for plug-ins whose default is more (BGPO / EBPO: 16): same code path, 8x cheaper
# The catalogue's trained algorithms without an RL plug-in, each snapshotted on every backbone above (their losses
# take the attention kind from the backbone's traits): sft and lora (kind sft) through `sft.sft_batch_loss`, vrpo
# (kind preference) through `preference.preference_batch_loss`, the per-batch losses their trainers step with.
SUPERVISED = ("sft", "lora", "vrpo", "ar", "cap", "wsd", "wsd-cap", "bdlm")
SFT_COPIES, PAIR_COPIES = GROUP, 2  # each prompt 4x in the SFT batch (16 rows), 2x in VRPO's (8 pairs, 16 rows)
LORA = dict(r=8, alpha=16, dropout=0.0)  # the tiny / micro adapters (reproductions/_defaults/algorithms/lora.yaml)
VRPO = dict(beta=0.2, mc_samples=2)  # dpo_beta's default, the micro MC budget (_defaults/kinds/preference.yaml)
# LLaDA2.0's recipe (block diffusion only, so on SDAR alone): ar = the SFT loss at block size 1 (the next-token loss);
# cap = the SFT loss + confidence_beta 2.0 (its default) x the confidence loss; wsd = one step of the WSD trainer's
# loss at the warmup stage (block 2, BD3 layout), the 12-token documents packed two to a row of seq_len 24; wsd-cap
# the same schedule's decay stage (block 4), where it adds confidence_beta 2.0 x the confidence loss; bdlm (the
# four-arm comparison's from-scratch arm) is the sft loss under another recipe, so its snapshot equals sft's
CAP = dict(confidence_beta=2.0)
WSD = dict(seq_len=24, stages=[{"phase": "warmup", "block_size": 2, "steps": 1},
                               {"phase": "stable", "block_size": 24, "steps": 1, "layout": "single"},
                               {"phase": "decay", "block_size": 4, "steps": 1}])
DIMS = 64
CHUNK = 1 << 16  # gradient entries per projection block: at most DIMS x CHUNK random numbers at a time

# Tolerances: TOL_FACTOR x the largest noise `noise()` measured over the 15 RL entries (Intel Xeon, torch 2.13 CPU,
# float32, recorded at 1 thread), with a floor. Measured maxima:
#                                       1 - cos      |norm ratio - 1|   |d loss| / |loss|   (|d loss|)
#   1 vs 2 torch threads                 8.2e-15      6.5e-9             0                  (0)
#   one vs two micro-batches (1)         3.6e-14      2.5e-8             1.3e-6             (8.4e-9)
#   float32 vs float64 gradient (2)      4.7e-14      4.9e-7             2.5e-6             (7.0e-8)
# (1) rows split in half, loss_scale 1/2, on the plug-ins for which that is the same loss (dtreerpo, ebpo, espo,
#     gdpo, mdpo, wd1); for the token-mean ones (bgpo, cj_grpo, coupled_grpo, d1, justgrpo, spg, tracerl) a split
#     changes the normaliser, so 1 - cos = 3e-4 ... 2e-2 there: a different loss, not noise, and not used.
# (2) the platform proxy: the float32 rollout batch, then prepare / backward in float64. Another CPU or BLAS (AVX2
#     vs AVX-512 kernels, other reduction orders) differs from this machine's float32 result by about its float32
#     rounding error, which is what this measures. 1 - cos is quadratic in a relative perturbation (4.7e-14 is a
#     ~3e-7 perturbation), hence its floor.
# The 6 sft / lora / vrpo entries, measured the same way, lie under these (maxima): 1 vs 2 threads 2.2e-16 / 0 / 0;
# two micro-batches (data-parallel shares of the same loss) 1.9e-14 / 3.3e-8 / 1.3e-7; float64 4.6e-14 / 9.5e-8 /
# 8.6e-8 (the sft / lora loss difference is 0 there: sft_loss takes its cross-entropy in float32), so the tolerances
# stand as derived.
# A sampler near-tie on another platform could still change a rollout token: then the batch fingerprint differs,
# the failure says so, and the entry must be re-recorded there (none seen at 1 vs 2 threads or float64).
# Any of these still fails a loss changed by more than ~1e-3 of its gradient: a flip gives 1 - cos = 2, a x2 / x0.5
# rescale |norm ratio - 1| = 1 / 0.5.
TOL_FACTOR = 1000
COS_TOL = max(TOL_FACTOR * 4.7e-14, 1e-6)  # on 1 - cosine of the projections: 1e-6 (floor: a 1.4e-3 relative tilt)
NORM_TOL = max(TOL_FACTOR * 4.9e-7, 1e-4)  # on |norm / recorded norm - 1|: 4.9e-4
LOSS_TOL = max(TOL_FACTOR * 2.5e-6, 1e-4)  # on |loss - recorded| / |recorded|: 2.5e-3 ...
LOSS_ABS_FLOOR = max(TOL_FACTOR * 7.0e-8, 1e-6)  # ... plus 7e-5 absolute (a GRPO loss that is ~0 by construction)


# ---------------------------------------------------------------------------------------------- the pinned batch

class CharTokenizer:
    """Digits 0-9 are ids 0-9, ':' is 10; PAD / EOS / MASK the special ids above (HF-like calls only; the plug-in
    tests' fakes use it too)."""

    pad_token_id, eos_token_id, mask_token_id, bos_token_id = PAD, EOS, MASK, None
    _chars = "0123456789:"

    def __call__(self, texts, add_special_tokens: bool = False) -> dict[str, Any]:
        """A batch call as the pipeline's example builders make it (`pipeline.examples.sft_examples`)."""
        one = isinstance(texts, str)
        ids = [self.encode(t) for t in ([texts] if one else texts)]
        return {"input_ids": ids[0] if one else ids}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [self._chars.index(ch) for ch in text]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        out = []
        for i in (ids.tolist() if hasattr(ids, "tolist") else list(ids)):
            if i < len(self._chars):
                out.append(self._chars[i])
            elif not skip_special_tokens:
                out.append({PAD: "<pad>", EOS: "<eos>", MASK: "<mask>"}.get(i, "?"))
        return "".join(out)


class _Grade:
    def __init__(self, correct: bool, reward: float):
        self.correct, self.reward = correct, reward


class _ReverseTask:
    """The prompt is 3 digits and ':'; the right completion is them reversed. The reward is dense (a random micro
    model's groups almost never tie): per position, 1 - |digit - target| / 9 (0 for a missing or non-digit), mean."""

    items = ["381", "527", "064", "912"]

    def format_prompt(self, item: str, template: Any = "plain") -> str:
        return item + ":"

    def format_answer(self, item: str, grader: str | None = None) -> str:
        return item[::-1]

    def grade(self, completion: str, item: str, grader: str = "dare") -> _Grade:
        target = item[::-1]
        close = [1 - abs(int(a) - int(b)) / 9 if a.isdigit() else 0.0 for a, b in zip(completion[:3], target)]
        return _Grade(completion[:3] == target, sum(close) / 3)


def micro_model(backbone: str, seed: int, **overrides):
    """A 1-layer backbone with the 16-token vocabulary, initialised from `seed` (global RNG untouched); `overrides`
    change its preset sizes (the plug-in tests' fakes build theirs here too)."""
    import torch

    from dare_bench.models.families import detect_family
    from dare_bench.models.io import build_model
    from dare_bench.models.presets import preset_config

    preset, sizes = PRESETS[backbone]
    cfg = preset_config(preset, **{**sizes, **overrides})
    cfg = detect_family(cfg).adapt_vocab(cfg, vocab_size=VOCAB, mask_token_id=MASK, eos_token_id=EOS,
                                         pad_token_id=PAD, bos_token_id=None)
    model = build_model(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.init_weights()
    return model


def entries() -> list[tuple[str, str]]:
    """(algorithm, backbone) of every snapshot: every RL plug-in on one backbone per attention kind it declares,
    then sft, lora and vrpo on one backbone per attention kind."""
    from dare_bench import catalogue
    from dare_bench.trainers.algorithms.base import get_algorithm, list_algorithms

    def applies(name: str, backbone: str) -> bool:  # ar / cap / wsd: block diffusion only (AlgorithmSpec.diffusion)
        return catalogue.backbone(backbone).diffusion in catalogue.algorithm(name).diffusion

    return ([(name, BACKBONES[kind]) for name in list_algorithms()
             for kind in get_algorithm(name).attention_kinds if kind in BACKBONES]
            + [(name, backbone) for name in SUPERVISED for backbone in BACKBONES.values() if applies(name, backbone)])


def _plugin(name: str, traits):
    """The plug-in with its defaults, MC samples capped, a KL term where it takes one, micro-sized knobs."""
    from dare_bench.errors import ConfigError
    from dare_bench.trainers.algorithms.base import get_algorithm

    cls = get_algorithm(name)
    config: dict[str, Any] = {}
    if cls.Config.model_fields["mc_samples"].default > MC_SAMPLES:
        config["mc_samples"] = MC_SAMPLES
    if "mask_block_length" in cls.Config.model_fields:  # SPG: blocks of the 8-token completion
        config["mask_block_length"] = 4
    try:
        return cls(dict(config, kl_beta=KL_BETA), traits), dict(config, kl_beta=KL_BETA)
    except ConfigError:  # the plug-in refuses a KL-to-reference term (validate): snapshot it without
        return cls(config, traits), config


def _digest(tensors, extra: bytes = b"") -> str:
    import torch

    h = hashlib.sha256()
    for t in tensors:
        h.update(torch.as_tensor(t).cpu().to(dtype=torch.int64).numpy().tobytes())
    h.update(extra)
    return "sha256:" + h.hexdigest()[:16]


def _fingerprint(batch) -> str:
    return _digest((batch.prompt_ids, batch.completion_ids, batch.completion_mask),
                   repr([round(float(r), 6) for r in batch.rewards]).encode())


def _micro_slices(rows: int, parts: int, block: int) -> list[slice]:
    blocks = rows // block
    if parts <= 1 or blocks < parts or blocks % parts:
        return [slice(0, rows)]
    step = rows // parts
    return [slice(i, i + step) for i in range(0, rows, step)]


def project(params, dims: int = DIMS, seed: int = PROJECTION_SEED) -> list[float]:
    """R g for the flattened gradient g of `params` (None grads count as 0), R with N(0, 1/dims) entries drawn
    block by block (at most dims x CHUNK at a time) from a generator seeded with `seed`: float64, so the projection
    adds no rounding of its own."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = torch.zeros(dims, dtype=torch.float64)
    for p in params:
        g = None if p.grad is None else p.grad.detach().reshape(-1).to("cpu", torch.float64)
        for start in range(0, p.numel(), CHUNK):
            n = min(CHUNK, p.numel() - start)
            r = torch.randn(dims, n, generator=gen, dtype=torch.float64)  # drawn even for a None grad: alignment
            if g is not None:
                out += r @ g[start:start + n]
    return (out / math.sqrt(dims)).tolist()


def snapshot(algorithm: str, backbone: str, *, dtype=None, micro_batches: int = 1) -> dict[str, Any]:
    """The loss, gradient norm, projection and batch fingerprint of `algorithm` on `backbone`'s pinned batch.

    `micro_batches` > 1 splits the rows as the loop does (loss_scale 1 / n, whole `micro_batch_block`s); `dtype`
    (the noise measurement: float64) casts the models after the float32 rollout, so the batch stays the same."""
    import torch

    from dare_bench.trainers.loop import rollout_batch

    if algorithm in SUPERVISED:
        return _supervised_snapshot(algorithm, backbone, dtype=dtype, micro_batches=micro_batches)

    policy = micro_model(backbone, POLICY_SEED)
    algo, config = _plugin(algorithm, policy.traits)
    reference = micro_model(backbone, REFERENCE_SEED) if algo.config.kl_beta > 0 else None
    settings = dict(SAMPLER)
    settings.update(algo.rollout_overrides)
    settings = algo.check_rollout(settings)
    settings["return_trajectory"] = bool(algo.needs_trajectory or settings.get("return_trajectory"))
    task = _ReverseTask()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(POLICY_SEED)  # a plug-in drawing from the global RNG (dropout, a value head) is pinned too
        batch, _ = rollout_batch(policy, CharTokenizer(), task, task.items, list(range(PROMPTS)), GROUP, settings,
                                 generator=torch.Generator().manual_seed(ROLLOUT_SEED), algorithm=algo)
        if dtype is not None:
            policy.to(dtype)
            if reference is not None:
                reference.to(dtype)
        policy.train()
        adv = algo.advantages(batch.rewards, batch.group_size)
        algo.optimizer_step, algo.total_optimizer_steps = 0, 1
        algo.forward_batch_size = batch.num_rows
        state = algo.prepare(batch, policy, reference, generator=torch.Generator().manual_seed(PREPARE_SEED),
                             num_iterations=1)
        policy.zero_grad(set_to_none=True)
        slices = _micro_slices(batch.num_rows, micro_batches, algo.micro_batch_block(batch))
        loss = 0.0
        for sl in slices:
            metrics = algo.backward(policy, batch.select(sl), state.select(sl), adv[sl],
                                    loss_scale=1.0 / len(slices), iteration=0)
            loss += float(metrics["loss"]) / len(slices)
    params = [p for p in policy.parameters() if p.requires_grad]
    norm = math.sqrt(sum(float(p.grad.detach().double().pow(2).sum()) for p in params if p.grad is not None))
    return {"algorithm": algorithm, "backbone": backbone, "config": config, "rows": batch.num_rows,
            "micro_batches": len(slices), "batch_fingerprint": _fingerprint(batch),
            "reward_mean": float(batch.rewards.mean()), "loss": loss, "grad_norm": norm,
            "projection": project(params)}


def _pinned_examples():
    """The SFT batch as the pipeline builds it (`sft_examples`: prompt, gold reversal, EOS-padded to the 8-token
    completion), each prompt SFT_COPIES times; and VRPO's pairs, each prompt PAIR_COPIES times: chosen the reversal,
    rejected the digits copied unreversed (both + EOS)."""
    from dare_bench.pipeline.examples import sft_examples
    from dare_bench.trainers.preference import PreferencePair

    task, tok = _ReverseTask(), CharTokenizer()
    examples = sft_examples(task, tok, task.items, "plain", "dare", pad_to=SAMPLER["gen_length"]) * SFT_COPIES
    pairs = [PreferencePair(tok.encode(task.format_prompt(item)), tok.encode(task.format_answer(item)) + [EOS],
                            tok.encode(item) + [EOS]) for item in task.items] * PAIR_COPIES
    return examples, pairs


def _supervised_snapshot(algorithm: str, backbone: str, *, dtype=None, micro_batches: int = 1) -> dict[str, Any]:
    """`snapshot` of sft / lora / vrpo: the trainer's per-batch loss on the pinned batch, noise / masks from a fixed
    generator, then backward. lora: the project's `apply_lora` on the micro model (the micro adapters), the
    gradient of the adapters only (the trainable parameters). vrpo: against a second micro model as the reference
    (so the margin, hence the loss, is not log 2 by construction), antithetic masks (the default).
    `micro_batches` > 1 splits the rows as data-parallel ranks do (the whole batch's noise drawn from the same
    generator state, each share's loss at weight 1 / n)."""
    import torch

    from dare_bench.config import LoraSettings
    from dare_bench.trainers import preference, sft

    examples, pairs = _pinned_examples()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(POLICY_SEED)  # peft draws the adapters' A from the global RNG
        policy = micro_model(backbone, POLICY_SEED)
        config: dict[str, Any] = {}
        if algorithm == "lora":
            from dare_bench.trainers.lora import apply_lora

            policy = apply_lora(policy, LoraSettings(**LORA))
            config = dict(LORA)
        reference = micro_model(backbone, REFERENCE_SEED).eval().requires_grad_(False) if algorithm == "vrpo" else None
        if dtype is not None:
            policy.to(dtype)
            if reference is not None:
                reference.to(dtype)
        policy.train()
        if algorithm == "vrpo":
            cfg = preference.PreferenceConfig(batch_pairs=len(pairs), **VRPO)
            config = dict(VRPO, antithetic=cfg.antithetic)
            units, fingerprint = len(pairs), _digest(preference.interleave_pairs(pairs, EOS))
        elif algorithm in ("wsd", "wsd-cap"):
            from dare_bench.catalogue.wsd import WsdKnobs
            from dare_bench.trainers.wsd import WsdConfig, set_block_size

            stage, extra = (0, {}) if algorithm == "wsd" else (2, CAP)
            cfg = WsdConfig(schedule=WsdKnobs.model_validate(WSD), steps=None, batch_size=len(examples),
                            packing=True, **extra)
            set_block_size(policy, cfg.schedule.stages[stage].block_size)
            config = dict(WSD, stage=stage, eps=cfg.eps, packing=True, **extra)
            units, fingerprint = len(examples), _digest(sft.collate_own_length(examples, PAD))
        else:
            if algorithm == "ar":
                from dare_bench.trainers.wsd import set_block_size

                set_block_size(policy, 1)
                config = dict(config, block_size=1)
            if algorithm == "cap":
                config = dict(config, **CAP)
            cfg = sft.SFTConfig(batch_size=len(examples), **(CAP if algorithm == "cap" else {}))
            config = dict(config, eps=cfg.eps)
            units, fingerprint = len(examples), _digest(sft.collate(examples, EOS))
        policy.zero_grad(set_to_none=True)
        slices = _micro_slices(units, micro_batches, 1)
        loss = 0.0
        for sl in slices:
            noise = torch.Generator().manual_seed(PREPARE_SEED)  # every share draws the whole batch's noise
            if algorithm == "vrpo":
                value, _ = preference.preference_batch_loss(policy, reference, pairs, cfg, noise, pairs=sl)
            elif algorithm in ("wsd", "wsd-cap"):
                from dare_bench.trainers.wsd import wsd_batch_loss

                value = wsd_batch_loss(policy, examples, cfg, config["stage"], noise, rows=sl)
            else:
                value = sft.sft_batch_loss(policy, examples, cfg, noise, rows=sl)
            (value / len(slices)).backward()
            loss += float(value.detach()) / len(slices)
    params = [p for p in policy.parameters() if p.requires_grad]
    norm = math.sqrt(sum(float(p.grad.detach().double().pow(2).sum()) for p in params if p.grad is not None))
    return {"algorithm": algorithm, "backbone": backbone, "config": config,
            "rows": 2 * units if algorithm == "vrpo" else units, "micro_batches": len(slices),
            "batch_fingerprint": fingerprint, "loss": loss, "grad_norm": norm, "projection": project(params)}


def key(algorithm: str, backbone: str) -> str:
    return f"{algorithm}/{backbone}"


# ---------------------------------------------------------------------------------------------- compare

def _cosine(a: list[float], b: list[float]) -> float:
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(x * x for x in b))
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return sum(x * y for x, y in zip(a, b)) / (na * nb)


def _check(name: str, passed: bool, detail: str, baseline: float, current: float, delta: float,
           tolerance: float) -> dict[str, Any]:
    return {"name": name, "status": "pass" if passed else "fail", "baseline": baseline, "current": current,
            "delta": delta, "tolerance": tolerance, "sigma": None, "z": None, "detail": detail}


def compare(recorded: dict[str, Any], current: dict[str, Any]) -> list[dict[str, Any]]:
    """The three checks of one snapshot: gradient direction (cosine of the projections), gradient norm (relative
    difference), loss value (relative, with an absolute floor for a loss that is ~0 by construction)."""
    cos = _cosine(recorded["projection"], current["projection"])
    same_batch = recorded.get("batch_fingerprint") == current.get("batch_fingerprint")
    batch_note = "" if same_batch else (f"; the pinned rollout batch changed ({current.get('batch_fingerprint')} != "
                                        f"recorded {recorded.get('batch_fingerprint')}: sampler, model or task moved)")
    rec_norm, cur_norm = float(recorded["grad_norm"]), float(current["grad_norm"])
    rel_norm = abs(cur_norm / rec_norm - 1.0) if rec_norm > 0 else (0.0 if cur_norm == 0 else math.inf)
    rec_loss, cur_loss = float(recorded["loss"]), float(current["loss"])
    loss_tol = LOSS_TOL * abs(rec_loss) + LOSS_ABS_FLOOR
    return [
        _check("gradient/cosine", 1.0 - cos <= COS_TOL, f"cosine {cos:.8f} of {DIMS}-dim projections" + batch_note,
               1.0, cos, 1.0 - cos, COS_TOL),
        _check("gradient/norm", rel_norm <= NORM_TOL, "relative norm difference" + batch_note,
               rec_norm, cur_norm, rel_norm, NORM_TOL),
        _check("gradient/loss", abs(cur_loss - rec_loss) <= loss_tol, "loss value" + batch_note,
               rec_loss, cur_loss, cur_loss - rec_loss, loss_tol),
    ]


# ---------------------------------------------------------------------------------------------- the file

def path_in(directory: Path) -> Path:
    return Path(directory) / FILENAME


def load(path: Path) -> dict[str, Any]:
    import json

    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise DataError(f"{path}: cannot read the gradient snapshots ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DataError(f"{path}: not a dare-bench gradient snapshot file (format must be {FORMAT!r})")
    if data.get("version") != VERSION:
        raise DataError(f"{path}: gradient snapshot version {data.get('version')!r}; this dare-bench reads "
                        f"version {VERSION}")
    if not isinstance(data.get("entries"), dict):
        raise DataError(f"{path}: gradient snapshot file lacks 'entries'")
    return data


def record(log: Callable[[str], Any] = print) -> dict[str, Any]:
    """Every entry's snapshot, as the document `write` stores (the caller pins the thread count)."""
    import torch

    from dare_bench.errors import DareBenchError
    from dare_bench.store import environment

    out = {}
    for algorithm, backbone in entries():
        log(f"record-gradients: {key(algorithm, backbone)}")
        snap = snapshot(algorithm, backbone)
        if snap["grad_norm"] == 0:
            raise DareBenchError(f"{key(algorithm, backbone)}: the gradient on the pinned batch is 0, so a snapshot "
                                 "could not see a broken loss; change the pinned batch (dare_bench/check/gradients.py)")
        out[key(algorithm, backbone)] = snap
    return {"format": FORMAT, "version": VERSION,
            "recorded_at": datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
            "code_version": environment.code_version(), "packages": environment.package_versions(),
            "hardware": environment.hardware(), "threads": torch.get_num_threads(), "dtype": "float32",
            "dims": DIMS, "projection_seed": PROJECTION_SEED, "entries": out}


def check(directory: Path, log: Callable[[str], Any] = print) -> list[dict[str, Any]]:
    """One report entry per algorithm x backbone (status pass | fail | error, checks as `compare`); [] when the
    directory holds no snapshot file."""
    import time

    path = path_in(directory)
    if not path.exists():
        return []
    doc = load(path)
    recorded = doc["entries"]
    expected = [key(a, b) for a, b in entries()]
    out = []
    for name in list(dict.fromkeys(expected + sorted(recorded))):
        entry = {"name": f"gradients:{name}", "kind": "gradient", "scale": "micro", "baseline": str(path),
                 "status": "error", "run_id": None, "seed": None, "wall_seconds": None, "message": "", "checks": []}
        out.append(entry)
        if name not in expected:
            entry["message"] = f"{name} is no algorithm x backbone of the snapshots any more; re-record " \
                               "(dare-bench check --record-gradients)"
            continue
        if name not in recorded:
            entry["message"] = f"no gradient snapshot for {name} in {path}; record it (dare-bench check " \
                               "--record-gradients)"
            continue
        algorithm, backbone = name.split("/")
        t0 = time.perf_counter()
        try:
            current = snapshot(algorithm, backbone)
        except Exception as exc:  # the code under test crashed: a regression
            entry.update(status="fail", message=f"the snapshot crashed: {type(exc).__name__}: {exc}")
            continue
        entry["wall_seconds"] = round(time.perf_counter() - t0, 2)
        entry["checks"] = compare(recorded[name], current)
        failed = [c["name"] for c in entry["checks"] if c["status"] != "pass"]
        entry["status"] = "fail" if failed else "pass"
        entry["message"] = ("moved beyond tolerance: " + ", ".join(failed)) if failed else ""
    return out


def noise(pairs: list[tuple[str, str]] | None = None) -> dict[str, dict[str, Any]]:
    """The measured noise behind the tolerances, per entry: 1 vs 2 torch threads, one vs two micro-batches, float32
    vs float64 (each: 1 - cosine, |norm ratio - 1|, relative loss difference, whether the batch stayed the same)."""
    import torch

    def diff(a, b):
        return {"one_minus_cos": 1.0 - _cosine(a["projection"], b["projection"]),
                "norm_rel": abs(b["grad_norm"] / a["grad_norm"] - 1.0) if a["grad_norm"] else None,
                "loss_rel": abs(b["loss"] - a["loss"]) / max(abs(a["loss"]), 1e-12),
                "same_batch": a["batch_fingerprint"] == b["batch_fingerprint"]}

    old = torch.get_num_threads()
    out = {}
    try:
        for algorithm, backbone in pairs or entries():
            torch.set_num_threads(1)
            base = snapshot(algorithm, backbone)
            split = snapshot(algorithm, backbone, micro_batches=2)
            f64 = snapshot(algorithm, backbone, dtype=torch.float64)
            torch.set_num_threads(2)
            two = snapshot(algorithm, backbone)
            out[key(algorithm, backbone)] = {
                "threads": diff(base, two), "float64": diff(base, f64),
                "split": dict(diff(base, split), micro_batches=split["micro_batches"])}
    finally:
        torch.set_num_threads(old)
    return out


def write(path: Path, doc: dict[str, Any]) -> None:
    from dare_bench.fileio import atomic_write_json

    atomic_write_json(path, doc, indent=1)
