"""Generated programs with known host syncs: the test bed of the sync detector, on CPU and on a GPU.

A program is a few setup lines (device tensors ``x``, ``y``, ``mask``, ``ind``, ``repeats`` and a
host tensor ``ind_cpu``) followed by statements drawn from ``STATEMENTS``, one per line. Each
statement carries the sync reasons (``sync_rules.REASONS`` ids) it causes on CUDA. Statements marked
``torch_test`` are the cases of torch's own ``test_sync_warning`` (test/test_torch.py), the rest
follow the CUDA kernels named in ``sync_rules``.

On a GPU, :func:`real_sync_lines` runs a program under ``torch.cuda.set_sync_debug_mode("warn")``
and returns the line of every warning: the ground truth the detector is compared with (GPU check).
On a CPU build the same source runs under the detector's emulation.
"""
from __future__ import annotations

import random
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

N = 8  # elements of x

SETUP = (
    "x = torch.randn(n, device=device)",
    "y = torch.rand((), device=device) + 0.5",
    "mask = x > 0",
    "ind = torch.randint(n, (3,), device=device)",
    "ind_cpu = torch.arange(3)",
    "repeats = torch.full((n,), 2, device=device)",
)


@dataclass(frozen=True)
class Statement:
    code: str
    reasons: tuple[str, ...]    # the syncs it causes on CUDA, in order
    torch_test: bool = False    # a case of torch's test_sync_warning


STATEMENTS = (
    # --- no sync ---
    Statement("x[mask] = 1.0", (), True),
    Statement("x[ind] = y", (), True),
    Statement("z = x[ind]", (), True),
    Statement("z = F.one_hot(ind, num_classes=n)", (), True),
    Statement("z = torch.randperm(20, device=device)", (), True),
    Statement("z = torch.repeat_interleave(x, 2, output_size=2 * n)", (), True),
    Statement("z = torch.repeat_interleave(x, repeats, output_size=2 * n)", (), True),
    Statement("z = torch.any(y)", (), True),
    Statement("z = x.sum() * 2", ()),
    Statement("z = x.masked_fill(mask, 0.0)", ()),
    Statement("z = torch.where(mask, x, 0.0)", ()),
    Statement("z = torch.histc(x, bins=4, min=-3.0, max=3.0)", ()),
    Statement("z = x.to('cpu', non_blocking=True)", ()),
    Statement("z = torch.full((2,), 3.0, device=device)", ()),
    # --- sync ---
    Statement("x[mask] = y", ("bool_mask_index",), True),
    Statement("x[ind_cpu] = y", ("host_index",), True),
    Statement("z = x[mask]", ("bool_mask_index",), True),
    Statement("z = x[ind_cpu]", ("host_index",), True),
    Statement("z = x.nonzero()", ("nonzero",), True),
    Statement("z = 1.0 if y else 0.0", ("scalar_read",), True),
    Statement("z = F.one_hot(ind)", ("one_hot_classes",), True),
    Statement("z = torch.repeat_interleave(x, repeats)", ("repeat_interleave",), True),
    Statement("z = torch.where(mask)", ("nonzero",)),
    Statement("z = y.item()", ("scalar_read",)),
    Statement("z = float(y) + int(ind[0])", ("scalar_read", "scalar_read")),
    Statement("z = x.masked_select(mask)", ("masked_select",)),
    Statement("z = torch.unique(ind)", ("unique",)),
    Statement("z = x.cpu()", ("device_to_host",)),
    Statement("z = x.tolist()", ("device_to_host",)),
    Statement("z = repr(x)", ("device_to_host",)),
    Statement("z = f'{y:.3f}'", ("scalar_read",)),
    Statement("z = torch.tensor([1.0, 2.0], device=device)", ("host_to_device",)),
    Statement("z = ind_cpu.to(device)", ("host_to_device",)),
    Statement("z = torch.bincount(ind)", ("bincount",)),
    Statement("z = torch.histc(x, bins=4)", ("histc_range",)),
    Statement("z = torch.equal(x, x)", ("bool_result",)),
)


@dataclass(frozen=True)
class SyncProgram:
    """Source text and the expected syncs as (line, reason) pairs; lines count from 1."""

    name: str
    source: str
    expected: tuple[tuple[int, str], ...]

    def run(self, device: str = "cuda") -> dict:
        """Execute the program; returns its namespace. ``device`` is the string the program uses."""
        namespace = {"torch": torch, "F": F, "n": N, "device": device}
        exec(compile(self.source, self.name, "exec"), namespace)  # noqa: S102 - our own generated code
        return namespace


def make_program(seed: int, n_statements: int = 8, *, pool=STATEMENTS) -> SyncProgram:
    """A random program of ``n_statements`` statements (with repeats) after the setup lines."""
    if isinstance(n_statements, bool) or not isinstance(n_statements, int) or n_statements < 0:
        raise ValueError(f"n_statements must be an int >= 0, got {n_statements!r}")
    if not pool:
        raise ValueError("pool must hold at least one Statement")
    rng = random.Random(seed)
    lines = list(SETUP)
    expected = []
    for _ in range(n_statements):
        st = rng.choice(pool)
        lines.append(st.code)
        expected += [(len(lines), r) for r in st.reasons]
    return SyncProgram(f"<sync-program-{seed}>", "\n".join(lines) + "\n", tuple(expected))


def detected_lines(program: SyncProgram, *, emulate: bool | None = None) -> list[tuple[int, str]]:
    """The (line, reason) of every implicit sync the detector finds in ``program``."""
    from .sync_detector import SyncDetector

    with SyncDetector(emulate=emulate) as det:
        program.run("cuda")
    return [(int(e.where.rsplit(":", 1)[1]), e.reason) for e in det.implicit()
            if e.where.startswith(program.name)]


def real_sync_lines(program: SyncProgram) -> list[int]:
    """GPU only: one entry per ``set_sync_debug_mode("warn")`` warning, the program line it came from.

    The program runs one line at a time (a warning raised inside torch's Python code, e.g.
    ``torch.unique`` in torch/functional.py, carries torch's file and line, not the program's)."""
    if not torch.cuda.is_available():
        raise RuntimeError("real_sync_lines needs a CUDA device (torch.cuda.is_available() is False)")
    namespace = {"torch": torch, "F": F, "n": N, "device": "cuda"}
    lines = program.source.splitlines()
    out: list[int] = []
    previous = torch.cuda.get_sync_debug_mode()
    try:
        for lineno, code in enumerate(lines, start=1):
            torch.cuda.synchronize()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    exec(compile("\n" * (lineno - 1) + code, program.name, "exec"), namespace)  # noqa: S102
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            out += [lineno for w in caught if "synchronizing" in str(w.message)]
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    return out
