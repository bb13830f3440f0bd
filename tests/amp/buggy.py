"""Known-buggy implementations of the amp chapter's exercises: each one must be rejected by its checker.

Each bug is a mistake students really make (the issue names four: round-half-up instead of
half-to-even, a scaler that steps on inf, unscaling twice, clipping before unscale); the test also
checks that the failure message names the likely cause where the checker has one (``expect`` words).

Every source is a complete replacement for the answer cell that defines the exercise's entry point;
like the answer cells, the trainers use ``torch``, ``F`` and ``mlp_forward`` from the setup cell.
``amp.amp_speed`` grades ``amp_train`` itself, so its bugs replace the cell of Exercise amp.amp_train
(``ANSWER_CELL`` below says so for the end-to-end tests).
"""

ANSWER_CELL = {"amp.amp_speed": "amp_train_code"}

_FORMATS = ('import math\n'
            'FORMATS = {"fp32": (8, 23), "bf16": (8, 7), "fp16": (5, 10), "fp8_e5m2": (5, 2), "fp8_e4m3fn": (4, 3)}\n')

_DECODE = _FORMATS + """
import math

def decode(bits, fmt):
    e_bits, m_bits = FORMATS[fmt]
    bias = (1 << (e_bits - 1)) - 1
    sign = -1.0 if bits >> (e_bits + m_bits) else 1.0
    exponent = (bits >> m_bits) & ((1 << e_bits) - 1)
    mantissa = bits & ((1 << m_bits) - 1)
    all_ones = (1 << e_bits) - 1
    if NAN_RULE:
        return math.nan
    if INF_RULE:
        return sign * math.inf if mantissa == 0 else math.nan
    if exponent == 0:
        return sign * SUBNORMAL
    return sign * math.ldexp((1 << m_bits) | mantissa, exponent - BIAS - m_bits)
"""
_E4M3_NAN = 'fmt == "fp8_e4m3fn" and exponent == all_ones and mantissa == (1 << m_bits) - 1'
_IEEE_INF = 'fmt != "fp8_e4m3fn" and exponent == all_ones'


def _decode(nan=_E4M3_NAN, inf=_IEEE_INF, subnormal="math.ldexp(mantissa, 1 - bias - m_bits)", bias="bias"):
    return (_DECODE.replace("NAN_RULE", nan).replace("INF_RULE", inf).replace("SUBNORMAL", subnormal)
            .replace("BIAS", bias))


_DECOMPOSE = _FORMATS + """
import math

def decompose(value, fmt):
    e_bits, m_bits = FORMATS[fmt]
    bias = (1 << (e_bits - 1)) - 1
    all_ones = (1 << e_bits) - 1
    has_inf = fmt != "fp8_e4m3fn"
    sign = 1 if math.copysign(1.0, value) < 0 else 0
    if math.isnan(value):
        return sign, all_ones, (1 << m_bits) - 1
    if math.isinf(value):
        return sign, all_ones, 0
    a = abs(value)
    if a == 0.0:
        return sign, 0, 0
    m, e = math.frexp(a)
    big_m, big_e = int(m * 2**53), e - 53
    emin = 1 - bias
    if FLUSH and e - 1 < emin:
        return sign, 0, 0
    exp = max(e - 1, emin)
    shift = exp - m_bits - big_e
    q, rem = big_m >> shift, big_m & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if ROUND_UP:
        q += 1
    if q >= (1 << m_bits):
        exponent, mantissa = exp + bias, q - (1 << m_bits)
        if mantissa == (1 << m_bits):
            exponent, mantissa = exponent + 1, 0
    else:
        exponent, mantissa = 0, q
    max_exp = all_ones - 1 if has_inf else all_ones
    if exponent > max_exp:
        return OVERFLOW
    return sign, exponent, mantissa
"""


def _decompose(round_up="rem > half or (rem == half and q & 1)", flush="False", overflow="sign, all_ones, 0"):
    return _DECOMPOSE.replace("ROUND_UP", round_up).replace("FLUSH", flush).replace("OVERFLOW", overflow)


_RSE = """
import torch

def _round_shift_right_even(v, shift):
    q = v >> shift
    rem = v & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    return q + ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(torch.int64)
"""

_FP16 = _RSE + """
def fp32_to_fp16_bits(x):
    u = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    sign = (u >> 16) & 0x8000
    mag = u & 0x7FFFFFFF
    exp32 = mag >> 23
    mant32 = mag & 0x7FFFFF
    normal = torch.clamp(ROUND(mag, 13) - (112 << 10), max=MAXBITS)
    shift = torch.clamp(126 - exp32, min=1, max=31)
    subnormal = ROUND(mant32 | (1 << 23), shift)
    out = torch.where(exp32 >= 113, normal, torch.where(exp32 >= SUBMIN, subnormal, torch.zeros_like(u)))
    out = torch.where(mag == 0x7F800000, 0x7C00, out)
    out = torch.where(mag > 0x7F800000, NAN, out)
    return (sign | out).to(torch.int16)
"""


def _fp16(round_fn="_round_shift_right_even", maxbits="0x7C00", submin="1", nan="0x7E00 | (mant32 >> 13)"):
    return _FP16.replace("ROUND", round_fn).replace("MAXBITS", maxbits).replace("SUBMIN", submin).replace("NAN", nan)


_HALF_UP = """
def _half_up(v, shift):
    return (v + (1 << (shift - 1))) >> shift
"""

_PREDICT = """
def predict_dtypes(layers, device_type, autocast_dtype, input_dtype="float32"):
    out, current = [], input_dtype
    for op in layers:
        if op in ("linear", "matmul"):
            current = autocast_dtype
        elif LOSS_RULE:
            current = "float32"
        elif FP32_RULE:
            current = "float32"
        elif ADD_RULE:
            current = "float32"
        out.append(current)
    return out
"""


def _predict(loss='op in ("mse_loss", "cross_entropy")',
             fp32='device_type == "cuda" and op in ("layer_norm", "softmax", "log_softmax", "exp", "pow", "sum")',
             add='op == "add_fp32"'):
    return _PREDICT.replace("LOSS_RULE", loss).replace("FP32_RULE", fp32).replace("ADD_RULE", add)


_UPDATE = """
FLT_MAX = 3.4028234663852886e38

def update_scale(scale, growth_tracker, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    if found_inf:
        return scale * backoff_factor, TRACKER_ON_INF
    COUNT
    if GROW_WHEN:
        grown = scale * growth_factor
        return (grown if GROW_OK else scale), TRACKER_ON_GROWTH
    return scale, growth_tracker
"""


def _update(on_inf="0", count="growth_tracker += 1", grow_when="growth_tracker == growth_interval",
            grow_ok="grown <= FLT_MAX", on_growth="0"):
    return (_UPDATE.replace("TRACKER_ON_INF", on_inf).replace("COUNT", count).replace("GROW_WHEN", grow_when)
            .replace("GROW_OK", grow_ok).replace("TRACKER_ON_GROWTH", on_growth))


_SCALER = """
import torch

FLT_MAX = 3.4028234663852886e38

class GradScaler:
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.s = float(init_scale)
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.tracker = 0
        self.stage, self.found = {}, {}

    def scale(self, loss):
        return loss * self.s

    def unscale_(self, optimizer):
        key = id(optimizer)
        if TWICE_CHECK and self.stage.get(key) == "unscaled":
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        found = False
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    if not torch.isfinite(p.grad).all():
                        found = True
                    p.grad.mul_(INV_SCALE)
        self.found[key] = FOUND
        self.stage[key] = "unscaled"

    def step(self, optimizer):
        key = id(optimizer)
        if ALWAYS_UNSCALE or self.stage.get(key) != "unscaled":
            self.unscale_(optimizer)
        self.stage[key] = "stepped"
        if STEP_RULE:
            return optimizer.step()

    def update(self):
        found = any(self.found.values())
        if found:
            self.s, self.tracker = self.s * BACKOFF, 0
        else:
            self.tracker += 1
            if self.tracker == self.growth_interval:
                grown = self.s * self.growth_factor
                self.s, self.tracker = (grown if grown <= FLT_MAX else self.s), 0
        self.stage = {}
        RESET_FOUND

    def get_scale(self):
        return self.s
"""


def _scaler(twice_check="True", inv_scale="1.0 / self.s", found="found", always_unscale="False",
            step_rule="not self.found[key]", backoff="self.backoff_factor", reset_found="self.found = {}"):
    return (_SCALER.replace("RESET_FOUND", reset_found).replace("TWICE_CHECK", twice_check)
            .replace("INV_SCALE", inv_scale).replace("FOUND", found).replace("ALWAYS_UNSCALE", always_unscale)
            .replace("STEP_RULE", step_rule).replace("BACKOFF", backoff))


_TRAIN = """
def amp_train(params, optimizer, data, steps, dtype, scaler=None, clip=None, accum=1, loss_weight=1.0):
    masters = list(params.values())
    losses, skipped = [], []
    for step in range(steps):
        for p in masters:
            p.grad = None
        total = 0.0
        for k in range(accum):
            x, y = data[(step * accum + k) % len(data)]
            compute = {n: p.detach().to(CAST).requires_grad_(True) for n, p in params.items()}
            FORWARD
            total += loss.item()
            micro = MICRO
            (scaler.scale(micro) if scaler is not None else micro).backward()
            with torch.no_grad():
                for n, p in params.items():
                    g = compute[n].grad.float()
                    p.grad = g if p.grad is None else p.grad + g
            PER_MICRO
        losses.append(total / accum)
        FINISH
    return losses, skipped
"""
_FORWARD = "pred = mlp_forward(compute, x.to(CAST))\n            loss = F.mse_loss(pred.float(), y) * loss_weight"
_FINISH = """if scaler is not None:
            scaler.unscale_(optimizer)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(masters, clip)
        if scaler is None:
            optimizer.step()
        else:
            before = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            if scaler.get_scale() SKIP_TEST before:
                skipped.append(step)"""


def _train(forward=_FORWARD, micro="loss / accum", per_micro="pass", finish=_FINISH, cast="dtype", skip_test="<"):
    return (_TRAIN.replace("FORWARD", forward).replace("PER_MICRO", per_micro).replace("MICRO", micro)
            .replace("FINISH", finish).replace("SKIP_TEST", skip_test).replace("CAST", cast))


_CLIP_FIRST = """if clip is not None:
            torch.nn.utils.clip_grad_norm_(masters, clip)
        if scaler is not None:
            scaler.unscale_(optimizer)
        if scaler is None:
            optimizer.step()
        else:
            before = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            if scaler.get_scale() < before:
                skipped.append(step)"""

_STEP_EACH_MICRO = """if scaler is not None:
                scaler.unscale_(optimizer)
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(masters, clip)
            if scaler is None:
                optimizer.step()
            else:
                before = scaler.get_scale()
                scaler.step(optimizer)
                scaler.update()
                if scaler.get_scale() < before and step not in skipped:
                    skipped.append(step)
            for p in masters:
                p.grad = None"""

BUGGY = {
    "amp.decode": {
        "subnormal_with_implicit_one": (_decode(subnormal="math.ldexp((1 << m_bits) | mantissa, 1 - bias - m_bits)"),
                                        "no implicit"),
        "e4m3fn_has_infinities": (_decode(nan="False", inf="exponent == all_ones"), "no infinities"),
        "subnormal_exponent_minus_bias": (_decode(subnormal="math.ldexp(mantissa, -bias - m_bits)"), "1 - bias"),
        "bias_off_by_one": (_decode(bias="(bias + 1)", subnormal="math.ldexp(mantissa, -bias - m_bits)"), None),
    },
    "amp.decompose": {
        "round_half_up": (_decompose(round_up="rem >= half"), "EVEN neighbour"),
        "truncate": (_decompose(round_up="False"), "truncated"),
        "flush_subnormals": (_decompose(flush="True"), "subnormals"),
        "saturate_instead_of_inf": (_decompose(overflow="sign, max_exp, (1 << m_bits) - 1"), "becomes inf"),
    },
    "amp.fp32_to_bf16_bits": {
        "round_half_up": (_RSE + """
def fp32_to_bf16_bits(x):
    u = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    mag = u & 0x7FFFFFFF
    out = ((u >> 16) & 0x8000) | torch.where(mag > 0x7F800000, 0x7FC0, (mag + 0x8000) >> 16)
    return out.to(torch.int16)
""", "EVEN neighbour"),
        "truncate": (_RSE + """
def fp32_to_bf16_bits(x):
    return (x.contiguous().view(torch.int32) >> 16).to(torch.int16)
""", "truncated"),
        "nan_rounded_like_a_number": (_RSE + """
def fp32_to_bf16_bits(x):
    u = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    lsb = (u >> 16) & 1
    return ((u + 0x7FFF + lsb) >> 16).to(torch.int16)
""", "NaN input must give a NaN"),
        "casts_with_to": ("""
import torch

def fp32_to_bf16_bits(x):
    return x.to(torch.bfloat16).view(torch.int16)
""", "integer operations"),
    },
    "amp.fp32_to_fp16_bits": {
        "round_half_up": (_HALF_UP + _fp16(round_fn="_half_up"), "EVEN neighbour"),
        "flush_subnormals": (_fp16(submin="1000"), "subnormals"),
        "saturate_instead_of_inf": (_fp16(maxbits="0x7BFF"), "becomes inf"),
        "nan_becomes_inf": (_fp16(nan="0x7C00"), "NaN input must give a NaN"),
        "numpy_cast": ("""
import torch

def fp32_to_fp16_bits(x):
    import numpy as np
    with np.errstate(over="ignore"):
        return torch.from_numpy(x.contiguous().numpy().astype(np.float16).view(np.int16))
""", "used Tensor.numpy"),
    },
    "amp.predict_dtypes": {
        "cpu_like_cuda": (_predict(fp32='op in ("layer_norm", "softmax", "log_softmax", "exp", "pow", "sum")'),
                          "CPU autocast does not list"),
        "cuda_like_cpu": (_predict(fp32="False"), "on CUDA"),
        "no_type_promotion": (_predict(add="False"), "type promotion"),
        "losses_in_low_precision": (_predict(loss="False"), "fp32 list"),
    },
    "amp.update_scale": {
        "keeps_count_on_inf": (_update(on_inf="growth_tracker"), "resets growth_tracker"),
        "grows_to_inf": (_update(grow_ok="True"), "never grow the scale to inf"),
        "no_reset_after_growth": (_update(on_growth="growth_tracker"), "starts again from 0"),
        "grows_one_step_late": (_update(count="pass").replace("return scale, growth_tracker\n",
                                                               "return scale, growth_tracker + 1\n"), "off by one"),
    },
    "amp.grad_scaler": {
        "steps_on_inf": (_scaler(step_rule="True"), "must skip optimizer.step()"),
        "unscales_twice": (_scaler(always_unscale="True", twice_check="False"), "divided by the scale twice"),
        "sticky_found_inf": (_scaler(found="found or self.found.get(key, False)", reset_found="pass"),
                             "must be reset"),
        "multiplies_by_scale": (_scaler(inv_scale="self.s"), "1/scale"),
        "no_backoff": (_scaler(backoff="1.0"), "back off"),
    },
    "amp.amp_train": {
        "clip_before_unscale": (_train(finish=_CLIP_FIRST), "clip AFTER scaler.unscale_"),
        "no_accum_division": (_train(micro="loss"), "divide each micro-batch loss by accum"),
        "step_every_micro_batch": (_train(per_micro=_STEP_EACH_MICRO, finish="pass"), None),
        "loss_in_low_precision": (_train(forward="pred = mlp_forward(compute, x.to(dtype))\n"
                                                 "            loss = F.mse_loss(pred, y.to(dtype)) * loss_weight"),
                                  "float32"),
        "uses_autocast": ("""
def amp_train(params, optimizer, data, steps, dtype, scaler=None, clip=None, accum=1, loss_weight=1.0):
    losses, skipped = [], []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for k in range(accum):
            x, y = data[(step * accum + k) % len(data)]
            with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
                loss = F.mse_loss(mlp_forward(params, x), y) * loss_weight
            total += loss.item()
            (scaler.scale(loss / accum) if scaler is not None else loss / accum).backward()
        losses.append(total / accum)
        if scaler is not None:
            scaler.unscale_(optimizer)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(list(params.values()), clip)
        if scaler is None:
            optimizer.step()
        else:
            before = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            if scaler.get_scale() < before:
                skipped.append(step)
    return losses, skipped
""", "used torch.autocast"),
        "computes_in_fp32": (_train(cast="torch.float32"), "your matmuls ran in float32"),
        "growth_counted_as_skip": (_train(skip_test="!="), "growth also changes"),
    },
    "amp.amp_speed": {
        "computes_in_fp32": (_train(cast="torch.float32"), "nothing got smaller"),
        "upcast_between_layers": (_train(forward="""xd = x.to(dtype)
            h = torch.relu(F.linear(xd, compute["w1"], compute["b1"])).float()  # back up to fp32 "for accuracy"
            pred = F.linear(h, compute["w2"].float(), compute["b2"].float()).to(dtype)
            loss = F.mse_loss(pred.float(), y) * loss_weight"""), "saves float32 tensors"),
        "logging_forward_with_grad": (_train(forward=_FORWARD + """
            fp32_loss = F.mse_loss(mlp_forward(params, x), y)  # for logging, but autograd saves its tensors"""),
                                      "torch.no_grad()"),
    },
}
