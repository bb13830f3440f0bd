"""Forward ops of the mini engine: compute with torch, record a node when a gradient is needed.

Mirrors the generated ``VariableType`` kernels (torch/csrc/autograd/generated/VariableType_*.cpp):
each op

1. computes its result on plain tensors (torch does the maths: ``a.data * b.data``);
2. if grad mode is on and some input requires grad, creates the node (``MulBackward0``) whose
   ``next_functions`` are the inputs' gradient edges, and saves what the backward formula needs;
3. sets the result's history: ``out.grad_fn = node``, ``out.requires_grad = True``.

Node names are PyTorch's (``SumBackward1`` is ``sum`` with ``dim``; ``reshape`` is ``ViewBackward0`` as
in torch when the reshape is a view). Python numbers are wrapped as 0-dim tensors of the other
operand's dtype and saved like any tensor, as torch does since 2.x (``x * 2`` has a ``MulBackward0``
that cannot be backwarded twice).
"""
from __future__ import annotations

import builtins

import torch

from . import node as _node  # module import: node.py and variable.py import each other's names
from .variable import Variable, gradient_edge, is_grad_enabled

_NUMBER = (int, float)

# Every op that records an OpNode looked up in node.BACKWARD_FORMULAS, with what its node saves
# (the arguments its formula gets after ``grad``).
OP_SAVES = {
    "add": "(a_shape, b_shape)", "sub": "(a_shape, b_shape)", "mul": "(a, b)", "div": "(a, b)",
    "neg": "()", "pow": "(a, exponent)", "matmul": "(a, b)", "exp": "(result,)", "log": "(a,)",
    "tanh": "(result,)", "sigmoid": "(result,)", "relu": "(result,)", "clone": "()",
    "sum": "(input_shape, dim, keepdim)", "mean": "(input_shape, dim, keepdim)", "reshape": "(input_shape,)",
    "transpose": "(dim0, dim1)", "expand": "(input_shape,)",
}
OP_NAMES = tuple(OP_SAVES)


def _as_variable(x, like: Variable | None, arg: str) -> Variable:
    """Variables pass through; tensors and numbers become constants (``requires_grad=False``)."""
    if isinstance(x, Variable):
        return x
    if isinstance(x, torch.Tensor):
        return Variable(x)
    if isinstance(x, _NUMBER) and not isinstance(x, bool):
        if like is None:
            return Variable(torch.tensor(x))
        # A "wrapped number": 0-dim, does not promote a float32 tensor to float64.
        return Variable(torch.tensor(x, dtype=torch.result_type(like.data, x), device=like.device))
    raise TypeError(f"{arg} must be a Variable, a torch.Tensor or a Python number, got {type(x).__name__}")


def _binary_operands(a, b, op: str) -> tuple[Variable, Variable]:
    like = a if isinstance(a, Variable) else b if isinstance(b, Variable) else None
    if like is None:
        raise TypeError(f"{op}: at least one operand must be a Variable, got {type(a).__name__} and "
                        f"{type(b).__name__}")
    return _as_variable(a, like, f"{op}(): a"), _as_variable(b, like, f"{op}(): b")


def _record(op: str, name: str, inputs: list, out_data: torch.Tensor, saved, formula=None) -> Variable:
    """Wrap ``out_data``; if a gradient is needed, build the node. ``saved(out)`` lists what to keep."""
    out = Variable(out_data)
    if is_grad_enabled() and builtins.any(v.requires_grad for v in inputs):
        node = _node.OpNode(
            op, name,
            next_functions=[gradient_edge(v) for v in inputs],
            input_shapes=[tuple(v.shape) for v in inputs],
            formula=formula,
        )
        out._set_history(node, 0)
        node.save(saved(out), output=out)
        if out_data._is_view():  # reshape/transpose/expand share the input's storage: remember it
            base = inputs[0]._base or inputs[0]
            out._base = base
            base._views.add(out)
    return out


def _check_broadcast(a: Variable, b: Variable, op: str) -> None:
    try:
        torch.broadcast_shapes(a.shape, b.shape)
    except RuntimeError:
        raise ValueError(f"{op}: shapes {tuple(a.shape)} and {tuple(b.shape)} are not "
                         "broadcastable") from None


# ------------------------------------------------------------------------------ binary pointwise
def add(a, b) -> Variable:
    a, b = _binary_operands(a, b, "add")
    _check_broadcast(a, b, "add")
    shapes = (tuple(a.shape), tuple(b.shape))  # add saves no tensor, only what unbroadcast needs
    return _record("add", "AddBackward0", [a, b], a.data + b.data, lambda out: shapes)


def sub(a, b) -> Variable:
    a, b = _binary_operands(a, b, "sub")
    _check_broadcast(a, b, "sub")
    shapes = (tuple(a.shape), tuple(b.shape))
    return _record("sub", "SubBackward0", [a, b], a.data - b.data, lambda out: shapes)


def mul(a, b) -> Variable:
    a, b = _binary_operands(a, b, "mul")
    _check_broadcast(a, b, "mul")
    # torch saves `other` only if self needs a gradient and vice versa; we keep both for simplicity.
    return _record("mul", "MulBackward0", [a, b], a.data * b.data, lambda out: (a, b))


def div(a, b) -> Variable:
    a, b = _binary_operands(a, b, "div")
    _check_broadcast(a, b, "div")
    return _record("div", "DivBackward0", [a, b], a.data / b.data, lambda out: (a, b))


def matmul(a, b) -> Variable:
    a, b = _binary_operands(a, b, "matmul")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: both arguments need at least 1 dimension, got shapes {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    k_b = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if a.shape[-1] != k_b:
        raise ValueError(f"matmul: a's last dim ({a.shape[-1]}) must equal b's contraction dim ({k_b}); "
                         f"shapes {tuple(a.shape)} @ {tuple(b.shape)}")
    try:
        out = torch.matmul(a.data, b.data)
    except RuntimeError as e:
        raise ValueError(f"matmul: batch dims of {tuple(a.shape)} and {tuple(b.shape)} do not broadcast "
                         f"({e})") from None
    name = "MmBackward0" if a.ndim == 2 and b.ndim == 2 else "MatmulBackward0"
    return _record("matmul", name, [a, b], out, lambda out: (a, b))


# ------------------------------------------------------------------------------- unary pointwise
def _unary(x, op: str) -> Variable:
    if not isinstance(x, Variable):
        raise TypeError(f"{op}(): x must be a Variable, got {type(x).__name__}")
    return x


def neg(x) -> Variable:
    x = _unary(x, "neg")
    return _record("neg", "NegBackward0", [x], -x.data, lambda out: ())


def pow(x, exponent) -> Variable:  # noqa: A001 (the op's name)
    x = _unary(x, "pow")
    if isinstance(exponent, bool) or not isinstance(exponent, _NUMBER):
        raise TypeError(f"pow(): exponent must be a Python int or float, got {type(exponent).__name__}")
    return _record("pow", "PowBackward0", [x], x.data ** exponent, lambda out: (x, exponent))


def exp(x) -> Variable:
    x = _unary(x, "exp")
    return _record("exp", "ExpBackward0", [x], torch.exp(x.data), lambda out: (out,))  # saves the result


def log(x) -> Variable:
    x = _unary(x, "log")
    return _record("log", "LogBackward0", [x], torch.log(x.data), lambda out: (x,))


def tanh(x) -> Variable:
    x = _unary(x, "tanh")
    return _record("tanh", "TanhBackward0", [x], torch.tanh(x.data), lambda out: (out,))


def sigmoid(x) -> Variable:
    x = _unary(x, "sigmoid")
    return _record("sigmoid", "SigmoidBackward0", [x], torch.sigmoid(x.data), lambda out: (out,))


def relu(x) -> Variable:
    x = _unary(x, "relu")
    return _record("relu", "ReluBackward0", [x], torch.relu(x.data), lambda out: (out,))


def clone(x) -> Variable:
    x = _unary(x, "clone")
    return _record("clone", "CloneBackward0", [x], x.data.clone(), lambda out: ())


# ------------------------------------------------------------------------------------ reductions
def _normalize_dims(dim, ndim: int, op: str):
    """None -> None; int or sequence of ints -> sorted tuple of dims in [0, ndim) (0-d: like ndim 1)."""
    if dim is None:
        return None
    dims = (dim,) if isinstance(dim, int) and not isinstance(dim, bool) else dim
    if not isinstance(dims, (tuple, list)) or not builtins.all(
            isinstance(d, int) and not isinstance(d, bool) for d in dims):
        raise TypeError(f"{op}(): dim must be None, an int or a tuple of ints, got {dim!r}")
    if len(dims) == 0:
        raise ValueError(f"{op}(): dim must not be empty; use dim=None to reduce over all dimensions")
    rank = builtins.max(ndim, 1)
    for d in dims:
        if not -rank <= d < rank:
            raise IndexError(f"{op}(): Dimension out of range (expected to be in range of [{-rank}, "
                             f"{rank - 1}], but got {d})")
    norm = sorted({d % rank for d in dims})
    if len(norm) != len(dims):
        raise ValueError(f"{op}(): dim {tuple(dims)} names a dimension twice")
    return tuple(norm) if ndim > 0 else ()


def sum(x, dim=None, keepdim: bool = False) -> Variable:  # noqa: A001
    x = _unary(x, "sum")
    dims = _normalize_dims(dim, x.ndim, "sum")
    if dims is None:
        data = x.data.sum()
    else:  # dims == () only for a 0-d x: nothing to reduce
        data = x.data.sum(dim=dims, keepdim=keepdim) if dims else x.data.clone()
    if dims is None and keepdim:
        data = data.reshape((1,) * x.ndim)
    name = "SumBackward0" if dim is None else "SumBackward1"
    return _record("sum", name, [x], data, lambda out: (tuple(x.shape), dims, keepdim))


def mean(x, dim=None, keepdim: bool = False) -> Variable:
    x = _unary(x, "mean")
    if not x.data.is_floating_point():
        raise TypeError(f"mean(): x must have a floating point dtype, got {x.dtype}")
    dims = _normalize_dims(dim, x.ndim, "mean")
    if dims is None:
        data = x.data.mean()
    else:
        data = x.data.mean(dim=dims, keepdim=keepdim) if dims else x.data.clone()
    if dims is None and keepdim:
        data = data.reshape((1,) * x.ndim)
    name = "MeanBackward0" if dim is None else "MeanBackward1"
    return _record("mean", name, [x], data, lambda out: (tuple(x.shape), dims, keepdim))


# ------------------------------------------------------------------------------------- shape ops
def _shape_arg(shape, op: str) -> tuple:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
        shape = tuple(shape[0])
    if not builtins.all(isinstance(s, int) and not isinstance(s, bool) for s in shape):
        raise TypeError(f"{op}(): shape must be ints, got {shape!r}")
    return tuple(shape)


def reshape(x, *shape) -> Variable:
    x = _unary(x, "reshape")
    shape = _shape_arg(shape, "reshape")
    try:
        data = x.data.reshape(shape)
    except RuntimeError as e:
        raise ValueError(f"reshape(): shape {shape} is invalid for input of shape {tuple(x.shape)} "
                         f"({e})") from None
    return _record("reshape", "ViewBackward0", [x], data, lambda out: (tuple(x.shape),))


def transpose(x, dim0: int, dim1: int) -> Variable:
    x = _unary(x, "transpose")
    d0, d1 = (_normalize_dims(d, x.ndim, "transpose") for d in (dim0, dim1))
    if x.ndim == 0:
        return _record("transpose", "TransposeBackward0", [x], x.data.clone(), lambda out: (0, 0))
    d0, d1 = d0[0], d1[0]
    return _record("transpose", "TransposeBackward0", [x], x.data.transpose(d0, d1), lambda out: (d0, d1))


def expand(x, *shape) -> Variable:
    x = _unary(x, "expand")
    shape = _shape_arg(shape, "expand")
    try:
        data = x.data.expand(shape)  # a view with stride 0 in the expanded dims: no copy
    except RuntimeError as e:
        raise ValueError(f"expand(): cannot expand shape {tuple(x.shape)} to {shape} ({e})") from None
    return _record("expand", "ExpandBackward0", [x], data, lambda out: (tuple(x.shape),))


# ----------------------------------------------------------------------------------- custom ops
def custom_op(name: str, forward, backward, *inputs, save_inputs: bool = True) -> Variable:
    """An op defined by two functions, the mini engine's ``torch.autograd.Function`` (torch: ``PyNode``).

    ``forward(*tensors) -> tensor`` computes the value from the inputs' plain tensors.
    ``backward(grad, *saved) -> tuple`` returns one gradient (a Variable or None) per input; ``saved``
    are the inputs as Variables when ``save_inputs`` (released after backward like any saved value,
    so a second backward raises), nothing otherwise. ``name`` is the node's name, e.g. ``"MyOpBackward"``.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if not callable(forward) or not callable(backward):
        raise TypeError("forward and backward must be callable")
    if not inputs or not builtins.all(isinstance(v, Variable) for v in inputs):
        raise TypeError("custom_op needs at least one input, and every input must be a Variable")
    out_data = forward(*(v.data for v in inputs))
    if not isinstance(out_data, torch.Tensor):
        raise TypeError(f"forward must return a torch.Tensor, got {type(out_data).__name__}")
    return _record("custom", name, list(inputs), out_data.detach(),
                   lambda out: tuple(inputs) if save_inputs else (), formula=backward)


# ------------------------------------------------------------------------------------ in place
def add_(x, other) -> Variable:
    """``x += other`` in place: bumps x's version counter and rebases x's history onto a new node.

    After ``y = a.exp(); y.add_(1)``, ``ExpBackward0`` still holds y at version 0 while y is at
    version 1: its backward raises the "modified by an inplace operation" error.
    """
    if not isinstance(x, Variable):
        raise TypeError(f"add_(): x must be a Variable, got {type(x).__name__}")
    other = _as_variable(other, x, "add_(): other")
    try:
        out_shape = torch.broadcast_shapes(x.shape, other.shape)
    except RuntimeError:
        out_shape = None
    if out_shape != x.shape:  # in place: the result must keep x's shape
        raise ValueError(f"add_(): other of shape {tuple(other.shape)} does not broadcast to x's shape "
                         f"{tuple(x.shape)}")
    needs_grad = is_grad_enabled() and (x.requires_grad or other.requires_grad)
    if needs_grad and x.is_leaf and x.requires_grad:
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
    if needs_grad and (x._base is not None or len(x._views) > 0):
        # torch rebases the base's history (CopySlices) and regenerates every view's grad_fn; without
        # that, the other aliases' graphs would silently miss `other`. We refuse instead.
        raise RuntimeError("add_(): in-place on a view, or on a tensor that has views, is not supported by "
                           "the mini engine when a gradient is needed; use the out-of-place x + other")
    edges = [gradient_edge(x), gradient_edge(other)]  # x's *old* history: read before the rebase
    x.data.add_(other.data)  # version counter += 1
    if needs_grad:
        shapes = [tuple(x.shape), tuple(other.shape)]
        node = _node.OpNode("add", "AddBackward0", next_functions=edges, input_shapes=shapes)
        node.save((tuple(x.shape), tuple(other.shape)), output=x)
        x._set_history(node, 0)  # torch: rebase_history
    return x
