"""Compile a kernel for a GPU you do not have: what ``@triton.jit`` does at first launch, done by hand.

``triton.compile`` runs the whole pipeline (Python AST -> Triton IR -> TritonGPU IR -> LLVM IR -> PTX
-> cubin via the ``ptxas`` shipped in the triton wheel) for any ``GPUTarget``, with no driver.
That answers compiled-mode questions on a laptop: how much shared memory a config takes
(``num_stages`` copies of the A and B tiles), how many registers each thread needs and whether any
spill to local memory, and whether ``tl.dot`` became Hopper's ``wgmma`` (SASS ``HGMMA``) or the
older ``mma.sync`` (``HMMA``). It also shows what the interpreter lets slip: ``tl.dot`` on 8 x 8
blocks runs there, and fails here.

Kernels must be plain ``@triton.jit`` functions, i.e. defined with ``TRITON_INTERPRET`` unset or 0:
run this in a process of its own (the tests do). The signature mimics what the launcher would see:
pointers are ``"*fp16"``-style strings (assumed 16-byte aligned), ints equal to 1 become constants
(as Triton specializes them) and ints divisible by 16 are marked so, floats are fp32 scalars, and
``("c", value)`` is a ``tl.constexpr``.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

#: shared memory one thread block may use on sm_90 (227 KiB)
SM90_MAX_SHARED = 232448


@dataclass(frozen=True)
class CompileReport:
    shared_bytes: int        # shared memory per program (pipeline stages of the tiles, scratch)
    registers: int           # per thread (255 is the hardware maximum)
    spill_bytes: int         # local-memory stack frame: > 0 means registers spilled
    sass_counts: dict        # how often some instructions occur: HGMMA (wgmma), HMMA, LDGSTS, LDL, STL

    @property
    def uses_wgmma(self) -> bool:
        return self.sass_counts.get("HGMMA", 0) > 0


def _signature(fn, args: dict):
    sig, consts, attrs = {}, {}, {}
    missing = [a for a in fn.arg_names if a not in args]
    if missing:
        raise ValueError(f"args is missing kernel argument(s) {missing}")
    for i, name in enumerate(fn.arg_names):
        v = args[name]
        if isinstance(v, tuple) and len(v) == 2 and v[0] == "c":
            sig[name], consts[name] = "constexpr", v[1]
        elif isinstance(v, str) and v.startswith("*"):
            sig[name], attrs[(i,)] = v, [["tt.divisibility", 16]]
        elif isinstance(v, bool):
            sig[name] = "i1"
        elif isinstance(v, int):
            if v == 1:
                sig[name], consts[name] = "constexpr", 1
            else:
                sig[name] = "i32" if -(2**31) <= v < 2**31 else "i64"
                if v % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, float):
            sig[name] = "fp32"
        else:
            raise TypeError(f"argument {name!r}: expected '*dtype', int, float or ('c', value), got {v!r}")
    return sig, consts, attrs


def compile_for_gpu(kernel, args: dict, *, num_warps: int = 4, num_stages: int = 3,
                    capability: int = 90) -> CompileReport:
    """Compile ``kernel`` (a ``@triton.jit`` function or an autotuned one) for sm_``capability``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    fn = kernel
    while not isinstance(fn, JITFunction) and hasattr(fn, "fn"):   # unwrap @autotune / @heuristics
        fn = fn.fn
    if not isinstance(fn, JITFunction):
        raise TypeError(f"kernel must be a compiled-mode @triton.jit function (defined with TRITON_INTERPRET "
                        f"unset), got {type(fn).__name__}")
    sig, consts, attrs = _signature(fn, args)
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", capability, 32),
                              options={"num_warps": num_warps, "num_stages": num_stages})
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        run = lambda *flags: subprocess.run([cuobjdump, *flags, f.name],
                                            capture_output=True, text=True).stdout
        usage = run("--dump-resource-usage")
        sass = run("-sass")
    regs = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    counts = {op: len(re.findall(rf"\b{op}\b", sass)) for op in ("HGMMA", "HMMA", "LDGSTS", "LDL", "STL")}
    return CompileReport(shared_bytes=int(compiled.metadata.shared),
                         registers=int(regs.group(1)) if regs else -1,
                         spill_bytes=int(stack.group(1)) if stack else 0, sass_counts=counts)
