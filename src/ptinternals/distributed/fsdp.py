"""Fully sharded data parallel (ZeRO-3): parameters exist in full only while a unit computes.

A reading of FSDP1 (torch/distributed/fsdp/_flat_param.py ``FlatParamHandle``,
_runtime_utils.py ``_pre_forward`` / ``_post_forward`` / ``_pre_backward_hook`` /
``_post_backward_hook``) in one file:

- **Units and flat shards.** The model is cut into units (e.g. one per transformer block; the root
  keeps what is left). A unit's parameters (P elements) are flattened, padded to N * S with
  S = ceil(P / N), and rank r keeps only elements [r*S, (r+1)*S): an ``nn.Parameter`` of shape (S,).
  The original parameters are deleted from the modules; the optimizer sees only shards.
- **Forward.** Before a unit runs: all-gather the shards (S,) -> (N*S,) ("unshard") and point each
  module attribute (``layer.weight``...) at a view of that flat buffer. After it runs: drop the views
  ("reshard"), so the full parameters are freed and the next unit's can take their place. Peak
  parameter memory is about one unit (two with prefetch), not the whole model.
- **Backward.** Autograd saves the weights it needs (``addmm`` keeps ``weight.t()``). Saving them would
  keep every unit's full parameters alive until backward, defeating the point, so a
  ``saved_tensors_hooks`` pair replaces each saved parameter view by a small token and, when backward
  needs it, all-gathers the unit again (FSDP1 frees and re-allocates the storage instead; same
  collectives). The unshard is an autograd Function, so its backward receives the gradient of the
  whole flat buffer (N*S,) once every op of the unit has run: that is the moment to reshard and
  **reduce-scatter** the gradient -> (S,), the mean over ranks of this rank's shard's gradient.
- **Prefetch.** With ``prefetch=True`` the next unit's all-gather is issued asynchronously before it is
  needed (forward: in the order the units ran last iteration; backward: the reverse), overlapping
  communication with compute at the cost of one more unit's memory (FSDP's ``forward_prefetch`` /
  ``BackwardPrefetch.BACKWARD_PRE``).
- **Mixed precision.** ``param_dtype`` casts the shard before the all-gather (half the bytes on the
  wire, compute in bf16); ``reduce_dtype`` is the dtype of the gradient reduce-scatter; the shard and
  the optimizer stay in fp32 (FSDP's ``MixedPrecision`` / FSDP2's ``MixedPrecisionPolicy``).

This is FSDP1, the design PyTorch has moved away from: FSDP2 (``torch.distributed.fsdp.fully_shard``,
:mod:`ptinternals.distributed.fsdp2`) shards each parameter on dim 0 and keeps the shards as the
module's parameters, instead of one flat buffer per unit; the collectives are the same.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ._common import all_gather_flat, group_rank_and_size, reduce_scatter_flat


@dataclass
class _ParamInfo:
    owner: nn.Module  # the module that has the attribute
    attr: str  # e.g. "weight"
    qualname: str  # e.g. "2.weight", relative to the wrapped model
    shape: torch.Size
    numel: int
    offset: int  # element offset in the unit's flat parameter


class _ParamViewToken:
    """What autograd keeps instead of a saved parameter view: where to find it after re-gathering."""

    __slots__ = ("handle", "size", "stride", "offset")

    def __init__(self, handle, t: torch.Tensor):
        self.handle, self.size, self.stride, self.offset = handle, t.size(), t.stride(), t.storage_offset()


class FlatParamHandle:
    """One unit's flat parameter: the local shard (S,) and, while unsharded, the full buffer (N*S,)."""

    def __init__(self, fsdp: "FullyShardedDataParallel", name: str, infos: list[_ParamInfo],
                 flat: torch.Tensor):
        self.fsdp, self.name, self.infos = fsdp, name, infos
        n, r = fsdp.world_size, fsdp.rank
        self.numel = flat.numel()  # P
        self.shard_size = math.ceil(self.numel / n)  # S
        padded = torch.zeros(n * self.shard_size, dtype=flat.dtype, device=flat.device)
        padded[: self.numel].copy_(flat)
        self.shard = nn.Parameter(padded[r * self.shard_size: (r + 1) * self.shard_size].clone())  # (S,)
        self.full: torch.Tensor | None = None  # (N*S,) in param_dtype, only while unsharded
        self._prefetch: tuple[dist.Work, torch.Tensor] | None = None

    # -- collectives ------------------------------------------------------------------------------
    def _start_all_gather(self, async_op: bool):
        f = self.fsdp
        src = self.shard.detach().to(f.param_dtype or self.shard.dtype)  # (S,), cast before sending
        full = torch.empty(f.world_size * self.shard_size, dtype=src.dtype, device=src.device)  # (N*S,)
        work = all_gather_flat(full, src, group=f.group, async_op=async_op)
        f._track_allocation(full, f"all-gather {self.name or '<root>'}")
        return work, full

    def prefetch(self) -> None:
        if self.full is None and self._prefetch is None:
            self._prefetch = self._start_all_gather(async_op=True)

    def unshard(self) -> torch.Tensor:
        """The full flat parameter (N*S,): from a finished prefetch, or gathered now."""
        if self._prefetch is not None:
            work, full = self._prefetch
            work.wait()
            self._prefetch = None
            return full
        return self._start_all_gather(async_op=False)[1]

    def reduce_scatter_grad(self, grad_full: torch.Tensor) -> torch.Tensor:
        """(N*S,) gradient of the full flat parameter -> (S,) mean-over-ranks gradient of my shard."""
        f = self.fsdp
        g = (grad_full.to(f.reduce_dtype or grad_full.dtype) / f.world_size).contiguous()
        out = torch.empty(self.shard_size, dtype=g.dtype, device=g.device)
        reduce_scatter_flat(out, g, group=f.group)
        return out.to(self.shard.dtype)

    # -- module attributes ------------------------------------------------------------------------
    def use_views(self, full: torch.Tensor) -> None:
        for p in self.infos:  # layer.weight becomes a (shape) view of the flat buffer, no copy
            setattr(p.owner, p.attr, full[p.offset: p.offset + p.numel].view(p.shape))

    def reshard(self) -> None:
        if self._prefetch is not None:
            self._prefetch[0].wait()
            self._prefetch = None
        self.full = None
        for p in self.infos:
            setattr(p.owner, p.attr, None)  # drop our references; autograd holds only tokens


class _UnshardFlatParam(torch.autograd.Function):
    """forward: all-gather shards -> full flat parameter. backward: reshard, reduce-scatter the grad."""

    @staticmethod
    def forward(ctx, shard: torch.Tensor, handle: FlatParamHandle) -> torch.Tensor:
        ctx.handle = handle
        return handle.unshard()

    @staticmethod
    def backward(ctx, grad_full: torch.Tensor):
        handle = ctx.handle
        handle.fsdp._backward_started()
        handle.reshard()  # every op of this unit has finished its backward: full params not needed
        handle.fsdp._note(f"reshard {handle.name or '<root>'} (backward)")
        return handle.reduce_scatter_grad(grad_full), None


class FullyShardedDataParallel(nn.Module):
    """``FullyShardedDataParallel(model, units=[model[0], model[1], ...])``; then use like the model.

    ``parameters()`` yields only the local flat shards; build the optimizer on them.
    """

    def __init__(self, module: nn.Module, units=(), group=None, param_dtype: torch.dtype | None = None,
                 reduce_dtype: torch.dtype | None = None, prefetch: bool = True):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
        for name, dt in (("param_dtype", param_dtype), ("reduce_dtype", reduce_dtype)):
            if dt is not None and not (isinstance(dt, torch.dtype) and dt.is_floating_point):
                raise TypeError(f"{name} must be None or a floating torch.dtype, got {dt!r}")
        if not isinstance(prefetch, bool):
            raise TypeError(f"prefetch must be a bool, got {type(prefetch).__name__}")
        self.rank, self.world_size = group_rank_and_size(group, "FullyShardedDataParallel")
        self.group, self.prefetch = group, prefetch
        self.param_dtype, self.reduce_dtype = param_dtype, reduce_dtype
        self.module = module
        units = list(units)
        names = {id(m): n for n, m in module.named_modules()}
        for i, u in enumerate(units):
            if not isinstance(u, nn.Module) or id(u) not in names:
                raise ValueError(f"units[{i}] must be a submodule of module, got {type(u).__name__}")
            if u is module:
                raise ValueError(f"units[{i}] is the wrapped module itself: it is always the root unit")
        for i, u in enumerate(units):
            for j, v in enumerate(units):
                if i != j and any(m is v for m in u.modules()):
                    raise ValueError(f"units[{j}] is nested inside units[{i}]: units must not overlap")

        seen: dict[int, str] = {}
        for qualname, p in module.named_parameters(remove_duplicate=False):
            if id(p) in seen:
                raise ValueError(f"parameter {qualname!r} is shared with {seen[id(p)]!r}: tied parameters "
                                 f"are not supported by this FSDP")
            seen[id(p)] = qualname
            if not p.requires_grad:
                raise ValueError(f"parameter {qualname!r} does not require grad: frozen parameters are "
                                 f"not supported")
        unit_of = {}  # id(submodule) -> unit index; the root unit is len(units)
        for k, u in enumerate(units):
            for m in u.modules():
                unit_of[id(m)] = k
        groups: list[list[_ParamInfo]] = [[] for _ in range(len(units) + 1)]
        for mod_name, m in module.named_modules():
            for attr, p in list(m.named_parameters(recurse=False)):
                qual = f"{mod_name}.{attr}" if mod_name else attr
                groups[unit_of.get(id(m), len(units))].append(
                    _ParamInfo(m, attr, qual, p.shape, p.numel(), 0))
        self.handles: list[FlatParamHandle] = []
        self._root_handle = None
        self._all_buffers: list[tuple[weakref.ref, int]] = []
        self.peak_full_param_bytes = 0
        self.memory_events: list[tuple[str, int]] = []  # (what happened, live full-param bytes)
        for k, infos in enumerate(groups):
            if not infos:
                continue
            params = [getattr(i.owner, i.attr) for i in infos]
            for i, p in zip(infos, params, strict=True):
                if p.dtype != params[0].dtype or p.device != params[0].device:
                    raise TypeError(f"parameter {i.qualname!r} is {p.dtype} on {p.device} but "
                                    f"{infos[0].qualname!r} is {params[0].dtype} on {params[0].device}: "
                                    f"a flat parameter needs one of each")
            offset = 0
            for i in infos:
                i.offset, offset = offset, offset + i.numel
            with torch.no_grad():
                flat = torch.cat([p.detach().reshape(-1) for p in params])  # (P,)
            handle = FlatParamHandle(self, names[id(units[k])] if k < len(units) else "", infos, flat)
            for i in infos:  # the module no longer owns its parameters
                del i.owner._parameters[i.attr]
                setattr(i.owner, i.attr, None)
            self.handles.append(handle)
            if k < len(units):
                units[k].register_forward_pre_hook(lambda m, args, h=handle: self._pre_forward(h))
                units[k].register_forward_hook(lambda m, args, out, h=handle: self._post_forward(h))
            else:
                self._root_handle = handle
        if not self.handles:
            raise ValueError("module has no parameters to shard")
        self.flat_shards = nn.ParameterList([h.shard for h in self.handles])
        self._exec_order: list[FlatParamHandle] = []  # units in the order they ran last forward
        self._this_order: list[FlatParamHandle] = []
        self._in_backward = False

    # -- memory accounting: count the full-parameter buffers that are really still alive ----------
    def live_full_param_bytes(self) -> int:
        self._all_buffers = [(ref, nb) for ref, nb in self._all_buffers if ref() is not None]
        return sum(nb for _, nb in self._all_buffers)

    def _track_allocation(self, full: torch.Tensor, what: str) -> None:
        self._all_buffers.append((weakref.ref(full), full.numel() * full.element_size()))
        live = self.live_full_param_bytes()
        self.peak_full_param_bytes = max(self.peak_full_param_bytes, live)
        self.memory_events.append((what, live))

    def _note(self, what: str) -> None:
        self.memory_events.append((what, self.live_full_param_bytes()))

    # -- forward ----------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        for h in self.handles:  # nothing gathered may survive an optimizer step: it would be stale
            h.reshard()
        self._this_order, self._in_backward = [], False
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            if self._root_handle is not None:
                self._pre_forward(self._root_handle)
            out = self.module(*args, **kwargs)
            if self._root_handle is not None:
                self._post_forward(self._root_handle)
        self._exec_order = self._this_order
        return out

    def _pre_forward(self, h: FlatParamHandle) -> None:
        self._this_order.append(h)
        h.full = _UnshardFlatParam.apply(h.shard, h)  # (N*S,), differentiable w.r.t. the shard
        h.use_views(h.full)
        if self.prefetch and h in self._exec_order:  # next unit of the last iteration's order
            k = self._exec_order.index(h)
            if k + 1 < len(self._exec_order):
                self._exec_order[k + 1].prefetch()

    def _post_forward(self, h: FlatParamHandle) -> None:
        h.reshard()
        self._note(f"reshard {h.name or '<root>'}")

    # -- backward ---------------------------------------------------------------------------------
    def _pack(self, t: torch.Tensor):
        for h in self.handles:
            full = h.full
            if (full is not None and t.device == full.device
                    and t.untyped_storage().data_ptr() == full.untyped_storage().data_ptr()):
                return _ParamViewToken(h, t)  # do not keep the full parameters alive
        return t

    def _unpack(self, x):
        if not isinstance(x, _ParamViewToken):
            return x
        h = x.handle
        self._backward_started()
        if h.full is None:  # first use of this unit in backward: gather it again
            h.full = h.unshard()
            if self.prefetch and h in self._exec_order:  # the unit before it runs its backward next
                k = self._exec_order.index(h)
                if k > 0:
                    self._exec_order[k - 1].prefetch()
        return h.full.as_strided(x.size, x.stride, x.offset)

    def _backward_started(self) -> None:
        if not self._in_backward:
            self._in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_finished)

    def _backward_finished(self) -> None:
        for h in self.handles:  # free anything prefetched but not used
            h.reshard()
        self._in_backward = False
        self._note("backward end")

    # -- state ------------------------------------------------------------------------------------
    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Gather every unit (a collective: all ranks call it) -> {original name: full tensor}."""
        out = {}
        for h in self.handles:
            full = torch.empty(self.world_size * h.shard_size, dtype=h.shard.dtype, device=h.shard.device)
            all_gather_flat(full, h.shard.detach(), group=self.group)  # fp32 shards -> fp32 full
            for p in h.infos:
                out[p.qualname] = full[p.offset: p.offset + p.numel].view(p.shape).clone()
        return out

    def sharded_state_dict(self) -> dict:
        """This rank's shards (save one file per rank; no communication)."""
        return {"world_size": self.world_size, "rank": self.rank,
                "shards": {h.name: h.shard.detach().clone() for h in self.handles}}

    @torch.no_grad()
    def load_sharded_state_dict(self, state: dict) -> None:
        if state.get("world_size") != self.world_size or state.get("rank") != self.rank:
            raise ValueError(f"state holds rank {state.get('rank')} of world_size {state.get('world_size')}; "
                             f"this is rank {self.rank} of {self.world_size}")
        for h in self.handles:
            if h.name not in state["shards"] or state["shards"][h.name].shape != h.shard.shape:
                raise ValueError(f"state has no shard of shape {tuple(h.shard.shape)} for unit {h.name!r}")
            h.shard.copy_(state["shards"][h.name])
