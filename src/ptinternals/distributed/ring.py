"""Ring all-reduce built from point-to-point sends and receives.

This is the algorithm behind NCCL's ring all-reduce and gloo's ``AllreduceRing``
(third_party/gloo/gloo/allreduce_ring_chunked.h; NCCL src/device/all_reduce.h ``runRing``), written
with ``torch.distributed.batch_isend_irecv`` so each step is visible.

N ranks stand in a ring: rank r sends to r+1 and receives from r-1 (mod N). The flat tensor is cut
into N chunks (sizes differ by at most one element, like ``torch.tensor_split``).

- reduce-scatter, N-1 steps: at step s rank r sends chunk (r - s) mod N and adds the chunk it
  receives, (r - s - 1) mod N, into its own copy. After N-1 steps rank r holds the full sum of
  chunk (r + 1) mod N.
- all-gather, N-1 steps: at step s rank r sends chunk (r + 1 - s) mod N (a finished sum) and
  overwrites chunk (r - s) mod N with what it receives.

Cost model: each rank sends 2(N-1) chunks of L/N elements, i.e. 2(N-1)/N * L elements. That is
(almost) independent of N, which is why the ring is bandwidth-optimal; its latency grows with
2(N-1) steps, which is why NCCL switches to trees for small messages.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ._common import global_rank, group_rank_and_size

_OPS = {"sum": "sum", "avg": "avg"}


def _check_world_size(world_size) -> None:
    if not isinstance(world_size, int) or isinstance(world_size, bool):
        raise TypeError(f"world_size must be an int, got {type(world_size).__name__}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")


def chunk_bounds(length: int, world_size: int) -> list[tuple[int, int]]:
    """[start, end) of each of the ``world_size`` chunks of a flat tensor of ``length`` elements.

    The first ``length % world_size`` chunks get one extra element (the split ``torch.tensor_split``
    makes), so nothing is dropped when ``length`` is not divisible, and chunks may be empty when
    ``length < world_size``.
    """
    if not isinstance(length, int) or isinstance(length, bool):
        raise TypeError(f"length must be an int, got {type(length).__name__}")
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    _check_world_size(world_size)
    base, extra = divmod(length, world_size)
    bounds, start = [], 0
    for c in range(world_size):
        end = start + base + (1 if c < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def ring_schedule(world_size: int) -> list[dict]:
    """The 2(N-1) steps of a ring all-reduce, as plain data.

    Each step is ``{"phase": "reduce-scatter" | "all-gather", "step": s, "send": [chunk sent by rank
    r], "recv": [chunk received by rank r]}``. Rank r always sends to (r+1) % N and receives from
    (r-1) % N, so ``recv[r] == send[(r - 1) % N]`` at every step.
    """
    _check_world_size(world_size)
    n, steps = world_size, []
    for s in range(n - 1):
        steps.append({"phase": "reduce-scatter", "step": s,
                      "send": [(r - s) % n for r in range(n)],
                      "recv": [(r - s - 1) % n for r in range(n)]})
    for s in range(n - 1):
        steps.append({"phase": "all-gather", "step": s,
                      "send": [(r + 1 - s) % n for r in range(n)],
                      "recv": [(r - s) % n for r in range(n)]})
    return steps


def ring_contributions(world_size: int) -> list[list[list[frozenset[int]]]]:
    """Symbolic run of the schedule: ``states[k][r][c]`` is the set of ranks whose chunk c is summed
    into rank r's copy of chunk c after k steps (k = 0 .. 2(N-1)). At the end every entry is all ranks."""
    _check_world_size(world_size)
    n = world_size
    state = [[frozenset([r]) for _ in range(n)] for r in range(n)]
    states = [state]
    for step in ring_schedule(n):
        new = [list(row) for row in state]
        for r in range(n):
            left, c = (r - 1) % n, step["recv"][r]
            sent = state[left][step["send"][left]]  # what the left neighbour sent, chunk c
            new[r][c] = state[r][c] | sent if step["phase"] == "reduce-scatter" else sent
        state = new
        states.append(state)
    return states


def ring_bytes_sent_per_rank(length: int, element_size: int, world_size: int) -> list[int]:
    """Bytes each rank sends in one ring all-reduce of ``length`` elements (exact, per rank).

    With L divisible by N every entry equals 2 (N-1)/N * L * element_size.
    """
    if not isinstance(element_size, int) or element_size < 1:
        raise ValueError(f"element_size must be an int >= 1, got {element_size!r}")
    bounds = chunk_bounds(length, world_size)
    sent = [0] * world_size
    for step in ring_schedule(world_size):
        for r, c in enumerate(step["send"]):
            sent[r] += (bounds[c][1] - bounds[c][0]) * element_size
    return sent


def _parse_op(op) -> str:
    if isinstance(op, str) and op.lower() in _OPS:
        return op.lower()
    if op == dist.ReduceOp.SUM:
        return "sum"
    if op == dist.ReduceOp.AVG:
        return "avg"
    raise ValueError(f"op must be 'sum' or 'avg' (or dist.ReduceOp.SUM/AVG), got {op!r}")


def ring_all_reduce(tensor: torch.Tensor, group=None, op="sum") -> None:
    """All-reduce ``tensor`` in place over ``group`` with a ring of send/recv; same result as
    ``dist.all_reduce`` (sum, or avg = sum / N). Works for any length, including 0, lengths not
    divisible by the world size, and non-contiguous tensors."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    op = _parse_op(op)
    if tensor.dtype == torch.bool:
        raise TypeError("tensor must not be bool: a sum of bools is not a bool")
    if op == "avg" and not (tensor.is_floating_point() or tensor.is_complex()):
        raise TypeError(f"op='avg' needs a floating-point tensor, got {tensor.dtype}")
    if tensor.requires_grad and torch.is_grad_enabled() and tensor.is_leaf:
        raise ValueError("tensor must not be a leaf that requires grad (in-place op); pass tensor.detach()")
    rank, n = group_rank_and_size(group, "ring_all_reduce")
    if tensor.numel() == 0:
        return

    # Work on one contiguous flat buffer (L elements); copy back at the end if tensor is strided.
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    bounds = chunk_bounds(flat.numel(), n)
    right, left = global_rank(group, (rank + 1) % n), global_rank(group, (rank - 1) % n)
    max_chunk = max(e - s for s, e in bounds)
    inbox = torch.empty(max_chunk, dtype=flat.dtype, device=flat.device)  # (ceil(L/N),) receive buffer

    def exchange(send_chunk: int, recv_into: torch.Tensor) -> None:
        s0, e0 = bounds[send_chunk]
        ops = []
        if e0 > s0:  # empty chunks (L < N) are skipped by both ends: the receiver's chunk is the same one
            ops.append(dist.P2POp(dist.isend, flat[s0:e0], right, group))
        if recv_into.numel() > 0:
            ops.append(dist.P2POp(dist.irecv, recv_into, left, group))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()

    for step in ring_schedule(n):
        send_c, recv_c = step["send"][rank], step["recv"][rank]
        s1, e1 = bounds[recv_c]
        if step["phase"] == "reduce-scatter":
            chunk_in = inbox[: e1 - s1]
            exchange(send_c, chunk_in)
            flat[s1:e1] += chunk_in  # partial sum grows by one rank's contribution
            if op == "avg" and step["step"] == n - 2:
                flat[s1:e1] /= n  # this chunk is now the full sum: divide once, before sharing it
        else:
            exchange(send_c, flat[s1:e1])  # a finished chunk overwrites ours
    if not tensor.is_contiguous():
        tensor.copy_(flat.view(tensor.shape))
