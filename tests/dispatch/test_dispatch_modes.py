"""modes.py: OpLogger, MemoryTracker, HiddenCopyDetector, FunctionLogger against real torch."""
import inspect

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from ptinternals.dispatch.modes import (
    HiddenCopyDetector,
    MemoryTracker,
    OpLogger,
    function_vs_dispatch,
    round_cuda_allocation,
)

dims = st.sampled_from([0, 1, 3, 7, 16])


def test_op_logger_sees_linear_after_autograd_and_decomposition():
    torch.manual_seed(0)
    lin = nn.Linear(8, 16)
    x = torch.randn(4, 8, requires_grad=True)
    with OpLogger() as log:
        F.gelu(lin(x)).sum().backward()
    names = log.op_names()
    assert names[:3] == ["aten.t.default", "aten.addmm.default", "aten.gelu.default"]  # linear -> t + addmm
    assert "aten.gelu_backward.default" in names and names.count("aten.mm.default") == 2  # backward comes too
    rec = log.records[1]
    assert rec.input_shapes == ((16,), (4, 8), (8, 16)) and rec.output_shapes == ((4, 16),)
    assert rec.output_dtypes == ("float32",)
    assert "aten.addmm.default(float32[16], float32[4, 8], float32[8, 16]) -> float32[4, 16]" in str(log)


def test_function_vs_dispatch_layers():
    lin = nn.Linear(4, 4)
    seen = function_vs_dispatch(lambda: lin(torch.randn(2, 4)))
    assert any("linear" in c for c in seen["torch_function"])
    assert seen["torch_dispatch"] == ["aten.randn.default", "aten.t.default", "aten.addmm.default"]
    with pytest.raises(TypeError, match="callable"):
        function_vs_dispatch(3)


@given(m=dims, n=dims, k=dims, transpose=st.booleans())
def test_memory_tracker_counts_new_storages(m, n, k, transpose):
    a = torch.randn(k, m).t() if transpose else torch.randn(m, k)  # non-contiguous or not
    b = torch.randn(k, n)
    with MemoryTracker() as mt:
        c = a @ b                     # new [m, n] fp32 storage
        v = c.view(-1)                # a view: no allocation
        c.add_(1)                     # in place: no allocation
        d = a.contiguous()            # a copy only when a was non-contiguous
    assert v.data_ptr() == c.data_ptr()
    by_op = {}
    for r in mt.records:
        by_op.setdefault(r.op, []).append(r.new_bytes)
    assert sum(by_op["aten.mm.default"]) == m * n * 4
    assert by_op.get("aten.view.default", [0]) == [0] and by_op["aten.add_.Tensor"] == [0]
    assert sum(by_op.get("aten.clone.default", [0])) == (m * k * 4 if transpose and m > 1 and k > 1 else 0)
    assert mt.live_bytes == c.untyped_storage().nbytes() + (d.untyped_storage().nbytes() if d is not a else 0)
    del c, v, d
    assert mt.live_bytes == 0  # finalizers ran as the storages died


def test_memory_tracker_peak_and_track():
    x = torch.randn(256)  # 1024 B, made outside the mode
    with MemoryTracker() as mt:
        assert mt.track(x, x[1:]) == 1024 and mt.live_bytes == 1024  # a view adds nothing
        y = x * 2          # +1024
        z = y * 2          # +1024 -> 3072 live
        del y              # -1024
        w = z + 1          # +1024 -> 3072 live again
        assert mt.peak_bytes == 3072
        mt.reset_peak()
        del z, w
    assert mt.live_bytes == 1024 and mt.peak_bytes == 3072


def test_memory_tracker_fake_tensors_and_cuda_rounding():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = torch.empty(3, 5)
        with MemoryTracker(round_to_cuda=True) as mt:
            b = a * 2  # 60 B -> one 512 B block
            c = torch.empty(1000)  # 4000 B -> 4096
        assert [r.new_bytes for r in mt.records] == [512, 4096]
        del b, c
    assert [round_cuda_allocation(n) for n in (0, 1, 512, 513)] == [0, 512, 512, 1024]
    with pytest.raises(ValueError, match="nbytes"):
        round_cuda_allocation(-1)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        h = self.proj(x.t().contiguous().t())  # a hidden copy: transpose, materialise, transpose back
        return h.to(torch.float64)


def test_hidden_copy_detector_reports_line_module_and_backward():
    model = Model()
    x = torch.randn(8, 8, requires_grad=True)
    with HiddenCopyDetector(model) as hc:
        model(x).sum().backward()
    src_line = inspect.getsourcelines(Model.forward)[1] + 1
    fwd = [e for e in hc.events if not e.where.startswith("backward")]
    assert [e.op for e in fwd] == ["aten.clone.default", "aten._to_copy.default"]
    assert fwd[0].where.startswith(f"test_dispatch_modes.py:{src_line} ")
    assert fwd[0].modules == ("Model",) and fwd[0].nbytes == 8 * 8 * 4
    assert "float32->torch.float64" in fwd[1].reason and fwd[1].nbytes == 8 * 8 * 8
    bwd = [e for e in hc.events if e.where.startswith("backward")]
    assert any(e.where == "backward: ToCopyBackward0" for e in bwd)  # float64 grad cast back to float32
    assert "copies" in hc.report()


def test_hidden_copy_detector_is_quiet_when_nothing_copies():
    x = torch.randn(4, 4)
    with HiddenCopyDetector() as hc:
        x.contiguous()          # already contiguous: returns self, no clone
        x.t().reshape(16)       # cannot be a view -> a copy
        x.to(torch.float32)     # same dtype: no copy
    assert [e.op for e in hc.events] == ["aten.clone.default"]
    with HiddenCopyDetector(min_bytes=10_000) as hc2:
        x.t().contiguous()
    assert hc2.events == [] and hc2.report() == "no hidden copies"
    with pytest.raises(ValueError, match="min_bytes"):
        HiddenCopyDetector(min_bytes=-1)
    with pytest.raises(TypeError, match="nn.Module"):
        HiddenCopyDetector(module="model")
