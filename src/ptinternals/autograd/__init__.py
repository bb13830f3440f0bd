"""The autograd chapter, "Autograd and custom Functions": a reverse-mode engine, custom Functions, checkpointing.

The mini engine (torch/csrc/autograd): ``variable`` (Variable, SavedVariable, grad mode), ``node``
(Node, AccumulateGrad), ``ops`` (forward ops that record nodes), ``formulas`` (each op's backward,
an exercise), ``engine`` (the backward pass, an exercise). ``scaffold`` is the student-facing view of
the first three (no formulas, no engine: what the grading sandbox ships); importing this package
installs the reference formulas and engine into it.

On real torch autograd: ``functions`` (custom ``torch.autograd.Function``s), ``saved_tensors`` (saved-tensor
bytes), ``checkpoint`` (activation checkpointing from scratch), ``accumulation`` (gradient accumulation).
"""
from .variable import Variable, enable_grad, is_grad_enabled, no_grad, set_grad_enabled  # noqa: I001 (first)
from .node import AccumulateGrad, GraphRoot, Node, OpNode
from .formulas import BACKWARD_FORMULAS, unbroadcast, use_formulas
from .engine import backward, compute_dependencies, grad, use_backward
from .functions import FakeQuantize, FusedGeLU, FusedSiLU, FusedSwiGLU, LogSumExp, StraightThroughRound
from .functions import fake_quantize, fused_gelu, fused_silu, fused_swiglu, logsumexp, ste_round
from .saved_tensors import saved_tensor_bytes, saved_tensors_log
from .checkpoint import checkpoint, checkpoint_with_hooks
from .accumulation import accumulate_grads

__all__ = [
    "Variable", "enable_grad", "is_grad_enabled", "no_grad", "set_grad_enabled",
    "AccumulateGrad", "GraphRoot", "Node", "OpNode",
    "BACKWARD_FORMULAS", "unbroadcast", "use_formulas",
    "backward", "compute_dependencies", "grad", "use_backward",
    "FakeQuantize", "FusedGeLU", "FusedSiLU", "FusedSwiGLU", "LogSumExp", "StraightThroughRound",
    "fake_quantize", "fused_gelu", "fused_silu", "fused_swiglu", "logsumexp", "ste_round",
    "saved_tensor_bytes", "saved_tensors_log", "checkpoint", "checkpoint_with_hooks", "accumulate_grads",
]
