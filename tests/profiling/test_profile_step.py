"""profile_steps: torch.profiler with a schedule and record_function ranges, read back from the trace."""
import pytest
import torch

from ptinternals.profiling.profile_step import capstone_step, profile_steps
from ptinternals.profiling.trace_analysis import complete_events, load_trace
from tests.profiling.conftest import small_step


def test_profile_steps_records_only_the_active_steps(tmp_path):
    report = profile_steps(small_step(), wait=1, warmup=1, active=3, trace_path=str(tmp_path / "t.json"))
    steps = [e for e in complete_events(load_trace(report.trace_path), ("user_annotation",))
             if e.name.startswith("ProfilerStep#")]
    assert len(steps) == 3 and report.active_steps == 3
    assert [e.name for e in steps] == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    assert set(report.phase_us()) == {"forward", "backward", "optimizer"}
    top = report.top(3)
    assert len(top) == 3 and all(name.startswith("aten::") for name, _ in top)
    assert [us for _, us in top] == sorted((us for _, us in top), reverse=True)
    assert "Self CPU" in report.table


def test_capstone_step_is_profiled_with_its_phases():
    torch.manual_seed(0)
    step = capstone_step(batch_size=2, n_layer=1)
    report = profile_steps(step, wait=0, warmup=1, active=1)
    assert set(report.phase_us()) == {"forward", "backward", "optimizer"}
    names = [n for n, _ in report.top(6)]
    assert "aten::mm" in names or "aten::addmm" in names       # the matmuls are among the top costs


def test_bad_arguments():
    with pytest.raises(ValueError, match="active"):
        profile_steps(lambda: None, active=0)
    with pytest.raises(TypeError, match="callable"):
        profile_steps(None)
    with pytest.raises(ValueError, match="device"):
        profile_steps(lambda: None, device="tpu")


def test_capstone_costs_rejects_bad_parts(tmp_path):
    from ptinternals.profiling.profile_step import capstone_costs

    with pytest.raises(TypeError, match="backward must be callable"):
        capstone_costs(lambda: None, 3, lambda: None, str(tmp_path / "t.json"))
    with pytest.raises(TypeError, match="trace_path must be a path"):
        capstone_costs(lambda: None, lambda: None, lambda: None, 7)
