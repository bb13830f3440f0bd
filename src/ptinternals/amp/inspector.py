"""See what autocast really did: a TorchDispatchMode that logs every aten op's input and output dtypes.

Dispatch order (the dispatch chapter): Autocast -> Autograd -> ... -> Python (where TorchDispatchMode lives)
-> the backend kernel. Autocast runs *above* the mode, so the mode sees the ops after autocast has
rewritten them: the inserted casts (``_to_copy`` fp32 -> bf16), the matmuls with their low-precision
inputs, and the composite ops already decomposed (``linear`` arrives as ``t`` + ``addmm``). It also
sees the backward pass, which runs in the dtypes the forward chose (autocast is off in backward).

    with torch.autocast("cpu", dtype=torch.bfloat16), AutocastDtypeMode() as mode:
        loss = model(x)
    mode.records  # [OpRecord(op='_to_copy', input_dtypes=('float32',), output_dtype='bfloat16'), ...]

``layer_output_dtypes`` answers the module-level question ("what dtype does each layer output?")
with forward hooks; ``ProbeNet`` is the small model the chapter's prediction exercise uses, and
``predict_probe_dtypes`` derives the answer from ``autocast_policy`` (the reference solution).

Mirrors torch/utils/_python_dispatch.py (TorchDispatchMode) and the Autocast keys of
c10/core/DispatchKey.h; self-contained so the chapter does not depend on the dispatch chapter's package.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .autocast_policy import autocast_output_dtype, dtype_name

# Ops that carry no dtype decision (autograd's bookkeeping); left out of records unless asked.
DEFAULT_IGNORE = frozenset({"detach", "alias", "lift_fresh", "_local_scalar_dense"})


class OpRecord(NamedTuple):
    op: str  # aten op name without namespace/overload: "addmm", "_to_copy", "native_layer_norm"
    input_dtypes: tuple[str, ...]  # dtypes of the tensor arguments, in order (lists flattened)
    output_dtype: str | None  # dtype of the first tensor output, None when there is none


class AutocastDtypeMode(TorchDispatchMode):
    """Record ``OpRecord(op, input_dtypes, output_dtype)`` for every aten op that reaches the backend."""

    def __init__(self, ignore=DEFAULT_IGNORE):
        super().__init__()
        self.ignore = frozenset(ignore)
        self.records: list[OpRecord] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__  # "addmm" for aten.addmm.default
        if name not in self.ignore:
            ins = tuple(
                dtype_name(t.dtype) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
            )
            outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            self.records.append(OpRecord(name, ins, dtype_name(outs[0].dtype) if outs else None))
        return out


def _autocast_ctx(device_type: str, dtype, cache_enabled: bool = True):
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    if dtype is None:
        return nullcontext()
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"dtype must be torch.float16, torch.bfloat16 or None (no autocast), got {dtype!r}")
    return torch.autocast(device_type, dtype=dtype, cache_enabled=cache_enabled)


def inspect_autocast(
    fn: Callable,
    *args,
    device_type: str = "cpu",
    dtype=torch.bfloat16,
    cache_enabled: bool = True,
    backward: bool = False,
    ignore=DEFAULT_IGNORE,
) -> list[OpRecord]:
    """Run ``fn(*args)`` under ``torch.autocast(device_type, dtype)`` and return the ops that ran.

    ``backward=True`` also calls ``.backward()`` on the (scalar) result and records the backward
    ops (outside the autocast region, as in a training loop). ``dtype=None`` runs without autocast.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    mode = AutocastDtypeMode(ignore=ignore)
    with _autocast_ctx(device_type, dtype, cache_enabled), mode:
        out = fn(*args)
    if backward:
        if not (isinstance(out, torch.Tensor) and out.numel() == 1 and out.requires_grad):
            raise ValueError("backward=True needs fn to return a scalar tensor that requires grad")
        with mode:
            out.backward()
    return mode.records


def layer_output_dtypes(
    model: torch.nn.Module, *inputs, device_type: str = "cpu", dtype=torch.bfloat16
) -> dict[str, str]:
    """``{submodule name: dtype of its first tensor output}`` for one forward under autocast."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    seen: dict[str, str] = {}
    handles = []
    for name, mod in model.named_modules():
        if name == "":
            continue

        def hook(_mod, _inp, out, name=name):
            ts = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            if ts:
                seen[name] = dtype_name(ts[0].dtype)

        handles.append(mod.register_forward_hook(hook))
    try:
        with _autocast_ctx(device_type, dtype), torch.no_grad():
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return seen


class ProbeNet(torch.nn.Module):
    """The prediction exercise's model. x (B, 16) fp32, target (B,) int64 -> (loss, probs).

    fc1 Linear(16, 32) -> act GELU -> norm LayerNorm(32) -> fc2 Linear(32, 8) = logits;
    softmax(logits) = probs; loss_fn CrossEntropyLoss(logits, target) = loss.
    """

    # (layer, aten op autocast sees, the layer whose output feeds it; None = the input x)
    LAYERS = (
        ("fc1", "linear", None),
        ("act", "gelu", "fc1"),
        ("norm", "layer_norm", "act"),
        ("fc2", "linear", "norm"),
        ("softmax", "softmax", "fc2"),
        ("loss_fn", "cross_entropy_loss", "fc2"),
    )

    def __init__(self, d_in: int = 16, d_hidden: int = 32, n_classes: int = 8):
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, d_hidden)
        self.act = torch.nn.GELU()
        self.norm = torch.nn.LayerNorm(d_hidden)
        self.fc2 = torch.nn.Linear(d_hidden, n_classes)
        self.softmax = torch.nn.Softmax(dim=-1)
        self.loss_fn = torch.nn.CrossEntropyLoss()

    def forward(self, x, target):
        logits = self.fc2(self.norm(self.act(self.fc1(x))))  # (B, n_classes)
        return self.loss_fn(logits, target), self.softmax(logits)

    @staticmethod
    def example_inputs(batch: int = 4, device: str = "cpu", seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(batch, 16, generator=g)
        target = torch.randint(0, 8, (batch,), generator=g)
        return x.to(device), target.to(device)


def predict_probe_dtypes(device_type: str, autocast_dtype, input_dtype="float32") -> dict[str, str]:
    """Reference answer to the prediction exercise: ProbeNet's layer output dtypes, from the policy tables."""
    out: dict[str, str] = {}
    for layer, op, source in ProbeNet.LAYERS:
        in_dtype = dtype_name(input_dtype) if source is None else out[source]
        out[layer] = autocast_output_dtype(op, [in_dtype], device_type, autocast_dtype)
    return out


def summarize(records: list[OpRecord]) -> dict[str, list[str]]:
    """Group ops by the dtype they produced: ``{"bfloat16": ["addmm", ...], "float32": [...]}``."""
    if not isinstance(records, list):
        raise TypeError(f"records must be a list of OpRecord, got {type(records).__name__}")
    groups: dict[str, list[str]] = {}
    for r in records:
        groups.setdefault(str(r.output_dtype), []).append(r.op)
    return groups
