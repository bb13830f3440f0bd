"""Known-buggy implementations of the kernels chapter's exercises: each one must be rejected by its checker.

Each bug is a mistake students really make in Triton (the issue names several: softmax without the max
subtraction, a missing mask on the last block, layer norm with the unbiased variance, attention without
the causal mask or with a wrong rescale of the running sum). ``expect`` words must appear in the
failure message, so the message names the likely cause.

The kernels are long, so most bugs are written as edits of the solution's answer cell
(``ptinternals.grading.testing.edited``): each is still a complete replacement for that cell, which is what the end-to-end
tests paste into a notebook. An edit whose text is no longer in the solution fails loudly.

``GPU_BUGGY`` holds bugs only a GPU can see (the interpreter accepts ``tl.dot`` on 8 x 8 blocks; a GPU
compile refuses): same format, run by the ``gpu``-marked test.
"""

from ptinternals.grading.testing import edited

# Exercise kernels.custom_op wraps the student's own layer_norm_forward and layer_norm_backward: a bug there fails it too (end-to-end tests).
DEPENDS_ON = {"kernels.custom_op": ("kernels.layer_norm_forward", "kernels.layer_norm_backward")}


ADD_HEAD = """
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, stride_x, stride_y, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
"""

BUGGY = {
    "kernels.add": {
        # the "missing mask on the last block"
        "no_mask_on_last_block": (
            ADD_HEAD
            + """
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    x = tl.load(x_ptr + offsets * stride_x)
    y = tl.load(y_ptr + offsets * stride_y)
    tl.store(out_ptr + offsets, x + y)


def add(x, y):
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.numel()
    add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, x.stride(0), y.stride(0), BLOCK_SIZE=1024)
    return out
""",
            "missing mask",
        ),
        "grid_rounds_down": (
            ADD_HEAD
            + """
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets * stride_x, mask=mask)
    y = tl.load(y_ptr + offsets * stride_y, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def add(x, y):
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.numel()
    add_kernel[(n // 1024,)](x, y, out, n, x.stride(0), y.stride(0), BLOCK_SIZE=1024)
    return out
""",
            "triton.cdiv",
        ),
        "ignores_strides": (
            ADD_HEAD
            + """
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def add(x, y):
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.numel()
    add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, x.stride(0), y.stride(0), BLOCK_SIZE=1024)
    return out
""",
            "not contiguous",
        ),
        "block_start_not_scaled": (
            ADD_HEAD
            + """
    offsets = pid + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets * stride_x, mask=mask)
    y = tl.load(y_ptr + offsets * stride_y, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def add(x, y):
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.numel()
    add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, x.stride(0), y.stride(0), BLOCK_SIZE=1024)
    return out
""",
            None,
        ),
        "torch_does_the_add": (
            """
def add(x, y):
    return x + y
""",
            "launched no Triton kernel",
        ),
    },
    "kernels.softmax": {
        # the "softmax without max subtraction overflowing on large inputs"
        "no_max_subtraction": (
            edited("kernels.softmax", ("z = x - tl.max(x, axis=0)", "z = x")),
            "subtract the row max",
        ),
        "masked_lanes_load_zero": (
            edited("kernels.softmax", (', mask=mask, other=-float("inf"))', ", mask=mask, other=0.0)")),
            "-inf",
        ),
        "no_mask_on_last_block": (
            edited(
                "kernels.softmax",
                (', mask=mask, other=-float("inf"))', ")"),
                ("num / den, mask=mask)", "num / den)"),
            ),
            "missing mask",
        ),
        "fixed_block_of_128": (
            edited(
                "kernels.softmax", ("BLOCK_SIZE = max(triton.next_power_of_2(n_cols), 16)", "BLOCK_SIZE = 128")
            ),
            "BLOCK_SIZE must cover",
        ),
        "assumes_unit_column_stride": (
            edited("kernels.softmax", ("cols * x_col_stride, mask", "cols, mask")),
            "not contiguous",
        ),
        "torch_softmax_in_the_wrapper": (
            edited("kernels.softmax", ("    return out\n", "    return torch.softmax(x, -1)\n")),
            "computed with torch",
        ),
    },
    "kernels.layer_norm_forward": {
        # the "layernorm with unbiased variance"
        "unbiased_variance": (
            edited(
                "kernels.layer_norm_forward",
                ("var = tl.sum(xc * xc, axis=0) / n_cols", "var = tl.sum(xc * xc, axis=0) / (n_cols - 1)"),
            ),
            "unbiased variance",
        ),
        "masked_lanes_in_variance": (
            edited("kernels.layer_norm_forward", ("xc = tl.where(mask, x - mean, 0.0)", "xc = x - mean")),
            "masked lanes",
        ),
        "eps_outside_sqrt": (
            edited("kernels.layer_norm_forward", ("rstd = 1.0 / tl.sqrt(var + eps)", "rstd = 1.0 / (tl.sqrt(var) + eps)")),
            "inside the square root",
        ),
        "no_mask_on_last_block": (
            edited(
                "kernels.layer_norm_forward",
                ("cols * x_col_stride, mask=mask, other=0.0)", "cols * x_col_stride)"),
                ("xc * rstd * w + b, mask=mask)", "xc * rstd * w + b)"),
            ),
            "missing mask",
        ),
        "mean_over_block": (
            edited(
                "kernels.layer_norm_forward", ("mean = tl.sum(x, axis=0) / n_cols", "mean = tl.sum(x, axis=0) / BLOCK_SIZE")
            ),
            "divide the row sum by N",
        ),
    },
    "kernels.layer_norm_backward": {
        "dx_without_the_xhat_term": (
            edited("kernels.layer_norm_backward", ("(wdy - (xhat * c1 + c2)) * rstd", "(wdy - c2) * rstd")),
            "missing the term xhat",
        ),
        "dx_without_the_mean_term": (
            edited("kernels.layer_norm_backward", ("(wdy - (xhat * c1 + c2)) * rstd", "(wdy - xhat * c1) * rstd")),
            "missing the term mean",
        ),
        "dweight_from_x_not_xhat": (
            edited("kernels.layer_norm_backward", ("dw_acc += dy * xhat", "dw_acc += dy * x")),
            "dy * xhat",
        ),
        "partials_summed_from_torch_empty": (
            edited(
                "kernels.layer_norm_backward",
                (
                    "partial_dw = torch.empty((n_programs, n_cols)",
                    "partial_dw = torch.empty((n_programs + 1, n_cols)",
                ),
                (
                    "partial_db = torch.empty((n_programs, n_cols)",
                    "partial_db = torch.empty((n_programs + 1, n_cols)",
                ),
                (
                    "partial_dw, partial_db, dw, db, n_programs, n_cols,",
                    "partial_dw, partial_db, dw, db, n_programs + 1, n_cols,",
                ),
            ),
            "torch.zeros",
        ),
    },
    "kernels.grouped_tile_order": {
        "row_major": (
            """
def grouped_tile_order(num_pid_m, num_pid_n, group_size_m):
    return [(pid // num_pid_n, pid % num_pid_n) for pid in range(num_pid_m * num_pid_n)]
""",
            "row-major",
        ),
        "last_group_not_shortened": (
            """
def grouped_tile_order(num_pid_m, num_pid_n, group_size_m):
    order = []
    num_pid_in_group = group_size_m * num_pid_n
    for pid in range(num_pid_m * num_pid_n):
        first_pid_m = (pid // num_pid_in_group) * group_size_m
        pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
        pid_n = (pid % num_pid_in_group) // group_size_m
        order.append((pid_m, pid_n))
    return order
""",
            "last group may be shorter",
        ),
        "group_counts_tile_rows_not_columns": (
            """
def grouped_tile_order(num_pid_m, num_pid_n, group_size_m):
    order = []
    num_pid_in_group = group_size_m * num_pid_m
    for pid in range(num_pid_m * num_pid_n):
        first_pid_m = (pid // num_pid_in_group) * group_size_m
        group_size = min(num_pid_m - first_pid_m, group_size_m)
        pid_m = first_pid_m + (pid % num_pid_in_group) % group_size
        pid_n = (pid % num_pid_in_group) // group_size
        order.append((pid_m, pid_n))
    return order
""",
            "num_pid_n",
        ),
    },
    "kernels.matmul": {
        "no_mask_on_the_last_k_step": (
            edited(
                "kernels.matmul",
                ("a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)", "a = tl.load(a_ptrs)"),
                ("b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)", "b = tl.load(b_ptrs)"),
            ),
            "Mask it",
        ),
        "no_accumulation": (
            edited("kernels.matmul", ("acc = tl.dot(a, b, acc)", "acc = tl.dot(a, b)")),
            "accumulate",
        ),
        "assumes_contiguous_b": (
            edited(
                "kernels.matmul",
                (
                    "b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn",
                    "b_ptrs = b_ptr + offs_k[:, None] * N + offs_bn[None, :]",
                ),
                ("b_ptrs += BLOCK_K * stride_bk", "b_ptrs += BLOCK_K * N"),
            ),
            "do not assume contiguous",
        ),
        "no_mask_on_the_store": (
            edited(
                "kernels.matmul",
                (
                    "tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))",
                    "tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty))",
                ),
            ),
            "missing mask",
        ),
        "grouped_order_ignores_short_last_group": (
            edited(
                "kernels.matmul",
                (
                    "pid_n = (pid % num_pid_in_group) // group_size_m",
                    "pid_n = (pid % num_pid_in_group) // GROUP_SIZE_M",
                ),
            ),
            "grouped order",
        ),
    },
    "kernels.flash_attention": {
        # the "attention without causal masking"
        "no_causal_mask": (
            edited(
                "kernels.flash_attention",
                (
                    "                valid = valid & (offs_n[None, :] <= offs_m[:, None])\n",
                    "                pass\n",
                ),
                ("        hi = tl.minimum((start_m + 1) * BLOCK_M, SEQ_K)", "        hi = SEQ_K"),
                (
                    "hi_unmasked = tl.minimum((start_m * BLOCK_M) // BLOCK_N * BLOCK_N, seq_k_full)",
                    "hi_unmasked = seq_k_full",
                ),
            ),
            "every query attended every key",
        ),
        # the "wrong rescale of the running sum"
        "running_sum_not_rescaled": (
            edited("kernels.flash_attention", ("l_i = l_i * alpha + tl.sum(p, axis=1)", "l_i = l_i + tl.sum(p, axis=1)")),
            "rescaled by",
        ),
        "accumulator_not_rescaled": (
            edited(
                "kernels.flash_attention",
                (
                    "acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])",
                    "acc = tl.dot(p.to(v.dtype), v, acc)",
                ),
            ),
            "rescaled by",
        ),
        "keys_past_sk_score_zero": (
            edited(
                "kernels.flash_attention",
                (
                    "            valid = offs_n[None, :] < seq_k\n",
                    "            valid = offs_n[None, :] >= 0\n",
                ),
            ),
            "keys past Sk",
        ),
        "causal_mask_hides_the_diagonal": (
            edited(
                "kernels.flash_attention", ("(offs_n[None, :] <= offs_m[:, None])", "(offs_n[None, :] < offs_m[:, None])")
            ),
            "keep the diagonal",
        ),
        "no_softmax_scale": (
            edited("kernels.flash_attention", ("o, 1.0 / math.sqrt(D), *q.stride()", "o, 1.0, *q.stride()")),
            "not scaled",
        ),
    },
    "kernels.custom_op": {
        "fake_stats_keep_a_dim": (
            edited(
                "kernels.custom_op",
                (
                    "x.new_empty(m, dtype=torch.float32),\n            x.new_empty(m, dtype=torch.float32))",
                    "x.new_empty(m, 1, dtype=torch.float32),\n            x.new_empty(m, 1, dtype=torch.float32))",
                ),
            ),
            "register_fake",
        ),
        "fake_stats_in_the_input_dtype": (
            edited(
                "kernels.custom_op",
                (
                    "x.new_empty(m, dtype=torch.float32),\n            x.new_empty(m, dtype=torch.float32))",
                    "x.new_empty(m), x.new_empty(m))",
                ),
            ),
            "register_fake",
        ),
        "no_autograd_registration": (
            edited(
                "kernels.custom_op", ("layer_norm_op.register_autograd(backward, setup_context=setup_context)", "")
            ),
            "register_autograd",
        ),
        "backward_swaps_dweight_and_dbias": (
            edited("kernels.custom_op", ("return dx, dw, db, None", "return dx, db, dw, None")),
            "gradients",
        ),
        "backward_launches_the_kernel_directly": (
            edited(
                "kernels.custom_op",
                (
                    "dx, dw, db = layer_norm_backward_op(dy.contiguous(), x, weight, mean, rstd)",
                    "dx, dw, db = layer_norm_backward(dy.contiguous(), x, weight, mean, rstd)",
                ),
            ),
            "fake",
        ),
    },
}

GPU_BUGGY = {
    "kernels.matmul": {
        "dot_on_blocks_of_8": (
            edited(
                "kernels.matmul",
                (
                    "    MATMUL_CONFIGS = [_mm_config(128, 256, 64, 8, 3, 8)",
                    "    MATMUL_CONFIGS = [_mm_config(32, 32, 8, 4, 1, 4)]\n"
                    "    _ = [_mm_config(128, 256, 64, 8, 3, 8)",
                ),
            ),
            "CompilationError",
        ),
    },
    "kernels.flash_attention": {
        "key_blocks_of_8": (
            edited(
                "kernels.flash_attention",
                (
                    "for bm, bn, s, w in [(128, 64, 3, 4),",
                    "for bm, bn, s, w in [(32, 8, 1, 4)]] or [0 for bm, bn, s, w in [(128, 64, 3, 4),",
                ),
            ),
            "CompilationError",
        ),
    },
}
