"""The kernels chapter benchmark: each Triton kernel against torch's own op, same device, same run.

``run(ctx)`` returns one ``Measurement`` per (kernel, shape, dtype) with bytes and FLOPs
(``ptinternals.kernels.costs``), torch's time in ``torch_ms``, and in ``extra``: the roofline
position against the H200 datasheet (``h200_*``) and against the peaks measured in this run
(``meas_*``, when ``ctx.peaks`` is given), the largest difference from torch's output
(``max_abs_err``), and ``target_vs_torch``, the speed ratio the GPU check expects (None = no target).

On CUDA the sizes are the real ones (softmax 4096 x 4096, layer norm 4096 x 8192, matmul 4096^3,
attention B=4, H=16, S=4096, D=64); with ``ctx.small`` (the CPU, where Triton runs in its
interpreter) they are tiny so the run takes seconds, and the numbers only show the plumbing works.

Run alone: ``python bench/bench_kernels.py`` (prints the table).
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from ptinternals.benchmark import Measurement, time_ms
from ptinternals.kernels import (
    add,
    flash_attention_backward,
    flash_attention_forward,
    layer_norm_backward,
    layer_norm_forward,
    matmul,
    softmax,
)
from ptinternals.kernels.costs import (
    H200_PEAKS,
    KernelCost,
    add_cost,
    attention_cost,
    layer_norm_cost,
    matmul_cost,
    roofline_fractions,
    softmax_cost,
)

SUITE = "kernels"


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _measure(ctx, name: str, shape: str, dtype: torch.dtype, cost: KernelCost, ours, theirs,
             target: float | None) -> Measurement:
    """Run both once (autotuning, compiling, and a correctness check), then time both."""
    got, want = ours(), theirs()
    if isinstance(got, tuple):
        got, want = got[0], want[0]
    err = (got.float() - want.float()).abs().max().item() if got.numel() else 0.0
    kw = {} if ctx.device == "cuda" else {"warmup": 0, "reps": 2}   # interpreter: slow; ours() ran above
    ms = time_ms(ours, ctx.device, **kw)
    torch_ms = time_ms(theirs, ctx.device, **kw)
    m = Measurement(suite=SUITE, name=name, device=ctx.device, shape=shape, dtype=_dt(dtype), ms=ms,
                    bytes_moved=cost.bytes_moved, flops=cost.flops, torch_ms=torch_ms)
    m.extra.update(max_abs_err=err, target_vs_torch=target if ctx.device == "cuda" else None,
                   triton_mode="compiled" if ctx.device == "cuda" else "interpreter")
    m.extra.update({f"h200_{k}": v for k, v in roofline_fractions(m, H200_PEAKS).items()})
    if getattr(ctx, "peaks", None) is not None:
        m.extra.update({f"meas_{k}": v for k, v in roofline_fractions(m, ctx.peaks).items()})
    return m


def _sizes(small: bool) -> dict:
    if small:
        return dict(add=[3000], softmax=[(16, 300)], softmax_online=[(8, 300, 64)], layer_norm=[(16, 200)],
                    matmul=[(64, 48, 80)], attention=[(1, 2, 64, 32)],
                    float_dtypes=[torch.float32], dot_dtypes=[torch.float32])
    return dict(add=[1 << 28], softmax=[(4096, 4096), (1024, 32768)], softmax_online=[(1024, 65536, 8192)],
                layer_norm=[(4096, 8192)], matmul=[(4096, 4096, 4096)], attention=[(4, 16, 4096, 64)],
                float_dtypes=[torch.float16, torch.bfloat16, torch.float32],
                dot_dtypes=[torch.float16, torch.bfloat16])


def run(ctx) -> list[Measurement]:
    dev, small = ctx.device, bool(ctx.small)
    sz = _sizes(small)
    g = torch.Generator(device=dev).manual_seed(0)
    randn = lambda *shape, dtype: torch.randn(*shape, generator=g, device=dev, dtype=dtype)
    out: list[Measurement] = []

    for n in sz["add"]:                                   # memory-bound: GB/s against HBM
        x, y = randn(n, dtype=torch.float32), randn(n, dtype=torch.float32)
        out.append(_measure(ctx, "add", f"({n},)", x.dtype, add_cost(n, x.dtype),
                            partial(add, x, y), partial(torch.add, x, y), target=None))

    for dtype in sz["float_dtypes"]:
        for (r, c) in sz["softmax"]:
            x = randn(r, c, dtype=dtype)
            out.append(_measure(ctx, "softmax", f"({r}, {c})", dtype, softmax_cost(r, c, dtype),
                                partial(softmax, x), partial(torch.softmax, x, -1), target=1.0))
        for (r, c, block) in sz["softmax_online"]:        # rows wider than one block: reads x twice
            x = randn(r, c, dtype=dtype)
            out.append(_measure(ctx, "softmax_online", f"({r}, {c}) block {block}", dtype,
                                softmax_cost(r, c, dtype), partial(softmax, x, block_size=block),
                                partial(torch.softmax, x, -1), target=None))
        if dtype == torch.float32 and not small:
            continue                                      # layer norm: fp16/bf16 are the cases that matter
        for (r, c) in sz["layer_norm"]:
            x, w, b = randn(r, c, dtype=dtype), randn(c, dtype=dtype), randn(c, dtype=dtype)
            out.append(_measure(ctx, "layer_norm_fwd", f"({r}, {c})", dtype, layer_norm_cost(r, c, dtype),
                                partial(layer_norm_forward, x, w, b, 1e-5),
                                partial(torch.native_layer_norm, x, [c], w, b, 1e-5), target=1.0))
            dy = randn(r, c, dtype=dtype)
            _, mean, rstd = layer_norm_forward(x, w, b, 1e-5)
            _, t_mean, t_rstd = torch.native_layer_norm(x, [c], w, b, 1e-5)   # torch's own saved statistics
            out.append(_measure(ctx, "layer_norm_bwd", f"({r}, {c})", dtype,
                                layer_norm_cost(r, c, dtype, backward=True),
                                partial(layer_norm_backward, dy, x, w, mean, rstd),
                                partial(torch.ops.aten.native_layer_norm_backward, dy, x, [c], t_mean, t_rstd,
                                        w, b, [True, True, True]),
                                target=1.0))

    for dtype in sz["dot_dtypes"]:                         # compute-bound: TFLOP/s against the tensor cores
        for (m, n, k) in sz["matmul"]:
            a, b = randn(m, k, dtype=dtype), randn(k, n, dtype=dtype)
            out.append(_measure(ctx, "matmul", f"({m}, {n}, {k})", dtype, matmul_cost(m, n, k, dtype),
                                partial(matmul, a, b), partial(torch.matmul, a, b), target=0.9))
        for (bsz, h, s, d) in sz["attention"]:
            q, k, v, do = (randn(bsz, h, s, d, dtype=dtype) for _ in range(4))
            for causal in (False, True):
                shape = f"({bsz}, {h}, {s}, {d}){' causal' if causal else ''}"
                out.append(_measure(ctx, "attention_fwd", shape, dtype,
                                    attention_cost(bsz, h, s, s, d, dtype, causal),
                                    partial(flash_attention_forward, q, k, v, causal),
                                    partial(_sdpa, q, k, v, causal), target=0.8))
                o, lse = flash_attention_forward(q, k, v, causal)
                qr, kr, vr = (t.detach().requires_grad_() for t in (q, k, v))
                o_ref = _sdpa(qr, kr, vr, causal)
                out.append(_measure(ctx, "attention_bwd", shape, dtype,
                                    attention_cost(bsz, h, s, s, d, dtype, causal, backward=True),
                                    partial(flash_attention_backward, do, q, k, v, o, lse, causal),
                                    partial(torch.autograd.grad, o_ref, (qr, kr, vr), do, retain_graph=True),
                                    target=None))
    return out


def _sdpa(q, k, v, causal):
    """torch's attention; on CUDA pinned to the FlashAttention-2 backend, the one to beat."""
    if q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16):   # FA2 has no fp32
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


if __name__ == "__main__":
    from types import SimpleNamespace

    from ptinternals.benchmark import measure_peaks
    from ptinternals.device import describe, pick_device
    from ptinternals.kernels.costs import format_report

    device = pick_device()
    small = device != "cuda"
    ctx = SimpleNamespace(device=device, small=small, peaks=measure_peaks(device, small=small))
    print(describe(device))
    print(format_report(run(ctx), ctx.peaks))
