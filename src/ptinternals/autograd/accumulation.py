"""Gradient accumulation on purpose: several small backward passes that sum to one large-batch step.

Why it works: ``.grad`` accumulates (AccumulateGrad adds, never overwrites), so k backward passes
leave ``sum_i d loss_i / d w`` in ``w.grad``. What must be right is the *scaling*:

- ``reduction="mean"`` (``F.cross_entropy``'s default): the full-batch loss is
  ``(1/N) sum_n l_n``. A micro-batch of ``n_i`` samples gives ``mean_i = (1/n_i) sum l_n``, so each
  one is weighted ``n_i / N``: ``sum_i (n_i/N) mean_i = (1/N) sum_n l_n``. When all micro-batches
  are equal (``n_i = N/k``) this is the familiar ``1/k``; when they are not (N = 10 in 3 pieces:
  4, 3, 3) plain ``1/k`` over-weights the samples of the smaller micro-batches. We choose
  ``n_i / N`` because it gives exactly the full-batch gradient for every split.
- ``reduction="sum"``: the losses already add up; no scaling.

Not covered by any scaling (documented, not "fixed"): BatchNorm statistics (computed per
micro-batch), dropout masks (drawn per micro-batch), and losses that do not decompose per sample
(e.g. a mean over *tokens* where micro-batches hold different token counts: weight by tokens then).
Mirrors what training loops do with ``loss / accumulation_steps`` and DDP's ``no_sync``.
"""
from __future__ import annotations

import torch


def accumulate_grads(model: torch.nn.Module, loss_fn, batch_x: torch.Tensor, batch_y: torch.Tensor,
                     micro_batches: int, reduction: str = "mean", zero_grad: bool = True) -> torch.Tensor:
    """Fill the parameters' ``.grad`` with the gradient of the full-batch loss, ``micro_batches`` at a time.

    ``loss_fn(output, target)`` must reduce over the micro-batch as ``reduction`` says ("mean" or
    "sum"). The batch is split along dim 0 with ``torch.tensor_split`` (sizes differ by at most one).
    Returns the full-batch loss (detached, same reduction). With ``zero_grad=False`` the gradients
    are added to whatever ``.grad`` already holds.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
    for name, t in (("batch_x", batch_x), ("batch_y", batch_y)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() == 0:
            raise ValueError(f"{name} must have a batch dimension, got a 0-d tensor")
    n = batch_x.shape[0]
    if batch_y.shape[0] != n:
        raise ValueError(f"batch_x and batch_y must have the same batch size, got {n} and {batch_y.shape[0]}")
    if n == 0:
        raise ValueError("the batch is empty (batch_x.shape[0] == 0)")
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int):
        raise TypeError(f"micro_batches must be an int, got {type(micro_batches).__name__}")
    if not 1 <= micro_batches <= n:
        raise ValueError(f"micro_batches must be in [1, batch size = {n}], got {micro_batches}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")

    if zero_grad:
        model.zero_grad(set_to_none=True)
    total = None
    # tensor_split: N = 10 into 3 gives sizes (4, 3, 3); views, no copies.
    xs_list, ys_list = torch.tensor_split(batch_x, micro_batches), torch.tensor_split(batch_y, micro_batches)
    for xs, ys in zip(xs_list, ys_list, strict=True):
        loss = loss_fn(model(xs), ys)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError(f"loss_fn must return a one-element tensor, got {loss!r:.80}")
        weight = xs.shape[0] / n if reduction == "mean" else 1.0  # n_i / N, see the module docstring
        (loss * weight).backward()  # .grad += weight * d loss_i / d w
        part = loss.detach() * weight
        total = part if total is None else total + part
    return total.reshape(())
