"""``MiniModule``: torch.nn.Module rebuilt from its parts, one idea per mixin.

=====================  ==========================================================================
mixin (module)         what it mirrors in torch/nn/modules/module.py
=====================  ==========================================================================
``ModuleBase``         ``__init__``, ``register_*``, ``__getattr__``/``__setattr__``/``__delattr__``
(registration)
``Traversal``          ``named_modules``, ``named_parameters``, ``named_buffers``, ``_named_members``
``Conversion``         ``_apply``, ``to``, ``float``/``double``/``half``, ``cpu``/``cuda``
``StateDict``          ``state_dict``, ``load_state_dict``, ``_IncompatibleKeys``
``Calling``            ``_call_impl`` (``__call__``) and the forward/backward hook registrations
``Modes``              ``train``/``eval``, ``requires_grad_``, ``zero_grad``
=====================  ==========================================================================

A ``MiniModule`` is NOT a ``torch.nn.Module``: torch's own utilities (optimizers aside, which only
need ``parameters()``) do not recognise it, and a ``torch.nn.Linear`` cannot be its child. Its
children are MiniModules (see :mod:`.containers`); its tensors are ordinary ``torch.Tensor``s and
``torch.nn.Parameter``s, so real autograd and real optimizers work on it.
"""
from __future__ import annotations

from .call import Calling
from .conversion import Conversion
from .modes import Modes
from .registration import ModuleBase
from .state_dict import StateDict
from .traversal import Traversal

__all__ = ["MiniModule"]


def _addindent(text: str, num_spaces: int) -> str:
    lines = text.split("\n")
    if len(lines) == 1:
        return text
    first = lines.pop(0)
    return first + "\n" + "\n".join((num_spaces * " ") + line if line.strip() else "" for line in lines)


class MiniModule(ModuleBase, Traversal, Conversion, StateDict, Calling, Modes):
    """Base class of the course's modules: subclass it, call ``super().__init__()``, define ``forward``."""

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:  # torch's Module.__repr__: one line per child, indented
        extra_lines = self.extra_repr().split("\n") if self.extra_repr() else []
        child_lines = [f"({key}): " + _addindent(repr(module), 2) for key, module in self._modules.items()]
        lines = extra_lines + child_lines
        main_str = self._get_name() + "("
        if len(extra_lines) == 1 and not child_lines:  # the one-liner most leaf modules use
            main_str += extra_lines[0]
        elif lines:
            main_str += "\n  " + "\n  ".join(lines) + "\n"
        return main_str + ")"

    def __dir__(self):
        keys = list(super().__dir__()) + list(self._parameters) + list(self._modules) + list(self._buffers)
        return sorted(k for k in set(keys) if not k[0].isdigit())
