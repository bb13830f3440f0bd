"""ZeRO stage 1: every rank keeps the optimizer state of only its shard of the parameters.

Mirrors the idea of torch/distributed/optim/zero_redundancy_optimizer.py (``ZeroRedundancyOptimizer``)
and DeepSpeed's stage 1, with the flat-buffer layout of stage 2/3 (simpler to read than torch's
per-parameter partitioning):

AdamW keeps two fp32 moments per parameter: 8 bytes per element on top of the 4-byte weight and
4-byte gradient. With N ranks each holding a full replica, those 8 bytes are stored N times. ZeRO-1
concatenates all parameters into one flat vector of P elements, pads it to N * S with
S = ceil(P / N), and gives rank r the range [r*S, min((r+1)*S, P)). Each step:

1. reduce-scatter the flat gradient (N*S,) -> each rank gets the *summed* gradient of its shard (S,),
   divided by N: the mean over ranks (the same bytes a ring all-reduce spends on its first half);
2. step AdamW on the shard only (state: 2 * S * 4 bytes instead of 2 * P * 4);
3. all-gather the updated shards (S,) -> (N*S,) and copy them back into every parameter (the
   all-reduce's second half).

Communication equals one all-reduce, so ZeRO-1 costs no more bandwidth than DDP, and the optimizer
state per rank drops to ~1/N. AdamW is elementwise, so the result equals ``torch.optim.AdamW`` on
the full parameters exactly (up to rounding in the gradient sum).
"""
from __future__ import annotations

import math

import torch

from ._common import all_gather_flat, group_rank_and_size, reduce_scatter_flat


def shard_bounds(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """[start, end) of ``rank``'s shard of a flat vector of ``numel`` elements: ceil-sized shards,
    the last ones shorter (or empty) so nothing is dropped and nothing is counted twice."""
    for name, v in (("numel", numel), ("world_size", world_size), ("rank", rank)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if numel < 0:
        raise ValueError(f"numel must be >= 0, got {numel}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise IndexError(f"rank must be in [0, {world_size}), got {rank}")
    shard = math.ceil(numel / world_size)
    return min(rank * shard, numel), min((rank + 1) * shard, numel)


class ZeroRedundancyAdamW:
    """AdamW whose state is sharded over the ranks of ``group``. Same step as ``torch.optim.AdamW``.

    Gradients are averaged over ranks inside :meth:`step` (a parameter whose ``.grad`` is None counts
    as a zero gradient, unlike torch's AdamW which would skip it).
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, group=None):
        if isinstance(params, torch.Tensor):
            raise TypeError("params must be an iterable of tensors, got a single tensor (wrap it in a list)")
        self.params = list(params)
        if not self.params:
            raise ValueError("params must not be empty")
        for i, p in enumerate(self.params):
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"params[{i}] must be a torch.Tensor, got {type(p).__name__}")
            if not p.is_floating_point():
                raise TypeError(f"params[{i}] must be floating point, got {p.dtype}")
            if p.dtype != self.params[0].dtype or p.device != self.params[0].device:
                raise TypeError(f"params[{i}] is {p.dtype} on {p.device} but params[0] is "
                                f"{self.params[0].dtype} on {self.params[0].device}: one flat buffer "
                                f"needs one of each")
        self.group = group
        self.rank, self.world_size = group_rank_and_size(group, "ZeroRedundancyAdamW")
        self.numel = sum(p.numel() for p in self.params)  # P
        self.shard_size = math.ceil(self.numel / self.world_size)  # S; N * S >= P (padding at the end)
        self.start, self.end = shard_bounds(self.numel, self.world_size, self.rank)
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1) for p in self.params])  # (P,)
            # The only copy of the weights this rank's optimizer updates: (end - start,) elements.
            self.shard = torch.nn.Parameter(flat[self.start: self.end].clone())
        # AdamW's hyper-parameters are validated by torch itself.
        self.optimizer = torch.optim.AdamW([self.shard], lr=lr, betas=betas, eps=eps,
                                           weight_decay=weight_decay)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def _flat_padded(self, tensors) -> torch.Tensor:
        """(N*S,) buffer: the tensors concatenated in parameter order, zeros where missing or padding."""
        p0 = self.params[0]
        buf = torch.zeros(self.world_size * self.shard_size, dtype=p0.dtype, device=p0.device)
        offset = 0
        for p, t in zip(self.params, tensors, strict=True):
            if t is not None:
                buf[offset: offset + p.numel()].copy_(t.reshape(-1))
            offset += p.numel()
        return buf

    @torch.no_grad()
    def step(self) -> None:
        n, s = self.world_size, self.shard_size
        # 1. reduce-scatter: (N*S,) local grads -> (S,) summed grads of my shard; / N -> the mean.
        flat_grad = self._flat_padded([p.grad for p in self.params])
        flat_grad.div_(n)
        grad_shard = torch.empty(s, dtype=flat_grad.dtype, device=flat_grad.device)
        reduce_scatter_flat(grad_shard, flat_grad, group=self.group)
        self.shard.grad = grad_shard[: self.end - self.start].clone()
        # 2. AdamW on my shard only: exp_avg and exp_avg_sq are (end - start,) each.
        self.optimizer.step()
        # 3. all-gather the updated shards (S,) -> (N*S,), then unflatten into the parameters.
        padded = torch.zeros(s, dtype=self.shard.dtype, device=self.shard.device)
        padded[: self.end - self.start].copy_(self.shard)
        flat = torch.empty(n * s, dtype=padded.dtype, device=padded.device)
        all_gather_flat(flat, padded, group=self.group)
        offset = 0
        for p in self.params:
            p.copy_(flat[offset: offset + p.numel()].view_as(p))
            offset += p.numel()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def state_bytes(self) -> int:
        """Bytes of optimizer state held by this rank (moments and step counters)."""
        return sum(t.numel() * t.element_size() for st in self.optimizer.state.values()
                   for t in st.values() if isinstance(t, torch.Tensor))

    def state_dict(self) -> dict:
        """This rank's shard of the state (save one file per rank, or gather them yourself)."""
        return {"optimizer": self.optimizer.state_dict(), "shard": self.shard.detach().clone(),
                "start": self.start, "end": self.end, "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        saved = (state.get("world_size"), state.get("start"), state.get("end"))
        if saved != (self.world_size, self.start, self.end):
            raise ValueError(f"state was saved for shard [{saved[1]}, {saved[2]}) of world_size {saved[0]}; "
                             f"this rank owns [{self.start}, {self.end}) of world_size {self.world_size}")
        with torch.no_grad():
            self.shard.copy_(state["shard"])
        self.optimizer.load_state_dict(state["optimizer"])
