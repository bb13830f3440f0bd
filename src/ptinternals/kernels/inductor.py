"""Reading the kernels ``torch.compile`` writes (torch/_inductor/codegen/triton.py).

Inductor lowers a captured graph to loops, fuses what it can, and on a GPU prints each fused group
as a Triton kernel into a Python module (the "output code", also dumped by ``TORCH_LOGS=output_code``).
Kernel names say what kind of loop it is: ``triton_poi_`` pointwise, ``triton_red_`` a reduction
that loops over blocks, ``triton_per_`` a *persistent* reduction whose whole row fits one block (like
``fused_softmax.softmax_kernel``), ``triton_tem_`` a template such as a matmul; then ``fused_`` and
the aten ops it fused. On the CPU Inductor writes C++ (``cpp_fused_...``) instead: the same helpers
return that code, and :func:`triton_kernel_names` finds no Triton kernels in it.
"""
from __future__ import annotations

import re
from typing import Callable

_KERNEL_DEF = re.compile(r"^def (triton_\w+)\(", re.MULTILINE)


def generated_code(fn: Callable, *args) -> list[str]:
    """Compile ``fn`` with Inductor, run it on ``args`` and return the source of the module(s) it wrote."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    import torch
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()                      # compile afresh, so the code is produced (not cached)
    _, sources = run_and_get_code(torch.compile(fn), *args)
    return list(sources)


def _code_text(obj) -> str:
    """The module source inside whatever ``GraphLowering.codegen`` returned (it varies by version)."""
    if isinstance(obj, str):
        return obj
    if isinstance(obj, (tuple, list)) and obj:
        return _code_text(obj[0])
    for attr in ("value", "source_code", "code"):
        if isinstance(getattr(obj, attr, None), str):
            return getattr(obj, attr)
    return str(obj)


def generated_triton_code(fn: Callable, *args) -> list[str]:
    """The Triton code Inductor writes for ``fn(*args)``, with or without a GPU.

    On CUDA this is :func:`generated_code`. On the CPU Inductor writes C++ unless
    ``torch._inductor.config.cpu_backend = "triton"``; then it writes Triton kernels for the CPU, but
    loading them needs a Triton CPU driver ("0 active drivers" here). So the code is captured where
    ``GraphLowering.codegen`` returns it, before anything is compiled, and the run is abandoned.
    Should a torch version move those internals, this falls back to the C++ code.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    import torch

    if torch.cuda.is_available():
        return generated_code(fn, *args)
    import torch._inductor.config as inductor_config
    import torch.utils._triton as torch_triton
    from torch._inductor.graph import GraphLowering

    class _Captured(Exception):
        pass

    captured: list[str] = []
    original_codegen = GraphLowering.codegen
    saved = {name: getattr(torch_triton, name) for name in ("triton_backend", "triton_hash_with_backend")}

    def codegen(self, *a, **k):
        captured.append(_code_text(original_codegen(self, *a, **k)))
        raise _Captured()

    torch._dynamo.reset()
    try:
        GraphLowering.codegen = codegen
        torch_triton.triton_backend = lambda: None          # no driver: the backend only feeds a cache key
        torch_triton.triton_hash_with_backend = lambda: "cpu-interpret"
        with inductor_config.patch(cpu_backend="triton"):
            torch.compile(fn)(*args)
    except Exception:
        if not captured:
            return generated_code(fn, *args)
    finally:
        GraphLowering.codegen = original_codegen
        for name, value in saved.items():
            setattr(torch_triton, name, value)
        torch._dynamo.reset()
    return captured or generated_code(fn, *args)


def triton_kernel_names(source: str) -> list[str]:
    """Names of the ``@triton.jit`` kernels defined in Inductor output code, in order."""
    if not isinstance(source, str):
        raise TypeError(f"source must be a str, got {type(source).__name__}")
    return _KERNEL_DEF.findall(source)


def triton_kernel_source(source: str, name: str) -> str:
    """The text of kernel ``name`` from Inductor output code, from its decorators to its last line."""
    names = triton_kernel_names(source)
    if name not in names:
        raise ValueError(f"no kernel named {name!r} in this code; it defines {names}")
    lines = source.splitlines()
    def_line = next(i for i, line in enumerate(lines) if line.startswith(f"def {name}("))
    start = def_line
    if start > 0 and lines[start - 1].startswith("@triton.jit"):
        start -= 1                                # the decorator, not Inductor's heuristics above it
    end = def_line + 1
    while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end].strip()):
        end += 1                                  # the indented body (blank lines included)
    return "\n".join(lines[start:end]).rstrip()
