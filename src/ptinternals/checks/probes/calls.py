"""Which torch functions a student's code called (sandbox side, shared by the chapters' probes).

A ``TorchFunctionMode`` sees every torch function and Tensor method called inside it (mirrors how
``torch.overrides.TorchFunctionMode`` is entered around a call). What it records is feedback and a second
line only: the student's code shares the process and could hide a call from it; where points depend on
*how* an answer is computed, the static policy (``grading/policy.py``) decides, in the grader.
"""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def recording_torch_calls(calls: set):
    """Add to ``calls`` the name of every torch function or Tensor method called inside the block."""
    from torch.overrides import TorchFunctionMode

    class Recorder(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            calls.add(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    with Recorder():
        yield


def record_torch_calls(entry, *args, **kwargs):
    """Call ``entry``: ``{"out": its result, "calls": the sorted names of the torch functions it used}``
    (strides: as_strided, not unfold, and no copies; distributed: plain arithmetic, no torch at all)."""
    calls: set = set()
    with recording_torch_calls(calls):
        out = entry(*args, **kwargs)
    return {"out": out, "calls": sorted(calls)}


class Banned(RuntimeError):
    """Raised by a function :func:`banned` replaced."""


@contextlib.contextmanager
def banned(targets, why: str = "it is the operation you are asked to write"):
    """Replace ``(owner, attribute)`` or ``(owner, attribute, why)`` pairs (a module or class and the name of
    a function on it; missing ones are skipped) by functions that raise :class:`Banned`, for the block.

    A second line only: the grade relies on the trusted side's check of the answer cells' source.
    """
    saved = []
    for owner, attr, *reason in targets:
        if not hasattr(owner, attr):
            continue

        message = f"{getattr(owner, '__name__', owner)}.{attr} is not available in this exercise: {(reason or [why])[0]}"

        def stub(*args, _message=message, **kwargs):
            raise Banned(_message)

        saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, stub)
    try:
        yield
    finally:
        for owner, attr, value in reversed(saved):
            setattr(owner, attr, value)
