"""Containers and a few layers on :class:`MiniModule`, enough for the chapter's demos and tests.

Mirrors (the parts used here of) torch/nn/modules/container.py (``Sequential``, ``ModuleList``),
linear.py (``Linear``), batchnorm.py (``BatchNorm1d``) and dropout.py (``Dropout``). The layers do
their arithmetic with ``torch.nn.functional``: this chapter is about the module plumbing around it.

Containers are ordinary modules whose children are named ``"0"``, ``"1"``...: that is where the
``layers.0.weight`` keys of every checkpoint come from. ``Sequential.forward`` calls each child with
``module(x)``, i.e. through ``__call__``, so the children's hooks run.
"""
from __future__ import annotations

import math
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch.nn import Parameter

from .module import MiniModule

__all__ = ["Sequential", "ModuleList", "Linear", "BatchNorm1d", "Dropout"]


def _check_index(idx, n: int) -> int:
    if isinstance(idx, bool) or not isinstance(idx, int):
        raise TypeError(f"index must be an int, got {type(idx).__name__}")
    if not -n <= idx < n:
        raise IndexError(f"index {idx} is out of range")
    return idx % n


class Sequential(MiniModule):
    """``Sequential(a, b, c)`` or ``Sequential(OrderedDict(name=module))``; forward chains them."""

    def __init__(self, *args) -> None:
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for idx, module in enumerate(args):
                self.add_module(str(idx), module)

    def __getitem__(self, idx: int):
        return list(self._modules.values())[_check_index(idx, len(self._modules))]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def forward(self, x):
        for module in self:  # every child through __call__: its hooks run
            x = module(x)
        return x


class ModuleList(MiniModule):
    """A list whose items are registered children ``"0"``, ``"1"``... (no forward of its own)."""

    def __init__(self, modules=None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def append(self, module) -> "ModuleList":
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules) -> "ModuleList":
        if isinstance(modules, (str, bytes)) or not hasattr(modules, "__iter__"):
            raise TypeError(f"ModuleList.extend should be called with an iterable, but got {type(modules).__name__}")
        for module in modules:
            self.append(module)
        return self

    def __getitem__(self, idx: int):
        return self._modules[str(_check_index(idx, len(self)))]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class Linear(MiniModule):
    """``y = x @ weight.T + bias``; weight ``(out_features, in_features)``, bias ``(out_features,)`` or None."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype=None) -> None:
        super().__init__()
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(torch.empty(out_features, in_features, dtype=dtype))
        if bias:
            self.bias = Parameter(torch.empty(out_features, dtype=dtype))
        else:
            self.register_parameter("bias", None)  # a None slot: skipped by parameters() and state_dict()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0.0  # torch's kaiming_uniform_(a=sqrt(5))
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)  # (..., in) -> (..., out)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class BatchNorm1d(MiniModule):
    """Normalises ``(N, C)`` over the batch in training and with running statistics in eval.

    State: ``weight``, ``bias`` (C,) parameters; ``running_mean``, ``running_var`` (C,) float buffers and
    ``num_batches_tracked`` (0-dim int64) buffer, all persistent (the keys every BatchNorm checkpoint has).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features < 1:
            raise ValueError(f"num_features must be an int >= 1, got {num_features!r}")
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.weight = Parameter(torch.ones(num_features))
        self.bias = Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.num_batches_tracked.add_(1)
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            training=self.training, momentum=self.momentum, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class Dropout(MiniModule):
    """Zeroes each element with probability ``p`` in training (scaling the rest by 1/(1-p)); identity in eval."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p!r}")
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
