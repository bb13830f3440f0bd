"""The machinery of the sync detector: a TorchDispatchMode that records the ops a *rule* flags.

This module is scaffolding (the grading sandbox ships it): the rule table itself, the exercise of
the chapter, lives in ``sync_rules`` and is plugged in by :class:`~.sync_detector.SyncDetector`.

Two interception layers (the two of {{chapter dispatch}}), because the syncs live at both:

- ATen ops, seen by ``__torch_dispatch__`` after autograd and decompositions, judged by ``rule``
  (``_local_scalar_dense``, ``nonzero``, mask indexing, ``unique``, ...);
- Python API calls, seen first by ``host_boundary.HostBoundary`` (a TorchFunctionMode): copies with
  ``.cpu()``/``.to()``/``.cuda()``/``copy_``, ``tolist``, printing, ``torch.tensor(data, device=)``,
  and ``one_hot``, whose ATen ops differ between CPU and CUDA.

Plus the one explicit wait that is no tensor op: ``torch.cuda.synchronize()`` is wrapped while the
recorder is active (kind "explicit": it waits on purpose, and set_sync_debug_mode does not report it).
"""
from __future__ import annotations

import os
import sys
from collections import Counter
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .host_boundary import HostBoundary
from .placement import Placement

_HERE = os.path.dirname(os.path.abspath(__file__))
_OWN_FILES = {os.path.join(_HERE, f) for f in ("sync_recorder.py", "sync_detector.py", "host_boundary.py",
                                               "placement.py", "sync_rules.py")}
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))


@dataclass(frozen=True)
class SyncEvent:
    """One host wait: the op (``aten.nonzero.default`` or an API call), why, where, and of which kind."""

    op: str
    reason: str                 # a key of sync_rules.REASONS
    api: str | None             # the Python call it happened in ("torch.Tensor.item"), if any
    where: str                  # "file.py:41" of the program's line
    kind: str = "implicit"      # "implicit" (set_sync_debug_mode reports it), "explicit" (synchronize),
    #                             "stall" (pageable non_blocking copy: the host waits, unreported by torch)

    def __str__(self) -> str:
        via = f" ({self.api})" if self.api and self.api != self.op else ""
        return f"{self.op:40s} {self.reason:20s} at {self.where}{via}"


def _program_line() -> str:
    """The innermost frame that belongs to the program (not torch, not the detector itself)."""
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not (path in _OWN_FILES or path.startswith(_TORCH)):
            return f"{os.path.basename(path)}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


class SyncRecorder(TorchDispatchMode):
    """Record every op of a program that ``rule`` says makes the host wait for a CUDA device.

    ``rule(func, args, kwargs, on_device)``: the ATen-level judge (a ``REASONS`` key or None), e.g.
    ``sync_rules.sync_reason`` (what :class:`~.sync_detector.SyncDetector` uses) or an exercise's.
    ``emulate``: run CUDA programs on CPU tensors (default: when CUDA is unavailable). With a real
    GPU (``emulate=False``) the recorder only watches; compare with ``torch.cuda.set_sync_debug_mode``.
    """

    def __init__(self, rule, emulate: bool | None = None):
        super().__init__()
        if not callable(rule):
            raise TypeError(f"rule must be callable like sync_reason(func, args, kwargs, on_device), got {rule!r}")
        self.rule = rule
        if emulate is None:
            emulate = not torch.cuda.is_available()
        if not isinstance(emulate, bool):
            raise TypeError(f"emulate must be a bool or None, got {type(emulate).__name__}")
        self.emulate = emulate
        self.placement = Placement()
        self.events: list[SyncEvent] = []
        self.boundary = HostBoundary(self.placement, emulate, self._api_event)
        self._real_synchronize = None

    # ---- recording -----------------------------------------------------------------------------
    def _api_event(self, api: str, reason: str, kind: str = "implicit") -> None:
        self.events.append(SyncEvent(api, reason, api, _program_line(), kind=kind))

    def _synchronize(self, device=None) -> None:
        self.events.append(SyncEvent("torch.cuda.synchronize", "explicit_synchronize", None, _program_line(),
                                     kind="explicit"))
        if not self.emulate:
            self._real_synchronize(device)

    def on_device(self, t: object) -> bool:
        return self.placement.on_device(t)

    # ---- the two modes -------------------------------------------------------------------------
    def __enter__(self):
        self._real_synchronize = torch.cuda.synchronize
        torch.cuda.synchronize = self._synchronize
        self.boundary.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self.boundary.__exit__(*exc)
            torch.cuda.synchronize = self._real_synchronize

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.boundary.suppress:
            reason = self.rule(func, args, kwargs, self.on_device)
            if reason is not None:
                self.events.append(SyncEvent(str(func), reason, self.boundary.current_api, _program_line()))
        out = func(*args, **kwargs)
        if self.emulate:  # outputs of device work are device tensors (factories inside a device call too)
            inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            if self.boundary.api_on_device or any(self.on_device(t) for t in inputs):
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor):
                        self.placement.mark_device(t)
        return out

    # ---- reading the result --------------------------------------------------------------------
    def implicit(self) -> list[SyncEvent]:
        """The syncs set_sync_debug_mode would report (explicit synchronize() calls left out)."""
        return [e for e in self.events if e.kind == "implicit"]

    def stalls(self) -> list[SyncEvent]:
        """Pageable non_blocking copies: the host blocks while staging, and torch does not report it."""
        return [e for e in self.events if e.kind == "stall"]

    def count_by_line(self) -> Counter:
        return Counter(e.where for e in self.implicit())

    def report(self) -> str:
        if not self.events:
            return "no host-device syncs"
        n_explicit = sum(e.kind == "explicit" for e in self.events)
        lines = [f"{len(self.implicit())} implicit sync(s), {n_explicit} explicit, {len(self.stalls())} stall(s)"]
        lines += [f"  {e}" for e in self.events]
        return "\n".join(lines)


__all__ = ["SyncEvent", "SyncRecorder"]
