"""Conversion: ``_apply`` and everything built on it (``to``, ``float``, ``half``, ``cpu``, ``cuda`` ...).

Mirrors ``Module._apply`` and ``Module.to`` in torch/nn/modules/module.py.

``_apply(fn)`` walks children first, then converts this module's own tensors:

- **parameters keep their identity.** By default the converted tensor is put *inside* the existing
  Parameter with ``param.data = fn(param)`` (the "set_data" path). The Python object, its ``id``, its
  hooks and every reference to it (an optimizer's ``param_groups``, a tied module) stay valid: an
  optimizer built before ``model.to(torch.float64)`` still steps the model's parameters.
  ``.data =`` is only allowed when the new tensor has a compatible TensorImpl type
  (``torch._has_compatible_shallow_copy_type``: a dense CPU tensor and a dense CUDA tensor are; a
  dense tensor and a sparse or a wrapper-subclass one are not).
- when that is not possible, or when ``torch.__future__.set_overwrite_module_params_on_conversion(True)``,
  a **new** Parameter replaces the old one in ``_parameters`` (the old optimizer now holds orphans);
  with ``torch.__future__.set_swap_module_params_on_conversion(True)``, ``torch.utils.swap_tensors``
  exchanges the two objects' contents so the identity survives in every case.
- **the gradient moves with its parameter**, by the same rule.
- **buffers are replaced**: ``self._buffers[key] = fn(buf)``, a new tensor object (buffers have no
  optimizer holding them).
- everything else is untouched: a tensor stored as a plain attribute stays where it was.

All of it runs under ``torch.no_grad()``: converting a parameter must not record autograd history.

Simplified: the FakeTensor and traceable-wrapper-subclass cases that force the swap path are not
handled (there are none in this course), and complex-dtype warnings are omitted.
"""
from __future__ import annotations

import torch
from torch.nn import Parameter

__all__ = ["Conversion"]


def _compute_should_use_set_data(tensor: torch.Tensor, tensor_applied: torch.Tensor) -> bool:
    """torch's nested ``compute_should_use_set_data``: may ``tensor.data = tensor_applied`` be used?"""
    if torch._has_compatible_shallow_copy_type(tensor, tensor_applied):
        return not torch.__future__.get_overwrite_module_params_on_conversion()
    return False


def _distinct_children(module) -> list:
    """``module.children()`` written out (each non-None child once), so that Conversion needs no Traversal."""
    seen: list = []
    for child in module._modules.values():
        if child is not None and not any(child is s for s in seen):
            seen.append(child)
    return seen


class Conversion:
    """Mixin of :class:`MiniModule`: converting every parameter and buffer in place."""

    def _apply(self, fn, recurse: bool = True):
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        if recurse:
            for module in _distinct_children(self):  # torch: self.children()
                module._apply(fn)

        use_swap = torch.__future__.get_swap_module_params_on_conversion()
        for key, param in self._parameters.items():
            if param is None:
                continue
            with torch.no_grad():
                param_applied = fn(param)
            param_grad = param.grad
            if use_swap:
                # Swap the C++ contents of the two Python objects: same id, new data and dtype.
                if param_grad is not None:
                    param.grad = None  # swap_tensors refuses tensors with other references
                try:
                    torch.utils.swap_tensors(param, Parameter(param_applied, requires_grad=param.requires_grad))
                except Exception as e:
                    if param_grad is not None:
                        param.grad = param_grad
                    raise RuntimeError(f"_apply(): Couldn't swap {self._get_name()}.{key}") from e
                out_param = param
            elif _compute_should_use_set_data(param, param_applied):
                param.data = param_applied  # the default: same Parameter object, new storage
                out_param = param
            else:
                out_param = Parameter(param_applied, param.requires_grad)  # a new object: identity lost
                self._parameters[key] = out_param

            if param_grad is not None:
                with torch.no_grad():
                    grad_applied = fn(param_grad)
                if use_swap:
                    grad_applied.requires_grad_(param_grad.requires_grad)
                    torch.utils.swap_tensors(param_grad, grad_applied)
                    out_param.grad = param_grad
                elif _compute_should_use_set_data(param_grad, grad_applied):
                    out_param.grad.data = grad_applied
                else:
                    out_param.grad = grad_applied.requires_grad_(param_grad.requires_grad)

        for key, buf in self._buffers.items():
            if buf is not None:
                self._buffers[key] = fn(buf)  # buffers: a new tensor object each time
        return self

    def to(self, *args, **kwargs):
        """``to(device=None, dtype=None, non_blocking=False)``, ``to(dtype)``, ``to(tensor)``.

        Only floating-point and complex tensors change dtype; integer and bool buffers (a step counter,
        ``num_batches_tracked``) only change device.
        """
        device, dtype, non_blocking, convert_to_format = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is not None and not (dtype.is_floating_point or dtype.is_complex):
            raise TypeError("nn.Module.to only accepts floating point or complex "
                            f"dtypes, but got desired dtype={dtype}")

        def convert(t: torch.Tensor) -> torch.Tensor:
            cast = dtype if (t.is_floating_point() or t.is_complex()) else None
            if convert_to_format is not None and t.dim() in (4, 5):
                return t.to(device, cast, non_blocking, memory_format=convert_to_format)
            return t.to(device, cast, non_blocking)

        return self._apply(convert)

    def float(self):
        return self._apply(lambda t: t.float() if t.is_floating_point() else t)

    def double(self):
        return self._apply(lambda t: t.double() if t.is_floating_point() else t)

    def half(self):
        return self._apply(lambda t: t.half() if t.is_floating_point() else t)

    def bfloat16(self):
        return self._apply(lambda t: t.bfloat16() if t.is_floating_point() else t)

    def cpu(self):
        return self._apply(lambda t: t.cpu())

    def cuda(self, device=None):
        return self._apply(lambda t: t.cuda(device))

    def type(self, dst_type):
        """Casts *every* tensor, integer buffers included (unlike ``to``), as torch's ``type`` does."""
        return self._apply(lambda t: t.type(dst_type))
