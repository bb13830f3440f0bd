"""Checkpoints: ``state_dict`` and ``load_state_dict``.

Mirrors torch/nn/modules/module.py: ``_IncompatibleKeys``, ``_save_to_state_dict``, ``state_dict``,
``_load_from_state_dict``, ``load_state_dict``, ``get_extra_state``/``set_extra_state``.

Saving is a pre-order walk: each module writes ``prefix + name`` for its non-None parameters, then
its non-None *persistent* buffers, then (if its class overrides ``get_extra_state``)
``prefix + "_extra_state"``; then each child with ``prefix + child_name + "."``. The returned
``OrderedDict`` carries ``_metadata``: ``{module_prefix_without_dot: {"version": cls._version}}``, the
hook a module uses to upgrade old checkpoints in its own ``_load_from_state_dict``. Values are
``detach()``-ed aliases (same storage, no autograd), not copies: ``torch.save`` serialises them.
Tied parameters appear under *every* name (state_dict does not de-duplicate; ``parameters()`` does).

Loading walks the same tree. Each module looks up its own keys: a present key is *copied into* the
existing tensor (``param.copy_(input)`` under no_grad: identity, dtype and device of the model are
kept) after a shape check; a missing key is reported. Keys under the module's prefix that name
nothing it owns are unexpected. With ``strict=True`` missing/unexpected keys become a RuntimeError;
with ``strict=False`` they are only *returned*: the classic "it loaded fine" checkpoint whose every
key had a stale prefix loads nothing at all. Shape mismatches raise even when ``strict=False``.
``assign=True`` puts the checkpoint's tensors themselves into the module (keeping each parameter's
``requires_grad``), which is how a model built on the ``meta`` device gets real weights without a copy.

Simplified: no state-dict hooks (``register_state_dict_pre_hook``, ``register_load_state_dict_pre_hook``
and ``_post_hook``), no lazy (uninitialized) parameters, and the positional-argument form of
``state_dict`` is refused.
"""
from __future__ import annotations

import itertools
import warnings
from collections import OrderedDict, namedtuple
from collections.abc import Mapping

import torch
from torch.nn import Parameter

__all__ = ["IncompatibleKeys", "StateDict", "EXTRA_STATE_KEY_SUFFIX"]

EXTRA_STATE_KEY_SUFFIX = "_extra_state"


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    """What ``load_state_dict`` returns: torch's ``_IncompatibleKeys`` (a namedtuple of two lists).

    Same class name as torch's, so that even the repr is identical:
    ``_IncompatibleKeys(missing_keys=[...], unexpected_keys=[...])``.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


IncompatibleKeys = _IncompatibleKeys


class StateDict:
    """Mixin of :class:`MiniModule`: saving and loading a module tree's state."""

    # ---- extra (non-tensor) state: override both to use it ------------------------------------------
    def get_extra_state(self):
        raise RuntimeError("Reached a code path in Module.get_extra_state() that should never be called.")

    def set_extra_state(self, state) -> None:
        raise RuntimeError("Reached a code path in Module.set_extra_state() that should never be called.")

    def _has_extra_state(self, method: str) -> bool:
        return getattr(type(self), method) is not getattr(StateDict, method)

    # ---- saving -------------------------------------------------------------------------------------
    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        """This module's own entries only (no children)."""
        for name, param in self._parameters.items():
            if param is not None:
                destination[prefix + name] = param if keep_vars else param.detach()
        for name, buf in self._buffers.items():
            if buf is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = buf if keep_vars else buf.detach()
        if self._has_extra_state("get_extra_state"):
            destination[prefix + EXTRA_STATE_KEY_SUFFIX] = self.get_extra_state()

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        if args:
            raise TypeError("state_dict takes keyword arguments only (destination=, prefix=, keep_vars=); "
                            f"got {len(args)} positional argument(s)")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        if destination is None:
            destination = OrderedDict()
            destination._metadata = OrderedDict()
        elif not isinstance(destination, dict):
            raise TypeError(f"destination must be a dict, got {type(destination).__name__}")
        local_metadata = dict(version=self._version)
        if hasattr(destination, "_metadata"):
            destination._metadata[prefix[:-1]] = local_metadata  # "" for the root, "encoder.0" below
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, module in self._modules.items():
            if module is not None:
                module.state_dict(destination=destination, prefix=prefix + name + ".", keep_vars=keep_vars)
        return destination

    # ---- loading ------------------------------------------------------------------------------------
    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        """Load this module's own entries; append to the three lists instead of raising."""
        persistent_buffers = {k: v for k, v in self._buffers.items() if k not in self._non_persistent_buffers_set}
        local_state = {k: v for k, v in itertools.chain(self._parameters.items(), persistent_buffers.items())
                       if v is not None}
        assign = local_metadata.get("assign_to_params_buffers", False)
        use_swap = torch.__future__.get_swap_module_params_on_conversion()
        for name, param in local_state.items():
            key = prefix + name
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            input_param = state_dict[key]
            if not torch.overrides.is_tensor_like(input_param):
                error_msgs.append(f'While copying the parameter named "{key}", expected torch.Tensor or Tensor-like '
                                  f"object from checkpoint but received {type(input_param)}")
                continue
            # Backward compatibility: checkpoints from 0.3 stored 0-dim values as shape (1,).
            if len(param.shape) == 0 and len(input_param.shape) == 1 and input_param.shape[0] == 1:
                input_param = input_param[0]
            if input_param.shape != param.shape:
                error_msgs.append(f"size mismatch for {key}: copying a param with shape {input_param.shape} from "
                                  f"checkpoint, the shape in current model is {param.shape}.")
                continue
            if param.is_meta and not input_param.is_meta and not assign:
                warnings.warn(f"for {key}: copying from a non-meta parameter in the checkpoint to a meta parameter "
                              "in the current model, which is a no-op. (Did you mean to pass `assign=True` to "
                              "assign items in the state dictionary to their corresponding key in the module "
                              "instead of copying them in place?)", stacklevel=2)
            try:
                with torch.no_grad():
                    if use_swap:
                        new_input = param.module_load(input_param, assign=assign)
                        if isinstance(param, Parameter) and not isinstance(new_input, Parameter):
                            new_input = Parameter(new_input, requires_grad=param.requires_grad)
                        torch.utils.swap_tensors(param, new_input)
                    elif assign:
                        # torch: setattr(self, name, input_param), which __setattr__ files into the same dict
                        if isinstance(param, Parameter):
                            if not isinstance(input_param, Parameter):
                                input_param = Parameter(input_param, requires_grad=param.requires_grad)
                            else:
                                input_param.requires_grad_(param.requires_grad)
                            self._parameters[name] = input_param
                        else:
                            self._buffers[name] = input_param
                    else:
                        param.copy_(input_param)  # in place: the model keeps its tensors, dtype, device
            except Exception as ex:
                action = "swapping" if use_swap else "copying"
                error_msgs.append(f'While {action} the parameter named "{key}", whose dimensions in the model are '
                                  f"{param.size()} and whose dimensions in the checkpoint are {input_param.size()}, "
                                  f"an exception occurred : {ex.args}.")
        extra_state_key = prefix + EXTRA_STATE_KEY_SUFFIX
        if self._has_extra_state("set_extra_state"):
            if extra_state_key in state_dict:
                self.set_extra_state(state_dict[extra_state_key])
            elif strict:
                missing_keys.append(extra_state_key)
        elif strict and extra_state_key in state_dict:
            unexpected_keys.append(extra_state_key)
        if strict:
            for key in state_dict:
                if key.startswith(prefix) and key != extra_state_key:
                    input_name = key[len(prefix):].split(".", 1)
                    if len(input_name) > 1:  # "child.rest": unexpected unless a child of that name exists
                        if input_name[0] not in self._modules:
                            unexpected_keys.append(key)
                    elif input_name[0] not in local_state:
                        unexpected_keys.append(key)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False) -> _IncompatibleKeys:
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        if not isinstance(strict, bool):
            raise TypeError(f"strict must be a bool, got {strict!r}")
        if not isinstance(assign, bool):
            raise TypeError(f"assign must be a bool, got {assign!r}")
        missing_keys: list[str] = []
        unexpected_keys: list[str] = []
        error_msgs: list[str] = []
        metadata = getattr(state_dict, "_metadata", None)
        state_dict = OrderedDict(state_dict)  # a copy: _load_from_state_dict may edit it
        if metadata is not None:
            state_dict._metadata = metadata

        def load(module, local_state_dict, prefix=""):
            local_metadata = {} if metadata is None else metadata.get(prefix[:-1], {})
            if assign:
                local_metadata["assign_to_params_buffers"] = assign
            # Always strict=True here: the lists are filled; the flag only decides whether they raise.
            module._load_from_state_dict(local_state_dict, prefix, local_metadata, True, missing_keys,
                                         unexpected_keys, error_msgs)
            for name, child in module._modules.items():
                if child is not None:
                    child_prefix = prefix + name + "."
                    child_state_dict = {k: v for k, v in local_state_dict.items() if k.startswith(child_prefix)}
                    load(child, child_state_dict, child_prefix)

        load(self, state_dict)
        if strict:
            if unexpected_keys:
                error_msgs.insert(0, "Unexpected key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in unexpected_keys)))
            if missing_keys:
                error_msgs.insert(0, "Missing key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in missing_keys)))
        if error_msgs:
            raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(
                self.__class__.__name__, "\n\t".join(error_msgs)))
        return _IncompatibleKeys(missing_keys, unexpected_keys)
