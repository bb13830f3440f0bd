"""Shared by the chapter's modules: is there a process group, who am I in it, which tensors a forward returned."""
from __future__ import annotations

import torch
import torch.distributed as dist


def group_rank_and_size(group, who: str) -> tuple[int, int]:
    """(rank in ``group``, size of ``group``); raises naming ``who`` when there is no process group."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{who} needs an initialised process group: call dist.init_process_group "
                           f"first (torchrun or ptinternals.distributed.run_ranks does it for you)")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed ProcessGroup or None, got {type(group).__name__}")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"{who}: this process (global rank {dist.get_rank()}) is not a member of group")
    return rank, dist.get_world_size(group)


def global_rank(group, group_rank: int) -> int:
    """The global rank of ``group_rank`` in ``group`` (P2P ops and broadcast ``src`` take global ranks)."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def tensors_in(obj) -> list[torch.Tensor]:
    """The tensors in a forward's output (nested lists, tuples and dicts), in order: where DDP and FSDP
    hook into the autograd graph (torch's ``_find_tensors`` in ``nn/parallel/distributed.py``)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in tensors_in(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in tensors_in(o)]
    return []


# torch 2.13 renamed the flat-buffer collectives (all_gather_into_tensor -> all_gather_single,
# reduce_scatter_tensor -> reduce_scatter_single) and deprecates the old names; torch 2.11 has only
# the old ones. The helpers live in the scaffold, which the exercises use too.
from .scaffold import all_gather_flat, reduce_scatter_flat  # noqa: E402,F401
