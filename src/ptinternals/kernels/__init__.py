"""The kernels chapter, Triton kernels: the kernels PyTorch runs for you, written by hand.

``common`` is imported first: on a machine without CUDA it turns the Triton interpreter on before
any ``@triton.jit`` is defined. Then one module per kernel (named after the Triton tutorial it
follows), each a Triton kernel plus the torch-facing wrapper that checks inputs and launches it.

=====================  ==========================================================================
``vector_add``         the SPMD model: programs, ``program_id``, blocks, masks, strides
``fused_softmax``      fusion for a memory-bound op; the online (multi-block) softmax; coalescing
``layernorm``          forward + backward, the two-stage reduction for dweight/dbias
``blocked_matmul``     tiling, ``tl.dot``, grouped program order, ``num_warps``/``num_stages``, autotune
``attention``          flash attention forward (online softmax over K/V tiles, causal stages)
``attention_backward`` its backward: dK/dV and dQ kernels rebuilding P from the saved logsumexp
``custom_op``          a kernel as a real operator: ``torch.library.custom_op``, fake, autograd
``costs``              bytes and FLOPs per kernel, the roofline (see ``ptinternals.viz.kernels``)
``inductor``           reading the Triton code ``torch.compile`` generates (on the CPU too)
``offline_compile``    compiling for sm_90 without a GPU: shared memory, registers, wgmma
=====================  ==========================================================================

The chapter's graded checks live in ``ptinternals.checks.kernels`` (imported by the grader, not here).
"""
from . import common  # noqa: F401  (sorts first, and must: it sets TRITON_INTERPRET before triton is imported)
from .attention import flash_attention, flash_attention_forward
from .attention_backward import flash_attention_backward
from .blocked_matmul import matmul
from .fused_softmax import softmax
from .layernorm import layer_norm, layer_norm_backward, layer_norm_forward
from .vector_add import add

__all__ = [
    "add", "softmax", "layer_norm", "layer_norm_forward", "layer_norm_backward", "matmul",
    "flash_attention", "flash_attention_forward", "flash_attention_backward",
]
