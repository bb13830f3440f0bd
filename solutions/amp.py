# %% [markdown]
# # {{title}}
#
# A float32 number costs 4 bytes; bfloat16 and float16 cost 2. Halving the bytes halves the memory
# traffic of every activation, and on a GPU the 16-bit matrix units (tensor cores) run many times
# faster than fp32 arithmetic. **Mixed precision** takes that win where it is safe (the matmuls) and
# keeps fp32 where it is needed (the weights the optimizer updates, the losses, some reductions).
# PyTorch packages it as two tools: `torch.autocast`, which decides per op which dtype to run in, and
# `torch.amp.GradScaler`, which keeps fp16 gradients from vanishing.
#
# This chapter takes both apart. You will read floats bit by bit and round them by hand exactly as
# `tensor.to(torch.bfloat16)` does (c10's `BFloat16.h` and `Half.h`), predict what autocast does to
# each layer (ATen's `autocast_mode.cpp`), write `GradScaler` from scratch and match torch's scale
# trajectory step for step (`torch/amp/grad_scaler.py`, `AmpGradScalerKernels.cpp`), and build a
# mixed-precision training step by hand, with fp32 master weights, loss scaling, gradient clipping
# and accumulation, that matches autocast + GradScaler.
#
# **How this notebook works.** Run the cells in order. Each exercise has an *answer cell* (replace
# `raise NotImplementedError()` with your code) followed by a *check cell* that gives instant
# feedback. Only the code inside answer cells is graded; define any helper you need inside the same
# answer cell. The grader runs your code in a separate process, without the course's reference
# implementation, on many more cases than the visible ones, and compares with real PyTorch. Quiz
# answers are recorded in `amp.answers.json` beside this notebook: *practice* questions check your
# answer at once and count no points; *graded* ones only record it (the last answer counts) and are
# scored when your notebook is graded.
#
# A word on speed: this notebook runs on a CPU. bf16/fp16 matmuls on a CPU without AMX units are
# *slower* than fp32 (12-18x here), so everything below is tiny, and the speed half of the last
# check needs a GPU.

# %% [setup]
import math

import torch
import torch.nn.functional as F

from ptinternals.amp.scaffold import UNDERFLOW_CONFIG, MLPConfig, init_mlp_params, make_regression_data, mlp_forward
from ptinternals.grading import check
from ptinternals.quiz import quiz_progress, show_quiz
from ptinternals.viz.amp import draw_bit_layout, draw_dynamic_range

torch.manual_seed(0)

# %% [markdown]
# ## 1. Floating-point formats, bit by bit
#
# A binary float is three fields: a **sign** bit, an **exponent** field of `E` bits and a **mantissa**
# (fraction) field of `M` bits. With `bias = 2**(E-1) - 1`:
#
# | exponent field | meaning | value |
# |---|---|---|
# | `1 .. 2**E - 2` | normal | `(-1)**sign * 1.mantissa * 2**(exponent - bias)` (an implicit leading 1) |
# | `0` | zero or **subnormal** | `(-1)**sign * 0.mantissa * 2**(1 - bias)` (no implicit 1: gradual underflow) |
# | `2**E - 1` (all ones) | inf (mantissa 0) or NaN (mantissa != 0) | |
#
# | format | bits | E | M | bias | eps = 2**-M | smallest normal | smallest subnormal | largest finite |
# |---|---|---|---|---|---|---|---|---|
# | fp32 | 32 | 8 | 23 | 127 | 1.2e-7 | 2**-126 ~ 1.2e-38 | 2**-149 ~ 1.4e-45 | 3.4e38 |
# | tf32 | 19 | 8 | 10 | 127 | 9.8e-4 | 2**-126 | | 3.4e38 |
# | bf16 | 16 | 8 | 7 | 127 | 7.8e-3 | 2**-126 | 2**-133 | 3.39e38 |
# | fp16 | 16 | 5 | 10 | 15 | 9.8e-4 | 2**-14 ~ 6.1e-5 | 2**-24 ~ 6.0e-8 | 65504 |
# | fp8 e5m2 | 8 | 5 | 2 | 15 | 0.25 | 2**-14 | 2**-16 | 57344 |
# | fp8 e4m3fn | 8 | 4 | 3 | 7 | 0.125 | 2**-6 | 2**-9 | 448 |
#
# **bf16** is fp32 with the mantissa cut to 7 bits: the same exponent, so the same range, and 8
# significant bits (7 stored plus the implicit leading 1), about 2.4 decimal digits (8 x log10 2): 1.0
# and 1.004 are the same bf16 number. **fp16** spends its bits on the mantissa (11 significant bits,
# about 3.3 digits) and pays
# in range: nothing above 65504, nothing below 6e-8. **tf32** is not a storage format: NVIDIA's tensor
# cores read fp32 operands and multiply only their top 10 mantissa bits (PyTorch's
# `torch.backends.cuda.matmul.allow_tf32`). The **fp8** formats (Hopper and later) come in two
# flavours: e5m2 (fp16's range, 2 mantissa bits) for gradients, and e4m3fn for weights and
# activations, where "fn" means *finite*: it has no infinities, gives the all-ones exponent back to
# ordinary numbers, and keeps only `S.1111.111` for NaN, so its largest value is 1.75 * 2**8 = 448.
#
# `torch.finfo` knows these constants:

# %%
for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float8_e5m2, torch.float8_e4m3fn):
    fi = torch.finfo(dtype)
    print(f"{str(dtype):22s} bits {fi.bits:2d}  eps {fi.eps:<10.3g} smallest normal {fi.smallest_normal:<10.3g} "
          f"max {fi.max:.6g}")

# %% [markdown]
# The same value, rounded into each format, bit by bit (`ptinternals.viz.amp.draw_bit_layout`).
# 0.1 has no finite binary expansion, so every format keeps as many of its bits as it can; note the
# relative error grow as the mantissa shrinks.

# %%
draw_bit_layout(0.1)

# %% [markdown]
# To read a bit pattern in torch, reinterpret the bytes with `Tensor.view(dtype)` (a bit cast, no
# conversion): `torch.tensor([0x3C00], dtype=torch.int16).view(torch.float16)` is fp16's 1.0.

# %%
print(torch.tensor([0x3C00, 0x0001, 0x7BFF, 0x7C00], dtype=torch.int16).view(torch.float16).tolist())

# %% [markdown]
# ### {{exercise decode}}: what a bit pattern is worth
#
# Write `decode(bits, fmt)`: the value (a Python float) of the unsigned integer bit pattern `bits` in
# format `fmt` (a key of `FORMATS`, given at the top of the answer cell: `fp32`, `bf16`, `fp16`,
# `fp8_e5m2`, `fp8_e4m3fn`). Return `math.inf`/`-math.inf` and `math.nan` for the special patterns; remember that
# `fp8_e4m3fn` has no infinities. Plain Python only (`math.ldexp(m, e)` computes `m * 2**e`
# exactly); torch, numpy and struct are unavailable in this exercise.

# %% [answer decode]
import math

# The formats of this chapter: name -> (exponent bits, mantissa bits). Every one has 1 sign bit.
FORMATS = {"fp32": (8, 23), "bf16": (8, 7), "fp16": (5, 10), "fp8_e5m2": (5, 2), "fp8_e4m3fn": (4, 3)}


def decode(bits, fmt):
    """The value of the bit pattern `bits` (an int) in format `fmt`, e.g. decode(0x3C00, "fp16") == 1.0."""
    ### BEGIN SOLUTION
    # twin: ptinternals.amp.formats.decode
    e_bits, m_bits = FORMATS[fmt]
    bias = (1 << (e_bits - 1)) - 1
    sign = -1.0 if bits >> (e_bits + m_bits) else 1.0
    exponent = (bits >> m_bits) & ((1 << e_bits) - 1)
    mantissa = bits & ((1 << m_bits) - 1)
    all_ones = (1 << e_bits) - 1
    if fmt == "fp8_e4m3fn":  # no infinities: only S.1111.111 is NaN
        if exponent == all_ones and mantissa == (1 << m_bits) - 1:
            return math.nan
    elif exponent == all_ones:
        return sign * math.inf if mantissa == 0 else math.nan
    if exponent == 0:  # zero or subnormal: 0.mantissa * 2**(1 - bias)
        return sign * math.ldexp(mantissa, 1 - bias - m_bits)
    return sign * math.ldexp((1 << m_bits) | mantissa, exponent - bias - m_bits)
    ### END SOLUTION


# %% [tests decode]
check("amp.decode", decode)
### BEGIN HIDDEN TESTS
check("amp.decode", decode, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### Rounding: to nearest, ties to even
#
# Going the other way, a value usually falls *between* two numbers of the format. IEEE 754's default,
# which every cast in PyTorch uses, is **round to nearest, ties to even**: take the nearer neighbour;
# on an exact tie take the one whose last mantissa bit is 0. Ties-to-even has no bias (half the ties
# go up, half down), where "round half up" drifts upwards over millions of additions.
#
# Two consequences. A rounding carry can ripple all the way into the exponent (1.9999999 rounds to
# 2.0 in bf16). And past the largest finite value, "nearest" is infinity: fp16 turns 65520 (halfway
# between 65504 and 2**16) into inf. Near zero, values below the smallest normal become
# **subnormals** (exponent field 0, fewer significant bits) before they become 0.

# %%
for v in (1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, 1.9999999):
    print(f"{v!r:22} -> bf16 {torch.tensor(v).bfloat16().item()!r}")
for v in (65504.0, 65519.0, 65520.0, 2**-24, 2**-25, 3 * 2**-25):
    print(f"{v!r:22} -> fp16 {torch.tensor(v).half().item()!r}")

# %% [markdown]
# ### {{exercise decompose}}: round a value into a format
#
# Write `decompose(value, fmt)`: round the Python float `value` to the nearest number of `fmt` (ties
# to even) and return its fields `(sign, exponent, mantissa)` as ints: the raw exponent field (still
# biased) and the raw mantissa field (no implicit bit). Overflow gives inf (`(sign, 2**E - 1, 0)`;
# the checker only asks `fp8_e4m3fn` about values below 464, where it does not overflow); NaN gives any
# NaN pattern; values below the smallest subnormal's half give a (signed) zero.
#
# A plan: `m, e = math.frexp(abs(value))` gives `abs(value) = m * 2**e` with `0.5 <= m < 1`, so
# `int(m * 2**53)` is an exact 53-bit integer significand. Work out the spacing of the format's
# numbers near the value (fixed below the smallest normal), divide by it with a right shift, round
# the dropped bits, then assemble the fields, letting a carry move into the exponent. Plain Python
# only.

# %% [answer decompose]
import math


def decompose(value, fmt):
    """(sign, exponent field, mantissa field) of `value` rounded to nearest-even in `fmt`."""
    ### BEGIN SOLUTION
    # twin: ptinternals.amp.formats.decompose_fields
    e_bits, m_bits = FORMATS[fmt]
    bias = (1 << (e_bits - 1)) - 1
    all_ones = (1 << e_bits) - 1
    has_inf = fmt != "fp8_e4m3fn"
    sign = 1 if math.copysign(1.0, value) < 0 else 0
    if math.isnan(value):
        return sign, all_ones, (1 << m_bits) - 1 if not has_inf else 1 << (m_bits - 1)
    if math.isinf(value):
        return sign, all_ones, 0
    a = abs(value)
    if a == 0.0:
        return sign, 0, 0
    m, e = math.frexp(a)  # a = m * 2**e, 0.5 <= m < 1
    big_m, big_e = int(m * 2**53), e - 53  # a = big_m * 2**big_e exactly
    emin = 1 - bias
    exp = max(e - 1, emin)  # the binade of a (clamped: subnormals share the smallest normal's spacing)
    shift = exp - m_bits - big_e  # spacing of fmt's numbers near a is 2**(exp - m_bits)
    q, rem = big_m >> shift, big_m & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if rem > half or (rem == half and q & 1):  # round to nearest, ties to even
        q += 1
    if q >= (1 << m_bits):  # normal (a carry may have moved q into the next binade)
        exponent, mantissa = exp + bias, q - (1 << m_bits)
        if mantissa == (1 << m_bits):
            exponent, mantissa = exponent + 1, 0
    else:  # subnormal or zero
        exponent, mantissa = 0, q
    if exponent > (all_ones - 1 if has_inf else all_ones):
        return sign, all_ones, 0  # overflow: inf
    return sign, exponent, mantissa
    ### END SOLUTION


# %% [tests decompose]
check("amp.decompose", decompose)
### BEGIN HIDDEN TESTS
check("amp.decompose", decompose, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("amp", "q1", "q2", "q4")

# %% [markdown]
# ## 2. Rounding whole tensors with integer operations
#
# `x.to(torch.bfloat16)` does not loop over Python floats: it works on the 32-bit pattern of each
# element. Reinterpret a float32 tensor with `x.view(torch.int32)` (same bytes, no copy), widen it to
# int64 so shifts never sign-extend or overflow, and everything is shifts, masks and adds:
#
# ```
# fp32:  S EEEEEEEE MMMMMMMMMMMMMMMMMMMMMMM   (1 + 8 + 23)
# bf16:  S EEEEEEEE MMMMMMM                   (1 + 8 + 7):  the top 16 bits, rounded
# fp16:  S EEEEE MMMMMMMMMM                   (1 + 5 + 10): re-bias 127 -> 15, round to 10 bits
# ```
#
# For bf16, c10 (`c10/util/BFloat16.h`, `round_to_nearest_even`) adds `0x7FFF + lsb` to the pattern and
# keeps the top half, where `lsb` is bit 16 (the last kept bit): below half an ulp the add does not
# reach bit 16, above half it carries, and an exact half carries only when the kept value is odd.
# Because bf16 keeps fp32's exponent, one rule covers normals, subnormals and overflow (the largest
# fp32 values carry into the all-ones exponent: inf). NaN is the exception: rounding a NaN's payload
# can carry it into inf or even into the sign bit, so NaNs are handled first. torch's NaN *bits*
# differ between its code paths (0x7FC0, 0xFFFF, 0x7FFF), so the checker only asks for a NaN.

# %%
x = torch.tensor([1.0, 1 + 2**-8, -2.5, float("inf")])
bits = x.view(torch.int32)  # (4,) int32, the same 16 bytes
print([hex(b & 0xFFFFFFFF) for b in bits.tolist()])
print([hex(b & 0xFFFF) for b in x.bfloat16().view(torch.int16).tolist()])

# %% [markdown]
# ### {{exercise fp32_to_bf16_bits}}: fp32 -> bf16, with integer operations
#
# Write `fp32_to_bf16_bits(x)`: for a float32 tensor `x` of any shape and layout, return an **int16**
# tensor of the same shape holding the bf16 bit patterns, so that `out.view(torch.bfloat16)` equals
# `x.to(torch.bfloat16)` bit for bit (any NaN for a NaN). Use torch integer operations on the bit
# patterns: the checker rejects code that makes a bf16 or fp16 tensor, or goes through numpy or
# struct. Leave `x` as it was: the checker reads it again after your call. (An int64 value from 0 to
# 0xFFFF becomes the right int16 pattern with `.to(torch.int16)`: the conversion wraps.)

# %% [answer fp32_to_bf16_bits]
import torch


def fp32_to_bf16_bits(x):
    """bf16 bit patterns (int16, same shape) of float32 `x`, rounded to nearest even."""
    ### BEGIN SOLUTION
    # twin: ptinternals.amp.rounding.fp32_to_bf16_bits
    u = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # 0 .. 2**32 - 1
    sign = (u >> 16) & 0x8000
    mag = u & 0x7FFFFFFF
    q, rem = mag >> 16, mag & 0xFFFF
    rounded = q + ((rem > 0x8000) | ((rem == 0x8000) & ((q & 1) == 1))).to(torch.int64)
    is_nan = mag > 0x7F800000
    out = sign | torch.where(is_nan, 0x7FC0, rounded)  # a quiet NaN (torch's NaN bits vary: any NaN will do)
    return out.to(torch.int16)
    ### END SOLUTION


# %% [tests fp32_to_bf16_bits]
check("amp.fp32_to_bf16_bits", fp32_to_bf16_bits)
### BEGIN HIDDEN TESTS
check("amp.fp32_to_bf16_bits", fp32_to_bf16_bits, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### fp16: a different exponent
#
# fp16 needs more than a cut. Its bias is 15, not 127, so the exponent is re-biased (subtract
# `(127 - 15) << 10` after shifting the pattern right by 13); the rounding and the carry still work
# on the shifted pattern. Then three ranges:
#
# * `|x| >= 65520`: rounds to inf (`0x7C00`); inf stays inf, NaN stays NaN (`0x7E00 | payload`);
# * `2**-14 <= |x|`: normal fp16, as above;
# * `|x| < 2**-14`: fp16 **subnormal**: the result counts units of `2**-24`. With the implicit 1
#   restored, `|x| = (2**23 + mant32) * 2**(exp32 - 150)`, so the count is that integer shifted right
#   by `126 - exp32` bits, rounded to nearest even (a shift of 25 or more leaves 0).
#
# c10's `fp16_ieee_from_fp32_value` (`c10/util/Half.h`) does the same with float arithmetic tricks;
# your version keeps every step visible in integers.

# %% [markdown]
# ### {{exercise fp32_to_fp16_bits}}: fp32 -> fp16, with integer operations
#
# Write `fp32_to_fp16_bits(x)`, the fp16 twin of {{exercise fp32_to_bf16_bits}}: an int16 tensor with
# `out.view(torch.float16)` equal to `x.to(torch.float16)`, bit for bit (any NaN for a NaN), for any
# shape and layout, leaving `x` unchanged. Integer operations only. You may write a helper
# `round_shift(v, shift)` (v shifted right by `shift` bits, rounded to nearest even; `shift` may be a
# tensor) and use it for both ranges.

# %% [answer fp32_to_fp16_bits]
import torch


def fp32_to_fp16_bits(x):
    """fp16 bit patterns (int16, same shape) of float32 `x`, rounded to nearest even."""
    ### BEGIN SOLUTION
    # twin: ptinternals.amp.rounding.fp32_to_fp16_bits
    def round_shift(v, shift):  # v / 2**shift, to nearest, ties to even (v >= 0, shift >= 1)
        q = v >> shift
        rem = v & ((1 << shift) - 1)
        half = 1 << (shift - 1)
        return q + ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(torch.int64)

    u = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    sign = (u >> 16) & 0x8000
    mag = u & 0x7FFFFFFF
    exp32, mant32 = mag >> 23, mag & 0x7FFFFF
    # re-bias; a carry may reach inf, and so do overflow and inf itself (exponent 255 lands far past 0x7C00)
    normal = torch.clamp(round_shift(mag, 13) - (112 << 10), max=0x7C00)
    shift = torch.clamp(126 - exp32, min=1, max=31)
    subnormal = round_shift(mant32 | (1 << 23), shift)  # units of 2**-24
    out = torch.where(exp32 >= 113, normal, torch.where(exp32 >= 1, subnormal, torch.zeros_like(u)))
    out = torch.where(mag > 0x7F800000, 0x7E00, out)  # a quiet NaN (any NaN will do)
    return (sign | out).to(torch.int16)
    ### END SOLUTION


# %% [tests fp32_to_fp16_bits]
check("amp.fp32_to_fp16_bits", fp32_to_fp16_bits)
### BEGIN HIDDEN TESTS
check("amp.fp32_to_fp16_bits", fp32_to_fp16_bits, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### Why fp16 gradients underflow and bf16 ones do not
#
# Here are the true (fp32) gradients of the small MLP this chapter trains, with a loss weight of
# 2**-20: the kind of factor that makes real gradients tiny (a loss averaged over millions of tokens,
# a small auxiliary-loss coefficient, late training). The bars below the histogram are each format's
# range: light for subnormals, dark for normals. Everything left of the red line rounds to zero in
# fp16; bf16, with fp32's exponent range, holds all of it.

# %%
cfg = UNDERFLOW_CONFIG
batches = make_regression_data(cfg, n_batches=4, batch_size=32)
weights = {n: p.requires_grad_(True) for n, p in init_mlp_params(cfg).items()}
x, y = batches[0]
pred = mlp_forward(weights, x)  # (32, 8) fp32
pred.retain_grad()
(F.mse_loss(pred, y) * cfg.loss_weight).backward()
grads = torch.cat([pred.grad.flatten()] + [p.grad.flatten() for p in weights.values()])
print(f"share of |gradients| below fp16's smallest subnormal/2 (2**-25): {(grads.abs() < 2**-25).float().mean():.0%}")
draw_dynamic_range(["fp32", "bf16", "fp16", "fp8_e5m2"], values=grads, values_label="|fp32 gradients|")

# %% [quiz]
show_quiz("amp", "q3")

# %% [markdown]
# ## 3. What autocast does
#
# `torch.autocast(device_type, dtype)` turns on a dispatch key, `AutocastCPU` or `AutocastCUDA`,
# that sits *above* Autograd ({{chapter dispatch}}). For each op it has a registered **cast policy**
# (`aten/src/ATen/autocast_mode.cpp`); it casts the floating-point arguments and redispatches, so
# autograd records the casts like any other op:
#
# | policy | what autocast does | examples |
# |---|---|---|
# | lower_precision_fp | cast fp32 inputs to the autocast dtype | `mm`, `addmm`, `linear`, `matmul`, `conv2d`, `bmm`, SDPA |
# | fp32 | cast inputs to fp32 | losses (`mse_loss`, `nll_loss`, ...); on CUDA also `exp`, `log`, `pow`, `layer_norm`, norms |
# | fp32_set_opt_dtype | call with `dtype=torch.float32` (CUDA) | `softmax`, `log_softmax`, `sum`, `cumsum`, `prod` |
# | promote | cast all inputs to the widest | `cat`, `stack` (CPU); `addcmul`, `dot` (CUDA) |
# | (not listed) | nothing: ordinary type promotion | `relu`, `gelu`, `add`, `mul`, views |
#
# The lists differ by device. CUDA puts `layer_norm`, `softmax`, `exp` and friends in fp32; **CPU
# does not list them**, so on the CPU an op given bf16 input stays bf16, and only the losses go back
# to fp32. The default autocast dtype is bf16 on the CPU and fp16 on CUDA.
#
# Seeing is believing: `ptinternals.amp.inspector.AutocastDtypeMode` is a `TorchDispatchMode`, which
# sits *below* Autocast in the dispatcher, so it sees every op after autocast has rewritten it: the
# inserted casts (`_to_copy`), and `linear` already decomposed into `t` + `addmm`. Here is the
# chapter's `ProbeNet` (Linear -> GELU -> LayerNorm -> Linear, then cross-entropy and softmax) under
# CPU bf16 autocast:

# %%
from ptinternals.amp.inspector import ProbeNet, inspect_autocast

net = ProbeNet()
xb, target = ProbeNet.example_inputs()
for r in inspect_autocast(lambda: net(xb, target)[0], device_type="cpu", dtype=torch.bfloat16):
    print(f"{r.op:18s} {', '.join(r.input_dtypes):36s} -> {r.output_dtype}")

# %% [markdown]
# Three `_to_copy`s at the start: `x`, `fc1.weight` and `fc1.bias` cast to bf16. The cross-entropy
# is computed in fp32 (a `_to_copy` back up, then `_log_softmax` and `nll_loss`), while the softmax
# of the same logits stays bf16 on the CPU.
#
# **The weight cache.** A cast of an fp32 leaf tensor that requires grad (a weight) is cached until
# the outermost autocast region exits, so a weight used twice is cast once (`at::autocast::cached_cast`).
# `cache_enabled=False` turns the cache off:

# %%
w = torch.randn(64, 64, requires_grad=True)
xs = torch.randn(8, 64)


def two_uses(x):
    return (x @ w).relu() @ w  # the same weight, twice


for cache in (True, False):
    casts = [r for r in inspect_autocast(two_uses, xs, cache_enabled=cache) if r.op == "_to_copy"]
    print(f"cache_enabled={cache}: {len(casts)} casts (x once, w {'once' if cache else 'twice'})")

# %% [markdown]
# ### {{exercise predict_dtypes}}: predict autocast's dtypes
#
# Write `predict_dtypes(layers, device_type, autocast_dtype, input_dtype="float32")`. `layers` is a
# small model as a list of op names applied in turn to a `(4, 8)` tensor `h` of dtype `input_dtype`,
# under `torch.autocast(device_type, dtype=autocast_dtype)`; return the list of the dtype names
# (`"float32"`, `"bfloat16"`, `"float16"`) each layer outputs. The ops (weights are fp32 tensors):
#
# | name | op | name | op |
# |---|---|---|---|
# | `linear` | `F.linear(h, w, b)` | `log_softmax` | `F.log_softmax(h, -1)` |
# | `matmul` | `h @ w` | `exp` | `torch.exp(h)` |
# | `relu`, `gelu` | `F.relu(h)`, `F.gelu(h)` | `pow` | `h.pow(2)` |
# | `layer_norm` | `F.layer_norm(h, (8,), ln_w, b)` | `add_fp32` | `h + r` (`r` an fp32 (4, 8) tensor) |
# | `softmax` | `F.softmax(h, -1)` | `mul_scalar` | `h * 0.5` |
# | `sum` | `h.sum(-1)` (only last) | `mse_loss`, `cross_entropy` | against fp32 / int64 targets (only last) |
#
# `device_type` is `"cpu"` or `"cuda"`. The grader runs the layers under real autocast on each
# device type (on a machine without a GPU, CUDA's autocast runs on fake CUDA tensors: the real
# dispatcher and policies, no kernels). Plain Python, no torch: predict from the rules.

# %% [answer predict_dtypes]
def predict_dtypes(layers, device_type, autocast_dtype, input_dtype="float32"):
    """The output dtype name of each layer under torch.autocast(device_type, autocast_dtype)."""
    ### BEGIN SOLUTION
    # twin: ptinternals.amp.layer_dtypes.predict_dtypes
    lower = {"linear", "matmul"}
    fp32_everywhere = {"mse_loss", "cross_entropy"}
    fp32_on_cuda = {"layer_norm", "softmax", "log_softmax", "exp", "pow", "sum"}
    out, current = [], input_dtype
    for op in layers:
        if op in lower:
            current = autocast_dtype
        elif op in fp32_everywhere or (device_type == "cuda" and op in fp32_on_cuda):
            current = "float32"
        elif op == "add_fp32":  # not listed: type promotion with an fp32 tensor
            current = "float32"
        out.append(current)  # everything else runs in its input's dtype
    return out
    ### END SOLUTION


# %% [tests predict_dtypes]
check("amp.predict_dtypes", predict_dtypes)
### BEGIN HIDDEN TESTS
check("amp.predict_dtypes", predict_dtypes, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("amp", "q5", "q6", "q11")

# %% [markdown]
# ## 4. Loss scaling and GradScaler
#
# In an fp16 backward pass, every gradient is an fp16 tensor, and the gradients of section 2 round to
# zero. **Loss scaling** multiplies the loss by a factor S before `backward()`: by the chain rule every
# gradient is S times larger, back inside fp16's range. Before the optimizer step, divide the (fp32)
# gradients by S and nothing else has changed. If S is too large, the backward overflows to inf or
# NaN: then skip that step and lower S. bf16 does not need any of this (fp32's range), which is a big
# reason it is the default on hardware that has it.
#
# Here is the provided model (the loss weight 2**-20 from above) trained in fp16 with no scaler, with
# a scaler, and in bf16, using the chapter's reference trainer (`ptinternals.amp.trainer`):

# %%
from ptinternals.amp.trainer import train_steps

runs = {
    "fp16, no scaler": train_steps(cfg, batches, 16, torch.float16),
    "fp16 + GradScaler": train_steps(cfg, batches, 16, torch.float16, scaler=torch.amp.GradScaler("cpu")),
    "bf16, no scaler": train_steps(cfg, batches, 16, torch.bfloat16),
}
for name, r in runs.items():
    first, last = sum(r["losses"][:4]) / 4, sum(r["losses"][-4:]) / 4  # one pass over the 4 batches each
    print(f"{name:18s} loss {first:.3e} -> {last:.3e} (x{last / first:.2f}); "
          f"share of exactly-zero gradient elements: {r['zero_grad_fraction'][0]:.0%}")

# %% [markdown]
# fp16 without a scaler does not train at all: every gradient element is exactly zero, and the
# optimizer has nothing to do. With the scaler, fp16 trains like bf16.
#
# ### The GradScaler algorithm
#
# `torch.amp.GradScaler` (`torch/amp/grad_scaler.py`) keeps S in a 0-dim float32 tensor and a count of
# consecutive good steps, `growth_tracker`. One iteration:
#
# ```
# scaler.scale(loss).backward()   # loss * S: every gradient is S * g
# scaler.unscale_(optimizer)      # optional, e.g. before clipping: grads *= 1/S; found_inf = any inf/NaN
# clip_grad_norm_(params, 1.0)    # on the TRUE gradients, so after unscale_
# scaler.step(optimizer)          # unscale_ if not done yet; optimizer.step() only if no inf/NaN
# scaler.update()                 # inf found: S *= backoff (0.5), tracker = 0
#                                 # else: tracker += 1; at growth_interval (2000): S *= growth (2.0), tracker = 0
# ```
#
# The two kernels are `_amp_foreach_non_finite_check_and_unscale_` and `_amp_update_scale_`
# (`aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp`, `aten/src/ATen/native/cuda/AmpKernels.cu`):
# they work on device tensors, so a training step never waits for the GPU except once, when `step`
# must decide whether to skip. Unscaling twice in one iteration would divide by S twice, so torch
# tracks a per-optimizer stage (READY -> UNSCALED -> STEPPED) and raises instead. The scale never
# grows to inf: a growth that would overflow float32 is dropped.
#
# ### {{exercise update_scale}}: the scale update
#
# Write `update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval)`
# returning `(new_scale, new_growth_tracker)`, the rule of `torch._amp_update_scale_` on Python
# numbers. The scale is stored as float32: if `scale * growth_factor` is larger than float32's largest
# value (3.4028234663852886e38), keep the old scale. The kernel grows when the count of good steps
# *reaches* `growth_interval` (`==`): a `growth_tracker` already at or past it (a checkpoint restored
# with a smaller interval) just keeps counting. Plain Python.

# %% [answer update_scale]
def update_scale(scale, growth_tracker, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    """One GradScaler.update(): back off after an inf/NaN, grow after growth_interval good steps in a row."""
    ### BEGIN SOLUTION
    # twin: ptinternals.amp.scaler_kernels.update_scale
    if found_inf:
        return scale * backoff_factor, 0
    growth_tracker += 1  # this step was good
    if growth_tracker == growth_interval:
        grown = scale * growth_factor
        return (grown if grown <= 3.4028234663852886e38 else scale), 0
    return scale, growth_tracker
    ### END SOLUTION


# %% [tests update_scale]
check("amp.update_scale", update_scale)
### BEGIN HIDDEN TESTS
check("amp.update_scale", update_scale, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### {{exercise grad_scaler}}: GradScaler from scratch
#
# Write a class `GradScaler(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
# growth_interval=2000)` with the methods of torch's that a training loop uses:
#
# * `scale(loss)`: `loss * S`;
# * `unscale_(optimizer)`: multiply every `p.grad` of `optimizer.param_groups` by `1/S` in place
#   (skipping parameters whose `.grad` is None) and record whether any of them held an inf or NaN;
#   calling it twice before `update()` raises
#   `RuntimeError`;
# * `step(optimizer)`: unscale (unless `unscale_` already ran this iteration), then call
#   `optimizer.step()` only if no inf/NaN was found;
# * `update()`: apply the scale rule of {{exercise update_scale}} and start a new iteration (you may call your
#   `update_scale`, but then a bug there costs both exercises);
# * `get_scale()`: S as a Python float.
#
# The checker drives your class and `torch.amp.GradScaler("cpu")` through the same scripted runs
# (parameters computed in fp16, so large scales overflow as in real training; injected infs and NaNs;
# several micro-batches; `unscale_` before `step`) and compares the scale, the skipped steps, the
# gradients and the parameters after every step. Write the algorithm yourself: torch's GradScaler and
# its `_amp_*` kernels are what you are compared with, so the checker refuses them.

# %% [answer grad_scaler]
import torch


class GradScaler:
    """Dynamic loss scaling, like torch.amp.GradScaler."""

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        ### BEGIN SOLUTION
        # twin: ptinternals.amp.grad_scaler.CPUGradScaler
        self._scale = float(init_scale)
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval = growth_interval
        self.growth_tracker = 0
        self.stage = {}  # id(optimizer) -> "unscaled" | "stepped" (absent: ready)
        self.found_inf = {}  # id(optimizer) -> bool
        ### END SOLUTION

    def scale(self, loss):
        ### BEGIN SOLUTION
        return loss * self._scale
        ### END SOLUTION

    def unscale_(self, optimizer):
        ### BEGIN SOLUTION
        key = id(optimizer)
        if self.stage.get(key) == "unscaled":
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if self.stage.get(key) == "stepped":
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = 1.0 / self._scale
        found = False
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    if not torch.isfinite(p.grad).all():
                        found = True
                    p.grad.mul_(inv_scale)
        self.found_inf[key] = found
        self.stage[key] = "unscaled"
        ### END SOLUTION

    def step(self, optimizer):
        ### BEGIN SOLUTION
        key = id(optimizer)
        if self.stage.get(key) == "stepped":
            raise RuntimeError("step() has already been called since the last update().")
        if self.stage.get(key) != "unscaled":
            self.unscale_(optimizer)
        self.stage[key] = "stepped"
        if not self.found_inf[key]:
            return optimizer.step()
        return None
        ### END SOLUTION

    def update(self):
        ### BEGIN SOLUTION
        if any(self.found_inf.values()):  # a skipped step: back off, restart the count
            self._scale, self.growth_tracker = self._scale * self.backoff_factor, 0
        else:
            self.growth_tracker += 1
            if self.growth_tracker == self.growth_interval:
                grown = self._scale * self.growth_factor
                self._scale = grown if grown <= 3.4028234663852886e38 else self._scale  # never to inf
                self.growth_tracker = 0
        self.stage, self.found_inf = {}, {}  # a new iteration
        ### END SOLUTION

    def get_scale(self):
        ### BEGIN SOLUTION
        return self._scale
        ### END SOLUTION


# %% [tests grad_scaler]
check("amp.grad_scaler", GradScaler)
### BEGIN HIDDEN TESTS
check("amp.grad_scaler", GradScaler, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# For reference, torch's own scaler on a run whose first scales overflow fp16 (the same scripted
# driver the checker uses: the gradients pass through fp16, so S * g past 65504 is inf):

# %%
from ptinternals.amp.scaffold import scaler_trajectory

params0 = [torch.randn(3, 4), torch.randn(5)]
script = [{"micro": [[torch.randn(3, 4), torch.randn(5)]], "unscale": False} for _ in range(8)]
traj = scaler_trajectory(lambda: torch.amp.GradScaler("cpu", init_scale=2.0**20, growth_interval=2), params0, script)
print("scale before each step:", [f"2**{int(math.log2(s))}" for s in traj["scales"][:-1]])
print("optimizer.step() called:", traj["stepped"])

# %% [quiz]
show_quiz("amp", "q7", "q9")

# %% [markdown]
# ## 5. Master weights, clipping and accumulation: a training step by hand
#
# Why does the optimizer keep **fp32 master weights**? Because updates are small. bf16 has 8
# significant bits, so near 1.0 its numbers are 2**-7 apart, and any update smaller than half that
# rounds away:

# %%
wt = torch.tensor(1.0, dtype=torch.bfloat16)
print("bf16: 1.0 + 1e-3 =", (wt + 1e-3).item(), "| fp32: 1.0 + 1e-3 =", (torch.tensor(1.0) + 1e-3).item())

# %% [markdown]
# So mixed precision keeps the weights in fp32 (4 bytes each, owned by the optimizer), makes a
# low-precision copy for each forward (2 bytes each, thrown away after backward), and adds the
# copies' gradients, cast to fp32, into the masters' `.grad`. That is exactly what autocast does for
# a `linear`: it casts the weight (a `_to_copy`), and the backward of that cast turns the bf16
# gradient back into fp32 and accumulates it in the fp32 parameter's `.grad`.
#
# The order of a step matters:
#
# 1. **accumulate**: for each of `accum` micro-batches, forward, `loss / accum`, scaled backward; the
#    gradients add up (in fp32, in the masters);
# 2. **unscale** once (`scaler.unscale_`): now `.grad` holds the true gradient;
# 3. **clip** the true gradient (`clip_grad_norm_`): clipping the scaled one would clip to the wrong
#    norm and then be divided by S again;
# 4. **step** (`scaler.step`: skipped on inf/NaN) and **update** the scale.
#
# ### {{exercise amp_train}}: mixed precision by hand
#
# Write `amp_train(params, optimizer, data, steps, dtype, scaler=None, clip=None, accum=1,
# loss_weight=1.0)` that trains the chapter's MLP (`mlp_forward(params, x)`; it, `torch` and `F` come
# from the setup cell):
#
# * `params`: dict of fp32 master weights (`w1`, `b1`, `w2`, `b2`); `optimizer` already owns them
#   (Adam or SGD). Some may be frozen (`requires_grad=False`, as when fine-tuning part of a model): like
#   autocast with `AdamW(model.parameters())`, a frozen weight gets no gradient and never moves;
# * `data`: a list of `(x, y)` fp32 batches; micro-batch `k` of step `s` is
#   `data[(s * accum + k) % len(data)]`;
# * forward in `dtype` (float32, bfloat16 or float16) on fresh low-precision copies of the weights and
#   of `x`, **without autocast**; the loss in fp32: `F.mse_loss(pred.float(), y) * loss_weight`;
# * `scaler` is `None` or a `torch.amp.GradScaler`; `clip` is `None` or a max gradient norm.
#
# Return `(losses, skipped_steps)`: the mean unscaled micro-batch loss of each step (Python floats),
# and the indices of the steps the scaler skipped (a skipped step is one where `update()` lowered the
# scale). The checker compares with `torch.autocast` + `torch.amp.GradScaler` on the same model and
# data: losses within 0.1%, the same skipped steps, final weights within 1% of the largest update;
# it includes the fp16 underflow setting above, without and with a scaler.

# %% [answer amp_train]
def amp_train(params, optimizer, data, steps, dtype, scaler=None, clip=None, accum=1, loss_weight=1.0):
    """Train with fp32 master weights and `dtype` compute; returns (losses, skipped_steps)."""
    ### BEGIN SOLUTION
    # twin: ptinternals.amp.trainer.amp_train
    masters = list(params.values())
    losses, skipped = [], []
    for step in range(steps):
        for p in masters:
            p.grad = None
        total = 0.0
        for k in range(accum):
            x, y = data[(step * accum + k) % len(data)]
            # the weight cast: fresh low-precision leaves, 2 B/param for bf16/fp16 (a frozen one needs no grad)
            compute = {n: p.detach().to(dtype).requires_grad_(p.requires_grad) for n, p in params.items()}
            pred = mlp_forward(compute, x.to(dtype))  # (B, d_out) in dtype
            loss = F.mse_loss(pred.float(), y) * loss_weight  # fp32 loss, like autocast
            total += loss.item()
            micro = loss / accum
            (scaler.scale(micro) if scaler is not None else micro).backward()
            with torch.no_grad():  # low-precision grads -> fp32, accumulated in the masters
                for n, p in params.items():
                    if compute[n].grad is not None:
                        g = compute[n].grad.float()
                        p.grad = g if p.grad is None else p.grad + g
        losses.append(total / accum)
        if scaler is not None:
            scaler.unscale_(optimizer)  # true gradients from here on
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(masters, clip)  # clip AFTER unscale_
        if scaler is None:
            optimizer.step()
        else:
            before = scaler.get_scale()
            scaler.step(optimizer)  # skips optimizer.step() on inf/NaN
            scaler.update()
            if scaler.get_scale() < before:
                skipped.append(step)
    return losses, skipped
    ### END SOLUTION


# %% [tests amp_train]
check("amp.amp_train", amp_train)
### BEGIN HIDDEN TESTS
check("amp.amp_train", amp_train, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("amp", "q8", "q10")

# %% [markdown]
# ## 6. The win: memory and speed
#
# What does mixed precision save? Not the weights: an fp32 master (4 B) plus a bf16 copy (2 B) is
# *more* than fp32 alone, and Adam's two fp32 moments (8 B) stay. The saving is in the
# **activations**, the tensors autograd keeps for the backward pass, which dominate memory at large
# batch sizes: in bf16 they take 2 bytes per element instead of 4. We can count them with
# `torch.autograd.graph.saved_tensors_hooks`, here for one forward of a wider MLP:

# %%
def saved_bytes(dtype, d_in=64, hidden=256, d_out=16, batch=64):
    params = init_mlp_params(MLPConfig(d_in, hidden, d_out))
    compute = {n: p.to(dtype).requires_grad_(True) for n, p in params.items()}
    x, y = torch.randn(batch, d_in), torch.randn(batch, d_out)
    storages = {}

    def pack(t):  # called for every tensor autograd saves
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.mse_loss(mlp_forward(compute, x.to(dtype)).float(), y)
    return sum(storages.values())


b32, b16 = saved_bytes(torch.float32), saved_bytes(torch.bfloat16)
print(f"saved for backward: fp32 {b32:,} B, bf16 {b16:,} B (x{b16 / b32:.2f}; the fp32 loss inputs stay 4 B)")

# %% [markdown]
# Speed is the other half, and it needs the right hardware: matrix units that multiply 16-bit
# numbers. On an H200 (datasheet peaks):

# %%
from ptinternals.benchmark import H200_BF16_DENSE_FLOPS, H200_HBM_BYTES_PER_S

H200_FP32_FLOPS = 67e12  # fp32 on the CUDA cores (no TF32), datasheet
m = n = k = 8192
flops = 2 * m * n * k  # one (8192 x 8192) @ (8192 x 8192) matmul
print(f"fp32 at peak: {flops / H200_FP32_FLOPS * 1e3:.1f} ms | bf16 at peak: {flops / H200_BF16_DENSE_FLOPS * 1e3:.2f} ms "
      f"(x{H200_BF16_DENSE_FLOPS / H200_FP32_FLOPS:.0f})")
act = 8192 * 4096  # one activation of a wide layer
print(f"reading one {act:,}-element activation at {H200_HBM_BYTES_PER_S / 1e12:.1f} TB/s: fp32 "
      f"{4 * act / H200_HBM_BYTES_PER_S * 1e6:.0f} us, bf16 {2 * act / H200_HBM_BYTES_PER_S * 1e6:.0f} us")

# %% [markdown]
# On this CPU the opposite happens (no bf16 matrix units), which is why the check below measures
# speed only on a GPU. `bench/bench_amp.py` measures a GPT-like block in fp32, bf16 autocast and
# fp16 + GradScaler (tokens/s, TFLOP/s, peak memory, and the ratios to fp32).
#
# ### {{exercise amp_speed}}: smaller, and on a GPU faster
#
# Nothing new to write: this check runs **your `amp_train`** from {{exercise amp_train}} in float32 and in low
# precision. Everywhere, one low-precision step must save at most 0.7x the bytes for backward of the
# fp32 step. On a GPU it also trains a wide MLP (1024 -> 4096 -> 1024, batch 8192) and requires a
# low-precision step at most 0.8x the time and 0.9x the peak memory of fp32; on a CPU that half is
# skipped, and the check says so.

# %% [tests amp_speed]
if not torch.cuda.is_available():
    print("CPU: this check measures the bytes saved for backward; the speed/peak-memory half is SKIPPED (GPU only).")
check("amp.amp_speed", amp_train)
### BEGIN HIDDEN TESTS
check("amp.amp_speed", amp_train, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## 7. Pitfalls in real training code
#
# Four mistakes that the mechanisms above explain.
#
# **`torch.cuda.amp` is the old name.** Since torch 2.4 the API is device-generic:
# `torch.amp.autocast("cuda", dtype=...)` and `torch.amp.GradScaler("cuda")`. The old
# `torch.cuda.amp.autocast` and `torch.cuda.amp.GradScaler` still work but are deprecated aliases
# that warn (and, like the new ones, turn themselves off on a machine without CUDA):

# %%
import warnings

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.cuda.amp.GradScaler()
for w in caught:
    print(f"{w.category.__name__}: {str(w.message)[:110]}")

# %% [markdown]
# **GradScaler refuses fp16 gradients.** After `model.half()` the parameters, and so their gradients,
# are float16. Unscaling them would divide in fp16 (small gradients flush to zero, the very underflow
# the scaler exists to prevent), and the optimizer would update fp16 weights (updates smaller than half
# a spacing vanish, section 5). So `unscale_` raises. The fix is not to call `.half()`: keep the model
# in fp32 (the master weights) and let autocast cast each op's inputs.

# %%
p = torch.nn.Parameter(torch.randn(3).half())  # what model.half() makes of a weight
opt = torch.optim.SGD([p], lr=0.1)
scaler = torch.amp.GradScaler("cpu")
scaler.scale((p.float() * 2).sum()).backward()
try:
    scaler.unscale_(opt)
except ValueError as e:
    print("ValueError:", e)

# %% [markdown]
# **Some ops refuse to autocast on CUDA.** `F.binary_cross_entropy` (and `nn.BCELoss`) takes
# probabilities, and in fp16 a probability of 1 - 1e-4 rounds to 1.0, whose log is -inf. CUDA's
# autocast therefore registers a kernel for it at the `AutocastCUDA` dispatch key ({{chapter dispatch}})
# that only raises; use `F.binary_cross_entropy_with_logits` (`nn.BCEWithLogitsLoss`), which takes
# the logits, fuses the sigmoid and computes in fp32. The kernel is in every build, so we can call
# it directly at that key, even here without a GPU (CPU autocast has no such ban):

# %%
bce = torch.ops.aten.binary_cross_entropy.default
try:
    bce.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCUDA), torch.rand(3), torch.rand(3))
except RuntimeError as e:
    print("RuntimeError:", str(e).splitlines()[0])

# %% [markdown]
# **bf16 is coarse.** With 8 significant bits, bf16 cannot tell 256 from 257, nor 1.0 from 1.003. That
# is fine for activations and gradients, which are noisy anyway, and wrong for anything accumulated:
# sums over long sequences, running statistics, optimizer state and the weights themselves stay fp32
# (autocast's fp32 ops and the master weights of section 5 exist for this).

# %%
print(torch.tensor([256.0, 257.0, 1.003]).bfloat16().tolist())

# %% [markdown]
# ## Summary
#
# * A float is sign, exponent and mantissa; bf16 keeps fp32's range with 8 significant bits, fp16
#   trades range (6e-8 .. 65504) for 11 bits; casts round to nearest, ties to even, with subnormals
#   and overflow to inf, and all of it is integer arithmetic on the bit pattern.
# * Autocast is a dispatch key with per-op cast policies: matmuls in low precision, losses (and on
#   CUDA, norms, softmax, exp, ...) in fp32, everything else in its input's dtype; weight casts are
#   cached per region.
# * fp16 gradients underflow; loss scaling moves them back into range, and GradScaler adapts the scale:
#   skip and halve on inf/NaN, double after 2000 good steps. Unscale once, clip after unscaling,
#   accumulate in fp32.
# * fp32 master weights keep the small updates; the savings are in the activations (2 bytes instead
#   of 4) and, on tensor-core hardware, in time.
# * In practice: use `torch.amp` (not the deprecated `torch.cuda.amp`), never `model.half()` with a
#   GradScaler, BCE-with-logits instead of BCE under CUDA autocast, and fp32 for anything accumulated.
#
# Next: {{chapter distributed}} splits a training step across processes, where the gradients you just scaled are
# all-reduced in buckets.
#
# ### Your quiz score so far
# Practice answers count no points; the grader scores your last answer to each graded question (recorded in
# `amp.answers.json`).

# %% [quiz-grade]
quiz_progress("amp")
