"""Shape propagation with an FX Interpreter (torch/fx/passes/shape_prop.py ``ShapeProp``,
torch/fx/passes/fake_tensor_prop.py ``FakeTensorProp``).

``torch.fx.Interpreter`` runs a graph node by node: ``run_node`` fetches the node's arguments from
its environment (the values computed so far), dispatches on ``node.op`` to ``placeholder``,
``call_function``, ``call_method``, ``call_module``, ``get_attr`` or ``output``, and stores the
result. A pass that needs every intermediate's shape only has to override ``run_node`` and write down
what it saw. Run on real tensors it costs a full forward; run on **fake tensors**
(``FakeTensorMode``: tensors with shape, dtype, strides and device but no data, whose ops only run
their meta functions) it costs almost nothing, for any size - the way Dynamo, AOTAutograd and Inductor
propagate shapes.

Each node gets ``node.meta["shape_prop"]``, a :class:`TensorInfo`, for tensor results (``None`` for
anything else). Nodes returning a tuple of tensors (``torch.split``, ``max(dim)``) get a tuple of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch.fx import Interpreter

__all__ = ["TensorInfo", "ShapeProp", "propagate_shapes"]


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...]
    requires_grad: bool

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        """Bytes of the elements the tensor covers (numel x itemsize), as torch's partitioner counts them."""
        return self.numel * self.dtype.itemsize

    @classmethod
    def of(cls, t: torch.Tensor) -> "TensorInfo":
        return cls(tuple(int(s) for s in t.shape), t.dtype, tuple(int(s) for s in t.stride()), bool(t.requires_grad))


def _info(value: Any):
    if isinstance(value, torch.Tensor):
        return TensorInfo.of(value)
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return tuple(TensorInfo.of(v) for v in value)
    return None


class ShapeProp(Interpreter):
    """Run a GraphModule and record each node's :class:`TensorInfo` in ``node.meta["shape_prop"]``.

    ``fake=True`` runs under ``FakeTensorMode``: real inputs are converted to fake ones first, so no
    arithmetic happens and huge shapes cost nothing (ops without a meta kernel would fail there).
    """

    def __init__(self, gm: fx.GraphModule, fake: bool = False):
        if not isinstance(gm, fx.GraphModule):
            raise TypeError(f"gm must be a torch.fx.GraphModule, got {type(gm).__name__}")
        super().__init__(gm)
        self.fake = bool(fake)

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)                   # the real (or fake) value of this node
        n.meta["shape_prop"] = _info(result)
        return result

    def propagate(self, *args: Any) -> Any:
        """Run the graph on ``args`` (tensors or other values, one per placeholder)."""
        n_inputs = sum(1 for n in self.graph.nodes if n.op == "placeholder")
        if len(args) != n_inputs:
            raise ValueError(f"the graph has {n_inputs} inputs, got {len(args)} args")
        if not self.fake:
            return self.run(*args)
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        with mode:
            return self.run(*fake_args)


def propagate_shapes(gm: fx.GraphModule, *args: Any, fake: bool = False) -> dict[str, Any]:
    """``{node name: TensorInfo | tuple | None}`` for every node except the output."""
    ShapeProp(gm, fake=fake).propagate(*args)
    return {n.name: n.meta.get("shape_prop") for n in gm.graph.nodes if n.op != "output"}
