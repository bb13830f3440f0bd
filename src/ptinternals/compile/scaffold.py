"""What the compile chapter's exercises build on (shipped to the grading sandbox; no solution here).

Two small program families whose behaviour under Dynamo the chapter predicts:

- straight-line programs over one tensor ``x``, one named statement after another
  (:data:`STATEMENTS`, :func:`build_program`), for the graph-break rule (``graph_breaks``);
- calls of one fixed function ``f(x, n, flag)`` (:data:`SOURCE`) described by a :class:`CallSpec`
  (:func:`make_args` makes the real arguments), for the recompilation rule (``guard_rules``).

Imports only torch: the sandbox has nothing else of the course.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

__all__ = ["STATEMENTS", "build_program", "check_statements", "SOURCE", "f", "CallSpec", "make_args"]

STATEMENTS = {
    "op": ["x = x.sin()"],
    "no_grad": ["with torch.no_grad():", "    x = x * 2"],
    "print": ["print('.', end='')"],
    "graph_break": ["torch._dynamo.graph_break()"],
    "item": ["x = x + x.sum().item()"],
    "branch": ["if x.sum() > 0:", "    x = x + 1", "else:", "    x = x - 1"],
    "helper": ["x = helper(x)"],
}


def check_statements(statements: Sequence[str]) -> list[str]:
    if isinstance(statements, str) or not isinstance(statements, Sequence):
        raise TypeError(f"statements must be a list of statement names, got {type(statements).__name__}")
    unknown = [s for s in statements if s not in STATEMENTS]
    if unknown:
        raise ValueError(f"unknown statements {unknown}; known: {sorted(STATEMENTS)}")
    return list(statements)


def build_program(statements: Sequence[str]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A fresh Python function ``prog(x)`` running ``statements`` in order, then ``return x``.

    Each call makes new code objects (the program and its helper), so nothing compiled for an earlier
    program is reused.
    """
    lines = ["def helper(x):", "    x = x.cos()", "    print('.', end='')", "    return x.exp()", "",
             "def prog(x):"]
    for s in check_statements(statements):
        lines.extend("    " + line for line in STATEMENTS[s])
    lines.append("    return x")
    namespace = {"torch": torch}
    exec(compile("\n".join(lines) + "\n", "<graph_breaks program>", "exec"), namespace)
    prog = namespace["prog"]
    prog.source = "\n".join(lines[5:])
    return prog


SOURCE = '''def f(x, n, flag):
    y = x.sin() * n
    return y.cos() if flag else y
'''

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}


def f(x, n, flag):
    y = x.sin() * n
    return y.cos() if flag else y


@dataclass(frozen=True)
class CallSpec:
    shape: tuple[int, ...] = (4,)
    dtype: str = "float32"
    requires_grad: bool = False
    transposed: bool = False              # x = contiguous(shape reversed).t(): rank-2 shapes only
    n: int = 2
    flag: bool = True

    def __post_init__(self):
        if not isinstance(self.shape, tuple) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                         for s in self.shape):
            raise ValueError(f"shape must be a tuple of ints >= 0, got {self.shape!r}")
        if not 1 <= len(self.shape) <= 3:
            raise ValueError(f"shape must have 1 to 3 dims, got {self.shape!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.transposed and len(self.shape) != 2:
            raise ValueError(f"transposed needs a rank-2 shape, got {self.shape!r}")
        if isinstance(self.n, bool) or not isinstance(self.n, int):
            raise TypeError(f"n must be an int, got {type(self.n).__name__}")
        if not isinstance(self.flag, bool) or not isinstance(self.requires_grad, bool):
            raise TypeError("flag and requires_grad must be bools")

    @property
    def strides(self) -> tuple[int, ...]:
        base = self.shape[::-1] if self.transposed else self.shape
        strides, running = [], 1
        for size in reversed(base):
            strides.append(running)
            running *= max(size, 1)
        strides = tuple(reversed(strides))
        return strides[::-1] if self.transposed else strides

    def as_dict(self) -> dict:
        """The call as plain data (what the recompilation predictor is given): every field, and ``x``'s
        strides under ``"stride"``."""
        return {"shape": self.shape, "dtype": self.dtype, "requires_grad": self.requires_grad,
                "transposed": self.transposed, "stride": self.strides, "n": self.n, "flag": self.flag}

    @classmethod
    def from_dict(cls, call: dict) -> "CallSpec":
        if not isinstance(call, dict):
            raise TypeError(f"call must be a dict, got {type(call).__name__}")
        fields = {k: call[k] for k in ("dtype", "requires_grad", "transposed", "n", "flag") if k in call}
        return cls(shape=tuple(call["shape"]), **fields)


def make_args(spec: CallSpec, seed: int = 0) -> tuple:
    """Real arguments ``(x, n, flag)`` for a spec."""
    if not isinstance(spec, CallSpec):
        raise TypeError(f"spec must be a CallSpec, got {type(spec).__name__}")
    g = torch.Generator().manual_seed(seed)
    base_shape = spec.shape[::-1] if spec.transposed else spec.shape
    x = torch.randn(base_shape, generator=g).to(_DTYPES[spec.dtype])
    if spec.transposed:
        x = x.t()
    return x.requires_grad_(spec.requires_grad), spec.n, spec.flag
