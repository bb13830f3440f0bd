"""The dispatch chapter's probes (sandbox side): drive a student's mode, subclass, custom op or estimator on a workload.

Every case of the dispatch chapter's class-shaped exercises is plain data (a ``spec`` tuple); the probes here
turn it into the same seeded model and inputs on both sides of the grading boundary (the trusted
grader imports this module to compute the expected answers with real torch), run the student's code
on it and return only data: numbers, tensors, op names. No solution code lives here: the probes
*use* a FLOP counter, a tracer, a quantised tensor, a custom op or a memory estimate, they do not
implement one. Imports: torch and the standard library only.
"""
from __future__ import annotations

import itertools
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ptinternals.dispatch.scaffold import Block

# ================================================================================================
# Workloads: a spec -> (fn, named leaf tensors). fn() returns the model's output.
# ================================================================================================


class Workload:
    """``fn()`` computes the output from ``leaves`` (named tensors: inputs first, then parameters)."""

    def __init__(self, fn, leaves: dict[str, torch.Tensor], module: nn.Module | None = None):
        self.fn, self.leaves, self.module = fn, leaves, module

    def loss(self) -> torch.Tensor:
        out = self.fn()
        return out.float().square().mean()


def _params(module: nn.Module) -> dict[str, torch.Tensor]:
    return {"p_" + name.replace(".", "_"): p for name, p in module.named_parameters()}


def make_workload(spec, seed: int = 0) -> Workload:
    """Build the workload ``spec`` (a tuple: kind, then sizes) with values drawn from ``seed``.

    Shapes, structure and constants do not depend on the seed; values do (the tracer exercise
    replays a graph recorded on seed 0 with the values of seed 1).
    """
    kind, *a = spec
    torch.manual_seed(seed)
    if kind == "linear":  # x (*batch, d_in) -> Linear
        batch, d_in, d_out, bias = a
        m = nn.Linear(d_in, d_out, bias=bias)
        x = torch.randn(*batch, d_in, requires_grad=True)
        return Workload(lambda: m(x), {"x": x, **_params(m)}, m)
    if kind == "mlp":  # Linear -> GELU(tanh) -> LayerNorm -> Linear
        batch, d_in, d_hidden, d_out = a
        m = nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(approximate="tanh"), nn.LayerNorm(d_hidden),
                          nn.Linear(d_hidden, d_out))
        x = torch.randn(batch, d_in, requires_grad=True)
        return Workload(lambda: m(x), {"x": x, **_params(m)}, m)
    if kind in ("bmm", "baddbmm"):
        b, m_, k, n = a
        x = torch.randn(b, m_, k, requires_grad=True)
        w = torch.randn(b, k, n, requires_grad=True)
        if kind == "bmm":
            return Workload(lambda: torch.bmm(x, w), {"x": x, "w": w})
        c = torch.randn(b, m_, n, requires_grad=True)
        return Workload(lambda: torch.baddbmm(c, x, w), {"x": x, "w": w, "c": c})
    if kind == "conv2d":
        batch, c_in, c_out, size, kernel, stride, groups = a
        m = nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, groups=groups)
        x = torch.randn(batch, c_in, size, size, requires_grad=True)
        return Workload(lambda: m(x), {"x": x, **_params(m)}, m)
    if kind == "attention":  # fused SDPA on (b, h, s, d) query/key/value
        b, h, s_q, s_k, d, causal = a
        q = torch.randn(b, h, s_q, d, requires_grad=True)
        k = torch.randn(b, h, s_k, d, requires_grad=True)
        v = torch.randn(b, h, s_k, d, requires_grad=True)
        return Workload(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), {"q": q, "k": k, "v": v})
    if kind == "block":
        b, s, d_model, n_head = a
        m = Block(d_model, n_head)
        x = torch.randn(b, s, d_model, requires_grad=True)
        return Workload(lambda: m(x), {"x": x, **_params(m)}, m)
    if kind == "masked":  # hand-written attention scores with a constant causal mask (a closure constant)
        s, d = a
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)  # the same on every seed
        q = torch.randn(s, d, requires_grad=True)
        k = torch.randn(s, d, requires_grad=True)
        return Workload(lambda: (q @ k.t() / math.sqrt(d)).masked_fill(mask, float("-inf")).softmax(-1) @ k,
                        {"q": q, "k": k})
    raise ValueError(f"unknown workload kind {kind!r}")


# ================================================================================================
# Exercise dispatch.flop_counter: a FLOP-counting TorchDispatchMode
# ================================================================================================
def count_flops(entry, spec, backward: bool):
    """``with entry() as counter:`` run the workload (and its backward); return ``counter.total``.

    While the student's counter runs, FlopCounterMode's table of formulas is emptied: the exercise is
    to count, not to wrap torch's counter."""
    from torch.utils import flop_counter

    w = make_workload(spec)
    saved = dict(flop_counter.flop_registry)
    flop_counter.flop_registry.clear()
    try:
        counter = entry()
        with counter:
            loss = w.loss()
            if backward:
                loss.backward()
    finally:
        flop_counter.flop_registry.update(saved)
    total = getattr(counter, "total", None)
    if isinstance(total, bool) or not isinstance(total, int):
        raise TypeError(f"counter.total must be an int after the run, got {total!r}")
    return total


# ================================================================================================
# Exercise dispatch.graph_tracer: a tracing mode; the probe replays its graph on new values
# ================================================================================================
def _is_ref(x) -> bool:
    return type(x).__name__ == "Ref" and hasattr(x, "node") and hasattr(x, "index")


def replay(nodes, values: dict[str, torch.Tensor]) -> list:
    """Run a recorded graph: placeholders take ``values[name]``, constants their stored tensor, each
    call node its OpOverload on the resolved arguments; return the output node's values."""
    env: dict[str, object] = {}

    def resolve(x):
        if _is_ref(x):
            if x.node not in env:
                raise KeyError(f"Ref({x.node!r}) points at no earlier node")
            value = env[x.node]
            if x.index is None and isinstance(value, (tuple, list)):
                raise TypeError(f"Ref({x.node!r}) points at a node that returned {len(value)} values: refer to "
                                f"its i-th output as Ref({x.node!r}, i)")
            return value if x.index is None else value[x.index]
        if isinstance(x, (list, tuple)):
            return type(x)(resolve(y) for y in x)
        if isinstance(x, dict):
            return {k: resolve(v) for k, v in x.items()}
        return x

    for i, node in enumerate(nodes):
        if not isinstance(node, tuple) or len(node) != 4:
            raise TypeError(f"nodes[{i}] must be a tuple (name, target, args, kwargs), got {node!r:.80}")
        name, target, args, kwargs = node
        if target == "placeholder":
            if name not in values:
                raise KeyError(f"placeholder {name!r} is not one of the inputs {sorted(values)}: a tensor the "
                               f"graph did not produce must be a 'constant' node that holds the tensor")
            env[name] = values[name]
        elif target == "constant":
            env[name] = args[0]
        elif target == "output":
            return list(resolve(tuple(args)))
        elif isinstance(target, torch._ops.OpOverload):
            try:
                env[name] = target(*resolve(tuple(args)), **resolve(dict(kwargs)))
            except Exception as e:  # say which node failed
                first = (str(e).strip().splitlines() or [""])[0][:300]
                message = f"replaying node {name!r} ({target}) failed: {first}"
                try:
                    err = type(e)(message)
                except Exception:  # noqa: BLE001  (an exception type that takes other arguments)
                    err = RuntimeError(message)
                raise err from None
        else:
            raise TypeError(f"node {name!r}: target must be 'placeholder', 'constant', 'output' or an "
                            f"OpOverload such as aten.mm.default, got {target!r:.80}")
    raise ValueError("the graph has no output node: call tracer.output(...) at the end")


def trace_and_replay(entry, spec):
    """Trace loss and backward of workload ``spec`` (seed 0) with ``entry()``; replay on seed 1."""
    w = make_workload(spec, seed=0)
    tracer = entry()
    for name, t in w.leaves.items():
        tracer.placeholder(t, name)
    with tracer:
        loss = w.loss()
        loss.backward()
    tracer.output(loss, *[t.grad for t in w.leaves.values()])  # outside the mode: records no op of its own
    nodes = list(tracer.nodes)
    calls = [n for n in nodes if isinstance(n, tuple) and len(n) == 4 and isinstance(n[1], torch._ops.OpOverload)]
    ops = [str(n[1]) for n in calls]
    kwargs = [sorted(n[3]) if isinstance(n[3], dict) else [] for n in calls]
    fresh = make_workload(spec, seed=1)
    with torch.no_grad():
        outs = replay(nodes, {k: v.detach().clone() for k, v in fresh.leaves.items()})
    return {"ops": ops, "kwargs": kwargs, "replay": outs}


def eager_loss_and_grads(spec, seed: int = 1) -> list[torch.Tensor]:
    """The truth for a replay: loss and the gradient of every leaf, computed eagerly."""
    w = make_workload(spec, seed=seed)
    loss = w.loss()
    loss.backward()
    return [loss.detach()] + [t.grad for t in w.leaves.values()]


# ================================================================================================
# Exercise dispatch.int8_tensor: an int8 wrapper subclass through a training step
# ================================================================================================
def quantized_model(spec, seed: int = 0):
    """``spec = (batch, d_in, d_hidden, d_out, lr)``: Linear -> ReLU -> LayerNorm -> Linear and an input."""
    batch, d_in, d_hidden, d_out, lr = spec
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.LayerNorm(d_hidden), nn.Linear(d_hidden, d_out))
    x = torch.randn(*batch, d_in, requires_grad=True)
    target = torch.randn(*batch, d_out)
    return model, x, target


def train_step(model, x, target, lr):
    """One SGD step on every parameter that requires grad; returns the output and the loss."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    out = model(x)
    loss = F.mse_loss(out, target)
    loss.backward()
    opt.step()
    return out, loss


def quantize_only(entry, w: torch.Tensor) -> dict:
    """``entry.quantize(w)`` on one weight (special values, odd layouts): the codes, the scales, the
    dequantised weight, the class after ``nn.Parameter`` (which detaches), and whether ``w`` was modified."""
    before = w.clone()
    q = entry.quantize(w)
    param = nn.Parameter(q, requires_grad=False)
    dequantize = getattr(q, "dequantize", None)
    return {"types": [type(param).__name__], "dtypes": [str(q.dtype).replace("torch.", "")],
            "int_data": [getattr(q, "int_data", None)], "scale": [getattr(q, "scale", None)],
            "dequantized": dequantize() if callable(dequantize) else None,
            "w_modified": not torch.allclose(w, before, rtol=0, atol=0, equal_nan=True)}


def train_quantized(entry, spec):
    """Quantise every Linear weight with ``entry.quantize``, freeze it, train one step, report. A case that
    is a weight tensor instead of a model spec quantises that weight only (``quantize_only``).

    A failure after quantising (in the forward, backward or step) is reported as ``train_error``, with the
    codes and scales already read: the checker then judges the quantisation first."""
    if isinstance(spec, torch.Tensor):
        return quantize_only(entry, spec)
    model, x, target = quantized_model(spec)
    linears = [m for m in model if isinstance(m, nn.Linear)]
    for m in linears:
        m.weight = nn.Parameter(entry.quantize(m.weight.detach()), requires_grad=False)
    report = {"types": [type(m.weight).__name__ for m in linears],
              "dtypes": [str(m.weight.dtype).replace("torch.", "") for m in linears],
              "int_data": [getattr(m.weight, "int_data", None) for m in linears],
              "scale": [getattr(m.weight, "scale", None) for m in linears]}
    try:
        out, loss = train_step(model, x, target, spec[-1])
        trainable = [p.detach() for p in model.parameters() if p.requires_grad]
        with torch.no_grad():
            out_after = model(x)  # the frozen int8 weights must still work after the step
    except Exception as e:  # noqa: BLE001  (reported: the quantisation is judged first)
        report["train_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        return report
    report.update({"out": out.detach(), "loss": loss.detach(), "x_grad": x.grad, "trainable_after": trainable,
                   "out_after_step": out_after, "types_after": [type(m.weight).__name__ for m in linears]})
    return report


# ================================================================================================
# Exercise dispatch.custom_op: a custom op defined by torch.library.custom_op
# ================================================================================================
_NAMESPACES = itertools.count()


def fresh_namespace() -> str:
    """A namespace no earlier case used in this process, so a re-definition never collides."""
    return f"ptstudent_{os.getpid()}_{next(_NAMESPACES)}"


def dispatch_kinds(qualname: str, keys=("CPU", "Meta", "AutogradCPU")) -> dict[str, str]:
    """What the dispatch table holds at ``keys`` for op ``qualname`` (from ``_dispatch_dump_table``)."""
    text = torch._C._dispatch_dump_table(qualname) or ""
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key.strip() in keys:
            kind = rest.rsplit("[", 1)[-1].rstrip("] \n") if "[" in rest else rest.strip()
            out[key.strip()] = ("fallthrough " if "fallthrough" in rest else "") + kind
    return out


OP_VALUES = ("normal", "huge", "tiny", "offset", "saturated", "nan")


def op_inputs(shape, dtype_name: str, seed: int = 0, values: str = "normal"):
    """x, bias and grad_out for the custom-op exercises. ``values``: "normal" (standard normal), "huge"
    (|x|, |bias| up to about a quarter of the dtype's max), "tiny" (subnormal), "offset" (1000 plus a
    spread of 0.01), "saturated" (|z| >= 20: gelu is z or -0) or "nan" (every third element of x NaN)."""
    if values not in OP_VALUES:
        raise ValueError(f"values must be one of {OP_VALUES}, got {values!r}")
    dtype = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    bias = torch.randn(shape[-1], generator=g, dtype=torch.float64)
    grad_out = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    info = torch.finfo(dtype)
    if values == "huge":
        x, bias = x * (info.max / 16), bias * (info.max / 16)
    elif values == "tiny":
        x, bias = x * (info.tiny / 8), bias * (info.tiny / 8)
    elif values == "offset":
        x, bias = 1000 + 0.01 * x, 0.01 * bias
    elif values == "saturated":
        x, bias = x.sign() * (20 + 10 * x.abs()), bias.sign() * 0.5
    elif values == "nan":
        x.view(-1)[::3] = float("nan")
    x, bias = x.to(dtype), bias.to(dtype)
    if len(shape) >= 2:  # a non-contiguous input of the same shape
        x = x.transpose(0, -1).contiguous().transpose(0, -1)
    return x, bias, grad_out


def check_custom_op(entry, shape, dtype_name: str, full: bool, values: str = "normal"):
    """Define the student's op in a fresh namespace and exercise it: eager values and gradients, the
    fake kernel (FakeTensorMode, CPU and 'cuda'), the dispatch table, and when ``full`` also
    ``torch.library.opcheck`` and ``torch.compile(fullgraph=True)``."""
    ns = fresh_namespace()
    entry(ns)
    packet = getattr(getattr(torch.ops, ns), "fused_bias_gelu", None)
    if packet is None:
        raise LookupError(f"{ns}::fused_bias_gelu is not defined: define_op(namespace) must define "
                          f"f'{{namespace}}::fused_bias_gelu' with torch.library.custom_op")
    return op_report(packet.default, shape, dtype_name, full, values)


def op_report(op, shape, dtype_name: str, full: bool, values: str = "normal") -> dict:
    """What the custom-op exercises check of ``op``: eager values and gradients, the fake kernel
    (FakeTensorMode, on 'cpu' and 'cuda'), the dispatch table, and when ``full`` also
    ``torch.library.opcheck`` and ``torch.compile(fullgraph=True)``."""
    ns = op.namespace
    x, bias, grad_out = op_inputs(shape, dtype_name, values=values)
    report: dict = {"out": op(x, bias)}
    xg, bg = x.detach().requires_grad_(), bias.detach().requires_grad_()
    try:
        report["grads"] = list(torch.autograd.grad(op(xg, bg), [xg, bg], grad_out))
    except Exception as e:  # noqa: BLE001  (a wrong backward is a result to report, not a crash)
        report["grads"] = f"{type(e).__name__}: {str(e)[:300]}"
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake = {}
    for device in ("cpu", "cuda"):  # inputs without requires_grad: safe on fake CUDA on a CPU build
        try:
            with FakeTensorMode():
                fx = torch.empty(shape, dtype=x.dtype, device=device)
                fb = torch.empty(shape[-1], dtype=x.dtype, device=device)
                fo = op(fx, fb)
                fake[device] = (tuple(fo.shape), str(fo.dtype).replace("torch.", ""), fo.device.type)
        except Exception as e:  # noqa: BLE001
            fake[device] = f"{type(e).__name__}: {str(e)[:300]}"
    report["fake"] = fake
    report["layout"] = fake_vs_real_layout(op, x, bias, report["out"])
    report["table"] = dispatch_kinds(f"{ns}::fused_bias_gelu")
    if full:
        args = (x.detach().requires_grad_(), bias.detach().requires_grad_())
        try:
            results = torch.library.opcheck(op, args, raise_exception=False)
            report["opcheck"] = {k: v if v == "SUCCESS" else f"{type(v).__name__}: {str(v)[:300]}"
                                 for k, v in results.items()}
        except Exception as e:  # noqa: BLE001
            report["opcheck"] = {"opcheck": f"{type(e).__name__}: {str(e)[:300]}"}
        try:
            torch._dynamo.reset()
            compiled = torch.compile(lambda a, b: op(a, b).sum(-1) * 2, backend="aot_eager", fullgraph=True)
            report["compiled"] = compiled(x, bias)
        except Exception as e:  # noqa: BLE001
            report["compiled"] = f"{type(e).__name__}: {str(e)[:300]}"
    return report


def fake_vs_real_layout(op, x, bias, out) -> dict:
    """``{"real": meta, "fake": meta or "Error: ..."}``, meta = ``[shape, strides, dtype]``: the real result of
    ``op(x, bias)`` and the fake kernel's result on FakeTensors with x's own (non-contiguous) strides.

    The course compares them itself (``checks.dispatch.layout_problem``): ``opcheck``'s fake-tensor test
    compares strides on CPU tensors only from torch 2.13 on (2.11's ``compare_tensor_meta`` calls
    ``check_significant_strides`` with ``only_cuda=True``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def meta(t):
        return [list(t.shape), list(t.stride()), str(t.dtype).replace("torch.", "")]

    report = {"real": meta(out) if isinstance(out, torch.Tensor) else f"not a tensor: {type(out).__name__}"}
    try:
        with FakeTensorMode() as mode:
            fo = op(mode.from_tensor(x), mode.from_tensor(bias))
            report["fake"] = meta(fo) if isinstance(fo, torch.Tensor) else f"not a tensor: {type(fo).__name__}"
    except Exception as e:  # noqa: BLE001  (a fake kernel that fails is reported by report["fake"] too)
        report["fake"] = f"{type(e).__name__}: {str(e)[:300]}"
    return report


# ================================================================================================
# Exercise dispatch.cpp_op: the same operator with a C++ kernel
# ================================================================================================
class _OpWatcher(TorchDispatchMode):
    """Records the ATen ops a kernel calls: the kernel runs below the Python key (``redispatch``) while this
    mode is active, so every op it dispatches comes through here."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def check_cpp_op(entry, shape, dtype_name: str, full: bool, values: str = "normal"):
    """Build ``entry.source()`` (C++, once per source: ``cpp_build``), add ``entry.register(namespace, lib)``'s
    Python registrations to a fresh ``torch.library.Library`` fragment, exercise the op as ``op_report`` does,
    and report where its CPU kernel came from and which ATen ops that kernel calls. The fragment is
    destroyed after the case, so the next case (or submission) registers afresh."""
    from . import cpp_build

    source, register = getattr(entry, "source", None), getattr(entry, "register", None)
    if not callable(source) or not callable(register):
        raise TypeError(f"{getattr(entry, '__name__', entry)!r} must be a class with `source()` (returning the C++ "
                        f"text) and `register(namespace, lib)` (the Python registrations)")
    text = source()
    if not isinstance(text, str):
        raise TypeError(f"source() must return the C++ source as a str, got {type(text).__name__}")
    missing = cpp_build.compiler_missing()
    if missing:  # the grader's own process says whether that may be so (CppOpExercise.compare)
        return {"skipped": missing}
    ns = cpp_build.build(text)
    packet = getattr(getattr(torch.ops, ns), "fused_bias_gelu", None)
    if packet is None:
        raise LookupError("your C++ built, but it defines no NAMESPACE::fused_bias_gelu: declare the schema in "
                          "TORCH_LIBRARY(NAMESPACE, m) { m.def(\"fused_bias_gelu(Tensor x, Tensor bias) -> Tensor\"); }")
    op = packet.default
    lib = torch.library.Library(ns, "FRAGMENT")
    try:
        register(ns, lib)
        try:
            report = op_report(op, shape, dtype_name, full, values)
        except NotImplementedError as e:  # the dispatcher's "Could not run ...": not the stub's NotImplementedError
            raise RuntimeError(str(e).strip().splitlines()[0]) from None
        report["origins"] = {k: list(v) for k, v in cpp_build.kernel_origins(f"{ns}::fused_bias_gelu").items()}
        x, bias, _ = op_inputs(shape, dtype_name, values=values)
        watcher = _OpWatcher()
        try:
            with watcher:  # the CPU kernel alone, its own calls watched
                op.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), x, bias)
        except Exception:  # noqa: BLE001  (no CPU kernel: reported by the table)
            pass
        report["kernel_calls"] = sorted(set(watcher.seen))
    finally:
        lib._destroy()
        # The Python dispatcher (opcheck's AOT test, torch.compile) caches each key's resolved kernel on the
        # OpOverload: a cached Autograd entry outliving the registration crashes the next case that has none.
        getattr(op, "_dispatch_cache", {}).clear()
        torch._dynamo.reset()  # compiled graphs may hold the registrations just destroyed
    return report


# ================================================================================================
# Exercise dispatch.memory_estimate: a memory estimate with FakeTensorMode
# ================================================================================================
class MaskedReLU(nn.Module):
    """relu written as masked_fill: autograd saves the bool mask, a storage of 1 byte per element."""

    def forward(self, x):
        return x.masked_fill(x < 0, 0.0)


def memory_model(spec) -> nn.Module:
    """``("mlp", d_in, d_hidden, d_out, dtype, freeze_first)``, ``("lm", vocab, d_model, dtype,
    freeze_embedding)``, ``("conv", c_in, c_mid, kernel, dtype)`` or ``("masked", d_in, d_hidden, dtype)``;
    parameters in ``dtype``."""
    kind, *a = spec
    if kind == "mlp":
        d_in, d_hidden, d_out, dtype, freeze_first = a
        f = {"dtype": getattr(torch, dtype)}
        m = nn.Sequential(nn.Linear(d_in, d_hidden, **f), nn.GELU(), nn.Linear(d_hidden, d_out, **f))
        if freeze_first:
            m[0].requires_grad_(False)
    elif kind == "lm":
        vocab, d_model, dtype, freeze_embedding = a
        f = {"dtype": getattr(torch, dtype)}
        m = nn.Sequential(nn.Embedding(vocab, d_model, **f), nn.LayerNorm(d_model, **f),
                          nn.Linear(d_model, vocab, bias=False, **f))
        if freeze_embedding:
            m[0].requires_grad_(False)
    elif kind == "conv":
        c_in, c_mid, kernel, dtype = a
        f = {"dtype": getattr(torch, dtype)}
        m = nn.Sequential(nn.Conv2d(c_in, c_mid, kernel, padding=kernel // 2, **f), nn.ReLU(),
                          nn.Conv2d(c_mid, c_in, kernel, **f), nn.Flatten())
    elif kind == "masked":
        d_in, d_hidden, dtype = a
        f = {"dtype": getattr(torch, dtype)}
        m = nn.Sequential(nn.Linear(d_in, d_hidden, **f), MaskedReLU(), nn.Linear(d_hidden, 1, **f))
    else:
        raise ValueError(f"unknown memory model kind {kind!r}")
    return m


def _fake_mode_active() -> bool:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return any(isinstance(m, FakeTensorMode) for m in _get_current_dispatch_mode_stack())


def estimate_memory_probe(entry, spec, input_shape, input_dtype: str, device: str):
    """Call the student's ``estimate_memory(model_fn, input_shape, input_dtype, device)``.

    ``model_fn`` refuses to build the model outside FakeTensorMode: the point is to estimate a model
    that does not fit, and some cases describe gigabytes of parameters."""
    def model_fn():
        if not _fake_mode_active():
            raise RuntimeError("model_fn() was called outside FakeTensorMode: build the model under "
                               "`with FakeTensorMode():` (a real build of this model could need gigabytes)")
        return memory_model(spec)

    device = "".join(list(device))  # equal to the literal "cuda" but not the same object: compare with ==
    return entry(model_fn, tuple(input_shape), getattr(torch, input_dtype), device)
