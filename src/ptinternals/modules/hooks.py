"""Hook handles and the global (every-module) hook tables.

Mirrors two pieces of PyTorch:

- ``RemovableHandle`` (torch/utils/hooks.py): a hook lives in an ordered dict keyed by an integer id
  drawn from ONE counter shared by every handle ever made. The id is what makes ``prepend`` and
  removal work, and, because ids are unique across tables, what lets ``_call_impl`` look a hook's
  flags up (``with_kwargs``, ``always_call``) in side tables keyed by the same id.
- the module-level tables of torch/nn/modules/module.py (``_global_forward_pre_hooks`` ...) and the
  functions that fill them (``register_module_forward_pre_hook``, ``register_module_forward_hook``,
  ``register_module_full_backward_pre_hook``, ``register_module_full_backward_hook``). Global hooks
  run before every module's own hooks of the same kind, on every module.

These tables belong to :class:`~ptinternals.modules.MiniModule`, not to ``torch.nn.Module``: a hook
registered here never fires on a real torch module, and the other way round.

Simplified: no global *registration* hooks (``register_module_buffer_registration_hook`` & co.) and
no deprecated non-full backward hooks (``register_module_backward_hook``).
"""
from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Callable

__all__ = [
    "RemovableHandle", "register_module_forward_pre_hook", "register_module_forward_hook",
    "register_module_full_backward_pre_hook", "register_module_full_backward_hook", "clear_global_hooks",
]


class RemovableHandle:
    """What ``register_*_hook`` returns: ``handle.remove()`` deletes the hook (and its flags).

    ``hooks_dict`` (an OrderedDict: a plain dict cannot be weakly referenced) is held by weak reference,
    as in torch, so a handle does not keep a dead module's
    tables alive. ``extra_dict`` (one dict or a list) are the side tables (``_forward_hooks_with_kwargs``,
    ``_forward_hooks_always_called``) whose entry for this id must go too.
    """

    next_id: int = 0  # class-wide: ids are unique across all modules and all kinds of hooks

    def __init__(self, hooks_dict: OrderedDict, *, extra_dict=None) -> None:
        if not isinstance(hooks_dict, OrderedDict):  # a plain dict cannot be weakly referenced
            raise TypeError(f"hooks_dict must be an OrderedDict, got {type(hooks_dict).__name__}")
        self.hooks_dict_ref = weakref.ref(hooks_dict)
        self.id = RemovableHandle.next_id
        RemovableHandle.next_id += 1
        if extra_dict is None:
            extras = []
        elif isinstance(extra_dict, OrderedDict):
            extras = [extra_dict]
        elif isinstance(extra_dict, list) and all(isinstance(d, OrderedDict) for d in extra_dict):
            extras = extra_dict
        else:
            raise TypeError(f"extra_dict must be an OrderedDict or a list of them, got {type(extra_dict).__name__}")
        self.extra_dict_ref = tuple(weakref.ref(d) for d in extras)

    def remove(self) -> None:
        """Delete the hook; removing twice, or after the module died, does nothing (as in torch)."""
        hooks_dict = self.hooks_dict_ref()
        if hooks_dict is not None and self.id in hooks_dict:
            del hooks_dict[self.id]
        for ref in self.extra_dict_ref:
            extra = ref()
            if extra is not None and self.id in extra:
                del extra[self.id]

    def __enter__(self) -> "RemovableHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"RemovableHandle(id={self.id})"


# The global tables (torch/nn/modules/module.py, module level). Ordered: hooks run in registration order.
_global_forward_pre_hooks: OrderedDict[int, Callable] = OrderedDict()
_global_forward_hooks: OrderedDict[int, Callable] = OrderedDict()
_global_forward_hooks_with_kwargs: OrderedDict[int, bool] = OrderedDict()
_global_forward_hooks_always_called: OrderedDict[int, bool] = OrderedDict()
_global_backward_pre_hooks: OrderedDict[int, Callable] = OrderedDict()
_global_backward_hooks: OrderedDict[int, Callable] = OrderedDict()


def _check_hook(hook) -> None:
    if not callable(hook):
        raise TypeError(f"hook must be callable, got {type(hook).__name__}")


def _check_flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")


def register_module_forward_pre_hook(hook: Callable) -> RemovableHandle:
    """``hook(module, args) -> None or new args``, before every MiniModule's own pre-hooks.

    Global pre-hooks cannot take kwargs (torch's function has no ``with_kwargs``).
    """
    _check_hook(hook)
    handle = RemovableHandle(_global_forward_pre_hooks)
    _global_forward_pre_hooks[handle.id] = hook
    return handle


def register_module_forward_hook(hook: Callable, *, with_kwargs: bool = False,
                                 always_call: bool = False) -> RemovableHandle:
    """``hook(module, args, output)`` (or ``(module, args, kwargs, output)``), before module hooks.

    As in torch, removing the handle cleans the ``always_call`` table but not the ``with_kwargs`` one
    (ids are never reused, so the stale flag is harmless).
    """
    _check_hook(hook)
    _check_flag("with_kwargs", with_kwargs)
    _check_flag("always_call", always_call)
    handle = RemovableHandle(_global_forward_hooks, extra_dict=_global_forward_hooks_always_called)
    _global_forward_hooks[handle.id] = hook
    if with_kwargs:
        _global_forward_hooks_with_kwargs[handle.id] = True
    if always_call:
        _global_forward_hooks_always_called[handle.id] = True
    return handle


def register_module_full_backward_pre_hook(hook: Callable) -> RemovableHandle:
    """``hook(module, grad_output) -> None or new grad_output``, before module backward pre-hooks."""
    _check_hook(hook)
    handle = RemovableHandle(_global_backward_pre_hooks)
    _global_backward_pre_hooks[handle.id] = hook
    return handle


def register_module_full_backward_hook(hook: Callable) -> RemovableHandle:
    """``hook(module, grad_input, grad_output) -> None or new grad_input``, before module backward hooks."""
    _check_hook(hook)
    handle = RemovableHandle(_global_backward_hooks)
    _global_backward_hooks[handle.id] = hook
    return handle


def clear_global_hooks() -> None:
    """Empty every global table (for tests and notebooks; torch has no such function)."""
    for table in (_global_forward_pre_hooks, _global_forward_hooks, _global_forward_hooks_with_kwargs,
                  _global_forward_hooks_always_called, _global_backward_pre_hooks, _global_backward_hooks):
        table.clear()


def has_any_global_hook() -> bool:
    """torch's ``_has_any_global_hook``: the fast path of ``_call_impl`` is taken only when False."""
    return bool(_global_forward_pre_hooks or _global_forward_hooks or _global_backward_pre_hooks
                or _global_backward_hooks)
