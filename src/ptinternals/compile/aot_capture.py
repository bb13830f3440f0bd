"""What AOTAutograd decided, captured (torch/_functorch/aot_autograd.py ``aot_function``/``aot_module``,
torch/_functorch/_aot_autograd/graph_compile.py).

``aot_function(fn, fw_compiler, bw_compiler, partition_fn)`` traces ``fn`` and its backward with fake
tensors into one *joint* ATen graph (functionalised: no in-place ops, no views that alias outputs),
hands it to ``partition_fn(joint, joint_inputs, num_fwd_outputs=...)``, which returns a forward and a
backward graph, and compiles each with its compiler (``torch.compile`` does the same with Inductor as
both compilers and the min-cut partitioner). The forward graph returns the real outputs followed by
the tensors it saves for the backward, so the saved set can be read straight off its output node.

:func:`capture_aot` runs ``fn`` once forward and once backward with recording compilers and a
recording partitioner, and returns the joint graph (a copy taken before torch's partitioner touches
it), the forward and backward graphs, and the names of the saved tensors - AOTAutograd's choices,
against which ``partition.min_cut_saved`` is compared.
"""
from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx

from .joint_graph import alias_root, node_bytes

__all__ = ["AOTCapture", "capture_aot", "saved_by_forward", "saved_roots"]


@dataclass
class AOTCapture:
    joint: fx.GraphModule            # the joint graph as the partitioner received it (a copy)
    num_fwd_outputs: int
    forward: fx.GraphModule
    backward: fx.GraphModule
    saved: list[str]                 # tensors the forward saves for the backward (names in the joint graph)

    @property
    def saved_bytes(self) -> int:
        by_name = {n.name: n for n in self.joint.graph.nodes}
        return sum(node_bytes(by_name[s]) for s in self.saved if s in by_name)


def saved_by_forward(forward: fx.GraphModule, num_fwd_outputs: int) -> list[str]:
    """Names of the tensors a partitioned forward graph returns beyond its ``num_fwd_outputs`` outputs
    (symbolic sizes, which a dynamic-shape forward also returns, are left out)."""
    out = next(n for n in forward.graph.nodes if n.op == "output").args[0]
    flat: list = []
    fx.node.map_aggregate(out, flat.append)
    saved = []
    for node in flat[num_fwd_outputs:]:
        if isinstance(node, fx.Node) and not isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat)):
            saved.append(node.name)
    return saved


def saved_roots(joint: fx.GraphModule, names: list[str]) -> set[str]:
    """The storage owners of saved tensors (``t(add)`` -> ``add``): what saving really keeps alive."""
    by_name = {n.name: n for n in joint.graph.nodes}
    missing = [s for s in names if s not in by_name]
    if missing:
        raise ValueError(f"{missing} are not nodes of the joint graph")
    return {alias_root(by_name[s]).name for s in names}


def _partitioner(name_or_fn) -> Callable:
    from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition

    if callable(name_or_fn):
        return name_or_fn
    table = {"min_cut": min_cut_rematerialization_partition, "default": default_partition}
    if name_or_fn not in table:
        raise ValueError(f"partition must be 'min_cut', 'default' or a partition function, got {name_or_fn!r}")
    return table[name_or_fn]


def capture_aot(fn: Callable | torch.nn.Module, *args, partition="min_cut") -> AOTCapture:
    """Trace ``fn(*args)`` with AOTAutograd, run forward and backward once, and return its choices.

    ``fn``: a function of tensors (``aot_function``) or an ``nn.Module`` (``aot_module``: parameters
    become primals too). At least one input or parameter must require grad. Backward is run on the
    sum of every floating-point output, which calls the backward compiler.
    """
    from functorch.compile import aot_function, aot_module, make_boxed_func

    if not callable(fn):
        raise TypeError(f"fn must be a function or an nn.Module, got {type(fn).__name__}")
    partitioner = _partitioner(partition)
    seen: dict = {}

    def partition_fn(joint, joint_inputs, **kwargs):
        with warnings.catch_warnings():               # torch's pytree warns about its own LeafSpec here
            warnings.simplefilter("ignore", FutureWarning)
            seen["joint"] = copy.deepcopy(joint)      # torch's partitioner mutates it (DCE, CSE, tags)
        seen["num_fwd_outputs"] = kwargs["num_fwd_outputs"]
        return partitioner(joint, joint_inputs, **kwargs)

    def compiler(name):
        def record(gm, example_inputs):
            seen[name] = gm
            return make_boxed_func(gm.forward)
        return record

    wrap = aot_module if isinstance(fn, torch.nn.Module) else aot_function
    compiled = wrap(fn, fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                    partition_fn=partition_fn)
    out = compiled(*args)
    flat = [o for o in (out if isinstance(out, (tuple, list)) else (out,))
            if isinstance(o, torch.Tensor) and o.requires_grad]
    if not flat:
        raise ValueError("no output requires grad: give an input (or parameter) with requires_grad=True")
    sum(o.sum() for o in flat).backward()
    if "backward" not in seen:
        raise RuntimeError("AOTAutograd compiled no backward graph: the outputs that need a gradient are "
                           "views of the inputs (AOTAutograd regenerates those at runtime, outside the graph)")
    n = seen["num_fwd_outputs"]
    return AOTCapture(joint=seen["joint"], num_fwd_outputs=n, forward=seen["forward"],
                      backward=seen["backward"], saved=saved_by_forward(seen["forward"], n))
