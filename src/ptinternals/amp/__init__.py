"""The amp chapter, mixed precision (AMP).

- ``formats``: fp32/tf32/bf16/fp16/fp8 layouts, ``decompose``, ``encode``/``decode`` (exercises amp.decode, amp.decompose)
- ``rounding``: fp32 -> bf16/fp16 by integer ops, bit-exact vs ``tensor.to`` (exercises amp.fp32_to_bf16_bits, amp.fp32_to_fp16_bits)
- ``autocast_policy`` / ``inspector``: autocast's cast lists and a dispatch mode that shows the
  dtype every op ran in (exercise amp.predict_dtypes: predict the dtype of each layer)
- ``scaler_kernels``: ``update_scale`` and the unscale/inf-check kernel (exercise amp.update_scale)
- ``grad_scaler``: ``GradScaler`` from scratch, equal to ``torch.amp.GradScaler`` (exercise amp.grad_scaler)
- ``trainer``: manual mixed precision with fp32 master weights (exercises amp.amp_train, amp.amp_speed) and its autocast
  reference; ``scaffold``: the MLP it trains (visible to graded code: no solution inside)
- ``exercises``: the graded exercises and their checkers
"""

from .autocast_policy import autocast_output_dtype, autocast_policy
from .formats import FORMATS, Decomposed, FloatFormat, decode, decompose, describe, encode, get_format
from .grad_scaler import GradScaler, OptState
from .inspector import (
    AutocastDtypeMode,
    OpRecord,
    ProbeNet,
    inspect_autocast,
    layer_output_dtypes,
    predict_probe_dtypes,
)
from .rounding import bf16_bits_to_fp32, fp16_bits_to_fp32, fp32_to_bf16_bits, fp32_to_fp16_bits, round_fp32
from .scaler_kernels import amp_foreach_non_finite_check_and_unscale_, amp_update_scale_, update_scale
from .trainer import (
    UNDERFLOW_CONFIG,
    MLPConfig,
    make_regression_data,
    reference_autocast_train_steps,
    train_steps,
)

__all__ = [
    "FORMATS",
    "Decomposed",
    "FloatFormat",
    "decode",
    "decompose",
    "describe",
    "encode",
    "get_format",
    "fp32_to_bf16_bits",
    "fp32_to_fp16_bits",
    "bf16_bits_to_fp32",
    "fp16_bits_to_fp32",
    "round_fp32",
    "update_scale",
    "amp_update_scale_",
    "amp_foreach_non_finite_check_and_unscale_",
    "GradScaler",
    "OptState",
    "MLPConfig",
    "UNDERFLOW_CONFIG",
    "make_regression_data",
    "train_steps",
    "reference_autocast_train_steps",
    "autocast_policy",
    "autocast_output_dtype",
    "AutocastDtypeMode",
    "OpRecord",
    "ProbeNet",
    "inspect_autocast",
    "layer_output_dtypes",
    "predict_probe_dtypes",
]
