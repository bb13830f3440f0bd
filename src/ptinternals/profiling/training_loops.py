"""A training loop with hidden host syncs, and the same loop without them.

``train_with_hidden_syncs`` is the loop people write first. Every step it makes the host wait for the
GPU several times, each innocent-looking:

==============================================  ============================================================
line                                            why the host waits
==============================================  ============================================================
``x = x.to(device)``                            a blocking copy from pageable memory (memcpy_and_sync)
``x, y = x[keep], y[keep]``                     a boolean mask becomes ``nonzero()``: the host reads the count
``if torch.isnan(loss): raise``                 ``bool()`` of a device tensor
``losses.append(loss.item())``                  a scalar read every step
==============================================  ============================================================

``train_without_syncs`` computes the same losses (to rounding) with one wait, after the loop:
pinned batches copied with ``non_blocking=True``; unlabelled rows (label -1) left out by
``cross_entropy(..., ignore_index=-1)`` instead of a mask; non-finite losses collected on the device
and checked once; the losses kept on the device and read back together at the end.

The data: ``make_batches`` gives host batches of features and labels, some labels -1 ("unlabelled").
A batch whose labels are all -1 has no loss (NaN, 0/0): both loops raise ``ValueError`` for it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .scaffold import CLASSES, FEATURES, HIDDEN, make_batches, make_model  # noqa: F401 - re-exported


def train_with_hidden_syncs(model, batches, lr: float = 0.1, device: str = "cuda") -> list[float]:
    """The loop as first written: four kinds of host sync per step (see the module docstring)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        keep = y >= 0
        x, y = x[keep], y[keep]
        loss = F.cross_entropy(model(x), y)
        if torch.isnan(loss):
            raise ValueError("loss is NaN: a batch without labelled rows")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def train_without_syncs(model, batches, lr: float = 0.1, device: str = "cuda") -> list[float]:
    """The same losses, one host wait at the end (none at all when ``batches`` is empty)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    finite = torch.ones((), dtype=torch.bool, device=device)
    for x, y in batches:
        x = x.pin_memory().to(device, non_blocking=True)   # (already pinned batches: pinning again is cheap)
        y = y.pin_memory().to(device, non_blocking=True)
        loss = F.cross_entropy(model(x), y, ignore_index=-1)
        finite &= torch.isfinite(loss)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    if not losses:
        return []
    values = torch.stack(losses).tolist()                   # the one device-to-host read
    if any(v != v for v in values):                         # NaN: checked on the host copy, no extra sync
        raise ValueError("loss is NaN: a batch without labelled rows")
    return values
