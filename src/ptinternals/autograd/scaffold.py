"""The mini engine without its formulas and without its backward pass: what the autograd chapter's exercises build on.

Students write the two missing pieces (the backward formulas and the engine) and plug them in::

    from ptinternals.autograd.scaffold import Variable, use_backward, use_formulas

    with use_formulas({"mul": my_mul_backward}), use_backward(my_backward):
        loss = (a * b).sum()
        loss.backward()          # runs my_backward, which calls the nodes, which call my_mul_backward

What is here (the same objects the reference package uses; nothing in this module or in the three it
imports knows about ``formulas.py`` or ``engine.py``, so it can be shipped to the grading sandbox):

- ``Variable``          a tensor value plus ``grad``, ``grad_fn``, ``requires_grad``, hooks,
                        ``retain_grad()``; ops ``+ - * / @ ** exp log tanh sigmoid relu sum mean
                        reshape transpose expand clone add_`` (variable.py, ops.py).
- ``gradient_edge(v)``  where v's gradient goes: ``(v.grad_fn, 0)``, or ``(AccumulateGrad of v, 0)``
                        for a leaf that requires grad, or ``(None, 0)``.
- ``Node`` and friends  ``next_functions``, ``sequence_nr``, ``apply(grad_outputs)``,
                        ``tensor_pre_hooks(input_nr)``, ``release_variables()`` (node.py);
                        ``AccumulateGrad`` adds into a leaf's ``.grad``; ``OpNode`` runs the formula
                        of its op from ``BACKWARD_FORMULAS``.
- ``custom_op``         an op given by a forward and a backward function (a mini ``autograd.Function``).
- ``use_formulas``      swap entries of the formula table for a while.
- ``use_backward``      make ``Variable.backward()`` run another engine for a while.

In a full install, importing this module runs ``ptinternals/autograd/__init__.py``, which installs
the reference formulas and engine as defaults; in the grading sandbox only the scaffold exists.
"""
from __future__ import annotations

from . import ops
from .node import BACKWARD_FORMULAS, AccumulateGrad, GraphRoot, Node, OpNode
from .ops import OP_NAMES, OP_SAVES, custom_op
from .variable import (
    SavedVariable,
    Variable,
    backward_engine,
    enable_grad,
    gradient_edge,
    is_grad_enabled,
    no_grad,
    set_grad_enabled,
    use_backward,
)

_MISSING = object()


class use_formulas:
    """``with use_formulas({"mul": my_mul_backward}): ...`` swaps table entries, then restores them.

    A formula is ``f(grad, *saved) -> tuple`` with one gradient per input of the op; ``OP_SAVES``
    says what each op saves (``mul``: ``(a, b)``; ``add``: the two input shapes).
    """

    def __init__(self, overrides: dict):
        if not isinstance(overrides, dict):
            raise TypeError("overrides must be a dict of op name -> function, got "
                            f"{type(overrides).__name__}")
        unknown = sorted(set(overrides) - set(OP_NAMES))
        if unknown:
            raise ValueError(f"overrides has unknown op names {unknown}; known: {sorted(OP_NAMES)}")
        bad = [k for k, f in overrides.items() if not callable(f)]
        if bad:
            raise TypeError(f"overrides[{bad[0]!r}] must be callable")
        self.overrides = overrides
        self._previous: dict = {}

    def __enter__(self):
        self._previous = {k: BACKWARD_FORMULAS.get(k, _MISSING) for k in self.overrides}
        BACKWARD_FORMULAS.update(self.overrides)
        return self

    def __exit__(self, *exc):
        for k, f in self._previous.items():
            if f is _MISSING:
                BACKWARD_FORMULAS.pop(k, None)
            else:
                BACKWARD_FORMULAS[k] = f
        return False


__all__ = [
    "AccumulateGrad", "BACKWARD_FORMULAS", "GraphRoot", "Node", "OP_NAMES", "OP_SAVES", "OpNode", "SavedVariable",
    "Variable", "backward_engine", "custom_op", "enable_grad", "gradient_edge", "is_grad_enabled", "no_grad", "ops",
    "set_grad_enabled", "use_backward", "use_formulas",
]
