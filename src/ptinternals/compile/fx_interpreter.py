"""An FX Interpreter subclass that finds where a NaN or inf first appears (torch/fx/interpreter.py).

``torch.fx.Interpreter`` is the graph's reference executor: every pass that needs *values* (shape
propagation, profiling per op, numerical debugging, quantisation calibration) subclasses it and
overrides a hook. The hooks, in the order a node meets them: ``run_node(n)`` -> the method named
after ``n.op`` (``call_function(target, args, kwargs)``, ``call_method``, ``call_module``...).
Overriding ``run_node`` sees every node with its result; overriding ``call_function`` changes what a
call does (e.g. swap an op for another, as a *Transformer* does when it builds a new graph).

:class:`NonFiniteLocator` runs a graph and stops at the first node whose output holds a NaN or an
inf while all of that node's tensor inputs were finite: the op that *made* the bad value, not the
last of the ops that carried it (``torch.autograd.detect_anomaly`` does the same for backward).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch.fx import Interpreter
from torch.fx.node import map_aggregate

__all__ = ["NonFiniteFound", "NonFiniteLocator", "first_non_finite"]


@dataclass
class NonFiniteFound:
    node: str                  # the node's name in the graph, e.g. "log"
    op: str                    # what it runs, e.g. "torch.log" / "Tensor.sqrt"
    nan: int                   # NaN elements in its output
    inf: int                   # +-inf elements in its output


def _tensors(value: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    map_aggregate(value, lambda v: found.append(v) if isinstance(v, torch.Tensor) else None)
    return found


def _all_finite(value: Any) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in _tensors(value) if t.is_floating_point() or t.is_complex())


class NonFiniteLocator(Interpreter):
    """Run the graph; ``found`` is the first node that turned finite inputs into a NaN/inf, or None."""

    def __init__(self, gm: fx.GraphModule):
        if not isinstance(gm, fx.GraphModule):
            raise TypeError(f"gm must be a torch.fx.GraphModule, got {type(gm).__name__}")
        super().__init__(gm)
        self.found: NonFiniteFound | None = None

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if self.found is None and n.op not in ("placeholder", "output", "get_attr") and not _all_finite(result):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            if _all_finite((args, kwargs)):                 # the bad value was born here
                from .backends import graph_ops

                bad = [t for t in _tensors(result) if t.is_floating_point() or t.is_complex()]
                op = graph_ops(_single_node_graph(n))[0]
                self.found = NonFiniteFound(node=n.name, op=op,
                                            nan=sum(int(torch.isnan(t).sum()) for t in bad),
                                            inf=sum(int(torch.isinf(t).sum()) for t in bad))
        return result


def _single_node_graph(n: fx.Node) -> fx.Graph:
    g = fx.Graph()
    g.node_copy(n, lambda _: None)
    return g


def first_non_finite(gm: fx.GraphModule, *args: Any) -> NonFiniteFound | None:
    """Where did the first NaN/inf come from when running ``gm(*args)``? None if nothing went wrong
    (or if an input was already non-finite and every op just carried it along)."""
    locator = NonFiniteLocator(gm)
    locator.run(*args)
    return locator.found
