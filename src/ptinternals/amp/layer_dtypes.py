"""The dtype each layer of a small model outputs under autocast, predicted from the cast policies.

The chapter's exercise amp.predict_dtypes names its layers (``"linear"``, ``"layer_norm"``,
``"add_fp32"``, ...); each is one aten op applied to the running activation ``h`` and, for some, an
fp32 tensor the model owns. ``autocast_policy.autocast_output_dtype`` decides each op from its policy
on the device (lower_precision_fp, fp32, fp32_set_opt_dtype, or not listed: type promotion):

    layer          aten op        floating inputs    CPU            CUDA
    linear         linear         h, weight (fp32)   low            low
    matmul         matmul         h, weight (fp32)   low            low
    layer_norm     layer_norm     h                  h's dtype      fp32
    softmax, sum   softmax, sum   h                  h's dtype      fp32 (fp32_set_opt_dtype)
    add_fp32       add            h, r (fp32)        promotion: fp32
    mse_loss       mse_loss       h, y (fp32)        fp32           fp32

``layer_norm``'s fp32 weight and bias do not promote its output: ATen's layer norm accepts a bf16/fp16
input with fp32 parameters and returns the input's dtype (checked against real autocast in
tests/amp/test_exercises.py). This module imports no torch itself (the policies do), so the exercise's
"no torch" rule can be checked on it.
"""

from __future__ import annotations

from .autocast_policy import autocast_output_dtype

# layer name -> (aten op, dtypes of its floating inputs besides h)
LAYERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "linear": ("linear", ("float32",)),
    "matmul": ("matmul", ("float32",)),
    "relu": ("relu", ()),
    "gelu": ("gelu", ()),
    "layer_norm": ("layer_norm", ()),
    "softmax": ("softmax", ()),
    "log_softmax": ("log_softmax", ()),
    "exp": ("exp", ()),
    "pow": ("pow", ()),
    "add_fp32": ("add", ("float32",)),
    "mul_scalar": ("mul", ()),
    "sum": ("sum", ()),
    "mse_loss": ("mse_loss", ("float32",)),
    "cross_entropy": ("cross_entropy", ()),  # the int64 targets are not floating: autocast leaves them
}


def predict_dtypes(layers, device_type, autocast_dtype, input_dtype="float32") -> list[str]:
    """The output dtype name of each of ``layers`` applied in turn to ``h`` (``input_dtype``) under
    ``torch.autocast(device_type, dtype=autocast_dtype)``."""
    if not isinstance(layers, (list, tuple)):
        raise TypeError(f"layers must be a list of layer names, got {type(layers).__name__}")
    out, current = [], input_dtype
    for i, layer in enumerate(layers):
        if layer not in LAYERS:
            raise ValueError(f"layers[{i}] must be one of {sorted(LAYERS)}, got {layer!r}")
        op, others = LAYERS[layer]
        current = autocast_output_dtype(op, [current, *others], device_type, autocast_dtype)
        out.append(current)
    return out
