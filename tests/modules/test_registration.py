"""Registration: random sequences of attribute operations give torch's state and torch's errors."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ptinternals.checks.modules import OP_NAMES, VALUE_KINDS, WHATS
from ptinternals.checks.probes import modules as P
from ptinternals.checks.probes.modules import describe
from ptinternals.modules import MiniModule

from .strategies import outcome

OPS = st.tuples(st.sampled_from(WHATS), st.sampled_from(OP_NAMES), st.sampled_from(VALUE_KINDS), st.booleans())


def apply_op(module, world, op, k):
    """The probe's operation, judged with the error's message too (the probe compares types only)."""
    return outcome(P.op_call(module, world, op, k))


def snapshot(module) -> dict:
    return {**P.snapshot(module), "state_dict": list(module.state_dict())}


@given(st.lists(OPS, min_size=1, max_size=12))
def test_random_operations_match_torch(ops):
    t, m = type("Model", (torch.nn.Module,), {})(), type("Model", (MiniModule,), {})()
    for k, op in enumerate(ops):
        got_t = apply_op(t, torch.nn.Module, op, k)
        got_m = apply_op(m, MiniModule, op, k)
        assert got_m == got_t, f"op {k}: {op}"
        assert snapshot(m) == snapshot(t), f"after op {k}: {op}"


class EarlyTorch(torch.nn.Module):
    def __init__(self, kind):
        if kind == "parameter":
            self.w = torch.nn.Parameter(torch.ones(1))
        elif kind == "module":
            self.c = torch.nn.Module()
        else:
            self.register_buffer("b", torch.ones(1))
        super().__init__()


class EarlyMini(MiniModule):
    def __init__(self, kind):
        if kind == "parameter":
            self.w = torch.nn.Parameter(torch.ones(1))
        elif kind == "module":
            self.c = MiniModule()
        else:
            self.register_buffer("b", torch.ones(1))
        super().__init__()


@pytest.mark.parametrize("kind", ["parameter", "module", "buffer"])
def test_assignment_before_init_is_torch_error(kind):
    assert outcome(lambda: EarlyMini(kind)) == outcome(lambda: EarlyTorch(kind))


def test_plain_tensor_attribute_is_invisible():
    m = MiniModule()
    m.cache = torch.ones(3)  # not a Parameter, not a Buffer: a plain attribute
    assert "cache" in vars(m) and list(m.state_dict()) == [] and list(m.buffers()) == []
    m.to(torch.float64)
    assert m.cache.dtype == torch.float32  # .to() never saw it
    # torch refuses to turn the plain attribute into a buffer in place (KeyError), and so do we...
    t = torch.nn.Module()
    t.cache = torch.ones(3)
    assert outcome(lambda: setattr(m, "cache", torch.nn.Buffer(torch.ones(3)))) == \
        outcome(lambda: setattr(t, "cache", torch.nn.Buffer(torch.ones(3))))
    del m.cache  # ...until it is deleted
    m.cache = torch.nn.Buffer(torch.ones(3))
    assert "cache" not in vars(m) and list(m.state_dict()) == ["cache"]


def test_parameter_slot_refuses_plain_tensor():
    t, m = torch.nn.Linear(2, 2), MiniModule()
    m.weight = torch.nn.Parameter(torch.ones(2, 2))
    assert outcome(lambda: setattr(m, "weight", torch.ones(2, 2))) == \
        outcome(lambda: setattr(t, "weight", torch.ones(2, 2)))


def test_get_submodule_parameter_buffer_errors_match_torch():
    def make(world):
        cls = type("Model", (world,), {})
        root = cls()
        root.add_module("child", cls())
        root.child.w = torch.nn.Parameter(torch.ones(1))
        root.child.register_buffer("b", torch.ones(1))
        root.child.plain = 3
        return root

    t, m = make(torch.nn.Module), make(MiniModule)
    for call in ("get_submodule", "get_parameter", "get_buffer"):
        for target in ["child", "child.w", "child.b", "child.plain", "nope", "child.nope", "child.w.x", ""]:
            got_t = outcome(lambda c=call, x=target: describe(getattr(t, c)(x)))
            got_m = outcome(lambda c=call, x=target: describe(getattr(m, c)(x)))
            assert got_m == got_t, (call, target)


def test_delattr_removes_from_the_right_table():
    m = MiniModule()
    m.register_buffer("b", torch.ones(1), persistent=False)
    del m.b
    assert "b" not in m._buffers and "b" not in m._non_persistent_buffers_set
    with pytest.raises(AttributeError):
        del m.nothing
