"""Graph nodes: what ``y.grad_fn`` points to.

Mirrors torch/csrc/autograd/function.h ``Node`` and its subclasses:

- ``Node``            ``next_functions`` (the edges: one ``(node, input_nr)`` per forward input,
                      ``(None, 0)`` for an input that needs no gradient), ``sequence_nr`` (creation
                      order; the engine runs the most recently created ready node first), tensor
                      pre-hooks per input, node pre-/post-hooks, ``release_variables``.
- ``OpNode``          the generated ``MulBackward0``-style nodes (torch/csrc/autograd/generated/
                      Functions.h): saved variables plus a backward formula, looked up by op name in
                      ``BACKWARD_FORMULAS`` *when the node runs*, so a student's formulas can be
                      plugged in without rebuilding the graph. The table starts empty: the reference
                      ``formulas.py`` fills it when ``ptinternals.autograd`` is imported (this module
                      never imports it, so it can serve as scaffolding in the grading sandbox). A node
                      made by ``ops.custom_op`` carries its own formula, like torch's ``PyNode``.
- ``AccumulateGrad``  torch/csrc/autograd/functions/accumulate_grad.h: the sink for a leaf. Adds the
                      incoming gradient into ``variable.grad`` (accumulates, never overwrites), then
                      runs the leaf's post-accumulate-grad hooks.
- ``GraphRoot``       torch/csrc/autograd/functions/basic_ops.h: the node the engine starts from; it
                      hands the root gradients (``ones`` for a scalar loss) to the roots' edges.

Vocabulary (as in PyTorch): a node's *inputs* are the gradients of its forward *outputs*
(``grad_outputs``, one per forward output; all our ops have one), and it returns one gradient per
forward *input* (``grad_inputs``), in ``next_functions`` order.
"""
from __future__ import annotations

import math
from itertools import count

from .variable import SavedVariable, Variable, _HookDict, add_hook, is_grad_enabled

_sequence_nr = count()  # torch: a thread-local counter bumped by every Node constructor

# op name -> backward formula ``f(grad, *saved) -> tuple of grads``, read by OpNode.apply at backward
# time. Filled by formulas.py (the reference) or by ``scaffold.use_formulas`` (a student's table).
BACKWARD_FORMULAS: dict = {}


class Node:
    num_inputs = 1  # how many gradients flow *into* this node (= number of forward outputs)

    def __init__(self, next_functions=(), input_shapes=None):
        self.next_functions = tuple(next_functions)  # ((Node | None, input_nr), ...)
        # The shape each returned gradient must have (torch: InputMetadata, checked by the engine's
        # validate_outputs). None where unknown.
        n = len(self.next_functions)
        self.input_shapes = tuple(input_shapes) if input_shapes is not None else (None,) * n
        self.sequence_nr = next(_sequence_nr)
        self._tensor_pre_hooks: dict[int, _HookDict] = {}  # input_nr -> hooks from Variable.register_hook
        self._retains_grad_hooks: dict[int, object] = {}   # input_nr -> the retain_grad() hook
        self._pre_hooks = _HookDict()   # hook(grad_outputs) -> new grad_outputs | None
        self._post_hooks = _HookDict()  # hook(grad_inputs, grad_outputs) -> new grad_inputs | None

    def name(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        return f"<{self.name()} object at {hex(id(self))}>"

    def apply(self, grad_outputs: list) -> tuple:
        """Gradients for the forward inputs, one per entry of ``next_functions``."""
        raise NotImplementedError(f"{self.name()} does not define apply()")

    def release_variables(self) -> None:
        """Drop saved tensors (called by the engine after this node ran, unless ``retain_graph``)."""

    def tensor_pre_hooks(self, input_nr: int) -> list:
        """Hooks to run on the gradient for input ``input_nr`` before the node runs, in order.

        Each is ``hook(grad) -> Variable | None`` (a Variable replaces the gradient). The list holds
        the ``register_hook`` hooks of the tensor this input is the gradient of, then its
        ``retain_grad()`` hook if any (torch keeps that one apart and always runs it last, so
        ``.grad`` sees the gradient after every other hook; it returns None).
        """
        hooks = list(self._tensor_pre_hooks.get(input_nr, {}).values())
        if input_nr in self._retains_grad_hooks:
            hooks.append(self._retains_grad_hooks[input_nr])
        return hooks

    def register_prehook(self, hook):
        """``hook(grad_outputs) -> tuple | None`` runs before the node (torch: ``Node.register_prehook``)."""
        return add_hook(self._pre_hooks, hook)

    def register_hook(self, hook):
        """``hook(grad_inputs, grad_outputs) -> tuple | None`` runs after it (``Node.register_hook``)."""
        return add_hook(self._post_hooks, hook)


class OpNode(Node):
    """A node for one differentiable op: saved values + a formula from ``BACKWARD_FORMULAS[op]``.

    ``saved`` holds the formula's arguments after ``grad``: ``SavedVariable`` for tensors (released
    after backward), plain Python values (shapes, dims, exponents) kept as they are. For ``mul`` it is
    ``(SavedVariable(a), SavedVariable(b))`` and the node computes ``mul_backward(grad, a, b)``.
    """

    def __init__(self, op: str, name: str, next_functions, input_shapes, formula=None):
        super().__init__(next_functions, input_shapes)
        if formula is not None and not callable(formula):
            raise TypeError(f"formula must be callable or None, got {type(formula).__name__}")
        self.op = op
        self._name = name
        self.formula = formula  # None: look BACKWARD_FORMULAS[op] up when the node runs
        self.saved: tuple = ()

    def name(self) -> str:
        return self._name

    def save(self, values, output: Variable) -> None:
        self.saved = tuple(SavedVariable(v, is_output=v is output) if isinstance(v, Variable) else v
                           for v in values)

    def apply(self, grad_outputs: list) -> tuple:
        (grad,) = grad_outputs
        if grad is None:  # no gradient reached this output: nothing flows further
            return (None,) * len(self.next_functions)
        args = [s.unpack(self) if isinstance(s, SavedVariable) else s for s in self.saved]
        formula = self.formula or BACKWARD_FORMULAS.get(self.op)
        if formula is None:
            raise RuntimeError(f"no backward formula for op {self.op!r} is installed: plug one in with "
                               f"`with use_formulas({{{self.op!r}: my_{self.op}_backward}}): ...`")
        grads = formula(grad, *args)
        if not isinstance(grads, tuple):
            raise TypeError(f"backward formula for {self.op!r} must return a tuple, got "
                            f"{type(grads).__name__}")
        return grads

    def release_variables(self) -> None:
        for s in self.saved:
            if isinstance(s, SavedVariable):
                s.release()


class AccumulateGrad(Node):
    """The sink of a leaf: ``variable.grad += grad`` (torch/csrc/autograd/functions/accumulate_grad.h)."""

    def __init__(self, variable: Variable):
        super().__init__(next_functions=())
        # torch gives AccumulateGrad sequence_nr UINT64_MAX: once ready, it runs before anything else,
        # so .grad is filled (and post-accumulate hooks fire, e.g. an optimizer step) as early as possible.
        self.sequence_nr = math.inf
        self.variable = variable

    def tensor_pre_hooks(self, input_nr: int) -> list:
        # The leaf's own hooks (Variable.register_hook) run as this node's tensor pre-hooks.
        return list(self.variable._hooks.values())

    def apply(self, grad_outputs: list) -> tuple:
        (new_grad,) = grad_outputs
        if new_grad is None:
            return ()
        var = self.variable
        if var.grad is None:
            # torch may "steal" new_grad's buffer when nothing else references it; we always copy so
            # that an in-place accumulation later cannot write into a gradient another leaf holds.
            # Under create_graph, clone() is recorded (CloneBackward0), so .grad is differentiable.
            var.grad = new_grad.clone() if is_grad_enabled() else Variable(new_grad.data.clone())
        elif not is_grad_enabled():
            var.grad.data.add_(new_grad.data)  # in place, like `variable_grad += new_grad`
        else:
            var.grad = var.grad + new_grad     # create_graph: out of place, so the sum has a graph
        for hook in list(var._post_accumulate_grad_hooks.values()):
            if hook(var) is not None:
                raise RuntimeError("post accumulate grad hooks must return None")
        return ()


class GraphRoot(Node):
    """Where the engine starts: returns the root gradients, one per root edge."""

    def __init__(self, root_edges, root_grads):
        super().__init__(next_functions=root_edges, input_shapes=[tuple(g.shape) for g in root_grads])
        self.root_grads = list(root_grads)
        self.num_inputs = 0

    def apply(self, grad_outputs: list) -> tuple:
        return tuple(self.root_grads)
