"""A recording backend: what Dynamo hands a compiler (torch/_dynamo/backends/debugging.py, torch/_dynamo/testing.py).

``torch.compile(fn, backend=b)`` runs ``fn`` under Dynamo's frame evaluation hook (PEP 523,
torch/csrc/dynamo/eval_frame.c). Dynamo symbolically executes the frame's bytecode
(torch/_dynamo/symbolic_convert.py), records every tensor operation into an FX graph, and at the end
of the frame (or at a graph break) calls the backend **once per captured graph**::

    compiled = backend(gm: torch.fx.GraphModule, example_inputs: list[Tensor | SymInt]) -> callable

The callable replaces the graph from then on; here it is ``gm.forward`` itself (like Dynamo's ``eager``
backend), so the program runs as before and the backend only *watches*. Beside the graph Dynamo builds
**guards** (torch/_dynamo/guards.py): the checks on the frame's inputs under which the compiled code
stays valid (a tensor's dtype, device, sizes, strides and requires_grad; the value of an int or a
bool; the identity of a global function...). They are built after the graph, so the backend never
sees them; ``torch._dynamo.optimize(..., guard_export_fn=...)`` hands them over once per compiled
frame, and ``guard_fail_fn`` reports which guard failed when a cached entry is rejected.

Each compilation has a ``CompileId`` (torch/_guards.py) written ``"frame/attempt"``: ``"0/0"`` is
the first frame's first compilation, ``"0/1"`` a *recompilation* of the same frame after a guard
failed, ``"1/0"`` a new frame, e.g. the resume function Dynamo makes after a graph break. A recording
keeps that id with each graph, so recompilations and graph breaks can be told apart afterwards.
"""
from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx

__all__ = ["GuardRecord", "GraphRecord", "RecordingBackend", "make_recording_backend", "graph_ops", "describe_input"]


@dataclass(frozen=True)
class GuardRecord:
    """One guard as Dynamo exported it: the source it checks, its kind, and the Python it evaluates.

    ``source`` is Dynamo's name for the checked value (``"L['x']"`` a local, ``"G['scale']"`` a global,
    ``""`` for global state such as grad mode); ``kind`` the guard builder's name (``TENSOR_MATCH``,
    ``EQUALS_MATCH``, ``ID_MATCH``, ``TYPE_MATCH``, ``SHAPE_ENV``, ``GRAD_MODE``...); ``code`` the
    checks it compiles to, when Dynamo recorded them (e.g. ``"L['n'] == 3"``).
    """

    source: str
    kind: str
    code: tuple[str, ...] = ()


@dataclass
class GraphRecord:
    """One graph Dynamo captured and handed to the backend."""

    compile_id: str                  # "frame/attempt", e.g. "0/1" = frame 0's first recompilation
    frame_id: int
    attempt: int                     # 0 for a first compilation, k for the k-th recompilation
    graph_module: fx.GraphModule
    example_inputs: list[str]        # "f32[3, s27]", "SymInt s86" ... as traced (symbolic sizes by name)
    ops: list[str]                   # call_function / call_method / call_module targets, in order
    guards: list[GuardRecord] = field(default_factory=list)

    @property
    def is_recompile(self) -> bool:
        return self.attempt > 0

    @property
    def code(self) -> str:
        return self.graph_module.code


_DTYPE_SHORT = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
                torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
                torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128"}


def describe_input(value: Any) -> str:
    """``"f32[3, s0]"`` for a tensor (symbolic sizes by name), ``"SymInt s77"``, or the repr of a constant."""
    if isinstance(value, torch.Tensor):
        dims = ", ".join(str(s) for s in value.shape)
        return f"{_DTYPE_SHORT.get(value.dtype, str(value.dtype))}[{dims}]"
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return f"{type(value).__name__} {value}"
    return repr(value)


def _target_name(node: fx.Node) -> str:
    target = node.target
    if node.op == "call_method":
        return f"Tensor.{target}"
    if node.op == "call_module":
        return f"module {target}"
    if isinstance(target, torch._ops.OpOverload):
        return str(target)                                 # "aten.add.Tensor"
    if target.__module__ == "_operator" or getattr(operator, getattr(target, "__name__", ""), None) is target:
        return f"operator.{target.__name__}"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", None) or repr(target)
    if module.startswith("torch._C._nn"):
        return f"torch.nn.functional.{name}"               # F.gelu is the builtin torch._C._nn.gelu
    if not module or module.startswith("torch._C") or module == "torch":
        return f"torch.{name}"                             # torch.relu: a method of _VariableFunctionsClass
    return f"{module}.{getattr(target, '__qualname__', name)}"


def graph_ops(gm: fx.GraphModule) -> list[str]:
    """The operations of a graph in order, named readably: ``["torch.sin", "operator.mul", "Tensor.sum"]``.

    Placeholders, ``get_attr`` and the output are not operations; everything Dynamo would run is.
    """
    if not isinstance(gm, (fx.GraphModule, fx.Graph)):
        raise TypeError(f"gm must be a torch.fx.GraphModule or Graph, got {type(gm).__name__}")
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    return [_target_name(n) for n in graph.nodes if n.op in ("call_function", "call_method", "call_module")]


def _compile_id() -> tuple[str, int, int]:
    """The CompileId Dynamo is working on now (torch/_guards.py), as ("f/a", f, a)."""
    cid = torch._guards.CompileContext.current_compile_id()
    if cid is None:                                        # called outside Dynamo (e.g. by hand)
        return "?/?", -1, -1
    frame, attempt = cid.frame_id, cid.frame_compile_id
    return f"{frame}/{attempt}", int(frame if frame is not None else -1), int(attempt if attempt is not None else -1)


def _guard_record(guard) -> GuardRecord:
    try:
        kind = guard.create_fn_name()
    except Exception:                                      # pragma: no cover - older Guard objects
        kind = getattr(getattr(guard, "create_fn", None), "__name__", "?")
    code = getattr(guard, "code_list", None) or ()
    return GuardRecord(source=str(guard.name), kind=str(kind), code=tuple(str(c) for c in code))


class RecordingBackend:
    """A Dynamo backend that keeps every graph it is given and runs it unchanged.

    >>> rec = RecordingBackend()
    >>> f = rec.compile(lambda x: x.sin() * 2)
    >>> f(torch.randn(3)); len(rec.graphs), rec.graphs[0].ops
    (1, ['torch.sin', 'operator.mul'])        # doctest: +SKIP (method calls appear as Tensor.sin)

    ``compile`` wraps ``fn`` with ``torch._dynamo.optimize`` so guards are recorded too (each graph gets
    the guards of its frame) and guard failures are kept in ``guard_failures`` (why a cached
    compilation was rejected). Used as ``torch.compile(fn, backend=rec)`` it records graphs only.
    ``inner``, when given, is the backend that really compiles (e.g. ``"inductor"`` or a function).
    """

    def __init__(self, inner: Callable | str | None = None):
        if inner is not None and not (callable(inner) or isinstance(inner, str)):
            raise TypeError(f"inner must be a backend (callable or name), got {type(inner).__name__}")
        self.inner = inner
        self.graphs: list[GraphRecord] = []
        self.guard_failures: list[str] = []
        self._pending_guards: dict[str, list[GuardRecord]] = {}

    # the backend protocol: (GraphModule, example inputs) -> callable
    def __call__(self, gm: fx.GraphModule, example_inputs: list) -> Callable:
        cid, frame, attempt = _compile_id()
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        traced = [n.meta.get("example_value", n.meta.get("val")) for n in placeholders]
        if len(traced) != len(example_inputs) or any(v is None for v in traced):
            traced = list(example_inputs)                  # the real inputs (concrete sizes only)
        record = GraphRecord(compile_id=cid, frame_id=frame, attempt=attempt, graph_module=gm,
                             example_inputs=[describe_input(v) for v in traced], ops=graph_ops(gm))
        self.graphs.append(record)
        if self.inner is None:
            return gm.forward
        if isinstance(self.inner, str):
            from torch._dynamo.backends.registry import lookup_backend

            return lookup_backend(self.inner)(gm, example_inputs)
        return self.inner(gm, example_inputs)

    def _on_guards(self, guards) -> None:
        cid, _, _ = _compile_id()
        records = [_guard_record(g) for g in guards]
        for record in self.graphs:
            if record.compile_id == cid:
                record.guards = records
        self._pending_guards[cid] = records

    def _on_guard_fail(self, failure) -> None:
        first_line = str(getattr(failure, "reason", failure)).splitlines()[0]
        self.guard_failures.append(re.sub(r"\s{2,}#.*$", "", first_line).strip())  # drop the source comment

    def guards_of(self, compile_id: str) -> list[GuardRecord]:
        """The guards Dynamo installed for compilation ``compile_id`` (also frames that made no graph)."""
        if compile_id not in self._pending_guards:
            raise KeyError(f"no guards recorded for compile id {compile_id!r}; known: "
                           f"{sorted(self._pending_guards)}")
        return self._pending_guards[compile_id]

    def compile(self, fn: Callable, *, fullgraph: bool = False, dynamic: bool | None = None) -> Callable:
        """``fn`` compiled by Dynamo with this backend, guards and guard failures recorded."""
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        return torch._dynamo.optimize(self, nopython=fullgraph, dynamic=dynamic,
                                      guard_export_fn=self._on_guards,
                                      guard_fail_fn=self._on_guard_fail)(fn)

    def clear(self) -> None:
        self.graphs.clear()
        self.guard_failures.clear()
        self._pending_guards.clear()

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def recompile_count(self) -> int:
        """Graphs compiled for a frame that had been compiled before (attempt > 0)."""
        return sum(1 for g in self.graphs if g.is_recompile)


def make_recording_backend() -> tuple[Callable, list[fx.GraphModule]]:
    """The smallest useful backend: ``(backend, graphs)``; ``backend`` appends each graph it is given
    to ``graphs`` and returns ``gm.forward``, so the program runs exactly as Dynamo captured it."""
    graphs: list[fx.GraphModule] = []

    def backend(gm: fx.GraphModule, example_inputs: list) -> Callable:
        graphs.append(gm)              # the GraphModule Dynamo built: its graph, code and example values
        return gm.forward              # Dynamo calls this instead of the captured bytecode region

    return backend, graphs

