"""Rank-side checks for the distributed chapter, run inside ``run_ranks`` (no pytest here).

Spawning ranks costs seconds, so one spawn runs many checks: each ``suite_*`` function runs a list
of sub-checks and returns plain data (errors, byte counts, timelines); the assertions live in
test_distributed_ranks.py so failures show up as ordinary pytest failures. Every rank runs the same
collectives in the same order; a sub-check never raises on one rank only (that would desynchronise
the ranks): errors are caught and returned.

Random cases use hypothesis *driven by rank 0*: rank 0 draws an example and broadcasts it, every rank
runs it, and the worst error is all-reduced back to rank 0's assertion (so shrinking works too).
"""
from __future__ import annotations

import gc
import math
import os
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
from torch import nn

from ptinternals.distributed import (
    DistributedDataParallel,
    FullyShardedDataParallel,
    FullyShardedSequential,
    NaiveDDP,
    ZeroRedundancyAdamW,
    fully_shard,
    ring_all_reduce,
)

G = None  # the process group the current check runs on (None: the default group); set by run_suite
DEV = torch.device("cpu")  # where tensors go: cuda:LOCAL_RANK under nccl; set by run_suite

DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64,
          "bfloat16": torch.bfloat16}


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def mlp(seed: int = 0, widths=(5, 7, 6, 3)) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1]).to(DEV)


def batch(n: int, d_in: int, d_out: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d_in, generator=g).to(DEV), torch.randn(n, d_out, generator=g).to(DEV)


def max_diff(a, b) -> float:
    """Largest |a_i - b_i| over two equally long sequences of tensors (inf if lengths differ)."""
    a, b = list(a), list(b)
    if len(a) != len(b) or not a or any(x.shape != y.shape for x, y in zip(a, b, strict=True)):
        return math.inf
    return max((x.detach().float() - y.detach().float()).abs().max().item() if x.numel() else 0.0
               for x, y in zip(a, b, strict=True))


def guarded(fn, *args):
    """Run a sub-check; an exception becomes {'error': traceback} instead of killing the rank."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001
        return {"error": traceback.format_exc()}


def leader_driven_hypothesis(strategy, body, max_examples: int, tol: float):
    """Rank 0 runs a hypothesis test; each example is broadcast and run on every rank.

    ``body(case) -> float`` returns this rank's error; the max over ranks must be <= tol.
    Returns None on success or the failure message (same value on every rank).
    """
    def run_case(case) -> float:
        try:
            err = float(body(case))
        except Exception:  # noqa: BLE001 - a crash on one rank must not desynchronise the others
            err = math.inf
        t = torch.tensor([err], dtype=torch.float64, device=DEV)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=G)
        return t.item()

    leader = dist.get_global_rank(G, 0) if G is not None else 0
    if dist.get_rank(G) == 0:
        from hypothesis import HealthCheck, given, settings

        @settings(max_examples=max_examples, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(strategy)
        def check(case):
            box = [case]
            dist.broadcast_object_list(box, src=leader, group=G)
            err = run_case(case)
            assert err <= tol, f"case {case}: max error over ranks {err} > {tol}"

        try:
            check()
            msg = None
        except AssertionError as exc:
            msg = str(exc)
        box = [("done", msg)]
        dist.broadcast_object_list(box, src=leader, group=G)
        return msg
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=leader, group=G)
        if isinstance(box[0], tuple) and box[0][0] == "done":
            return box[0][1]
        run_case(box[0])


# ------------------------------------------------------------------------------------------------
# ring all-reduce
# ------------------------------------------------------------------------------------------------
def _ring_case(case) -> float:
    rank, n = dist.get_rank(G), dist.get_world_size(G)
    dtype = DTYPES[case["dtype"]]
    g = torch.Generator().manual_seed(case["seed"] * 101 + rank)
    if case["integer_valued"] or not dtype.is_floating_point:  # sums of small ints are exact in any dtype
        base = torch.randint(-8, 9, (case["length"], 2), generator=g).to(DEV, dtype)
    else:
        base = torch.randn(case["length"], 2, generator=g, dtype=torch.float64).to(DEV, dtype)
    # non-contiguous: every other element of a (L, 2) buffer; the other column must stay untouched
    x = base[:, 0] if case["noncontig"] else base[:, 0].contiguous()
    expected = x.clone()
    dist.all_reduce(expected, group=G)  # SUM
    if case["op"] == "avg":
        expected = expected / n
    untouched = base[:, 1].clone()
    ring_all_reduce(x, group=G, op=case["op"])
    if x.shape != expected.shape or x.dtype != expected.dtype:
        return math.inf
    err = (x.double() - expected.double()).abs()
    if not case["integer_valued"] and dtype.is_floating_point:
        # relative error over the rounding one reduction of n values may add in this dtype
        rtol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 3e-2}[dtype]
        err = err / (1.0 + expected.double().abs()) / rtol
    bad_other = not torch.equal(base[:, 1], untouched)
    return math.inf if bad_other else (err.max().item() if err.numel() else 0.0)


def ring_strategy():
    from hypothesis import strategies as st

    return st.fixed_dictionaries({
        "length": st.one_of(st.integers(0, 9), st.integers(10, 3000)),
        "dtype": st.sampled_from(sorted(DTYPES)),
        "op": st.sampled_from(["sum", "avg"]),
        "noncontig": st.booleans(),
        "integer_valued": st.booleans(),
        "seed": st.integers(0, 10_000),
    }).filter(lambda c: not (c["op"] == "avg" and c["dtype"] == "int64"))


def check_ring() -> dict:
    n = dist.get_world_size(G)
    max_examples = 40 if n == 2 else 20
    edge_lengths = sorted({0, 1, n - 1, n, n + 1, 2 * n - 1, 7, 1000, 1023})
    edge_errors = {}
    for length in edge_lengths:
        for op in ("sum", "avg"):
            case = {"length": length, "dtype": "float32", "op": op, "noncontig": length % 2 == 1,
                    "integer_valued": True, "seed": length}
            edge_errors[f"{length}/{op}"] = _ring_case(case)
    failure = leader_driven_hypothesis(ring_strategy(), _ring_case, max_examples, tol=1.0)
    return {"edge_errors": edge_errors, "hypothesis_failure": failure}


# ------------------------------------------------------------------------------------------------
# DDP
# ------------------------------------------------------------------------------------------------
def _reference_grads(model, x, y):
    nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def check_ddp() -> dict:
    rank, n = dist.get_rank(G), dist.get_world_size(G)
    x, y = batch(4 * n, 5, 3)
    xs, ys = x.chunk(n)[rank], y.chunk(n)[rank]  # equal shards: mean of means = full-batch mean
    ref = _reference_grads(mlp(0), x, y)
    out = {}
    # broadcast at construction: rank r builds a model with seed r, all end up with rank 0's weights
    naive = NaiveDDP(mlp(seed=rank), group=G)
    out["naive_broadcast_diff"] = max_diff(naive.module.parameters(), mlp(0).parameters())
    nn.functional.mse_loss(naive(xs), ys).backward()
    out["naive_grad_diff"] = max_diff([p.grad for p in naive.module.parameters()], ref)

    for label, cap, first in (("default", 25.0, 1.0), ("tiny", 0.0001, 0.00005)):
        model = mlp(seed=rank + 10)
        ddp = DistributedDataParallel(model, group=G, bucket_cap_mb=cap, first_bucket_cap_mb=first)
        out[f"{label}_broadcast_diff"] = max_diff(model.parameters(), mlp(10).parameters())
        ref_model = mlp(10)
        ref_g = _reference_grads(ref_model, x, y)
        for _ in range(2):  # twice: state must reset between iterations
            model.zero_grad()
            nn.functional.mse_loss(ddp(xs), ys).backward()
        out[f"{label}_grad_diff"] = max_diff([p.grad for p in model.parameters()], ref_g)
        out[f"{label}_buckets"] = ddp.bucket_names()
        out[f"{label}_timeline"] = list(ddp.timeline)
    return out


def check_no_sync() -> dict:
    rank, n = dist.get_rank(G), dist.get_world_size(G)
    micro = [batch(2 * n, 5, 3, seed=s) for s in (3, 4, 5)]
    ref_model = mlp(0)
    for x, y in micro:  # accumulate 3 micro-batches of full-batch loss
        nn.functional.mse_loss(ref_model(x), y).backward()
    model = mlp(0)
    ddp = DistributedDataParallel(model, group=G, bucket_cap_mb=0.0001, first_bucket_cap_mb=0.00005)
    launches_before = sum(e == "bucket_launch" for e, _, _ in ddp.timeline)
    with ddp.no_sync():
        for x, y in micro[:2]:
            nn.functional.mse_loss(ddp(x.chunk(n)[rank]), y.chunk(n)[rank]).backward()
    launches_in_no_sync = sum(e == "bucket_launch" for e, _, _ in ddp.timeline) - launches_before
    local = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(local) for _ in range(n)]
    dist.all_gather(gathered, local, group=G)
    ranks_differ = any(not torch.allclose(gathered[0], g) for g in gathered[1:])
    x, y = micro[2]
    nn.functional.mse_loss(ddp(x.chunk(n)[rank]), y.chunk(n)[rank]).backward()  # synced: sums of 3
    grad_diff = max_diff([p.grad for p in model.parameters()], [p.grad for p in ref_model.parameters()])
    return {"grad_diff": grad_diff,
            "launches_in_no_sync": launches_in_no_sync, "local_grads_differ_across_ranks": ranks_differ}


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.trunk, self.head_a = nn.Linear(5, 6), nn.Linear(6, 3)
        self.head_b, self.never = nn.Linear(6, 3), nn.Linear(6, 3)
        self.to(DEV)

    def forward(self, x, use_b: bool):
        h = torch.tanh(self.trunk(x))
        return self.head_a(h) + (self.head_b(h) if use_b else 0)


def check_find_unused() -> dict:
    rank, n = dist.get_rank(G), dist.get_world_size(G)
    x, y = batch(2 * n, 5, 3, seed=7)
    xs, ys = x.chunk(n), y.chunk(n)
    ref = Branchy()  # rank r uses head_b only when r == 0; "never" is unused everywhere
    sum(nn.functional.mse_loss(ref(xs[r], use_b=(r == 0)), ys[r]) for r in range(n)).div(n).backward()
    model = Branchy()
    ddp = DistributedDataParallel(model, group=G, find_unused_parameters=True, bucket_cap_mb=0.0001,
                                  first_bucket_cap_mb=0.00005)
    nn.functional.mse_loss(ddp(xs[rank], use_b=(rank == 0)), ys[rank]).backward()
    diffs = {name: (max_diff([p.grad], [q.grad]) if q.grad is not None and p.grad is not None else
                    (0.0 if p.grad is None and q.grad is None else math.inf))
             for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True)}
    never_none = model.never.weight.grad is None and model.never.bias.grad is None
    # Without the flag, a parameter unused on every rank: every rank raises the same clear error.
    plain = DistributedDataParallel(Branchy(), group=G, bucket_cap_mb=0.0001, first_bucket_cap_mb=0.00005)
    try:
        nn.functional.mse_loss(plain(xs[rank], use_b=True), ys[rank]).backward()
        error = None
    except RuntimeError as exc:
        error = str(exc)
    return {"grad_diffs": diffs, "never_grad_is_none": never_none, "error_without_flag": error}


# ------------------------------------------------------------------------------------------------
# ZeRO-1 and FSDP
# ------------------------------------------------------------------------------------------------
class FrozenTied(nn.Module):
    """A frozen bias, a weight tied between two layers, a layer never used (grad None everywhere) and a
    branch only rank 0's batch uses (grad None on the other ranks)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = nn.Linear(5, 6), nn.Linear(6, 6), nn.Linear(6, 6)
        self.c.weight = self.b.weight
        self.a.bias.requires_grad_(False)
        self.unused, self.head, self.branch = nn.Linear(6, 2), nn.Linear(6, 3), nn.Linear(6, 3)
        self.to(DEV)

    def forward(self, x, use_branch: bool):
        h = torch.tanh(self.c(torch.tanh(self.b(torch.tanh(self.a(x))))))
        return self.head(h) + (self.branch(h) if use_branch else 0)


def check_zero(steps: int = 3) -> dict:
    rank, n = dist.get_rank(G), dist.get_world_size(G)
    x, y = batch(4 * n, 5, 3, seed=11)
    widths = (5, 6, 7, 3)  # 109 parameters: not divisible by 2, 3 or 4, so the last shard is short
    ref = mlp(0, widths)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.05, weight_decay=0.1)
    model = mlp(0, widths)
    opt = ZeroRedundancyAdamW(model.parameters(), lr=0.05, weight_decay=0.1, group=G)
    for _ in range(steps):
        ref_opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
        opt.zero_grad()
        nn.functional.mse_loss(model(x.chunk(n)[rank]), y.chunk(n)[rank]).backward()
        opt.step()
    full_state = sum(t.numel() * t.element_size() for s in ref_opt.state.values() for t in s.values())
    moment_bytes = sum(t.numel() * t.element_size() for s in opt.optimizer.state.values()
                       for k, t in s.items() if k != "step")
    param_diff = max_diff(model.parameters(), ref.parameters())
    # step for step with torch.optim.AdamW on the full batch: frozen, tied, unused and partly used parameters
    ref, model = FrozenTied(), FrozenTied()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.05, weight_decay=0.1)
    opt2 = ZeroRedundancyAdamW(model.parameters(), lr=0.05, weight_decay=0.1, group=G)
    xs, ys = x.chunk(n), y.chunk(n)
    frozen_tied_diffs = []
    for _ in range(steps):
        ref_opt.zero_grad()
        sum(nn.functional.mse_loss(ref(xs[r], r == 0), ys[r]) for r in range(n)).div(n).backward()
        ref_opt.step()
        opt2.zero_grad()
        nn.functional.mse_loss(model(xs[rank], rank == 0), ys[rank]).backward()
        opt2.step()
        frozen_tied_diffs.append(max_diff(model.parameters(), ref.parameters()))
    untouched = FrozenTied()
    return {"param_diff": param_diff, "state_bytes": opt.state_bytes(),
            "moment_bytes": moment_bytes, "full_state_bytes": full_state,
            "full_moment_bytes": sum(2 * p.numel() * p.element_size() for p in mlp(0, widths).parameters()),
            "numel": opt.numel, "shard": (opt.start, opt.end),
            "frozen_tied_diffs": frozen_tied_diffs,
            "frozen_moved": max_diff([model.a.bias, model.unused.weight, model.unused.bias],
                                     [untouched.a.bias, untouched.unused.weight, untouched.unused.bias])}


def settled_live_bytes(fsdp, timeout_s: float = 3.0) -> int:
    """Live full-parameter bytes once the backend has let go: gloo's worker thread keeps the last
    finished collective's tensors for a moment after wait() returns. Autograd keeping a buffer would
    keep it for good, so polling until zero (or the timeout) separates the two."""
    deadline = time.monotonic() + timeout_s
    while (live := fsdp.live_full_param_bytes()) and time.monotonic() < deadline:
        time.sleep(0.005)
    return live


def deep_mlp(seed=0, depth=6, width=8):
    return mlp(seed, widths=(5,) + (width,) * depth + (3,))


def check_fsdp(steps: int = 3) -> dict:
    rank, n = dist.get_rank(G), dist.get_world_size(G)
    x, y = batch(2 * n, 5, 3, seed=13)
    ref = deep_mlp()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.05)
    ref_traj = []
    for _ in range(steps):
        ref_opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
        ref_traj.append({k: v.clone() for k, v in ref.state_dict().items()})
    unsharded = sum(p.numel() * p.element_size() for p in ref.parameters())
    out = {"unsharded_bytes": unsharded}
    for prefetch in (True, False):
        model = deep_mlp()
        linears = [m for m in model if isinstance(m, nn.Linear)]
        fsdp = FullyShardedDataParallel(model, units=linears, prefetch=prefetch, group=G)
        opt = torch.optim.AdamW(fsdp.parameters(), lr=0.05)
        traj, live_between = [], []
        for _ in range(steps):
            opt.zero_grad()
            loss = nn.functional.mse_loss(fsdp(x.chunk(n)[rank]), y.chunk(n)[rank])
            live_between.append(settled_live_bytes(fsdp))  # after forward, before backward
            loss.backward()
            opt.step()
            traj.append(fsdp.full_state_dict())
        del loss
        gc.collect()  # once: tensors die by reference counting, this only proves no cycle keeps one
        key = "prefetch" if prefetch else "no_prefetch"
        out[key] = {
            "traj_diff": max(max_diff([t[k] for k in r], list(r.values()))
                             for t, r in zip(traj, ref_traj, strict=True)),
            "peak": fsdp.peak_full_param_bytes, "live_between_fwd_bwd": live_between,
            "live_after": settled_live_bytes(fsdp),
            "unit_full_bytes": [h.shard_size * n * h.shard.element_size() for h in fsdp.handles],
            "shard_bytes": sum(p.numel() * p.element_size() for p in fsdp.parameters()),
            "param_names": sorted(k for k in traj[-1]), "ref_names": sorted(ref.state_dict()),
            "memory_events": fsdp.memory_events[:40],
        }
        if prefetch:  # sharded checkpoint: save, load into a differently initialised copy, compare
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, f"rank{rank}.pt")
                torch.save(fsdp.sharded_state_dict(), path)
                other = deep_mlp(seed=5)
                units = [m for m in other if isinstance(m, nn.Linear)]
                fsdp2 = FullyShardedDataParallel(other, units=units, group=G)
                fsdp2.load_sharded_state_dict(torch.load(path, map_location=DEV))
                sd_a, sd_b = fsdp.full_state_dict(), fsdp2.full_state_dict()
                out["ckpt_roundtrip_diff"] = max_diff([sd_a[k] for k in sd_a], [sd_b[k] for k in sd_a])
    # mixed precision: all-gather and compute in bf16, shards and grads stay fp32
    model = deep_mlp()
    fsdp = FullyShardedDataParallel(model, units=[m for m in model if isinstance(m, nn.Linear)], group=G,
                                    param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    xb = x.chunk(n)[rank].to(torch.bfloat16)
    pred = fsdp(xb)
    nn.functional.mse_loss(pred.float(), y.chunk(n)[rank]).backward()
    out["mixed"] = {"out_dtype": str(pred.dtype),
                    "shard_grad_dtypes": sorted({str(p.grad.dtype) for p in fsdp.parameters()}),
                    "shard_dtypes": sorted({str(p.dtype) for p in fsdp.parameters()})}
    return out


def _mesh():
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(G if G is not None else dist.group.WORLD, DEV.type)


def _fully_shard_all(model, **kwargs):
    """torch's FSDP2 the way the chapter uses it: every child with parameters a group, then the root."""
    from torch.distributed.fsdp import fully_shard

    mesh = _mesh()
    for child in model:
        if any(True for _ in child.parameters()):
            fully_shard(child, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    return model


def check_fsdp2(steps: int = 3) -> dict:
    """torch's own FSDP2 on a CPU mesh, same training as check_fsdp's reference."""
    rank, n = dist.get_rank(G), dist.get_world_size(G)
    x, y = batch(2 * n, 5, 3, seed=13)
    ref = deep_mlp()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.05)
    model = _fully_shard_all(deep_mlp())
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    for _ in range(steps):
        ref_opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
        opt.zero_grad()
        nn.functional.mse_loss(model(x.chunk(n)[rank]), y.chunk(n)[rank]).backward()
        opt.step()
    w = model[0].weight
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    return {"param_type": type(w).__name__, "placements": str(w.placements),
            "local_shape": tuple(w.to_local().shape), "global_shape": tuple(w.shape),
            "diff": max_diff([full[k] for k in ref.state_dict()], list(ref.state_dict().values()))}


def _fsdp2_model(kind: str) -> nn.Module:
    from ptinternals.checks.probes.distributed import build_model

    arch = {"layers": [("linear", 5, 7), ("tanh",), ("pair", 7), ("tanh",), ("linear", 7, 7), ("tanh",),
                       ("linear", 7, 2)], "frozen": ("0.bias",), "unused": (4,)}
    if kind == "cross_tie":
        arch = {"layers": [("linear", 5, 6), ("tanh",), ("linear", 6, 6), ("tanh",), ("linear", 6, 2)],
                "tie": (("4.weight", "2.weight"),)}
    if kind == "noncontig":
        arch = dict(arch, noncontig=("4.weight",))
    torch.manual_seed(0)
    return build_model(arch).to(DEV)


def check_fsdp2_reference(steps: int = 3) -> dict:
    """The reference FSDP2 (fsdp2.py) against torch's fully_shard, trained side by side: the same names, the
    same local shards (values too) after every AdamW step, frozen and unused parameters without gradients,
    reshard_after_forward both ways, mixed precision; and both refuse a parameter tied between two groups."""
    from ptinternals.distributed.fsdp2 import FullyShardedSequential, MixedPrecisionPolicy

    rank, n = dist.get_rank(G), dist.get_world_size(G)
    x, y = batch(4 * n, 5, 2, seed=21)
    xs, ys = x.chunk(n)[rank], y.chunk(n)[rank]
    out = {}
    for reshard in (True, False):
        ours, theirs = _fsdp2_model("plain"), _fully_shard_all(_fsdp2_model("plain"), reshard_after_forward=reshard)
        wrapped = FullyShardedSequential(ours, group=G, reshard_after_forward=reshard)
        opts = [torch.optim.AdamW(m.parameters(), lr=0.05, weight_decay=0.1) for m in (ours, theirs)]
        diffs = []
        for _ in range(steps):
            for m, opt in zip((wrapped, theirs), opts):
                opt.zero_grad()
                nn.functional.mse_loss(m(xs), ys).backward()
                opt.step()
            mine, torch_local = dict(ours.named_parameters()), {k: v.to_local() for k, v in theirs.named_parameters()}
            diffs.append(max_diff([mine[k] for k in torch_local], list(torch_local.values()))
                         if list(mine) == list(torch_local) else math.inf)
        out[f"reshard={reshard}"] = {
            "names_equal": list(dict(ours.named_parameters())) == list(dict(theirs.named_parameters())),
            "shapes_equal": [tuple(p.shape) for p in ours.parameters()] == [tuple(p.to_local().shape)
                                                                            for p in theirs.parameters()],
            "diffs": diffs, "no_grad": [k for k, p in ours.named_parameters() if p.grad is None],
            "torch_no_grad": [k for k, p in theirs.named_parameters() if p.grad is None],
            "peak": wrapped.memory.peak, "live_after": wrapped.memory.live_bytes()}
    wrapped = FullyShardedSequential(_fsdp2_model("plain"), group=G,
                                     mp_policy=MixedPrecisionPolicy(torch.bfloat16, torch.float32))
    pred = wrapped(xs)
    nn.functional.mse_loss(pred.float(), ys).backward()
    out["mixed"] = {"out_dtype": str(pred.dtype),
                    "grad_dtypes": sorted({str(p.grad.dtype) for p in wrapped.parameters() if p.grad is not None}),
                    "shard_dtypes": sorted({str(p.dtype) for p in wrapped.parameters()})}
    refusals = {}
    for kind in ("cross_tie", "noncontig"):
        for who in ("ours", "torch"):
            try:
                model = _fsdp2_model(kind)
                if who == "ours":
                    FullyShardedSequential(model, group=G)(xs)
                else:
                    _fully_shard_all(model)(xs)
                refusals[kind, who] = None
            except (ValueError, NotImplementedError, RuntimeError) as exc:  # torch 2.11: a shape error, not a check
                refusals[kind, who] = f"{type(exc).__name__}: {exc}"
    out["refusals"] = refusals
    return out


def check_fully_sharded_expected_vs_torch() -> dict:
    """The graded exercise's expected values (distributed.fully_sharded, every case of this world size) against
    torch's fully_shard run on the same model and batches: shards after wrapping and after training, losses,
    outputs; a model torch refuses must be one the checker lets a student refuse (naming the parameter)."""
    from ptinternals.checks.distributed import FullyShardedExercise
    from ptinternals.checks.probes.distributed import build_model

    rank, n = dist.get_rank(G), dist.get_world_size(G)
    cases, expected = FullyShardedExercise().cases_and_expected(hidden=True)
    out = []
    for case, exp in zip(cases, expected):
        if case.args[0] != n:
            continue
        spec = case.args[1]
        model = build_model(spec["arch"], spec["state"]).to(DEV)
        xs, ys = spec["x"].chunk(n)[rank].to(DEV), spec["y"].chunk(n)[rank].to(DEV)
        try:
            _fully_shard_all(model)
            shards = [p.to_local().detach().clone() for p in model.parameters()]
            opt = torch.optim.SGD(model.parameters(), lr=spec["lr"], momentum=0.5)
            losses = []
            for _ in range(spec["steps"]):
                opt.zero_grad()
                loss = nn.functional.mse_loss(model(xs), ys)
                loss.backward()
                opt.step()
                losses.append(loss.item())
        except (ValueError, NotImplementedError, RuntimeError) as exc:  # 2.11 fails on a tie instead of refusing
            out.append({"label": case.label, "refused": str(exc), "may_refuse": list(exp["may_refuse"])})
            continue
        with torch.no_grad():
            pred = model(spec["x_eval"].to(DEV))
        out.append({
            "label": case.label, "refused": None,
            "names_equal": [k for k, _ in model.named_parameters()] == exp["names"],
            "shard_diff": max_diff(shards, exp["shards"][rank]),
            "final_diff": max_diff([p.to_local() for p in model.parameters()], exp["final"][rank]),
            "loss_diff": max(abs(a - e[rank]) for a, e in zip(losses, exp["losses"])),
            "out_diff": max_diff([pred], [exp["out"]])})
    return out


# ------------------------------------------------------------------------------------------------
# invalid inputs that need a process group
# ------------------------------------------------------------------------------------------------
def _raises(fn, exc_type, *words):
    try:
        fn()
    except exc_type as exc:
        msg = str(exc)
        return None if all(w in msg for w in words) else f"message {msg!r} lacks {words}"
    except Exception as exc:  # noqa: BLE001
        return f"raised {type(exc).__name__}: {exc} instead of {exc_type.__name__}"
    return f"did not raise {exc_type.__name__}"


def check_invalid_inputs() -> dict:
    lin = nn.Linear(2, 2)
    tied = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    tied[1].weight = tied[0].weight
    mixed = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).double())
    frozen = nn.Sequential(nn.Linear(2, 2))
    frozen[0].bias.requires_grad_(False)
    seq = nn.Sequential(nn.Sequential(nn.Linear(2, 2)), nn.Linear(2, 2))
    scalar = nn.Module()
    scalar.scale = nn.Parameter(torch.ones(()))
    tied_again = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    tied_again[1].weight = tied_again[0].weight
    tied_groups = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    tied_groups[1].weight = tied_groups[0].weight
    tied_ddp = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    tied_ddp[1].weight = tied_ddp[0].weight
    column_major = nn.Sequential(nn.Linear(3, 2))
    column_major[0].weight = nn.Parameter(column_major[0].weight.detach().t().contiguous().t())
    cases = {
        "ring_not_tensor": _raises(lambda: ring_all_reduce([1.0, 2.0]), TypeError, "tensor"),
        "ring_bad_op": _raises(lambda: ring_all_reduce(torch.ones(3), op="max"), ValueError, "op"),
        "ring_avg_int": _raises(lambda: ring_all_reduce(torch.ones(3, dtype=torch.int64), op="avg"),
                                TypeError, "avg"),
        "ring_bool": _raises(lambda: ring_all_reduce(torch.ones(3, dtype=torch.bool)), TypeError, "bool"),
        "ring_leaf_requires_grad": _raises(lambda: ring_all_reduce(torch.ones(3, requires_grad=True)),
                                           ValueError, "leaf"),
        "ddp_not_module": _raises(lambda: DistributedDataParallel(3), TypeError, "module"),
        "ddp_cap_zero": _raises(lambda: DistributedDataParallel(lin, bucket_cap_mb=0),
                                ValueError, "bucket_cap_mb"),
        "ddp_flag_type": _raises(lambda: DistributedDataParallel(lin, find_unused_parameters="yes"),
                                 TypeError, "find_unused_parameters"),
        "ddp_no_params": _raises(lambda: DistributedDataParallel(nn.ReLU()), ValueError, "parameters"),
        "naive_not_module": _raises(lambda: NaiveDDP("model"), TypeError, "module"),
        "zero_empty": _raises(lambda: ZeroRedundancyAdamW([]), ValueError, "params"),
        "zero_single_tensor": _raises(lambda: ZeroRedundancyAdamW(torch.ones(2, requires_grad=True)),
                                      TypeError, "params"),
        "zero_mixed_dtypes": _raises(lambda: ZeroRedundancyAdamW(list(mixed.parameters())),
                                     TypeError, "params[2]"),
        "zero_int_param": _raises(lambda: ZeroRedundancyAdamW([torch.ones(2, dtype=torch.int64)]),
                                  TypeError, "params[0]"),
        "fsdp_not_module": _raises(lambda: FullyShardedDataParallel(None), TypeError, "module"),
        "fsdp_foreign_unit": _raises(lambda: FullyShardedDataParallel(nn.Sequential(nn.Linear(2, 2)),
                                                                      units=[lin]), ValueError, "units[0]"),
        "fsdp_nested_units": _raises(lambda: FullyShardedDataParallel(seq, units=[seq[0], seq[0][0]]),
                                     ValueError, "nested"),
        "fsdp_tied": _raises(lambda: FullyShardedDataParallel(tied), ValueError, "shared"),
        "fsdp_frozen": _raises(lambda: FullyShardedDataParallel(frozen), ValueError, "require grad"),
        "fsdp_bad_dtype": _raises(lambda: FullyShardedDataParallel(nn.Linear(2, 2), param_dtype=torch.int8),
                                  TypeError, "param_dtype"),
        "fsdp2_zero_dim": _raises(lambda: fully_shard(scalar), ValueError, "'scale'"),
        "fsdp2_twice": _raises(lambda: fully_shard(fully_shard(nn.Linear(2, 2), group=G), group=G), ValueError,
                               "already"),
        "fsdp2_tied_between_groups": _raises(lambda: fully_shard(fully_shard(tied_groups[0], group=G) and tied_groups,
                                                                group=G), ValueError, "'1.weight'"),
        "fsdp2_sequential_tied": _raises(lambda: FullyShardedSequential(tied_again, group=G), ValueError, "'1.weight'"),
        "fsdp2_noncontiguous": _raises(lambda: FullyShardedSequential(column_major, group=G), ValueError, "'0.weight'"),
        "ddp_tied_bucketed_once": None if len(DistributedDataParallel(tied_ddp, group=G).params) == 3 else
        "a tied parameter must be bucketed once",
    }
    return cases


# ------------------------------------------------------------------------------------------------
# training script: the uninterrupted run (test_distributed_train.py resumes it under torchrun)
# ------------------------------------------------------------------------------------------------
TRAIN_ARGS = ["--steps", "6", "--save-every", "3"]


def check_train(workdir: str) -> dict:
    from ptinternals.distributed import train_ddp

    result = train_ddp.main(TRAIN_ARGS + ["--ckpt-dir", os.path.join(workdir, "ckpt"),
                                          "--out", os.path.join(workdir, "full.pt")])
    return {"losses": None if result is None else result["losses"]}


# ------------------------------------------------------------------------------------------------
# suites: one spawn each
# ------------------------------------------------------------------------------------------------
SUITES = {
    "ring": check_ring, "ddp": check_ddp,
    "no_sync": check_no_sync, "find_unused": check_find_unused, "zero": check_zero, "fsdp": check_fsdp,
    "fsdp2": check_fsdp2, "fsdp2_reference": check_fsdp2_reference,
    "fully_sharded_vs_torch": check_fully_sharded_expected_vs_torch, "invalid": check_invalid_inputs,
    "train": check_train,
}

# What each spawn runs: world size 2 (everything), world size 4 (plus a 3-rank sub-group [1, 2, 3])
PLANS = {
    2: {"world": (["ring", "ddp", "no_sync", "find_unused", "zero", "fsdp", "invalid", "fsdp2", "fsdp2_reference",
                   "fully_sharded_vs_torch", "train"], None)},
    4: {"world": (["ring", "fully_sharded_vs_torch"], None),
        "sub3": (["ring", "ddp", "no_sync", "find_unused", "zero", "fsdp", "fsdp2_reference",
                  "fully_sharded_vs_torch"], [1, 2, 3])},
}
_RESULTS: dict = {}
WORKDIR = None


def suite_results(world_size: int) -> list[dict]:
    """Parent side: run PLANS[world_size] once per test session; per-rank results in rank order."""
    global WORKDIR
    if WORKDIR is None:
        import atexit
        import shutil

        WORKDIR = tempfile.mkdtemp(prefix="ptinternals_dist_")
        atexit.register(shutil.rmtree, WORKDIR, True)
    if world_size not in _RESULTS:
        from ptinternals.distributed import default_backend, run_ranks

        # gloo ranks can be forked from this process (torch already imported: no start-up cost);
        # nccl ranks must be spawned (CUDA does not survive a fork).
        method = "fork" if default_backend(world_size) == "gloo" else "spawn"
        try:
            _RESULTS[world_size] = run_ranks(run_suite, world_size, PLANS[world_size], WORKDIR, timeout_s=240,
                                             start_method=method)
        except Exception as exc:  # remember the failure: do not respawn for every test
            _RESULTS[world_size] = exc
    if isinstance(_RESULTS[world_size], Exception):
        raise _RESULTS[world_size]
    return _RESULTS[world_size]


def run_suite(rank: int, world_size: int, plan: dict, workdir: str | None = None) -> dict:
    """``plan`` maps a label to (check names, ranks of the group or None for all ranks).

    A sub-group tests the ``group=`` argument of everything (its ranks are not 0..k-1) and gives a
    second world size without a second spawn. Returns {label: {check: result}, "seconds": ...}.
    """
    global G, DEV
    from ptinternals.distributed import rank_device

    DEV = rank_device()
    out, seconds = {}, {}
    for label, (names, members) in plan.items():
        group = None if members is None else dist.new_group(members)  # every rank must call new_group
        if members is not None and rank not in members:
            continue
        G = group
        out[label] = {}
        for name in names:
            t0 = time.perf_counter()
            out[label][name] = guarded(SUITES[name], workdir) if name == "train" else guarded(SUITES[name])
            seconds[f"{label}:{name}"] = round(time.perf_counter() - t0, 3)
        G = None
    out["seconds"] = seconds
    return out


# ------------------------------------------------------------------------------------------------
# deliberate failures for the launcher tests
# ------------------------------------------------------------------------------------------------
def mismatched_collectives(rank: int, world_size: int) -> None:
    t = torch.ones(4)
    dist.all_reduce(t)  # both ranks: fine
    if rank == 0:
        dist.all_reduce(t)  # rank 0 waits for an all_reduce ...
    else:
        dist.broadcast(t, src=1)  # ... that rank 1 never calls: a hang


def rank_dies(rank: int, world_size: int) -> None:
    t = torch.ones(4)
    if rank == 1:
        os._exit(3)  # a crash without a Python exception (segfault, OOM kill)
    dist.all_reduce(t)


