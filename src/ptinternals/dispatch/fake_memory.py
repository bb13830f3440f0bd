"""Memory of one training step, estimated without memory: FakeTensorMode + a storage-tracking mode.

``torch/_subclasses/fake_tensor.py`` ``FakeTensorMode``: under the mode, tensor factories return
FakeTensors - wrapper subclasses with the metadata (shape, dtype, strides, device) of a real tensor and
a *meta* storage inside. Every op runs its meta kernel (or ``register_fake`` rule): shapes and dtypes
propagate, nothing is computed and no device memory is touched, so a 7B-parameter model "runs" on a
laptop. Storage sizes are real, so the bytes a step would allocate can be counted:

    parameters      sum of parameter storages
    gradients       sum of .grad storages after backward
    optimizer_state sum of optimizer state tensors (Adam: exp_avg + exp_avg_sq = 2x parameters, fp32);
                    0-dim ``step`` counters are left out (they live on the CPU unless fused/capturable)
    activations     unique storages saved for backward (``saved_tensors_hooks``), parameters and the
                    input excluded
    peak            peak of live bytes over forward + backward + optimizer.step of a *second* step
                    (the first creates the optimizer state), as ``MemoryTracker`` sees it

For ``device="cuda"`` each storage is rounded like the CUDA caching allocator (512 B), so ``peak``
predicts ``torch.cuda.max_memory_allocated`` minus what kernels allocate out of sight (cuBLAS workspace).

Backward on fake *CUDA* tensors needs a visible GPU, whatever the build: the autograd engine asks c10
about the device (``torch/csrc/autograd/engine.cpp`` -> ``at::cuda::detail::hasPrimaryContext``). A
CPU-only build has no CUDA DeviceGuardImpl and the process aborts (torch 2.13); a CUDA build without a
GPU raises "hasPrimaryContext expects a valid device index" (torch 2.11's PyPI wheel on a CPU machine).
There we trace on fake CPU tensors instead - same shapes and dtypes, hence the same bytes - and say so
in ``traced_on``.
"""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from .modes import MemoryTracker, round_cuda_allocation


def fake_backward_supported(device: str) -> bool:
    """Can this machine run backward on fake tensors of ``device``? (cuda: a CUDA build that sees that GPU;
    a CUDA build is not enough, see the module docstring)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return bool(torch.backends.cuda.is_built() and torch.cuda.is_available()
                    and (dev.index or 0) < torch.cuda.device_count())
    return dev.type in ("cpu", "meta")


def _storage_bytes(tensors, round_to_cuda: bool) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        s = t.untyped_storage()
        if id(s) in seen:
            continue
        seen.add(id(s))
        total += round_cuda_allocation(s.nbytes()) if round_to_cuda else s.nbytes()
    return total


def _convert_module(model: torch.nn.Module, device: str, dtype: torch.dtype) -> None:
    """``model.to(device, dtype)`` for fake parameters: ``Module.to`` swaps tensor subclasses in place
    (``torch.utils.swap_tensors``), which FakeTensors refuse, so rebind new Parameters instead."""
    for mod in model.modules():
        for name, p in list(mod.named_parameters(recurse=False)):
            new = p.detach().to(device=device, dtype=dtype if p.is_floating_point() else p.dtype)
            setattr(mod, name, torch.nn.Parameter(new, requires_grad=p.requires_grad))
        for name, b in list(mod.named_buffers(recurse=False)):
            if b is not None:
                mod._buffers[name] = b.to(device=device, dtype=dtype if b.is_floating_point() else b.dtype)


def _default_loss(out) -> torch.Tensor:
    if isinstance(out, (tuple, list)):
        out = out[0]
    return out.float().mean()


def estimate_training_memory(model_fn, input_shape, device: str = "cuda", dtype: torch.dtype = torch.float32,
                             *, input_dtype: torch.dtype | None = None, optimizer_fn=None,
                             loss_fn=None) -> dict:
    """Bytes of one training step of ``model_fn()`` on an input of ``input_shape``, from fake tensors.

    ``model_fn``: builds the model (called under FakeTensorMode, so its parameters are fake).
    ``input_dtype``: e.g. ``torch.long`` for token ids (default: ``dtype``).
    ``optimizer_fn(params)``: default ``AdamW(params, foreach=False)`` (foreach kernels add transient
    copies that depend on the implementation). ``loss_fn(output)``: default the mean of the output.
    Returns a dict of ints (bytes) plus ``device`` and ``traced_on``.
    """
    if isinstance(model_fn, torch.nn.Module) or not callable(model_fn):
        raise TypeError(f"model_fn must be a callable that *builds* the model under FakeTensorMode "
                        f"(e.g. lambda: MyModel()), got {type(model_fn).__name__}")
    if isinstance(input_shape, int):
        input_shape = (input_shape,)
    if not isinstance(input_shape, (tuple, list, torch.Size)) or not all(
            isinstance(s, int) and s >= 0 for s in input_shape):
        raise ValueError(f"input_shape must be a tuple of ints >= 0, got {input_shape!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    device = str(torch.device(device))
    trace_device = device if fake_backward_supported(device) else "cpu"
    round_to_cuda = torch.device(device).type == "cuda"
    input_dtype = input_dtype or dtype

    with FakeTensorMode():
        model = model_fn()
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model_fn must return an nn.Module, got {type(model).__name__}")
        _convert_module(model, trace_device, dtype)
        if input_dtype.is_floating_point:
            x = torch.empty(tuple(input_shape), dtype=input_dtype, device=trace_device)
        else:
            x = torch.zeros(tuple(input_shape), dtype=input_dtype, device=trace_device)
        result = training_step_memory(model, x, optimizer_fn=optimizer_fn, loss_fn=loss_fn,
                                      round_to_cuda=round_to_cuda)
    result.update(device=device, traced_on=trace_device)
    return result


def estimate_memory(model_fn, input_shape, input_dtype: torch.dtype = torch.float32, device: str = "cuda") -> dict:
    """The chapter exercise's estimate: ``parameters``, ``gradients``, ``optimizer_state`` (AdamW),
    ``activations`` (bytes) and ``output_shape`` of one training step of ``model_fn()`` on an input of
    ``input_shape`` and ``input_dtype``, traced on fake CPU tensors in the model's own dtypes, each storage
    rounded to 512 bytes when ``device`` is cuda (``training_step_memory`` does the accounting)."""
    if not isinstance(input_dtype, torch.dtype):
        raise TypeError(f"input_dtype must be a torch.dtype, got {input_dtype!r}")
    with FakeTensorMode():
        model = model_fn()
        make = torch.empty if input_dtype.is_floating_point else torch.zeros
        x = make(tuple(input_shape), dtype=input_dtype)
        step = training_step_memory(model, x, round_to_cuda=torch.device(device).type == "cuda")
    return {k: step[k] for k in ("parameters", "gradients", "optimizer_state", "activations", "output_shape")}


def training_step_memory(model: torch.nn.Module, x: torch.Tensor, *, optimizer_fn=None, loss_fn=None,
                         round_to_cuda: bool = False) -> dict:
    """Run two training steps of ``model`` on ``x`` (real or fake tensors) and account for the second.

    With real CUDA tensors the dict also holds ``cuda_max_allocated``: ``torch.cuda.max_memory_allocated``
    over the second step, the number the estimate tries to predict."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a tensor, got {type(x).__name__}")
    optimizer_fn = optimizer_fn or (lambda params: torch.optim.AdamW(params, foreach=False))
    loss_fn = loss_fn or _default_loss
    params = [p for p in model.parameters() if p.requires_grad]
    opt = optimizer_fn(params)
    loss_fn(model(x)).backward()  # warm-up: creates the optimizer state, as a real run's first step does
    opt.step()
    opt.zero_grad(set_to_none=True)

    state = [t for per_param in opt.state.values() for t in per_param.values()
             if isinstance(t, torch.Tensor) and t.dim() > 0]
    real_cuda = x.device.type == "cuda" and not _is_fake(x)
    if real_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    tracker = MemoryTracker(round_to_cuda=round_to_cuda)
    not_activations = {id(t.untyped_storage()) for t in [x, *model.parameters(), *model.buffers()]}
    saved: dict[int, int] = {}  # id(storage) -> bytes; no references kept, so backward frees as usual

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()  # all saved storages are alive during forward: ids are unique
        if id(storage) not in not_activations:
            n = storage.nbytes()
            saved[id(storage)] = round_cuda_allocation(n) if round_to_cuda else n
        return t

    with tracker:
        tracker.track(x, *model.parameters(), *model.buffers(), *state)
        baseline = tracker.live_bytes
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(x)
            loss = loss_fn(out)
        peak_forward = tracker.peak_bytes
        loss.backward()
        grads = [p.grad for p in params]
        opt.step()
    result = {
        "parameters": _storage_bytes(list(model.parameters()), round_to_cuda),
        "gradients": _storage_bytes(grads, round_to_cuda),
        "optimizer_state": _storage_bytes(state, round_to_cuda),
        "activations": sum(saved.values()),
        "input": _storage_bytes([x], round_to_cuda),
        "baseline": baseline,          # live before the step: params, buffers, optimizer state, input
        "peak_forward": peak_forward,
        "peak": tracker.peak_bytes,
        "output_shape": tuple((out[0] if isinstance(out, (tuple, list)) else out).shape),
    }
    if real_cuda:
        torch.cuda.synchronize()
        result["cuda_max_allocated"] = int(torch.cuda.max_memory_allocated())
    del loss, grads, out
    opt.zero_grad(set_to_none=True)
    return result


def _is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n} B"
