"""Traces: validation, replay statistics, the fragmentation exercise (e), peak prediction (f)."""

import pytest
import torch

from ptinternals.allocator import (
    AllocatorConfig,
    GiB,
    MiB,
    fits,
    predict_peak_reserved,
    replay,
    validate_trace,
)
from ptinternals.allocator.workloads import (
    FRAGMENTATION_CAPACITY,
    check_fragmentation_fix,
    fragmenting_trace,
    random_trace,
    trace_allocations,
    training_step_trace,
)


def test_replay_per_event_stats():
    t = [
        ("alloc", "a", 3 * MiB, 0),
        ("alloc", "b", 100, 0),
        ("step", 0),
        ("free", "a"),
        ("empty_cache",),
        ("free", "b"),
        ("empty_cache",),
        ("step", 1),
    ]
    r = replay(t)
    assert r.reserved_bytes == [20 * MiB, 22 * MiB, 22 * MiB, 22 * MiB, 2 * MiB, 2 * MiB, 0, 0]
    assert r.allocated_bytes == [3 * MiB, 3 * MiB + 512, 3 * MiB + 512, 512, 512, 0, 0, 0]
    assert r.segments == [1, 2, 2, 2, 1, 1, 0, 0]
    assert [s["step"] for s in r.steps] == [0, 1] and r.steps[0]["reserved_bytes"] == 22 * MiB
    assert r.peak_reserved == 22 * MiB and r.oom is None


def test_ids_can_be_reused_after_free_and_zero_byte_allocs():
    r = replay([("alloc", 1, 0, 0), ("free", 1), ("alloc", 1, 10, 0), ("free", 1)])
    assert r.reserved_bytes == [0, 0, 2 * MiB, 2 * MiB] and r.alloc_ptrs[0] is None


@pytest.mark.parametrize(
    "trace, exc, words",
    [
        ([("alloc", 1, 10)], ValueError, "takes 3 fields"),
        ([("malloc", 1, 10, 0)], ValueError, "unknown event"),
        ([("free", 1)], ValueError, "not live"),
        ([("alloc", 1, 10, 0), ("alloc", 1, 10, 0)], ValueError, "allocated twice"),
        ([("alloc", 1, -10, 0)], ValueError, "nbytes"),
        ([("alloc", 1, 10, -1)], ValueError, "stream"),
        ([("alloc", 1.5, 10, 0)], TypeError, "id"),
        ([("record_stream", 3, 1)], ValueError, "not live"),
        ("alloc", TypeError, "list of events"),
    ],
)
def test_invalid_traces(trace, exc, words):
    with pytest.raises(exc, match=words):
        validate_trace(trace)
    with pytest.raises(exc, match=words):
        replay(trace)


def test_fragmenting_trace_ooms_with_free_memory_left():
    t = fragmenting_trace()
    assert fits(t, 2 * GiB)
    r = replay(t, FRAGMENTATION_CAPACITY)
    oom = r.oom
    assert oom is not None
    unallocated = oom["reserved_bytes"] - oom["allocated_bytes"]
    assert unallocated > FRAGMENTATION_CAPACITY // 4  # >25% of the GPU reserved but unallocated
    assert oom["allocated_bytes"] + oom["alloc_size"] < FRAGMENTATION_CAPACITY  # enough bytes in total
    assert "reserved by PyTorch but unallocated" in oom["message"]


def test_fragmentation_fixes_fit():
    t = fragmenting_trace()
    # max_split_size_mb: oversize scratch blocks are not split for the kept tensors
    assert fits(t, FRAGMENTATION_CAPACITY, config=AllocatorConfig(max_split_size=48 * MiB))
    # reordering: allocate the long-lived tensors first
    keeps = [e for e in t if e[0] == "alloc" and str(e[1]).startswith("keep")]
    rest = [e for e in t if e not in keeps]
    assert fits(keeps + rest, FRAGMENTATION_CAPACITY)
    # preallocation: one scratch buffer of the largest size, reused every step
    biggest = max(e[2] for e in t if e[0] == "alloc" and str(e[1]).startswith("scratch"))
    pre = [("alloc", "scratch", biggest, 0)] + [
        e for e in t if not str(e[1] if len(e) > 1 else "").startswith("scratch")
    ]
    assert fits(pre, FRAGMENTATION_CAPACITY)
    # empty_cache right after each scratch free: the kept tensors find no free segment to pin
    with_ec = [x for e in t for x in ([e, ("empty_cache",)] if e[0] == "free" else [e])]
    assert fits(with_ec, FRAGMENTATION_CAPACITY)
    # ... but calling it when the OOM comes is too late: the retry path already did it
    r = replay(t, FRAGMENTATION_CAPACITY)
    assert r.oom is not None and r.allocator.memory_stats()["num_alloc_retries"] >= 1


def test_replay_continue_after_oom():
    t = [
        ("alloc", 0, 60 * MiB, 0),
        ("alloc", 1, 60 * MiB, 0),
        ("free", 1),
        ("free", 0),
        ("alloc", 2, 60 * MiB, 0),
    ]
    r = replay(t, 100 * MiB, stop_on_oom=False)
    assert r.oom["event_index"] == 1 and r.events == 5 and r.allocated_bytes[-1] == 60 * MiB


def test_predict_peak_reserved_training_step():
    t = training_step_trace()
    peak = predict_peak_reserved(t)
    r = replay(t)
    assert peak == max(r.reserved_bytes) == r.steps[-1]["peak_reserved"]
    assert peak >= max(r.allocated_bytes)
    r.allocator.check_invariants()


def test_random_traces_replay_soundly():
    for seed in range(5):
        r = replay(random_trace(300, seed=seed, empty_cache_every=50), 1 * GiB)
        r.allocator.check_invariants()
        assert all(a <= b for a, b in zip(r.allocated_bytes, r.reserved_bytes, strict=True))


def test_trace_allocations_of_a_cpu_training_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        x = torch.randn(64, 256)  # 64 KiB
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    trace = trace_allocations(step)
    validate_trace(trace)
    sizes = {e[2] for e in trace if e[0] == "alloc"}
    assert 64 * 256 * 4 in sizes and 512 * 256 * 4 in sizes  # the input and the first weight's grad
    live = {e[1] for e in trace if e[0] == "alloc"} - {e[1] for e in trace if e[0] == "free"}
    assert not live  # every temporary died (grads were set to None)
    # the first weight's storage existed before: only its gradient (same size) is an allocation
    assert sum(1 for e in trace if e[0] == "alloc" and e[2] == 512 * 256 * 4) == 1
    assert predict_peak_reserved(trace) == 2 * MiB  # everything fits in one small-pool segment


def test_workload_builders_validate():
    with pytest.raises(ValueError, match="steps"):
        fragmenting_trace(0)
    with pytest.raises(ValueError, match="widths"):
        training_step_trace(widths=(3,))
    with pytest.raises(ValueError, match="n_events"):
        random_trace(-1)
    with pytest.raises(TypeError, match="callable"):
        trace_allocations(3)


def test_fragmentation_fix_checker():
    t = fragmenting_trace()
    assert not check_fragmentation_fix(t)["fits"]
    keeps = [e for e in t if e[0] == "alloc" and str(e[1]).startswith("keep")]
    report = check_fragmentation_fix(keeps + [e for e in t if e not in keeps])
    assert report["ok"], report
    assert check_fragmentation_fix(t, config=AllocatorConfig(max_split_size=48 * MiB))["ok"]
    cheat = [e for e in t if not (e[0] == "alloc" and e[1] == "keep3")]  # drops a kept tensor
    report = check_fragmentation_fix(cheat)
    assert not report["ok"] and any("keep3" in p for p in report["problems"])
