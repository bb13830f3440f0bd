"""Traversal: ``named_modules``, ``named_parameters``, ``named_buffers`` and their plain forms.

Mirrors torch/nn/modules/module.py: ``named_modules``, ``modules``, ``named_children``, ``children``,
``_named_members``, ``named_parameters``, ``parameters``, ``named_buffers``, ``buffers``, ``apply``.

Order is a pre-order walk of ``_modules`` in insertion order, and within one module its own
``_parameters`` (or ``_buffers``) in insertion order. That order is the contract optimizers rely on:
``torch.optim`` stores state per parameter in the order ``parameters()`` gave it, and a saved
optimizer state dict is matched back by position.

De-duplication works on *object identity*, at two levels:

- ``named_modules(memo)``: a module instance reachable twice (the same block registered under two
  names) is yielded once, under the first name reached, and its subtree is not walked again.
- ``_named_members``: a tensor reachable twice (weight tying: ``decoder.weight = encoder.weight``) is
  yielded once, under the first name. ``remove_duplicate=False`` turns both off, which is how
  ``functional_call`` discovers every name a tied tensor has.

``None`` entries (``register_parameter("bias", None)``) are never yielded.
"""
from __future__ import annotations

from typing import Callable, Iterator

__all__ = ["Traversal"]


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")


def _check_prefix(prefix) -> None:
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")


class Traversal:
    """Mixin of :class:`MiniModule`: walking the module tree."""

    def named_modules(self, memo: set | None = None, prefix: str = "", remove_duplicate: bool = True):
        """Pre-order ``(dotted name, module)`` pairs, self first with name ``prefix``."""
        _check_prefix(prefix)
        _check_bool("remove_duplicate", remove_duplicate)
        if memo is None:
            memo = set()
        if self not in memo:  # hashing is by identity: modules do not define __eq__
            if remove_duplicate:
                memo.add(self)
            yield prefix, self
            for name, module in self._modules.items():
                if module is None:
                    continue
                submodule_prefix = prefix + ("." if prefix else "") + name
                yield from module.named_modules(memo, submodule_prefix, remove_duplicate)

    def modules(self, remove_duplicate: bool = True) -> Iterator:
        for _, module in self.named_modules(remove_duplicate=remove_duplicate):
            yield module

    def named_children(self) -> Iterator:
        """Direct children; the same instance under two names is yielded once (always, no flag)."""
        memo = set()
        for name, module in self._modules.items():
            if module is not None and module not in memo:
                memo.add(module)
                yield name, module

    def children(self) -> Iterator:
        for _, module in self.named_children():
            yield module

    def _named_members(self, get_members_fn: Callable, prefix: str = "", recurse: bool = True,
                       remove_duplicate: bool = True):
        """The one walk behind named_parameters and named_buffers: modules, then each one's members."""
        _check_prefix(prefix)
        _check_bool("recurse", recurse)
        _check_bool("remove_duplicate", remove_duplicate)
        memo = set()  # tensors already yielded (Tensor.__hash__ is id-based)
        modules = (self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate)
                   if recurse else [(prefix, self)])
        for module_prefix, module in modules:
            for k, v in get_members_fn(module):
                if v is None or v in memo:
                    continue
                if remove_duplicate:
                    memo.add(v)
                name = module_prefix + ("." if module_prefix else "") + k
                yield name, v

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        yield from self._named_members(lambda module: module._parameters.items(), prefix=prefix,
                                       recurse=recurse, remove_duplicate=remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator:
        for _, param in self.named_parameters(recurse=recurse):
            yield param

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        yield from self._named_members(lambda module: module._buffers.items(), prefix=prefix,
                                       recurse=recurse, remove_duplicate=remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator:
        for _, buf in self.named_buffers(recurse=recurse):
            yield buf

    def apply(self, fn: Callable):
        """``fn(module)`` on every child subtree first, then on self (post-order, children deduplicated)."""
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self
