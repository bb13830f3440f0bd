"""Autocast's cast policies, as data: which op runs in low precision, in fp32, or at the widest input.

Inside ``torch.autocast(device_type, dtype)`` the Autocast dispatch key (one per device: AutocastCPU,
AutocastCUDA) sits above Autograd. For a registered op it casts the floating-point tensor arguments
and redispatches; unregistered ops fall through and run in whatever dtype their inputs have.

    lower_precision_fp   cast fp32 inputs to the autocast dtype (fp16/bf16): matmuls, convs, linear
    fp32                 cast inputs to fp32: ops whose range or accuracy suffers in fp16 (exp, log,
                         pow, norms, most losses)
    fp32_set_opt_dtype   call the op with dtype=float32 (softmax, log_softmax, sum, cumsum, prod):
                         low-precision input, fp32 accumulation and output (CUDA only)
    fp32_append_dtype    same idea for ``norm`` overloads without a dtype argument (CUDA only)
    promote              cast all inputs to the widest input dtype (addcmul, cat on CPU, ...); an
                         input in the other 16-bit dtype (fp16 under bf16 autocast) is an error
    fp16                 cast to float16 whatever the autocast dtype: ``_cudnn_rnn``, registered only by
                         CUDA builds with cuDNN (aten/src/ATen/cudnn/AutocastRNN.cpp)
    (not listed)         run in the input dtype: relu, gelu, add, dropout, view ops ...

CPU versus CUDA (aten/src/ATen/autocast_mode.cpp): the lower-precision lists agree on the matmul
family, but the CPU fp32 list holds mostly losses, linalg and FFT ops. exp, log, pow, softmax,
log_softmax, layer_norm, group_norm, sum are fp32 on CUDA and *not listed* on CPU: on the CPU an op
given bf16 input stays bf16, and only the losses are pushed back to fp32. Default autocast dtype:
bfloat16 on CPU, float16 on CUDA. On CUDA ``binary_cross_entropy`` is banned (use the
``_with_logits`` form, which is on the fp32 list).

Composite ops that autocast does not list (``cross_entropy_loss`` on CUDA) decompose below it into
listed ops (``log_softmax`` -> fp32, ``nll_loss`` -> fp32), so their output follows those: the table
records the net effect under ``COMPOSITE``.

Weight cache: casts of fp32 leaf tensors that require grad (the weights) to the autocast dtype are
cached until the outermost autocast region exits, so a weight used twice is cast once (and its
two gradients are summed in low precision before the single cast back). ``cache_enabled=False``
turns this off. ``inspector.inspect_autocast`` shows both.

Mirrors aten/src/ATen/autocast_mode.cpp (CPU lists) and aten/src/ATen/autocast_mode.h
(AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE, AT_FORALL_PROMOTE) as
written in torch 2.13, then cut down at import to the ops the installed torch's dispatcher has an
Autocast kernel for: torch 2.11 has no CUDA rule for ``rms_norm`` (2.13 added it to the fp32 list), and
a CPU-only build registers no ``_cudnn_rnn`` rule. (2.11 also lists named-tensor overloads such as
``softmax.Dimname``, which 2.13 deleted; policies here are per op name, so nothing changes.)
"""

from __future__ import annotations

import torch

_CUDA_LOWER = frozenset(
    """
_convolution conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d convolution
prelu addmm addmv addr matmul einsum mm mv linalg_vecdot linear addbmm baddbmm bmm chain_matmul
linalg_multi_dot _thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell
_scaled_dot_product_flash_attention scaled_dot_product_attention cudnn_convolution cudnn_convolution_transpose
""".split()
)
_CUDA_FP32 = frozenset(
    """
acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow softplus layer_norm
native_layer_norm rms_norm group_norm frobenius_norm nuclear_norm cosine_similarity poisson_nll_loss
cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss
mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss triplet_margin_loss multi_margin_loss
binary_cross_entropy_with_logits dist pdist cdist renorm logsumexp
upsample_nearest1d _upsample_nearest_exact1d
upsample_nearest2d _upsample_nearest_exact2d upsample_nearest3d _upsample_nearest_exact3d upsample_linear1d
upsample_bilinear2d _upsample_bilinear2d_aa upsample_trilinear3d upsample_bicubic2d _upsample_bicubic2d_aa
""".split()
)
_CUDA_FP32_SET_OPT_DTYPE = frozenset(
    "prod softmax log_softmax cumprod cumsum linalg_vector_norm linalg_matrix_norm sum".split()
)
_CUDA_PROMOTE = frozenset(
    "addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add".split()
)

_CPU_LOWER = frozenset(
    """
conv1d conv2d conv3d bmm mm linalg_vecdot baddbmm addmm _addmm_activation addbmm linear _convolution matmul
conv_tbc mkldnn_rnn_layer conv_transpose1d conv_transpose2d conv_transpose3d prelu
scaled_dot_product_attention _native_multi_head_attention
""".split()
)
_CPU_FP32 = frozenset(
    """
avg_pool3d binary_cross_entropy grid_sampler polar prod quantile nanquantile stft cdist grid_sampler_2d
_grid_sampler_2d_cpu_fallback grid_sampler_3d trace view_as_complex cholesky cholesky_inverse
cholesky_solve inverse lu_solve orgqr ormqr pinverse max_pool3d max_unpool2d max_unpool3d
adaptive_avg_pool3d reflection_pad1d reflection_pad2d replication_pad1d replication_pad2d
replication_pad3d mse_loss cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss
poisson_nll_loss smooth_l1_loss cross_entropy_loss l1_loss huber_loss margin_ranking_loss
soft_margin_loss triplet_margin_loss multi_margin_loss ctc_loss kl_div multilabel_margin_loss
binary_cross_entropy_with_logits fft_fft fft_ifft fft_fft2 fft_ifft2 fft_fftn fft_ifftn fft_rfft
fft_irfft fft_rfft2 fft_irfft2 fft_rfftn fft_irfftn fft_hfft fft_ihfft linalg_cond linalg_matrix_rank
linalg_solve linalg_cholesky linalg_svdvals linalg_eigvals linalg_eigvalsh linalg_inv
linalg_householder_product linalg_tensorinv linalg_tensorsolve fake_quantize_per_tensor_affine geqrf
_lu_with_info qr svd triangular_solve fractional_max_pool2d fractional_max_pool3d adaptive_max_pool3d
multilabel_margin_loss_forward linalg_qr linalg_cholesky_ex linalg_svd linalg_eig linalg_eigh
linalg_lstsq linalg_inv_ex
""".split()
)
_CPU_PROMOTE = frozenset("stack cat index_copy".split())

WRITTEN_POLICIES = {
    "cuda": {
        "lower_precision_fp": _CUDA_LOWER,
        "fp32": _CUDA_FP32,
        "fp32_set_opt_dtype": _CUDA_FP32_SET_OPT_DTYPE,
        "fp32_append_dtype": frozenset({"norm"}),
        "promote": _CUDA_PROMOTE,
        "fp16": frozenset({"_cudnn_rnn"}),
    },
    "cpu": {"lower_precision_fp": _CPU_LOWER, "fp32": _CPU_FP32, "promote": _CPU_PROMOTE},
}
_AUTOCAST_KEY = {"cuda": "AutocastCUDA", "cpu": "AutocastCPU"}


def registered_autocast_ops(device_type: str) -> frozenset:
    """Names of the aten ops the installed torch has a kernel for at Autocast<device> (any overload)."""
    key = _AUTOCAST_KEY[device_type]
    return frozenset(op[len("aten::"):].split(".")[0] for op in torch._C._dispatch_get_all_op_names()
                     if op.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(op, key))


_REGISTERED = {device: registered_autocast_ops(device) for device in _AUTOCAST_KEY}  # ~0.1 s
POLICIES = {device: {policy: ops & _REGISTERED[device] for policy, ops in table.items()}
            for device, table in WRITTEN_POLICIES.items()}
# Unlisted composite ops whose decomposition is listed: net policy (device -> op -> policy).
COMPOSITE = {
    "cuda": {"cross_entropy_loss": "fp32", "cross_entropy": "fp32"},
    "cpu": {"cross_entropy": "fp32"},
}
BANNED = {"cuda": frozenset({"binary_cross_entropy"}), "cpu": frozenset()}

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "bool": torch.bool,
}


def dtype_name(dtype: "torch.dtype | str") -> str:
    """torch.float16 -> "float16"; accepts names ("fp16", "half", "torch.bfloat16") too."""
    if isinstance(dtype, torch.dtype):
        return str(dtype).replace("torch.", "")
    if not isinstance(dtype, str):
        raise TypeError(f"dtype must be a torch.dtype or a name, got {type(dtype).__name__}")
    key = dtype.replace("torch.", "").strip().lower()
    key = {
        "fp32": "float32",
        "float": "float32",
        "fp16": "float16",
        "half": "float16",
        "bf16": "bfloat16",
        "fp64": "float64",
        "double": "float64",
        "long": "int64",
    }.get(key, key)
    if key not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return key


def _check_device_type(device_type: str) -> str:
    if device_type not in POLICIES:
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    return device_type


def autocast_policy(op: str, device_type: str) -> str:
    """The cast policy autocast applies to aten op ``op`` ("linear", "softmax", ...) on ``device_type``.

    Returns "lower_precision_fp", "fp32", "fp32_set_opt_dtype", "fp32_append_dtype", "promote", "fp16"
    or "none" (not listed: the op runs in its inputs' dtype). The installed torch decides which ops
    are listed (see the module docstring).
    """
    if not isinstance(op, str) or not op:
        raise TypeError(f"op must be a non-empty aten op name like 'linear', got {op!r}")
    device_type = _check_device_type(device_type)
    name = op.replace("aten.", "").replace("aten::", "").split(".")[0]
    if name in BANNED[device_type]:
        raise RuntimeError(
            f"{name} is banned under {device_type} autocast (unsafe in fp16): "
            "use binary_cross_entropy_with_logits"
        )
    for policy, ops in POLICIES[device_type].items():
        if name in ops:
            return policy
    return COMPOSITE[device_type].get(name, "none")


def autocast_output_dtype(
    op: str, input_dtypes, device_type: str, autocast_dtype: "torch.dtype | str"
) -> str:
    """Predict the dtype of ``op``'s (first) output under ``torch.autocast(device_type, autocast_dtype)``.

    ``input_dtypes`` lists the dtypes of the op's tensor inputs (names or torch dtypes). Integer
    inputs (indices, targets) are not cast by autocast and do not take part in promotion here.
    """
    device_type = _check_device_type(device_type)
    low = dtype_name(autocast_dtype)
    if low not in ("float16", "bfloat16"):
        raise ValueError(f"autocast_dtype must be float16 or bfloat16, got {autocast_dtype!r}")
    if not isinstance(input_dtypes, (list, tuple)) or len(input_dtypes) == 0:
        raise ValueError("input_dtypes must be a non-empty list of dtypes")
    names = [dtype_name(d) for d in input_dtypes]
    floating = [n for n in names if n in ("float16", "bfloat16", "float32", "float64")]
    if not floating:
        raise ValueError(f"input_dtypes must contain a floating-point dtype, got {names}")
    if "float64" in floating:
        raise ValueError("float64 inputs are not eligible for autocast: this predictor covers fp32/fp16/bf16")
    policy = autocast_policy(op, device_type)
    if policy == "lower_precision_fp":
        return low
    if policy == "fp16":
        return "float16"
    if policy.startswith("fp32"):
        return "float32"
    if policy == "promote":
        # at::autocast::prioritize: start from the autocast dtype; any fp32 input wins; an input in
        # the *other* low-precision dtype (fp16 under a bf16 autocast) is an error in torch
        current = low
        for n in floating:
            if current == "float32" or n == "float32":
                current = "float32"
            elif n != low:
                raise RuntimeError(
                    f"Unexpected floating ScalarType in at::autocast::prioritize: a {n} input "
                    f"under {low} autocast (promote op {op!r})"
                )
        return current
    # unlisted ops: ordinary type promotion among the floating inputs
    out = _DTYPES[floating[0]]
    for n in floating[1:]:
        out = torch.promote_types(out, _DTYPES[n])
    return dtype_name(out)
