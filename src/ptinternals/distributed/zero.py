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
the full parameters (up to rounding in the gradient sum), provided two things torch's AdamW does per
*parameter* survive the flattening: each parameter has its own step count (bias correction), and a
parameter whose ``.grad`` is None is skipped, weight decay included (a frozen parameter,
``requires_grad=False``, or one the forward did not use must not move). So the shard is kept as
*pieces*, one per parameter that overlaps the rank's range, each a view of the shard, and a torch
``AdamW`` over the pieces does both; an all-reduce of one flag per parameter tells every rank which
parameters got a gradient on some rank (DDP's ``local_used_map`` does the same).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

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
    """AdamW whose state is sharded over the ranks of ``group``. Same steps as ``torch.optim.AdamW``.

    Each rank owns the range [start, end) of the flat parameter vector and keeps AdamW's state for it
    only, per *piece*: the part of one parameter that falls in its range (a parameter may be split
    between ranks). A torch ``AdamW`` over those pieces keeps per-parameter state (moments and step
    count) exactly as ``torch.optim.AdamW`` over the whole parameters does, and skips a piece whose
    ``.grad`` is None, so a parameter that got no gradient on ANY rank (frozen, ``requires_grad=False``,
    or unused in the forward) is left alone: no step, no decoupled weight decay. Which parameters got a
    gradient somewhere is one small all-reduce (DDP's ``local_used_map`` does the same job); a
    parameter with a gradient on some ranks only counts the missing ones as zero, as averaging the
    full-batch loss over ranks does.
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
            for j in range(i):
                if self.params[j] is p:
                    raise ValueError(f"params[{i}] is the same tensor as params[{j}] (a tied parameter listed "
                                     f"twice): pass each parameter once, as model.parameters() does")
        self.group = group
        self.rank, self.world_size = group_rank_and_size(group, "ZeroRedundancyAdamW")
        self.offsets = [0]  # offsets[i]: where params[i] starts in the flat vector of P elements
        for p in self.params:
            self.offsets.append(self.offsets[-1] + p.numel())
        self.numel = self.offsets[-1]  # P
        self.shard_size = math.ceil(self.numel / self.world_size)  # S; N * S >= P (padding at the end)
        self.start, self.end = shard_bounds(self.numel, self.world_size, self.rank)
        p0 = self.params[0]
        # The weights of my range, (end - start,): the only copy this rank's optimizer updates.
        self.shard = torch.zeros(self.end - self.start, dtype=p0.dtype, device=p0.device)
        # pieces[k] = (parameter index, its slice [a, b) in the flat vector, the piece: a view of shard).
        self.pieces: list[tuple[int, int, int, torch.nn.Parameter]] = []
        for i in range(len(self.params)):
            a, b = max(self.offsets[i], self.start), min(self.offsets[i + 1], self.end)
            if a < b:
                self.pieces.append((i, a, b, torch.nn.Parameter(self.shard[a - self.start: b - self.start])))
        # AdamW's hyper-parameters are validated by torch itself; one state per piece, as per parameter.
        self.optimizer = torch.optim.AdamW([piece for *_, piece in self.pieces] or [torch.nn.Parameter(
            torch.zeros(0, dtype=p0.dtype, device=p0.device))], lr=lr, betas=betas, eps=eps,
            weight_decay=weight_decay)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @torch.no_grad()
    def step(self) -> None:
        n, s = self.world_size, self.shard_size
        p0 = self.params[0]
        # 0. which parameters have a gradient on some rank (a frozen or unused one has none anywhere)
        used = torch.tensor([p.grad is not None for p in self.params], dtype=torch.int32, device=p0.device)
        dist.all_reduce(used, group=self.group)
        # 1. reduce-scatter: (N*S,) local grads (zeros where None) -> (S,) summed grads of my range; / N.
        flat_grad = torch.zeros(n * s, dtype=p0.dtype, device=p0.device)
        for i, p in enumerate(self.params):
            if p.grad is not None:
                flat_grad[self.offsets[i]: self.offsets[i + 1]].copy_(p.grad.reshape(-1))
        flat_grad.div_(n)
        grad_shard = torch.empty(s, dtype=p0.dtype, device=p0.device)
        reduce_scatter_flat(grad_shard, flat_grad, group=self.group)
        # 2. AdamW on my pieces, from the parameters' current values (the parameters are the truth: every
        #    rank holds the same ones); a piece of a parameter with no gradient anywhere is skipped.
        for i, a, b, piece in self.pieces:
            piece.copy_(self.params[i].detach().reshape(-1)[a - self.offsets[i]: b - self.offsets[i]])
            piece.grad = grad_shard[a - self.start: b - self.start].clone() if used[i] else None
        self.optimizer.step()
        for *_, piece in self.pieces:
            piece.grad = None
        # 3. all-gather the updated ranges (S,) -> (N*S,), then copy back the parameters that stepped.
        padded = torch.zeros(s, dtype=p0.dtype, device=p0.device)
        padded[: self.end - self.start].copy_(self.shard)
        flat = torch.empty(n * s, dtype=p0.dtype, device=p0.device)
        all_gather_flat(flat, padded, group=self.group)
        for i, p in enumerate(self.params):
            if used[i]:
                p.copy_(flat[self.offsets[i]: self.offsets[i + 1]].view_as(p))

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
