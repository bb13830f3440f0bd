"""Compiled-mode checks without a GPU: compile the real kernels for sm_90 (Hopper) offline.

The interpreter runs anything numpy can; a GPU compile is stricter. Here ``triton.compile`` with a
``GPUTarget("cuda", 90, 32)`` checks, in a process where the kernels are compiled-mode functions,
that the autotune configs chosen for the H200 fit its shared memory, use ``wgmma`` (SASS HGMMA),
spill no registers, and that ``tl.dot`` on 8 x 8 blocks - fine in the interpreter - is rejected.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import triton

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin"

SCRIPT = r'''
import json
import triton.language as tl
from triton.compiler import CompilationError
from ptinternals.kernels import attention, blocked_matmul
from ptinternals.kernels.offline_compile import compile_for_gpu

out = {}
mm = dict(a_ptr="*fp16", b_ptr="*fp16", c_ptr="*fp16", M=4096, N=4096, K=4096, stride_am=4096, stride_ak=1,
          stride_bk=4096, stride_bn=1, stride_cm=4096, stride_cn=1,
          INPUT_PRECISION=("c", "ieee"), UPCAST=("c", False))
cfg = blocked_matmul.GPU_CONFIGS[0]
r = compile_for_gpu(blocked_matmul.matmul_kernel, {**mm, **{k: ("c", v) for k, v in cfg.kwargs.items()}},
                    num_warps=cfg.num_warps, num_stages=cfg.num_stages)
out["matmul"] = dict(shared=r.shared_bytes, spill=r.spill_bytes, wgmma=r.uses_wgmma)
S, D = 4096, 64
fa = dict(Q="*bf16", K="*bf16", V="*bf16", O="*bf16", LSE="*fp32", sm_scale=0.125, H=16, SEQ_Q=S, SEQ_K=S,
          HEAD_DIM=("c", D), BLOCK_D=("c", D), CAUSAL=("c", True), UPCAST=("c", False),
          BLOCK_M=("c", 128), BLOCK_N=("c", 64))
for t in "qkvo":   # (B, H, S, D) contiguous: strides (H*S*D, S*D, D, 1)
    seq = "m" if t in "qo" else "n"
    fa.update({f"stride_{t}b": 16 * S * D, f"stride_{t}h": S * D, f"stride_{t}{seq}": D, f"stride_{t}d": 1})
r = compile_for_gpu(attention.flash_attention_fwd_kernel, fa, num_warps=4, num_stages=3)
out["attention"] = dict(shared=r.shared_bytes, spill=r.spill_bytes, wgmma=r.uses_wgmma)
try:
    tiny = {"BLOCK_M": ("c", 8), "BLOCK_N": ("c", 8), "BLOCK_K": ("c", 8), "GROUP_SIZE_M": ("c", 1)}
    compile_for_gpu(blocked_matmul.matmul_kernel, {**mm, **tiny}, num_warps=1, num_stages=1)
    out["dot8"] = "compiled"
except CompilationError:
    out["dot8"] = "rejected"
print("RESULT " + json.dumps(out))
'''


@pytest.mark.skipif(not (BIN / "ptxas").exists() or not (BIN / "cuobjdump").exists(),
                    reason="this triton wheel ships no ptxas/cuobjdump")
def test_kernels_compile_for_hopper():
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"offline compile failed:\n{proc.stderr[-3000:]}"
    out = json.loads(lines[0][len("RESULT "):])
    from ptinternals.kernels.offline_compile import SM90_MAX_SHARED

    for name in ("matmul", "attention"):
        r = out[name]
        assert r["wgmma"], f"{name}: tl.dot did not become wgmma (HGMMA) on sm_90"
        assert r["spill"] == 0, f"{name}: {r['spill']} bytes of registers spilled to local memory"
        assert 0 < r["shared"] <= SM90_MAX_SHARED, f"{name}: {r['shared']} B of shared memory"
    assert out["dot8"] == "rejected", "tl.dot on 8x8 blocks should not compile for a GPU (min 16)"
