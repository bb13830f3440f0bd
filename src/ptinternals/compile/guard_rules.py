"""Which calls recompile, as a rule you can run (torch/_dynamo/guards.py, torch/_dynamo/pgo.py
``FrameStateSizeEntry``, torch/_dynamo/variables/builder.py, torch/_dynamo/cache_size.py).

The function under study is fixed (:data:`SOURCE`)::

    def f(x, n, flag):
        y = x.sin() * n
        return y.cos() if flag else y

and a call is described by a ``scaffold.CallSpec``: ``x``'s shape, dtype, requires_grad and layout
(contiguous, or the transpose of a contiguous tensor), the int ``n`` and the bool ``flag``. (``n`` stays
an int: when a Python number changes *type*, what Dynamo remembers about it follows rules that changed
between releases, so the model leaves them out.)
``scaffold.make_args`` turns a spec into real arguments, so the rule can be checked against Dynamo with
``recompiles.run_and_count``.

The model of Dynamo's cache, as :func:`predict_compiles` runs it:

1. The frame keeps a list of *cache entries*, each compiled for one call and guarded by checks on the
   inputs. A call runs the **newest** entry whose guards all pass; if none passes, Dynamo compiles a new
   entry - unless the frame already has ``recompile_limit`` (8) entries: then the call runs eagerly.
2. An entry's guards: ``x``'s dtype, requires_grad and rank; each size, either exactly (a *static*
   dim) or "any size >= 2" (a *dynamic* dim: sizes 0 and 1 are always specialised, because so much
   code branches on them); the strides (exact numbers when every dim is static, else formulas in the
   sizes: those of the entry's layout, so a transposed (1, 1) tensor passes a contiguous guard); ``n``'s
   value if ``n`` is static; the value of ``flag`` (the ``if`` was resolved while tracing).
3. **Automatic dynamic shapes.** The frame remembers the first call's sizes and ``n``. When it compiles
   again, every dim whose size differs from the remembered one becomes dynamic from then on (also in
   entries compiled later for other reasons), and so does ``n`` once its value has differed (no 0/1
   specialisation for ints). A change of rank makes *every* dim dynamic from then on. The first
   compilation is fully static.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .scaffold import SOURCE, CallSpec, f, make_args

__all__ = ["SOURCE", "CallSpec", "f", "make_args", "predict_compiles", "RECOMPILE_LIMIT"]

RECOMPILE_LIMIT = 8                     # torch._dynamo.config.recompile_limit's default


@dataclass
class _Entry:
    dtype: str
    requires_grad: bool
    sizes: tuple                             # an int (static) or None (dynamic: any size >= 2) per dim
    strides: tuple | None                    # exact strides when every dim is static
    transposed: bool
    n_value: int | None                      # None: n dynamic
    flag: bool

    def accepts(self, c: CallSpec) -> bool:
        if (c.dtype, c.requires_grad, c.flag) != (self.dtype, self.requires_grad, self.flag):
            return False
        if len(c.shape) != len(self.sizes):
            return False
        if any(s != size if s is not None else size < 2 for s, size in zip(self.sizes, c.shape)):
            return False
        if self.strides is not None:                 # all static: the exact strides
            if c.strides != self.strides:
                return False
        elif c.strides != CallSpec(shape=c.shape, transposed=self.transposed).strides:
            return False                             # symbolic strides: those of the entry's layout

        return self.n_value is None or c.n == self.n_value


@dataclass
class _FrameState:
    """What automatic dynamic shapes remembers across compilations of the frame."""
    shape: tuple | None = None
    dynamic_dims: set = field(default_factory=set)
    all_dynamic: bool = False                # the rank changed once: every dim is dynamic from then on
    n: int | None = None
    n_dynamic: bool = False

    def update(self, c: CallSpec) -> None:
        if self.shape is None:
            self.shape, self.n = c.shape, c.n
            return
        if len(c.shape) != len(self.shape):
            self.all_dynamic = True
        else:
            self.dynamic_dims |= {d for d, (a, b) in enumerate(zip(c.shape, self.shape)) if a != b}
        if c.n != self.n:
            self.n_dynamic = True

    def is_dynamic(self, dim: int) -> bool:
        return self.all_dynamic or dim in self.dynamic_dims


def _compile(c: CallSpec, state: _FrameState) -> _Entry:
    sizes = tuple(None if state.is_dynamic(d) and size >= 2 else size for d, size in enumerate(c.shape))
    all_static = all(s is not None for s in sizes)
    return _Entry(c.dtype, c.requires_grad, sizes, c.strides if all_static else None, c.transposed,
                  None if state.n_dynamic else c.n, c.flag)


def predict_compiles(calls: Sequence[CallSpec | dict], recompile_limit: int = RECOMPILE_LIMIT) -> list[int]:
    """For each call in order: 1 if Dynamo compiles ``f`` during it, else 0 (a cache hit, or eager
    because the frame hit the recompile limit). A call is a ``CallSpec`` or its plain-data form
    (``CallSpec.as_dict()``, what the exercise is given)."""
    if isinstance(calls, (str, bytes)) or not isinstance(calls, Sequence):
        raise TypeError(f"calls must be a list of CallSpec, got {type(calls).__name__}")
    bad = [i for i, c in enumerate(calls) if not isinstance(c, (CallSpec, dict))]
    if bad:
        raise TypeError(f"calls[{bad[0]}] must be a CallSpec, got {type(calls[bad[0]]).__name__}")
    calls = [c if isinstance(c, CallSpec) else CallSpec.from_dict(c) for c in calls]
    entries: list[_Entry] = []
    state = _FrameState()
    out = []
    for c in calls:
        if any(e.accepts(c) for e in reversed(entries)):
            out.append(0)
        elif len(entries) >= recompile_limit:
            out.append(0)                     # the frame gave up: this call runs eagerly
        else:
            state.update(c)
            entries.append(_compile(c, state))
            out.append(1)
    return out
