"""Scaffolding for the distributed chapter's exercises: the pieces they build on that are not the point.

Importable in the grading sandbox as ``ptinternals.distributed.scaffold`` (``Chapter.sandbox_files``),
so it must not import the chapter's reference modules, and it holds no solution.

- ``all_gather_flat`` / ``reduce_scatter_flat``: the flat-buffer collectives under their torch 2.13
  names (``all_gather_single``, ``reduce_scatter_single``) or, on torch 2.11, the old ones
  (``all_gather_into_tensor``, ``reduce_scatter_tensor``): same signature, same collective. They look
  the function up at each call, so tools that wrap ``torch.distributed`` (the grader's trace) see it.
- ``TinyMLP`` and ``make_dataset``: the model and data of the torchrun trainer (Exercise distributed.train_resume).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset


def all_gather_flat(output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False):
    """(S,) on every rank -> (N*S,) on every rank, rank r's input at [r*S, (r+1)*S)."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(output, input, group=group, async_op=async_op)


def reduce_scatter_flat(output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False):
    """(N*S,) on every rank -> (S,) on rank r: the sum over ranks of input[r*S:(r+1)*S]."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(output, input, group=group, async_op=async_op)


class TinyMLP(nn.Module):
    """16 -> 32 -> 32 -> 4 with dropout, so that the RNG state matters for resuming."""

    def __init__(self, d_in: int = 16, d_hidden: int = 32, d_out: int = 4, dropout: float = 0.1):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(d_hidden, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_out))

    def forward(self, x):
        return self.net(x)


def make_dataset(n: int = 256, seed: int = 0) -> TensorDataset:
    """A fixed synthetic regression set: y = tanh(x W) + noise, identical on every rank."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 4, generator=g)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(n, 4, generator=g)
    return TensorDataset(x, y)
