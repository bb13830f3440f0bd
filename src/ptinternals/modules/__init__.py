"""The chapter "Modules: what ``model(x)`` really does": ``torch.nn.Module`` rebuilt, piece by piece.

Reference implementation of torch/nn/modules/module.py (and the parts of torch/utils/hooks.py,
torch/nn/utils/stateless.py and torch/_functorch/functional_call.py it relies on):

- :mod:`.registration`: ``ModuleBase``, attribute routing into ``_parameters``/``_buffers``/``_modules``.
- :mod:`.traversal`: ``named_modules``/``named_parameters``/``named_buffers``, de-duplication of shared objects.
- :mod:`.conversion`: ``_apply`` and ``to``: parameters keep their identity, gradients move with them.
- :mod:`.state_dict`: ``state_dict``/``load_state_dict``, strict reporting, ``IncompatibleKeys``.
- :mod:`.hooks`: ``RemovableHandle`` and the global hook tables.
- :mod:`.backward_hook`: the identity-Function trick behind module backward hooks.
- :mod:`.call`: ``_call_impl``: pre-hooks, forward, hooks, backward hooks, ``always_call``.
- :mod:`.modes`: ``train``/``eval``, ``requires_grad_``, ``zero_grad``.
- :mod:`.module`: ``MiniModule``, the mixins put together.
- :mod:`.containers`: ``Sequential``, ``ModuleList``, ``Linear``, ``BatchNorm1d``, ``Dropout`` on MiniModule.
- :mod:`.functional`: ``functional_call`` (parameters swapped in for one call).
- :mod:`.trees`: the same module tree built on ``torch.nn.Module`` or ``MiniModule`` from plain data.
- :mod:`.hook_order`: the order of hook calls of a chain of modules, predicted without running it.
- :mod:`.scaffold`: ``ModuleState`` and ``compose``, what the exercises' mixins are written over, and
  ``BrokenNet`` for the bug hunt (shipped to the grading sandbox; no solution in it).
- :mod:`.bug_hunt`: ``FixedNet`` and ``load_checkpoint`` (strip wrapper prefixes, then load strictly).

Nothing here imports the grading package.
"""
from .hooks import (  # noqa: I001 (the order below follows the dependencies)
    RemovableHandle,
    clear_global_hooks,
    register_module_forward_hook,
    register_module_forward_pre_hook,
    register_module_full_backward_hook,
    register_module_full_backward_pre_hook,
)
from .state_dict import IncompatibleKeys
from .module import MiniModule
from .containers import BatchNorm1d, Dropout, Linear, ModuleList, Sequential
from .functional import functional_call
from .trees import build_tree, example_spec, validate_spec

__all__ = [
    "RemovableHandle", "clear_global_hooks", "register_module_forward_hook", "register_module_forward_pre_hook",
    "register_module_full_backward_hook", "register_module_full_backward_pre_hook", "IncompatibleKeys",
    "MiniModule", "BatchNorm1d", "Dropout", "Linear", "ModuleList", "Sequential", "functional_call",
    "build_tree", "example_spec", "validate_spec",
]
