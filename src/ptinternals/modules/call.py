"""Calling a module: ``model(x)`` is ``_call_impl``, and ``forward`` is only its middle step.

Mirrors ``Module._call_impl`` and the hook registration methods of torch/nn/modules/module.py
(``register_forward_pre_hook``, ``register_forward_hook``, ``register_full_backward_pre_hook``,
``register_full_backward_hook``, ``_get_backward_hooks``, ``_get_backward_pre_hooks``).

``_call_impl(*args, **kwargs)``, step by step:

1. fast path: no hook of any kind, on this module or globally -> ``return self.forward(*args, **kwargs)``.
2. forward **pre-hooks**, global ones first, then the module's (``prepend=True`` puts a hook first among
   the module's). ``hook(module, args)`` may return new args (a non-tuple is wrapped in a 1-tuple);
   with ``with_kwargs=True``, ``hook(module, args, kwargs)`` may return a ``(args, kwargs)`` pair.
3. if there are full backward hooks or backward pre-hooks: pass the tensor args through an identity
   autograd Function (``BackwardHook.setup_input_hook``, see :mod:`.backward_hook`).
4. ``result = self.forward(*args, **kwargs)``.
5. forward **hooks**, global first: ``hook(module, args, result)`` or, ``with_kwargs``,
   ``hook(module, args, kwargs, result)``; a non-None return value *replaces* the result, and later
   hooks see the replacement. The ``args`` they see are those the pre-hooks produced.
6. backward hooks again: the result passes through the identity Function (``setup_output_hook``).
7. if anything above raised, each ``always_call=True`` forward hook that has not run yet runs now, as
   ``hook(module, args, result)`` (result may still be None), its own exceptions turned into warnings;
   then the original exception propagates.

Calling ``model.forward(x)`` runs step 4 alone: no pre-hook (FSDP's parameter all-gather, a
quantization observer), no forward hook (activation capture), no backward hook. Nothing fails; the
machinery around the model silently does not happen.

Simplified: no tracing (``_slow_forward``), no ``torch.compile`` (``_compiled_call_impl``), no
deprecated non-full backward hooks (``register_backward_hook``).
"""
from __future__ import annotations

import warnings
from typing import Callable

import torch

from . import hooks as G
from .backward_hook import BackwardHook
from .hooks import RemovableHandle

__all__ = ["Calling"]


def _check_hook(hook, prepend, **flags) -> None:
    if not callable(hook):
        raise TypeError(f"hook must be callable, got {type(hook).__name__}")
    for name, value in dict(prepend=prepend, **flags).items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}")


class Calling:
    """Mixin of :class:`MiniModule`: hooks and ``__call__``."""

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    # ---- registering hooks --------------------------------------------------------------------------
    def register_forward_pre_hook(self, hook: Callable, *, prepend: bool = False,
                                  with_kwargs: bool = False) -> RemovableHandle:
        _check_hook(hook, prepend, with_kwargs=with_kwargs)
        handle = RemovableHandle(self._forward_pre_hooks, extra_dict=self._forward_pre_hooks_with_kwargs)
        self._forward_pre_hooks[handle.id] = hook
        if with_kwargs:
            self._forward_pre_hooks_with_kwargs[handle.id] = True
        if prepend:
            self._forward_pre_hooks.move_to_end(handle.id, last=False)
        return handle

    def register_forward_hook(self, hook: Callable, *, prepend: bool = False, with_kwargs: bool = False,
                              always_call: bool = False) -> RemovableHandle:
        _check_hook(hook, prepend, with_kwargs=with_kwargs, always_call=always_call)
        handle = RemovableHandle(self._forward_hooks,
                                 extra_dict=[self._forward_hooks_with_kwargs, self._forward_hooks_always_called])
        self._forward_hooks[handle.id] = hook
        if with_kwargs:
            self._forward_hooks_with_kwargs[handle.id] = True
        if always_call:
            self._forward_hooks_always_called[handle.id] = True
        if prepend:
            self._forward_hooks.move_to_end(handle.id, last=False)
        return handle

    def register_full_backward_pre_hook(self, hook: Callable, prepend: bool = False) -> RemovableHandle:
        _check_hook(hook, prepend)
        handle = RemovableHandle(self._backward_pre_hooks)
        self._backward_pre_hooks[handle.id] = hook
        if prepend:
            self._backward_pre_hooks.move_to_end(handle.id, last=False)
        return handle

    def register_full_backward_hook(self, hook: Callable, prepend: bool = False) -> RemovableHandle:
        _check_hook(hook, prepend)
        handle = RemovableHandle(self._backward_hooks)
        self._backward_hooks[handle.id] = hook
        if prepend:
            self._backward_hooks.move_to_end(handle.id, last=False)
        return handle

    def _get_backward_hooks(self) -> list:
        return [*G._global_backward_hooks.values(), *self._backward_hooks.values()]

    def _get_backward_pre_hooks(self) -> list:
        return [*G._global_backward_pre_hooks.values(), *self._backward_pre_hooks.values()]

    # ---- the call -----------------------------------------------------------------------------------
    def _call_impl(self, *args, **kwargs):
        forward_call = self.forward
        if not (self._backward_hooks or self._backward_pre_hooks or self._forward_hooks or self._forward_pre_hooks
                or G.has_any_global_hook()):
            return forward_call(*args, **kwargs)  # 1. the fast path: most modules, most of the time

        result = None
        called_always_called_hooks: set[int] = set()

        def inner():
            nonlocal result, args, kwargs
            backward_pre_hooks = self._get_backward_pre_hooks() if (
                self._backward_pre_hooks or G._global_backward_pre_hooks) else []
            full_backward_hooks = self._get_backward_hooks() if (
                self._backward_hooks or G._global_backward_hooks) else []

            # 2. forward pre-hooks: global first, then the module's own
            for hook_id, hook in (*G._global_forward_pre_hooks.items(), *self._forward_pre_hooks.items()):
                if hook_id in self._forward_pre_hooks_with_kwargs:
                    args_kwargs_result = hook(self, args, kwargs)
                    if args_kwargs_result is not None:
                        if isinstance(args_kwargs_result, tuple) and len(args_kwargs_result) == 2:
                            args, kwargs = args_kwargs_result
                        else:
                            raise RuntimeError("forward pre-hook must return None or a tuple of (new_args, "
                                               f"new_kwargs), but got {args_kwargs_result}.")
                else:
                    args_result = hook(self, args)
                    if args_result is not None:
                        if not isinstance(args_result, tuple):
                            args_result = (args_result,)
                        args = args_result

            # 3. backward hooks need a node before the forward...
            bw_hook = None
            if full_backward_hooks or backward_pre_hooks:
                bw_hook = BackwardHook(self, full_backward_hooks, backward_pre_hooks)
                args = bw_hook.setup_input_hook(args)

            result = forward_call(*args, **kwargs)  # 4. the module's own computation

            # 5. forward hooks: global first; a non-None return replaces the result
            for hook_id, hook in (*G._global_forward_hooks.items(), *self._forward_hooks.items()):
                if hook_id in self._forward_hooks_always_called or hook_id in G._global_forward_hooks_always_called:
                    called_always_called_hooks.add(hook_id)
                if hook_id in self._forward_hooks_with_kwargs or hook_id in G._global_forward_hooks_with_kwargs:
                    hook_result = hook(self, args, kwargs, result)
                else:
                    hook_result = hook(self, args, result)
                if hook_result is not None:
                    result = hook_result

            # 6. ...and a node after it
            if bw_hook:
                if not isinstance(result, (torch.Tensor, tuple)):
                    warnings.warn("For backward hooks to be called, module output should be a Tensor or a tuple of "
                                  f"Tensors but received {type(result)}", stacklevel=2)
                result = bw_hook.setup_output_hook(result)
            return result

        try:
            return inner()
        except Exception:
            # 7. always_call hooks that did not get to run, then re-raise the original error
            for hook_id, hook in G._global_forward_hooks.items():
                if hook_id in G._global_forward_hooks_always_called and hook_id not in called_always_called_hooks:
                    try:
                        hook_result = hook(self, args, result)
                        if hook_result is not None:
                            result = hook_result
                    except Exception as e:
                        warnings.warn("global module forward hook with ``always_call=True`` raised an exception "
                                      f"that was silenced as another error was raised in forward: {str(e)}",
                                      stacklevel=2)
            for hook_id, hook in self._forward_hooks.items():
                if hook_id in self._forward_hooks_always_called and hook_id not in called_always_called_hooks:
                    try:
                        if hook_id in self._forward_hooks_with_kwargs:
                            hook_result = hook(self, args, kwargs, result)
                        else:
                            hook_result = hook(self, args, result)
                        if hook_result is not None:
                            result = hook_result
                    except Exception as e:
                        warnings.warn("module forward hook with ``always_call=True`` raised an exception that was "
                                      f"silenced as another error was raised in forward: {str(e)}", stacklevel=2)
            raise

    __call__ = _call_impl
