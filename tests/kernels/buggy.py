"""Known-buggy implementations of the kernels chapter's exercises: each one must be rejected by its checker.

Each bug is a mistake students really make in Triton (the issue names several: softmax without the max
subtraction, a missing mask on the last block, layer norm with the unbiased variance, attention without
the causal mask or with a wrong rescale of the running sum), written as the solution plus one edit
(``edited(exercise_id, (old, new))``: the bug is the edit a reader sees; two small edits where one cannot
express the mistake, said in a comment). Its second element is the hint the failure must give: words of its
"likely cause" line, or None when no likely cause may appear (the symptom does not identify the mistake,
or the message itself already says what is wrong: no kernel launched, torch did the math, an input written).

``GPU_BUGGY`` holds bugs only a GPU can see (the interpreter accepts ``tl.dot`` on 8 x 8 blocks; a GPU
compile refuses): same format, run by the ``gpu``-marked test.
"""

from ptinternals.grading.testing import edited

TESTS_OF_TESTS = {"hints", "twins", "boundaries"}

# Exercise kernels.custom_op wraps the student's own layer_norm_forward and layer_norm_backward: a bug there fails it too (end-to-end tests).
DEPENDS_ON = {"kernels.custom_op": ("kernels.layer_norm_forward", "kernels.layer_norm_backward")}

ADD, SM, LNF, LNB = "kernels.add", "kernels.softmax", "kernels.layer_norm_forward", "kernels.layer_norm_backward"
GTO, MM, FA, OP = "kernels.grouped_tile_order", "kernels.matmul", "kernels.flash_attention", "kernels.custom_op"

ADD_LOADS = """    x = tl.load(x_ptr + offsets * stride_x, mask=mask)         # read BLOCK_SIZE elements
    y = tl.load(y_ptr + offsets * stride_y, mask=mask)         # read BLOCK_SIZE elements
"""
ADD_STORE = "    tl.store(out_ptr + offsets, x + y, mask=mask)              # write BLOCK_SIZE elements\n"

BUGGY = {
    ADD: {
        # the "missing mask on the last block" (loads and store: one run of lines)
        "no_mask_on_last_block": (edited(ADD, (ADD_LOADS + ADD_STORE,
                                               "    x = tl.load(x_ptr + offsets * stride_x)\n"
                                               "    y = tl.load(y_ptr + offsets * stride_y)\n"
                                               "    tl.store(out_ptr + offsets, x + y)\n")),
                                  "missing mask"),
        "grid_rounds_down": (edited(ADD, ("grid = (triton.cdiv(n, BLOCK_SIZE),)", "grid = (n // BLOCK_SIZE,)")),
                             "triton.cdiv"),
        "ignores_strides": (edited(ADD, (ADD_LOADS, "    x = tl.load(x_ptr + offsets, mask=mask)\n"
                                                    "    y = tl.load(y_ptr + offsets, mask=mask)\n")),
                            "not contiguous"),
        # programs overlap and the tail stays unwritten: not the grid's fault, so no hint about it
        "block_start_not_scaled": (edited(ADD, ("offsets = pid * BLOCK_SIZE + tl.arange", "offsets = pid + tl.arange")),
                                   None),
        "torch_does_the_add": (edited(ADD, ("    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)   # contiguous\n",
                                            "    return x + y\n")),
                               None),
        "sum_stored_into_x": (edited(ADD, ("tl.store(out_ptr + offsets, x + y", "tl.store(x_ptr + offsets * stride_x, x + y")),
                              None),  # in place, as x += y would: the message says an input was written
    },
    SM: {
        # the "softmax without max subtraction overflowing on large inputs"
        "no_max_subtraction": (edited(SM, ("z = x - tl.max(x, axis=0)", "z = x")), "subtract the row max"),
        "masked_lanes_load_zero": (edited(SM, (', mask=mask, other=-float("inf"))', ", mask=mask, other=0.0)")), "-inf"),
        # two small edits: the mask dropped from the load and from the store
        "no_mask_on_last_block": (edited(SM, (', mask=mask, other=-float("inf"))', ")"), ("num / den, mask=mask)", "num / den)")),
                                  "missing mask"),
        "fixed_block_of_128": (edited(SM, ("BLOCK_SIZE = max(triton.next_power_of_2(n_cols), 16)", "BLOCK_SIZE = 128")),
                               "BLOCK_SIZE must cover"),
        # runs in the interpreter (it ignores num_warps); a GPU compile asserts a power of two: the message says it
        "num_warps_not_a_power_of_two": (edited(SM, ("num_warps = 4 if BLOCK_SIZE <= 2048", "num_warps = 6 if BLOCK_SIZE <= 2048")),
                                         None),
        "assumes_unit_column_stride": (edited(SM, ("cols * x_col_stride, mask", "cols, mask")), "not contiguous"),
        "torch_softmax_in_the_wrapper": (edited(SM, ("    return out\n", "    return torch.softmax(x, -1)\n")), None),
    },
    LNF: {
        # the "layernorm with unbiased variance"
        "unbiased_variance": (edited(LNF, ("var = tl.sum(xc * xc, axis=0) / n_cols", "var = tl.sum(xc * xc, axis=0) / (n_cols - 1)")),
                              "unbiased variance"),
        "masked_lanes_in_variance": (edited(LNF, ("xc = tl.where(mask, x - mean, 0.0)", "xc = x - mean")), "masked lanes"),
        "eps_outside_sqrt": (edited(LNF, ("rstd = 1.0 / tl.sqrt(var + eps)", "rstd = 1.0 / (tl.sqrt(var) + eps)")),
                             "inside the square root"),
        # two small edits: the mask dropped from the load of x and from the store of y
        "no_mask_on_last_block": (edited(LNF, ("cols * x_col_stride, mask=mask, other=0.0)", "cols * x_col_stride)"),
                                          ("xc * rstd * w + b, mask=mask)", "xc * rstd * w + b)")),
                                  "missing mask"),
        "mean_over_block": (edited(LNF, ("mean = tl.sum(x, axis=0) / n_cols", "mean = tl.sum(x, axis=0) / BLOCK_SIZE")),
                            "divide the row sum by N"),
        # E[x^2] - mean^2 in fp32: right for centred data, cancels catastrophically when the mean is large
        "one_pass_variance": (edited(LNF, ("var = tl.sum(xc * xc, axis=0) / n_cols", "var = tl.sum(x * x, axis=0) / n_cols - mean * mean")),
                              None),
    },
    LNB: {
        "dx_without_the_xhat_term": (edited(LNB, ("(wdy - (xhat * c1 + c2)) * rstd", "(wdy - c2) * rstd")),
                                     "missing the term xhat"),
        "dx_without_the_mean_term": (edited(LNB, ("(wdy - (xhat * c1 + c2)) * rstd", "(wdy - xhat * c1) * rstd")),
                                     "missing the term mean"),
        "dweight_from_x_not_xhat": (edited(LNB, ("dw_acc += dy * xhat", "dw_acc += dy * x")), "dy * xhat"),
        # stage 2 sums one partial row per row of x, but stage 1 wrote one per program
        "second_stage_sums_a_row_per_row_of_x": (edited(LNB, ("partial_dw, partial_db, dw, db, n_programs, n_cols,",
                                                              "partial_dw, partial_db, dw, db, n_rows, n_cols,")),
                                                 "torch.zeros"),
        # (x - mean) * rstd distributed: x * rstd and mean * rstd cancel when the mean is large
        "xhat_distributed": (edited(LNB, ("xhat = tl.where(mask, (x - mean) * rstd, 0.0)",
                                          "xhat = tl.where(mask, x * rstd - mean * rstd, 0.0)")),
                             None),
    },
    GTO: {
        "row_major": (edited(GTO, ("        pid_m = first_pid_m + (pid % num_pid_in_group) % group_size\n"
                                   "        pid_n = (pid % num_pid_in_group) // group_size\n",
                                   "        pid_m, pid_n = pid // num_pid_n, pid % num_pid_n\n")),
                      "row-major"),
        "last_group_not_shortened": (edited(GTO, ("group_size = min(num_pid_m - first_pid_m, group_size_m)",
                                                  "group_size = group_size_m")),
                                     "last group may be shorter"),
        "group_counts_tile_rows_not_columns": (edited(GTO, ("num_pid_in_group = group_size_m * num_pid_n",
                                                            "num_pid_in_group = group_size_m * num_pid_m")),
                                               "num_pid_n"),
    },
    MM: {
        "no_mask_on_the_last_k_step": (edited(MM, (
            "        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)\n"
            "        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)\n",
            "        a = tl.load(a_ptrs)\n        b = tl.load(b_ptrs)\n")),
                                       "Mask it"),
        "no_accumulation": (edited(MM, ("acc = tl.dot(a, b, acc)", "acc = tl.dot(a, b)")), "accumulate"),
        # two small edits: B addressed as contiguous where its pointers start and where they advance
        "assumes_contiguous_b": (edited(MM, ("b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn",
                                             "b_ptrs = b_ptr + offs_k[:, None] * N + offs_bn[None, :]"),
                                        ("b_ptrs += BLOCK_K * stride_bk", "b_ptrs += BLOCK_K * N")),
                                 "do not assume contiguous"),
        "no_mask_on_the_store": (edited(MM, (
            "tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))",
            "tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty))")),
                                 "missing mask"),
        "grouped_order_ignores_short_last_group": (edited(MM, ("pid_n = (pid % num_pid_in_group) // group_size_m",
                                                               "pid_n = (pid % num_pid_in_group) // GROUP_SIZE_M")),
                                                   "grouped order"),
    },
    FA: {
        # the "attention without causal masking": the flag never reaches the kernel
        "no_causal_mask": (edited(FA, ("HEAD_DIM=D, CAUSAL=causal)", "HEAD_DIM=D, CAUSAL=False)")),
                           "every query attended every key"),
        # the "wrong rescale of the running sum"
        "running_sum_not_rescaled": (edited(FA, ("l_i = l_i * alpha + tl.sum(p, axis=1)", "l_i = l_i + tl.sum(p, axis=1)")),
                                     "rescaled by"),
        "accumulator_not_rescaled": (edited(FA, ("acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])",
                                                 "acc = tl.dot(p.to(v.dtype), v, acc)")),
                                     "rescaled by"),
        "keys_past_sk_score_zero": (edited(FA, ("            valid = offs_n[None, :] < seq_k\n",
                                                "            valid = offs_n[None, :] >= 0\n")),
                                    "keys past Sk"),
        "causal_mask_hides_the_diagonal": (edited(FA, ("(offs_n[None, :] <= offs_m[:, None])", "(offs_n[None, :] < offs_m[:, None])")),
                                           "keep the diagonal"),
        "no_softmax_scale": (edited(FA, ("o, 1.0 / math.sqrt(D), *q.stride()", "o, 1.0, *q.stride()")), "not scaled"),
        # q's strides passed for k and v too: right until k's layout differs from q's (Sq != Sk, (B, S, H, D) memory)
        "k_and_v_with_q_strides": (edited(FA, ("*q.stride(), *k.stride(), *v.stride()", "*q.stride(), *q.stride(), *q.stride()")),
                                   "own four strides"),
    },
    OP: {
        "fake_stats_keep_a_dim": (edited(OP, (
            "x.new_empty(m, dtype=torch.float32),\n            x.new_empty(m, dtype=torch.float32))",
            "x.new_empty(m, 1, dtype=torch.float32),\n            x.new_empty(m, 1, dtype=torch.float32))")),
                                  "register_fake"),
        "fake_stats_in_the_input_dtype": (edited(OP, (
            "x.new_empty(m, dtype=torch.float32),\n            x.new_empty(m, dtype=torch.float32))",
            "x.new_empty(m), x.new_empty(m))")),
                                          "register_fake"),
        # torch's own error says it ("no autograd formula was registered. Please use register_autograd")
        "no_autograd_registration": (edited(OP, ("layer_norm_op.register_autograd(backward, setup_context=setup_context)", "")),
                                     None),
        "backward_swaps_dweight_and_dbias": (edited(OP, ("return dx, dw, db, None", "return dx, db, dw, None")), "swapped"),
        "backward_launches_the_kernel_directly": (edited(OP, (
            "dx, dw, db = layer_norm_backward_op(dy.contiguous(), x, weight, mean, rstd)",
            "dx, dw, db = layer_norm_backward(dy.contiguous(), x, weight, mean, rstd)")),
                                                  "fake"),
    },
}

GPU_BUGGY = {
    MM: {
        "dot_on_blocks_of_8": (edited(MM, (
            "    MATMUL_CONFIGS = [_mm_config(128, 256, 64, 8, 3, 8)",
            "    MATMUL_CONFIGS = [_mm_config(32, 32, 8, 4, 1, 4)]\n    _ = [_mm_config(128, 256, 64, 8, 3, 8)")),
                               "CompilationError"),
    },
    FA: {
        "key_blocks_of_8": (edited(FA, (
            "for bm, bn, s, w in [(128, 64, 3, 4),",
            "for bm, bn, s, w in [(32, 8, 1, 4)]] or [0 for bm, bn, s, w in [(128, 64, 3, 4),")),
                            "CompilationError"),
    },
}
