"""Module backward hooks: how ``register_full_backward_hook`` finds "the gradient of this module".

Mirrors ``BackwardHook`` in torch/utils/hooks.py and ``BackwardHookFunction`` in
torch/nn/modules/_functions.py.

Autograd knows nothing of modules: a module's forward may record any number of nodes, so there is no
single node whose gradients are "the module's". ``_call_impl`` therefore brackets the forward with two
identity autograd Functions::

    args --[BackwardHookFunction]--> args' --> forward --> out --[BackwardHookFunction]--> out'
            node "In"                                               node "Out"

In backward the gradient reaches ``Out`` first. A *post*-hook on ``Out`` records ``grad_output`` (one
entry per output; None for non-tensor outputs), runs the module's **backward pre-hooks**, which may
replace ``grad_output``, and passes it on into the forward's own nodes. When the gradient has flowed
through all of them it reaches ``In``; a post-hook there has the gradients with respect to the
module's inputs and calls the **full backward hooks** with ``(module, grad_input, grad_output)``; a hook
may return a new ``grad_input``. This is why the hooks see each tensor passed to the module as a view
(the identity Function's output), and why in-place changes to a module's inputs or outputs are
refused while backward hooks are set.

If no input requires grad (the first layer of a network fed plain data), ``In`` is never created: the
full backward hooks then run from ``Out``'s hook with ``grad_input`` all None (and a warning).

Simplified relative to torch: the packing helpers are inlined, the warning when a module returns
something other than a tensor or tuple is left out, and only plain tuples (and namedtuples) of inputs
are rebuilt.
"""
from __future__ import annotations

import warnings

import torch

__all__ = ["BackwardHook", "BackwardHookFunction"]


class BackwardHookFunction(torch.autograd.Function):
    """Identity on any number of tensors. Its node (``BackwardHookFunctionBackward``) is the hook point."""

    @staticmethod
    def forward(ctx, *args):
        ctx.mark_non_differentiable(*[arg for arg in args if not arg.requires_grad])
        return args

    @staticmethod
    def backward(ctx, *grads):
        return grads


class BackwardHook:
    """One per module call that has full backward hooks or backward pre-hooks."""

    def __init__(self, module, user_hooks: list, user_pre_hooks: list) -> None:
        self.module = module
        self.user_hooks = user_hooks  # full backward hooks: (module, grad_input, grad_output)
        self.user_pre_hooks = user_pre_hooks  # backward pre-hooks: (module, grad_output)
        self.grad_outputs = None  # set by Out's hook, consumed (and cleared) by In's hook
        self.n_inputs = -1
        self.input_tensors_index = None  # positions of tensor args; None: no input needs grad
        self.n_outputs = -1
        self.output_tensors_index = None

    # ---- the identity node and where its hook goes ---------------------------------------------------
    def _apply_on_tensors(self, register, args: tuple):
        """Pass the tensors among ``args`` through BackwardHookFunction; ``register(node)`` hooks its node."""
        tensors_idx = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        tensors = [args[i] for i in tensors_idx]
        requires_grad = any(t.requires_grad for t in tensors)
        if not (requires_grad and torch.is_grad_enabled()):
            return args, None  # nothing to hook: no gradient will flow through here
        new_tensors = BackwardHookFunction.apply(*tensors)
        grad_fns = [t.grad_fn for t in new_tensors
                    if t.grad_fn is not None and t.grad_fn.name() == "BackwardHookFunctionBackward"]
        register(grad_fns[0])  # all outputs share one node
        out = list(args)
        for i, t in zip(tensors_idx, new_tensors, strict=True):
            out[i] = t
        return (tuple(out) if type(args) is tuple else type(args)(*out)), tensors_idx

    # ---- inputs: the full backward hooks run when grad w.r.t. the inputs is ready ---------------------
    def setup_input_hook(self, args: tuple):
        def register(grad_fn) -> None:
            def hook(grad_input, _grad_output):  # a node post-hook: (the node's outputs, its inputs)
                if self.grad_outputs is None:
                    return None  # reached the inputs without passing the outputs (e.g. double backward)
                res = [None] * self.n_inputs  # one entry per positional arg, None for non-tensors
                for i, g in zip(self.input_tensors_index, grad_input, strict=True):
                    res[i] = g
                res = tuple(res)
                for user_hook in self.user_hooks:
                    out = user_hook(self.module, res, self.grad_outputs)
                    if out is None:
                        continue
                    if len(out) != len(res):
                        raise RuntimeError("Backward hook returned an invalid number of grad_input, "
                                           f"got {len(out)}, but expected {len(res)}")
                    res = out  # later hooks see the replaced grad_input
                self.grad_outputs = None
                return tuple(res[i] for i in self.input_tensors_index)

            grad_fn.register_hook(hook)

        res, input_idx = self._apply_on_tensors(register, args)
        self.n_inputs = len(args)
        self.input_tensors_index = input_idx
        return res

    # ---- outputs: the backward pre-hooks run when grad w.r.t. the outputs arrives ---------------------
    def setup_output_hook(self, result):
        def register(grad_fn) -> None:
            def hook(_grad_input, grad_output):
                packed = [None] * self.n_outputs
                for i, g in zip(self.output_tensors_index, grad_output, strict=True):
                    packed[i] = g
                self.grad_outputs = tuple(packed)
                expected_len = len(self.grad_outputs)
                for user_pre_hook in self.user_pre_hooks:
                    new = user_pre_hook(self.module, self.grad_outputs)
                    if new is None:
                        continue
                    if len(new) != expected_len:
                        raise RuntimeError("Backward pre hook returned an invalid number of grad_output, "
                                           f"got {len(new)}, but expected {expected_len}")
                    self.grad_outputs = new
                local_grad_outputs = self.grad_outputs
                if self.input_tensors_index is None:  # no input needs grad: fire the full hooks now
                    warnings.warn("Full backward hook is firing when gradients are computed with respect to "
                                  "module outputs since no inputs require gradients.", stacklevel=5)
                    grad_inputs = (None,) * self.n_inputs
                    for user_hook in self.user_hooks:
                        res = user_hook(self.module, grad_inputs, self.grad_outputs)
                        if res is not None and not (isinstance(res, tuple) and all(el is None for el in res)):
                            raise RuntimeError("Backward hook for Modules where no input requires gradient should "
                                               "always return None or None for all gradients.")
                    self.grad_outputs = None
                return tuple(local_grad_outputs[i] for i in self.output_tensors_index)

            grad_fn.register_hook(hook)

        is_tuple = isinstance(result, tuple)
        args = result if is_tuple else (result,)
        res, output_idx = self._apply_on_tensors(register, args)
        self.n_outputs = len(args)
        self.output_tensors_index = output_idx
        return res if is_tuple else res[0]
