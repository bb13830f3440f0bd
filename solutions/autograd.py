# %% [markdown]
# # {{title}}
#
# `loss.backward()` looks like one line of magic. Underneath, every differentiable operation you ran
# in the forward pass left a **node** behind: an object that knows how to turn the gradient of its
# output into gradients for its inputs, and holds whatever tensors it needs for that ("saved
# tensors"). The nodes point at each other, from the loss back to the parameters: a graph. Calling
# `backward()` hands that graph to PyTorch's C++ **engine** (torch/csrc/autograd/engine.cpp), which
# walks it from the loss, in an order where every node runs only once all the gradients for its
# output have arrived, and adds the results into each parameter's `.grad`.
#
# In this chapter you will read that graph on real PyTorch, then rebuild the two halves of autograd
# in a small engine of your own (the backward **formulas** and the **engine** that runs them), and
# then use what you learned on the tools people use daily: custom `torch.autograd.Function`s that
# save less memory, a straight-through estimator, activation checkpointing, gradient accumulation,
# hooks, and the error messages autograd gives when something is wrong.
#
# **How this notebook works.** Run the cells in order. Each exercise has an *answer cell* (replace
# `raise NotImplementedError()` with your code) followed by a *check cell* that gives instant
# feedback. Only the code inside answer cells is graded; define any helper you need inside the same
# answer cell. The grader runs your code in a separate process, without the course's reference
# implementation, on many more cases than the visible ones, and compares with real PyTorch. Quiz
# answers are recorded in `autograd.answers.json` beside this notebook: *practice* questions check
# your answer at once and count no points; *graded* ones only record it (the last answer counts) and
# are scored when your notebook is graded.

# %% [setup]
import torch
import torch.nn as nn
import torch.nn.functional as F

from ptinternals.autograd.scaffold import OP_SAVES, Variable, use_formulas
from ptinternals.grading import check
from ptinternals.quiz import quiz_progress, show_quiz
from ptinternals.viz.autograd import draw_graph, draw_graphs

torch.manual_seed(0)

# %% [markdown]
# ## 1. The graph that the forward pass records
#
# A tensor you create with `requires_grad=True` is a **leaf**. Every op on it is recorded: the
# result gets a `grad_fn`, the node that will compute the op's backward. The node's
# `next_functions` are its edges, one `(node, input_nr)` pair per forward input, pointing to where
# each input's gradient must go next:
#
# * the `grad_fn` of an input that was itself computed (a non-leaf),
# * an `AccumulateGrad` node for a leaf that requires grad (it adds the gradient into `leaf.grad`),
# * `None` for an input that needs no gradient (a constant, data, a frozen weight).
#
# Who writes these nodes? For every ATen op, `tools/autograd/derivatives.yaml` states its derivative
# and what it must save; the build generates one node class per formula (`MulBackward0`,
# `TanhBackward0`, ... in torch/csrc/autograd/generated/Functions.h) and the kernels that record them
# (`VariableType_*.cpp`). The node base class is `Node` in torch/csrc/autograd/function.h.

# %%
x = torch.randn(3, requires_grad=True)  # a leaf: (3,) float32, 12 bytes
w = torch.randn(3, requires_grad=True)  # a leaf
c = torch.randn(3)                      # a constant: requires_grad=False
y = x * w                               # recorded: y.grad_fn is a MulBackward0
loss = (y.tanh() + c).sum()             # () : the root of the graph

print("loss.grad_fn:", loss.grad_fn.name())
print("its next_functions:", loss.grad_fn.next_functions)


def walk(fn, depth=0):
    """Print the graph below node `fn`, following next_functions (what the engine follows)."""
    name = fn.name().replace("torch::autograd::", "") if fn is not None else "None  (an input that needs no gradient)"
    extra = f"  -> fills .grad of a leaf of shape {tuple(fn.variable.shape)}" if hasattr(fn, "variable") else ""
    print("    " * depth + name + extra)
    if fn is not None:
        for next_fn, _input_nr in fn.next_functions:
            walk(next_fn, depth + 1)


walk(loss.grad_fn)
print("x.is_leaf:", x.is_leaf, "| y.is_leaf:", y.is_leaf, "| x.grad_fn:", x.grad_fn)

# %% [markdown]
# The drawing below is the same walk: from the root at the top, each arrow is one entry of
# `next_functions`, in the direction the gradient flows. (The constant `c` has no node at all: the
# edge for it in `AddBackward0` is `None`, so no arrow is drawn.)

# %%
draw_graph(loss, "torch: (tanh(x * w) + c).sum()")

# %% [markdown]
# ### Leaves, non-leaves and `.grad`
#
# After `backward()`, only **leaves** that require grad get a `.grad`: those are the tensors you
# optimize. Gradients of intermediate values (`y` above) are computed, passed on and dropped, unless
# you ask to keep one with `y.retain_grad()` *before* the backward pass (it registers a hook on `y`'s
# node that stores the gradient). Reading `.grad` of a non-leaf without it gives `None` and a
# warning.
#
# Gradients **accumulate**: `AccumulateGrad` adds into `.grad`, it never overwrites
# (torch/csrc/autograd/functions/accumulate_grad.h). A second backward adds a second gradient. That
# is why training loops call `optimizer.zero_grad()` (which sets `.grad = None` by default), and also
# what makes gradient accumulation over micro-batches ({{exercise accumulate}}) possible.

# %%
y.retain_grad()
loss.backward()
print("x.grad:", x.grad, "\nw.grad:", w.grad, "\nc.grad:", c.grad, "(a constant)")
print("y.grad (kept by retain_grad):", y.grad)

x_grad_once = x.grad.clone()
(x * w).tanh().sum().backward()  # a new graph over the same leaves
print("x.grad after a second backward: the sum of both:", torch.allclose(x.grad, 2 * x_grad_once))
x.grad = None  # what optimizer.zero_grad() does
w.grad = None

# %% [quiz]
show_quiz("autograd", "q1", "q2")

# %% [markdown]
# ## 2. A mini engine you can open
#
# The rest of the chapter uses a small reverse-mode engine written in Python, built like PyTorch's:
# `ptinternals.autograd.scaffold`. Its `Variable` wraps a tensor (torch still does the maths) and
# mirrors the autograd half of a tensor: `grad`, `grad_fn`, `requires_grad`, `is_leaf`,
# `register_hook`, `retain_grad`. Its ops (`+ - * / @ ** exp log tanh sigmoid relu sum mean reshape
# transpose expand clone`) record nodes with `next_functions`, a `sequence_nr` (creation order) and
# saved values, and leaves get `AccumulateGrad` nodes. The same program, the same graph:

# %%
xv = Variable(x.detach().clone(), requires_grad=True)
wv = Variable(w.detach().clone(), requires_grad=True)
yv = xv * wv
loss_v = (yv.tanh() + c).sum()
print("mini engine:", loss_v.grad_fn.name(), loss_v.grad_fn.next_functions)
draw_graphs([("torch", loss), ("mini engine", loss_v)])

# %% [markdown]
# What the scaffold does **not** contain is the two pieces you will write:
#
# 1. the **backward formula** of each op: `OpNode.apply` looks the op's formula up, by name, in a
#    table *when the node runs* (so your formulas can be plugged in with `use_formulas`);
# 2. the **engine**: the function that walks the graph from the root and calls the nodes.
#
# (In this notebook the course's reference formulas and engine are installed, so the demos run;
# the grader runs your code without them.) Each node saves what its formula needs:

# %%
for op in ("add", "mul", "div", "matmul", "exp", "tanh", "sum"):
    print(f"{op:7s} saves {OP_SAVES[op]}")
loss_v.backward()  # the reference engine and formulas
print("same gradients as torch:", torch.allclose(xv.grad.data, torch.autograd.grad((x * w).tanh().sum(), x)[0]))

# %% [markdown]
# ## 3. Backward formulas
#
# A node is a **vector-Jacobian product**: given `grad`, the gradient of the loss with respect to
# the op's output, it returns the gradient with respect to each input. For `out = a * b`:
# `grad_a = grad * b` and `grad_b = grad * a` (elementwise). For `out = a @ b`:
# `grad_a = grad @ b^T`, `grad_b = a^T @ grad`. For `out = x.sum(dim)`: every input element
# contributed once, so `grad_x` is `grad` copied back over the summed dims.
#
# **Broadcasting** adds a twist. With `a: (4, 1)` and `b: (3,)`, `a * b` is `(4, 3)` and so is
# `grad * b`; but `a`'s gradient must have `a`'s shape. Each element of `a` was used 3 times (once
# per column), so its gradient is the **sum** of those 3 contributions: sum over the dims
# broadcasting created (new leading dims, and dims where the input had size 1). PyTorch's formulas
# return the full-size gradient and the engine reduces it with `at::sum_to` in `validate_outputs`
# (engine.cpp); in the mini engine each formula does it itself, with `unbroadcast`.

# %%
a = torch.randn(4, 1, requires_grad=True)
b = torch.randn(3, requires_grad=True)
(a * b).sum().backward()
print("a.grad shape", tuple(a.grad.shape), "| b.grad shape", tuple(b.grad.shape))
print("b.grad == (1 * a) summed over the broadcast dim:", torch.allclose(b.grad, a.detach().expand(4, 3).sum(0)))

# %% [markdown]
# ### {{exercise unbroadcast}}: `unbroadcast`
#
# Write `unbroadcast(grad, shape)`: sum `grad` down to `shape`, the adjoint of broadcasting (what
# `Tensor.sum_to_size` does, which you may not call). `shape` broadcasts to `grad.shape` when,
# aligned from the right, each of its sizes is 1 or equal to `grad`'s; otherwise raise `ValueError`.
# Sum over the leading dims `grad` has in excess, and over the dims where `shape` has 1 and `grad`
# does not (`keepdim=True` keeps them as size 1), then `reshape(shape)`.
#
# Use only what both a `torch.Tensor` and a mini-engine `Variable` have (`.shape`, `.ndim`,
# `.sum(dim=..., keepdim=...)`, `.reshape(...)`): the checker calls your function on both, because
# your formulas will call it inside the engine.

# %% [answer unbroadcast]
def unbroadcast(grad, shape):
    """Sum grad down to `shape` (which broadcasts to grad.shape); ValueError if it does not."""
    ### BEGIN SOLUTION
    # twin: ptinternals.autograd.formulas.unbroadcast
    shape = tuple(shape)
    gshape = tuple(grad.shape)
    lead = len(gshape) - len(shape)
    if lead < 0 or any(s != 1 and s != g for s, g in zip(shape, gshape[lead:])):
        raise ValueError(f"shape {shape} does not broadcast to grad's shape {gshape}")
    dims = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and gshape[lead + i] != 1)
    if dims:
        grad = grad.sum(dim=dims, keepdim=True)  # (1, ..., 1, *shape with 1s kept)
    return grad.reshape(shape)
    ### END SOLUTION


# %% [tests unbroadcast]
check("autograd.unbroadcast", unbroadcast)
### BEGIN HIDDEN TESTS
check("autograd.unbroadcast", unbroadcast, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### {{exercise formulas}}: seven backward formulas
#
# Write the formulas below. Each gets `grad` (the gradient for the op's output) and what the node
# saved (`OP_SAVES` above), and returns a **tuple** with one gradient per input, each of that
# input's shape. Details that matter:
#
# * `exp` and `tanh` save their **result** (`e^x`, `tanh(x)`), not their input: derivatives.yaml
#   does the same, because the derivative is cheapest from the result.
# * `add` saves no tensor at all, only the input shapes (so it can be backwarded twice).
# * `matmul` follows `torch.matmul`: a 1-d `a: (k,)` acts as `(1, k)` and a 1-d `b: (k,)` as
#   `(k, 1)` (the added dim is removed from the result), and batch dims broadcast.
# * `sum` gets `dim` as `None` (all dims) or a sorted tuple of non-negative dims; with
#   `keepdim=False` the summed dims are gone from `grad`: put them back as size 1, then `expand`.
#
# As in {{exercise unbroadcast}}, write them with operators (`+ - * / @ **`) and methods both tensors and
# Variables have (`.exp() .tanh() .sum(dim, keepdim) .reshape() .transpose(d0, d1) .expand()`,
# `.shape`, `.ndim`): the checker runs them on both and compares with `torch.autograd.grad`. A formula
# written this way is itself differentiable inside the mini engine, which is how `create_graph=True`
# (second derivatives) works there and in PyTorch. `torch.autograd` is unavailable in this exercise,
# and the checker calls a correct `unbroadcast` in place of yours (a mistake there costs points in
# {{exercise unbroadcast}} only).

# %% [answer formulas]
import torch


def add_backward(grad, a_shape, b_shape):
    ### BEGIN SOLUTION
    # twin backward_formula: ptinternals.autograd.formulas.backward_formula
    return unbroadcast(grad, a_shape), unbroadcast(grad, b_shape)
    ### END SOLUTION


def mul_backward(grad, a, b):
    ### BEGIN SOLUTION
    return unbroadcast(grad * b, a.shape), unbroadcast(grad * a, b.shape)
    ### END SOLUTION


def div_backward(grad, a, b):
    ### BEGIN SOLUTION
    return unbroadcast(grad / b, a.shape), unbroadcast(-grad * a / (b * b), b.shape)
    ### END SOLUTION


def matmul_backward(grad, a, b):
    ### BEGIN SOLUTION
    a2 = a.reshape(1, a.shape[0]) if a.ndim == 1 else a  # (..., m, k)
    b2 = b.reshape(b.shape[0], 1) if b.ndim == 1 else b  # (..., k, n)
    batch = tuple(torch.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]))
    g2 = grad.reshape(batch + (a2.shape[-2], b2.shape[-1]))  # (*batch, m, n)
    grad_a = unbroadcast(g2 @ b2.transpose(-1, -2), a2.shape).reshape(a.shape)  # (*batch, m, n) @ (..., n, k)
    grad_b = unbroadcast(a2.transpose(-1, -2) @ g2, b2.shape).reshape(b.shape)  # (..., k, m) @ (*batch, m, n)
    return grad_a, grad_b
    ### END SOLUTION


def exp_backward(grad, result):
    ### BEGIN SOLUTION
    return (grad * result,)
    ### END SOLUTION


def tanh_backward(grad, result):
    ### BEGIN SOLUTION
    return (grad * (1 - result * result),)
    ### END SOLUTION


def sum_backward(grad, input_shape, dim, keepdim):
    ### BEGIN SOLUTION
    input_shape = tuple(input_shape)
    dims = range(len(input_shape)) if dim is None else dim
    kept = tuple(1 if d in dims else s for d, s in enumerate(input_shape))  # summed dims back as size 1
    return (grad.reshape(kept).expand(input_shape),)
    ### END SOLUTION


MY_FORMULAS = {"add": add_backward, "mul": mul_backward, "div": div_backward, "matmul": matmul_backward,
               "exp": exp_backward, "tanh": tanh_backward, "sum": sum_backward}


def backward_formula(op, grad, *saved):
    """What the checker calls: the formula for `op` applied to (grad, *saved)."""
    return MY_FORMULAS[op](grad, *saved)


# %% [tests formulas]
check("autograd.formulas", backward_formula)
### BEGIN HIDDEN TESTS
check("autograd.formulas", backward_formula, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# Once your formulas pass, they plug into the mini engine with `with use_formulas(MY_FORMULAS): ...`.
# The engine checks the shape of what each formula returns (as PyTorch's `validate_outputs` does), so
# a formula that forgets to unbroadcast fails loudly. Here is that failure, with a deliberately
# broken formula:

# %%
def mul_backward_forgets_unbroadcast(grad, a, b):
    return grad * b, grad * a  # (4, 3) and (4, 3): not the inputs' shapes


with use_formulas({"mul": mul_backward_forgets_unbroadcast}):
    av = Variable(torch.randn(4, 1), requires_grad=True)
    bv = Variable(torch.randn(3), requires_grad=True)
    try:
        (av * bv).sum().backward()
    except RuntimeError as e:
        print("RuntimeError:", e)

# %% [markdown]
# ## 4. The engine: who runs when
#
# `Engine::execute` (torch/csrc/autograd/engine.cpp) runs a graph in three steps:
#
# 1. **Count dependencies** (`compute_dependencies`): for every node reachable from the root, the
#    number of edges that point at it, i.e. how many consumers will send it a gradient.
# 2. **Run ready nodes**: a node is *ready* when all its consumers have sent their gradients, which
#    the engine **sums** in the node's input buffer (`InputBuffer::add`, input_buffer.cpp) as they
#    arrive. Ready nodes wait in a priority queue (`ReadyQueue`) ordered by `sequence_nr`: the node
#    created last in the forward runs first, and `AccumulateGrad` (the largest `sequence_nr`) before
#    everything, so `.grad` fills as early as possible.
# 3. **Call each node** (`call_function`): run the tensor hooks on its incoming gradient, call the
#    node, check its outputs, send each output along its edge (decrementing the count of the node at
#    the other end), and, unless `retain_graph=True`, free the node's saved tensors
#    (`release_variables`).
#
# Why wait for *all* consumers? In `y = tanh(x); z = sigmoid(y) * exp(y)`, the gradient of `y` has
# two parts, one through `sigmoid` and one through `exp`. If `TanhBackward0` ran as soon as the first
# part arrived, it would pass on half a gradient, then run a second time and find its saved result
# freed. Counting dependencies is a topological sort done on the fly (Kahn's algorithm): here
# `TanhBackward0` starts with a count of 2.

# %%
x = torch.randn(2, 3, requires_grad=True)
y = x.tanh()
z = (y.sigmoid() * y.exp()).sum()
draw_graph(z, "y = tanh(x) feeds two ops")

# %% [markdown]
# ### {{exercise backward}}: the backward pass
#
# Write `backward(root, grad, retain_graph=False)` for the mini engine: accumulate the gradient of
# `root` (weighted by `grad`, a `Variable` of `root`'s shape) into the `.grad` of every leaf that
# requires grad. What you have (from `ptinternals.autograd.scaffold`):
#
# * `gradient_edge(root)` returns `(node, 0)`: `root.grad_fn`, or the `AccumulateGrad` node of a leaf
#   root, or `None` when no gradient is needed.
# * every node `fn` has `fn.next_functions` (a tuple of `(next_node or None, input_nr)`, one per
#   forward input), `fn.sequence_nr`, `fn.apply([g])` (returns a tuple with one gradient, or `None`,
#   per entry of `next_functions`; an `AccumulateGrad` node adds `g` into its leaf's `.grad`, runs
#   the post-accumulate hooks and returns `()`), `fn.tensor_pre_hooks(0)` (the hooks to run on the
#   incoming gradient, in order: each `hook(g)` returns a replacement gradient or `None` for "keep
#   it"; `retain_grad()`'s hook is the last one) and `fn.release_variables()`.
# * every node of the mini engine has exactly one input (each op has one output), so a node's
#   buffer is a single gradient.
#
# The steps: count dependencies with a walk from the start node; then run ready nodes (`heapq` with
# `(-fn.sequence_nr, tie_breaker, fn)` gives PyTorch's order, though any order that waits for all
# consumers gives the same gradients), running the hooks, calling `apply`, releasing, and summing
# each output into the buffer of the node it is sent to. Two subtleties: an edge whose gradient is
# `None` still counts as delivered, and gradients are plain values unless `create_graph`, so run the
# loop under the mini engine's `no_grad()`. The checker builds random graphs (fan-out, broadcasting,
# hooks, `retain_grad`, leaves without `requires_grad`, `x * y.detach()`, second backward passes)
# and compares everything with real PyTorch.

# %% [answer backward]
import heapq

from ptinternals.autograd.scaffold import gradient_edge, no_grad


def backward(root, grad, retain_graph=False):
    """Accumulate d(root)/d(leaf), weighted by `grad`, into the .grad of every reachable leaf."""
    ### BEGIN SOLUTION
    # twin: ptinternals.autograd.engine.backward
    start, _ = gradient_edge(root)
    if start is None:
        return
    dependencies = {}  # node -> number of edges pointing at it (consumers still to report)
    seen, stack = {start}, [start]
    while stack:
        fn = stack.pop()
        for next_fn, _ in fn.next_functions:
            if next_fn is None:
                continue
            dependencies[next_fn] = dependencies.get(next_fn, 0) + 1
            if next_fn not in seen:
                seen.add(next_fn)
                stack.append(next_fn)
    buffers = {start: grad}  # node -> sum of the gradients its consumers sent (InputBuffer)
    ready = [(-start.sequence_nr, 0, start)]  # ReadyQueue: highest sequence_nr first
    tie = 1
    with no_grad():
        while ready:
            _, _, fn = heapq.heappop(ready)
            g = buffers.pop(fn, None)
            if g is not None:
                for hook in fn.tensor_pre_hooks(0):
                    result = hook(g)
                    if result is not None:
                        g = result
            grads = fn.apply([g])
            if not retain_graph:
                fn.release_variables()
            for (next_fn, _), g_in in zip(fn.next_functions, grads):
                if next_fn is None:
                    continue
                if g_in is not None:
                    buffers[next_fn] = g_in if next_fn not in buffers else buffers[next_fn] + g_in
                dependencies[next_fn] -= 1
                if dependencies[next_fn] == 0:
                    heapq.heappush(ready, (-next_fn.sequence_nr, tie, next_fn))
                    tie += 1
    ### END SOLUTION


# %% [tests backward]
check("autograd.backward", backward)
### BEGIN HIDDEN TESTS
check("autograd.backward", backward, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# With both pieces passing, the mini engine is complete:
# `with use_formulas(MY_FORMULAS): backward(loss, Variable(torch.ones(())))` runs your engine on
# your formulas, for any graph built from those seven ops.
#
# ### `retain_graph`: saved tensors are freed as the graph runs
#
# After a node has run, its saved tensors are released (so a training step's activations are freed
# during backward, not after). A second backward through the same graph then fails, with PyTorch's
# best-known message. `retain_graph=True` keeps them, and the second backward's gradients add to the
# first. (Graphs of nodes that save nothing, like a sum of additions, can be backwarded twice anyway.)

# %%
x = torch.randn(3, requires_grad=True)
loss = x.exp().sum()  # ExpBackward0 saves its result
loss.backward()
try:
    loss.backward()
except RuntimeError as e:
    print("RuntimeError:", str(e)[:110], "...")

loss = x.exp().sum()
loss.backward(retain_graph=True)
loss.backward()
print("after two backward passes, x.grad == 3 * exp(x):", torch.allclose(x.grad, 3 * x.exp()))

# %% [markdown]
# ### `create_graph`: gradients of gradients
#
# With `create_graph=True`, the backward formulas themselves are recorded (they are ordinary
# differentiable ops), so the gradient has a `grad_fn` and can be differentiated again: second
# derivatives, Hessian-vector products, gradient penalties. The mini engine does the same because
# its formulas are written in its own ops.

# %%
x = torch.tensor(2.0, requires_grad=True)
(g,) = torch.autograd.grad(x ** 3, x, create_graph=True)  # 3 x^2 = 12, with a grad_fn
(h,) = torch.autograd.grad(g, x)                         # 6 x = 12
print(f"torch: d/dx x^3 = {g.item()} (grad_fn {g.grad_fn.name()}), d2/dx2 = {h.item()}")

xv = Variable(torch.tensor(2.0), requires_grad=True)
(xv ** 3).backward(create_graph=True)
gv = xv.grad  # a Variable with a graph
xv.grad = None
gv.backward()
print(f"mini engine: first derivative {gv.item()} (grad_fn {gv.grad_fn.name()}), second {xv.grad.item()}")

# %% [quiz]
show_quiz("autograd", "q3", "q4")

# %% [markdown]
# ## 5. Hooks: code that runs inside backward (and forward)
#
# * `tensor.register_hook(fn)`: `fn(grad)` runs when the gradient for that tensor has been summed,
#   before it is passed on; returning a tensor replaces it (per-tensor gradient clipping, debugging).
#   On a non-leaf it is a pre-hook of its `grad_fn`; on a leaf, of its `AccumulateGrad`.
# * `param.register_post_accumulate_grad_hook(fn)`: `fn(param)` runs right after `param.grad` was
#   written. Since `AccumulateGrad` runs as soon as it is ready, this is the place for an
#   *optimizer step inside backward*, which frees each gradient long before backward ends.

# %%
x = torch.randn(5, requires_grad=True)
h = x * 3
h.register_hook(lambda grad: grad.clamp(-0.5, 0.5))  # grad of h is 1 everywhere: clamped to 0.5
h.sum().backward()
print("x.grad = 3 * clamp(1):", x.grad)

model = nn.Linear(4, 2)
optimizers = {p: torch.optim.SGD([p], lr=0.1) for p in model.parameters()}


def step_in_backward(param):
    optimizers[param].step()  # update as soon as this gradient exists...
    param.grad = None          # ...and free it: peak memory never holds all gradients at once


for p in model.parameters():
    p.register_post_accumulate_grad_hook(step_in_backward)
before = model.weight.detach().clone()
model(torch.randn(8, 4)).pow(2).mean().backward()
print("weight updated during backward:", not torch.equal(before, model.weight), "| grad freed:", model.weight.grad is None)

# %% [markdown]
# ### Module hooks, and why `model(x)` is not `model.forward(x)`
#
# `nn.Module.__call__` (`_call_impl` in torch/nn/modules/module.py) runs the module's forward
# pre-hooks, then `forward`, then its forward hooks, and wires up backward hooks. Calling
# `model.forward(x)` directly runs only `forward`: **every hook is silently skipped**. That matters
# because real tools live in hooks: FSDP gathers a layer's sharded parameters in a forward pre-hook,
# activation-statistics observers and profilers use forward hooks, `register_full_backward_hook`
# powers gradient inspection. The output of `model.forward(x)` looks right; the system around it
# is broken.

# %%
calls = []
mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
mlp.register_forward_pre_hook(lambda module, args: calls.append("forward pre-hook"))
mlp.register_forward_hook(lambda module, args, output: calls.append("forward hook"))
mlp.register_full_backward_hook(lambda module, grad_in, grad_out: calls.append("backward hook"))

batch = torch.randn(3, 4, requires_grad=True)
mlp(batch).sum().backward()
print("model(x):        ", calls)
calls.clear()
mlp.forward(batch).sum().backward()
print("model.forward(x):", calls)

# %% [quiz]
show_quiz("autograd", "q5")

# %% [markdown]
# ## 6. Saved tensors: the memory of the backward pass
#
# Most of a training step's memory is not the weights but the **activations** the graph saves for
# backward. Every tensor a node saves passes through the *pack hook* of
# `torch.autograd.graph.saved_tensors_hooks` (torch/csrc/autograd/saved_variable.cpp), and comes back
# through the unpack hook when backward needs it. Logging the pack hook shows exactly what is kept:

# %%
W1, W2 = torch.randn(128, 256, requires_grad=True), torch.randn(256, 10, requires_grad=True)
inputs = torch.randn(64, 128)
saved = []


def pack(t):
    saved.append(t)
    return t


with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
    logits = torch.tanh(inputs @ W1) @ W2  # (64, 128) @ (128, 256) -> tanh -> @ (256, 10)
distinct = {t.untyped_storage().data_ptr(): t for t in saved}
for t in saved:
    print(f"  saved {str(tuple(t.shape)):11s} {t.numel() * t.element_size():7,d} bytes")
params = {W1.untyped_storage().data_ptr(), W2.untyped_storage().data_ptr()}
activations = sum(t.numel() * t.element_size() for p, t in distinct.items() if p not in params)
print(f"activation bytes kept until backward (each storage once, weights excluded): {activations:,}")
tanh_node = logits.grad_fn.next_functions[0][0]  # MmBackward0 -> TanhBackward0
print(tanh_node.name(), "keeps its result as _saved_result:", tuple(tanh_node._saved_result.shape))

# %% [markdown]
# ### The version counter: in-place ops on saved tensors
#
# A saved tensor remembers the **version** it had when it was saved (every in-place op bumps the
# counter that a tensor shares with its views, {{chapter strides}}'s `_version`). If it changed by the time
# backward unpacks it, the saved value is no longer the value the formula needs, and autograd
# refuses. Here `exp` saved its result `y`, then `y.add_(1)` overwrote it:

# %%
x = torch.randn(3, requires_grad=True)
y = x.exp()  # ExpBackward0 saves y (version 0)
y.add_(1)    # y._version: 0 -> 1
try:
    y.sum().backward()
except RuntimeError as e:
    print("RuntimeError:", str(e).split(". Hint")[0])

xv = Variable(torch.randn(3), requires_grad=True)
yv = xv.exp()
yv.add_(1)
try:
    yv.sum().backward()
except RuntimeError as e:
    print("mini engine: ", str(e).split(". Hint")[0])

# %% [markdown]
# ### Not recording: `no_grad`, `inference_mode`, `detach`
#
# * `torch.no_grad()`: ops record nothing (no `grad_fn`, results do not require grad). Used for
#   evaluation and for optimizer updates of parameters.
# * `torch.inference_mode()`: `no_grad` plus no version counter and no view tracking, so slightly
#   faster; the tensors it creates are *inference tensors* and may never enter autograd later.
# * `t.detach()`: a new tensor over the **same storage and version counter**, cut from the graph.
#   Writing into it in place still trips the version check of anything that saved `t`.

# %%
x = torch.randn(3, requires_grad=True)
with torch.no_grad():
    a = x * 2
with torch.inference_mode():
    b = x * 2
d = x.detach()
print("no_grad:        requires_grad", a.requires_grad, "| grad_fn", a.grad_fn, "| inference tensor", a.is_inference())
print("inference_mode: requires_grad", b.requires_grad, "| inference tensor", b.is_inference())
print("detach: same storage", d.untyped_storage().data_ptr() == x.untyped_storage().data_ptr(),
      "| shares the version counter:", d._version == x._version)
try:
    (b * x).sum().backward()
except RuntimeError as e:
    print("RuntimeError:", str(e).split(".")[0])

# %% [quiz]
show_quiz("autograd", "q6", "q7")

# %% [markdown]
# ## 7. Custom `torch.autograd.Function`s
#
# When you know a better backward than the one autograd would derive (more stable, less memory,
# or a deliberately different "gradient"), write a `torch.autograd.Function`
# (torch/autograd/function.py; its node in the graph is a `PyNode`). `forward(ctx, *inputs)` runs
# with grad recording off and saves what backward needs with `ctx.save_for_backward(...)` (checked
# by the version counter, seen by `saved_tensors_hooks`; other values go on `ctx` as attributes);
# `backward(ctx, grad_out)` returns one gradient per forward input (`None` for non-tensors).
#
# `torch.autograd.gradcheck` compares your backward with finite differences (in float64: float32 is
# too coarse for differences); `gradgradcheck` does the same for the derivative of your backward,
# which only works if your backward is itself written in differentiable torch ops on the saved
# tensors. A tiny example, and a wrong backward being caught:

# %%
class Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * 3 * x ** 2


class CubeWrong(Cube):
    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * 3 * x  # forgot the square


x64 = torch.randn(5, dtype=torch.float64, requires_grad=True)
print("Cube gradcheck:", torch.autograd.gradcheck(Cube.apply, (x64,)),
      "| gradgradcheck:", torch.autograd.gradgradcheck(Cube.apply, (x64,)))
print("CubeWrong gradcheck:", torch.autograd.gradcheck(CubeWrong.apply, (x64,), raise_exception=False))

# %% [markdown]
# ### {{exercise logsumexp}}: a stable LogSumExp that saves only what it needs
#
# `logsumexp(x, dim) = log(sum(exp(x), dim))` is everywhere (softmax normalizers, cross-entropy,
# attention). Computed naively, `exp(800.)` overflows to `inf` even in float64. The stable way:
# `m = max(x, dim)`, `out = m + log(sum(exp(x - m), dim))`. Its derivative is the softmax,
# `exp(x - out)` (with `out` broadcast back over `dim`).
#
# Write `LogSumExp`, a `torch.autograd.Function` with `forward(ctx, x, dim)` returning the result
# with `dim` removed (like `torch.logsumexp(x, dim)`), and a `backward` that:
#
# * saves **only** `x` and the output (what torch's own `logsumexp` saves: derivatives.yaml,
#   `logsumexp_backward`); the `exp(x - m)` temporary is as big as `x` and must die in forward;
# * computes `grad_out * exp(x - out)` from those saved tensors with torch ops, so it is
#   differentiable (the checker takes second derivatives, like `gradgradcheck`).
#
# Inputs are float64, `dim` may be negative, some entries may be `-inf` (a mask) but never a whole
# row. The checker compares values, gradients and second derivatives with `torch.logsumexp`, and
# measures the bytes you save with `saved_tensors_hooks`.

# %% [answer logsumexp]
import torch


class LogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        ### BEGIN SOLUTION
        # twin: ptinternals.autograd.functions.LogSumExp
        m = x.amax(dim=dim, keepdim=True)                        # (..., 1, ...)
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # a row of all -inf: avoid inf - inf
        out = (m + torch.log(torch.exp(x - m).sum(dim=dim, keepdim=True))).squeeze(dim)
        ctx.dim = dim
        ctx.save_for_backward(x, out)  # N + N / x.shape[dim] values; exp(x - m) is freed
        return out
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_out):
        ### BEGIN SOLUTION
        x, out = ctx.saved_tensors
        return grad_out.unsqueeze(ctx.dim) * torch.exp(x - out.unsqueeze(ctx.dim)), None
        ### END SOLUTION


# %% [tests logsumexp]
check("autograd.logsumexp", LogSumExp)
### BEGIN HIDDEN TESTS
check("autograd.logsumexp", LogSumExp, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### {{exercise fake_quantize}}: a straight-through estimator
#
# Quantization-aware training rounds weights or activations to a few levels in the forward pass.
# `round` has derivative 0 almost everywhere, which would stop all learning, so the backward pass
# *pretends* the op was the identity: the **straight-through estimator** (STE). The version PyTorch
# ships, `torch.fake_quantize_per_tensor_affine`, clips it: the gradient passes where the value was
# inside the representable range and is 0 where it was clamped (moving a clamped value a little
# changes nothing).
#
# Write `FakeQuantize` with `forward(ctx, x, scale, zero_point, quant_min, quant_max)`:
# `q = round(x / scale) + zero_point` (use `torch.round(x * (1.0 / scale))`, round-half-to-even as
# torch does), `out = (clamp(q, quant_min, quant_max) - zero_point) * scale`; backward returns
# `grad_out` where `quant_min <= q <= quant_max`, else 0 (and `None` for the four numbers). Save
# only the bool mask: 1 byte per element, where saving `x` would cost 4 (that is what torch saves).
# `gradcheck` would *fail* on this Function, by design: its backward is not the derivative of its
# forward. The checker compares with `torch.fake_quantize_per_tensor_affine` (float32).

# %% [answer fake_quantize]
import torch


class FakeQuantize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, zero_point, quant_min, quant_max):
        ### BEGIN SOLUTION
        # twin: ptinternals.autograd.functions.FakeQuantize
        q = torch.round(x * (1.0 / scale)) + zero_point  # integer levels, stored as floats
        mask = (q >= quant_min) & (q <= quant_max)        # bool: N bytes, all backward needs
        ctx.save_for_backward(mask)
        return (q.clamp(quant_min, quant_max) - zero_point) * scale
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_out):
        ### BEGIN SOLUTION
        (mask,) = ctx.saved_tensors
        return grad_out * mask, None, None, None, None
        ### END SOLUTION


# %% [tests fake_quantize]
check("autograd.fake_quantize", FakeQuantize)
### BEGIN HIDDEN TESTS
check("autograd.fake_quantize", FakeQuantize, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### {{exercise swiglu}}: a fused op that recomputes instead of saving
#
# The MLP of LLaMA-style transformers uses **SwiGLU**: `silu(a) * b` with `silu(a) = a * sigmoid(a)`.
# Written as separate ops, autograd saves every operand it will need: `F.silu(a) * b` keeps `a`
# (for `SiluBackward0`), `silu(a)` and `b` (for `MulBackward0`): three activation-sized tensors.
# A fused Function can keep only `a` and `b` and **recompute** `s = sigmoid(a)` in backward: one
# extra `exp` per element in exchange for a third of the memory. Count it:

# %%
def saved_bytes(fn, *args, exclude=()):
    """Bytes of the distinct storages fn's graph saves for backward (not counting those of `exclude`)."""
    kept = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    return sum(n for ptr, n in kept.items() if ptr not in skip)


a_act = torch.randn(1024, 1024, requires_grad=True)  # 4 MiB of float32
b_act = torch.randn(1024, 1024, requires_grad=True)
print(f"F.silu(a) * b saves          {saved_bytes(lambda a, b: F.silu(a) * b, a_act, b_act) / 2**20:.0f} MiB")
print(f"a * torch.sigmoid(a) * b saves {saved_bytes(lambda a, b: a * torch.sigmoid(a) * b, a_act, b_act) / 2**20:.0f} MiB")

# %% [markdown]
# Write `FusedSwiGLU` (`forward(ctx, a, b)`, same shapes) that saves only `a` and `b`. With
# `s = sigmoid(a)`: `d/da = grad_out * b * s * (1 + a * (1 - s))` and `d/db = grad_out * a * s`.
# Write backward with torch ops on the saved tensors so that second derivatives work (checked
# against `F.silu(a) * b` in float64, like `gradgradcheck`).

# %% [answer swiglu]
import torch


class FusedSwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ### BEGIN SOLUTION
        # twin: ptinternals.autograd.functions.FusedSwiGLU
        ctx.save_for_backward(a, b)  # 2N values; sigmoid(a) and silu(a) are temporaries
        return a * torch.sigmoid(a) * b
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_out):
        ### BEGIN SOLUTION
        a, b = ctx.saved_tensors
        s = torch.sigmoid(a)  # recomputed: one exp per element
        return grad_out * b * s * (1 + a * (1 - s)), grad_out * a * s
        ### END SOLUTION


# %% [tests swiglu]
check("autograd.swiglu", FusedSwiGLU)
### BEGIN HIDDEN TESTS
check("autograd.swiglu", FusedSwiGLU, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("autograd", "q8")

# %% [markdown]
# ## 8. Activation checkpointing: recompute for memory
#
# {{exercise swiglu}} recomputed one sigmoid. **Activation checkpointing** does the same for a whole block:
# forward runs the block *without recording* (`torch.no_grad()`: nothing is saved, every
# intermediate is freed at once) and keeps only the block's input; backward runs the block a second
# time, with recording on, and backpropagates through that fresh graph. For a block of `L` layers the
# saved activations drop from about `2L` tensors to 1, for the price of one more forward of the block.
# Large models checkpoint every transformer layer.
#
# `torch.utils.checkpoint` has two designs: the original *reentrant* one (a Function whose backward
# calls `torch.autograd.backward` inside the running backward) and the newer `use_reentrant=False`
# one, built on `saved_tensors_hooks` (pack returns a placeholder, the first unpack re-runs the
# block). Both must replay **the same random numbers** (dropout masks): they save the RNG state in
# forward and restore it for the recomputation, and not only the CPU's. Each device has its own
# generator, and an op draws from the generator of the device its tensor lives on: dropout on a GPU
# tensor draws from that GPU's CUDA generator, which `torch.get_rng_state()` neither reads nor
# restores. So `torch.utils.checkpoint` saves the CPU state *and* the state of every CUDA device its
# inputs live on (`get_device_states`), and restores all of them inside
# `torch.random.fork_rng(devices=...)` (`set_device_states`), which puts every generator back after the
# recomputation. A checkpoint that restores only the CPU generator is right on a laptop and silently
# wrong on a GPU: the recomputed block draws fresh masks, and backward differentiates a different
# network from the one forward ran.

# %%
import torch.utils.checkpoint as tuc

blk_w = [torch.randn(256, 256, requires_grad=True) for _ in range(4)]


def block(h):
    for weight in blk_w:
        h = torch.tanh(h @ weight)  # saves h (for @) and tanh's result: 2 activations per layer
    return h


h0 = torch.randn(128, 256, requires_grad=True)  # 128 KiB
plain = saved_bytes(block, h0, exclude=blk_w)
ckpt = saved_bytes(lambda t: tuc.checkpoint(block, t, use_reentrant=True), h0, exclude=blk_w)
print(f"activations saved for backward: plain {plain / 1024:.0f} KiB (the input and 4 tanh outputs), "
      f"checkpointed {ckpt / 1024:.0f} KiB (the input)")
g_plain = torch.autograd.grad(block(h0).sum(), h0)[0]
h0.grad = None
tuc.checkpoint(block, h0, use_reentrant=False).sum().backward()
print("same gradient:", torch.allclose(g_plain, h0.grad))

# %% [markdown]
# ### {{exercise checkpoint}}: checkpointing from scratch
#
# Write `checkpoint(fn, x)`: returns `fn(x)` but keeps at most one copy of `x` alive for backward,
# re-running `fn` in backward. The cell suggests the reentrant design (you may use
# `saved_tensors_hooks` instead): in `forward`, save the RNG state of every device the block draws
# from (`torch.get_rng_state()`, and `torch.cuda.get_rng_state(x.device)` when `x.is_cuda`), save
# `x`, and run `fn` under `torch.no_grad()`; in `backward`, take a fresh leaf
# `x.detach().requires_grad_(True)`, restore those states for the recomputation without disturbing
# the current ones (`with torch.random.fork_rng(devices=...)`: `torch.set_rng_state(...)` and
# `torch.cuda.set_rng_state(state, device)`), re-run `fn` under `torch.enable_grad()`, call
# `torch.autograd.backward(out, grad_out)`, which also fills the `.grad` of the parameters used inside
# `fn`, and return the input's gradient.
#
# The checker wraps a tanh MLP block (with dropout in some cases, a frozen or a shared weight in
# others), compares the output and the gradients of `x` and of every weight with the block run
# plainly, and measures which activations stay alive between forward and backward (at most the bytes
# of `x`). On a machine with a GPU it runs on the GPU, where dropout draws from the CUDA generator.
# `torch.utils.checkpoint` is unavailable here.

# %% [answer checkpoint]
import torch


class CheckpointFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, x):
        ### BEGIN SOLUTION
        # twin: ptinternals.autograd.checkpoint.checkpoint
        ctx.fn = fn
        # Every generator the block may draw from, so dropout draws the same masks again: the CPU's, and
        # x's GPU's when x lives on one (dropout on a CUDA tensor draws from that device's generator).
        ctx.devices = [x.device] if x.is_cuda else []
        ctx.cpu_state = torch.get_rng_state()
        ctx.cuda_states = [torch.cuda.get_rng_state(device) for device in ctx.devices]
        ctx.save_for_backward(x)
        with torch.no_grad():  # no graph: the block's activations are freed as it runs
            return fn(x)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_out):
        ### BEGIN SOLUTION
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_(True)
        with torch.random.fork_rng(devices=ctx.devices):  # every generator is put back afterwards
            torch.set_rng_state(ctx.cpu_state)
            for device, state in zip(ctx.devices, ctx.cuda_states):
                torch.cuda.set_rng_state(state, device)
            with torch.enable_grad():
                out = ctx.fn(x)  # the recomputation: same ops, same random numbers
        torch.autograd.backward(out, grad_out)  # fills x.grad and the parameters' .grad
        return None, x.grad
        ### END SOLUTION


def checkpoint(fn, x):
    """fn(x), keeping only x for backward; fn runs again during backward."""
    return CheckpointFunction.apply(fn, x)


# %% [tests checkpoint]
check("autograd.checkpoint", checkpoint)
### BEGIN HIDDEN TESTS
check("autograd.checkpoint", checkpoint, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("autograd", "q9")

# %% [markdown]
# ## 9. Gradient accumulation on purpose
#
# When a batch does not fit in memory, split it into micro-batches and call `backward()` on each:
# `.grad` accumulates, so after the last one it holds the sum of the micro-batch gradients. What
# must be right is the **weighting**. With a mean loss over `N` samples,
# `L = (1/N) sum_n l_n`, and a micro-batch `i` of `n_i` samples has mean loss
# `L_i = (1/n_i) sum l_n`, so `L = sum_i (n_i / N) L_i`: scale each micro-batch's loss by
# `n_i / N` before its backward. When all micro-batches are equal this is the familiar
# `1 / num_micro_batches`; when they are not (10 samples in 4, 3, 3), `1/k` is wrong.
# (Not covered by any weighting: BatchNorm statistics and losses that average over tokens whose
# count varies between micro-batches; weight those by tokens.)
#
# ### {{exercise accumulate}}: accumulate to the large-batch gradient
#
# Write `accumulate_grads(model, loss_fn, batch_x, batch_y, micro_batches)`: start from zero
# gradients (stale ones may be there: `model.zero_grad()`), split the batch along dim 0 into
# `micro_batches` pieces (`torch.tensor_split`), and for each run `loss_fn(model(xs), ys)` (a mean
# over the micro-batch) and a backward with the right weight. Return the full-batch loss as a Python
# float, computed from the micro-batch losses (no extra forward pass over the whole batch: it would
# not fit). Afterwards every parameter's `.grad` must equal the gradient of
# `loss_fn(model(batch_x), batch_y)`. Call the model as `model(xs)`: the checker counts the
# micro-batches with a forward hook, as real tools would.

# %% [answer accumulate]
import torch


def accumulate_grads(model, loss_fn, batch_x, batch_y, micro_batches):
    """Fill the parameters' .grad with the full-batch gradient, one micro-batch at a time."""
    ### BEGIN SOLUTION
    # twin: ptinternals.autograd.accumulation.accumulate_grads
    model.zero_grad(set_to_none=True)
    n = batch_x.shape[0]
    total = 0.0
    for xs, ys in zip(torch.tensor_split(batch_x, micro_batches), torch.tensor_split(batch_y, micro_batches)):
        loss = loss_fn(model(xs), ys)
        weight = xs.shape[0] / n  # n_i / N
        (loss * weight).backward()  # .grad += (n_i / N) * d L_i / d w
        total += loss.item() * weight
    return total
    ### END SOLUTION


# %% [tests accumulate]
check("autograd.accumulate", accumulate_grads)
### BEGIN HIDDEN TESTS
check("autograd.accumulate", accumulate_grads, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("autograd", "q10")

# %% [markdown]
# ## 10. When backward goes wrong: `detect_anomaly`
#
# A NaN in a gradient usually comes from a backward formula, far from the forward line that set it
# up, and by the time you see it in the loss the graph is gone. Under
# `torch.autograd.detect_anomaly()` every node records the Python traceback of the forward op that
# created it, and the engine checks each node's outputs for NaN: the error names the node, and the
# warning printed with it shows the forward line. (It slows everything down: turn it on to debug.)
# Here `sqrt` at 0 has an infinite derivative, multiplied by a zero gradient: `0 * inf = nan`.

# %%
x = torch.tensor([0.0, 4.0], requires_grad=True)
with torch.autograd.detect_anomaly():
    try:
        (x.sqrt() * 0).sum().backward()
    except RuntimeError as e:
        print("RuntimeError:", e)

# %% [markdown]
# ## Summary
#
# * The forward pass records a graph of nodes (`grad_fn`, `next_functions`, `AccumulateGrad` for
#   leaves); each node is a vector-Jacobian product with the tensors it saved.
# * The engine counts dependencies, runs a node only when all its consumers have reported, sums
#   what they sent, runs hooks, frees saved tensors unless `retain_graph`, and accumulates into
#   `.grad` (so gradients add up across backward calls).
# * `create_graph` records the backward itself: gradients of gradients.
# * Saved tensors are most of training memory: custom Functions save less (and recompute),
#   checkpointing saves only block inputs, the version counter guards them against in-place writes.
# * Hooks run inside autograd (`register_hook`, post-accumulate hooks) and modules
#   (`model(x)` runs them; `model.forward(x)` does not).
#
# Next: {{chapter modules}} goes one level up, to `nn.Module`, whose backward hooks are node hooks on
# identity Functions; then {{chapter dispatch}} follows an op one level down, through the dispatcher,
# where autograd is one dispatch key among many.
#
# ### Your quiz score so far
# Practice answers count no points; the grader scores your last answer to each graded question (recorded in
# `autograd.answers.json`).

# %% [quiz-grade]
quiz_progress("autograd")
