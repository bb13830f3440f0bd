"""Modes: ``train()``/``eval()``, ``requires_grad_()``, ``zero_grad()``.

Mirrors ``Module.train``, ``Module.eval``, ``Module.requires_grad_`` and ``Module.zero_grad`` in
torch/nn/modules/module.py.

``eval()`` is *only* ``train(False)``: it sets the boolean attribute ``training`` on every module of the
tree, and nothing else. Modules that behave differently at inference read it in their forward
(Dropout stops dropping, BatchNorm uses its running statistics instead of the batch's). It does not
stop autograd: a forward in eval mode still records a graph and keeps activations alive. That is
``torch.no_grad()``/``torch.inference_mode()``, a thread-local switch of the autograd engine that knows
nothing of modules. Evaluation wants both.

``requires_grad_(False)`` freezes parameters (the tensors' flag, not the module's); ``zero_grad()``
sets ``.grad`` to None by default (``set_to_none=True``), so an optimizer skips those parameters.
"""
from __future__ import annotations

__all__ = ["Modes"]


class Modes:
    """Mixin of :class:`MiniModule`: flags that travel down the tree."""

    def train(self, mode: bool = True):
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        for module in self.children():
            module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True):
        if not isinstance(requires_grad, bool):
            raise TypeError(f"requires_grad must be a bool, got {requires_grad!r}")
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        if not isinstance(set_to_none, bool):
            raise TypeError(f"set_to_none must be a bool, got {set_to_none!r}")
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()
