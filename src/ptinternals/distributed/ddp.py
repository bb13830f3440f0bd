"""DistributedDataParallel with gradient buckets that are all-reduced while backward still runs.

A reading of torch/csrc/distributed/c10d/reducer.cpp (class ``Reducer``) and
torch/nn/parallel/distributed.py, in Python:

- **Buckets, as torch assigns them.** A bucket is one flat buffer (one dtype, one device) into which
  many small gradients are copied, so one collective moves them all. At construction
  (``_ddp_init_helper`` in distributed.py) torch calls ``compute_bucket_assignment_by_size`` on the
  parameters in *registration* order and hands the Reducer the bucket list *reversed* (gradients
  arrive roughly last layer first). With the defaults (``find_unused_parameters=False``) the only limit
  is ``sys.maxsize``: the first iteration runs with ONE bucket per dtype and device, reduced when
  backward has produced every gradient, because the real order is not known yet. During that first
  backward the Reducer records the order in which the gradients became ready (``rebuilt_params_``),
  and at the next forward ``rebuild_buckets`` assigns buckets over that order with the limits
  ``[first_bucket_bytes_cap, bucket_bytes_cap]``: a small first bucket (``dist._DEFAULT_FIRST_BUCKET_BYTES``,
  1 MiB, when ``bucket_cap_mb`` is left at its default; the cap itself otherwise) so the first
  all-reduce starts after the first few gradients, 25 MiB ones after it (rank 0's assignment is
  broadcast so every rank agrees). It rebuilds once. Under ``find_unused_parameters=True`` it never
  rebuilds: the construction-time assignment uses ``[first, cap]`` over the registration order,
  reversed, so there the small bucket holds the *first* layers and goes out last.
- **Hooks.** A post-accumulate-grad hook per parameter copies the new ``.grad`` into its slot of the
  bucket (``mark_variable_ready``). When a bucket's last slot is filled the bucket is divided by the
  world size and its ``all_reduce(async_op=True)`` launched (``mark_bucket_ready`` /
  ``all_reduce_bucket``) while autograd keeps computing earlier layers' gradients: communication
  overlaps backward. Buckets are launched strictly in order (``next_bucket_``) so every rank issues
  the same collectives in the same order even if its gradients arrive in a different order.
- **Communication.** With no comm hook registered, the Reducer multiplies each gradient by 1/N *as it
  copies it into the bucket* (``mark_variable_ready_dense``: one pass over the data instead of two)
  and all-reduces the bucket with the C++ ``_AllReduceBySumCommHook`` (a plain SUM). The Python
  ``allreduce_hook`` of default_hooks.py, when registered, divides the bucket instead.
- **Finalize.** The first hook of a backward queues a callback on the autograd engine
  (``Variable._execution_engine.queue_callback``); the engine runs it when the whole backward graph
  has run, before ``loss.backward()`` returns (``finalize_backward``): it waits for every bucket and
  copies the averaged bucket back into each ``param.grad`` (``finalize_bucket_dense``). The caller
  never calls a "finish" method.
- **no_sync().** Inside the context the hooks do nothing, gradients just accumulate locally; the first
  backward outside it all-reduces the accumulated sums (gradient accumulation with one sync).
- **find_unused_parameters.** After forward, walk the autograd graph from the outputs
  (``search_unused_parameters``); parameters not reached would never fire their hook and their bucket
  would never launch, so they are marked ready (with a zero gradient) at the first hook. A
  ``local_used_map`` all-reduce at the end tells which were unused on *every* rank: those keep
  ``grad=None``. The graph walk and the extra all-reduce are the cost of the flag.

``timeline`` records (event, time.perf_counter(), index) so one can see bucket all-reduces start
before backward ends (``plot_ddp_timeline`` in ptinternals.viz.distributed draws it).
"""
from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from ._common import global_rank, group_rank_and_size, tensors_in
from .buckets import DEFAULT_BUCKET_CAP_MB, DEFAULT_FIRST_BUCKET_BYTES, compute_bucket_assignment_by_size
from .naive_ddp import broadcast_module_states

MiB = 1024 * 1024


@dataclass
class Bucket:
    """One flat gradient buffer and the parameters that live in it (reducer.hpp ``Bucket``)."""

    index: int
    param_indices: list[int]  # into DistributedDataParallel.params, in expected ready order
    offsets: list[int]  # element offset of each parameter's slot in ``buffer``
    buffer: torch.Tensor  # (sum of numels,) one dtype, one device
    pending: int = 0  # slots not yet filled in this backward
    work: dist.Work | None = None
    launched_at: float | None = None
    done_at: float | None = None
    names: list[str] = field(default_factory=list)


class DistributedDataParallel(nn.Module):
    """Bucketed, overlapping DDP. Use like torch's: wrap, forward, ``loss.backward()``, ``opt.step()``."""

    def __init__(self, module: nn.Module, group=None, bucket_cap_mb: float | None = None,
                 first_bucket_cap_mb: float | None = None, find_unused_parameters: bool = False):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
        for name, v in (("bucket_cap_mb", bucket_cap_mb), ("first_bucket_cap_mb", first_bucket_cap_mb)):
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0):
                raise ValueError(f"{name} must be None or a number > 0, got {v!r}")
        if not isinstance(find_unused_parameters, bool):
            raise TypeError(f"find_unused_parameters must be a bool, "
                            f"got {type(find_unused_parameters).__name__}")
        self.rank, self.world_size = group_rank_and_size(group, "DistributedDataParallel")
        self.module, self.group = module, group
        self.find_unused_parameters = find_unused_parameters
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]  # tied ones once
        if not named:
            raise ValueError("module has no parameters that require grad: nothing to synchronise")
        self.param_names = [n for n, _ in named]
        self.params = [p for _, p in named]
        broadcast_module_states(module, group)  # every replica starts from rank 0's weights

        # torch's limits (_BucketCapacityConfig): the first bucket is small only when the cap is the default.
        self.bucket_bytes_cap = max(1, int((DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb) * MiB))
        if first_bucket_cap_mb is not None:  # the course's knob for dist._DEFAULT_FIRST_BUCKET_BYTES
            self.first_bucket_bytes_cap = max(1, int(first_bucket_cap_mb * MiB))
        else:
            self.first_bucket_bytes_cap = DEFAULT_FIRST_BUCKET_BYTES if bucket_cap_mb is None else self.bucket_bytes_cap
        # Construction (_ddp_init_helper): registration order, the bucket list reversed. Without
        # find_unused_parameters the limit is sys.maxsize: one bucket until the order is known.
        if not find_unused_parameters:
            limits = [sys.maxsize]
        elif self.first_bucket_bytes_cap < self.bucket_bytes_cap:
            limits = [self.first_bucket_bytes_cap, self.bucket_bytes_cap]
        else:
            limits = [self.bucket_bytes_cap]
        assignment = compute_bucket_assignment_by_size(
            [p.numel() * p.element_size() for p in self.params], limits, keys=[(p.dtype, p.device) for p in self.params])
        self._build_buckets(list(reversed(assignment)))
        self._rebuilt = find_unused_parameters  # torch rebuilds once, and never under find_unused_parameters
        self._ready_order: list[int] = []  # the first backward's order of ready gradients (rebuilt_params_)

        self.require_backward_grad_sync = True
        self._expect_hooks = False  # True between a syncing forward and the end of its backward
        self._first_hook_called = False
        self._ready: list[bool] = [False] * len(self.params)
        self._unused: list[int] = []
        self._next_bucket = 0
        self.timeline: list[tuple[str, float, int]] = []
        self._hooks = [p.register_post_accumulate_grad_hook(self._make_hook(i))
                       for i, p in enumerate(self.params)]

    def _build_buckets(self, assignment: list[list[int]]) -> None:
        """One :class:`Bucket` per list of parameter indices, in launch order (reducer.cpp ``initialize_buckets``)."""
        self.buckets: list[Bucket] = []
        self._slot: dict[int, tuple[int, int]] = {}  # param index -> (bucket index, element offset)
        for b, indices in enumerate(assignment):
            offsets, total = [], 0
            for i in indices:
                offsets.append(total)
                self._slot[i] = (b, total)
                total += self.params[i].numel()
            first = self.params[indices[0]]
            buffer = torch.zeros(total, dtype=first.dtype, device=first.device)  # (sum of numels,)
            names = [self.param_names[i] for i in indices]
            self.buckets.append(Bucket(b, list(indices), offsets, buffer, names=names))

    def _rebuild_buckets(self) -> None:
        """``Reducer::rebuild_buckets``: assign buckets over the order the first backward's gradients became
        ready, with the limits [first bucket, cap]; rank 0's order is broadcast so every rank agrees."""
        if self._rebuilt or len(self._ready_order) != len(self.params):
            return
        order = torch.tensor(self._ready_order, dtype=torch.int64, device=self.params[0].device)
        dist.broadcast(order, src=global_rank(self.group, 0), group=self.group)  # sync_bucket_indices
        order_list = order.tolist()
        positions = compute_bucket_assignment_by_size(
            [self.params[i].numel() * self.params[i].element_size() for i in order_list],
            [self.first_bucket_bytes_cap, self.bucket_bytes_cap],
            keys=[(self.params[i].dtype, self.params[i].device) for i in order_list])
        self._build_buckets([[order_list[k] for k in bucket] for bucket in positions])
        self._rebuilt = True

    # ---------------------------------------------------------------- forward: prepare_for_backward
    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled():  # torch rebuilds before the forward allocates activations
            self._rebuild_buckets()
        sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        if sync:
            self._prepare_for_backward()
        out = self.module(*args, **kwargs)
        if sync:
            self.timeline.append(("forward_end", time.perf_counter(), -1))
            if self.find_unused_parameters:
                self._unused = self._search_unused_parameters(out)
        return out

    def _prepare_for_backward(self) -> None:
        for b in self.buckets:
            b.pending, b.work, b.launched_at, b.done_at = len(b.param_indices), None, None, None
        self._ready = [False] * len(self.params)
        self._unused, self._next_bucket = [], 0
        self._expect_hooks, self._first_hook_called = True, False
        self.timeline = [("forward_start", time.perf_counter(), -1)]

    def _search_unused_parameters(self, outputs) -> list[int]:
        """Parameters whose AccumulateGrad node is not reachable from ``outputs``' grad_fns."""
        reached: set[int] = set()
        seen: set = set()
        stack = [t.grad_fn for t in tensors_in(outputs) if t.grad_fn is not None]
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if hasattr(node, "variable"):  # an AccumulateGrad node: the leaf it accumulates into
                reached.add(id(node.variable))
            stack.extend(nxt for nxt, _ in node.next_functions)
        return [i for i, p in enumerate(self.params) if id(p) not in reached]

    # ---------------------------------------------------------------- backward: hooks and buckets
    def _make_hook(self, index: int):
        def hook(param: torch.Tensor) -> None:
            if not self._expect_hooks:  # no_sync(), or backward without a forward through us
                return
            if self._ready[index]:
                raise RuntimeError(f"parameter {self.param_names[index]!r} was marked ready twice in one "
                                   f"backward: call forward again before each backward")
            if not self._first_hook_called:
                self._first_hook_called = True
                torch.autograd.Variable._execution_engine.queue_callback(self._finalize_backward)
                for j in self._unused:  # they will never fire a hook: count them as ready, grad 0
                    self._mark_ready(j, None)
            if not self._rebuilt and len(self._ready_order) < len(self.params):
                self._ready_order.append(index)  # push_rebuilt_params
            self._mark_ready(index, param.grad)

        return hook

    def _mark_ready(self, index: int, grad: torch.Tensor | None) -> None:
        b, offset = self._slot[index]
        bucket = self.buckets[b]
        slot = bucket.buffer[offset: offset + self.params[index].numel()]  # (numel,) view into the bucket
        if grad is None:
            slot.zero_()
        else:
            torch.mul(grad.reshape(-1), 1.0 / self.world_size, out=slot)  # grad / N -> bucket, one pass
        self._ready[index] = True
        self.timeline.append(("grad_ready", time.perf_counter(), index))
        bucket.pending -= 1
        if bucket.pending == 0:
            self._launch_ready_buckets()

    def _launch_ready_buckets(self) -> None:
        # In order only: bucket k+1 waits for bucket k, so all ranks issue identical collectives.
        while self._next_bucket < len(self.buckets) and self.buckets[self._next_bucket].pending == 0:
            bucket = self.buckets[self._next_bucket]
            bucket.launched_at = time.perf_counter()
            self.timeline.append(("bucket_launch", bucket.launched_at, bucket.index))
            bucket.work = dist.all_reduce(bucket.buffer, group=self.group, async_op=True)  # SUM of grad / N
            bucket.work.get_future().then(lambda fut, b=bucket: self._bucket_done(b))
            self._next_bucket += 1

    def _bucket_done(self, bucket: Bucket) -> None:  # runs on the backend's thread when the reduce ends
        bucket.done_at = time.perf_counter()
        self.timeline.append(("bucket_done", bucket.done_at, bucket.index))

    def _finalize_backward(self) -> None:
        self.timeline.append(("backward_end", time.perf_counter(), -1))
        self._expect_hooks = False
        if self._next_bucket < len(self.buckets):
            missing = [self.param_names[i] for i, r in enumerate(self._ready) if not r]
            raise RuntimeError(
                f"DDP: backward ended but {len(missing)} parameter(s) never received a gradient, so "
                f"their buckets were never all-reduced: {missing}. Pass find_unused_parameters=True if "
                f"some parameters are legitimately unused in forward, or make them part of the loss.")
        for bucket in self.buckets:
            bucket.work.wait()
        used_anywhere = None
        if self.find_unused_parameters:  # local_used_map: which parameters got a grad on some rank
            unused = set(self._unused)
            used = torch.tensor([0 if i in unused else 1 for i in range(len(self.params))],
                                dtype=torch.int32, device=self.params[0].device)
            dist.all_reduce(used, group=self.group)
            used_anywhere = used.tolist()
        with torch.no_grad():
            for bucket in self.buckets:
                for i, offset in zip(bucket.param_indices, bucket.offsets, strict=True):
                    if used_anywhere is not None and used_anywhere[i] == 0:
                        continue  # unused on every rank: leave .grad as it was (None)
                    p = self.params[i]
                    reduced = bucket.buffer[offset: offset + p.numel()].view_as(p)
                    if p.grad is None:
                        p.grad = reduced.clone()
                    else:
                        p.grad.copy_(reduced)
        self.timeline.append(("sync_end", time.perf_counter(), -1))

    def finish_gradient_synchronization(self) -> None:
        """Run the end-of-backward step by hand (normally the autograd callback does it)."""
        if self._expect_hooks and self._first_hook_called:
            self._finalize_backward()

    # ---------------------------------------------------------------- gradient accumulation
    @contextlib.contextmanager
    def no_sync(self):
        """Forward+backward inside this context accumulate local grads without communicating."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def bucket_names(self) -> list[list[str]]:
        """Parameter names per bucket, in launch order."""
        return [list(b.names) for b in self.buckets]
