"""Known-buggy implementations of the amp chapter's exercises: each one must be rejected by its checker.

Each bug is a mistake students really make (the issue named four: round-half-up instead of
half-to-even, a scaler that steps on inf, unscaling twice, clipping before unscale), written as the
solution plus one edit (``edited(exercise_id, (old, new))``: the bug is the edit a reader sees; two small
edits where one mistake needs them, said in a comment). Its second element is the hint the failure must
give: words of its "likely cause" line, or None when no likely cause may appear (the checker cannot tell
this mistake from its symptom, or the failure is about how the answer is written, which its message says).

``amp.amp_speed`` grades ``amp_train`` itself, so its bugs are edits of the cell of amp.amp_train
(``ANSWER_CELL`` says so for the end-to-end tests, the twin test and the mutation runner).
"""
from ptinternals.grading.testing import edited

TESTS_OF_TESTS = {"hints", "twins", "boundaries"}
ANSWER_CELL = {"amp.amp_speed": "amp_train_code"}


def _decode(*edits):
    return edited("amp.decode", *edits)


def _decompose(*edits):
    return edited("amp.decompose", *edits)


def _bf16(*edits):
    return edited("amp.fp32_to_bf16_bits", *edits)


def _fp16(*edits):
    return edited("amp.fp32_to_fp16_bits", *edits)


def _predict(*edits):
    return edited("amp.predict_dtypes", *edits)


def _update(*edits):
    return edited("amp.update_scale", *edits)


def _scaler(*edits):
    return edited("amp.grad_scaler", *edits)


def _train(*edits):
    return edited("amp.amp_train", *edits)


_E4M3FN_BRANCH = ('if fmt == "fp8_e4m3fn":  # no infinities: only S.1111.111 is NaN\n'
                  '        if exponent == all_ones and mantissa == (1 << m_bits) - 1:\n'
                  '            return math.nan\n'
                  '    elif exponent == all_ones:')
_RNE_BF16 = "((rem > 0x8000) | ((rem == 0x8000) & ((q & 1) == 1)))"
_TWICE_GUARD = ('        if self.stage.get(key) == "unscaled":\n'
                '            raise RuntimeError("unscale_() has already been called on this optimizer since the last '
                'update().")\n')
_UNSCALE_THEN_CLIP = ("        if scaler is not None:\n"
                      "            scaler.unscale_(optimizer)  # true gradients from here on\n"
                      "        if clip is not None:\n"
                      "            torch.nn.utils.clip_grad_norm_(masters, clip)  # clip AFTER unscale_\n")
_CLIP_THEN_UNSCALE = ("        if clip is not None:\n"
                      "            torch.nn.utils.clip_grad_norm_(masters, clip)\n"
                      "        if scaler is not None:\n"
                      "            scaler.unscale_(optimizer)\n")
_FORWARD = ("            compute = {n: p.detach().to(dtype).requires_grad_(p.requires_grad) for n, p in params.items()}\n"
            "            pred = mlp_forward(compute, x.to(dtype))  # (B, d_out) in dtype\n")
_AUTOCAST_FORWARD = ("            compute = {n: p.detach().requires_grad_(p.requires_grad) for n, p in params.items()}\n"
                     '            with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):\n'
                     "                pred = mlp_forward(compute, x)\n")
# Two small edits: the forward left in fp32, weights and input alike (either one alone is a dtype error).
_FP32_FORWARD = (("p.detach().to(dtype).requires_grad_", "p.detach().requires_grad_"),
                 ("mlp_forward(compute, x.to(dtype))", "mlp_forward(compute, x)"))
_UPCAST = ("            xd = x.to(dtype)\n"
           '            h = torch.relu(F.linear(xd, compute["w1"], compute["b1"])).float()  # back up to fp32 "for accuracy"\n'
           '            pred = F.linear(h, compute["w2"].float(), compute["b2"].float()).to(dtype)\n')

BUGGY = {
    "amp.decode": {
        "subnormal_with_implicit_one": (_decode(("return sign * math.ldexp(mantissa, 1 - bias - m_bits)",
                                                 "return sign * math.ldexp((1 << m_bits) | mantissa, 1 - bias - m_bits)")),
                                        "no implicit"),
        "e4m3fn_has_infinities": (_decode((_E4M3FN_BRANCH, "if exponent == all_ones:")), "no infinities"),
        "subnormal_exponent_minus_bias": (_decode(("math.ldexp(mantissa, 1 - bias - m_bits)",
                                                   "math.ldexp(mantissa, -bias - m_bits)")), "1 - bias"),
        "bias_off_by_one": (_decode(("bias = (1 << (e_bits - 1)) - 1", "bias = 1 << (e_bits - 1)")),
                            "2**(E-1) - 1"),
        "sign_ignored": (_decode(("sign = -1.0 if bits >> (e_bits + m_bits) else 1.0", "sign = 1.0")), "is the sign"),
    },
    "amp.decompose": {
        "round_half_up": (_decompose(("if rem > half or (rem == half and q & 1):", "if rem >= half:")),
                          "EVEN neighbour"),
        "truncate": (_decompose(("    if rem > half or (rem == half and q & 1):  # round to nearest, ties to even\n"
                                 "        q += 1\n", "")), "truncated"),
        "flush_subnormals": (_decompose(("    exp = max(e - 1, emin)",
                                         "    if e - 1 < emin:  # below the smallest normal: flushed\n"
                                         "        return sign, 0, 0\n"
                                         "    exp = max(e - 1, emin)")), "subnormals"),
        "saturate_instead_of_inf": (_decompose(("return sign, all_ones, 0  # overflow: inf",
                                                "return sign, all_ones - 1, (1 << m_bits) - 1  # overflow: the max")),
                                    "becomes inf"),
        "carry_kept_in_the_mantissa": (_decompose(("        if mantissa == (1 << m_bits):\n"
                                                   "            exponent, mantissa = exponent + 1, 0\n", "")),
                                       "carry moves into the exponent"),
    },
    "amp.fp32_to_bf16_bits": {
        "round_half_up": (_bf16((_RNE_BF16, "(rem >= 0x8000)")), "EVEN neighbour"),
        "truncate": (_bf16((f"rounded = q + {_RNE_BF16}.to(torch.int64)", "rounded = q")), "truncated"),
        "nan_rounded_like_a_number": (_bf16(("torch.where(is_nan, 0x7FC0, rounded)", "rounded")),
                                      "NaN input must give a NaN"),
        "sign_dropped": (_bf16(("out = sign | torch.where", "out = torch.where")), "sign bit"),
        "casts_with_to": (_bf16(("return out.to(torch.int16)", "return x.to(torch.bfloat16).view(torch.int16)")), None),
        "abs_in_place": (_bf16(("mag = u & 0x7FFFFFFF", "mag = x.abs_().contiguous().view(torch.int32).to(torch.int64)")),
                         None),
    },
    "amp.fp32_to_fp16_bits": {
        "round_half_up": (_fp16(("return q + ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(torch.int64)",
                                 "return q + (rem >= half).to(torch.int64)")), "EVEN neighbour"),
        "flush_subnormals": (_fp16(("torch.where(exp32 >= 1, subnormal, torch.zeros_like(u))", "torch.zeros_like(u)")),
                             "subnormals"),
        "saturate_instead_of_inf": (_fp16(("max=0x7C00)", "max=0x7BFF)")), "becomes inf"),
        "nan_becomes_inf": (_fp16(("    out = torch.where(mag > 0x7F800000, 0x7E00, out)  # a quiet NaN (any NaN will do)\n",
                                   "")), "NaN input must give a NaN"),
        "subnormal_without_implicit_one": (_fp16(("round_shift(mant32 | (1 << 23), shift)", "round_shift(mant32, shift)")),
                                           None),
        "numpy_cast": (_fp16(("return (sign | out).to(torch.int16)",
                              "import numpy as np\n    with np.errstate(over='ignore'):\n"
                              "        return torch.from_numpy(x.numpy().astype('float16').view('int16'))")), None),
    },
    "amp.predict_dtypes": {
        "cpu_like_cuda": (_predict(('(device_type == "cuda" and op in fp32_on_cuda)', "op in fp32_on_cuda")),
                          "CPU autocast does not list"),
        "cuda_like_cpu": (_predict((' or (device_type == "cuda" and op in fp32_on_cuda)', "")), "on CUDA"),
        "no_type_promotion": (_predict(('        elif op == "add_fp32":  # not listed: type promotion with an fp32 '
                                        'tensor\n            current = "float32"\n', "")), "type promotion"),
        "losses_in_low_precision": (_predict(('fp32_everywhere = {"mse_loss", "cross_entropy"}',
                                              "fp32_everywhere = set()")), "fp32 list"),
        "assumes_fp32_input": (_predict(("out, current = [], input_dtype", 'out, current = [], "float32"')),
                               "input's dtype"),
        "matmul_not_lowered": (_predict(('lower = {"linear", "matmul"}', 'lower = {"linear"}')), "lower-precision list"),
    },
    "amp.update_scale": {
        "keeps_count_on_inf": (_update(("return scale * backoff_factor, 0", "return scale * backoff_factor, growth_tracker")),
                               "resets growth_tracker"),
        "grows_to_inf": (_update(("(grown if grown <= 3.4028234663852886e38 else scale)", "grown")),
                         "never grow the scale to inf"),
        "no_reset_after_growth": (_update(("else scale), 0", "else scale), growth_tracker")), "starts again from 0"),
        # Two small edits: the good step is counted after the growth test instead of before it.
        "grows_one_step_late": (_update(("    growth_tracker += 1  # this step was good\n", ""),
                                        ("return scale, growth_tracker\n", "return scale, growth_tracker + 1\n")),
                                "growth_tracker + 1 == growth_interval"),
        "grows_past_the_interval": (_update(("if growth_tracker == growth_interval:",
                                             "if growth_tracker >= growth_interval:")), "keeps counting"),
    },
    "amp.grad_scaler": {
        "steps_on_inf": (_scaler(("        if not self.found_inf[key]:\n            return optimizer.step()\n"
                                  "        return None\n", "        return optimizer.step()\n")),
                         "must skip optimizer.step()"),
        # Two small edits: step() always unscales, and nothing guards against unscaling twice.
        "unscales_twice": (_scaler(('if self.stage.get(key) != "unscaled":\n            self.unscale_(optimizer)',
                                    "self.unscale_(optimizer)"), (_TWICE_GUARD, "")),
                           "divided by the scale twice"),
        # Two small edits: found_inf is OR-ed into the old flag, which update() no longer clears.
        "sticky_found_inf": (_scaler(("found = False", "found = self.found_inf.get(key, False)"),
                                     ("self.stage, self.found_inf = {}, {}  # a new iteration", "self.stage = {}")),
                             "must be reset"),
        "multiplies_by_scale": (_scaler(("inv_scale = 1.0 / self._scale", "inv_scale = self._scale")), "1/scale"),
        "no_backoff": (_scaler(("self._scale, self.growth_tracker = self._scale * self.backoff_factor, 0",
                                "self.growth_tracker = 0")), "back off"),
        "twice_not_raised": (_scaler((_TWICE_GUARD, "")), "must raise RuntimeError"),
        "stops_at_a_missing_grad": (_scaler(("                        continue\n", "                        break\n")),
                                    "skip it"),
    },
    "amp.amp_train": {
        "clip_before_unscale": (_train((_UNSCALE_THEN_CLIP, _CLIP_THEN_UNSCALE)), "clip AFTER scaler.unscale_"),
        "no_accum_division": (_train(("micro = loss / accum", "micro = loss")), "divide each micro-batch loss by accum"),
        "zero_grad_every_micro_batch": (_train(("        for p in masters:\n            p.grad = None\n        total = 0.0\n"
                                                "        for k in range(accum):\n",
                                                "        total = 0.0\n        for k in range(accum):\n"
                                                "            for p in masters:\n                p.grad = None\n")), None),
        "loss_in_low_precision": (_train(("loss = F.mse_loss(pred.float(), y) * loss_weight",
                                          "loss = F.mse_loss(pred, y.to(dtype)) * loss_weight")), "float32"),
        "uses_autocast": (_train((_FORWARD, _AUTOCAST_FORWARD)), None),
        "computes_in_fp32": (_train(*_FP32_FORWARD), "dtype of what you give it"),
        "growth_counted_as_skip": (_train(("if scaler.get_scale() < before:", "if scaler.get_scale() != before:")),
                                   "growth also changes"),
        "frozen_gets_a_gradient": (_train(("requires_grad_(p.requires_grad)", "requires_grad_(True)")), "although frozen"),
    },
    "amp.amp_speed": {
        "computes_in_fp32": (edited("amp.amp_speed", *_FP32_FORWARD, cell="amp_train_code"), "nothing got smaller"),
        "upcast_between_layers": (edited("amp.amp_speed", ("            pred = mlp_forward(compute, x.to(dtype))  # (B, "
                                                           "d_out) in dtype\n", _UPCAST), cell="amp_train_code"),
                                  "saves float32 tensors"),
        "logging_forward_with_grad": (edited("amp.amp_speed", (
            "            total += loss.item()\n",
            "            total += loss.item()\n"
            "            fp32_loss = F.mse_loss(mlp_forward(params, x), y)  # for logging, but autograd saves its tensors\n"),
            cell="amp_train_code"), "torch.no_grad()"),
    },
}
