"""Random FX graphs built node by node, for the FX pass tests: torch-level ops as Dynamo and
``symbolic_trace`` record them, some results unused (dead code), some repeated (common
subexpressions), and ``gelu(x + b)`` often enough to give the pattern matcher work."""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F
from hypothesis import strategies as st

STEPS = ("sin", "relu", "add", "add_bias", "mul2", "mul2f", "gelu", "gelu_bias", "sum", "exp")


@st.composite
def graph_specs(draw, max_steps: int = 9):
    n_steps = draw(st.integers(0, max_steps))
    steps = []
    for k in range(n_steps):
        op = draw(st.sampled_from(STEPS))
        steps.append((op, draw(st.integers(0, k)), draw(st.integers(0, k))))   # value 0 is the input x
    n_values = n_steps + 1
    outputs = draw(st.lists(st.integers(0, n_values - 1), min_size=1, max_size=3, unique=True))
    return tuple(steps), tuple(outputs)


def build_graph(spec) -> fx.GraphModule:
    """x (4, 6) and bias b (6,) as inputs; each step appends one value (two nodes for *_bias/gelu_bias)."""
    steps, outputs = spec
    g = fx.Graph()
    x, b = g.placeholder("x"), g.placeholder("b")
    values = [x]
    for op, i, j in steps:
        a = values[i]
        if op in ("sin", "exp"):
            v = g.call_function(getattr(torch, op), (a,))
        elif op == "relu":
            v = g.call_function(torch.relu, (a,))
        elif op == "add":
            v = g.call_function(operator.add, (a, values[j]))
        elif op == "add_bias":
            v = g.call_function(operator.add, (a, b))
        elif op == "mul2":
            v = g.call_function(operator.mul, (a, 2))
        elif op == "mul2f":
            v = g.call_function(operator.mul, (a, 2.0))
        elif op == "gelu":
            v = g.call_function(F.gelu, (a,))
        elif op == "gelu_bias":
            v = g.call_function(F.gelu, (g.call_function(operator.add, (a, b)),))
        elif op == "sum":
            v = g.call_method("sum", (a, -1), {"keepdim": True})
        values.append(v)
    g.output(tuple(values[k] for k in outputs))
    return fx.GraphModule(torch.nn.Module(), g)


def inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(4, 6, generator=gen), torch.randn(6, generator=gen)
