"""Shared core of the diffusion samplers: results, forward counting and trajectory recording, setting checks, the
sampler registry, `generate` and `replay_trajectory`.

Each sampler family (`llada.py`, `dream.py`, `block.py`) is a frozen settings dataclass registered here by name
(`register_sampler`). `generate` picks the name from `model.traits` (`sampler_for`) or `sampler=`, checks the
settings every sampler takes (`CallSettings`), lets the family build and validate its own settings object
(`SamplerSettings.resolve`, raising SamplerError before any forward), then runs `settings.decode`.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, NamedTuple

import torch

from dare_bench.errors import SamplerError
from dare_bench.models.base import shift_logits
from dare_bench.models.flops import representing_rows
from dare_bench.models.layers import block_causal_mask

# settings every sampler takes (each family adds its own `SamplerSettings.OPTIONS`)
COMMON_OPTIONS = frozenset({
    "sampler", "gen_length", "max_new_tokens", "steps", "block_length", "temperature", "top_p", "top_k",
    "use_cache", "threshold", "stop_at_eos", "generator", "return_trajectory", "progress", "mask_id", "eos_id",
})


# --------------------------------------------------------------------------------------------------------------
# results


@dataclass
class GenerationStats:
    forwards: int = 0
    token_forwards: int = 0  # sum over forwards of batch x query length: a hardware-free FLOP proxy
    row_forwards: int = 0  # sum over forwards of the batch's rows
    # rows of those forwards not computed because an identical row of the same forward was (`shared_rows_forward`);
    # token_forwards and row_forwards still count them: they are the algorithm's counts, not the implementation's
    shared_rows: int = 0
    generated_tokens: int = 0  # per sequence (mean over the batch) committed in the generated region
    tokens_per_forward: float = 0.0
    wall_seconds: float = 0.0


@dataclass
class TrajectoryStep:
    state: torch.Tensor  # [B, T] canvas before the step
    unmasked: torch.Tensor  # bool [B, T]: positions that went from mask to a token in this step
    region_end: int  # canvas end the step's model call could see (block end for block diffusion)
    # The step's prediction of the clean canvas (MDLM samplers only, None elsewhere): every mask position the step's
    # model call saw filled with the token the sampler drew for it, committed or not, the rest of the canvas as it
    # was (MDPO's intermediate "x0"; a position outside the call's window keeps its mask id). `proposal_prob`: the
    # probability of each proposed token under the sampling distribution, softmax(logits / T) (T = 0: the argmax's
    # softmax probability); 0 where nothing was proposed.
    proposal: torch.Tensor | None = None  # [B, T] long
    proposal_prob: torch.Tensor | None = None  # [B, T] float32


@dataclass
class Trajectory:
    steps: list[TrajectoryStep]
    prompt_length: int
    kind: str  # "mdlm" | "block"
    mask_id: int
    logit_shift: int = 0
    block_size: int | None = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # padding mask / positions of the full canvas
    cfg_scale: float = 0.0
    prompt_index: torch.Tensor | None = None
    # block: canvas columns before `start` are left padding outside the row's block grid; each step's model call
    # saw columns start..region_end at positions 0.. (0 for a batch; a padded row decoded on its own: its pads)
    start: int = 0


@dataclass
class GenerationOutput:
    sequences: torch.Tensor
    canvas: torch.Tensor  # [B, T] full canvas (prompt + every generated position) before any cut
    prompt_length: int
    stats: GenerationStats
    settings: dict[str, Any]
    # one Trajectory of the batch, or (block diffusion of a left-padded batch, decoded row by row) one batch-of-one
    # Trajectory per row, laid out like `canvas`
    trajectory: Trajectory | list[Trajectory] | None = None


class Decoded(NamedTuple):
    """What a family's `decode` returns; `generate` wraps it into a GenerationOutput."""

    sequences: torch.Tensor  # shaped like the official function's return
    canvas: torch.Tensor  # full canvas before any cut
    trajectory: Trajectory | list[Trajectory] | None
    prompt_length: int  # where the generated part of `sequences` starts (0 when only generated tokens are returned)


class SamplerRun:
    """Counts forwards, records the trajectory and drives the optional progress bar."""

    def __init__(self, model, record: bool, progress: bool, total: int | None):
        self.model = model
        self.stats = GenerationStats()
        self.steps: list[TrajectoryStep] | None = [] if record else None
        self.bar = None
        if progress:
            try:
                from tqdm.auto import tqdm
            except ModuleNotFoundError:  # pragma: no cover - tqdm ships with the base install
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, desc="diffusion forwards", leave=False)

    @property
    def recording(self) -> bool:
        return self.steps is not None

    def restart_recording(self) -> None:
        """Record the next steps into a new list (a row decoded on its own gets a trajectory of its own)."""
        if self.steps is not None:
            self.steps = []

    def forward(self, ids: torch.Tensor, history: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        """The model on `ids` (`shared_rows_forward`; `history`: what identifies a row's KV-cache state)."""
        self.stats.forwards += 1
        self.stats.token_forwards += int(ids.numel())
        self.stats.row_forwards += int(ids.shape[0])
        if self.bar is not None:
            self.bar.update(1)
        out, shared = shared_rows_forward(self.model, ids, kwargs, history=history)
        self.stats.shared_rows += shared
        return out

    def record(self, state: torch.Tensor, before: torch.Tensor, after: torch.Tensor, mask_id: int, end: int,
               proposal: torch.Tensor | None = None, proposal_prob: torch.Tensor | None = None):
        if self.steps is not None:
            unmasked = (before == mask_id) & (after != mask_id)
            self.steps.append(TrajectoryStep(state=state, unmasked=unmasked, region_end=end, proposal=proposal,
                                             proposal_prob=proposal_prob))

    def close(self):
        if self.bar is not None:
            self.bar.close()


def sampling_prob(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """Probability of `tokens` under softmax(logits / T) (T = 0: softmax(logits)), float32: the confidence a
    trajectory records with its proposals (MDPO's rollout `confidence`)."""
    lp = logits.float()
    if temperature > 0:
        lp = lp / temperature
    return torch.softmax(lp, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def model_logits(model, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    out = model(ids, **kwargs)
    return out.logits if hasattr(out, "logits") else out


# Identical canvas rows are computed once per forward (issue #16 item 4). An RL rollout decodes each prompt
# `group_size` times: every copy starts from the same canvas, and a trained policy sampling at T < 1 often commits
# the same tokens in several copies for many steps (tiny LLaDA at its sudoku / countdown base: 5.1x / 6.9x fewer
# rows). Every backbone computes a row from that row's inputs alone, so the shared row's logits are the logits of
# each copy; on CPU they are the same bits (a matmul row does not depend on the batch's other rows there; tests/
# diffusion/test_shared_rows.py). A forward with a KV cache is shared only when the caller hands in each row's
# `history` (the exact block cache: the canvas up to the block's end, which fixes what the cache holds for that row):
# the distinct rows then run on a copy of their cache rows, and a cache update is copied back to every row. Without
# a history, cache forwards are never shared (their rows may differ in what the cache holds); nor are forwards on
# a GPU (below). `computing_every_row()` turns it off (the reference path of `bench tinyrl`).
_SHARE_ROWS: contextvars.ContextVar[bool] = contextvars.ContextVar("share_rows", default=True)


@contextlib.contextmanager
def computing_every_row():
    """Within this block, sampler forwards compute every row, shared or not (module comment above)."""
    token = _SHARE_ROWS.set(False)
    try:
        yield
    finally:
        _SHARE_ROWS.reset(token)


def _row_inputs(ids: torch.Tensor, kwargs: dict[str, Any]) -> list[str] | None:
    """Names of the keyword tensors that vary per row (batch dim = ids' batch), or None if some input is per-call
    state (a cache, an object) whose rows cannot be told apart."""
    per_row = []
    for name, value in kwargs.items():
        if isinstance(value, torch.Tensor):
            if value.dim() == 0 or value.shape[0] not in (1, ids.shape[0]):
                return None
            if value.shape[0] == ids.shape[0] and ids.shape[0] > 1:
                per_row.append(name)
        elif value is not None and not isinstance(value, (bool, int, float, str)):
            return None
    return per_row


# the fewest token rows the shared forward's matmuls may have (comment in `shared_rows_forward`)
MIN_SHARED_MATMUL_ROWS = 16


_HAS_EXPERTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> has routed experts (per model, once)


def _dense_float32(model) -> bool:
    """float32 weights and no routed experts (`shared_rows_forward`'s comment says why)."""
    from dare_bench.models.moe import RoutedExperts

    param = next(model.parameters(), None)
    if param is not None and param.dtype != torch.float32:
        return False
    if model not in _HAS_EXPERTS:  # the module tree, walked once per model instead of on every forward
        _HAS_EXPERTS[model] = any(isinstance(m, RoutedExperts) for m in model.modules())
    return not _HAS_EXPERTS[model]


def shared_rows_forward(model, ids: torch.Tensor, kwargs: dict[str, Any], history: torch.Tensor | None = None):
    """(`model_logits(model, ids, **kwargs)`, rows not computed): identical input rows go through the model once and
    their output is copied to every row that has them. Logits and `HiddenStates` (states indexed, head shared).
    With a `kv_cache`, only given each row's `history` ([B, ...]: rows with equal history hold equal cache rows, and
    `ids` is part of it): the distinct rows run on a copy of their cache rows, and an update is copied back to all."""
    # CPU, float32 only: there a matmul row does not depend on the batch's other rows once a matmul has 16 rows or
    # more (measured with this machine's torch: linear layers of width 64-12288, `test_the_premise_...`); below
    # that, and in bfloat16 (width 4096: 31-144 rows differ from a 300-row batch), the kernels differ in the last
    # bits. cuBLAS picks kernels (split-K) by shape, so on a GPU the shared row could differ too, and the official
    # samplers' token-exactness is the rule
    # Mixture-of-experts models (LLaDA2, SDAR-MoE) are never shared: an expert's matmul has as many rows as tokens
    # routed to it, which the batch's other rows decide, so it can fall below those 16 rows in one batch only.
    shareable = (_SHARE_ROWS.get() and ids.device.type == "cpu" and ids.dim() == 2 and ids.shape[0] > 1
                 and not torch.is_autocast_enabled("cpu") and _dense_float32(model))
    cache = kwargs.get("kv_cache")
    if cache is not None and (history is None or history.shape[0] != ids.shape[0]):
        shareable = False  # the rows' cached states cannot be told apart
    per_row = _row_inputs(ids, {k: v for k, v in kwargs.items() if k != "kv_cache"}) if shareable else None
    if per_row is None:
        return model_logits(model, ids, **kwargs), 0
    b = ids.shape[0]
    rows = ids if history is None else history
    # every per-row input as float64 columns (exact for token ids, 0/1 masks and float32 masks) in one key per row
    key = torch.cat([rows.reshape(b, -1).to(torch.float64)]
                    + [kwargs[n].reshape(b, -1).to(torch.float64) for n in per_row], dim=1)
    unique, inverse = torch.unique(key, dim=0, return_inverse=True)
    n = unique.shape[0]
    if n == b or n * ids.shape[1] < MIN_SHARED_MATMUL_ROWS:
        return model_logits(model, ids, **kwargs), 0
    # the first row of each distinct input stands for it (deterministic, whatever the order of the duplicates)
    first = torch.full((n,), b, dtype=torch.long, device=ids.device)
    first.scatter_reduce_(0, inverse, torch.arange(b, device=ids.device), reduce="amin")
    picked = {k: (v[first] if k in per_row else v) for k, v in kwargs.items()}
    if cache is not None:
        picked["kv_cache"] = cache.rows(first)
    with representing_rows(b):  # the compute meter counts all b rows (models/flops.py)
        out = model_logits(model, ids[first], **picked)
    if cache is not None and kwargs.get("update_cache"):
        cache.hold(picked["kv_cache"].rows(inverse))  # every row's cache as the plain forward would leave it
    if isinstance(out, torch.Tensor):
        return out[inverse], b - n
    return type(out)(out.states[inverse], out.head), b - n


def uniform(shape, dtype, device, generator) -> torch.Tensor:
    # torch.rand(shape) draws from the same stream as the official torch.rand_like(...) calls
    return torch.rand(shape, dtype=dtype, device=device, generator=generator)


# --------------------------------------------------------------------------------------------------------------
# setting checks


def check_int(name, value, low=1):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise SamplerError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def check_unit(name, value, allow_none=True):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < float(value) <= 1:
        raise SamplerError(f"{name} must be in (0, 1], got {value!r}")
    return float(value)


def is_left_padded(attention_mask: torch.Tensor | None) -> bool:
    return attention_mask is not None and not bool(attention_mask.bool().all())


def check_prompt(prompt_ids, attention_mask) -> None:
    if not isinstance(prompt_ids, torch.Tensor) or prompt_ids.dim() != 2 or prompt_ids.dtype not in (
            torch.int64, torch.int32):
        raise SamplerError("prompt_ids must be an integer tensor [batch, prompt_length]")
    if prompt_ids.shape[0] < 1:
        raise SamplerError("prompt_ids has an empty batch")
    if attention_mask is not None:
        if attention_mask.shape != prompt_ids.shape:
            raise SamplerError(f"attention_mask {tuple(attention_mask.shape)} does not match prompt_ids "
                               f"{tuple(prompt_ids.shape)}")
        m = attention_mask.bool()
        # left padding only: once a row has a real token, the rest of it is real
        if bool((m[:, :-1] & ~m[:, 1:]).any()):
            raise SamplerError("attention_mask must be left-padded (zeros only before the prompt tokens)")
        if not bool(m.any(dim=1).all()):
            raise SamplerError("a row of attention_mask is all padding")


@dataclass(frozen=True)
class CallSettings:
    """The settings every sampler takes, checked. Those whose default depends on the family stay None when not
    given; `given` holds the names the caller passed (Dream's defaults depend on it)."""

    sampler: str
    gen_length: int
    mask_id: int
    eos_id: int
    stop_ids: tuple[int, ...]  # eos first, then the model's other stop ids
    generator: torch.Generator | None
    return_trajectory: bool
    progress: bool
    temperature: float | None
    top_p: float | None
    top_k: int | None
    threshold: float | None
    block_length: int | None
    steps: int | None
    use_cache: Any  # the raw value (None / falsy = the family's default); each family checks it
    stop_at_eos: bool | None
    given: frozenset[str]

    @classmethod
    def parse(cls, sampler: str, traits, settings: dict[str, Any]) -> "CallSettings":
        gen = settings.get("gen_length")
        mnt = settings.get("max_new_tokens")
        if gen is not None and mnt is not None and gen != mnt:
            raise SamplerError(f"gen_length {gen} and max_new_tokens {mnt} disagree")
        gen = check_int("gen_length", gen if gen is not None else (mnt if mnt is not None else 128))
        mask_id = int(settings.get("mask_id", traits.mask_token_id))
        eos_id = int(settings.get("eos_id", traits.eos_token_id))
        stop_ids = tuple(dict.fromkeys((int(traits.eos_token_id), *map(int, traits.stop_token_ids))))
        if "eos_id" in settings:
            stop_ids = (eos_id,) + tuple(t for t in stop_ids if t != eos_id)
        generator = settings.get("generator")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise SamplerError("generator must be a torch.Generator or None")
        temperature = settings.get("temperature")
        if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                        or temperature < 0):
            raise SamplerError(f"temperature must be >= 0, got {temperature!r}")
        top_p = settings.get("top_p")
        if top_p is not None:
            top_p = check_unit("top_p", top_p)
        top_k = settings.get("top_k")
        if top_k is not None:
            top_k = check_int("top_k", top_k, low=0)
        threshold = check_unit("threshold", settings.get("threshold"))
        block_length = settings.get("block_length")
        if block_length is not None:
            check_int("block_length", block_length)
            if block_length > gen:
                raise SamplerError(f"block_length {block_length} is longer than gen_length {gen}")
        steps = settings.get("steps")
        if steps is not None:
            check_int("steps", steps)
        stop_at_eos = settings.get("stop_at_eos")
        return cls(
            sampler=sampler, gen_length=gen, mask_id=mask_id, eos_id=eos_id, stop_ids=stop_ids, generator=generator,
            return_trajectory=bool(settings.get("return_trajectory", False)),
            progress=bool(settings.get("progress", False)), temperature=temperature, top_p=top_p, top_k=top_k,
            threshold=threshold, block_length=block_length, steps=steps, use_cache=settings.get("use_cache"),
            stop_at_eos=None if stop_at_eos is None else bool(stop_at_eos), given=frozenset(settings),
        )


# --------------------------------------------------------------------------------------------------------------
# settings base class and registry


@dataclass(frozen=True)
class SamplerSettings(ABC):
    """Resolved settings of one sampler family (frozen). Subclasses add their fields, build themselves from the
    call in `resolve` (every check there, before any forward) and decode in `decode`."""

    sampler: str
    gen_length: int
    mask_id: int
    eos_id: int
    stop_ids: tuple[int, ...]
    generator: torch.Generator | None
    return_trajectory: bool
    progress: bool

    OPTIONS: ClassVar[frozenset[str]] = frozenset()  # settings only this family takes

    @staticmethod
    def common_fields(call: CallSettings) -> dict[str, Any]:
        return {"sampler": call.sampler, "gen_length": call.gen_length, "mask_id": call.mask_id,
                "eos_id": call.eos_id, "stop_ids": call.stop_ids, "generator": call.generator,
                "return_trajectory": call.return_trajectory, "progress": call.progress}

    @classmethod
    @abstractmethod
    def resolve(cls, call: CallSettings, options: dict[str, Any], traits, prompt_ids: torch.Tensor,
                attention_mask: torch.Tensor | None) -> "SamplerSettings":
        """Build and check the settings from the common call settings and the family's own `options`."""

    @abstractmethod
    def decode(self, model, prompt_ids: torch.Tensor, attention_mask: torch.Tensor | None,
               run: SamplerRun) -> Decoded:
        """Decode the (device-resident) prompts; every forward goes through `run.forward`."""

    def record(self) -> dict[str, Any]:
        """The settings as recorded in `GenerationOutput.settings` (everything but the generator)."""
        return {"sampler": self.sampler, "gen_length": self.gen_length, "mask_id": self.mask_id,
                "eos_id": self.eos_id, "stop_ids": self.stop_ids, "return_trajectory": self.return_trajectory,
                "progress": self.progress}


SAMPLER_REGISTRY: dict[str, type[SamplerSettings]] = {}


def register_sampler(name: str) -> Callable[[type[SamplerSettings]], type[SamplerSettings]]:
    def add(cls: type[SamplerSettings]) -> type[SamplerSettings]:
        if name in SAMPLER_REGISTRY:
            raise ValueError(f"sampler {name!r} is registered twice")
        SAMPLER_REGISTRY[name] = cls
        return cls
    return add


def sampler_for(traits) -> str:
    """The sampler a model gets without `sampler=`: block_causal -> "block", else logit_shift 1 -> "dream", else
    "llada"."""
    if traits.attention == "block_causal":
        return "block"
    return "dream" if traits.logit_shift == 1 else "llada"


def resolve_settings(model, prompt_ids, attention_mask, settings: dict[str, Any]) -> SamplerSettings:
    """The sampler's frozen settings for this call; raises SamplerError on anything invalid."""
    traits = model.traits
    sampler = settings.get("sampler")
    if sampler is None:
        sampler = sampler_for(traits)
    family = SAMPLER_REGISTRY.get(sampler)
    if family is None:
        raise SamplerError(f"unknown sampler {sampler!r}; use one of {tuple(SAMPLER_REGISTRY)}")
    allowed = COMMON_OPTIONS | family.OPTIONS
    unknown = sorted(set(settings) - allowed)
    if unknown:
        others = [k for k in unknown if any(k in f.OPTIONS for f in SAMPLER_REGISTRY.values())]
        hint = f" ({others} belong to another sampler)" if others else ""
        raise SamplerError(f"unknown setting(s) {unknown} for sampler {sampler!r}{hint}; known: {sorted(allowed)}")
    check_prompt(prompt_ids, attention_mask)
    call = CallSettings.parse(sampler, traits, settings)
    options = {k: v for k, v in settings.items() if k in family.OPTIONS}
    return family.resolve(call, options, traits, prompt_ids, attention_mask)


# --------------------------------------------------------------------------------------------------------------
# entry points


@torch.no_grad()
def generate(model, prompt_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
             **settings) -> GenerationOutput:
    """Run the diffusion sampler that fits `model.traits` (see the package docstring for settings)."""
    resolved = resolve_settings(model, prompt_ids, attention_mask, settings)
    device = next(model.parameters()).device
    prompt_ids = prompt_ids.to(device=device, dtype=torch.long)
    if attention_mask is not None:
        attention_mask = attention_mask.to(device)
    run = SamplerRun(model, resolved.return_trajectory, resolved.progress, None)
    was_training = model.training
    model.eval()
    t0 = time.perf_counter()
    try:
        out = resolved.decode(model, prompt_ids, attention_mask, run)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    finally:
        run.close()
        model.train(was_training)
    st = run.stats
    st.wall_seconds = time.perf_counter() - t0
    p = prompt_ids.shape[1]
    st.generated_tokens = int((out.canvas[:, p:] != resolved.mask_id).sum().item()) // out.canvas.shape[0]
    st.tokens_per_forward = st.generated_tokens / st.forwards if st.forwards else 0.0
    return GenerationOutput(sequences=out.sequences, canvas=out.canvas, prompt_length=out.prompt_length, stats=st,
                            settings=resolved.record(), trajectory=out.trajectory)


@torch.no_grad()
def replay_trajectory(model, trajectory: Trajectory | list[Trajectory]) -> torch.Tensor:
    """Re-run the model on every recorded state and write its greedy token at the positions unmasked in that step.

    For a greedy rollout this reproduces the final canvas (the CJ-GRPO consistency check); for a sampled one it
    tells how far the rollout was from the model's argmax. Each state is re-encoded without a cache (block
    diffusion: the prefix up to the step's block end, block-causal, from column `start`), which gives the cached
    samplers' logits up to float rounding. A list of per-row trajectories (a left-padded block batch) is replayed
    row by row, the rows stacked.
    """
    if isinstance(trajectory, list):
        if not trajectory:
            raise SamplerError("empty trajectory")
        return torch.cat([replay_trajectory(model, t) for t in trajectory])
    if not trajectory.steps:
        raise SamplerError("empty trajectory")
    x = trajectory.steps[0].state.clone()
    for step in trajectory.steps:
        state = step.state
        if trajectory.kind == "block":
            start, end = trajectory.start, step.region_end
            pos = torch.arange(end - start, device=state.device).expand(state.shape[0], end - start)
            mask = block_causal_mask(end - start, end - start, trajectory.block_size, device=state.device)
            logits = model_logits(model, state[:, start:end], position_ids=pos, attn_mask=mask)
            tokens = torch.full_like(state, trajectory.mask_id)
            tokens[:, start:end] = logits.argmax(-1)
        else:
            kw = trajectory.model_kwargs
            if trajectory.cfg_scale > 0:
                un = state.clone()
                un[trajectory.prompt_index] = trajectory.mask_id
                kw2 = {k: torch.cat([v, v]) for k, v in kw.items()}
                cond, unc = model_logits(model, torch.cat([state, un]), **kw2).chunk(2)
                logits = unc + (trajectory.cfg_scale + 1) * (cond - unc)
            else:
                logits = model_logits(model, state, **kw)
            tokens = shift_logits(logits, trajectory.logit_shift).argmax(-1)
        x[step.unmasked] = tokens[step.unmasked]
    return x
