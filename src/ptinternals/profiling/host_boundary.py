"""The Python-level half of the sync detector: host<->device transfers, printing, and CUDA on a CPU build.

Some ways of reading a device tensor never reach an ATen op that says so on a CPU tensor:
``x.cpu()``, ``x.to("cpu")`` and ``x.tolist()`` of a CPU tensor return at once, and printing runs with
every mode switched off (``torch/_tensor_str.py`` uses ``_disable_current_modes``). A ``TorchFunctionMode``
sees them before any of that, as Python API calls (``torch.Tensor.cpu``, ``torch.Tensor.__repr__``), so
this layer classifies them; the ATen layer (``sync_rules``, ``sync_detector``) classifies the rest.

Composite ops can branch on the device, so the ATen ops of a CPU run are not those of a CUDA run:
``F.one_hot`` validates its indices with ``min()/max().item()`` on the CPU but on CUDA reads
``max()`` only when ``num_classes`` is not given (aten/src/ATen/native/Onehot.cpp). Such calls are
judged here, as a whole, and the ATen ops under them are not judged again (``suppress``).

**Emulation.** On a build without CUDA (``emulate=True``), a program written for CUDA still runs:
device arguments ``"cuda"``/``cuda:N``/an int are rewritten to ``"cpu"`` and the results are recorded
as device tensors in a :class:`~.placement.Placement`; ``x.cuda()``/``x.to("cuda")`` copy;
``pin_memory()`` and ``pin_memory=True`` give (emulated) pinned buffers; ``x.device`` and ``x.is_cuda``
of a device tensor answer ``cuda:0``/``True`` to the program (not to torch's internals, which run
with this mode off). Not emulated: streams, events, generators and other ``torch.cuda`` objects.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.overrides import TorchFunctionMode, resolve_name
from torch.utils._pytree import tree_flatten

from .placement import Placement

_READS = {  # API calls that copy a whole device tensor to the host
    "torch.Tensor.tolist", "torch.Tensor.numpy", "torch.Tensor.__array__", "torch.Tensor.__repr__",
    "torch.Tensor.__str__", "torch.Tensor.__format__",
}
_FROM_DATA = {"torch.tensor", "torch.as_tensor", "torch.asarray"}


def is_cuda_device(device: object) -> bool:
    """True for "cuda", "cuda:1", torch.device("cuda") and an int ordinal (ints mean CUDA devices)."""
    if device is None or isinstance(device, bool):
        return False
    if isinstance(device, int):
        return True
    if isinstance(device, (str, torch.device)):
        return torch.device(device).type == "cuda"
    return False


def _tensors(tree) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


class HostBoundary(TorchFunctionMode):
    """Judge Python-level transfers and reads; emulate CUDA placement on a CPU build.

    ``on_event(api, reason, kind)`` is called for every sync found at this level (kind "implicit"), and
    for ``non_blocking`` host-to-device copies from pageable memory (kind "stall": the host copies the
    bytes to a staging buffer before it returns; ``set_sync_debug_mode`` does not report it). While a call that this
    layer judged is running, ``suppress`` is True (the ATen layer must not count it again);
    ``current_api`` is the Python call in progress and ``api_on_device`` whether it involves a device
    tensor (the ATen layer uses it to place the tensors that call creates).
    """

    def __init__(self, placement: Placement, emulate: bool, on_event: Callable[[str, str, str], None]):
        super().__init__()
        if not isinstance(placement, Placement):
            raise TypeError(f"placement must be a Placement, got {type(placement).__name__}")
        self.placement = placement
        self.emulate = bool(emulate)
        self.on_event = on_event
        self.suppress = False
        self.current_api: str | None = None
        self.api_on_device = False

    # ---- the mode ------------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = resolve_name(func) or getattr(func, "__name__", repr(func))
        outer = (self.suppress, self.current_api, self.api_on_device)
        self.current_api = name
        try:
            return self._handle(name, func, args, kwargs)
        finally:
            self.suppress, self.current_api, self.api_on_device = outer

    def _judged(self, reason: str | None, call: Callable[[], object], kind: str = "implicit"):
        """Run a call this layer has judged: report ``reason`` (if any) and hide its ATen ops."""
        if reason is not None:
            self.on_event(self.current_api, reason, kind)
        self.suppress = True
        return call()

    def _handle(self, name, func, args, kwargs):
        on_device = self.placement.on_device
        x = args[0] if args else None
        if self.emulate and name == "torch.Tensor.device.__get__" and on_device(x):
            return torch.device("cuda", 0)
        if self.emulate and name == "torch.Tensor.is_cuda.__get__" and on_device(x):
            return True
        if self.emulate and name == "torch.Tensor.is_pinned":
            return self.placement.is_pinned(x)
        if self.emulate and name == "torch.Tensor.pin_memory":
            out = x.clone()
            self.placement.mark_pinned(out)
            return out
        if name in _READS and on_device(x):
            if name == "torch.Tensor.numpy":  # what torch says for a CUDA tensor, emulated or not
                raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy "
                                "the tensor to host memory first.")
            reason = "scalar_read" if name == "torch.Tensor.__format__" and x.dim() == 0 else "device_to_host"
            return self._judged(reason, lambda: func(*args, **kwargs))
        if name == "torch.Tensor.cpu" and on_device(x):
            return self._transfer(func, args, kwargs, x, to_device=False, non_blocking=False, dtype=None)
        if name == "torch.Tensor.cuda":
            non_blocking = bool(kwargs.get("non_blocking", args[2] if len(args) > 2 else False))
            if on_device(x):
                return x
            return self._transfer(func, args, kwargs, x, to_device=True, non_blocking=non_blocking, dtype=None)
        if name == "torch.Tensor.to":
            return self._to(func, args, kwargs, x)
        if name == "torch.Tensor.copy_":
            src = args[1] if len(args) > 1 else kwargs.get("src")
            non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
            if isinstance(src, torch.Tensor) and on_device(x) != on_device(src) and not non_blocking:
                reason = "host_to_device" if on_device(x) else "device_to_host"
                return self._judged(reason, lambda: func(*args, **kwargs))
            return self._judged(None, lambda: func(*args, **kwargs))
        if name == "torch.nn.functional.one_hot" and on_device(x):
            num_classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
            out = self._judged("one_hot_classes" if num_classes == -1 else None, lambda: func(*args, **kwargs))
            self._place(out, True)
            return out
        if name == "torch.Tensor.__setitem__" and on_device(x):
            # python_variable_indexing.cpp makes a Python value a *CPU* scalar tensor when self is on
            # CUDA, so that index_put_ can take the masked_fill_ path: keep it on the host here too.
            return func(*args, **kwargs)
        if name in _FROM_DATA and is_cuda_device(kwargs.get("device")):
            data = args[0] if args else kwargs.get("data")
            copies = not (isinstance(data, torch.Tensor) and on_device(data))
            if self.emulate:
                kwargs["device"] = "cpu"
            out = self._judged("host_to_device" if copies else None, lambda: func(*args, **kwargs))
            self._place(out, True)
            return out
        return self._generic(func, args, kwargs)

    # ---- placement-aware calls -----------------------------------------------------------------
    def _place(self, out, on_device: bool) -> None:
        if self.emulate and on_device:
            for t in _tensors(out):
                self.placement.mark_device(t)

    def _generic(self, func, args, kwargs):
        """Any other call: rewrite CUDA device arguments (emulation) and place its outputs."""
        device_kw = kwargs.get("device")
        explicit = device_kw is not None
        to_device = is_cuda_device(device_kw) if explicit else any(
            self.placement.on_device(t) for t in _tensors((args, kwargs)))
        pin = kwargs.get("pin_memory") is True
        if self.emulate:
            if explicit and to_device:
                kwargs["device"] = "cpu"
            if pin:
                kwargs["pin_memory"] = False
        self.api_on_device = to_device
        out = func(*args, **kwargs)
        self._place(out, to_device)
        if self.emulate and pin:
            for t in _tensors(out):
                self.placement.mark_pinned(t)
        return out

    def _to(self, func, args, kwargs, x):
        rest = dict(kwargs)
        copy = bool(rest.pop("copy", False))
        rest.pop("memory_format", None)
        device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args[1:], **rest)
        if device is None or is_cuda_device(device) == self.placement.on_device(x):
            if self.emulate and device is not None:  # same side: at most a dtype change or a copy
                self.api_on_device = self.placement.on_device(x)
                out = x.to(dtype=dtype, copy=copy)
                self._place(out, self.api_on_device)
                return out
            return self._generic(func, args, kwargs)
        return self._transfer(func, args, kwargs, x, to_device=is_cuda_device(device),
                              non_blocking=non_blocking, dtype=dtype)

    def _transfer(self, func, args, kwargs, x, *, to_device: bool, non_blocking: bool, dtype):
        """A copy across the boundary. ``non_blocking=False`` makes the host wait (Copy.cu: memcpy_and_sync)."""
        reason = None if non_blocking else ("host_to_device" if to_device else "device_to_host")
        kind = "implicit"
        if non_blocking and to_device and not self.placement.is_pinned(x):
            reason, kind = "pageable_async", "stall"
        if self.emulate:
            out = self._judged(reason, lambda: x.to(dtype=dtype, copy=True) if dtype is not None else x.clone(), kind)
        else:
            out = self._judged(reason, lambda: func(*args, **kwargs), kind)
        self._place(out, to_device)
        return out
