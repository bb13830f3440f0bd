"""Which device runs: one place for the choice, so every check can say which path ran.

The device is a parameter, not a branch (STYLE.md 7): code asks ``pick_device()`` once and passes the
result down. ``PTINTERNALS_DEVICE=cpu`` forces the CPU path on a GPU machine (useful to reproduce
what CI sees); ``PTINTERNALS_DEVICE=cuda`` fails loudly when there is no GPU instead of silently
falling back.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

ENV_VAR = "PTINTERNALS_DEVICE"


@dataclass(frozen=True)
class DeviceInfo:
    """What ran: ``kind`` is "cuda" or "cpu"; ``name`` is e.g. "NVIDIA H200" or "cpu (2 threads)"."""

    kind: str
    name: str
    triton_mode: str  # "compiled" on a GPU, "interpreter" on the CPU, "unavailable" without triton

    def __str__(self) -> str:  # the line checks print: "ran on cuda (NVIDIA H200), Triton compiled"
        return f"ran on {self.kind} ({self.name}), Triton {self.triton_mode}"


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def pick_device(prefer: str | None = None) -> str:
    """Return "cuda" or "cpu".

    ``prefer`` (or the environment variable ``PTINTERNALS_DEVICE``) may be "cuda", "cpu" or "auto".
    Asking for "cuda" on a machine without one raises, naming the problem.
    """
    choice = (prefer or os.environ.get(ENV_VAR) or "auto").strip().lower()
    if choice not in ("auto", "cuda", "cpu"):
        raise ValueError(f"device must be 'auto', 'cuda' or 'cpu', got {choice!r} (from {ENV_VAR} or the argument)")
    if choice == "cpu":
        return "cpu"
    has_cuda = cuda_available()
    if choice == "cuda" and not has_cuda:
        raise RuntimeError("device 'cuda' was asked for but torch.cuda.is_available() is False on this machine")
    return "cuda" if has_cuda else "cpu"


def use_triton_interpreter_without_gpu() -> None:
    """Without a GPU, Triton must run in its interpreter, and the switch must be on before anything
    imports ``triton.language`` (torch 2.13's optimizers do): grading processes call this first thing."""
    if "TRITON_INTERPRET" not in os.environ and not cuda_available():
        os.environ["TRITON_INTERPRET"] = "1"


def triton_mode(device: str) -> str:
    """How Triton kernels run on ``device``: compiled on CUDA, the interpreter on CPU."""
    try:
        import triton  # noqa: F401
    except Exception:
        return "unavailable"
    if device == "cuda":
        return "compiled"
    return "interpreter"  # TRITON_INTERPRET=1, set by the tests, the grading processes and the kernels notebook


def describe(device: str | None = None) -> DeviceInfo:
    import torch

    device = device or pick_device()
    if device == "cuda":
        name = torch.cuda.get_device_name(0)
    else:
        name = f"cpu ({torch.get_num_threads()} threads)"
    return DeviceInfo(kind=device, name=name, triton_mode=triton_mode(device))
