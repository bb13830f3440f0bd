"""Backward formulas: one function per op, ``xxx_backward(grad, *saved) -> (grad_input, ...)``.

Reference solution of the exercise "implement backward formulas for a set of ops, broadcasting-aware".
Mirrors tools/autograd/derivatives.yaml and torch/csrc/autograd/FunctionsManual.cpp, e.g.::

    - name: mul.Tensor(Tensor self, Tensor other) -> Tensor
      self: mul_tensor_backward(grad, other, self.scalar_type())
      other: mul_tensor_backward(grad, self, other.scalar_type())

Every formula is written with ops that ``torch.Tensor`` and ``Variable`` both have (``*``, ``/``,
``@``, ``.sum(dim, keepdim)``, ``.reshape``, ``.expand``, ``.transpose``), so the same function

- runs on plain tensors (how a grader calls it: compare with ``torch.autograd.grad``), and
- runs on ``Variable``s inside the engine; under ``create_graph=True`` it records a graph of its
  own, which is what makes second derivatives work (PyTorch's formulas are differentiable for the
  same reason: they are written in ATen ops that have formulas themselves).

Broadcasting: ``a + b`` with ``a: (4, 1)`` and ``b: (3,)`` gives ``(4, 3)``; the gradient for ``b``
must be summed back to ``(3,)``. Here each formula calls ``unbroadcast`` itself; PyTorch does the
same reduction (``at::sum_to``) once, in the engine's ``validate_outputs``. Our engine only *checks*
the shapes, so a formula that forgets to unbroadcast fails loudly instead of being fixed silently.

Saved values are what PyTorch saves: ``exp``, ``tanh``, ``sigmoid`` and ``relu`` keep their *result*,
``log`` its input, ``add``/``sub``/``sum``/``reshape`` only shapes (so they can be backwarded twice).
"""
from __future__ import annotations

import math

from . import node as _node
from .scaffold import use_formulas  # noqa: F401  (re-exported: `with use_formulas({...}):`)


def _shape(x) -> tuple:
    return tuple(x.shape)


def unbroadcast(grad, shape):
    """Sum ``grad`` down to ``shape``: the adjoint of broadcasting (ATen ``at::sum_to``).

    ``grad: (5, 4, 3)``, ``shape: (4, 1)`` -> sum dim 0 (a new leading dim) and dim 2 (size 1 in
    ``shape``, 3 in ``grad``) -> ``(4, 1)``. Works on ``torch.Tensor`` and ``Variable``.
    """
    if not hasattr(grad, "shape") or not hasattr(grad, "sum"):
        raise TypeError(f"grad must be a tensor or Variable, got {type(grad).__name__}")
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise TypeError(f"shape must be a sequence of ints, got {shape!r}") from None
    gshape = _shape(grad)
    if gshape == shape:
        return grad
    lead = len(gshape) - len(shape)
    if lead < 0 or any(s != 1 and s != g for s, g in zip(shape, gshape[lead:], strict=True)):
        raise ValueError(f"shape {shape} is not broadcastable to grad's shape {gshape}: cannot sum grad "
                         "down to it")
    # Leading dims that broadcasting added, plus dims where `shape` has 1 and grad does not.
    dims = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and gshape[lead + i] != 1)
    if dims:
        grad = grad.sum(dim=dims, keepdim=True)  # (1, ..., 1, *shape-ish)
    return grad.reshape(shape)


# ------------------------------------------------------------------------------- binary, pointwise
def add_backward(grad, a_shape, b_shape):
    """``a + b``: saves no tensors, only the input shapes (for unbroadcast)."""
    return unbroadcast(grad, a_shape), unbroadcast(grad, b_shape)


def sub_backward(grad, a_shape, b_shape):
    return unbroadcast(grad, a_shape), unbroadcast(-grad, b_shape)


def mul_backward(grad, a, b):
    """``a * b``: d/da = grad * b, d/db = grad * a, each summed back to its input's shape."""
    return unbroadcast(grad * b, _shape(a)), unbroadcast(grad * a, _shape(b))


def div_backward(grad, a, b):
    """``a / b``: d/da = grad / b, d/db = -grad * a / b^2 (derivatives.yaml ``div_tensor_other_backward``)."""
    return unbroadcast(grad / b, _shape(a)), unbroadcast(-grad * a / (b * b), _shape(b))


def neg_backward(grad):
    return (-grad,)


def pow_backward(grad, a, exponent):
    """``a ** exponent`` for a Python-number exponent (FunctionsManual ``pow_backward``)."""
    if exponent == 0:  # d/da a^0 = 0 everywhere, also at a = 0 where the formula below gives 0 * inf
        return (grad * 0.0,)
    return (grad * exponent * a ** (exponent - 1),)


# ----------------------------------------------------------------------------------------- matmul
def matmul_backward(grad, a, b):
    """``a @ b`` with torch.matmul semantics: 1-D operands and broadcast batch dims.

    A 1-D ``a: (k,)`` acts as ``(1, k)`` and a 1-D ``b: (k,)`` as ``(k, 1)``; the added dims are
    removed from the result, so grad is first reshaped to the 2-D-or-more result shape ``(..., m, n)``.
    Then grad_a = grad @ b^T  ``(..., m, n) @ (..., n, k)`` and
    grad_b = a^T @ grad ``(..., k, m) @ (..., m, n)``, each summed over the batch dims that
    broadcasting added.
    """
    a_shape, b_shape = _shape(a), _shape(b)
    a2 = a.reshape(1, a_shape[0]) if len(a_shape) == 1 else a
    b2 = b.reshape(b_shape[0], 1) if len(b_shape) == 1 else b
    a2_shape, b2_shape = _shape(a2), _shape(b2)
    batch = _broadcast_shapes(a2_shape[:-2], b2_shape[:-2])
    g2 = grad.reshape(batch + (a2_shape[-2], b2_shape[-1]))
    grad_a = unbroadcast(g2 @ b2.transpose(-1, -2), a2_shape).reshape(a_shape)
    grad_b = unbroadcast(a2.transpose(-1, -2) @ g2, b2_shape).reshape(b_shape)
    return grad_a, grad_b


def _broadcast_shapes(s1: tuple, s2: tuple) -> tuple:
    n = max(len(s1), len(s2))
    s1, s2 = (1,) * (n - len(s1)) + s1, (1,) * (n - len(s2)) + s2
    return tuple(x if y == 1 else y for x, y in zip(s1, s2, strict=True))


# ------------------------------------------------------------------------------- unary, pointwise
def exp_backward(grad, result):
    """d/dx e^x = e^x: the node saves its *result* (no need to keep x)."""
    return (grad * result,)


def log_backward(grad, a):
    return (grad / a,)


def tanh_backward(grad, result):
    return (grad * (1 - result * result),)


def sigmoid_backward(grad, result):
    return (grad * result * (1 - result),)


def relu_backward(grad, result):
    """``threshold_backward(grad, result, 0)``: the mask ``result > 0`` is a constant (no gradient)."""
    mask = (result.data > 0).to(result.dtype)  # a plain torch.Tensor for both Tensor and Variable
    return (grad * mask,)


# ------------------------------------------------------------------------------------- reductions
def sum_backward(grad, input_shape, dim, keepdim):
    """Expand grad back to ``input_shape``; first re-insert the reduced dims if ``keepdim=False``.

    ``dim`` is None (all dims) or a tuple of non-negative dims. ``x: (2, 3, 4).sum(1)`` gives ``(2, 4)``;
    grad ``(2, 4)`` -> reshape ``(2, 1, 4)`` -> expand ``(2, 3, 4)``.
    """
    input_shape = tuple(input_shape)
    dims = range(len(input_shape)) if dim is None else dim
    kept = tuple(1 if d in dims else s for d, s in enumerate(input_shape))
    return (grad.reshape(kept).expand(input_shape),)


def mean_backward(grad, input_shape, dim, keepdim):
    dims = range(len(input_shape)) if dim is None else dim
    n = math.prod(input_shape[d] for d in dims)  # how many elements each output averaged
    (g,) = sum_backward(grad, input_shape, dim, keepdim)
    return (g / n if n else g,)  # n == 0: the gradient has no elements anyway


# ------------------------------------------------------------------------------------ shape ops
def reshape_backward(grad, input_shape):
    return (grad.reshape(tuple(input_shape)),)


def transpose_backward(grad, dim0, dim1):
    return (grad.transpose(dim0, dim1),)


def expand_backward(grad, input_shape):
    return (unbroadcast(grad, input_shape),)


def clone_backward(grad):
    return (grad,)


# The table OpNode.apply looks formulas up in, at backward time (node.BACKWARD_FORMULAS, the same dict
# object): importing this module installs the reference formulas; `use_formulas` swaps entries.
BACKWARD_FORMULAS = _node.BACKWARD_FORMULAS
REFERENCE_FORMULAS = {
    "add": add_backward,
    "sub": sub_backward,
    "mul": mul_backward,
    "div": div_backward,
    "neg": neg_backward,
    "pow": pow_backward,
    "matmul": matmul_backward,
    "exp": exp_backward,
    "log": log_backward,
    "tanh": tanh_backward,
    "sigmoid": sigmoid_backward,
    "relu": relu_backward,
    "sum": sum_backward,
    "mean": mean_backward,
    "reshape": reshape_backward,
    "transpose": transpose_backward,
    "expand": expand_backward,
    "clone": clone_backward,
}
BACKWARD_FORMULAS.update(REFERENCE_FORMULAS)


def backward_formula(op: str, grad, *saved):
    """The formula of ``op`` applied to ``(grad, *saved)``: what ``OpNode.apply`` does with the values the
    node saved (``OP_SAVES``). The entry point of the formulas exercise, so the notebook's answer and this
    table can be checked on the same cases."""
    if op not in REFERENCE_FORMULAS:
        raise ValueError(f"op must be one of {sorted(REFERENCE_FORMULAS)}, got {op!r}")
    return REFERENCE_FORMULAS[op](grad, *saved)
