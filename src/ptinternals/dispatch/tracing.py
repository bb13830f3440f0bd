"""Record the ATen-level graph of a forward and backward pass with a TorchDispatchMode.

The idea behind ``torch/fx/experimental/proxy_tensor.py`` (``make_fx``, ``ProxyTorchDispatchMode``) and
AOTAutograd, without proxies: every op that reaches ``__torch_dispatch__`` becomes a node whose
arguments point at the nodes that produced them. Tensor identity is the link - each output tensor is
remembered (weakly, ``torch.utils.weak.WeakIdKeyDictionary``) as "produced by node n", so a later op
taking that tensor gets an edge to n. Tensors the graph never produced become placeholders (inputs,
parameters, constants). The backward pass traces the same way: the autograd engine's kernels are ATen
ops too. ``AtenGraph.to_fx()`` turns the record into a runnable ``torch.fx.GraphModule``.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._mode_utils import no_dispatch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.weak import WeakIdKeyDictionary


@dataclass(frozen=True)
class Ref:
    """An argument that is the ``index``-th tensor output of node ``node`` (index None: its only output)."""

    node: str
    index: int | None = None

    def __str__(self) -> str:
        return f"%{self.node}" if self.index is None else f"%{self.node}[{self.index}]"


@dataclass
class Node:
    name: str
    op: str                    # "placeholder" | "call_function" | "output"
    target: object             # an OpOverload for call_function; the input's name for placeholder
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    shapes: tuple = ()         # shapes of the tensor outputs
    dtypes: tuple = ()
    phase: str = "forward"     # "forward" | "backward"

    def __str__(self) -> str:
        def fmt(a):
            if isinstance(a, (list, tuple)):
                inner = ", ".join(fmt(x) for x in a)
                return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
            return str(a)

        meta = ", ".join(f"{d}{list(s)}" for s, d in zip(self.shapes, self.dtypes, strict=True))
        if self.op == "placeholder":
            return f"%{self.name} : {meta} = placeholder[target={self.target}]"
        if self.op == "output":
            return f"return {fmt(self.args[0])}"
        args = ", ".join([fmt(a) for a in self.args] + [f"{k}={fmt(v)}" for k, v in self.kwargs.items()])
        return f"%{self.name} : {meta} = {self.target}({args})"


class AtenGraph:
    def __init__(self):
        self.nodes: list[Node] = []
        self.constants: dict[str, torch.Tensor] = {}  # placeholders we made up: tensors to feed on replay
        self.values: dict[str, torch.Tensor] = {}     # every placeholder's traced value (detached)
        self._names: Counter = Counter()

    def fresh_name(self, base: str) -> str:
        base = base.replace(".", "_")
        n = self._names[base]
        self._names[base] += 1
        return base if n == 0 else f"{base}_{n}"

    def example_inputs(self) -> list[torch.Tensor]:
        """The traced placeholder values, in placeholder order: ``graph.to_fx()(*graph.example_inputs())``."""
        return [self.values[n.name] for n in self.placeholders()]

    def placeholders(self) -> list[Node]:
        return [n for n in self.nodes if n.op == "placeholder"]

    def calls(self, phase: str | None = None) -> list[Node]:
        return [n for n in self.nodes if n.op == "call_function" and (phase is None or n.phase == phase)]

    def op_names(self, phase: str | None = None) -> list[str]:
        return [str(n.target) for n in self.calls(phase)]

    def __str__(self) -> str:
        lines, phase = ["graph():"], None
        for n in self.nodes:
            if n.op == "call_function" and n.phase != phase:
                phase = n.phase
                lines.append(f"    # --- {phase} ---")
            lines.append("    " + str(n))
        return "\n".join(lines)

    def to_fx(self) -> torch.fx.GraphModule:
        """A runnable GraphModule: its placeholders are this graph's, in order (constants included)."""
        g = torch.fx.Graph()
        env: dict[str, torch.fx.Node] = {}

        def lookup(a):
            if isinstance(a, Ref):
                node = env[a.node]
                return node if a.index is None else g.call_function(_getitem, (node, a.index))
            return a

        for n in self.nodes:
            if n.op == "placeholder":
                env[n.name] = g.placeholder(n.name)
            elif n.op == "call_function":
                env[n.name] = g.call_function(n.target, tree_map(lookup, n.args), tree_map(lookup, n.kwargs))
            else:
                g.output(tree_map(lookup, n.args[0]))
        g.lint()
        return torch.fx.GraphModule(torch.nn.Module(), g)


def _getitem(x, i):
    return x[i]


class AtenTracer(TorchDispatchMode):
    """``with AtenTracer() as tr: ...`` records ``tr.graph``. Name inputs first with ``tr.input(t, name)``;
    unnamed tensors the graph did not produce become placeholders ``const``, ``const_1``... whose values
    are kept in ``graph.constants``. Set ``tr.phase = "backward"`` before calling ``.backward()``."""

    def __init__(self):
        super().__init__()
        self.graph = AtenGraph()
        self.phase = "forward"
        self._producer = WeakIdKeyDictionary()  # tensor -> Ref

    def input(self, t: torch.Tensor, name: str) -> Ref:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"input {name!r} must be a tensor, got {type(t).__name__}")
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"name must be a Python identifier, got {name!r}")
        if t in self._producer:
            return self._producer[t]
        node = Node(self.graph.fresh_name(name), "placeholder", name, shapes=(tuple(t.shape),),
                    dtypes=(_dt(t),))
        self.graph.nodes.append(node)
        with no_dispatch():  # keep our own bookkeeping out of the graph
            self.graph.values[node.name] = t.detach()
        self._producer[t] = Ref(node.name)
        return self._producer[t]

    def ref(self, x):
        if isinstance(x, torch.Tensor):
            if x not in self._producer:
                ref = self.input(x, "const")
                self.graph.constants[ref.node] = self.graph.values[ref.node]
            return self._producer[x]
        return x

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        ref_args, ref_kwargs = tree_map(self.ref, args), tree_map(self.ref, kwargs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        tensors = [o for o in outs if isinstance(o, torch.Tensor)]
        node = Node(self.graph.fresh_name(func._overloadpacket.__name__), "call_function", func,
                    tuple(ref_args), dict(ref_kwargs), tuple(tuple(t.shape) for t in tensors),
                    tuple(_dt(t) for t in tensors), self.phase)
        self.graph.nodes.append(node)
        if isinstance(out, torch.Tensor):
            self._producer[out] = Ref(node.name)  # an in-place op re-points its tensor at the new node
        else:
            for i, o in enumerate(outs):
                if isinstance(o, torch.Tensor):
                    self._producer[o] = Ref(node.name, i)
        return out

    def output(self, *values) -> None:
        self.graph.nodes.append(Node("output", "output", "output", (tuple(self.ref(v) for v in values),)))


class GraphTracer(AtenTracer):
    """The tracer of the chapter's exercise, as an ``AtenTracer``: ``placeholder(t, name)`` names an input,
    ``output(*values)`` ends the graph, and ``nodes`` lists ``(name, target, args, kwargs)`` tuples, where
    ``target`` is ``"placeholder"``, ``"constant"`` (``args = (tensor,)``: a tensor the graph neither made
    nor took as an input), an ``OpOverload``, or ``"output"`` (``args``: the Refs of the returned values)."""

    def placeholder(self, t: torch.Tensor, name: str) -> None:
        self.input(t, name)

    @property
    def nodes(self) -> list[tuple]:
        out = []
        for n in self.graph.nodes:
            if n.op == "placeholder" and n.name in self.graph.constants:
                out.append((n.name, "constant", (self.graph.constants[n.name],), {}))
            elif n.op == "placeholder":
                out.append((n.name, "placeholder", (), {}))
            elif n.op == "call_function":
                out.append((n.name, n.target, n.args, n.kwargs))
            else:
                out.append((n.name, "output", tuple(n.args[0]), {}))
        return out


def _dt(t: torch.Tensor) -> str:
    short = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
             torch.int64: "i64", torch.int32: "i32", torch.bool: "b8", torch.int8: "i8"}
    return short.get(t.dtype, str(t.dtype))


def _identifier(name: str) -> str:
    """``"0.weight"`` -> ``"p0_weight"``: parameter paths as placeholder names."""
    name = name.replace(".", "_")
    return name if name.isidentifier() else "p" + name


def trace_forward_backward(fn, *inputs, params: dict[str, torch.Tensor] | None = None,
                           names: list[str] | None = None) -> AtenGraph:
    """Trace ``loss = fn(*inputs)`` and ``loss.backward()`` into one ATen graph.

    ``params``: named tensors used inside ``fn`` (e.g. ``dict(model.named_parameters())``); they and the
    inputs become placeholders. The output node returns ``(loss, grad of each input/param that requires
    grad)``, in placeholder order. ``loss`` must be a scalar."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if names is not None and len(names) != len(inputs):
        raise ValueError(f"names has {len(names)} entries for {len(inputs)} inputs")
    params = dict(params or {})
    for i, t in enumerate(inputs):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"inputs[{i}] must be a tensor, got {type(t).__name__}")
    named = [(names[i] if names else f"x{i}" if len(inputs) > 1 else "x", t) for i, t in enumerate(inputs)]
    named += [(_identifier(k), p) for k, p in params.items()]
    leaves = [t for _, t in named if t.requires_grad]
    saved = [t.grad for t in leaves]
    for t in leaves:
        t.grad = None
    try:
        with AtenTracer() as tr:
            for name, t in named:
                tr.input(t, name)
            loss = fn(*inputs)
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise ValueError("fn must return a scalar tensor (the loss)")
            tr.phase = "backward"
            loss.backward()
            grads = [t.grad for t in leaves]
            tr.output(loss, *[g for g in grads if g is not None])
    finally:
        for t, g in zip(leaves, saved, strict=True):
            t.grad = g
    return tr.graph
