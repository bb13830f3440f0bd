"""The amp chapter's probes (sandbox side): drive a student's rounding function, GradScaler or trainer.

Each probe runs next to the student's code and returns plain data for the trusted grader:

* ``record_bit_ops``: the rounding result, plus what the code used (a cast to fp16/bf16, numpy,
  struct), because the exercise is to round with integer operations;
* ``scaler_probe``: one scripted training run (``ptinternals.amp.scaffold.scaler_trajectory``) with a GradScaler (any class with
  torch.amp.GradScaler's methods): the scale before and after every step, which steps really called
  ``optimizer.step()``, the gradients and parameters after each step. The trusted grader runs the
  same script with ``torch.amp.GradScaler("cpu")`` for the expected trajectory;
* ``train_probe``: builds the optimizer and (torch's) GradScaler a case asks for, calls the student's
  trainer, and reports its losses, skipped steps, final weights, and in which dtypes its matmuls and
  its loss ran (and whether it used autocast, which the exercise does by hand);
* ``speed_probe``: the student's trainer in fp32 and in low precision: bytes saved for backward
  (any device), and on a GPU also time per step and peak memory.

Only torch and the standard library are imported; nothing here solves an exercise.
"""

from __future__ import annotations

import contextlib
import struct
import time

LOW_PRECISION = ("float16", "bfloat16")
_MATMUL_NAMES = {"linear", "matmul", "__matmul__", "__rmatmul__", "mm", "addmm", "bmm", "baddbmm", "einsum"}
_LOSS_NAMES = {"mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "cross_entropy"}


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _tensors(obj):
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def _recorder(on_call):
    """A TorchFunctionMode calling ``on_call(name, args, kwargs, out)`` after every torch call."""
    from torch.overrides import TorchFunctionMode

    class Recorder(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            on_call(getattr(func, "__name__", str(func)), args, kwargs, out)
            return out

    return Recorder()


@contextlib.contextmanager
def _watch_struct(used: set):
    """Record calls of struct's packing functions (struct.pack('e', ...) is a float16 conversion)."""
    names = ("pack", "unpack", "pack_into", "unpack_from", "iter_unpack")
    saved = {n: getattr(struct, n) for n in names}

    def wrap(n, f):
        def wrapper(*a, **k):
            used.add(f"struct.{n}")
            return f(*a, **k)

        return wrapper

    for n, f in saved.items():
        setattr(struct, n, wrap(n, f))
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(struct, n, f)


# ---- exercises amp.fp32_to_bf16_bits and amp.fp32_to_fp16_bits: rounding with integer operations ------------------------------------
def record_bit_ops(entry, x):
    """Call ``entry(x)``; also report torch calls that made fp16/bf16 tensors, numpy/struct use, and whether
    ``x`` came back changed (its bit patterns, so NaNs compare too)."""
    import torch

    calls: set = set()
    low: set = set()
    used: set = set()
    before = x.clone()

    def on_call(name, args, kwargs, out):
        calls.add(name)
        if name in ("numpy", "__array__", "tolist"):
            used.add(f"Tensor.{name}")
        for t in _tensors(out):
            if _dtype_name(t.dtype) in LOW_PRECISION:
                low.add(f"{name} -> {_dtype_name(t.dtype)}")

    with _watch_struct(used), _recorder(on_call):
        out = entry(x)
    modified = not torch.equal(before.view(torch.int32), x.view(torch.int32))
    return {"out": out, "low_precision_made": sorted(low), "used": sorted(used), "input_modified": modified}


# ---- exercise amp.grad_scaler: GradScaler ---------------------------------------------------------------------
def scaler_probe(entry, config, params, script):
    """The student's GradScaler class through the scaffold's ``scaler_trajectory``, watching for torch's own."""
    import torch

    used: set = set()

    def on_call(name, args, kwargs, out):
        if name.startswith("_amp_"):
            used.add(f"torch.{name}")

    def make():
        scaler = entry(**config)
        if isinstance(scaler, torch.amp.GradScaler):
            used.add("torch.amp.GradScaler")
        return scaler

    from ptinternals.amp.scaffold import scaler_trajectory

    with _recorder(on_call):
        out = scaler_trajectory(make, params, script)
    out["used"] = sorted(used)
    return out


# ---- exercise amp.amp_train: the trainer --------------------------------------------------------------------
def make_optimizer(params: dict, spec):
    """("adam", lr) -> Adam(eps=1e-12, like the reference), ("sgd", lr) -> SGD."""
    import torch

    kind, lr = spec
    ps = list(params.values())
    if kind == "adam":
        return torch.optim.Adam(ps, lr=lr, eps=1e-12)
    if kind == "sgd":
        return torch.optim.SGD(ps, lr=lr)
    raise ValueError(f"optimizer spec must be ('adam', lr) or ('sgd', lr), got {spec!r}")


def make_scaler(spec):
    """None, or a dict of torch.amp.GradScaler keyword arguments -> a CPU or CUDA GradScaler."""
    import torch

    if spec is None:
        return None
    spec = dict(spec)
    device = spec.pop("device", "cpu")
    return torch.amp.GradScaler(device, **spec)


def train_probe(
    entry, params, opt_spec, data, steps, dtype, scaler_spec=None, clip=None, accum=1, loss_weight=1.0, frozen=()
):
    """Call ``entry(params, optimizer, data, steps, dtype, scaler, clip, accum, loss_weight)``; the optimizer
    owns every master weight, the ``frozen`` ones (set to ``requires_grad=False``) too, as
    ``AdamW(model.parameters())`` does.

    The run is on the CPU whatever device the grader uses: it is compared with a CPU autocast run to
    0.1%, and a GPU's bf16 matmuls (another summation order) would differ by more than that.
    """
    import torch

    params = {n: p.detach().cpu().clone().requires_grad_(n not in frozen) for n, p in params.items()}
    data = [tuple(t.cpu() for t in batch) for batch in data]
    opt = make_optimizer(params, opt_spec)
    scaler = make_scaler(scaler_spec)
    step_grad_norms = []  # the gradient norm each real optimizer.step() saw (after unscaling and clipping)
    real_step = opt.step

    def recorded_step(*args, **kwargs):
        with torch.no_grad():
            norms = [torch.linalg.vector_norm(p.grad.double()) for p in params.values() if p.grad is not None]
            step_grad_norms.append(float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0)
        return real_step(*args, **kwargs)

    opt.step = recorded_step
    matmul, loss_in = set(), set()
    autocast = [False]
    devices = {p.device.type for p in params.values()}

    def on_call(name, args, kwargs, out):
        if any(torch.is_autocast_enabled(d) for d in devices):
            autocast[0] = True
        if name in _MATMUL_NAMES:
            ins = [t for t in _tensors(list(args) + list(kwargs.values())) if t.is_floating_point()]
            matmul.update(_dtype_name(t.dtype) for t in ins)
        elif name in _LOSS_NAMES:
            ins = [t for t in _tensors(list(args)[:1])]
            loss_in.update(_dtype_name(t.dtype) for t in ins)

    with _recorder(on_call):
        out = entry(params, opt, data, steps, dtype, scaler, clip, accum, loss_weight)
    return {
        "out": out,
        "params": {n: p.detach().clone() for n, p in params.items()},
        "matmul_dtypes": sorted(matmul),
        "loss_input_dtypes": sorted(loss_in),
        "autocast": autocast[0],
        "final_scale": scaler.get_scale() if scaler is not None else 1.0,
        "step_grad_norms": step_grad_norms,
    }


# ---- exercise amp.amp_speed: smaller everywhere, faster on a GPU ----------------------------------------------
CPU_SIZES = dict(d_in=64, d_hidden=256, d_out=16, batch=64)
GPU_SIZES = dict(d_in=1024, d_hidden=4096, d_out=1024, batch=8192)


def _mlp_problem(sizes, device, seed=0):
    """fp32 weights (the scaffold's layout: w1 (h, d_in), b1, w2 (d_out, h), b2) and one (x, y) batch."""
    import torch

    g = torch.Generator().manual_seed(seed)
    d_in, h, d_out, b = sizes["d_in"], sizes["d_hidden"], sizes["d_out"], sizes["batch"]

    def u(shape, fan_in):
        return ((torch.rand(shape, generator=g) * 2 - 1) / fan_in**0.5).to(device)

    params = {"w1": u((h, d_in), d_in), "b1": u((h,), d_in), "w2": u((d_out, h), h), "b2": u((d_out,), h)}
    x = torch.randn(b, d_in, generator=g).to(device)
    y = torch.randn(b, d_out, generator=g).to(device)
    return params, [(x, y)]


def _saved_bytes(entry, dtype, scaler_spec, device) -> tuple[int, int, int]:
    """(bytes, float32 bytes) of the distinct storages autograd saves during one training step, and the
    number of matmuls that ran (one forward of the 2-layer MLP has 2)."""
    import torch

    params, data = _mlp_problem(CPU_SIZES, device)
    params = {n: p.requires_grad_(True) for n, p in params.items()}
    opt = make_optimizer(params, ("sgd", 1e-3))
    seen = {}

    def pack(t):  # every saved tensor stays alive until backward, so storage addresses are unique
        s = t.untyped_storage()
        seen[(s.data_ptr(), t.device.type)] = (s.nbytes(), t.dtype == torch.float32)
        return t

    matmuls = [0]

    def on_call(name, args, kwargs, out):
        matmuls[0] += name in _MATMUL_NAMES

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _recorder(on_call):
        entry(params, opt, data, 1, dtype, make_scaler(scaler_spec), None, 1, 1.0)
    return int(sum(n for n, _ in seen.values())), int(sum(n for n, f in seen.values() if f)), matmuls[0]


def _timed_run(entry, dtype, scaler_spec, device, steps=5):
    """(ms per step, peak bytes allocated above the start) of the student's trainer at GPU size."""
    import torch

    params, data = _mlp_problem(GPU_SIZES, device)
    params = {n: p.requires_grad_(True) for n, p in params.items()}
    opt = make_optimizer(params, ("adam", 1e-4))
    entry(params, opt, data, 2, dtype, make_scaler(scaler_spec), None, 1, 1.0)  # warm-up, lazy state
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    best = float("inf")
    for _ in range(2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        entry(params, opt, data, steps, dtype, make_scaler(scaler_spec), None, 1, 1.0)
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) * 1e3 / steps)
    peak = torch.cuda.max_memory_allocated() - base
    del params, data, opt
    torch.cuda.empty_cache()
    return best, int(peak)


def speed_probe(entry, dtype, scaler_spec=None):
    """fp32 vs ``dtype`` for the student's trainer: saved-for-backward bytes; on CUDA also time and memory."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if scaler_spec is not None:
        scaler_spec = dict(scaler_spec, device=device)
    report = {"device": device, "dtype": _dtype_name(dtype)}
    fp32_bytes, _, _ = _saved_bytes(entry, torch.float32, None, device)
    low_bytes, low_fp32_bytes, low_matmuls = _saved_bytes(entry, dtype, scaler_spec, device)
    report.update(
        saved_bytes_fp32=fp32_bytes,
        saved_bytes_low=low_bytes,
        saved_fp32_bytes_in_low=low_fp32_bytes,
        matmuls_per_step=low_matmuls,
        saved_ratio=low_bytes / fp32_bytes if fp32_bytes else float("nan"),
    )
    if device == "cuda":
        ms32, peak32 = _timed_run(entry, torch.float32, None, device)
        ms_low, peak_low = _timed_run(entry, dtype, scaler_spec, device)
        report.update(
            ms_fp32=ms32,
            ms_low=ms_low,
            time_ratio=ms_low / ms32,
            peak_fp32=peak32,
            peak_low=peak_low,
            peak_ratio=peak_low / peak32 if peak32 else float("nan"),
            speed="measured",
        )
    else:
        report["speed"] = (
            "SKIPPED on CPU: bf16/fp16 matmuls are 12-18x slower than fp32 on a CPU without AMX, "
            "so the speed and peak-memory half of this check runs only on a GPU"
        )
    return report
