"""viz.allocator: the timeline and the segment map draw the model's and the real formats."""

import pytest
from matplotlib.figure import Figure

from ptinternals.allocator import CachingAllocator, GiB, MiB, replay
from ptinternals.allocator.workloads import FRAGMENTATION_CAPACITY, fragmenting_trace
from ptinternals.viz.allocator import plot_memory_timeline, plot_segment_map


def test_timeline_from_replay_and_from_dict():
    r = replay(fragmenting_trace(), FRAGMENTATION_CAPACITY)
    fig = plot_memory_timeline(r, capacity=FRAGMENTATION_CAPACITY)
    assert isinstance(fig, Figure)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("OOM" in s for s in labels) and any("reserved" in s for s in labels)
    fig2 = plot_memory_timeline({"reserved_bytes": [0, 2 * MiB], "allocated_bytes": [0, 512]})
    assert fig2.axes[0].get_ylabel() == "MiB"
    with pytest.raises(TypeError, match="reserved_bytes"):
        plot_memory_timeline({"x": []})
    with pytest.raises(ValueError, match="length"):
        plot_memory_timeline({"reserved_bytes": [1], "allocated_bytes": []})


def test_segment_map_states_and_inputs():
    a = CachingAllocator(GiB)
    keep = a.malloc(2 * MiB)
    tmp = a.malloc(5 * MiB)
    a.free(tmp)
    whole = a.malloc(30 * MiB)
    a.free(whole)
    pend = a.malloc(40 * MiB)
    a.record_stream(pend, 3)
    a.free(pend)
    for source in (a, a.snapshot(), a.snapshot()["segments"]):
        fig = plot_segment_map(source)
        assert isinstance(fig, Figure)
    legend = [t.get_text() for t in plot_segment_map(a).legends[0].get_texts()]
    assert len(legend) == 4  # allocated, pending, free-in-split, free segment
    assert isinstance(plot_segment_map(a, scale="fraction", max_segments=1), Figure)
    with pytest.raises(ValueError, match="scale"):
        plot_segment_map(a, scale="log")
    with pytest.raises(TypeError, match="snapshot"):
        plot_segment_map(42)
    a.free(keep)
