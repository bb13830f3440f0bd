"""What the modules chapter's exercises build on (shipped to the grading sandbox; no solution here).

``ModuleState`` is the *data* of a ``torch.nn.Module`` without any of its behaviour: the attributes
``Module.__init__`` creates (torch/nn/modules/module.py), set with ``object.__setattr__`` so that a
``__setattr__`` defined by a subclass or mixin never sees them. Each exercise writes one mixin
(``Registration``, ``Traversal``, ``Conversion``, ``StateDict``, ``Calling``) over these attributes;
``compose`` puts mixins and ``ModuleState`` together into a class, and ``build_tree(spec, cls,
register=False)`` (from :mod:`.trees`) fills a tree of that class directly through the dicts.

    training                      bool                       train()/eval() flip it
    _parameters                   {name: Parameter | None}
    _buffers                      {name: Tensor | None}
    _non_persistent_buffers_set   {name, ...}                buffers left out of state_dict
    _modules                      {name: module | None}
    _forward_pre_hooks            OrderedDict{id: hook}      (+ _forward_pre_hooks_with_kwargs {id: True})
    _forward_hooks                OrderedDict{id: hook}      (+ _forward_hooks_with_kwargs, _forward_hooks_always_called)
    _backward_pre_hooks           OrderedDict{id: hook}
    _backward_hooks               OrderedDict{id: hook}
"""
from __future__ import annotations

from collections import OrderedDict

from .trees import build_tree, example_spec

__all__ = ["ModuleState", "compose", "build_tree", "example_spec", "parse_to", "has_compatible_shallow_copy_type",
           "BrokenNet"]


class ModuleState:
    """The state of a module, nothing else. Subclass it (after your mixins) and call ``super().__init__()``."""

    _version = 1  # saved as state_dict()._metadata[prefix]["version"]

    def __init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "training", True)
        set_(self, "_parameters", {})
        set_(self, "_buffers", {})
        set_(self, "_non_persistent_buffers_set", set())
        set_(self, "_modules", {})
        for table in ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
                      "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_backward_pre_hooks",
                      "_backward_hooks"):
            set_(self, table, OrderedDict())

    def _get_name(self) -> str:
        return type(self).__name__

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    def __repr__(self) -> str:
        return f"{self._get_name()}(params={list(self._parameters)}, buffers={list(self._buffers)}, " \
               f"children={list(self._modules)})"


def _plain_call(self, *args, **kwargs):
    """``__call__`` for classes without the Calling mixin: forward only, no hooks."""
    return self.forward(*args, **kwargs)


def compose(*mixins: type, name: str = "StudentModule") -> type:
    """``class name(*mixins, ModuleState)``; adds a hook-less ``__call__`` if no mixin defines one."""
    for k, mixin in enumerate(mixins):
        if not isinstance(mixin, type):
            raise TypeError(f"mixins[{k}] must be a class, got {type(mixin).__name__}")
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name must be an identifier, got {name!r}")
    namespace = {}
    if not any("__call__" in vars(m) for m in mixins):
        namespace["__call__"] = _plain_call
    return type(name, (*mixins, ModuleState), namespace)


import torch  # noqa: E402
from torch import nn  # noqa: E402


# ---- two private torch helpers that Module._apply and Module.to call, under public names ----
def parse_to(*args, **kwargs) -> tuple:
    """``(device, dtype, non_blocking, memory_format)`` from the arguments of ``Module.to(...)``, parsed as
    ``Module.to`` parses them (``torch._C._nn._parse_to``): ``to(dtype)``, ``to(device, dtype)``,
    ``to(tensor)``, ``to(dtype=..., non_blocking=...)``."""
    return torch._C._nn._parse_to(*args, **kwargs)


def has_compatible_shallow_copy_type(tensor: torch.Tensor, new: torch.Tensor) -> bool:
    """Whether ``tensor.data = new`` is possible (``torch._has_compatible_shallow_copy_type``): both tensors
    have the same kind of implementation (dense CPU/CUDA tensors: yes; a dense and a sparse one: no)."""
    for name, value in (("tensor", tensor), ("new", new)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return torch._has_compatible_shallow_copy_type(tensor, new)


# ---- the bug hunt: a model with three classic module bugs (the notebook asks for a fixed version) ----

class BrokenNet(nn.Module):
    """A tiny causal sequence mixer, ``x (B, T, D) -> (B, T, D)``, whose arithmetic is right.

    Its module plumbing is not: find what ``parameters()``, ``state_dict()``, ``.to()`` and hooks miss.
    """

    def __init__(self, dim: int, depth: int, max_len: int) -> None:
        super().__init__()
        self.blocks = [nn.Linear(dim, dim) for _ in range(depth)]
        self.norm = nn.LayerNorm(dim)
        self.mask = torch.tril(torch.ones(max_len, max_len))  # (max_len, max_len), 1 = may attend
        self.register_buffer("scale", torch.tensor(dim ** -0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        scores = (x @ x.transpose(1, 2)) * self.scale  # (B, T, T)
        weights = scores.masked_fill(self.mask[:T, :T] == 0, float("-inf")).softmax(-1)
        x = weights @ x  # (B, T, D)
        for block in self.blocks:
            x = x + block.forward(x).relu()
        return self.norm(x)
