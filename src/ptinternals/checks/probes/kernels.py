"""The kernels chapter's probes (sandbox side): run a student's Triton wrapper the way the kernel checks need.

:func:`kernel_case` calls the wrapper with **guard bytes** around every tensor: each input is copied
into the middle of a larger buffer, and every tensor the wrapper allocates (``torch.empty``,
``empty_like``, ``clone``...) is given one too, through a ``TorchDispatchMode``. The guards are
filled with 0xFF bytes (NaN in fp16, bf16 and fp32), and so is every ``torch.empty`` result, since
that memory is uninitialized anyway. So:

* a store past the end of a tensor (a missing mask on the last block) lands in a guard instead of the
  heap, where the Triton interpreter would corrupt memory and kill the process; the probe reports
  which tensor's guard was written;
* a load past the end reads NaN, which shows up in the result;
* output elements a kernel never writes (a grid that is too small) stay NaN.

It also records which aten ops the wrapper ran (the checker rejects solutions that compute the answer
with torch instead of a kernel) and how many Triton kernels it launched.

A first argument ``{"benchmark": ...}`` asks for a performance measurement instead: on a GPU, the
wrapper and torch's own op are timed in this process on the same inputs (``do_bench``, median,
interleaved); without a GPU the case is skipped. bf16 inputs are skipped without a GPU too: the
interpreter computes bf16 wrongly.

:func:`custom_op_case` drives the custom-op exercise (opcheck, fake tensors, gradients, compile,
training). :func:`small_model_losses` is the small training run both sides use: here with the
student's op, in the grader with ``F.layer_norm``.

Runs next to student code: imports only torch, triton, numpy, the standard library and
``ptinternals.benchmark``; contains no solution.
"""

from __future__ import annotations

GUARD_BEFORE = 16 << 10  # bytes of guard before every tensor
GUARD_AFTER = 64 << 10  # bytes of guard after it, plus 4x the tensor's own bytes (offsets in bytes, not
#                         elements, land there), at most GUARD_SCALED_MAX
GUARD_SCALED_MAX = 16 << 20
FILL = 0xFF  # guards of inputs, and all of a fresh torch.empty: NaN in fp16, bf16, fp32 and fp64
FILL_ALLOC = 0xFE  # guards of what the wrapper allocates (a NaN stored there must not look untouched)
SKIP_BF16 = (
    "bf16 is checked on a GPU only: the Triton interpreter computes bf16 wrongly "
    "(this case runs when the grader has a GPU)"
)
SKIP_PERF = "performance is measured on a GPU only (this case runs when the grader has a GPU)"


# ================================================================================================
# Guarded tensors
# ================================================================================================
def _extent(t) -> int:
    """Elements between t's first and last addressed element, inclusive (0 for an empty tensor)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))


def _overlapping(t) -> bool:
    return any(st == 0 and s > 1 for s, st in zip(t.shape, t.stride(), strict=True))


def guarded(t, *, copy_values: bool = True, fill: int = FILL):
    """A tensor equal to ``t`` (same shape, strides, dtype, device) in the middle of a guarded buffer.

    Returns ``(tensor, guard)`` where ``guard = (base_bytes, start, end, fill)``: bytes outside
    ``[start, end)`` of ``base_bytes`` must still equal ``fill`` after the call. Inside, the bytes
    are 0xFF (NaN) until ``t``'s values are copied in (unless ``copy_values`` is False).
    """
    import torch

    if t.layout != torch.strided or t.device.type == "meta" or _overlapping(t) or t.dtype == torch.bool:
        return t, None
    elem = t.element_size()
    before = GUARD_BEFORE // elem
    extent = _extent(t)
    after = (GUARD_AFTER + min(4 * extent * elem, GUARD_SCALED_MAX)) // elem
    base = torch.empty(before + extent + after, dtype=t.dtype, device=t.device)
    raw = base.view(torch.uint8)
    start, end = before * elem, (before + extent) * elem
    raw[:start].fill_(fill)
    raw[start:end].fill_(FILL)
    raw[end:].fill_(fill)
    g = base.as_strided(tuple(t.shape), tuple(t.stride()), before)
    if copy_values and t.numel():
        g.copy_(t)
    return g, (raw, start, end, fill)


def guard_intact(guard) -> bool:
    raw, start, end, fill = guard
    return bool((raw[:start] == fill).all()) and bool((raw[end:] == fill).all())


def stray_writes(guard, elem: int) -> dict:
    """Where a kernel wrote into a guard, in elements of the tensor's dtype: how many elements before
    it, and the first, last and count of those after its last addressed element (0 = right after it).
    A missing mask on the last block writes one unbroken run starting right after the end."""
    raw, start, end, fill = guard
    before = raw[:start].view(-1, elem) if start else raw[:0].view(0, elem)
    after = raw[end : end + (raw.numel() - end) // elem * elem].view(-1, elem)
    dirty_after = (after != fill).any(1).nonzero().flatten()
    return {
        "before": int((before != fill).any(1).sum()),
        "after_first": int(dirty_after[0]) if len(dirty_after) else -1,
        "after_last": int(dirty_after[-1]) if len(dirty_after) else -1,
        "after_count": len(dirty_after),
    }


def _describe(t) -> str:
    return f"shape {tuple(t.shape)}, {str(t.dtype).replace('torch.', '')}"


def _tensors(tree):
    import torch

    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (list, tuple)):
        for x in tree:
            yield from _tensors(x)
    elif isinstance(tree, dict):
        for x in tree.values():
            yield from _tensors(x)


def _guard_mode():
    """A TorchDispatchMode that records op names and puts guards around every fresh tensor."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class GuardAllocations(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: set[str] = set()
            self.guards: list[tuple[str, tuple, int, list]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func.overloadpacket.__name__
            self.ops.add(name)
            out = func(*args, **kwargs)
            if not isinstance(out, torch.Tensor) or out.device.type == "meta":
                return out
            inputs = {
                a.untyped_storage().data_ptr()
                for a in _tensors((args, kwargs))
                if a.layout == torch.strided and a.device.type != "meta"
            }
            if out.layout != torch.strided or out.untyped_storage().data_ptr() in inputs:
                return out  # a view or an in-place result: no new memory
            fresh = name.startswith(("empty", "new_empty"))  # uninitialized memory: make it NaN
            g, guard = guarded(out, copy_values=not fresh, fill=FILL_ALLOC)
            if guard is not None:
                self.guards.append((f"a tensor your code allocated ({name}: {_describe(out)})", guard, out.element_size(),
                                    list(out.shape)))
            return g

    return GuardAllocations()


class _LaunchCounter:
    """Counts Triton kernel launches (compiled ``JITFunction.run`` and the interpreter's)."""

    def __init__(self):
        self.n = 0
        self.num_warps: set = set()  # the launch options' num_warps (the interpreter ignores them; a GPU does not)
        self._saved = []

    def __enter__(self):
        import triton.runtime.jit as jit

        classes = [jit.JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction

            classes.append(InterpretedFunction)
        except ImportError:  # pragma: no cover - every triton this course supports has it
            pass
        counter = self
        for cls in classes:
            original = cls.__dict__.get("run")
            if original is None:
                continue

            def run(self, *args, _orig=original, **kwargs):
                counter.n += 1
                if kwargs.get("num_warps") is not None:
                    counter.num_warps.add(kwargs["num_warps"])
                return _orig(self, *args, **kwargs)

            self._saved.append((cls, original))
            cls.run = run
        return self

    def __exit__(self, *exc):
        for cls, original in self._saved:
            cls.run = original
        return False


def run_guarded(entry, *args):
    """Call ``entry(*args)`` with guarded inputs and allocations; report what it did.

    ``oob``: the tensors whose guards were written (``stray``: where, see :func:`stray_writes`);
    ``modified``: the inputs whose memory changed (an element, or a gap between strided elements).
    """
    import warnings

    import torch

    guards, snapshots = [], []
    new_args = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            g, guard = guarded(a)
            if guard is not None:
                label = f"input {i} ({_describe(a)})"
                guards.append((label, guard, a.element_size(), list(a.shape)))
                raw, start, end, _ = guard
                snapshots.append((label, raw, start, end, raw[start:end].clone()))
            new_args.append(g)
        else:
            new_args.append(a)
    mode = _guard_mode()
    with _LaunchCounter() as launches, warnings.catch_warnings():
        # inf and NaN cases make the interpreter's numpy warn ("overflow encountered"): expected, and a
        # test cell that writes to stderr scores 0 under nbgrader
        warnings.simplefilter("ignore", RuntimeWarning)
        with mode:
            out = entry(*new_args)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    stray = [dict(label=label, shape=shape, **stray_writes(guard, elem))
             for label, guard, elem, shape in guards + mode.guards if not guard_intact(guard)]
    modified = [label for label, raw, start, end, before in snapshots if not torch.equal(raw[start:end], before)]
    device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
    return {"out": out, "ops": sorted(mode.ops), "launches": launches.n, "oob": [s["label"] for s in stray],
            "stray": stray, "modified": modified, "num_warps": sorted(launches.num_warps, key=repr), "device": device}


def kernel_case(entry, *args):
    """The probe of the kernel exercises: a benchmark, a GPU-only skip, or a guarded call."""
    import torch

    if args and isinstance(args[0], dict) and "benchmark" in args[0]:
        return benchmark(entry, args[0])
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if any(t.dtype == torch.bfloat16 for t in tensors) and all(t.device.type == "cpu" for t in tensors):
        return {"skipped": SKIP_BF16, "device": "cpu"}
    try:
        return run_guarded(entry, *args)
    except Exception as e:  # a stub kernel body: the interpreter wraps its NotImplementedError
        if _not_implemented(e) and not isinstance(e, NotImplementedError):
            raise NotImplementedError(str(e)) from None
        raise


# ================================================================================================
# Performance against torch, in the same process (GPU only)
# ================================================================================================
def _inputs(spec, device):
    """The benchmark's inputs and torch's own op, from its spec (never from student code)."""
    import torch
    import torch.nn.functional as F

    kind, shape = spec["benchmark"], tuple(spec["shape"])
    dtype = getattr(torch, spec["dtype"])
    g = torch.Generator(device=device).manual_seed(0)
    rand = lambda *s: torch.randn(*s, generator=g, device=device, dtype=dtype)  # noqa: E731
    if kind == "softmax":
        x = rand(*shape)
        return (x,), lambda: torch.softmax(x, -1)
    if kind == "layer_norm_forward":
        m, n = shape
        x, w, b = rand(m, n), rand(n), rand(n)
        return (x, w, b, 1e-5), lambda: F.layer_norm(x, (n,), w, b, 1e-5)
    if kind == "layer_norm_backward":
        m, n = shape
        x, w, b, dy = rand(m, n), rand(n), rand(n), rand(m, n)
        _, mean, rstd = torch.native_layer_norm(x, [n], w, b, 1e-5)
        return (
            (dy, x, w, mean.view(m), rstd.view(m)),
            lambda: torch.ops.aten.native_layer_norm_backward(
                dy, x, [n], mean, rstd, w, b, [True, True, True]
            ),
        )
    if kind == "matmul":
        m, n, k = shape
        a, b = rand(m, k), rand(k, n)
        return (a, b), lambda: torch.matmul(a, b)
    if kind == "attention":
        q, k, v = rand(*shape), rand(*shape), rand(*shape)
        causal = bool(spec.get("causal", False))

        def sdpa():
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return (q, k, v, causal), sdpa
    raise ValueError(f"unknown benchmark {kind!r}")


def benchmark(entry, spec):
    """Time ``entry`` and torch's op on the spec's inputs; correctness of the big run included."""
    import torch

    if not torch.cuda.is_available():
        return {"skipped": SKIP_PERF, "device": "cpu"}
    from ptinternals.benchmark import time_ms

    args, theirs = _inputs(spec, "cuda")
    ours = lambda: entry(*args)  # noqa: E731
    got, want = ours(), theirs()  # first call: compiles and autotunes
    torch.cuda.synchronize()
    if isinstance(got, (tuple, list)):
        got = got[0]
    if isinstance(want, (tuple, list)):
        want = want[0]
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
        return {
            "device": "cuda",
            "error": f"returned {type(got).__name__} "
            f"{tuple(got.shape) if isinstance(got, torch.Tensor) else ''}, expected shape {tuple(want.shape)}",
        }
    err = (got.float() - want.float()).abs().max().item()
    t_ours, t_theirs = [], []
    for _ in range(2):  # interleaved, best median of two: clocks and neighbours drift
        t_theirs.append(time_ms(theirs, "cuda"))
        t_ours.append(time_ms(ours, "cuda"))
    return {
        "device": "cuda",
        "gpu": torch.cuda.get_device_name(),
        "ms": min(t_ours),
        "torch_ms": min(t_theirs),
        "max_abs_err": err,
        "ref_max_abs": want.float().abs().max().item(),
    }


# ================================================================================================
# The custom-op exercise
# ================================================================================================
def small_model_losses(layer_norm, x, y, steps: int = 6, lr: float = 0.2) -> list[float]:
    """Train Linear -> layer_norm -> ReLU -> Linear on (x, y) with plain SGD; return the losses.

    ``layer_norm(h, weight, bias, eps)`` is the op under test. Initial weights come from a fixed
    generator, so both sides of the boundary train the very same model.
    """
    import torch

    g = torch.Generator().manual_seed(7)
    d_in, d_hidden = x.shape[1], 24
    dev = x.device
    w1 = (torch.randn(d_in, d_hidden, generator=g) * d_in**-0.5).to(dev).requires_grad_()
    b1 = torch.zeros(d_hidden, device=dev, requires_grad=True)
    ln_w = torch.ones(d_hidden, device=dev, requires_grad=True)
    ln_b = torch.zeros(d_hidden, device=dev, requires_grad=True)
    w2 = (torch.randn(d_hidden, y.shape[1], generator=g) * d_hidden**-0.5).to(dev).requires_grad_()
    params = [w1, b1, ln_w, ln_b, w2]
    losses = []
    for _ in range(steps):
        h = layer_norm(x @ w1 + b1, ln_w, ln_b, 1e-5)
        loss = ((torch.relu(h) @ w2 - y) ** 2).mean()
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, gr in zip(params, grads, strict=True):
                p -= lr * gr
        losses.append(float(loss.item()))
    return losses


def _not_implemented(exc) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, NotImplementedError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def custom_op_case(entry, kind, *args):
    """One check of a custom op ``entry`` (the student's ``CustomOpDef``).

    A ``NotImplementedError`` anywhere below (a stub, reached through the dispatcher, opcheck or
    dynamo, which wrap it) is re-raised as itself, so an unfinished answer reads as "not implemented".
    """
    try:
        return _custom_op_case(entry, kind, *args)
    except Exception as e:
        if _not_implemented(e) and not isinstance(e, NotImplementedError):
            raise NotImplementedError(str(e)[:500]) from None
        raise


def _custom_op_case(entry, kind, *args):
    import torch

    if kind == "is_custom_op":
        from torch._library.custom_ops import CustomOpDef

        return {"is_custom_op": isinstance(entry, CustomOpDef), "type": type(entry).__name__}
    if kind == "forward":
        return tuple(entry(*args))
    if kind == "grad":  # args[5], when given, names the frozen inputs (requires_grad=False): ("weight",)
        x, w, b, dy, eps = args[:5]
        frozen = args[5] if len(args) > 5 else ()
        x, w, b = (t.detach().clone().requires_grad_(name not in frozen)
                   for t, name in zip((x, w, b), ("x", "weight", "bias")))
        y = entry(x, w, b, eps)[0]
        return torch.autograd.grad(y, tuple(t for t in (x, w, b) if t.requires_grad), dy)
    if kind == "opcheck":
        x, w, b, eps = args
        inputs = tuple(t.detach().clone().requires_grad_() for t in (x, w, b)) + (eps,)
        result = torch.library.opcheck(entry, inputs, raise_exception=False)
        out = {}
        for test, verdict in result.items():
            if isinstance(verdict, BaseException):
                if _not_implemented(verdict):
                    raise NotImplementedError(str(verdict))
                out[test] = f"{type(verdict).__name__}: {str(verdict)[:600]}"
            else:
                out[test] = str(verdict)
        return out
    if kind == "compile":
        x, w, b, eps = args
        x, w, b = (t.detach().clone().requires_grad_() for t in (x, w, b))
        torch._dynamo.reset()

        def f(x, w, b):
            y = entry(x, w, b, eps)[0]
            return (y * y).sum()

        loss = torch.compile(f, backend="aot_eager", fullgraph=True)(x, w, b)
        return torch.autograd.grad(loss, (x, w, b))
    if kind == "train":
        x, y = args
        return small_model_losses(lambda h, w, b, eps: entry(h, w, b, eps)[0], x, y)
    raise ValueError(f"unknown custom-op check {kind!r}")
