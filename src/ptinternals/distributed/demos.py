"""What the distributed chapter's notebook runs inside real ranks (``run_ranks(tour, 3)``), and a hang to look at.

Starting ranks costs seconds (each imports torch), so the notebook starts them once and
:func:`tour` runs every demonstration of the chapter in that one launch, returning plain data the
notebook prints and draws: what each collective leaves on each rank, the ring's traffic, a DDP
timeline, torch's own DDP buckets, ZeRO-1's optimizer bytes, FSDP's live-parameter curve and torch's own
FSDP2. Everything
here uses the reference implementation or torch itself, never a student's answer.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from .ddp import DistributedDataParallel
from .fsdp2 import FullyShardedSequential
from .ring import ring_all_reduce, ring_bytes_sent_per_rank
from .scaffold import all_gather_flat, reduce_scatter_flat
from .zero import ZeroRedundancyAdamW


def _mlp(widths, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def collectives(rank: int, n: int) -> dict:
    """Each collective on tiny tensors: rank r starts with [10 r + 1, 10 r + 2, ...]."""
    def mine(k=2):
        return torch.arange(1, k + 1, dtype=torch.float32) + 10 * rank

    out = {"input": mine().tolist()}
    t = mine()
    dist.all_reduce(t)  # SUM: every rank gets the elementwise sum
    out["all_reduce"] = t.tolist()
    t = mine()
    dist.broadcast(t, src=0)  # every rank gets rank 0's tensor
    out["broadcast"] = t.tolist()
    gathered = torch.empty(2 * n)
    all_gather_flat(gathered, mine())  # (2,) each -> (2N,), rank r's at [2r, 2r + 2)
    out["all_gather"] = gathered.tolist()
    shard = torch.empty(2)
    reduce_scatter_flat(shard, mine(2 * n))  # (2N,) each -> (2,): rank r gets the sum of slice r
    out["reduce_scatter"] = shard.tolist()
    right, left = (rank + 1) % n, (rank - 1) % n
    inbox = torch.empty(2)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine(), right), dist.P2POp(dist.irecv, inbox, left)])
    for w in works:
        w.wait()
    out["recv_from_left"] = inbox.tolist()
    return out


def ring(rank: int, n: int) -> dict:
    x = torch.randn(1_000_003, generator=torch.Generator().manual_seed(rank))
    expected = x.clone()
    t0 = time.perf_counter()
    dist.all_reduce(expected)
    t_torch = time.perf_counter() - t0
    t0 = time.perf_counter()
    ring_all_reduce(x)
    t_ring = time.perf_counter() - t0
    return {"max_error": (x - expected).abs().max().item(), "ms_ring": 1e3 * t_ring, "ms_gloo": 1e3 * t_torch,
            "bytes_sent": ring_bytes_sent_per_rank(x.numel(), 4, n)[rank], "bytes": x.numel() * 4}


def ddp_timeline(rank: int, n: int) -> dict:
    """Bucketed DDP on an MLP big enough for backward to take a few ms: when do buckets go out?"""
    model = _mlp((256,) * 7)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.5, first_bucket_cap_mb=0.25)
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(rank))
    for _ in range(3):  # the last iteration is the warm one we show
        model.zero_grad()
        ddp(x).square().mean().backward()
    return {"timeline": list(ddp.timeline), "buckets": ddp.bucket_names(),
            "bucket_bytes": [b.buffer.numel() * 4 for b in ddp.buckets]}


def torch_ddp_buckets(rank: int, n: int) -> dict:
    """torch's own DDP: its buckets (indices of ``list(model.parameters())``, in launch order) at construction
    and after the first backward, when the Reducer has rebuilt them in the order the gradients arrived."""
    model = _mlp((128,) * 7)  # 6 layers of 64.5 KiB: two per bucket with a 0.1 MiB cap
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.1)
    params = list(model.parameters())
    index = {p.data_ptr(): i for i, p in enumerate(params)}

    def buckets():
        return [[index[t.data_ptr()] for t in b.parameters()] for b in ddp.reducer._get_zeros_like_grad_buckets()]

    out = {"at construction": buckets()}
    x = torch.randn(4, 128, generator=torch.Generator().manual_seed(rank))
    ddp(x).square().mean().backward()
    ddp(x)  # the next forward rebuilds
    out["after the first backward"] = buckets()
    return out


def zero(rank: int, n: int) -> dict:
    model = _mlp((64, 128, 128, 10))
    opt = ZeroRedundancyAdamW(model.parameters(), lr=1e-3)
    model(torch.randn(8, 64)).square().mean().backward()
    opt.step()
    full = torch.optim.AdamW(_mlp((64, 128, 128, 10)).parameters(), lr=1e-3)
    ref = _mlp((64, 128, 128, 10))
    full = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    ref(torch.randn(8, 64)).square().mean().backward()
    full.step()
    full_bytes = sum(t.numel() * t.element_size() for s in full.state.values() for t in s.values())
    return {"numel": opt.numel, "shard": (opt.start, opt.end), "state_bytes": opt.state_bytes(),
            "full_state_bytes": full_bytes}


def fsdp(rank: int, n: int) -> dict:
    """The reference FSDP2 (fsdp2.py) on a 6-layer MLP: live unsharded bytes over one step, resharding after
    forward or not."""
    out = {}
    for reshard in (True, False):
        model = _mlp((32,) * 7)
        unsharded = sum(p.numel() * p.element_size() for p in model.parameters())
        wrapped = FullyShardedSequential(model, reshard_after_forward=reshard)
        wrapped(torch.randn(4, 32)).square().mean().backward()
        key = "" if reshard else "_no_reshard"
        out["events" + key] = list(wrapped.memory.events)
        out["peak" + key] = wrapped.memory.peak
        out["unsharded_bytes"] = unsharded
        out["shard_elements"] = sum(p.numel() for p in model.parameters())
    return out


def fsdp2(rank: int, n: int) -> dict:
    """torch's FSDP2: every parameter becomes a DTensor sharded on dim 0 over a device mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (n,))
    model = _mlp((10, 16, 16, 3))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    w = model[0].weight
    out = model(torch.randn(4, 10))
    out.float().square().mean().backward()
    return {"type": type(w).__name__, "placements": str(w.placements), "global_shape": tuple(w.shape),
            "local_shape": tuple(w.to_local().shape), "out_dtype": str(out.dtype),
            "grad_dtype": str(w.grad.dtype), "grad_type": type(w.grad).__name__}


def tour(rank: int, world_size: int) -> dict:
    """Every demonstration of the chapter, in one launch of ``world_size`` ranks."""
    out = {}
    for name, fn in (("collectives", collectives), ("ring", ring), ("ddp", ddp_timeline),
                     ("torch_buckets", torch_ddp_buckets), ("zero", zero), ("fsdp", fsdp), ("fsdp2", fsdp2)):
        t0 = time.perf_counter()
        out[name] = fn(rank, world_size)
        out[name]["seconds"] = time.perf_counter() - t0
    return out


def mismatched(rank: int, world_size: int) -> None:
    """A hang on purpose: rank 0 all-reduces, every other rank broadcasts. Neither call can finish."""
    t = torch.ones(4)
    dist.all_reduce(t)  # everybody: fine
    if rank == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)
