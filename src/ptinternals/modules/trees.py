"""Module trees from plain data: the same tree built on ``torch.nn.Module`` and on ``MiniModule``.

The chapter compares the reference (and, later, students' modules) with real torch on *generated*
trees. A tree is described once, as JSON-like data, and built on any base class with
``build_tree(spec, base)``; two builds with the same ``seed`` hold equal values, class names and
registration order, so every walk, checkpoint, hook order and gradient can be compared one for one.

Spec (every list in registration order)::

    {"dim": D,                                          # features: x is (batch, D)
     "params":  [{"shape": [D, D] | [D] | [], "requires_grad": bool}, ...],   # the tensors
     "buffers": [{"shape": [D] | [], "dtype": "float32" | "int64"}, ...],
     "nodes": [                                          # nodes[0] is the root
        {"cls": "Block",
         "params":   [[local_name, index into params | None], ...],      # same index twice: tied
         "buffers":  [[local_name, index into buffers | None, persistent], ...],
         "children": [[local_name, index into nodes | None], ...]},   # same index twice: shared; no cycles
        ...]}

The forward of every built node, for ``x`` of shape ``(batch, D)``: for each own parameter ``p``,
``x = x @ p`` if ``p`` is ``(D, D)`` else ``x * p``; for each own float buffer ``b``, ``x = x + b``; in
training mode each int64 buffer counts calls (``b.add_(1)``, like ``num_batches_tracked``); then
``x = child(x)`` for each child, through ``__call__``. None slots are skipped everywhere.
"""
from __future__ import annotations

import torch

__all__ = ["build_tree", "validate_spec", "example_spec"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64}


def _tree_forward(self, x):
    for p in self._parameters.values():
        if p is not None:
            x = x @ p if p.dim() == 2 else x * p  # (B, D) @ (D, D) | (B, D) * (D,) | (B, D) * ()
    for b in self._buffers.values():
        if b is None:
            continue
        if b.is_floating_point():
            x = x + b
        elif self.training:
            b.add_(1)  # a call counter: state that changes in forward, only in training
    for child in self._modules.values():
        if child is not None:
            x = child(x)
    return x


def _err(path: str, what: str, value) -> ValueError:
    return ValueError(f"spec{path} {what}, got {value!r}")


def validate_spec(spec) -> None:
    """Raise ValueError/TypeError naming the first bad entry of ``spec``."""
    if not isinstance(spec, dict):
        raise TypeError(f"spec must be a dict, got {type(spec).__name__}")
    for key in ("dim", "params", "buffers", "nodes"):
        if key not in spec:
            raise ValueError(f"spec is missing the key {key!r}")
    dim = spec["dim"]
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
        raise _err("['dim']", "must be an int >= 0", dim)
    for i, p in enumerate(spec["params"]):
        if not isinstance(p, dict) or list(p.get("shape", "?")) not in ([dim, dim], [dim], []):
            raise _err(f"['params'][{i}]", f"must be {{'shape': [D, D] | [D] | [], 'requires_grad': bool}} with D={dim}", p)
        if not isinstance(p.get("requires_grad"), bool):
            raise _err(f"['params'][{i}]['requires_grad']", "must be a bool", p.get("requires_grad"))
    for i, b in enumerate(spec["buffers"]):
        if not isinstance(b, dict) or list(b.get("shape", "?")) not in ([dim], []) or b.get("dtype") not in _DTYPES:
            raise _err(f"['buffers'][{i}]", f"must be {{'shape': [D] | [], 'dtype': one of {sorted(_DTYPES)}}}", b)
    nodes = spec["nodes"]
    if not isinstance(nodes, list) or not nodes:
        raise _err("['nodes']", "must be a non-empty list", nodes)
    for n, node in enumerate(nodes):
        where = f"['nodes'][{n}]"
        if not isinstance(node, dict) or not isinstance(node.get("cls"), str) or not node["cls"].isidentifier():
            raise _err(where, "must be a dict whose 'cls' is an identifier", node)
        names = set()
        for kind, table, width in (("params", spec["params"], 2), ("buffers", spec["buffers"], 3),
                                   ("children", nodes, 2)):
            for k, entry in enumerate(node.get(kind, [])):
                if not isinstance(entry, (list, tuple)) or len(entry) != width:
                    raise _err(f"{where}['{kind}'][{k}]", f"must be a list of {width} items", entry)
                name, index = entry[0], entry[1]
                if not isinstance(name, str) or name == "" or "." in name or name in names:
                    raise _err(f"{where}['{kind}'][{k}][0]", "must be a new non-empty name without '.' in this node",
                               name)
                names.add(name)
                if index is None:
                    continue
                if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(table):
                    raise _err(f"{where}['{kind}'][{k}][1]", f"must be None or an index in [0, {len(table)})", index)
                if kind == "buffers" and not isinstance(entry[2], bool):
                    raise _err(f"{where}['buffers'][{k}][2]", "(persistent) must be a bool", entry[2])
    _check_acyclic(nodes)


def _check_acyclic(nodes: list) -> None:
    """A module may not contain itself (forward would recurse forever): depth-first search for a back edge."""
    state = [0] * len(nodes)  # 0 unseen, 1 on the current path, 2 done

    def visit(n: int, path: list) -> None:
        state[n] = 1
        for _, child in nodes[n].get("children", []):
            if child is None:
                continue
            if state[child] == 1:
                cycle = " -> ".join(str(i) for i in path + [n, child])
                raise ValueError(f"spec['nodes'] has a cycle ({cycle}): a module cannot contain itself")
            if state[child] == 0:
                visit(child, path + [n])
        state[n] = 2

    for n in range(len(nodes)):
        if state[n] == 0:
            visit(n, [])


def build_tree(spec: dict, base: type, seed: int = 0, dtype: torch.dtype = torch.float32,
               register: bool = True) -> list:
    """Build ``spec`` on ``base`` (``torch.nn.Module``, ``MiniModule``...); return the node modules.

    ``result[0]`` is the root; ``result[i]`` is the module of ``spec["nodes"][i]``. Float tensors get
    ``dtype`` and values from ``torch.Generator().manual_seed(seed)``, drawn in spec order.
    ``register=False`` writes the state dicts directly (``module._parameters[name] = p``...) instead of
    calling ``register_parameter``/``register_buffer``/``add_module``: for classes that have the
    state dicts but not (yet) the registration methods, like the exercises' ``ModuleState``.
    """
    if not isinstance(register, bool):
        raise TypeError(f"register must be a bool, got {register!r}")
    validate_spec(spec)
    if not isinstance(base, type):
        raise TypeError(f"base must be a class, got {type(base).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    g = torch.Generator().manual_seed(seed)
    params = [_param(p, g, dtype) for p in spec["params"]]
    buffers = []
    for b in spec["buffers"]:
        if _DTYPES[b["dtype"]].is_floating_point:
            buffers.append(torch.randn(b["shape"], generator=g, dtype=dtype))
        else:
            buffers.append(torch.zeros(b["shape"], dtype=_DTYPES[b["dtype"]]))
    classes: dict = {}
    modules = []
    for node in spec["nodes"]:
        cls = classes.get(node["cls"])
        if cls is None:
            cls = classes[node["cls"]] = type(node["cls"], (base,), {"forward": _tree_forward})
        modules.append(cls())
    for node, module in zip(spec["nodes"], modules):
        for name, index in node.get("params", []):
            value = None if index is None else params[index]
            if register:
                module.register_parameter(name, value)
            else:
                module._parameters[name] = value
        for name, index, persistent in node.get("buffers", []):
            value = None if index is None else buffers[index]
            if register:
                module.register_buffer(name, value, persistent=persistent)
            else:
                module._buffers[name] = value
                if not persistent:
                    module._non_persistent_buffers_set.add(name)
    for node, module in zip(spec["nodes"], modules):  # children last: every subtree is complete
        for name, index in node.get("children", []):
            child = None if index is None else modules[index]
            if register:
                module.add_module(name, child)
            else:
                module._modules[name] = child
    return modules


def _param(p: dict, g: torch.Generator, dtype: torch.dtype) -> torch.nn.Parameter:
    """One Parameter of spec entry ``p``: values ~ N(0, 1/D) for matrices (keeps forward values O(1))."""
    shape = list(p["shape"])
    scale = 1.0 / max(shape[0], 1) ** 0.5 if len(shape) == 2 else 1.0
    value = torch.randn(shape, generator=g, dtype=dtype) * scale
    return torch.nn.Parameter(value, requires_grad=p["requires_grad"])


def example_spec() -> dict:
    """A small tree with every feature: a tied weight, a frozen and a None parameter, buffers of each kind,
    a shared block and an empty module. Used by the notebook's figures and demos."""
    return {
        "dim": 3,
        "params": [{"shape": [3, 3], "requires_grad": True},   # 0: tied (embed.weight, head.weight)
                   {"shape": [3], "requires_grad": False},     # 1: frozen
                   {"shape": [3, 3], "requires_grad": True},   # 2: block.proj
                   {"shape": [3], "requires_grad": True}],     # 3: block.scale
        "buffers": [{"shape": [3], "dtype": "float32"},        # 0: running mean (persistent)
                    {"shape": [], "dtype": "int64"},           # 1: call counter (persistent)
                    {"shape": [3], "dtype": "float32"}],       # 2: cache (non-persistent)
        "nodes": [
            {"cls": "Net", "children": [["embed", 1], ["block", 2], ["again", 2], ["empty", 3], ["head", 4]]},
            {"cls": "Embed", "params": [["weight", 0], ["bias", None]]},
            {"cls": "Block", "params": [["proj", 2], ["scale", 3], ["gamma", 1]],
             "buffers": [["running_mean", 0, True], ["steps", 1, True], ["cache", 2, False]]},
            {"cls": "Identity"},
            {"cls": "Head", "params": [["weight", 0]]},
        ],
    }
