"""Data parallelism in its simplest correct form: one all-reduce per parameter, fired by a hook.

What ``torch.nn.parallel.DistributedDataParallel`` does, minus buckets:

1. at construction, broadcast every parameter and buffer from rank 0, so all replicas start equal
   (DDP's ``_sync_module_states``, torch/distributed/utils.py);
2. during backward, as soon as a parameter's ``.grad`` has been accumulated
   (``Tensor.register_post_accumulate_grad_hook``), launch an async all-reduce of that gradient,
   pre-divided by the world size so the sum is the mean over ranks (DDP's default ``allreduce_hook``,
   torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py);
3. at the end of backward (a callback queued on the autograd engine, as reducer.cpp's
   ``finalize_backward`` is) wait for every all-reduce, so ``optimizer.step()`` sees synced grads.

Because every rank's loss is the mean over its own equal-sized shard of the batch, the mean of the
ranks' gradients equals the gradient of the full-batch mean loss.

The cost this version teaches: one collective per parameter. A model with 200 small tensors pays
200 latencies per step; :mod:`ptinternals.distributed.ddp` fixes that with buckets.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from ._common import global_rank, group_rank_and_size


def broadcast_module_states(module: nn.Module, group=None, src_group_rank: int = 0) -> None:
    """Copy rank ``src_group_rank``'s parameters and buffers into every rank's ``module`` in place."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
    _, n = group_rank_and_size(group, "broadcast_module_states")
    if not isinstance(src_group_rank, int) or not 0 <= src_group_rank < n:
        raise IndexError(f"src_group_rank must be in [0, {n}), got {src_group_rank!r}")
    src = global_rank(group, src_group_rank)
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=src, group=group)


class NaiveDDP(nn.Module):
    """``NaiveDDP(module)(x)`` runs ``module(x)``; ``loss.backward()`` leaves mean-over-ranks grads."""

    def __init__(self, module: nn.Module, group=None):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
        self.rank, self.world_size = group_rank_and_size(group, "NaiveDDP")
        self.module = module
        self.group = group
        self.params = [p for p in module.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("module has no parameters that require grad: nothing to synchronise")
        broadcast_module_states(module, group)
        self._pending: list[tuple[dist.Work, torch.Tensor]] = []  # (work, grad being reduced)
        self._callback_queued = False
        self.timeline: list[tuple[str, float, int]] = []  # ("allreduce_start", t, param index), ...
        self._handles = [p.register_post_accumulate_grad_hook(self._make_hook(i))
                         for i, p in enumerate(self.params)]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _make_hook(self, index: int):
        def hook(param: torch.Tensor) -> None:
            if not self._callback_queued:  # first hook of this backward: arrange the final wait
                self._callback_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self.finish_gradient_synchronization)
            param.grad.div_(self.world_size)  # pre-divide: the sum over ranks is then the mean
            self.timeline.append(("allreduce_start", time.perf_counter(), index))
            work = dist.all_reduce(param.grad, group=self.group, async_op=True)
            self._pending.append((work, param.grad))

        return hook

    def finish_gradient_synchronization(self) -> None:
        """Wait for every outstanding all-reduce (runs automatically at the end of backward)."""
        self.timeline.append(("backward_end", time.perf_counter(), -1))
        for work, _ in self._pending:
            work.wait()
        self._pending.clear()
        self._callback_queued = False
