"""The dispatch chapter: the dispatcher, ``__torch_dispatch__`` and ``torch.library``.

Modules (each names the PyTorch source it mirrors):

    keys             DispatchKey order, the 64-bit DispatchKeySet, tensor and thread-local key sets
    operator_entry   an operator's dispatch table from its registrations (alias keys, fallbacks)
    dispatcher       predict_dispatch / explain_dispatch: which kernels run, in order   [exercise]
    recorded_path    probe operators that record the keys the real dispatcher ran (no solutions)
    modes            OpLogger, MemoryTracker, HiddenCopyDetector, FunctionLogger
    flops            FlopCounter, a TorchDispatchMode counting FLOPs incl. CPU attention [exercise]
    tracing          AtenTracer / trace_forward_backward: the ATen graph of fwd+bwd      [exercise]
    quantized        QuantizedTensor, an int8 wrapper subclass that survives training    [exercise]
    custom_ops       ptinternals::fused_bias_gelu via torch.library.custom_op            [exercise]
    fake_memory      estimate_training_memory with FakeTensorMode                        [exercise]
    (its graded exercises are in ptinternals.checks.dispatch, checked against real torch)

Importing this package registers ``ptinternals::fused_bias_gelu`` (once; re-registration replaces it).
"""
from .custom_ops import define_fused_bias_gelu, fused_bias_gelu
from .dispatcher import DispatchError, DispatchStep, TensorDesc, explain_dispatch, predict_dispatch
from .fake_memory import estimate_training_memory, training_step_memory
from .flops import FlopCounter, count_flops
from .keys import DispatchKeySet, LocalDispatchKeySet, tensor_key_set, tls_key_sets
from .modes import FunctionLogger, HiddenCopyDetector, MemoryTracker, OpLogger, function_vs_dispatch
from .operator_entry import compute_dispatch_table, dispatch_table_from_torch, registrations_from_torch
from .quantized import QuantizedTensor, quantize_linear_weights
from .tracing import AtenGraph, AtenTracer, trace_forward_backward

__all__ = [
    "DispatchKeySet", "LocalDispatchKeySet", "tensor_key_set", "tls_key_sets",
    "compute_dispatch_table", "dispatch_table_from_torch", "registrations_from_torch",
    "TensorDesc", "DispatchStep", "DispatchError", "explain_dispatch", "predict_dispatch",
    "OpLogger", "MemoryTracker", "HiddenCopyDetector", "FunctionLogger", "function_vs_dispatch",
    "FlopCounter", "count_flops",
    "AtenGraph", "AtenTracer", "trace_forward_backward",
    "QuantizedTensor", "quantize_linear_weights",
    "fused_bias_gelu", "define_fused_bias_gelu",
    "estimate_training_memory", "training_step_memory",
]
