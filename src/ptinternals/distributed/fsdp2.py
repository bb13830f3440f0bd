"""FSDP2 (``torch.distributed.fsdp.fully_shard``): every parameter sharded on dim 0; the shards stay the model's parameters.

A reading of torch/distributed/fsdp/_fully_shard/ (``_fully_shard.py``, ``_fsdp_param.py``,
``_fsdp_param_group.py``, ``_fsdp_collectives.py``, ``_fsdp_state.py``), without DTensor:

- **Groups.** ``fully_shard(module)`` makes one group of the parameters in ``module``'s subtree that no
  inner ``fully_shard`` already manages. Call it on each block, then on the root; a group is the unit of
  communication (one all-gather, one reduce-scatter) and of memory (its parameters exist in full only
  while it computes).
- **Sharding on dim 0.** A parameter of shape (d0, *rest) is chunked like ``torch.chunk(p, N, dim=0)``:
  ceil(d0 / N) rows per rank, the last ranks' chunks short or empty. The shard replaces the parameter on
  its module under the same name, an ``nn.Parameter`` of shape (rows_r, *rest): ``model.parameters()``
  yields shards, so ``AdamW(model.parameters())`` keeps state for this rank's rows only, and state-dict
  names do not change. (FSDP2's shard is a DTensor, placement ``Shard(0)``, that knows its global shape;
  here a plain tensor, and the group keeps the shapes.)
- **Unshard** (before the group's forward, and again before its backward): each rank copies its shards,
  padded to ceil(d0 / N) rows, into one flat buffer ("all-gather copy-in"), one all-gather per group
  gathers every rank's, and each parameter's full value is copied out of it into its *unsharded
  parameter*, a leaf ``nn.Parameter`` of the full shape that the module computes with.
- **Reshard** (after forward when ``reshard_after_forward``, and after backward): the module gets its
  shards back and the unsharded parameters' storage is freed (``untyped_storage().resize_(0)``). Autograd
  still holds the unsharded parameters it saved for backward; a hook on the group's forward outputs
  re-allocates their storage and all-gathers into it before the group's backward runs, without bumping
  their version counters (FSDP2 copies under ``_unsafe_preserve_version_counter``; here through ``.data``).
  With ``reshard_after_forward=False`` the full parameters stay from forward to backward: no second
  all-gather, more memory (torch's default for the root group, which backward needs first).
- **Reduce-scatter.** When every unsharded parameter of the group that requires grad has its ``.grad``
  (post-accumulate-grad hooks), the gradients are padded, laid out rank-major in one flat buffer
  ("reduce-scatter copy-in"), divided by N and reduce-scattered in ``reduce_dtype``; each rank adds its
  rows to its shard's ``.grad``. A callback queued on the autograd engine reduces any group left over
  (a parameter the forward did not use) when backward ends, and reshards everything.
- **Frozen and tied parameters.** A ``requires_grad=False`` parameter is sharded and gathered like any
  other and gets no gradient. A parameter tied between modules of one group is one parameter (its shard
  is put at every place it lives). Tied between two groups it is refused, as torch refuses it ("use
  ``fully_shard([module_a, module_b])`` to place them in the same FSDP group"); so is a non-contiguous
  parameter (torch: "FSDP does not support non-contiguous parameters yet").
- **Mixed precision** (``MixedPrecisionPolicy(param_dtype, reduce_dtype)``): shards are cast to
  ``param_dtype`` before the all-gather (half the bytes on the wire), the group computes in it (its
  floating inputs are cast too), gradients are reduce-scattered in ``reduce_dtype``; shards, their
  gradients and the optimizer stay in the parameters' own dtype.

Not modelled: prefetching (FSDP2 issues the next group's all-gather early in backward, and in forward
when asked), DTensor, CPU offload, and FSDP2's own lazy initialisation from the root. FSDP1's design,
one flat parameter per unit, is :mod:`ptinternals.distributed.fsdp`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ._common import all_gather_flat, group_rank_and_size, reduce_scatter_flat, tensors_in


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """``torch.distributed.fsdp.MixedPrecisionPolicy``: the dtype of the all-gather and compute, and of the reduce-scatter."""

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None


class MemoryLog:
    """Live bytes of unsharded parameters after each all-gather and reshard (for ``plot_fsdp_memory``)."""

    def __init__(self):
        self.groups: list[ParamGroup] = []
        self.events: list[tuple[str, int]] = []
        self.peak = 0

    def live_bytes(self) -> int:
        return sum(p.unsharded.untyped_storage().nbytes() for g in self.groups for p in g.params
                   if p.unsharded is not None)

    def note(self, what: str) -> None:
        live = self.live_bytes()
        self.peak = max(self.peak, live)
        self.events.append((what, live))


class ShardedParam:
    """One parameter: its dim-0 shard (registered on its modules) and, while unsharded, its full value."""

    def __init__(self, group: "ParamGroup", name: str, param: nn.Parameter, places: list[tuple[nn.Module, str]]):
        n, r = group.world_size, group.rank
        if param.dim() == 0:
            raise ValueError(f"parameter {name!r} is 0-d: there is no dim 0 to shard (make it shape (1,))")
        if not param.is_contiguous():
            raise ValueError(f"parameter {name!r} is not contiguous (shape {tuple(param.shape)}, stride "
                             f"{param.stride()}): torch's fully_shard refuses it too (NotImplementedError)")
        self.name, self.places, self.shape = name, places, param.shape
        self.rows = param.shape[0]
        self.rows_per_rank = math.ceil(self.rows / n)  # torch.chunk's chunk size
        lo, hi = min(r * self.rows_per_rank, self.rows), min((r + 1) * self.rows_per_rank, self.rows)
        self.row_numel = math.prod(param.shape[1:])
        self.padded_numel = self.rows_per_rank * self.row_numel  # elements each rank sends, padding included
        with torch.no_grad():  # (hi - lo, *rest): this rank's rows, the only copy it keeps
            self.sharded = nn.Parameter(param.detach()[lo:hi].clone(), requires_grad=param.requires_grad)
        self.my_rows = hi - lo
        self.unsharded: nn.Parameter | None = None  # (d0, *rest), created at the first unshard
        for module, attr in places:
            module._parameters[attr] = self.sharded

    def padded_shard(self, dtype) -> torch.Tensor:
        """(rows_per_rank * row_numel,): this rank's rows, cast, zero rows past the end."""
        out = torch.zeros(self.rows_per_rank, self.row_numel, dtype=dtype, device=self.sharded.device)
        out[: self.my_rows].copy_(self.sharded.detach().reshape(self.my_rows, self.row_numel))
        return out.reshape(-1)

    def use(self, which: nn.Parameter) -> None:
        for module, attr in self.places:
            module._parameters[attr] = which


class ParamGroup:
    """The parameters one ``fully_shard`` call manages (``FSDPParamGroup``)."""

    def __init__(self, modules: list[nn.Module], params: list[ShardedParam], group, rank: int, world_size: int,
                 reshard_after_forward: bool, mp_policy: MixedPrecisionPolicy, memory: MemoryLog | None, label: str):
        self.modules, self.params, self.group = modules, params, group
        self.rank, self.world_size = rank, world_size
        self.reshard_after_forward, self.mp, self.memory, self.label = reshard_after_forward, mp_policy, memory, label
        self.unsharded_now = False
        self.in_backward = False
        self.pending: set[int] = set()  # indices of trainable params whose grad has not arrived this backward

    # -- all-gather -------------------------------------------------------------------------------
    def unshard(self) -> None:
        if self.unsharded_now or not self.params:
            return
        p0 = self.params[0].sharded
        dtype = self.mp.param_dtype or p0.dtype
        send = torch.cat([p.padded_shard(dtype) for p in self.params])  # (sum of padded numels,) copy-in
        per_rank = send.numel()
        gathered = torch.empty(self.world_size * per_rank, dtype=dtype, device=p0.device)  # (N * per_rank,)
        all_gather_flat(gathered, send, group=self.group)
        by_rank = gathered.view(self.world_size, per_rank)
        offset = 0
        with torch.no_grad():
            for k, p in enumerate(self.params):  # copy-out: rank q's rows of p are by_rank[q, offset:offset + padded]
                full = by_rank[:, offset: offset + p.padded_numel].reshape(-1)[: p.rows * p.row_numel]
                offset += p.padded_numel
                if p.unsharded is None or p.unsharded.dtype != dtype:
                    p.unsharded = nn.Parameter(torch.empty(p.shape, dtype=dtype, device=p0.device),
                                               requires_grad=p.sharded.requires_grad)
                    if p.unsharded.requires_grad:
                        p.unsharded.register_post_accumulate_grad_hook(lambda t, k=k: self._grad_ready(k))
                storage = p.unsharded.untyped_storage()
                if storage.nbytes() == 0 and p.unsharded.numel():
                    storage.resize_(p.unsharded.numel() * p.unsharded.element_size())
                p.unsharded.data.copy_(full.view(p.shape))  # .data: autograd's saved copies stay valid
        self.unsharded_now = True
        if self.memory is not None:
            self.memory.note(f"all-gather {self.label}")

    def reshard(self) -> None:
        for p in self.params:
            p.use(p.sharded)
            if p.unsharded is not None:
                p.unsharded.untyped_storage().resize_(0)
        self.unsharded_now = False
        if self.memory is not None:
            self.memory.note(f"reshard {self.label}")

    # -- forward hooks ----------------------------------------------------------------------------
    def pre_forward(self, module, args, kwargs):
        if self.mp.param_dtype is not None:  # cast_forward_inputs
            args = tuple(a.to(self.mp.param_dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                         for a in args)
        self.unshard()
        for p in self.params:
            p.use(p.unsharded)
        return args, kwargs

    def post_forward(self, module, args, output):
        for p in self.params:
            p.use(p.sharded)
        if self.reshard_after_forward or not torch.is_grad_enabled():  # no backward will come to free them
            self.reshard()
        if torch.is_grad_enabled():
            for t in tensors_in(output):
                if t.requires_grad:
                    t.register_hook(self._pre_backward)
        return output

    # -- backward ---------------------------------------------------------------------------------
    def _pre_backward(self, grad):
        if not self.in_backward:
            self.in_backward = True
            self.pending = {k for k, p in enumerate(self.params) if p.sharded.requires_grad}
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        self.unshard()
        return grad

    def _grad_ready(self, k: int) -> None:
        self.pending.discard(k)
        if self.in_backward and not self.pending:
            self.reduce_scatter_grads()

    def reduce_scatter_grads(self) -> None:
        """(N * rows_per_rank, *rest) gradients, rank-major in one flat buffer -> this rank's rows, / N."""
        with_grad = [p for p in self.params if p.unsharded is not None and p.unsharded.grad is not None]
        if with_grad:
            p0 = with_grad[0].unsharded
            dtype = self.mp.reduce_dtype or p0.grad.dtype
            n = self.world_size
            blocks = []
            for p in with_grad:  # each (N, padded): rank q's rows of p's gradient in row q
                g = torch.zeros(n * p.rows_per_rank * p.row_numel, dtype=dtype, device=p0.device)
                g[: p.rows * p.row_numel].copy_(p.unsharded.grad.reshape(-1))
                blocks.append(g.view(n, p.padded_numel))
            send = torch.cat(blocks, dim=1).reshape(-1).div_(n)  # (N * sum of padded,), the mean over ranks
            mine = torch.empty(send.numel() // n, dtype=dtype, device=p0.device)
            reduce_scatter_flat(mine, send, group=self.group)
            offset = 0
            for p in with_grad:
                rows = mine[offset: offset + p.padded_numel].view(p.rows_per_rank, *p.shape[1:])[: p.my_rows]
                offset += p.padded_numel
                rows = rows.to(p.sharded.dtype)
                p.sharded.grad = rows.clone() if p.sharded.grad is None else p.sharded.grad + rows
                p.unsharded.grad = None
        self.pending = set()
        self.reshard()

    def _end_of_backward(self) -> None:
        if self.pending or self.unsharded_now:  # a parameter got no gradient in this backward
            self.reduce_scatter_grads()
        self.in_backward = False


def fully_shard(module: nn.Module, *, group=None, reshard_after_forward: bool = True,
                mp_policy: MixedPrecisionPolicy | None = None, memory: MemoryLog | None = None) -> nn.Module:
    """Shard the parameters of ``module`` that no inner ``fully_shard`` manages, in place; returns ``module``.

    Apply it to each block first, then to the root. ``memory`` (optional) records live unsharded bytes.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
    if not isinstance(reshard_after_forward, bool):
        raise TypeError(f"reshard_after_forward must be a bool, got {type(reshard_after_forward).__name__}")
    mp_policy = mp_policy or MixedPrecisionPolicy()
    if not isinstance(mp_policy, MixedPrecisionPolicy):
        raise TypeError(f"mp_policy must be a MixedPrecisionPolicy, got {type(mp_policy).__name__}")
    for name, dt in (("param_dtype", mp_policy.param_dtype), ("reduce_dtype", mp_policy.reduce_dtype)):
        if dt is not None and not (isinstance(dt, torch.dtype) and dt.is_floating_point):
            raise TypeError(f"mp_policy.{name} must be None or a floating torch.dtype, got {dt!r}")
    if getattr(module, "_fsdp_group", None) is not None:
        raise ValueError(f"fully_shard was already applied to this {type(module).__name__}")
    rank, world_size = group_rank_and_size(group, "fully_shard")

    places: dict[int, list] = {}  # id(param) -> [qualified name, param, [(module, attr), ...]]
    stack = [("", module)]
    while stack:  # the subtree, without the subtrees an inner fully_shard manages
        prefix, m = stack.pop()
        for attr, p in list(m._parameters.items()):
            if p is None:
                continue
            name = f"{prefix}{attr}"
            owner = getattr(p, "_fsdp_managed_by", None)  # set on a parameter another group replaced
            if owner is not None:
                raise ValueError(f"parameter {name!r} is shared with a parameter already managed by another "
                                 f"fully_shard group ({owner.label or 'its root'}): tied parameters must be in "
                                 f"one group (shard a module that contains both places)")
            places.setdefault(id(p), [name, p, []])[2].append((m, attr))
        for child_name, child in reversed(list(m._modules.items())):
            if child is not None and getattr(child, "_fsdp_group", None) is None:
                stack.append((f"{prefix}{child_name}.", child))
    pg = ParamGroup([module], [], group, rank, world_size, reshard_after_forward, mp_policy, memory,
                    type(module).__name__)
    pg.params = [ShardedParam(pg, name, p, where) for name, p, where in places.values()]
    for _, p, _ in places.values():  # only a module outside this group can still hold the original
        p._fsdp_managed_by = pg
    module._fsdp_group = pg
    if pg.params:
        module.register_forward_pre_hook(pg.pre_forward, with_kwargs=True)
        module.register_forward_hook(pg.post_forward)
    if memory is not None:
        memory.groups.append(pg)
    return module


class FullyShardedSequential(nn.Module):
    """``fully_shard`` on every child of an ``nn.Sequential`` that has parameters, then on the root.

    ``model.parameters()`` (and this module's) yield the dim-0 shards under their original names. A
    parameter tied between two children, or a non-contiguous one, is refused, naming it, as torch's
    ``fully_shard`` refuses them.
    """

    def __init__(self, model: nn.Sequential, group=None, reshard_after_forward: bool = True,
                 mp_policy: MixedPrecisionPolicy | None = None):
        super().__init__()
        if not isinstance(model, nn.Sequential):
            raise TypeError(f"model must be an nn.Sequential, got {type(model).__name__}")
        first_seen: dict[int, tuple[str, int]] = {}
        for k, child in enumerate(model):  # refuse what torch refuses, naming it as the model does
            for name, p in child.named_parameters(remove_duplicate=False):
                if not p.is_contiguous():
                    raise ValueError(f"parameter '{k}.{name}' is not contiguous (stride {p.stride()}): torch's "
                                     f"fully_shard refuses it too (NotImplementedError)")
                seen = first_seen.setdefault(id(p), (f"{k}.{name}", k))
                if seen[1] != k:
                    raise ValueError(f"parameter '{k}.{name}' is tied to {seen[0]!r} of another unit: fully_shard "
                                     f"groups cannot share a parameter (torch refuses it too; shard the two units "
                                     f"as one group)")
        self.model, self.memory = model, MemoryLog()
        for k, child in enumerate(model):
            if any(True for _ in child.parameters()):
                fully_shard(child, group=group, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy,
                            memory=self.memory)
                child._fsdp_group.label = str(k)
        fully_shard(model, group=group, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy,
                    memory=self.memory)

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)
