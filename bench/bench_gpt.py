"""Capstone benchmark: training throughput of the GPT per variant, and the GPU preset run itself.

Throughput (one ``Measurement`` per variant): a full training step (forward, cross-entropy,
backward, clipping, AdamW) of the same model on the same batch, in tokens/s:

- ``eager``: plain PyTorch (``F.layer_norm``, ``F.scaled_dot_product_attention``: on an H100/H200
  that is FlashAttention-2 inside torch) - the baseline, also stored as ``torch_ms`` in every row;
- ``kernels``: the course's Triton layer norm and flash attention as custom ops (``kernels="all"``);
- ``compile``: ``torch.compile`` of the eager model (Inductor writes fused Triton kernels itself);
  its cold compile time is in ``extra["compile_s"]``.

FLOPs per step use nanoGPT's ``estimate_mfu`` count: 6 * N * tokens for the matmuls plus
12 * L * C * T * tokens for attention; ``extra["mfu_h200"]`` is the fraction of the H200's dense
bf16 peak. On CUDA the model is the ``gpu`` preset (10.65 M parameters, B=64, T=256, bf16
autocast); with ``ctx.small`` (the CPU) it is tiny, the Triton kernels run in the interpreter, and
the numbers only show that every variant runs.

On CUDA with ``ctx.small`` False, the ``gpu`` preset is also *trained* (``preset_run`` row): wall time
and final validation loss against nanoGPT's reference (val loss 1.4697 after about 3 minutes on an
A100). Cap it for a short device check with ``ctx.gpt_max_iters`` or the environment variable
``PTI_GPT_BENCH_ITERS`` (default: the preset's 5000), and pick its kernels with ``ctx.gpt_kernels`` /
``PTI_GPT_BENCH_KERNELS`` (default "none").

Run alone: ``python bench/bench_gpt.py`` (prints the table).
"""
from __future__ import annotations

import os
import time
from types import SimpleNamespace

import torch

from ptinternals.benchmark import H200_BF16_DENSE_FLOPS, Measurement, time_ms
from ptinternals.gpt import GPT, make_config
from ptinternals.gpt.train import train, train_step

SUITE = "gpt"
NANOGPT_A100_WALL_S = 180.0      # "about 3 minutes" (nanoGPT README, shakespeare_char on one A100)
NANOGPT_VAL_LOSS = 1.4697        # its reported best validation loss
TARGET_VAL_LOSS = 1.47


def _config(ctx):
    if ctx.small:
        return make_config("cpu", dict(vocab_size=65, block_size=32, n_layer=1, n_head=2, n_embd=32, batch_size=4,
                                       device=ctx.device))
    return make_config("gpu", dict(vocab_size=65, device=ctx.device))


def _flops_per_step(model: GPT, cfg) -> int:
    tokens = cfg.batch_size * cfg.block_size
    per_token = 6 * model.num_params() + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size
    return int(per_token * tokens)


def _step_fn(cfg, variant: str, device: str):
    """(a callable running one training step, the model, seconds spent compiling)."""
    torch.manual_seed(0)
    model = GPT(cfg.replace(kernels="all" if variant == "kernels" else "none")).to(device)
    optimizer = model.configure_optimizers(device)
    run_model = torch.compile(model) if variant == "compile" else model
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.block_size), generator=g).to(device)
    y = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.block_size), generator=g).to(device)
    amp_dtype = torch.bfloat16 if device == "cuda" else None

    def step():
        return train_step(run_model, optimizer, None, [(x, y)], amp_dtype, cfg.grad_clip)

    t0 = time.perf_counter()
    step()                                   # autotuning, compiling (and a check that it runs)
    if device == "cuda":
        torch.cuda.synchronize()
    return step, model, time.perf_counter() - t0


def throughput(ctx) -> list[Measurement]:
    cfg = _config(ctx)
    rows, eager_ms = [], None
    for variant in ("eager", "kernels", "compile"):
        step, model, first_s = _step_fn(cfg, variant, ctx.device)
        kw = {} if ctx.device == "cuda" else {"warmup": 0, "reps": 1 if variant == "kernels" else 3}
        ms = time_ms(step, ctx.device, **kw)
        eager_ms = ms if variant == "eager" else eager_ms
        tokens = cfg.batch_size * cfg.block_size
        flops = _flops_per_step(model, cfg)
        rows.append(Measurement(
            suite=SUITE, name=f"train_step[{variant}]", device=ctx.device,
            shape=f"B={cfg.batch_size},T={cfg.block_size},L={cfg.n_layer},C={cfg.n_embd}",
            dtype="bf16-autocast" if ctx.device == "cuda" else "fp32", ms=ms, flops=flops, torch_ms=eager_ms,
            extra={"tokens_per_s": tokens / (ms * 1e-3), "vs_eager": eager_ms / ms,
                   "mfu_h200": flops / (ms * 1e-3) / H200_BF16_DENSE_FLOPS,
                   "compile_s" if variant == "compile" else "first_step_s": first_s,
                   "params_M": model.num_params() / 1e6,
                   "target": "kernels >= eager tokens/s" if variant == "kernels" else None}))
        del step, model
    return rows


def preset_run(ctx) -> Measurement:
    iters = int(getattr(ctx, "gpt_max_iters", None) or os.environ.get("PTI_GPT_BENCH_ITERS", 5000))
    kernels = getattr(ctx, "gpt_kernels", None) or os.environ.get("PTI_GPT_BENCH_KERNELS", "none")
    cfg = make_config("gpu", dict(max_iters=iters, lr_decay_iters=max(iters, 100), kernels=kernels,
                                  memory_report=True, log_interval=500))
    t0 = time.perf_counter()
    result = train(cfg)
    wall = time.perf_counter() - t0
    steps = len(result.history["loss"])
    return Measurement(
        suite=SUITE, name=f"preset_run[gpu,kernels={kernels}]", device=ctx.device,
        shape=f"iters={iters},B=64,T=256,L=6,C=384", dtype="bf16-autocast", ms=wall * 1e3,
        flops=_flops_per_step(result.model, cfg) * steps,
        extra={"val_loss": result.final_val_loss, "train_loss": result.final_train_loss, "wall_s": wall,
               "tokens_per_s": result.tokens_per_s, "target_val_loss": TARGET_VAL_LOSS,
               "nanogpt_val_loss": NANOGPT_VAL_LOSS, "nanogpt_a100_wall_s": NANOGPT_A100_WALL_S,
               "meets_val_loss": result.final_val_loss <= TARGET_VAL_LOSS if iters >= 5000 else None,
               "faster_than_nanogpt": wall < NANOGPT_A100_WALL_S if iters >= 5000 else None,
               "peak_allocated_MiB": (result.memory or {}).get("peak_allocated", 0) / 2**20,
               "peak_reserved_MiB": (result.memory or {}).get("peak_reserved", 0) / 2**20,
               "sample": result.sample[:200]})


def run(ctx) -> list[Measurement]:
    rows = throughput(ctx)
    if ctx.device == "cuda" and not ctx.small:
        rows.append(preset_run(ctx))
    return rows


if __name__ == "__main__":
    from ptinternals.device import pick_device

    device = pick_device()
    for m in run(SimpleNamespace(device=device, small=device != "cuda", peaks=None)):
        e = m.extra
        print(f"{m.name:32s} {m.shape:28s} {m.ms:10.2f} ms  {e.get('tokens_per_s', 0) / 1e3:9.1f}k tok/s"
              + (f"  x{e['vs_eager']:.2f} vs eager" if "vs_eager" in e else "")
              + (f"  val {e['val_loss']:.4f} in {e['wall_s']:.0f} s" if "val_loss" in e else ""))
