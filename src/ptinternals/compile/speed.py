"""Compiled versus eager for the capstone model ``ptinternals.gpt.model.GPT`` (torch/_inductor).

What ``torch.compile`` buys is the removal of overheads that eager mode pays per op: the Python and
dispatcher cost of launching each op, and the memory round trip of every intermediate that a fused
kernel keeps in registers. What it costs is **compile time**, paid on the first call of every new
guard set: Dynamo traces the Python, AOTAutograd traces the backward, Inductor generates C++ or
Triton and a compiler builds it. Inductor keeps its compiled graphs on disk
(``TORCHINDUCTOR_CACHE_DIR``, by default ``/tmp/torchinductor_<user>``), so a second process that
compiles the same graph skips code generation and the C++ build; Dynamo's tracing is paid again.

Two ways to compile a transformer:

- the **whole model** (``torch.compile(model)``): one graph for everything, the most fusion;
- **regional** compilation (``block.compile()`` for each block): every block runs the same code on
  parameters of the same shapes, so Dynamo traces one block, compiles it once, and reuses the compiled
  graph for all ``n_layer`` blocks (parameters are graph *inputs*, not constants). Compile time no
  longer grows with depth; the embedding and the head stay eager.

On a CPU the gain for a small model is modest (its time is mostly matmuls, which compiled code calls
in the same library as eager); on a GPU, where launch overhead and memory traffic dominate small ops,
it is larger. The numbers are measurements on the machine at hand, printed, never asserted.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

from ..benchmark import time_ms

__all__ = ["SpeedReport", "compare_gpt", "compile_blocks"]


@dataclass
class SpeedReport:
    how: str                  # "whole model" or "regional (per block)"
    device: str
    batch: int
    seq_len: int
    threads: int
    compile_s: float          # the first compiled call: tracing + code generation (or cache load)
    eager_ms: float           # median forward time, eager
    compiled_ms: float        # median forward time, compiled
    max_abs_diff: float       # |compiled - eager| over the logits

    @property
    def speedup(self) -> float:
        return self.eager_ms / self.compiled_ms

    @property
    def tokens_per_s(self) -> tuple[float, float]:
        """(eager, compiled) tokens per second of forward."""
        tokens = self.batch * self.seq_len
        return tokens / (self.eager_ms * 1e-3), tokens / (self.compiled_ms * 1e-3)

    def __str__(self) -> str:
        e, c = self.tokens_per_s
        return (f"{self.how} on {self.device} ({self.threads} thread(s)), batch {self.batch} x {self.seq_len}: "
                f"compile {self.compile_s:.1f} s; eager {self.eager_ms:.2f} ms ({e:,.0f} tok/s), "
                f"compiled {self.compiled_ms:.2f} ms ({c:,.0f} tok/s): {self.speedup:.2f}x; "
                f"max |diff| {self.max_abs_diff:.1e}")


def compile_blocks(model: torch.nn.Module, backend="inductor", **options) -> torch.nn.Module:
    """Regional compilation: compile every transformer block of the GPT in place, return the model.

    ``nn.Module.compile`` swaps the block's call for a compiled one (``block._compiled_call_impl``), so
    the model object and its ``state_dict`` stay as they are. All blocks share ``Block.forward``'s code
    and their parameters are graph inputs, so Dynamo compiles one graph and every block reuses it.
    """
    blocks = getattr(getattr(model, "transformer", None), "h", None)
    if not isinstance(blocks, torch.nn.ModuleList) or len(blocks) == 0:
        raise TypeError(f"model must be a ptinternals.gpt.GPT (blocks in model.transformer.h), got "
                        f"{type(model).__name__}")
    for block in blocks:
        block.compile(backend=backend, **options)
    return model


def compare_gpt(model: torch.nn.Module | None = None, *, batch: int = 8, seq_len: int | None = None,
                regional: bool = False, threads: int | None = 1, reps: int = 10, device: str = "cpu",
                seed: int = 0) -> SpeedReport:
    """Time the capstone GPT's forward (inference, no grad) eager and compiled with Inductor.

    ``model``: a ``ptinternals.gpt.GPT`` (default: the ``cpu`` preset with a 65-character vocabulary).
    ``threads``: torch's CPU threads during the timing (1 gives steadier numbers on a shared machine;
    None leaves the setting alone). The model is copied, so the caller's model is not compiled.
    """
    from ..gpt import GPT, GPTConfig

    if model is None:
        torch.manual_seed(seed)
        model = GPT(GPTConfig(vocab_size=65, dropout=0.0))
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a ptinternals.gpt.GPT, got {type(model).__name__}")
    seq_len = model.config.block_size if seq_len is None else seq_len
    for name, value in (("batch", batch), ("seq_len", seq_len), ("reps", reps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if seq_len > model.config.block_size:
        raise ValueError(f"seq_len must be <= block_size={model.config.block_size}, got {seq_len}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        eager = copy.deepcopy(model).to(device).eval()
        compiled = copy.deepcopy(eager)
        if regional:
            run_compiled = compile_blocks(compiled)
        else:
            run_compiled = torch.compile(compiled)
        g = torch.Generator().manual_seed(seed)
        idx = torch.randint(0, model.config.vocab_size, (batch, seq_len), generator=g).to(device)
        with torch.no_grad():
            t0 = time.perf_counter()
            out_compiled = run_compiled(idx)[0]
            if device == "cuda":
                torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
            out_eager = eager(idx)[0]
            diff = float((out_compiled - out_eager).abs().max())
            eager_ms = time_ms(lambda: eager(idx), device, reps=reps)
            compiled_ms = time_ms(lambda: run_compiled(idx), device, reps=reps)
    finally:
        torch.set_num_threads(old_threads)
    return SpeedReport("regional (per block)" if regional else "whole model", device, batch, seq_len,
                       threads or old_threads, compile_s, eager_ms, compiled_ms, diff)
