"""The backward pass: a dependency-counted walk of the graph from the root, like PyTorch's engine.

Reference solution of the exercise "implement the backward pass: topological order, accumulation,
hooks". Mirrors torch/csrc/autograd/engine.cpp (CPU path, one thread, no reentrancy):

- ``compute_dependencies``  For every node reachable from the root, how many edges point at it:
                            the number of consumers that will send it a gradient.
- ``execute``               ``Engine::execute`` + ``thread_main`` + ``evaluate_function``: a node is
                            *ready* when all its consumers have sent their gradient, which the engine
                            sums in the node's input buffer (``InputBuffer::add``). Ready nodes wait
                            in a priority queue (``ReadyQueue``): the one with the highest
                            ``sequence_nr`` (created last in the forward) runs first, AccumulateGrad
                            before everything. Grad mode is set to ``create_graph`` while it runs.
- ``call_function``         tensor pre-hooks (``register_hook``) then ``retain_grad`` hooks, node
                            pre-hooks, the node itself, ``validate_outputs`` (count and shapes), node
                            post-hooks; then, unless ``retain_graph``, ``release_variables``.
- ``backward`` / ``grad``   ``torch.autograd.backward`` / ``torch.autograd.grad``. ``grad`` *captures*
                            the gradient at the inputs' edges instead of accumulating it: only nodes
                            on a path to an input run (``GraphTask::init_to_execute``), and ``.grad``
                            of leaves is left untouched.
"""
from __future__ import annotations

import heapq
from itertools import count

import torch

from .node import GraphRoot, Node
from .variable import Variable, gradient_edge, install_default_backward, set_grad_enabled, use_backward  # noqa: F401


def compute_dependencies(root: Node) -> dict:
    """``{node: number of incoming edges}`` for every node reachable from ``root`` (root excluded).

    Iterative DFS, so a 10,000-op chain does not hit Python's recursion limit.
    """
    if not isinstance(root, Node):
        raise TypeError(f"root must be a Node, got {type(root).__name__}")
    dependencies: dict = {}
    seen = {root}
    stack = [root]
    while stack:
        fn = stack.pop()
        for next_fn, _input_nr in fn.next_functions:
            if next_fn is None:
                continue
            dependencies[next_fn] = dependencies.get(next_fn, 0) + 1
            if next_fn not in seen:
                seen.add(next_fn)
                stack.append(next_fn)
    return dependencies


def _nodes_needed(root: Node, dependencies: dict, capture_nodes: set) -> set:
    """Nodes on some path from ``root`` to a captured node (torch ``GraphTask::init_to_execute``)."""
    order, deps, ready = [], dict(dependencies), [root]
    while ready:  # Kahn's algorithm: consumers before producers
        fn = ready.pop()
        order.append(fn)
        for next_fn, _ in fn.next_functions:
            if next_fn is not None:
                deps[next_fn] -= 1
                if deps[next_fn] == 0:
                    ready.append(next_fn)
    needed: set = set()
    for fn in reversed(order):  # producers first, so every next_fn is decided before fn
        if any(n is not None and (n in needed or n in capture_nodes) for n, _ in fn.next_functions):
            needed.add(fn)
    return needed


def call_tensor_pre_hooks(fn: Node, inputs: list) -> list:
    """``register_hook`` hooks, then the ``retain_grad`` hook (last in ``tensor_pre_hooks``)."""
    inputs = list(inputs)
    for input_nr in range(len(inputs)):
        for hook in fn.tensor_pre_hooks(input_nr):
            if inputs[input_nr] is None:
                continue
            result = hook(inputs[input_nr])
            if result is not None:
                if not isinstance(result, Variable) or result.shape != inputs[input_nr].shape:
                    raise RuntimeError(f"hook {getattr(hook, '__name__', hook)!r} must return None or a "
                                       f"Variable of shape {tuple(inputs[input_nr].shape)}, got {result!r}")
                inputs[input_nr] = result
    return inputs


def validate_outputs(fn: Node, grads) -> None:
    """Check what a node returned: one gradient per edge, each of its input's shape."""
    if len(grads) != len(fn.next_functions):
        raise RuntimeError(f"function {fn.name()} returned an incorrect number of gradients "
                           f"(expected {len(fn.next_functions)}, got {len(grads)})")
    for i, (g, (next_fn, _)) in enumerate(zip(grads, fn.next_functions, strict=True)):
        if g is None or next_fn is None:
            continue
        if not isinstance(g, Variable):
            raise TypeError(f"function {fn.name()} returned a {type(g).__name__} at index {i}; gradients "
                            "inside the engine must be Variables (write formulas with ops both types have)")
        expected = fn.input_shapes[i]
        if expected is not None and tuple(g.shape) != tuple(expected):
            raise RuntimeError(f"Function {fn.name()} returned an invalid gradient at index {i} - got "
                               f"{list(g.shape)} but expected shape compatible with {list(expected)} "
                               "(did the formula forget to unbroadcast?)")


def call_function(fn: Node, inputs: list, keep_graph: bool, hooks_done: bool = False) -> list:
    if not hooks_done:
        inputs = call_tensor_pre_hooks(fn, inputs)
    for hook in list(fn._pre_hooks.values()):
        result = hook(tuple(inputs))
        if result is not None:
            inputs = list(result)
    outputs = list(fn.apply(inputs))
    validate_outputs(fn, outputs)
    for hook in list(fn._post_hooks.values()):
        result = hook(tuple(outputs), tuple(inputs))
        if result is not None:
            outputs = list(result)
    if not keep_graph:
        fn.release_variables()  # frees saved tensors: a second backward through fn now raises
    return outputs


def execute(graph_root: GraphRoot, keep_graph: bool, create_graph: bool, capture_edges=None) -> list:
    """Run the backward pass from ``graph_root``. Returns the gradients captured at ``capture_edges``.

    ``capture_edges`` is None for ``backward`` (every reachable node runs, leaves accumulate .grad),
    or a list of ``(node, input_nr)`` for ``grad`` (only the nodes needed to reach them run).
    """
    dependencies = compute_dependencies(graph_root)
    capture_edges = list(capture_edges) if capture_edges is not None else None
    captured = [None] * len(capture_edges or ())
    capture_nodes = {n for n, _ in capture_edges} if capture_edges else set()
    needed = _nodes_needed(graph_root, dependencies, capture_nodes) if capture_edges is not None else None

    not_ready: dict = {}  # node -> input buffer: list of summed gradients, one per node input
    ready: list = []      # heap of (-sequence_nr, tie, node, inputs)
    tie = count()
    heapq.heappush(ready, (-graph_root.sequence_nr, next(tie), graph_root, []))
    with set_grad_enabled(create_graph):  # formulas record a graph only if create_graph
        while ready:
            _, _, fn, inputs = heapq.heappop(ready)
            hooks_done = False
            if needed is not None:
                if fn not in needed:  # torch: tensor pre-hooks run before capturing here
                    inputs, hooks_done = call_tensor_pre_hooks(fn, inputs), True
                for i, (cap_fn, input_nr) in enumerate(capture_edges):
                    if cap_fn is fn:
                        captured[i] = inputs[input_nr]
                if fn not in needed:
                    continue  # a captured leaf's AccumulateGrad does not run: .grad stays as it was
            outputs = call_function(fn, inputs, keep_graph, hooks_done)
            for grad, (next_fn, input_nr) in zip(outputs, fn.next_functions, strict=True):
                if next_fn is None:
                    continue
                dependencies[next_fn] -= 1
                if needed is not None and next_fn not in needed and next_fn not in capture_nodes:
                    continue
                buffer = not_ready.setdefault(next_fn, [None] * next_fn.num_inputs)
                if grad is not None:  # InputBuffer::add: sum the gradients from all consumers
                    buffer[input_nr] = grad if buffer[input_nr] is None else buffer[input_nr] + grad
                if dependencies[next_fn] == 0:
                    heapq.heappush(ready, (-next_fn.sequence_nr, next(tie), next_fn, not_ready.pop(next_fn)))
    return captured


# ------------------------------------------------------------------------------------- public API
def _root_grad(root: Variable, grad, i: int) -> Variable:
    if grad is None:
        if root.numel() != 1:
            raise ValueError(f"grad can be implicitly created only for scalar outputs; outputs[{i}] has "
                             f"shape {tuple(root.shape)}, pass its gradient explicitly")
        return Variable(torch.ones_like(root.data))
    if isinstance(grad, torch.Tensor):
        grad = Variable(grad)
    if not isinstance(grad, Variable):
        raise TypeError(f"grad_outputs[{i}] must be a Variable, a torch.Tensor or None, got "
                        f"{type(grad).__name__}")
    if grad.shape != root.shape:
        raise ValueError(f"Mismatch in shape: grad_outputs[{i}] has a shape of {tuple(grad.shape)} and "
                         f"outputs[{i}] has a shape of {tuple(root.shape)}")
    return grad


def _as_list(x, arg: str) -> list:
    items = [x] if isinstance(x, Variable) else list(x) if isinstance(x, (list, tuple)) else None
    if items is None or not all(isinstance(v, Variable) for v in items):
        raise TypeError(f"{arg} must be a Variable or a sequence of Variables, got {x!r}")
    if not items:
        raise ValueError(f"{arg} must not be empty")
    return items


def _make_graph_root(outputs: list, grad_outputs) -> GraphRoot:
    if grad_outputs is None or isinstance(grad_outputs, (Variable, torch.Tensor)):
        grad_outputs = [grad_outputs] * len(outputs) if grad_outputs is None else [grad_outputs]
    if not isinstance(grad_outputs, (list, tuple)):
        raise TypeError(f"grad_outputs must be None, a Variable, a torch.Tensor or a sequence of them, "
                        f"got {type(grad_outputs).__name__}")
    if len(grad_outputs) != len(outputs):
        raise ValueError(f"grad_outputs has {len(grad_outputs)} entries but outputs has {len(outputs)}")
    grads, edges = [], []
    for i, (out, g) in enumerate(zip(outputs, grad_outputs, strict=True)):
        if not out.requires_grad:
            raise RuntimeError(f"element {i} of tensors does not require grad and does not have a grad_fn")
        grads.append(_root_grad(out, g, i))
        edges.append(gradient_edge(out))
    return GraphRoot(edges, grads)


def backward(root, grad=None, retain_graph: bool | None = None, create_graph: bool = False) -> None:
    """``torch.autograd.backward``: accumulate d(root)/d(leaf) into every reachable leaf's ``.grad``.

    ``root`` is a Variable (or a list of them, with ``grad`` a matching list). ``grad`` defaults to
    ones for a one-element root. ``retain_graph`` defaults to ``create_graph``; without it the saved
    tensors are freed as the nodes run.
    """
    roots = _as_list(root, "root")
    if not isinstance(create_graph, bool):
        raise TypeError(f"create_graph must be a bool, got {type(create_graph).__name__}")
    keep_graph = create_graph if retain_graph is None else retain_graph
    if not isinstance(keep_graph, bool):
        raise TypeError(f"retain_graph must be a bool or None, got {type(retain_graph).__name__}")
    execute(_make_graph_root(roots, grad), keep_graph, create_graph)


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None, create_graph: bool = False,
         allow_unused: bool = False) -> tuple:
    """``torch.autograd.grad``: return d(outputs)/d(inputs) without touching any ``.grad``."""
    outputs, inputs = _as_list(outputs, "outputs"), _as_list(inputs, "inputs")
    if not isinstance(create_graph, bool):
        raise TypeError(f"create_graph must be a bool, got {type(create_graph).__name__}")
    keep_graph = create_graph if retain_graph is None else retain_graph
    for i, x in enumerate(inputs):
        if not x.requires_grad:
            raise RuntimeError(f"One of the differentiated Tensors does not require grad (inputs[{i}])")
    graph_root = _make_graph_root(outputs, grad_outputs)
    result = execute(graph_root, keep_graph, create_graph, capture_edges=[gradient_edge(x) for x in inputs])
    for i, g in enumerate(result):
        if g is None and not allow_unused:
            raise RuntimeError(f"One of the differentiated Tensors (inputs[{i}]) appears to not have been "
                               "used in the graph. Set allow_unused=True if this is the desired behavior.")
    return tuple(result)


# ------------------------------------------------------------------------ a pluggable backward
# Variable.backward() runs the reference engine unless another one is plugged in with use_backward
# (which lives in the scaffold, variable.py, so that graded code can use it without this module).
install_default_backward(backward)
