"""Known-buggy implementations of the autograd chapter's exercises: each one must be rejected by its checker.

Each source replaces one answer cell of the solution notebook (it defines the entry point and what it
needs). ``expect`` is a phrase the failure message must contain (the likely cause), or None.
"""

_FORMULAS_TAIL = """
MY_FORMULAS = {"add": add_backward, "mul": mul_backward, "div": div_backward, "matmul": matmul_backward,
               "exp": exp_backward, "tanh": tanh_backward, "sum": sum_backward}


def backward_formula(op, grad, *saved):
    return MY_FORMULAS[op](grad, *saved)
"""

_GOOD_FORMULAS = {
    "add": """
def add_backward(grad, a_shape, b_shape):
    return unbroadcast(grad, a_shape), unbroadcast(grad, b_shape)
""",
    "mul": """
def mul_backward(grad, a, b):
    return unbroadcast(grad * b, a.shape), unbroadcast(grad * a, b.shape)
""",
    "div": """
def div_backward(grad, a, b):
    return unbroadcast(grad / b, a.shape), unbroadcast(-grad * a / (b * b), b.shape)
""",
    "matmul": """
def matmul_backward(grad, a, b):
    import torch
    a2 = a.reshape(1, a.shape[0]) if a.ndim == 1 else a
    b2 = b.reshape(b.shape[0], 1) if b.ndim == 1 else b
    batch = tuple(torch.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]))
    g2 = grad.reshape(batch + (a2.shape[-2], b2.shape[-1]))
    grad_a = unbroadcast(g2 @ b2.transpose(-1, -2), a2.shape).reshape(a.shape)
    grad_b = unbroadcast(a2.transpose(-1, -2) @ g2, b2.shape).reshape(b.shape)
    return grad_a, grad_b
""",
    "exp": """
def exp_backward(grad, result):
    return (grad * result,)
""",
    "tanh": """
def tanh_backward(grad, result):
    return (grad * (1 - result * result),)
""",
    "sum": """
def sum_backward(grad, input_shape, dim, keepdim):
    input_shape = tuple(input_shape)
    dims = range(len(input_shape)) if dim is None else dim
    kept = tuple(1 if d in dims else s for d, s in enumerate(input_shape))
    return (grad.reshape(kept).expand(input_shape),)
""",
}


def formulas_with(**replace) -> str:
    """The solution's formulas cell with some formulas replaced by buggy ones."""
    return "".join(replace.get(op, src) for op, src in _GOOD_FORMULAS.items()) + _FORMULAS_TAIL


_ENGINE = """
import heapq

from ptinternals.autograd.scaffold import gradient_edge, no_grad


def backward(root, grad, retain_graph=False):
    start, _ = gradient_edge(root)
    if start is None:
        return
    dependencies = {}
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
    buffers = {start: grad}
    ready = [(-start.sequence_nr, 0, start)]
    tie = 1
    with no_grad():
        while ready:
            _, _, fn = heapq.heappop(ready)
            g = buffers.pop(fn, None)
            if g is not None:
                for hook in fn.tensor_pre_hooks(0):
                    result = hook(g)
                    if result is not None:
                        g = result                                   # @HOOK
            grads = fn.apply([g])
            if not retain_graph:                                     # @RELEASE
                fn.release_variables()
            for (next_fn, _), g_in in zip(fn.next_functions, grads):
                if next_fn is None:
                    continue
                if g_in is not None:
                    buffers[next_fn] = g_in if next_fn not in buffers else buffers[next_fn] + g_in  # @BUFFER
                dependencies[next_fn] -= 1
                if dependencies[next_fn] == 0:
                    heapq.heappush(ready, (-next_fn.sequence_nr, tie, next_fn))
                    tie += 1
"""


def engine_with(**edits) -> str:
    """The solution's engine with lines replaced: ``engine_with(BUFFER="...")`` swaps the line tagged @BUFFER."""
    src = _ENGINE
    for tag, line in edits.items():
        lines = src.split("\n")
        for k, text in enumerate(lines):
            if f"# @{tag}" in text:
                indent = text[: len(text) - len(text.lstrip())]
                lines[k] = indent + line
        src = "\n".join(lines)
    return src


_LSE = """
import torch


class LogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
{forward}

    @staticmethod
    def backward(ctx, grad_out):
{backward}
"""


def lse(forward: str, backward: str) -> str:
    indent = lambda s: "\n".join("        " + line for line in s.strip("\n").split("\n"))  # noqa: E731
    return _LSE.format(forward=indent(forward), backward=indent(backward))


_FQ = """
import torch


class FakeQuantize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, zero_point, quant_min, quant_max):
{forward}

    @staticmethod
    def backward(ctx, grad_out):
{backward}
"""
_FQ_FORWARD = """
q = torch.round(x * (1.0 / scale)) + zero_point
mask = (q >= quant_min) & (q <= quant_max)
ctx.save_for_backward(mask)
return (q.clamp(quant_min, quant_max) - zero_point) * scale
"""
_FQ_BACKWARD = """
(mask,) = ctx.saved_tensors
return grad_out * mask, None, None, None, None
"""


def fq(forward: str = _FQ_FORWARD, backward: str = _FQ_BACKWARD) -> str:
    indent = lambda s: "\n".join("        " + line for line in s.strip("\n").split("\n"))  # noqa: E731
    return _FQ.format(forward=indent(forward), backward=indent(backward))


_SWIGLU = """
import torch


class FusedSwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
{forward}

    @staticmethod
    def backward(ctx, grad_out):
{backward}
"""


def swiglu(forward: str, backward: str) -> str:
    indent = lambda s: "\n".join("        " + line for line in s.strip("\n").split("\n"))  # noqa: E731
    return _SWIGLU.format(forward=indent(forward), backward=indent(backward))


_CKPT = """
import torch


class CheckpointFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, x):
        ctx.fn = fn
        ctx.rng_state = torch.get_rng_state()
        ctx.save_for_backward(x)
        with torch.no_grad():
            return fn(x)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_(True)
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(ctx.rng_state)   # @RNG
            with torch.enable_grad():
                out = ctx.fn(x)
        torch.autograd.backward(out, grad_out)   # @BACKWARD
        return None, x.grad                      # @RETURN


def checkpoint(fn, x):
    return CheckpointFunction.apply(fn, x)
"""


def ckpt(**edits) -> str:
    src = _CKPT
    for tag, line in edits.items():
        lines = src.split("\n")
        for k, text in enumerate(lines):
            if f"# @{tag}" in text:
                lines[k] = text[: len(text) - len(text.lstrip())] + line
        src = "\n".join(lines)
    return src


BUGGY = {
    "autograd.unbroadcast": {
        "no_leading_dims": ("""
def unbroadcast(grad, shape):
    shape = tuple(shape)
    lead = grad.ndim - len(shape)
    if lead < 0:
        raise ValueError("too many dims")
    dims = tuple(lead + i for i, s in enumerate(shape) if s == 1 and grad.shape[lead + i] != 1)
    if dims:
        grad = grad.sum(dim=dims, keepdim=True)
    return grad
""", "every dim that broadcasting added"),
        "mean_instead_of_sum": ("""
def unbroadcast(grad, shape):
    shape = tuple(shape)
    lead = grad.ndim - len(shape)
    if lead < 0 or any(s != 1 and s != g for s, g in zip(shape, tuple(grad.shape)[lead:])):
        raise ValueError("does not broadcast")
    dims = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and grad.shape[lead + i] != 1)
    if dims:
        grad = grad.mean(dim=dims, keepdim=True)
    return grad.reshape(shape)
""", "mean, not a sum"),
        "no_validation": ("""
def unbroadcast(grad, shape):
    shape = tuple(shape)
    lead = grad.ndim - len(shape)
    dims = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and grad.shape[lead + i] != 1)
    if dims:
        grad = grad.sum(dim=dims, keepdim=True)
    return grad.reshape(shape)
""", "raise ValueError"),
        "calls_sum_to_size": ("""
def unbroadcast(grad, shape):
    import torch
    if tuple(torch.broadcast_shapes(tuple(shape), tuple(grad.shape))) != tuple(grad.shape):
        raise ValueError("does not broadcast")
    return grad.sum_to_size(shape)
""", "sum_to_size"),
        "keeps_size1_only_for_leading": ("""
def unbroadcast(grad, shape):
    shape = tuple(shape)
    lead = grad.ndim - len(shape)
    if lead < 0 or any(s != 1 and s != g for s, g in zip(shape, tuple(grad.shape)[lead:])):
        raise ValueError("does not broadcast")
    for _ in range(lead):
        grad = grad.sum(dim=0)
    return grad
""", "every dim that broadcasting added or grew"),
    },
    "autograd.formulas": {
        "mul_forgets_unbroadcast": (formulas_with(mul="""
def mul_backward(grad, a, b):
    return grad * b, grad * a
"""), "sum it back with unbroadcast"),
        "mul_swapped": (formulas_with(mul="""
def mul_backward(grad, a, b):
    return unbroadcast(grad * a, a.shape), unbroadcast(grad * b, b.shape)
"""), "the OTHER input"),
        "div_sign": (formulas_with(div="""
def div_backward(grad, a, b):
    return unbroadcast(grad / b, a.shape), unbroadcast(grad * a / (b * b), b.shape)
"""), "minus sign"),
        "tanh_of_saved_result": (formulas_with(tanh="""
def tanh_backward(grad, result):
    return (grad * (1 - result.tanh() * result.tanh()),)
"""), "RESULT"),
        "sum_no_reshape": (formulas_with(sum="""
def sum_backward(grad, input_shape, dim, keepdim):
    return (grad.expand(tuple(input_shape)),)
"""), None),
        "matmul_2d_only": (formulas_with(matmul="""
def matmul_backward(grad, a, b):
    return grad @ b.transpose(-1, -2), a.transpose(-1, -2) @ grad
"""), None),
        "exp_with_torch_function": (formulas_with(exp="""
def exp_backward(grad, result):
    import torch
    return (torch.mul(grad, result),)
"""), "not on mini-engine Variables"),
        "exp_forgets_tuple": (formulas_with(exp="""
def exp_backward(grad, result):
    return grad * result
"""), "trailing comma"),
    },
    "autograd.backward": {
        "overwrites_buffer": (engine_with(BUFFER="buffers[next_fn] = g_in"), "add them up"),
        "ignores_hook_result": (engine_with(HOOK="pass"), "use what it returns"),
        "never_releases": (engine_with(RELEASE="if False:"), "release_variables"),
        "always_releases": (engine_with(RELEASE="if True:"), "do not release them"),
        "skips_none_edges_uncounted": (engine_with().replace(
            "if g_in is not None:\n", "if g_in is None:\n                    continue\n                if True:\n"),
            "even when the gradient sent along it is None"),
        "no_dependency_count": ("""
from ptinternals.autograd.scaffold import gradient_edge, no_grad


def backward(root, grad, retain_graph=False):
    start, _ = gradient_edge(root)
    queue = [(start, grad)]
    with no_grad():
        while queue:
            fn, g = queue.pop(0)          # breadth first: a node runs once per incoming gradient
            for hook in fn.tensor_pre_hooks(0):
                result = hook(g)
                if result is not None:
                    g = result
            grads = fn.apply([g])
            if not retain_graph:
                fn.release_variables()
            for (next_fn, _), g_in in zip(fn.next_functions, grads):
                if next_fn is not None and g_in is not None:
                    queue.append((next_fn, g_in))
""", "must wait until ALL its consumers"),
        "no_hooks": (engine_with(HOOK="pass", RELEASE="if not retain_graph:").replace(
            "fn.tensor_pre_hooks(0)", "[]"), "tensor_pre_hooks"),
        "root_grad_fn_only": (engine_with().replace("start, _ = gradient_edge(root)", "start = root.grad_fn"),
                              "the root may be a leaf"),
    },
    "autograd.logsumexp": {
        "no_max_subtraction": (lse("""
out = torch.log(torch.exp(x).sum(dim=dim))
ctx.dim = dim
ctx.save_for_backward(x, out)
return out
""", """
x, out = ctx.saved_tensors
return grad_out.unsqueeze(ctx.dim) * torch.exp(x - out.unsqueeze(ctx.dim)), None
"""), "subtract the max"),
        "saves_softmax_only": (lse("""
m = x.amax(dim=dim, keepdim=True)
e = torch.exp(x - m)
s = e.sum(dim=dim, keepdim=True)
ctx.save_for_backward(e / s)
ctx.dim = dim
return (m + torch.log(s)).squeeze(dim)
""", """
(p,) = ctx.saved_tensors
return grad_out.unsqueeze(ctx.dim) * p, None
"""), "backward must be differentiable"),
        "saves_exp_too": (lse("""
m = x.amax(dim=dim, keepdim=True)
e = torch.exp(x - m)
out = (m + torch.log(e.sum(dim=dim, keepdim=True))).squeeze(dim)
ctx.save_for_backward(x, out, e)
ctx.dim = dim
return out
""", """
x, out, e = ctx.saved_tensors
return grad_out.unsqueeze(ctx.dim) * torch.exp(x - out.unsqueeze(ctx.dim)), None
"""), "save x and the output only"),
        "backward_without_graph": (lse("""
m = x.amax(dim=dim, keepdim=True)
out = (m + torch.log(torch.exp(x - m).sum(dim=dim, keepdim=True))).squeeze(dim)
ctx.save_for_backward(x, out)
ctx.dim = dim
return out
""", """
x, out = ctx.saved_tensors
with torch.no_grad():
    return grad_out.unsqueeze(ctx.dim) * torch.exp(x - out.unsqueeze(ctx.dim)), None
"""), "backward must be differentiable"),
        "keeps_dim": (lse("""
m = x.amax(dim=dim, keepdim=True)
out = m + torch.log(torch.exp(x - m).sum(dim=dim, keepdim=True))
ctx.save_for_backward(x, out)
return out
""", """
x, out = ctx.saved_tensors
return grad_out * torch.exp(x - out), None
"""), "reduced dim is removed"),
    },
    "autograd.fake_quantize": {
        "plain_ste": (fq(backward="""
return grad_out, None, None, None, None
"""), "clipped"),
        "saves_x": (fq(forward="""
ctx.save_for_backward(x)
ctx.qparams = (scale, zero_point, quant_min, quant_max)
q = torch.round(x * (1.0 / scale)) + zero_point
return (q.clamp(quant_min, quant_max) - zero_point) * scale
""", backward="""
(x,) = ctx.saved_tensors
scale, zero_point, quant_min, quant_max = ctx.qparams
q = torch.round(x * (1.0 / scale)) + zero_point
return grad_out * ((q >= quant_min) & (q <= quant_max)), None, None, None, None
"""), "not x"),
        "mask_from_x": (fq(forward="""
q = torch.round(x * (1.0 / scale)) + zero_point
mask = (x >= quant_min * scale) & (x <= quant_max * scale)
ctx.save_for_backward(mask)
return (q.clamp(quant_min, quant_max) - zero_point) * scale
"""), "not from x"),
        "true_derivative": (fq(backward="""
return grad_out * 0, None, None, None, None
"""), "straight-through"),
        "floor_not_round": (fq(forward="""
q = torch.floor(x * (1.0 / scale)) + zero_point
mask = (q >= quant_min) & (q <= quant_max)
ctx.save_for_backward(mask)
return (q.clamp(quant_min, quant_max) - zero_point) * scale
"""), "forward:"),
    },
    "autograd.swiglu": {
        "saves_sigmoid": (swiglu("""
s = torch.sigmoid(a)
ctx.save_for_backward(a, b, s)
return a * s * b
""", """
a, b, s = ctx.saved_tensors
return grad_out * b * s * (1 + a * (1 - s)), grad_out * a * s
"""), "recompute s"),
        "missing_term": (swiglu("""
ctx.save_for_backward(a, b)
return a * torch.sigmoid(a) * b
""", """
a, b = ctx.saved_tensors
s = torch.sigmoid(a)
return grad_out * b * s, grad_out * a * s
"""), "term is missing"),
        "backward_detached": (swiglu("""
ctx.save_for_backward(a, b)
return a * torch.sigmoid(a) * b
""", """
a, b = ctx.saved_tensors
a, b, g = a.detach(), b.detach(), grad_out.detach()
s = torch.sigmoid(a)
return g * b * s * (1 + a * (1 - s)), g * a * s
"""), "differentiable"),
        "only_grad_for_a": (swiglu("""
ctx.save_for_backward(a, b)
return a * torch.sigmoid(a) * b
""", """
a, b = ctx.saved_tensors
s = torch.sigmoid(a)
return grad_out * b * s * (1 + a * (1 - s))
"""), None),
    },
    "autograd.checkpoint": {
        "no_checkpoint": ("""
def checkpoint(fn, x):
    return fn(x)
""", "torch.no_grad()"),
        "no_rng_restore": (ckpt(RNG="pass"), "dropout mask"),
        "input_grad_only": (ckpt(BACKWARD="(grad_x,) = torch.autograd.grad(out, x, grad_out)",
                                 RETURN="return None, grad_x"), "parameters inside the block got no gradient"),
        "saves_activations": ("""
import torch


class CheckpointFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, x):
        with torch.enable_grad():
            xd = x.detach().requires_grad_(True)
            out = fn(xd)
        ctx.save_for_backward(xd, out)
        return out.detach()

    @staticmethod
    def backward(ctx, grad_out):
        x, out = ctx.saved_tensors
        torch.autograd.backward(out, grad_out)
        return None, x.grad


def checkpoint(fn, x):
    return CheckpointFunction.apply(fn, x)
""", "torch.no_grad()"),
    },
    "autograd.accumulate": {
        "one_over_k": ("""
import torch


def accumulate_grads(model, loss_fn, batch_x, batch_y, micro_batches):
    model.zero_grad(set_to_none=True)
    total = 0.0
    for xs, ys in zip(torch.tensor_split(batch_x, micro_batches), torch.tensor_split(batch_y, micro_batches)):
        loss = loss_fn(model(xs), ys) / micro_batches
        loss.backward()
        total += loss.item()
    return total
""", "n_i / N"),
        "no_scaling": ("""
import torch


def accumulate_grads(model, loss_fn, batch_x, batch_y, micro_batches):
    model.zero_grad(set_to_none=True)
    total = 0.0
    for xs, ys in zip(torch.tensor_split(batch_x, micro_batches), torch.tensor_split(batch_y, micro_batches)):
        loss = loss_fn(model(xs), ys)
        loss.backward()
        total += loss.item() * xs.shape[0] / batch_x.shape[0]
    return total
""", "scaled down"),
        "no_zero_grad": ("""
import torch


def accumulate_grads(model, loss_fn, batch_x, batch_y, micro_batches):
    n = batch_x.shape[0]
    total = 0.0
    for xs, ys in zip(torch.tensor_split(batch_x, micro_batches), torch.tensor_split(batch_y, micro_batches)):
        loss = loss_fn(model(xs), ys) * (xs.shape[0] / n)
        loss.backward()
        total += loss.item()
    return total
""", "stale .grad"),
        "full_batch_at_once": ("""
def accumulate_grads(model, loss_fn, batch_x, batch_y, micro_batches):
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model(batch_x), batch_y)
    loss.backward()
    return loss.item()
""", "split the batch"),
        "calls_forward": ("""
import torch


def accumulate_grads(model, loss_fn, batch_x, batch_y, micro_batches):
    model.zero_grad(set_to_none=True)
    n = batch_x.shape[0]
    total = 0.0
    for xs, ys in zip(torch.tensor_split(batch_x, micro_batches), torch.tensor_split(batch_y, micro_batches)):
        loss = loss_fn(model.forward(xs), ys) * (xs.shape[0] / n)
        loss.backward()
        total += loss.item()
    return total
""", "model.forward(x)"),
    },
}

BUGGY["autograd.logsumexp"]["calls_torch_logsumexp"] = (lse("""
out = torch.logsumexp(x, dim)
ctx.dim = dim
ctx.save_for_backward(x, out)
return out
""", """
x, out = ctx.saved_tensors
return grad_out.unsqueeze(ctx.dim) * torch.exp(x - out.unsqueeze(ctx.dim)), None
"""), "this exercise asks you to write")
