"""Routed experts of the MoE blocks (LLaDA2, the SDAR / Qwen3-MoE variant): the per-expert loop or grouped matmuls.

Both blocks sort the (token, slot) pairs by expert first. Then the experts run in one of two ways
(`model.moe` in the run config; `set_moe(model, mode)`; `load_pretrained(..., moe=)`):

- `loop` (the default): the official form. Each expert's SwiGLU runs over its tokens, one expert after another,
  in a Python loop. That costs a fixed amount per expert (module calls, small kernels, a host sync for the counts)
  and dominates small decode calls.
- `grouped`: every expert in two `torch._grouped_mm` calls, gate and up fused ([E, 2I, H]), then down
  ([E, H, I]), over rows ordered by expert, with the group offsets on the device (no host sync in the forward; on
  a GPU one kernel per projection). The weights are read from a stacked *pack*: the experts' `nn.Linear` weights
  are views into it, so no call copies or re-stacks them (under autocast the pack is cast per call, as F.linear
  casts each weight). The module tree therefore does not change: `experts.{e}.{gate,up,down}_proj.weight`, the
  state dict, checkpoints, peft targets and the FSDP2 units are all the same as in `loop`.

Gradients reach each expert's own weight (a custom autograd function; `None` for an expert with no tokens, as in
the loop, so no optimizer moves it, except across ranks, where both modes give such an expert zeros so that every
rank reduces the same gradients: `RoutedExperts.every_expert_gets_a_gradient`).

When the pack cannot serve, a block in `grouped` mode falls back to the loop, which is always correct. That
happens when the experts' Linears are wrapped (peft LoRA adapters), when a weight no longer lives in the pack
(FSDP2 sharding or unsharding, `p.data = ...`), or when the dtype is float64. `RoutedExperts.fallback_reason`
says why; the pack is then dropped (under FSDP2 at the first forward after sharding). The pack is rebuilt after
`.to()` / `.float()` / `to_empty` (an `_apply` override), after a `load_state_dict` that replaced the weights
(assign), on `copy.deepcopy`, and on `set_moe`. `torch._grouped_mm` runs when the device and dtype allow it: CPU
fp32 / bf16 / fp16, CUDA bf16 (sm80+), 16-byte aligned strides. Otherwise (and on CPU for calls with fewer rows
than half the experts, where `_grouped_mm`'s visit of every group costs more) the grouped path does one `mm` per
non-empty expert on the pack, still free of module overhead.

Numerics: on CPU, `_grouped_mm` runs one GEMM per group on the same rows as the loop's `F.linear`, and the input
gradient and the SDAR combine are summed in the loop's order, so grouped and loop give the same bits in fp32 and
bf16 (the SDAR block's input gradient with top_k >= 3 aside: the loop gathers each expert's rows separately, so
autograd adds a token's three parts in another order, one rounding apart). On GPU the grouped kernel rounds differently
from cuBLAS. `tests/models/test_moe.py` pins all of this, gradients included.

    from dare_bench.models import load_pretrained, set_moe
    m = load_pretrained("tiny-llada2", moe="grouped")
    set_moe(m, "loop")
"""

from __future__ import annotations

import copy
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from dare_bench.errors import DareBenchError
from dare_bench.models.layers import SwiGLU

MOE_MODES = ("loop", "grouped")
EXPERT_NAMES = ("gate_proj", "up_proj", "down_proj")
_GROUPED_MM_DTYPES = {"cpu": (torch.float32, torch.bfloat16, torch.float16), "cuda": (torch.bfloat16,)}
_GROUPED_MM_REFUSED: set[str] = set()  # device types whose _grouped_mm raised once (never CPU: tested here)
# CPU: rows x hidden above this run in chunks of experts (2 MiB of fp32 activations: measured by `bench moe`)
CPU_CHUNK_ELEMENTS = 1 << 19


def check_moe(mode: str) -> None:
    if mode not in MOE_MODES:
        raise DareBenchError(f"unknown MoE expert mode {mode!r}; use one of {', '.join(MOE_MODES)}")


def set_moe(model, mode: str):
    """Select how the routed experts of every MoE block inside `model` run (`loop` | `grouped`); a dense backbone
    has none and is left as it is. Returns `model`. Raises if `model` holds no dare-bench backbone."""
    check_moe(mode)
    if not any(callable(getattr(m, "set_attention_backend", None)) for m in model.modules()):
        raise DareBenchError(f"set_moe: {type(model).__name__} holds no dare-bench backbone")
    for m in model.modules():
        if isinstance(m, RoutedExperts):
            m.set_impl(mode)
    return model


def moe_blocks(model) -> list[RoutedExperts]:
    return [m for m in model.modules() if isinstance(m, RoutedExperts)]


# --- grouped matmul --------------------------------------------------------------------------------------------------
def _aligned(t: torch.Tensor) -> bool:
    es = t.element_size()
    return t.data_ptr() % 16 == 0 and all((s * es) % 16 == 0 for s in t.stride() if s != 1)


def _kernel_for(t: torch.Tensor) -> str:
    """`grouped_mm` where `torch._grouped_mm` runs for this device / dtype / layout, else `mm`."""
    dev = t.device.type
    if not hasattr(torch, "_grouped_mm") or t.dtype not in _GROUPED_MM_DTYPES.get(dev, ()):
        return "mm"
    if dev == "cuda" and torch.cuda.get_device_capability(t.device) < (8, 0):
        return "mm"
    return "grouped_mm" if _aligned(t) else "mm"


def _gmm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, counts: torch.Tensor, kernel: str) -> torch.Tensor:
    """Grouped matmul over row groups of `a` (group e = rows offs[e-1]:offs[e]).
    a 2-D [N, K], b 3-D [E, K, M] -> [N, M] (group e times b[e]); a 2-D [K, N], b 2-D [N, M] -> [E, K, M] (the
    weight gradient: group e's columns of a times its rows of b; zeros for empty groups)."""
    # on CPU, _grouped_mm visits every group; with fewer rows than half the experts (decoding one token) the
    # per-expert mm over the non-empty groups is faster (measured by `dare-bench bench moe`)
    sparse = a.device.type == "cpu" and b.dim() == 3 and 2 * a.shape[0] < b.shape[0]
    if kernel == "grouped_mm" and not sparse and a.device.type not in _GROUPED_MM_REFUSED \
            and _aligned(a) and _aligned(b):
        try:
            return torch._grouped_mm(a, b, offs=offs)
        except RuntimeError as exc:  # a device / build whose kernel refuses this layout: the mm form, said once
            if a.device.type == "cpu":
                raise
            _GROUPED_MM_REFUSED.add(a.device.type)
            warnings.warn(f"torch._grouped_mm refused a MoE call on {a.device.type} ({exc}); grouped experts run "
                          f"one mm per expert there from now on", stacklevel=2)
    n = counts.tolist()
    if b.dim() == 3:
        out = a.new_empty(a.shape[0], b.shape[-1])
        start = 0
        for e, c in enumerate(n):
            if c:
                torch.mm(a[start:start + c], b[e], out=out[start:start + c])
                start += c
        return out
    out = a.new_zeros(len(n), a.shape[0], b.shape[-1])
    start = 0
    for e, c in enumerate(n):
        if c:
            torch.mm(a[:, start:start + c], b[start:start + c], out=out[e])
            start += c
    return out


class _GroupedLinear(torch.autograd.Function):
    """y = group_e(x) @ weight[e].T over expert-sorted rows; `weight` is the pack (or its autocast copy), `params`
    the experts' own Linear weights (rows of `weight` split by `split`), which receive the gradients."""

    @staticmethod
    def forward(ctx, x, weight, offs, counts, kernel, split, every, *params):
        # x in its own dtype, cast here to the weight's (autocast), so that its gradient is summed in x's dtype
        ctx.x_dtype = x.dtype
        x = x.to(weight.dtype)
        ctx.save_for_backward(x, weight, offs, counts)
        ctx.kernel, ctx.split, ctx.every = kernel, split, every
        ctx.param_dtypes = [p.dtype for p in params]
        return _gmm(x, weight.transpose(1, 2), offs, counts, kernel)

    @staticmethod
    def backward(ctx, gy):
        x, weight, offs, counts = ctx.saved_tensors
        gy = gy.contiguous()
        gx = None
        if ctx.needs_input_grad[0]:
            # one product per projection (gate, up), each cast to x's dtype and summed, as autograd sums the
            # loop's two F.linear input gradients
            start = 0
            for rows in ctx.split:
                part = _gmm(gy[:, start:start + rows], weight[:, start:start + rows], offs, counts, ctx.kernel)
                part = part.to(ctx.x_dtype)
                gx = part if gx is None else gx + part
                start += rows
        n_params = len(ctx.needs_input_grad) - 7
        grads: list[torch.Tensor | None] = [None] * n_params
        if any(ctx.needs_input_grad[7:]):
            gw = _gmm(gy.t(), x, offs, counts, ctx.kernel)  # [E, out, in]
            per = len(ctx.split)
            for e, c in enumerate(counts.tolist()):
                # an expert that got no token gets no gradient (None), as in the loop (zeros across ranks)
                if c or ctx.every:
                    parts = gw[e].split(list(ctx.split), dim=0) if per > 1 else (gw[e],)
                    for j, g in enumerate(parts):
                        k = e * per + j
                        grads[k] = g.to(ctx.param_dtypes[k])
        return (gx, None, None, None, None, None, None, *grads)


class ExpertPack:
    """The stacked storage the experts' weights are views of: gate_up [E, 2I, H] (rows :I gate, I: up), down
    [E, H, I]; `ptrs` are the expected weight data pointers, expert by expert (gate, up, down)."""

    __slots__ = ("gate_up", "down", "inter", "ptrs", "base", "kernel")

    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor):
        self.gate_up, self.down = gate_up, down
        self.inter = down.shape[-1]
        self.ptrs, self.base, self.kernel = [], (0, 0), "mm"
        if gate_up.device.type == "meta":  # shapes only: nothing runs on meta
            return
        es = gate_up.element_size()
        self.base = (gate_up.data_ptr(), down.data_ptr())
        half = self.inter * gate_up.shape[-1] * es
        for e in range(gate_up.shape[0]):
            g = gate_up.data_ptr() + e * gate_up.stride(0) * es
            self.ptrs += [g, g + half, down.data_ptr() + e * down.stride(0) * es]
        self.kernel = _kernel_for(gate_up) if _kernel_for(down) == "grouped_mm" else "mm"


def _plain_weight(m) -> torch.Tensor | None:
    if type(m) is not nn.Linear or m.bias is not None:
        return None
    w = m._parameters.get("weight")
    if w is None or type(w) is not nn.Parameter or type(w.data) is not torch.Tensor:
        return None  # DTensor (FSDP2 shards) and other subclasses
    return w


class RoutedExperts(nn.ModuleList):
    """The `experts` ModuleList of an MoE block (state-dict keys `experts.{e}.{gate,up,down}_proj.weight`), able
    to run its experts as grouped matmuls over a stacked pack of their weights (module docstring)."""

    def __init__(self, num_experts: int, hidden: int, inter: int):
        super().__init__(SwiGLU(hidden, inter) for _ in range(num_experts))
        self.impl = "loop"
        self._pack: ExpertPack | None = None
        self.fallback_reason: str | None = None
        self.register_load_state_dict_post_hook(RoutedExperts._after_load)

    # --- the pack ------------------------------------------------------------------------------------------------
    def set_impl(self, mode: str) -> None:
        check_moe(mode)
        self.impl = mode
        if mode == "grouped":
            self.repack()
        else:
            self._pack, self.fallback_reason = None, None

    def repack(self) -> bool:
        """(Re)build the pack from the experts' current weights and make those weights views of it. False (and
        `fallback_reason` set) when the experts cannot be packed; the block then runs the loop."""
        self._pack = None
        weights = []
        for ex in self:
            ws = [_plain_weight(ex._modules.get(n)) for n in EXPERT_NAMES] if isinstance(ex, SwiGLU) else [None]
            if any(w is None for w in ws):
                self.fallback_reason = ("expert Linears are wrapped or their weights are not plain tensors "
                                        "(LoRA adapters, FSDP2 shards)")
                return False
            weights.append(ws)
        g0 = weights[0][0]
        inter, hidden = g0.shape
        dtype, device = g0.dtype, g0.device
        shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
        if any(w.dtype != dtype or w.device != device or tuple(w.shape) != s
               for ws in weights for w, s in zip(ws, shapes)):
            self.fallback_reason = "expert weights differ in dtype, device or shape"
            return False
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            self.fallback_reason = f"no grouped kernel for {dtype}"
            return False
        E = len(weights)
        with torch.no_grad():
            gate_up = torch.empty(E, 2 * inter, hidden, dtype=dtype, device=device)
            down = torch.empty(E, hidden, inter, dtype=dtype, device=device)
            if device.type != "meta":
                for e, (g, u, d) in enumerate(weights):
                    gate_up[e, :inter].copy_(g)
                    gate_up[e, inter:].copy_(u)
                    down[e].copy_(d)
            for e, (g, u, d) in enumerate(weights):
                g.data, u.data, d.data = gate_up[e, :inter], gate_up[e, inter:], down[e]
        self._pack = ExpertPack(gate_up, down)
        self.fallback_reason = None
        return True

    def _weights_if_packed(self) -> list[torch.Tensor] | None:
        """The experts' weights (gate, up, down per expert) when every one is still a view of the pack, else None
        (the pack is then dropped, freeing what only it held, and `fallback_reason` says why)."""
        pack = self._pack
        if pack is None:
            return None
        weights = []
        try:
            for ex in self:
                for n in EXPERT_NAMES:
                    m = ex._modules[n]
                    if type(m) is not nn.Linear:
                        raise LookupError
                    weights.append(m._parameters["weight"])
            ok = (pack.gate_up.data_ptr(), pack.down.data_ptr()) == pack.base and \
                [w.data_ptr() for w in weights] == pack.ptrs
        except (LookupError, RuntimeError, AttributeError):  # wrapped module, storage-less (DTensor) weight
            ok = False
        if not ok:
            self._pack = None
            self.fallback_reason = ("expert weights are no longer views of the pack (wrapped by LoRA, sharded by "
                                    "FSDP2 or reassigned); set_moe(model, 'grouped') repacks")
            return None
        return weights

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        if self.impl == "grouped" and self._weights_if_packed() is None:
            self.repack()  # .to() / .float() / to_empty gave the weights new storage
        return out

    @staticmethod
    def _after_load(module: RoutedExperts, incompatible_keys) -> None:
        if module.impl == "grouped" and module._pack is not None and module._weights_if_packed() is None:
            module.repack()  # load_state_dict(assign=True) replaced the weights

    def __deepcopy__(self, memo):
        # nn.Parameter's deepcopy clones each weight on its own; rebuild the copy's pack over its own weights
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            new.__dict__[k] = None if k == "_pack" else copy.deepcopy(v, memo)
        if self._pack is not None:
            new.repack()
        return new

    # --- the experts ---------------------------------------------------------------------------------------------
    @staticmethod
    def every_expert_gets_a_gradient() -> bool:
        """True in a multi-rank backward-bound forward: an expert that got no token on this rank must still get
        a (zero) gradient, or ranks reduce different sets of gradients (FSDP2's reduce-scatter, the flat
        all-reduce of `trainers.distributed.all_reduce_grads`) and the collective fails. One process keeps the
        official behaviour: no gradient (None), so no optimizer step touches that expert."""
        if not torch.is_grad_enabled():
            return False
        dist = torch.distributed
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def grouped_weights(self) -> list[torch.Tensor] | None:
        """The weights for `grouped` when this block runs grouped now, else None (run the loop)."""
        if self.impl != "grouped":
            return None
        return self._weights_if_packed()

    def grouped(self, x: torch.Tensor, counts: torch.Tensor, weights: list[torch.Tensor],
                experts: tuple[int, int] | None = None) -> torch.Tensor:
        """SwiGLU of each expert over its rows of `x` ([N, H], rows sorted by expert, `counts[e]` rows of expert
        e): the same [N, H] result the loop's `cat(expert_e(x_e))` gives. `experts=(first, end)`: `x`, `counts`
        cover only those experts (a caller's chunk); `weights` stays the whole list."""
        pack = self._pack
        gate_up, down = pack.gate_up, pack.down
        if experts is not None:
            e0, e1 = experts
            gate_up, down, weights = gate_up[e0:e1], down[e0:e1], weights[3 * e0:3 * e1]
        dev = x.device.type
        autocast = torch.is_autocast_enabled(dev)
        if autocast:  # as F.linear under autocast: inputs and weights in the autocast dtype
            dt = torch.get_autocast_dtype(dev)
            gate_up, down = gate_up.to(dt), down.to(dt)
        elif x.dtype != gate_up.dtype:
            raise RuntimeError(f"expert input {x.dtype} and weights {gate_up.dtype} differ (F.linear would refuse)")
        kernel = pack.kernel if not autocast else ("grouped_mm" if _kernel_for(gate_up) == "grouped_mm"
                                                   and _kernel_for(down) == "grouped_mm" else "mm")
        grad = torch.is_grad_enabled() and (x.requires_grad or any(w.requires_grad for w in weights))
        every = grad and self.every_expert_gets_a_gradient()
        chunks = cpu_chunks(x.device, x.shape[0], x.shape[1], counts)
        with torch.autocast(dev, enabled=False) if autocast else _nullcontext():
            if chunks is None:
                return _swiglu(x, counts, gate_up, down, weights, kernel, grad, every)
            return torch.cat([_swiglu(x[r0:r1], counts[e0:e1], gate_up[e0:e1], down[e0:e1],
                                      weights[3 * e0:3 * e1], kernel, grad, every)
                              for e0, e1, r0, r1 in chunks])


def cpu_chunks(device: torch.device, rows: int, width: int, counts: torch.Tensor
               ) -> list[tuple[int, int, int, int]] | None:
    """On CPU, a call of `rows` x `width` above the cache-sized `CPU_CHUNK_ELEMENTS` runs in chunks of
    consecutive experts, (first, end, first row, end row), each about that size, so that a chunk's activations stay
    in cache between its matmuls (the loop's advantage at thousands of tokens); None: one grouped call (GPU, decode).
    """
    if device.type != "cpu" or rows * width <= CPU_CHUNK_ELEMENTS:
        return None
    target = max(1, CPU_CHUNK_ELEMENTS // width)
    chunks, e0, r0, size = [], 0, 0, 0
    n = counts.tolist()
    for e, c in enumerate(n):
        if size and size + c > target:
            chunks.append((e0, e, r0, r0 + size))
            e0, r0, size = e, r0 + size, 0
        size += c
    chunks.append((e0, len(n), r0, r0 + size))
    return chunks


def _swiglu(x, counts, gate_up, down, weights, kernel, grad, every):
    inter = down.shape[-1]
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    if grad:
        gu_params = [w for i, w in enumerate(weights) if i % 3 != 2]
        dn_params = weights[2::3]
        h = _GroupedLinear.apply(x, gate_up, offs, counts, kernel, (inter, inter), every, *gu_params)
        a = F.silu(h[:, :inter]) * h[:, inter:]
        return _GroupedLinear.apply(a, down, offs, counts, kernel, (down.shape[1],), every, *dn_params)
    h = _gmm(x.to(gate_up.dtype), gate_up.transpose(1, 2), offs, counts, kernel)
    a = F.silu(h[:, :inter]) * h[:, inter:]
    return _gmm(a, down.transpose(1, 2), offs, counts, kernel)


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


__all__ = ["EXPERT_NAMES", "MOE_MODES", "ExpertPack", "RoutedExperts", "check_moe", "moe_blocks", "set_moe"]
