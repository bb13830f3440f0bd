"""The sync detector: its rule table on torch's own cases, generated programs, the real op stream,
CUDA emulation on a CPU build, and (on a GPU) agreement with torch.cuda.set_sync_debug_mode."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from ptinternals.profiling import SyncDetector, find_syncs
from ptinternals.profiling.placement import Placement
from ptinternals.profiling.sync_programs import (
    SETUP,
    STATEMENTS,
    SyncProgram,
    detected_lines,
    make_program,
    real_sync_lines,
)
from ptinternals.profiling.sync_rules import REASONS, bind_arguments, can_dispatch_to_masked_fill, sync_reason

aten = torch.ops.aten


def _single(st_) -> SyncProgram:
    line = len(SETUP) + 1
    return SyncProgram("<one>", "\n".join(SETUP + (st_.code,)) + "\n", tuple((line, r) for r in st_.reasons))


# ---- the rule table --------------------------------------------------------------------------------
@pytest.mark.parametrize("statement", STATEMENTS, ids=lambda s: s.code)
def test_each_statement_alone(statement):
    program = _single(statement)
    assert detected_lines(program) == list(program.expected)


def test_torch_test_sync_warning_cases_are_all_there():
    # test/test_torch.py::test_sync_warning: 8 cases that must not sync, 8 that must
    cases = [s for s in STATEMENTS if s.torch_test]
    assert sum(not s.reasons for s in cases) == 8 and sum(bool(s.reasons) for s in cases) == 8
    assert all(r in REASONS for s in STATEMENTS for r in s.reasons)


@given(st.integers(0, 10_000), st.integers(0, 12))
def test_generated_programs(seed, n):
    program = make_program(seed, n)
    assert detected_lines(program) == list(program.expected)


def test_empty_program_has_no_syncs():
    program = make_program(0, 0)
    assert program.expected == () and detected_lines(program) == []


class _OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reported_aten_ops_are_the_ops_torch_dispatched(seed):
    # The ATen names the detector reports come from the dispatcher, in order: a plain logging mode
    # under the detector sees each of them (it runs inside the detector's emulation).
    program = make_program(seed, 10)
    with SyncDetector() as det:
        with _OpLog() as log:
            program.run("cuda")
    reported = [e.op for e in det.implicit() if e.op.startswith("aten.")]
    it = iter(log.ops)
    assert all(op in it for op in reported), (reported, log.ops)


def test_host_tensors_never_sync():
    on_device = Placement().on_device
    x = torch.randn(4)
    for func, args in [(aten._local_scalar_dense.default, (x[0],)), (aten.nonzero.default, (x,)),
                       (aten.masked_select.default, (x, x > 0)), (aten.bincount.default, (torch.tensor([1, 2]),))]:
        assert sync_reason(func, args, {}, on_device) is None


def test_rules_on_device_tensors():
    p = Placement()
    x, mask, ind = torch.randn(4), torch.tensor([True, False, True, False]), torch.tensor([0, 2])
    for t in (x, mask, ind):
        p.mark_device(t)
    host_scalar, host_vec = torch.tensor(1.0), torch.ones(2)
    r = lambda func, *args, **kw: sync_reason(func, args, kw, p.on_device)
    assert r(aten.index.Tensor, x, [mask]) == "bool_mask_index"
    assert r(aten.index.Tensor, x, [ind]) is None
    assert r(aten.index.Tensor, x, [torch.tensor([0])]) == "host_index"
    assert r(aten.index_put_.default, x, [mask], host_scalar) is None            # -> masked_fill_
    assert r(aten.index_put_.default, x, [mask], host_scalar, True) == "bool_mask_index"  # accumulate
    assert r(aten.index_put_.default, x, [mask], host_vec) == "bool_mask_index"  # not one element
    assert r(aten.index_put_.default, x, [mask], x[0]) == "bool_mask_index"      # device value
    assert r(aten.histc.default, x, 4) == "histc_range"
    assert r(aten.histc.default, x, 4, -1.0, 1.0) is None
    assert r(aten.histc.default, x, 4, 1.0, 1.0) == "histc_range"                # min == max at equality
    assert r(aten.repeat_interleave.Tensor, ind) == "repeat_interleave"
    assert r(aten.repeat_interleave.Tensor, ind, output_size=2) is None
    assert r(aten.repeat_interleave.Tensor, ind, output_size=0) is None             # given, though falsy
    assert r(aten.repeat_interleave.self_int, x, 2) is None
    assert r(aten.index_put_.default, x, [mask], torch.ones(1)) is None              # numel 1, not 0-d
    u8 = mask.to(torch.uint8)
    p.mark_device(u8)
    assert r(aten.index.Tensor, x, [u8]) == "bool_mask_index"                       # uint8 masks too
    assert r(aten.index_put_.default, x, [torch.tensor([0]), mask], host_scalar) == "host_index"
    assert r(aten.nonzero.default, x[:0]) == "nonzero"                               # empty still waits
    assert r(aten.add.Tensor, x, x) is None and r(aten.masked_fill_.Scalar, x, mask, 0.0) is None


def test_masked_fill_dispatch_boundaries():
    p = Placement()
    mask = torch.tensor([True, False])
    p.mark_device(mask)
    one = torch.tensor(1.0)
    assert can_dispatch_to_masked_fill(True, [mask], one, False, p.on_device)
    assert can_dispatch_to_masked_fill(True, [None, mask], one, False, p.on_device)
    assert not can_dispatch_to_masked_fill(True, [mask, mask], one, False, p.on_device)     # two masks
    assert not can_dispatch_to_masked_fill(True, [mask], torch.ones(2), False, p.on_device)  # two values
    assert not can_dispatch_to_masked_fill(True, [mask], one, True, p.on_device)            # accumulate
    assert not can_dispatch_to_masked_fill(True, [torch.tensor([True, False])], one, False, p.on_device)  # host mask


def test_bind_arguments_fills_defaults_and_rejects_bad_input():
    x = torch.ones(2)
    a = bind_arguments(aten.histc.default, (x, 4), {})
    assert a["self"] is x and (a["bins"], a["min"], a["max"]) == (4, 0, 0)
    assert bind_arguments(aten.histc.default, (x,), {"max": 2.0})["max"] == 2.0
    a = bind_arguments(aten.repeat_interleave.Tensor, (torch.ones(2, dtype=torch.long),), {"output_size": 3})
    assert a["output_size"] == 3
    with pytest.raises(TypeError, match="OpOverload"):
        bind_arguments(torch.add, (), {})
    with pytest.raises(ValueError, match="positional"):
        bind_arguments(aten.nonzero.default, (1, 2, 3), {})


# ---- emulation and the Python-level layer ------------------------------------------------------------
def test_emulated_tensors_look_like_cuda_to_the_program():
    with SyncDetector(emulate=True) as det:
        x = torch.zeros(3, device="cuda")
        y = torch.empty(2, 2, device=torch.device("cuda", 0))
        z = torch.ones(2).cuda()
        w = x.new_zeros(4)
        assert x.device == torch.device("cuda", 0) and x.is_cuda and y.is_cuda and z.is_cuda and w.is_cuda
        assert not torch.ones(2).is_cuda
        assert x.to("cuda") is x                                        # already there: no copy
        with pytest.raises(TypeError, match="Use Tensor.cpu"):
            x.numpy()
    assert [e.reason for e in det.events] == ["host_to_device"]         # only the .cuda() copy


def test_pinned_non_blocking_copies_do_not_sync_but_blocking_ones_do():
    with SyncDetector(emulate=True) as det:
        host = torch.randn(4).pin_memory()
        assert host.is_pinned()
        a = host.to("cuda", non_blocking=True)
        b = host.to("cuda")
        c = a.to("cpu", non_blocking=True)
        d = b.cpu()
        e = torch.empty(3, pin_memory=True)
        assert e.is_pinned() and not d.is_pinned()
    assert [(ev.api, ev.reason) for ev in det.events] == [("torch.Tensor.to", "host_to_device"),
                                                          ("torch.Tensor.cpu", "device_to_host")]
    assert a.sum() == b.sum() and c.sum() == d.sum()                      # the copies copied


def test_a_training_loop_on_the_emulated_device():
    def train(steps):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to("cuda")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.randn(steps, 4, 8).pin_memory()
        losses = []
        for i in range(steps):
            x = data[i].to("cuda", non_blocking=True)
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())                                  # the one sync per step
        return losses

    with SyncDetector() as det:
        train(3)
    reasons = [e.reason for e in det.implicit()]
    assert reasons == ["host_to_device"] * 4 + ["scalar_read"] * 3      # model.to("cuda"): 4 tensors
    lines = det.count_by_line()
    assert sorted(lines.values()) == [3, 4]                              # the .item() line, the .to line


def test_explicit_synchronize_is_recorded_and_restored():
    real = torch.cuda.synchronize
    with SyncDetector(emulate=True) as det:
        torch.cuda.synchronize()
    assert torch.cuda.synchronize is real
    assert [(e.kind, e.reason) for e in det.events] == [("explicit", "explicit_synchronize")]
    assert det.implicit() == []


def test_without_emulation_a_cpu_program_has_no_syncs():
    def cpu_program():
        x = torch.randn(5)
        x[x > 0] = 0.0
        return x.nonzero(), x.sum().item(), x.tolist()

    assert [e for e in find_syncs(cpu_program, emulate=False) if e.kind == "implicit"] == []


def test_report_and_line_counts():
    with SyncDetector() as det:
        x = torch.randn(3, device="cuda")
        x.sum().item()
        x.sum().item()
    assert sum(det.count_by_line().values()) == 2
    assert "2 implicit sync(s)" in det.report()
    assert SyncDetector().report() == "no host-device syncs"


def test_bad_arguments():
    with pytest.raises(TypeError, match="emulate"):
        SyncDetector(emulate="yes")
    with pytest.raises(TypeError, match="fn must be callable"):
        find_syncs(3)
    with pytest.raises(ValueError, match="n_statements"):
        make_program(0, -1)
    with pytest.raises(TypeError, match="torch.Tensor"):
        Placement().mark_device([1, 2])


# ---- the ground truth, on a GPU ------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("statement", STATEMENTS, ids=lambda s: s.code)
def test_statement_agrees_with_set_sync_debug_mode(statement):
    program = _single(statement)
    assert real_sync_lines(program) == [line for line, _ in program.expected]


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(5))
def test_programs_agree_with_set_sync_debug_mode_on_a_gpu(seed):
    program = make_program(seed, 12)
    expected = [line for line, _ in detected_lines(program, emulate=False)]
    assert real_sync_lines(program) == expected
