"""Random FX graphs for the FX pass tests: the chapter's own graph family (``workloads.fx_graph``: torch-level
ops as Dynamo and ``symbolic_trace`` record them, some results unused, some repeated, and ``gelu(x + b)``
often enough to give the pattern matcher work), drawn with hypothesis."""
from __future__ import annotations

from hypothesis import strategies as st

from ptinternals.compile.workloads import fx_graph as build_graph
from ptinternals.compile.workloads import fx_inputs as inputs

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


__all__ = ["STEPS", "graph_specs", "build_graph", "inputs"]
