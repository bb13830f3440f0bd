"""The differentiable tensor of the mini engine: ``Variable``, its saved copies and grad mode.

Mirrors, in Python, what PyTorch keeps next to every tensor that takes part in autograd:

- ``Variable``            torch/csrc/autograd/variable.h ``AutogradMeta``: ``grad``, ``grad_fn``,
                          ``output_nr``, ``requires_grad``, the lazily created ``grad_accumulator``
                          of a leaf, its hooks, and ``retains_grad``.
- ``gradient_edge``       variable.h ``impl::gradient_edge``: where a gradient for this tensor goes,
                          ``(grad_fn, output_nr)`` for a result, ``(AccumulateGrad, 0)`` for a leaf.
- ``SavedVariable``       torch/csrc/autograd/saved_variable.cpp: a tensor a node keeps for its
                          backward, with the version it had when saved (the in-place check) and
                          ``release()`` (what ``retain_graph=False`` does after a node has run).
- grad mode               c10/core/GradMode.h: a thread-local flag; ``no_grad`` turns recording off.

The values are plain ``torch.Tensor`` objects with ``requires_grad=False``: torch computes the
numbers, this package builds and walks the graph. Ops (``a * b``, ``a.exp()``...) live in ``ops.py``,
their backward formulas in ``formulas.py``, the backward pass in ``engine.py``.

This module, ``node.py`` and ``ops.py`` are the chapter's *scaffold* (see ``scaffold.py``): they never
import the formulas or the engine. ``Variable.backward()`` runs whichever engine is installed: the
reference one (``engine.py`` installs itself when ``ptinternals.autograd`` is imported) or a
student's, plugged in with ``use_backward``.
"""
from __future__ import annotations

import contextlib
import threading
import weakref
from collections import OrderedDict
from itertools import count

import torch

# ----------------------------------------------------------------------------------------- grad mode
_grad_mode = threading.local()  # c10::GradMode is thread-local too


def is_grad_enabled() -> bool:
    return getattr(_grad_mode, "enabled", True)


@contextlib.contextmanager
def set_grad_enabled(mode: bool):
    """Context manager (and decorator) that sets grad mode, like ``torch.set_grad_enabled``."""
    if not isinstance(mode, bool):
        raise TypeError(f"mode must be a bool, got {type(mode).__name__}")
    previous = is_grad_enabled()
    _grad_mode.enabled = mode
    try:
        yield
    finally:
        _grad_mode.enabled = previous


def no_grad():
    """Ops run inside record no graph: results have ``requires_grad=False`` and no ``grad_fn``."""
    return set_grad_enabled(False)


def enable_grad():
    return set_grad_enabled(True)


# ------------------------------------------------------------------------------------------- hooks
_handle_ids = count()


class RemovableHandle:
    """What ``register_hook`` returns (torch/utils/hooks.py): ``handle.remove()`` unregisters."""

    def __init__(self, hooks_dict: "_HookDict"):
        self.id = next(_handle_ids)
        self._hooks_ref = weakref.ref(hooks_dict)  # the handle must not keep a dead graph's hooks alive

    def remove(self) -> None:
        hooks = self._hooks_ref()
        if hooks is not None:
            hooks.pop(self.id, None)


class _HookDict(OrderedDict):
    """An OrderedDict that a RemovableHandle can point to weakly (plain dicts cannot be weakref'd)."""


def add_hook(hooks: _HookDict, fn) -> RemovableHandle:
    if not callable(fn):
        raise TypeError(f"hook must be callable, got {type(fn).__name__}")
    handle = RemovableHandle(hooks)
    hooks[handle.id] = fn  # insertion order = call order
    return handle


# ---------------------------------------------------------------------------------------- Variable
class Variable:
    """A tensor value plus its autograd metadata.

    ``Variable(torch.randn(3, 4), requires_grad=True)`` is a leaf, like ``torch.randn(3, 4,
    requires_grad=True)``. Results of ops on it have a ``grad_fn`` (a ``Node``) and are not leaves.
    """

    def __init__(self, data: torch.Tensor, requires_grad: bool = False):
        if not isinstance(data, torch.Tensor):
            raise TypeError(f"data must be a torch.Tensor, got {type(data).__name__}")
        if not isinstance(requires_grad, bool):
            raise TypeError(f"requires_grad must be a bool, got {type(requires_grad).__name__}")
        if requires_grad and not (data.is_floating_point() or data.is_complex()):
            raise TypeError(f"only floating point data can require gradients, got dtype {data.dtype}")
        # detach(): a new TensorImpl over the same storage that *shares the version counter*, so an
        # in-place op on either bumps the `_version` that SavedVariable checks.
        self._data = data.detach()
        self._requires_grad = requires_grad
        self._grad: Variable | None = None
        self.grad_fn = None          # the Node that produced this value; None for a leaf
        self.output_nr = 0           # which output of grad_fn this is (all our ops have one output)
        self._grad_accumulator = None  # AccumulateGrad node of a leaf, created on first use
        self._hooks = _HookDict()    # leaf tensor hooks, run by AccumulateGrad before accumulating
        self._post_accumulate_grad_hooks = _HookDict()
        self._retains_grad = False
        self._base: Variable | None = None  # for a view recorded by reshape/transpose/expand: its base
        self._views = weakref.WeakSet()      # recorded views of this value (see ops.add_)

    # ---- plain tensor facts
    @property
    def data(self) -> torch.Tensor:
        return self._data

    @property
    def shape(self) -> torch.Size:
        return self._data.shape

    def size(self, dim: int | None = None):
        return self._data.shape if dim is None else self._data.size(dim)

    @property
    def dtype(self) -> torch.dtype:
        return self._data.dtype

    @property
    def device(self) -> torch.device:
        return self._data.device

    @property
    def ndim(self) -> int:
        return self._data.dim()

    def dim(self) -> int:
        return self._data.dim()

    def numel(self) -> int:
        return self._data.numel()

    def item(self):
        return self._data.item()

    @property
    def _version(self) -> int:
        return self._data._version

    def __repr__(self) -> str:
        extra = ""
        if self.grad_fn is not None:
            extra = f", grad_fn=<{self.grad_fn.name()}>"
        elif self._requires_grad:
            extra = ", requires_grad=True"
        return f"Variable({self._data!r}{extra})"

    # ---- autograd metadata
    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"requires_grad must be a bool, got {type(value).__name__}")
        if self.grad_fn is not None:  # torch: same message, RuntimeError
            raise RuntimeError("you can only change requires_grad flags of leaf variables.")
        if value and not (self._data.is_floating_point() or self._data.is_complex()):
            raise TypeError(f"only floating point data can require gradients, got dtype {self.dtype}")
        self._requires_grad = value

    def requires_grad_(self, requires_grad: bool = True) -> "Variable":
        self.requires_grad = requires_grad
        return self

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    @property
    def grad(self) -> "Variable | None":
        return self._grad

    @grad.setter
    def grad(self, value: "Variable | None") -> None:
        if value is not None:
            if not isinstance(value, Variable):
                raise TypeError(f"grad must be a Variable or None, got {type(value).__name__}")
            if value.shape != self.shape:
                raise ValueError(f"assigned grad has shape {tuple(value.shape)}, expected "
                                 f"{tuple(self.shape)}")
        self._grad = value

    @property
    def retains_grad(self) -> bool:
        return self._retains_grad

    def _set_history(self, grad_fn, output_nr: int = 0) -> None:
        """Make this value the output ``output_nr`` of ``grad_fn`` (torch: ``set_gradient_edge``)."""
        self.grad_fn = grad_fn
        self.output_nr = output_nr
        self._requires_grad = True

    def _get_grad_accumulator(self):
        """The leaf's AccumulateGrad node, made on first use (torch: ``impl::grad_accumulator``)."""
        if self.grad_fn is not None:
            raise RuntimeError("grad_accumulator() should only be called on leaf Variables")
        if not self._requires_grad:
            return None
        if self._grad_accumulator is None:
            from .node import AccumulateGrad

            self._grad_accumulator = AccumulateGrad(self)
        return self._grad_accumulator

    def detach(self) -> "Variable":
        """Same storage and version counter, no history, ``requires_grad=False``."""
        return Variable(self._data)

    # ---- hooks
    def register_hook(self, hook) -> RemovableHandle:
        """``hook(grad) -> Variable | None`` runs when the gradient for this tensor is computed.

        The hook sees the *summed* gradient (all uses of the tensor added up) and may return a
        replacement. On a leaf it runs inside AccumulateGrad before accumulation; on a non-leaf it is
        a pre-hook of ``grad_fn`` for input ``output_nr`` (torch: ``tensor_pre_hooks``).
        """
        if not self._requires_grad:  # torch: same message, RuntimeError
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self.grad_fn is None:
            return add_hook(self._hooks, hook)
        hooks = self.grad_fn._tensor_pre_hooks.setdefault(self.output_nr, _HookDict())
        return add_hook(hooks, hook)

    def register_post_accumulate_grad_hook(self, hook) -> RemovableHandle:
        """``hook(tensor) -> None`` runs after ``tensor.grad`` was accumulated (leaves only)."""
        if not self._requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self.grad_fn is not None:
            raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
        return add_hook(self._post_accumulate_grad_hooks, hook)

    def retain_grad(self) -> None:
        """Keep ``.grad`` for a non-leaf: a hook on grad_fn stores the gradient, after all tensor hooks.

        No-op on a leaf (leaves always keep their grad). Like torch, the captured gradient is the one
        *after* every ``register_hook`` hook of this tensor ran, whatever the registration order.
        """
        if not self._requires_grad:
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        if self.grad_fn is None or self._retains_grad:
            return
        self_ref = weakref.ref(self)  # torch holds the tensor weakly too: the graph must not keep it alive

        def retain_grad_hook(grad: Variable) -> None:
            var = self_ref()
            if var is None or grad is None:
                return
            if var._grad is None:
                var._grad = grad.clone()  # a CloneBackward0 node under create_graph, a plain copy otherwise
            else:
                var._grad = var._grad + grad

        self.grad_fn._retains_grad_hooks[self.output_nr] = retain_grad_hook
        self._retains_grad = True

    # ---- backward
    def backward(self, gradient=None, retain_graph: bool | None = None, create_graph: bool = False) -> None:
        """``loss.backward()``: run the installed engine from this tensor (see ``engine.backward``)."""
        backward_engine()(self, gradient, retain_graph, create_graph)

    # ---- ops: defined in ops.py, bound here so `a * b` reads like torch
    def __add__(self, other):
        return _ops.add(self, other)

    def __radd__(self, other):
        return _ops.add(other, self)

    def __sub__(self, other):
        return _ops.sub(self, other)

    def __rsub__(self, other):
        return _ops.sub(other, self)

    def __mul__(self, other):
        return _ops.mul(self, other)

    def __rmul__(self, other):
        return _ops.mul(other, self)

    def __truediv__(self, other):
        return _ops.div(self, other)

    def __rtruediv__(self, other):
        return _ops.div(other, self)

    def __neg__(self):
        return _ops.neg(self)

    def __pow__(self, exponent):
        return _ops.pow(self, exponent)

    def __matmul__(self, other):
        return _ops.matmul(self, other)

    def __rmatmul__(self, other):
        return _ops.matmul(other, self)

    def exp(self):
        return _ops.exp(self)

    def log(self):
        return _ops.log(self)

    def tanh(self):
        return _ops.tanh(self)

    def relu(self):
        return _ops.relu(self)

    def sigmoid(self):
        return _ops.sigmoid(self)

    def sum(self, dim=None, keepdim: bool = False):
        return _ops.sum(self, dim, keepdim)

    def mean(self, dim=None, keepdim: bool = False):
        return _ops.mean(self, dim, keepdim)

    def reshape(self, *shape):
        return _ops.reshape(self, *shape)

    def transpose(self, dim0: int, dim1: int):
        return _ops.transpose(self, dim0, dim1)

    def expand(self, *shape):
        return _ops.expand(self, *shape)

    def clone(self):
        return _ops.clone(self)

    def add_(self, other):
        return _ops.add_(self, other)


# ------------------------------------------------------------------------------ a pluggable engine
# What Variable.backward() runs: fn(root, gradient, retain_graph, create_graph). The default is set by
# engine.py (the reference) when it is imported; use_backward stacks another one on top for a while.
_default_backward = None
_backward_stack: list = []


def install_default_backward(fn) -> None:
    """Make ``fn`` what ``Variable.backward()`` runs when no ``use_backward`` is active."""
    global _default_backward
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    _default_backward = fn


def backward_engine():
    """The backward function ``Variable.backward()`` calls now."""
    if _backward_stack:
        return _backward_stack[-1]
    if _default_backward is None:
        raise RuntimeError("no backward engine is installed: call your own engine directly, or plug it in with "
                           "`with use_backward(my_backward): loss.backward()`")
    return _default_backward


class use_backward:
    """``with use_backward(fn): loss.backward()`` routes ``Variable.backward`` to
    ``fn(root, gradient, retain_graph, create_graph)``."""

    def __init__(self, fn):
        if not callable(fn):
            raise TypeError("fn must be callable with (root, grad, retain_graph, create_graph), got "
                            f"{type(fn).__name__}")
        self.fn = fn

    def __enter__(self):
        _backward_stack.append(self.fn)
        return self

    def __exit__(self, *exc):
        _backward_stack.pop()  # context managers exit in LIFO order
        return False


def gradient_edge(var: Variable) -> tuple:
    """Where the gradient of ``var`` flows: ``(node, input_nr)``, or ``(None, 0)`` if nowhere.

    This pair is one entry of a consumer's ``next_functions`` (torch/csrc/autograd/edge.h ``Edge``).
    """
    if var.grad_fn is not None:
        return (var.grad_fn, var.output_nr)
    if var.requires_grad:
        return (var._get_grad_accumulator(), 0)
    return (None, 0)


# ----------------------------------------------------------------------------------- SavedVariable
ERR_BACKWARD_TWICE = (
    "Trying to backward through the graph a second time (or directly access saved tensors after they "
    "have already been freed). Saved intermediate values of the graph are freed when you call "
    ".backward() or autograd.grad(). Specify retain_graph=True if you need to backward through the "
    "graph a second time or if you need to access saved tensors after calling backward."
)


class SavedVariable:
    """A Variable kept by a node for its backward, with the version it had when it was saved.

    ``unpack()`` fails, with PyTorch's messages, after ``release()`` (the graph was freed by a
    backward without ``retain_graph``) or when the value was modified in place since it was saved
    (its version counter moved: torch/csrc/autograd/saved_variable.cpp ``unpack``).
    """

    def __init__(self, variable: Variable, is_output: bool):
        if not isinstance(variable, Variable):
            raise TypeError(f"variable must be a Variable, got {type(variable).__name__}")
        self._variable: Variable | None = variable
        self.saved_version = variable._version
        self.is_output = is_output
        self._shape = tuple(variable.shape)
        self._dtype = variable.dtype
        self._producer = variable.grad_fn.name() if variable.grad_fn is not None else None

    def unpack(self, saved_for=None) -> Variable:
        if self._variable is None:
            raise RuntimeError(ERR_BACKWARD_TWICE)
        current = self._variable._version
        if current != self.saved_version:
            who = f"output {self._variable.output_nr} of {self._producer}" if self._producer else "a leaf"
            user = f" needed by {saved_for.name()}" if saved_for is not None else ""
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace "
                f"operation: [{self._dtype} {list(self._shape)}]{user}, which is {who}, is at version "
                f"{current}; expected version {self.saved_version} instead. Hint: the in-place op "
                "overwrote a value that backward needs; use an out-of-place op or clone() first."
            )
        return self._variable

    def release(self) -> None:
        self._variable = None


from . import ops as _ops  # noqa: E402  (ops imports Variable from this module)
