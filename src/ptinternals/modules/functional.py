"""``functional_call``: run a module with other tensors in place of its parameters, for one call.

Mirrors ``torch.func.functional_call`` (torch/_functorch/functional_call.py), which calls
``_functional_call``, ``_reparametrize_module`` and ``_untie_named_tensors_map`` in
torch/nn/utils/stateless.py and ``swap_tensor`` in torch/nn/utils/_named_member_accessor.py.

A module is state plus code. ``functional_call(module, {"0.weight": w, ...}, x)`` separates them:
it swaps the given tensors into the module's ``_parameters``/``_buffers`` dicts (plain dict
assignment: no ``__setattr__`` checks, so any tensor fits, even one that is not a Parameter or
that requires no grad), calls ``module(x)`` (hooks included), and swaps the originals back in a
``finally``, even when forward raised. The result is a *pure function* of (parameters, inputs), which
is what ``torch.func.grad``/``vmap`` (per-example gradients, ensembles) and ``torch.compile`` need.

Tied tensors: with ``tie_weights=True`` (the default) a value given for one name of a tied tensor
is used for all its names (``{"encoder.weight": w}`` also sets ``decoder.weight``); two *different*
values for one tied tensor is an error. With ``strict=True`` the given names must be exactly all of
the module's parameter and buffer names (every alias of a tied tensor included).

Simplified: no ``stack_weights`` and no JIT/DataParallel checks. Names that are neither a parameter
nor a buffer are set as plain attributes, as torch does.

Deliberate differences from torch 2.13, both bugs there:

- a module registered under two names (``nn.Sequential(lin, lin)``) with ``tie_weights=True``: torch
  swaps the one slot twice and restores first-in-first-out, so after the call the module *keeps* the
  tensor you passed (pytorch/pytorch#164759). Here originals are restored last-in-first-out.
- two of three (or more) names of one tied tensor given: torch's ``_untie_named_tensors_map`` raises
  ``KeyError`` for the name not given (it looks up every tied name in the user's dict); here the check
  only compares the values that were given.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Sequence

import torch

from .registration import ModuleBase

__all__ = ["functional_call"]

_MISSING = object()  # "this name did not exist before the swap"


def _untie_named_tensors_map(module, parameters_and_buffers: dict) -> dict:
    """Add every alias of a tied tensor for which one name was given; refuse two values for one tensor."""
    all_named_tensors = {}
    all_named_tensors.update(module.named_parameters(remove_duplicate=False))
    all_named_tensors.update(module.named_buffers(remove_duplicate=False))
    tensor_to_names: dict = {}
    for name, tensor in all_named_tensors.items():
        tensor_to_names.setdefault(tensor, set()).add(name)
    tied_names_map = {name: names for names in tensor_to_names.values() if len(names) > 1 for name in names}

    given_tied = {name for name in parameters_and_buffers if name in tied_names_map}
    for given_name in given_tied:
        tied_names = tied_names_map[given_name]
        if (len(tied_names & given_tied) > 1
                and len({parameters_and_buffers[n] for n in tied_names if n in parameters_and_buffers}) != 1):
            raise ValueError(f"functional_call got multiple values for keys {sorted(tied_names)}, which are tied. "
                             "Consider using tie_weights=False")
    untied = dict(parameters_and_buffers)
    for given_name in given_tied:
        for tied_name in tied_names_map[given_name]:
            untied[tied_name] = parameters_and_buffers[given_name]
    return untied


def _get_submodule(module, path: str):
    """The module at dotted ``path`` (NamedMemberAccessor.get_submodule, without its cache)."""
    if not path:
        return module
    for attr in path.split("."):
        try:
            submodule = getattr(module, attr)
        except AttributeError as ex:
            raise AttributeError(f"{module._get_name()} has no attribute `{attr}`") from ex
        if not hasattr(submodule, "_parameters") or not hasattr(submodule, "_modules"):
            raise TypeError(f"submodule `{path}`: {submodule} is not an instance of torch.nn.Module")
        module = submodule
    return module


def _swap_tensor(module, name: str, tensor):
    """Put ``tensor`` at dotted ``name``; return what was there (``_MISSING`` if nothing). ``_MISSING`` deletes."""
    prefix, _, leaf = name.rpartition(".")
    module = _get_submodule(module, prefix)
    if tensor is not _MISSING and tensor is not None and not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{tensor} is not an instance of torch.Tensor")
    if leaf == "":
        raise KeyError('tensor name can\'t be empty string ""')
    if leaf in module._parameters:
        orig = module._parameters[leaf]
        if tensor is _MISSING:
            del module._parameters[leaf]
        else:
            module._parameters[leaf] = tensor  # a plain dict write: no Parameter check
    elif leaf in module._buffers:
        orig = module._buffers[leaf]
        if tensor is _MISSING:
            del module._buffers[leaf]
        else:
            module._buffers[leaf] = tensor
    else:
        orig = getattr(module, leaf) if hasattr(module, leaf) else _MISSING
        if orig is not _MISSING and orig is not None and not isinstance(orig, torch.Tensor):
            raise TypeError(f"attribute `{leaf}`: {orig} is not an instance of torch.Tensor")
        if tensor is not _MISSING:
            setattr(module, leaf, tensor)
        elif hasattr(module, leaf):
            delattr(module, leaf)
    return orig


def _check_keys(module, keys) -> tuple[list, list]:
    valid = {name for name, _ in module.named_parameters(remove_duplicate=False)}
    valid |= {name for name, _ in module.named_buffers(remove_duplicate=False)}
    keys = set(keys)
    return sorted(valid - keys), sorted(keys - valid)


@contextlib.contextmanager
def _reparametrize_module(module, parameters_and_buffers: dict, tie_weights: bool = False, strict: bool = False):
    untied = _untie_named_tensors_map(module, parameters_and_buffers) if tie_weights else parameters_and_buffers
    if strict:
        missing, unexpected = _check_keys(module, untied)
        error_msgs = []
        if unexpected:
            error_msgs.append(f"Unexpected key(s): {', '.join(map(repr, unexpected))}.")
        if missing:
            error_msgs.append(f"Missing key(s): {', '.join(map(repr, missing))}.")
        if error_msgs:
            raise RuntimeError("Error(s) in reparametrizing for {}:\n\t{}".format(module._get_name(),
                                                                                 "\n\t".join(error_msgs)))
    originals: dict = {}
    try:
        try:
            for name, tensor in untied.items():
                originals[name] = _swap_tensor(module, name, tensor)
        except Exception:
            for name, orig in originals.items():  # a half-done swap is undone before raising
                _swap_tensor(module, name, orig)
            originals = {}
            raise
        yield
    finally:
        # Restore in reverse order (torch does so only with stack_weights=True). Two names can reach the
        # same slot (a module registered twice, tie_weights=True): the second swap then saved the *new*
        # tensor as "original", and restoring first-in-first-out would leave it in the module.
        restored = {name: _swap_tensor(module, name, orig) for name, orig in reversed(list(originals.items()))}
        # If forward replaced a swapped-in tensor (an in-place buffer update by assignment), tell the caller.
        parameters_and_buffers.update({k: restored[k] for k in parameters_and_buffers if k in restored})


def functional_call(module, parameter_and_buffer_dicts, args=None, kwargs=None, *, tie_weights: bool = True,
                    strict: bool = False):
    """``module(*args, **kwargs)`` with the named tensors of ``parameter_and_buffer_dicts`` swapped in."""
    if isinstance(parameter_and_buffer_dicts, dict):
        parameters_and_buffers = parameter_and_buffer_dicts
    elif isinstance(parameter_and_buffer_dicts, Sequence):  # a str too: torch reports its items
        if not all(isinstance(d, dict) for d in parameter_and_buffer_dicts):
            raise ValueError("Expected all elements of parameter_and_buffer_dicts to be dictionaries")
        counts = Counter(k for d in parameter_and_buffer_dicts for k in d)
        repeated = [k for k, n in counts.items() if n > 1]
        if repeated:
            raise ValueError(f"{repeated} appeared in multiple dictionaries; behavior of functional call is ambiguous")
        parameters_and_buffers = {k: v for d in parameter_and_buffer_dicts for k, v in d.items()}
    else:
        raise ValueError("Expected parameter_and_buffer_dicts to be a dict, or a list/tuple of dicts, "
                         f"but got {type(parameter_and_buffer_dicts)}")
    for key in parameters_and_buffers:
        if not isinstance(key, str):
            raise TypeError(f"parameter_and_buffer_dicts keys must be str (dotted names), got {key!r}")
    for name in ("tie_weights", "strict"):
        if not isinstance(locals()[name], bool):
            raise TypeError(f"{name} must be a bool, got {locals()[name]!r}")
    if not isinstance(module, (ModuleBase, torch.nn.Module)):  # the same dicts: both work
        raise TypeError(f"module must be a MiniModule or a torch.nn.Module, got {type(module).__name__}")
    if kwargs is None:
        kwargs = {}
    if args is None:
        args = ()
    elif not isinstance(args, tuple):
        args = (args,)
    with _reparametrize_module(module, parameters_and_buffers, tie_weights=tie_weights, strict=strict):
        return module(*args, **kwargs)
