"""PyTorch Internals, hands-on: the course's reference implementations and shared machinery.

One subpackage per chapter holds a reference implementation that mirrors what PyTorch does in C++:

    strides       storage, sizes, strides and views        (c10/core/TensorImpl, ATen computeStride)
    autograd      a reverse-mode engine                     (torch/csrc/autograd/engine.cpp)
    dispatch      dispatch keys, modes, subclasses          (c10/core/DispatchKeySet, torch/_ops.py)
    allocator     the CUDA caching allocator                (c10/cuda/CUDACachingAllocator.cpp)
    amp           float formats, autocast, GradScaler       (torch/amp/grad_scaler.py)
    distributed   collectives, DDP, ZeRO, FSDP              (torch/csrc/distributed/c10d/reducer.cpp)
    kernels       Triton kernels                            (Triton tutorials, flash-attention)
    gpt           the capstone mini-GPT                     (nanoGPT)

Shared machinery lives in one place each: ``device`` (which device runs), ``grading`` (checkers,
the trusted grading boundary, the instructor CLI), ``quiz`` (quiz widgets) and ``viz`` (figures).

This ``__init__`` imports nothing on purpose: the grading sandbox imports ``ptinternals`` while the
reference subpackages are hidden from student code.
"""

__version__ = "0.1.0"
