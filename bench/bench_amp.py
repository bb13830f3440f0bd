"""Mixed precision's speed and memory win on a GPT-like block: fp32 vs bf16 autocast vs fp16 + GradScaler.

One training step = forward, cross-entropy, backward, AdamW step (fp32 master weights in every
variant: autocast only changes the compute dtype). Reported per variant: ms per step, tokens/s,
TFLOP/s from the usual estimate (6 * params * tokens for the matmuls + 12 * layers * d * T * tokens
for attention), peak CUDA memory, and ratios against fp32 in ``extra``.

The fp16 row is measured twice: with this chapter's ``ptinternals.amp.GradScaler`` (``ms``) and with
``torch.amp.GradScaler`` (``torch_ms``) in the same run.

On the CPU (``ctx.small``) the model is tiny and the numbers only show the code runs: CPU bf16/fp16
matmuls (without AMX) are 12-18x *slower* than fp32, and peak memory is not measured (no CUDA
allocator statistics). On an H200, bf16 tensor cores are ~16x fp32's (non-tf32) rate, and
activations saved for backward halve.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from ptinternals.amp.grad_scaler import GradScaler
from ptinternals.benchmark import Measurement, time_ms


class Block(torch.nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)); x + mlp(ln(x)). x: (B, T, d)."""

    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)  # 3 x (B, T, d)
        q, k, v = (
            t.view(B, T, self.n_head, d // self.n_head).transpose(1, 2) for t in (q, k, v)
        )  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(torch.nn.Module):
    def __init__(self, vocab: int, d: int, n_layer: int, n_head: int, ctx_len: int):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(ctx_len, d)
        self.blocks = torch.nn.ModuleList(Block(d, n_head) for _ in range(n_layer))
        self.ln_f, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))  # (B, T, d)
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))  # (B, T, vocab)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _sizes(small: bool) -> dict:
    if small:
        return dict(vocab=128, d=64, n_layer=1, n_head=4, ctx_len=32, batch=4)
    return dict(vocab=8192, d=1024, n_layer=4, n_head=16, ctx_len=1024, batch=8)


def _flops_per_step(model: TinyGPT, s: dict) -> int:
    n_params = sum(p.numel() for n, p in model.named_parameters() if not n.startswith(("tok", "pos")))
    tokens = s["batch"] * s["ctx_len"]
    return int(6 * n_params * tokens + 12 * s["n_layer"] * s["d"] * s["ctx_len"] * tokens)


def _make_step(device: str, s: dict, dtype, scaler):
    torch.manual_seed(0)
    model = TinyGPT(s["vocab"], s["d"], s["n_layer"], s["n_head"], s["ctx_len"]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, s["vocab"], (s["batch"], s["ctx_len"]), device=device)
    targets = torch.roll(idx, -1, dims=1)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=dtype) if dtype is not None else nullcontext():
            loss = model(idx, targets)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return loss

    return model, step


def _peak_bytes(device: str, step) -> int | None:
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated())


def run(ctx) -> list[Measurement]:
    device, small = ctx.device, ctx.small
    s = _sizes(small)
    tokens = s["batch"] * s["ctx_len"]
    shape = f"B={s['batch']} T={s['ctx_len']} d={s['d']} L={s['n_layer']} V={s['vocab']}"
    reps = dict(warmup=1, reps=3) if small else {}
    variants = [  # (name, autocast dtype, scaler factory for ours, scaler factory for torch's)
        ("fp32", None, None, None),
        ("bf16_autocast", torch.bfloat16, None, None),
        (
            "fp16_autocast_gradscaler",
            torch.float16,
            lambda: GradScaler(device),
            lambda: torch.amp.GradScaler(device),
        ),
    ]
    results, base = [], {}
    for name, dtype, ours, theirs in variants:
        model, step = _make_step(device, s, dtype, ours() if ours else None)
        flops = _flops_per_step(model, s)
        step()  # first step: lazy init of the scaler and optimizer state
        ms = time_ms(step, device, **reps)
        peak = _peak_bytes(device, step)
        torch_ms = None
        if theirs is not None:
            del model, step
            _, ref_step = _make_step(device, s, dtype, theirs())
            ref_step()
            torch_ms = time_ms(ref_step, device, **reps)
        if name == "fp32":
            base = {"ms": ms, "peak": peak}
        extra = {
            "tokens_per_s": tokens / (ms * 1e-3),
            "speedup_vs_fp32": base["ms"] / ms,
            "peak_mem_bytes": peak if peak is not None else "not measured on cpu (no CUDA allocator stats)",
            "mem_ratio_vs_fp32": (peak / base["peak"]) if peak and base.get("peak") else None,
        }
        if device == "cpu":
            extra["note"] = (
                "CPU run: bf16/fp16 matmuls without AMX are 12-18x slower than fp32 here; "
                "the low-precision rows are not expected to be faster"
            )
        if torch_ms is not None:
            extra["torch_ms_is"] = "same step with torch.amp.GradScaler instead of ptinternals.amp.GradScaler"
        results.append(
            Measurement(
                suite="amp",
                name=name,
                device=device,
                shape=shape,
                dtype=str(dtype or torch.float32).replace("torch.", ""),
                ms=ms,
                flops=flops,
                torch_ms=torch_ms,
                extra=extra,
            )
        )
    return results


if __name__ == "__main__":  # python bench/bench_amp.py
    from types import SimpleNamespace

    from ptinternals.device import pick_device

    dev = pick_device()
    for m in run(SimpleNamespace(device=dev, small=dev == "cpu", peaks=None)):
        tf = m.tflops
        print(
            f"{m.name:28s} {m.ms:9.2f} ms  {m.extra['tokens_per_s']:12.0f} tok/s  "
            f"{(tf if tf is not None else math.nan):7.3f} TFLOP/s  "
            f"x{m.extra['speedup_vs_fp32']:.2f} vs fp32  "
            f"peak {m.extra['peak_mem_bytes']}"
        )
