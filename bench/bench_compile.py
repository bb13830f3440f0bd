"""Compile chapter benchmark: the capstone GPT's forward, eager against ``torch.compile``, and what compiling costs.

One ``Measurement`` per variant, all on the same model, batch and device (inference: ``torch.no_grad``,
bf16 autocast on CUDA, fp32 on the CPU):

- ``forward[eager]``: plain PyTorch, the baseline (``torch_ms`` of every row);
- ``forward[whole]``: ``torch.compile(model)``: one graph for the whole model, the most fusion;
- ``forward[regional]``: ``compile_blocks(model)`` (the chapter's exercise): each block compiled in place,
  one graph reused by every block, so compile time does not grow with depth;
- ``forward[reduce-overhead]`` (CUDA only): the whole model with ``mode="reduce-overhead"``: the compiled
  graph is recorded into a CUDA graph and replayed with one launch.

``extra["compile_s"]`` is the first call of each compiled variant: Dynamo's tracing, AOTAutograd,
Inductor's code generation and the C++/Triton build (and autotuning). Each variant starts from an
empty Dynamo cache; Inductor's on-disk cache (``TORCHINDUCTOR_CACHE_DIR``) is left as it is, so a
second run of the suite measures a warm compile: the JSON says which (``extra["inductor_cache"]``).
FLOPs per forward: 2 x parameters x tokens for the matmuls plus 4 x n_layer x n_embd x T x tokens for
attention (nanoGPT's count, forward only). On CUDA the model is the ``gpu`` preset (10.65 M parameters,
B=64, T=256); with ``ctx.small`` (the CPU) it is tiny and the numbers only show that every variant runs.

Run alone: ``python bench/bench_compile.py`` (prints the table).
"""
from __future__ import annotations

import contextlib
import copy
import os
import time
from types import SimpleNamespace

import torch

from ptinternals.benchmark import H200_BF16_DENSE_FLOPS, Measurement, time_ms
from ptinternals.compile.speed import compile_blocks
from ptinternals.gpt import GPT, make_config

SUITE = "compile"


def _config(ctx):
    if ctx.small:
        return make_config("cpu", dict(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32, batch_size=4,
                                       dropout=0.0, device=ctx.device))
    return make_config("gpu", dict(vocab_size=65, dropout=0.0, device=ctx.device))


def _flops(model: GPT, cfg) -> int:
    tokens = cfg.batch_size * cfg.block_size
    return int((2 * model.num_params() + 4 * cfg.n_layer * cfg.n_embd * cfg.block_size) * tokens)


def _inductor_cache_state() -> str:
    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join("/tmp", f"torchinductor_{os.getlogin()}" if
                                                                        hasattr(os, "getlogin") else "torchinductor")
    try:
        return "warm" if any(os.scandir(folder)) else "cold"
    except OSError:
        return "cold"


def _variants(device: str) -> list[str]:
    variants = ["eager", "whole", "regional"]
    if device == "cuda" and os.environ.get("PTI_COMPILE_BENCH_CUDAGRAPHS", "1") != "0":
        variants.append("reduce-overhead")
    return variants


def _compiled(model: GPT, variant: str):
    if variant == "eager":
        return model
    if variant == "whole":
        return torch.compile(model)
    if variant == "regional":
        return compile_blocks(model)
    return torch.compile(model, mode="reduce-overhead")


def _forward_fn(run_model, idx, autocast):
    def step():
        with torch.no_grad(), autocast:
            return run_model(idx)[0]

    return step


def forward(ctx) -> list[Measurement]:
    cfg = _config(ctx)
    device = ctx.device
    torch.manual_seed(0)
    base = GPT(cfg).to(device).eval()
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.block_size), generator=g).to(device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()
    cache = _inductor_cache_state()
    tokens = cfg.batch_size * cfg.block_size
    flops = _flops(base, cfg)
    rows, eager_ms, eager_out = [], None, None
    for variant in _variants(device):
        torch._dynamo.reset()
        model = copy.deepcopy(base)
        step = _forward_fn(_compiled(model, variant), idx, autocast)

        t0 = time.perf_counter()
        out = step()                                  # compiles (and autotunes) on the first call
        if device == "cuda":
            torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        kw = {} if device == "cuda" else {"warmup": 1, "reps": 5}
        ms = time_ms(step, device, **kw)
        if variant == "eager":
            eager_ms, eager_out = ms, out.float()
        diff = float((out.float() - eager_out).abs().max())
        rows.append(Measurement(
            suite=SUITE, name=f"forward[{variant}]", device=device,
            shape=f"B={cfg.batch_size},T={cfg.block_size},L={cfg.n_layer},C={cfg.n_embd}",
            dtype="bf16-autocast" if device == "cuda" else "fp32", ms=ms, flops=flops, torch_ms=eager_ms,
            extra={"tokens_per_s": tokens / (ms * 1e-3), "vs_eager": eager_ms / ms,
                   "compile_s" if variant != "eager" else "first_call_s": first_s,
                   "max_abs_diff_vs_eager": diff, "inductor_cache": cache if variant != "eager" else None,
                   "mfu_h200": flops / (ms * 1e-3) / H200_BF16_DENSE_FLOPS if device == "cuda" else None,
                   "params_M": base.num_params() / 1e6}))
        del step, model
    torch._dynamo.reset()
    return rows


def run(ctx) -> list[Measurement]:
    return forward(ctx)


if __name__ == "__main__":
    from ptinternals.device import pick_device

    device = pick_device()
    for m in run(SimpleNamespace(device=device, small=device != "cuda", peaks=None)):
        e = m.extra
        print(f"{m.name:28s} {m.shape:26s} {m.ms:9.2f} ms  {e['tokens_per_s'] / 1e3:9.1f}k tok/s  x{e['vs_eager']:.2f}"
              + (f"  compile {e['compile_s']:.1f} s ({e['inductor_cache']} Inductor cache)" if "compile_s" in e else ""))
