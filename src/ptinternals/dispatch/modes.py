"""TorchDispatchModes that watch ATen ops: an op logger, a memory tracker, a hidden-copy detector.

Built on ``torch/utils/_python_dispatch.py`` ``TorchDispatchMode``: while a mode is on the stack, the
Python dispatch key sits in the thread-local include set, so every op - forward and backward, after
autograd and after CompositeImplicitAutograd decompositions - reaches ``__torch_dispatch__`` with its
``OpOverload`` (``aten.add.Tensor``) and real arguments. The mode is popped while its handler runs, so
``func(*args)`` inside the handler goes straight on to the kernels below Python.

- ``OpLogger`` records each op's overload name, input/output shapes and dtypes;
- ``MemoryTracker`` counts the bytes of *new storages* each op allocates, and the peak of live bytes,
  by hanging a ``weakref.finalize`` on every storage it has seen (storages keep their Python object
  alive as long as the C++ StorageImpl lives, so the finalizer fires exactly when the memory is freed);
- ``HiddenCopyDetector`` reports ops that materialise copies (clone/contiguous/copy_/_to_copy and
  layout changes) with the Python line or the autograd node that caused them;
- ``FunctionLogger`` (a TorchFunctionMode) and ``function_vs_dispatch`` show the other interception
  layer: ``__torch_function__`` sees the Python API call (``torch.nn.functional.linear``) *before*
  autograd and before any decomposition; ``__torch_dispatch__`` sees the ATen ops after them.
"""
from __future__ import annotations

import os
import traceback
import weakref
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten


def _tensors(tree) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class OpRecord:
    op: str                                   # "aten.mm.default"
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[str, ...]

    def __str__(self) -> str:
        ins = ", ".join(f"{d}{list(s)}" for s, d in zip(self.input_shapes, self.input_dtypes, strict=True))
        outs = ", ".join(f"{d}{list(s)}" for s, d in zip(self.output_shapes, self.output_dtypes, strict=True))
        return f"{self.op}({ins}) -> {outs}"


class OpLogger(TorchDispatchMode):
    """Record every ATen op: ``with OpLogger() as log: ...`` then ``log.records`` / ``log.op_names()``."""

    def __init__(self):
        super().__init__()
        self.records: list[OpRecord] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins, outs = _tensors((args, kwargs)), _tensors(out)
        self.records.append(OpRecord(
            str(func),
            tuple(tuple(t.shape) for t in ins), tuple(_dtype_name(t.dtype) for t in ins),
            tuple(tuple(t.shape) for t in outs), tuple(_dtype_name(t.dtype) for t in outs)))
        return out

    def op_names(self) -> list[str]:
        return [r.op for r in self.records]

    def __str__(self) -> str:
        return "\n".join(str(r) for r in self.records)


def round_cuda_allocation(nbytes: int) -> int:
    """c10/cuda/CUDACachingAllocator.cpp ``round_size``: requests round up to a multiple of 512 bytes."""
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    return 512 * ((nbytes + 511) // 512) if nbytes else 0


@dataclass
class AllocationRecord:
    op: str
    new_bytes: int    # bytes of storages this op created
    live_bytes: int   # live tracked bytes right after the op


class MemoryTracker(TorchDispatchMode):
    """Bytes allocated per op and the peak of live tensor bytes, from storages (works on CPU and with
    FakeTensors, whose storages are meta storages with the right ``nbytes``).

    Storages that exist before the mode starts (parameters, inputs) are not seen until an op touches
    them as an *output*; pass them to ``track(...)`` to count them from the start. ``round_to_cuda``
    rounds every storage as the CUDA caching allocator does (512 B), to predict
    ``torch.cuda.max_memory_allocated``. Kernel workspaces that never become tensors are invisible.
    """

    def __init__(self, *, round_to_cuda: bool = False):
        super().__init__()
        self.round_to_cuda = bool(round_to_cuda)
        self.records: list[AllocationRecord] = []
        self.live_bytes = 0
        self.peak_bytes = 0
        self._live: dict[int, int] = {}  # id(storage) -> counted bytes, while the storage lives

    def _size(self, storage) -> int:
        n = storage.nbytes()
        return round_cuda_allocation(n) if self.round_to_cuda else n

    def _free(self, key: int) -> None:
        self.live_bytes -= self._live.pop(key, 0)

    def _see(self, t: torch.Tensor) -> int:
        """Start tracking ``t``'s storage if new; return the bytes it added."""
        if not _has_storage(t):
            return 0  # sparse tensors and wrapper subclasses: their inner tensors are what allocates
        storage = t.untyped_storage()
        key = id(storage)
        if key in self._live:
            return 0
        n = self._size(storage)
        self._live[key] = n
        self.live_bytes += n
        weakref.finalize(storage, self._free, key)
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return n

    def track(self, *tensors) -> int:
        """Count already-existing tensors (e.g. ``model.parameters()``) as live; returns bytes added."""
        added = 0
        for t in _tensors(list(tensors)):
            added += self._see(t)
        return added

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # an output that shares an input's storage (in-place ops, views) allocated nothing
        input_storages = {id(t.untyped_storage()) for t in _tensors((args, kwargs)) if _has_storage(t)}
        out = func(*args, **kwargs)
        new = sum(self._see(t) for t in _tensors(out)
                  if _has_storage(t) and id(t.untyped_storage()) not in input_storages)
        self.records.append(AllocationRecord(str(func), new, self.live_bytes))
        return out


def _has_storage(t: torch.Tensor) -> bool:
    return t.layout == torch.strided and (type(t).__torch_dispatch__ is torch.Tensor.__torch_dispatch__
                                          or _is_fake(t))


def _is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


# ops whose job is to materialise a copy, and the reasons we print for them
COPY_OPS = {
    aten.clone.default: "clone (.contiguous() on a non-contiguous tensor, reshape of a non-viewable tensor)",
    aten._to_copy.default: ".to(dtype/device) / .float() / .cpu(): a converted copy",
    aten.copy_.default: "copy_ into an existing tensor",
    aten._copy_from.default: "cross-device copy",
    aten._copy_from_and_resize.default: "cross-device copy with resize",
    aten.contiguous.default: ".contiguous()",
}
LAYOUT_OPS = {aten.to_dense.default, aten.to_sparse.default, aten._to_dense.default}


@dataclass
class CopyEvent:
    op: str
    shape: tuple[int, ...]
    nbytes: int
    where: str      # "file.py:12 in f" or "backward: PermuteBackward0"
    reason: str
    modules: tuple[str, ...] = field(default_factory=tuple)

    def __str__(self) -> str:
        mods = f" [{', '.join(self.modules)}]" if self.modules else ""
        return f"{self.op} {list(self.shape)} {self.nbytes} B at {self.where}{mods}: {self.reason}"


_TORCH_DIR = os.path.dirname(torch.__file__)
_THIS_FILE = os.path.abspath(__file__)


def _user_frame() -> str | None:
    """The innermost stack frame outside torch and this file: the line that caused the op."""
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if path.startswith(_TORCH_DIR) or path == _THIS_FILE or frame.filename.startswith("<frozen"):
            continue
        return f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}"
    return None


class HiddenCopyDetector(TorchDispatchMode):
    """Report every op that materialises a copy, with where it came from.

    ``where`` is the first Python frame outside torch (forward), or the autograd node being run
    (backward, where no user frame exists: ``torch._C._current_autograd_node()``). Pass a module to
    also get the module path (``"Model.block.attn"``) via ``torch.utils.module_tracker.ModuleTracker``.
    """

    def __init__(self, module: torch.nn.Module | None = None, *, min_bytes: int = 0):
        super().__init__()
        if module is not None and not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be an nn.Module or None, got {type(module).__name__}")
        if not isinstance(min_bytes, int) or min_bytes < 0:
            raise ValueError(f"min_bytes must be an int >= 0, got {min_bytes!r}")
        self.min_bytes = min_bytes
        self.events: list[CopyEvent] = []
        self._tracker = None
        if module is not None:
            from torch.utils.module_tracker import ModuleTracker

            self._tracker = ModuleTracker()

    def __enter__(self):
        if self._tracker is not None:
            self._tracker.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        out = super().__exit__(*exc)
        if self._tracker is not None:
            self._tracker.__exit__(*exc)
        return out

    def _reason(self, func, args, kwargs, out) -> str | None:
        if func in COPY_OPS:
            fmt = kwargs.get("memory_format")
            if func is aten.clone.default and fmt is torch.contiguous_format:
                return ".contiguous() / reshape of a non-contiguous tensor: a strided copy"
            if func is aten.clone.default and fmt not in (None, torch.preserve_format):
                return f"clone to {fmt}: a layout change"
            if func is aten._to_copy.default and isinstance(args[0], torch.Tensor):
                src, dst = args[0], out
                changes = [f"{n} {a}->{b}" for n, a, b in (("dtype", src.dtype, dst.dtype),
                                                            ("device", src.device, dst.device)) if a != b]
                return "_to_copy: " + (", ".join(changes) or "same dtype and device (a plain copy)")
            return COPY_OPS[func]
        if func in LAYOUT_OPS:
            return "layout conversion"
        return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        reason = self._reason(func, args, kwargs, out)
        if reason is not None:
            res = _tensors(out) or _tensors(args[:1])
            t = res[0] if res else None
            nbytes = t.numel() * t.element_size() if t is not None else 0
            if nbytes >= self.min_bytes:
                node = getattr(torch._C, "_current_autograd_node", lambda: None)()  # None outside backward
                where = f"backward: {node.name()}" if node is not None else (_user_frame() or "<unknown>")
                modules = tuple(sorted(self._tracker.parents - {"Global"})) if self._tracker else ()
                self.events.append(CopyEvent(str(func), tuple(t.shape) if t is not None else (), nbytes,
                                             where, reason, modules))
        return out

    def report(self) -> str:
        if not self.events:
            return "no hidden copies"
        total = sum(e.nbytes for e in self.events)
        return "\n".join(str(e) for e in self.events) + f"\n{len(self.events)} copies, {total} bytes"


class FunctionLogger(TorchFunctionMode):
    """Log the ``__torch_function__`` layer: the public Python API calls (``torch.nn.functional.linear``,
    ``Tensor.__add__``, ``Tensor.t``), before autograd and before any decomposition."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
        module = getattr(func, "__module__", None) or ""
        self.calls.append(f"{module}.{name}" if module and not name.startswith(module) else name)
        return func(*args, **(kwargs or {}))


def function_vs_dispatch(fn, *args, **kwargs) -> dict[str, list[str]]:
    """Run ``fn`` once under both a FunctionLogger and an OpLogger; return what each layer saw."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    with FunctionLogger() as f_log, OpLogger() as d_log:
        fn(*args, **kwargs)
    return {"torch_function": f_log.calls, "torch_dispatch": d_log.op_names()}
