"""What every kernel wrapper in this chapter shares: where Triton runs, input checks, launch sizes.

Triton runs a kernel in one of two ways (``ptinternals.device.triton_mode``):

- **compiled** on a CUDA device: ``@triton.jit`` lowers the Python to Triton IR, then to PTX and a
  cubin for the GPU in hand (``triton/compiler/compiler.py``), once per signature (dtypes, the
  ``tl.constexpr`` values, and which integer arguments equal 1 or are multiples of 16).
- **interpreted** on the CPU (``TRITON_INTERPRET=1``, ``triton/runtime/interpreter.py``): every
  program of the grid runs one after another as numpy code. Slow, but ``print`` and ``breakpoint()``
  work inside a kernel, which makes it *the* debugging tool. The switch is read when a function is
  decorated, so it must be set before the first ``@triton.jit`` is defined - including Triton's own
  ``tl.max``/``tl.sum``, defined when ``triton.language`` is first imported. Importing this package on
  a machine without CUDA sets it (``ptinternals/kernels/__init__.py`` imports this module first), and
  ``tests/conftest.py`` does the same.

Differences of the interpreter that shape the kernels here (measured with triton 3.6-3.9):
bf16 arithmetic gives garbage, so every kernel upcasts to fp32 right after ``tl.load`` (also the
right thing on a GPU for reductions: torch's "opmath" type); ``@triton.autotune`` over several
configs needs a GPU to time them, so :func:`autotune` keeps one config off the GPU; an unmasked
out-of-bounds access corrupts the host heap instead of raising.
"""
from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
    if "triton.language" in sys.modules:  # its own @jit helpers (tl.max, tl.sum...) are compiled-only now
        raise RuntimeError(
            "triton.language was imported before TRITON_INTERPRET=1 was set, and this machine has no "
            "CUDA: set os.environ['TRITON_INTERPRET'] = '1' before the first 'import triton'"
        )
    os.environ["TRITON_INTERPRET"] = "1"  # before any @triton.jit (including triton's own) is defined

import triton  # noqa: E402

#: True when the kernels of this package were defined under the Triton interpreter.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

#: dtypes the elementwise and reduction kernels accept (they compute in fp32, or fp64 for fp64).
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: dtypes the ``tl.dot`` kernels accept (tensor cores: fp16/bf16; fp32 goes through tf32 or ieee).
DOT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def acc_dtype(dtype: torch.dtype):
    """The dtype a kernel computes in (its ``ACC_DTYPE`` constexpr): fp64 for fp64, else fp32.

    fp16/bf16 are storage formats here: loads upcast at once, like torch's ``opmath_type``
    (aten/src/ATen/OpMathType.h), and stores round back to the output's dtype.
    """
    import triton.language as tl

    return tl.float64 if dtype == torch.float64 else tl.float32


def check_tensor(name: str, t, *, dtypes=FLOAT_DTYPES, ndim: int | None = None, min_ndim: int = 0) -> None:
    """Raise a TypeError/ValueError naming ``name`` unless ``t`` is a tensor a kernel can read.

    A kernel gets a raw pointer plus the strides we pass it, so it can read any dtype-correct
    tensor on a device Triton runs on: CUDA (compiled) or CPU (only with the interpreter on).
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({allowed}), got {str(t.dtype).replace('torch.', '')}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if t.dim() < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape {tuple(t.shape)}")
    if t.device.type == "cuda":
        return
    if t.device.type == "cpu":
        if not INTERPRET:
            raise ValueError(
                f"{name} is on the CPU, but Triton runs CPU tensors only in the interpreter: set "
                "TRITON_INTERPRET=1 before ptinternals.kernels is first imported"
            )
        return
    raise ValueError(f"{name} must be on a CUDA device or the CPU, got device {t.device}")


def check_same(names: tuple[str, ...], tensors: tuple, *, dtype: bool = True) -> None:
    """Raise a ValueError/TypeError unless all ``tensors`` share one device (and dtype)."""
    first = tensors[0]
    for n, t in zip(names[1:], tensors[1:], strict=True):
        if t.device != first.device:
            raise ValueError(f"{n} is on {t.device} but {names[0]} is on {first.device}: "
                             "move them to one device")
        if dtype and t.dtype != first.dtype:
            raise TypeError(f"{n} has dtype {t.dtype} but {names[0]} has {first.dtype}: "
                            "cast them to one dtype")


def check_block(name: str, value: int, *, minimum: int = 1) -> None:
    """A block size is a power of two (``tl.arange`` needs one) and at least ``minimum``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= {minimum}, got {value}")


def num_warps_for(block_size: int) -> int:
    """Warps per program for a one-row kernel holding ``block_size`` elements in registers.

    More warps = more threads sharing one row: each thread keeps block_size / (32 * num_warps)
    values. The thresholds are Liger-Kernel's ``calculate_settings`` (src/liger_kernel/ops/utils.py).
    """
    if block_size >= 32768:
        return 32
    if block_size >= 8192:
        return 16
    if block_size >= 2048:
        return 8
    return 4


def multiprocessor_count(device: torch.device) -> int:
    """SMs on a GPU (132 on an H100/H200 SXM); on the CPU a small number, so the interpreter is quick."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def autotune(configs: list, cpu_config, key: list[str], **kwargs):
    """``@triton.autotune`` over ``configs`` on a GPU; over the single ``cpu_config`` otherwise.

    Autotuning times every config with ``do_bench`` on first use of each ``key`` value (e.g. each
    new (M, N, K)) and caches the winner; without a GPU there is nothing to time it on ("0 active
    drivers"), and with one config the autotuner skips timing.
    """
    if INTERPRET or not torch.cuda.is_available():
        return triton.autotune(configs=[cpu_config], key=key, **kwargs)
    return triton.autotune(configs=configs, key=key, **kwargs)


next_power_of_2 = triton.next_power_of_2
cdiv = triton.cdiv
