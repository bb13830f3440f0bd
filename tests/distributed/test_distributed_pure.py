"""The distributed chapter checks that need no process group: schedules, bucket assignment, shards, figures, errors."""
import math

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st
from matplotlib.figure import Figure
from torch import nn

from ptinternals.distributed import (
    DistributedDataParallel,
    FullyShardedDataParallel,
    FullyShardedSequential,
    MixedPrecisionPolicy,
    NaiveDDP,
    ZeroRedundancyAdamW,
    assign_buckets,
    chunk_bounds,
    compute_bucket_assignment_by_size,
    fully_shard,
    read_last_collective,
    ring_all_reduce,
    ring_bytes_sent_per_rank,
    ring_schedule,
    run_ranks,
    shard_bounds,
)
from ptinternals.distributed.ring import ring_contributions
from ptinternals.viz.distributed import plot_ddp_timeline, plot_fsdp_memory, plot_ring_all_reduce


# ---------------------------------------------------------------------------------------------- ring
@given(st.integers(0, 5000), st.integers(1, 9))
def test_chunk_bounds_match_tensor_split(length, world_size):
    bounds = chunk_bounds(length, world_size)
    expected = [t.numel() for t in torch.arange(length).tensor_split(world_size)]
    assert [e - s for s, e in bounds] == expected
    assert bounds[0][0] == 0 and bounds[-1][1] == length
    assert all(bounds[i][1] == bounds[i + 1][0] for i in range(world_size - 1)), "chunks tile [0, length)"


@pytest.mark.parametrize("n", range(1, 9))
def test_ring_schedule_is_a_ring(n):
    steps = ring_schedule(n)
    assert len(steps) == 2 * (n - 1)
    assert [s["phase"] for s in steps] == ["reduce-scatter"] * (n - 1) + ["all-gather"] * (n - 1)
    for st_ in steps:  # what rank r receives is what its left neighbour sends
        assert all(st_["recv"][r] == st_["send"][(r - 1) % n] for r in range(n))
        assert sorted(st_["send"]) == list(range(n)), "each step moves every chunk exactly once"


@pytest.mark.parametrize("n", range(1, 9))
def test_ring_contributions_reduce_then_gather(n):
    states = ring_contributions(n)
    everyone = frozenset(range(n))
    after_rs = states[n - 1]
    for r in range(n):  # after reduce-scatter rank r owns the full sum of chunk (r + 1) % n
        assert after_rs[r][(r + 1) % n] == everyone
    assert all(cell == everyone for row in states[-1] for cell in row)


@given(st.integers(0, 4000), st.sampled_from([1, 2, 4, 8]), st.integers(1, 8))
def test_ring_bytes_cost_model(length, element_size, n):
    sent = ring_bytes_sent_per_rank(length, element_size, n)
    # every chunk is forwarded by N-1 ranks in each phase: 2(N-1) * L elements in total
    assert sum(sent) == 2 * (n - 1) * length * element_size
    if length % n == 0:
        assert all(s == 2 * (n - 1) * length // n * element_size for s in sent)
    assert max(sent) <= 2 * (n - 1) * math.ceil(length / n) * element_size


# ---------------------------------------------------------------------------------------------- buckets
_DTYPES = [torch.float32, torch.float16, torch.float64]


@given(st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 2)), min_size=1, max_size=25),
       st.lists(st.integers(1, 20000), min_size=1, max_size=3))
def test_bucket_assignment_matches_torch(tensors, limits):
    ts = [torch.empty(numel, dtype=_DTYPES[d]) for numel, d in tensors]
    expected, _ = dist._compute_bucket_assignment_by_size(ts, limits)
    got = compute_bucket_assignment_by_size([t.numel() * t.element_size() for t in ts], limits,
                                            keys=[t.dtype for t in ts])
    assert got == [list(b) for b in expected], f"bytes {[t.nbytes for t in ts]}, limits {limits}"


def test_bucket_assignment_first_bucket_is_small():
    mib = 1 << 20
    # ready order: 0.6 MiB, 0.6 MiB, then 10 x 4 MiB with a 1 MiB first bucket and 25 MiB cap
    sizes = [int(0.6 * mib)] * 2 + [4 * mib] * 10
    buckets = compute_bucket_assignment_by_size(sizes, [mib, 25 * mib])
    assert buckets[0] == [0, 1], "the first bucket closes as soon as it reaches 1 MiB"
    assert buckets[1] == [2, 3, 4, 5, 6, 7, 8], "later buckets close at >= 25 MiB (7 x 4 MiB = 28)"
    assert buckets[2] == [9, 10, 11]


# ---------------------------------------------------------------------------------------------- shards
@given(st.integers(0, 5000), st.integers(1, 9))
def test_shard_bounds_tile_the_flat_vector(numel, n):
    bounds = [shard_bounds(numel, n, r) for r in range(n)]
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(bounds[r][1] == bounds[r + 1][0] for r in range(n - 1))
    sizes = [e - s for s, e in bounds]
    chunks = [c.numel() for c in torch.arange(numel).chunk(n)] if numel else []
    assert sizes == chunks + [0] * (n - len(chunks)), "same split as torch.chunk (FSDP2's dim-0 sharding)"


# ---------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("call, exc, words", [
    (lambda: chunk_bounds(-1, 2), ValueError, "length"),
    (lambda: chunk_bounds(3, 0), ValueError, "world_size"),
    (lambda: chunk_bounds("3", 2), TypeError, "length"),
    (lambda: ring_schedule(0), ValueError, "world_size"),
    (lambda: ring_schedule(2.0), TypeError, "world_size"),
    (lambda: ring_bytes_sent_per_rank(10, 0, 2), ValueError, "element_size"),
    (lambda: compute_bucket_assignment_by_size([1, -2], [10]), ValueError, "tensor_bytes[1]"),
    (lambda: compute_bucket_assignment_by_size([1, 2], []), ValueError, "bucket_size_limits"),
    (lambda: compute_bucket_assignment_by_size([1, 2], [0]), ValueError, "bucket_size_limits[0]"),
    (lambda: compute_bucket_assignment_by_size(5, [10]), TypeError, "tensor_bytes"),
    (lambda: compute_bucket_assignment_by_size([1, 2], [10], keys=["a"]), ValueError, "keys"),
    (lambda: shard_bounds(10, 2, 2), IndexError, "rank"),
    (lambda: shard_bounds(-1, 2, 0), ValueError, "numel"),
    (lambda: shard_bounds(10, 0, 0), ValueError, "world_size"),
    (lambda: assign_buckets([4, 8], 0, 4), ValueError, "bucket_cap_bytes"),
    (lambda: assign_buckets([4, 8], 16, 2.5), ValueError, "first_bucket_cap_bytes"),
    (lambda: assign_buckets([4, -8], 16, 4), ValueError, "tensor_bytes[1]"),
    (lambda: fully_shard(3), TypeError, "module"),
    (lambda: fully_shard(nn.Linear(2, 2), reshard_after_forward="yes"), TypeError, "reshard_after_forward"),
    (lambda: fully_shard(nn.Linear(2, 2), mp_policy="bf16"), TypeError, "mp_policy"),
    (lambda: fully_shard(nn.Linear(2, 2), mp_policy=MixedPrecisionPolicy(param_dtype=torch.int8)), TypeError,
     "mp_policy.param_dtype"),
    (lambda: FullyShardedSequential(nn.Linear(2, 2)), TypeError, "model"),
    (lambda: DistributedDataParallel(nn.Linear(2, 2), bucket_cap_mb=0), ValueError, "bucket_cap_mb"),
    (lambda: DistributedDataParallel(nn.Linear(2, 2), first_bucket_cap_mb=-1.0), ValueError, "first_bucket_cap_mb"),
    (lambda: plot_ring_all_reduce(1), ValueError, "world_size"),
    (lambda: plot_ddp_timeline([]), ValueError, "timeline"),
    (lambda: plot_ddp_timeline([("x", 1.0)]), ValueError, "timeline[0]"),
    (lambda: plot_fsdp_memory([("x", "big")]), ValueError, "memory_events[0]"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_pure_functions_reject_bad_input(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    assert words in str(info.value)


@pytest.mark.parametrize("call", [
    lambda: ring_all_reduce(torch.ones(3)),
    lambda: DistributedDataParallel(nn.Linear(2, 2)),
    lambda: NaiveDDP(nn.Linear(2, 2)),
    lambda: ZeroRedundancyAdamW(nn.Linear(2, 2).parameters()),
    lambda: FullyShardedDataParallel(nn.Linear(2, 2)),
    lambda: fully_shard(nn.Linear(2, 2)),
])
def test_everything_needs_a_process_group(call):
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        call()


def _module_level(rank, world_size):
    return rank


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(fn=lambda r, w: r, world_size=2), TypeError, "module-level"),
    (dict(fn=3, world_size=2), TypeError, "callable"),
    (dict(fn=_module_level, world_size=0), ValueError, "world_size"),
    (dict(fn=_module_level, world_size="2"), TypeError, "world_size"),
    (dict(fn=_module_level, world_size=2, backend="mpi"), ValueError, "backend"),
    (dict(fn=_module_level, world_size=2, timeout_s=0), ValueError, "timeout_s"),
    (dict(fn=_module_level, world_size=2, debug="LOUD"), ValueError, "debug"),
    (dict(fn=_module_level, world_size=2, num_threads=0), ValueError, "num_threads"),
])
def test_run_ranks_rejects_bad_arguments_before_spawning(kwargs, exc, words):
    fn, world_size = kwargs.pop("fn"), kwargs.pop("world_size")
    with pytest.raises(exc) as info:
        run_ranks(fn, world_size, **kwargs)
    assert words in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_run_ranks_nccl_needs_gpus():
    with pytest.raises(ValueError, match="one GPU per rank"):
        run_ranks(_module_level, 2, backend="nccl")


def test_read_last_collective(tmp_path):
    path = tmp_path / "rank0.trace"
    path.write_text("1\tenter\tall_reduce\ttensor[4] float32\t1.0\n"
                    "1\texit\tall_reduce\ttensor[4] float32\t1.1\n"
                    "2\tenter\tbroadcast\ttensor[2] float32\t1.2\n")
    last = read_last_collective(str(path))
    assert last == {"seq": 2, "name": "broadcast", "detail": "tensor[2] float32", "returned": False,
                    "count": 2}
    assert read_last_collective(str(tmp_path / "missing")) is None


# ---------------------------------------------------------------------------------------------- figures
@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_figure(n):
    fig = plot_ring_all_reduce(n)
    assert isinstance(fig, Figure)
    texts = [t.get_text() for t in fig.axes[0].texts]
    # chunk 0 is finished by rank n-1 at the end of reduce-scatter; each all-gather step adds one rank
    assert texts.count("Σ0") == n * (n + 1) // 2


def test_timeline_and_memory_figures():
    tl = [("forward_start", 0.0, -1), ("forward_end", 0.001, -1), ("grad_ready", 0.002, 1),
          ("bucket_launch", 0.0021, 0), ("grad_ready", 0.003, 0), ("bucket_launch", 0.0031, 1),
          ("backward_end", 0.0032, -1), ("bucket_done", 0.0030, 0), ("bucket_done", 0.004, 1)]
    fig = plot_ddp_timeline(tl)
    assert isinstance(fig, Figure)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["compute", "bucket 0", "bucket 1"]
    fig = plot_fsdp_memory([("all-gather 0", 100), ("reshard 0", 0)], unsharded_bytes=300)
    assert isinstance(fig, Figure)


# ---------------------------------------------------------------------------------------------- vs torch DDP
@pytest.fixture
def single_rank_group():
    """A one-rank gloo group in this process (bucket layout does not depend on the world size)."""
    from ptinternals.distributed import find_free_port

    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class _Reordered(nn.Module):
    """Registered a, b, c but used c -> a -> b: the ready order is b, a, c, not the reverse of registration."""

    def __init__(self, width):
        super().__init__()
        self.a, self.b, self.c = (nn.Linear(width, width) for _ in range(3))

    def forward(self, x):
        return self.b(self.a(self.c(x)))


def _ddp_model(kind: str, width: int, layers: int = 4) -> nn.Module:
    torch.manual_seed(0)
    if kind == "reordered":
        return _Reordered(width)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    if kind == "frozen":
        model[1].weight.requires_grad_(False)
    if kind == "tied":
        model[2].weight = model[0].weight
    return model


def _torch_bucket_indices(ddp, params) -> list[list[int]]:
    """torch's buckets, in launch order, as indices into ``params`` (the parameters that require grad)."""
    index = {p.data_ptr(): i for i, p in enumerate(params)}
    return [[index[t.data_ptr()] for t in b.parameters()] for b in ddp.reducer._get_zeros_like_grad_buckets()]


@pytest.mark.parametrize("kind, width, cap_mb, find_unused", [
    ("plain", 512, None, False),  # default caps: 25 MiB, the first bucket 1 MiB (one 512 x 512 layer is 1 MiB)
    ("plain", 256, 0.6, False),   # a non-default cap: torch then uses the cap for the first bucket too
    ("plain", 96, 0.05, True),    # find_unused_parameters: [first, cap] over registration order, never rebuilt
    ("reordered", 96, 0.05, False),  # the rebuild follows the order gradients really arrived in
    ("frozen", 96, 0.05, False),  # frozen parameters are not bucketed
    ("tied", 96, 0.05, False),    # a tied parameter is one parameter (bucketed once)
])
def test_ddp_bucket_indices_match_torch_ddp(single_rank_group, kind, width, cap_mb, find_unused):
    """Bucket indices, in launch order, at construction and after torch rebuilds them at the 2nd forward: the
    reference DDP, the reference assign_buckets on the observed ready order, and torch's own Reducer agree."""
    from ptinternals.distributed.buckets import assign_buckets

    kwargs = {"find_unused_parameters": find_unused} | ({} if cap_mb is None else {"bucket_cap_mb": cap_mb})
    theirs = torch.nn.parallel.DistributedDataParallel(_ddp_model(kind, width), **kwargs)
    ours = DistributedDataParallel(_ddp_model(kind, width), **kwargs)
    params = [p for p in theirs.module.parameters() if p.requires_grad]
    ready: list[int] = []
    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda p, i=i: ready.append(i))
    x = torch.randn(2, width)
    at_construction = _torch_bucket_indices(theirs, params)
    assert [b.param_indices for b in ours.buckets] == at_construction
    if not find_unused:
        assert at_construction == [list(range(len(params)))], "the first iteration has one bucket"
    for step in range(3):
        ready.clear()
        theirs(x).sum().backward()
        ours(x).sum().backward()
        got = _torch_bucket_indices(theirs, params)
        assert [b.param_indices for b in ours.buckets] == got, f"step {step}"
        if step == 0:
            first_order = list(ready)
    if find_unused:
        assert got == at_construction, "find_unused_parameters: torch never rebuilds"
        return
    cap = int((cap_mb or 25) * 2**20)
    first = dist._DEFAULT_FIRST_BUCKET_BYTES if cap_mb is None else cap
    nbytes = [params[i].numel() * params[i].element_size() for i in first_order]
    assert [[first_order[k] for k in b] for b in assign_buckets(nbytes, cap, first)] == got
    if kind == "reordered":  # b's gradients first, then a's, then c's: not the reverse of registration
        assert first_order == [3, 2, 1, 0, 5, 4], first_order
