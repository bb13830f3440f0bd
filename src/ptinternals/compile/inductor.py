"""Reading what Inductor generated: kernels, what each fused, and the library calls
(torch/_inductor/graph.py ``GraphLowering.codegen``, torch/_inductor/codegen/cpp.py and triton.py,
torch/_inductor/scheduler.py).

Inductor lowers each ATen op of the (post-AOTAutograd) graph to a loop body over an index space
(torch/_inductor/lowering.py), then its *scheduler* fuses nodes whose loops can share one pass over
memory: pointwise ops into each other, pointwise ops into the reduction that reads them (and the
reduction's result into the pointwise ops after it, when the loop sizes agree). Matmuls and
convolutions are not generated: they become ``extern_kernels.mm(...)`` calls into the ATen library
(cuBLAS on a GPU, MKL/oneDNN on the CPU), and fusion stops at them.

The result is one Python module, the *output code* (also written by ``TORCH_LOGS=output_code`` and
into the debug folder of ``TORCH_COMPILE_DEBUG=1``). Each generated kernel is defined once at module
level and called from ``call(args)``::

    cpp_fused_add_cos_relu_sin_0 = async_compile.cpp_pybinding([...], r'''<C++ source>''')   # CPU
    triton_poi_fused_add_cos_0 = async_compile.triton('triton_poi_fused_add_cos_0', '''...''')  # GPU

The name lists the ATen ops it fused, sorted (``cpp.descriptive_names = "original_aten"``). On the CPU
one C++ kernel can hold several loop nests (Inductor's "outer loop fusion" puts nests over the same
outer loop in one function), so ``torch._inductor.metrics.generated_kernel_count``, which counts loop
nests generated, can exceed the number of kernel *functions* counted here.
"""
from __future__ import annotations

import contextlib
import functools
import re
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

__all__ = ["KernelDef", "InductorOutput", "compile_and_read", "generate_code", "kernel_defs", "kernel_source",
           "extern_calls", "kernel_ops", "read_kernels"]

_DEF = re.compile(r"^(?P<name>\w+) = async_compile\.(?P<kind>cpp_pybinding|cpp|triton)\(", re.MULTILINE)
_EXTERN = re.compile(r"\bextern_kernels\.(\w+)\(")
_PREFIXES = ("cpp_fused_", "triton_poi_fused_", "triton_per_fused_", "triton_red_fused_", "triton_tem_fused_",
             "triton_fused_")


@dataclass(frozen=True)
class KernelDef:
    name: str                 # e.g. "cpp_fused__softmax_add_relu_sin_sum_0"
    language: str             # "cpp" or "triton"
    ops: tuple[str, ...]      # the ATen ops its name lists, e.g. ("_softmax", "add", "relu", "sin", "sum")


@dataclass
class InductorOutput:
    result: Any               # what the compiled function returned
    code: list[str]           # the output-code module(s), one per compiled graph
    fusion: list[tuple[str, tuple[str, ...]]] | None = None   # (fused name, ATen ops) per kernel, if recorded
    library: list[str] | None = None   # the graph's extern kernels ("extern_kernels.mm"), if recorded
    kernel_names: list[str] | None = None   # the kernels Inductor generated, by its own record, if recorded

    @property
    def kernels(self) -> list[KernelDef]:
        return [k for src in self.code for k in kernel_defs(src)]

    @property
    def extern(self) -> list[str]:
        return [c for src in self.code for c in extern_calls(src)]


@functools.lru_cache(maxsize=1)
def _aten_op_names() -> frozenset[str]:
    names = set()
    for qualified in torch._C._dispatch_get_all_op_names():       # "aten::add.Tensor"
        namespace, _, rest = qualified.partition("::")
        if namespace in ("aten", "prims"):
            names.add(rest.split(".")[0])
    return frozenset(names)


def kernel_ops(name: str) -> tuple[str, ...]:
    """The ATen op names inside an Inductor kernel name (``"cpp_fused_add_cos_0"`` -> ``("add", "cos")``).

    The name is the sorted op names joined by ``_``, and op names contain ``_`` themselves
    (``native_layer_norm``, ``_softmax``), so it is split into known ATen/prims names by dynamic
    programming, preferring the fewest pieces. A name that cannot be split is returned whole.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    body = name
    for prefix in _PREFIXES:
        if body.startswith(prefix):
            body = body[len(prefix):]
            break
    body = re.sub(r"_\d+$", "", body)
    known = _aten_op_names()
    # best[i]: fewest pieces splitting body[:i] at "_" boundaries (a piece may start with "_")
    best: list[tuple[int, tuple[str, ...]] | None] = [None] * (len(body) + 1)
    best[0] = (0, ())
    for i in range(len(body) + 1):
        if best[i] is None:
            continue
        start = i + 1 if i > 0 else 0                               # skip the joining "_"
        if i > 0 and (i >= len(body) or body[i] != "_"):
            continue
        for j in range(start + 1, len(body) + 1):
            piece = body[start:j]
            if piece in known and (j == len(body) or body[j] == "_"):
                cand = (best[i][0] + 1, best[i][1] + (piece,))
                if best[j] is None or cand[0] < best[j][0]:
                    best[j] = cand
    return best[len(body)][1] if best[len(body)] else (body,)


def kernel_defs(code: str) -> list[KernelDef]:
    """The kernels an output-code module defines, in order."""
    if not isinstance(code, str):
        raise TypeError(f"code must be a str (Inductor output code), got {type(code).__name__}")
    return [KernelDef(m["name"], "triton" if m["kind"] == "triton" else "cpp", kernel_ops(m["name"]))
            for m in _DEF.finditer(code)]


def read_kernels(code: str) -> tuple[list[tuple[str, tuple[str, ...]]], list[str]]:
    """``([(kernel name, ATen ops it fused)], [library calls])`` of one output-code module, in order."""
    return [(k.name, k.ops) for k in kernel_defs(code)], extern_calls(code)


def kernel_source(code: str, name: str) -> str:
    """The definition of kernel ``name`` in an output-code module: ``name = async_compile.<kind>(...)`` with
    the kernel's source, which Inductor writes between triple quotes."""
    if not isinstance(code, str) or not isinstance(name, str):
        raise TypeError("code and name must be str")
    m = re.search(rf"^{re.escape(name)} = async_compile\.\w+\(", code, re.MULTILINE)
    if m is None:
        raise ValueError(f"no kernel named {name!r} is defined in this code; it defines "
                         f"{[k.name for k in kernel_defs(code)]}")
    opening = code.index("'''", m.end())
    closing = code.index("'''", opening + 3)
    end = code.find("\n", closing)
    return code[m.start():end if end >= 0 else len(code)]


def extern_calls(code: str) -> list[str]:
    """Library calls (``extern_kernels.mm``, ``addmm``, ``bmm``, ``convolution``...) made by ``call``, in order."""
    if not isinstance(code, str):
        raise TypeError(f"code must be a str (Inductor output code), got {type(code).__name__}")
    return _EXTERN.findall(code)


@contextlib.contextmanager
def _recording_fusion(groups: list):
    """Wrap Inductor's kernel namer (``get_fused_kernel_name``, torch/_inductor/utils.py) so each kernel's
    ATen ops are read from the scheduler nodes' ``origins`` as Inductor generates it."""
    import importlib

    import torch._inductor.config as inductor_config
    from torch._inductor import utils as inductor_utils

    original = inductor_utils.get_fused_kernel_name

    def recording(node_schedule, descriptive_names):
        name = original(node_schedule, descriptive_names)
        ops = sorted({o.meta["original_aten"]._overloadpacket.__name__
                      for o in inductor_utils.aggregate_origins(node_schedule)
                      if o.op == "call_function" and isinstance(o.meta.get("original_aten"), torch._ops.OpOverload)})
        groups.append((name, tuple(ops)))
        return name

    patched = []
    for module_name in ("torch._inductor.codegen.cpp", "torch._inductor.codegen.triton"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:                                   # pragma: no cover - a backend missing
            continue
        if getattr(module, "get_fused_kernel_name", None) is original:
            module.get_fused_kernel_name = recording          # the codegen modules import it by name
            patched.append(module)
    try:
        with inductor_config.patch(fx_graph_cache=False):     # a cache hit would generate nothing
            yield
    finally:
        for module in patched:
            module.get_fused_kernel_name = original


def compile_and_read(fn: Callable, *args: Any, mode: str | None = None, dynamic: bool | None = False,
                     fusion: bool = False, **options) -> InductorOutput:
    """Compile ``fn`` with Inductor, run it on ``args``, and return the result and the output code.

    Dynamo is reset first (``run_and_get_code`` does so), so every compiled function in the process is
    recompiled on its next call; compiled artefacts come from Inductor's on-disk cache when the same
    graph was compiled before (``TORCHINDUCTOR_CACHE_DIR``), which is what makes repeats cheap.
    ``fusion=True`` also records what the scheduler fused into each kernel (``InductorOutput.fusion``),
    from Inductor's own nodes; that needs code generation, so the FX graph cache is skipped for this
    compile (the C++ build is still cached by its source).
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if mode not in (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
        raise ValueError(f"mode must be a torch.compile mode, got {mode!r}")
    from torch._inductor.utils import run_and_get_code

    compiled = torch.compile(fn, mode=mode, dynamic=dynamic, options=options or None)
    groups: list = []
    with _recording_fusion(groups) if fusion else contextlib.nullcontext():
        result, code = run_and_get_code(compiled, *args)
    return InductorOutput(result=result, code=list(code), fusion=groups if fusion else None)


class _CodeWritten(Exception):
    """Raised from ``GraphLowering.codegen`` once the output code exists: nothing is built or run."""


def generate_code(fn: Callable, *args: Any, backend: str = "cpp") -> InductorOutput:
    """The output code Inductor writes for ``fn(*args)`` and what its scheduler fused, without building it.

    Dynamo, AOTAutograd, lowering, fusion and code generation all run; the module is captured where
    ``GraphLowering.codegen`` returns it, and the compile is then abandoned, so no C++ compiler (or
    Triton) runs: about 2 s per small graph instead of 5-40 s. ``backend="triton"`` writes the Triton
    kernels a GPU would get (Inductor's ``cpu_backend="triton"``), also on a machine without one; the
    ``triton`` package must be installed. ``result`` is None: nothing ran. Dynamo is reset first.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if backend not in ("cpp", "triton"):
        raise ValueError(f"backend must be 'cpp' or 'triton', got {backend!r}")
    import torch._inductor.config as inductor_config
    import torch.utils._triton as torch_triton
    from torch._inductor.graph import GraphLowering

    code: list[str] = []
    library: list[str] = []
    names: list[str] = []
    original_codegen = GraphLowering.codegen

    def codegen(graph, *a, **k):
        result = original_codegen(graph, *a, **k)
        code.append(_module_text(result))
        library.extend(str(b.python_kernel_name) for b in graph.buffers
                       if str(getattr(b, "python_kernel_name", "")).startswith("extern_kernels."))
        names.extend(getattr(graph.wrapper_code, "src_to_kernel", {}).values())   # kernels defined, in order
        raise _CodeWritten()

    saved = {name: getattr(torch_triton, name) for name in ("triton_backend", "triton_hash_with_backend")}
    groups: list = []
    torch._dynamo.reset()
    try:
        GraphLowering.codegen = codegen
        if backend == "triton":                              # no driver is needed to *write* Triton code
            torch_triton.triton_backend = lambda: None
            torch_triton.triton_hash_with_backend = lambda: "cpu-codegen-only"
        # vec_isa_ok: trust the CPU's flags for the vector ISA instead of test-building a program per ISA
        # with g++ (tens of seconds in a fresh cache); nothing is built here anyway
        with _recording_fusion(groups), inductor_config.patch({"cpu_backend": backend, "cpp.vec_isa_ok": True}), \
                warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Could not find an active CPU backend")  # we run nothing
            try:
                torch.compile(fn, dynamic=False)(*args)
            except Exception:                                # the abandoned compile, wrapped by Dynamo
                if not code:
                    raise
    finally:
        GraphLowering.codegen = original_codegen
        for name, value in saved.items():
            setattr(torch_triton, name, value)
        torch._dynamo.reset()
    return InductorOutput(result=None, code=code, fusion=groups, library=library, kernel_names=names)


def _module_text(obj) -> str:
    """The module source inside what ``GraphLowering.codegen`` returns (its type varies by release)."""
    if isinstance(obj, str):
        return obj
    if isinstance(obj, (tuple, list)) and obj:
        return _module_text(obj[0])
    for attr in ("value", "source_code", "code"):
        if isinstance(getattr(obj, attr, None), str):
            return getattr(obj, attr)
    return str(obj)
