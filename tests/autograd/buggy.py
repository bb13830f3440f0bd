"""Known-buggy implementations of the autograd chapter's exercises: each one must be rejected by its checker.

Each bug is a mistake students really make, written as the solution plus one edit
(``edited(exercise_id, (old, new))``: the bug is the edit a reader sees; two small edits where one
cannot express it, said in a comment). Its second element is the hint the failure must give: words of
its "likely cause" line, or None when no likely cause may appear (the failure message itself says what
is wrong, or the checker cannot tell this mistake from its symptom, so it must not guess).

``GPU_BUGGY`` holds the bugs only a GPU can show: a checkpoint that restores the CPU generator but not
the CUDA one is right on a CPU, where dropout draws from the CPU generator.
"""
from ptinternals.grading.testing import edited

TESTS_OF_TESTS = {"hints", "twins", "boundaries"}

BUGGY = {
    "autograd.unbroadcast": {
        "no_leading_dims": (edited("autograd.unbroadcast", ("dims = tuple(range(lead)) + tuple(", "dims = tuple(")),
                            "every dim that broadcasting added"),
        "mean_instead_of_sum": (edited("autograd.unbroadcast", ("grad = grad.sum(dim=dims, keepdim=True)",
                                                                "grad = grad.mean(dim=dims, keepdim=True)")),
                                "mean, not a sum"),
        "no_validation": (edited("autograd.unbroadcast", (
            "    if lead < 0 or any(s != 1 and s != g for s, g in zip(shape, gshape[lead:])):\n"
            '        raise ValueError(f"shape {shape} does not broadcast to grad\'s shape {gshape}")\n', "")),
                          "raise ValueError"),
        "calls_sum_to_size": (edited("autograd.unbroadcast", ("return grad.reshape(shape)",
                                                              "return grad.sum_to_size(shape)")), None),
        "size_one_dims_not_summed": (edited("autograd.unbroadcast", (  # only the leading dims are summed
            " + tuple(lead + i for i, s in enumerate(shape) if s == 1 and gshape[lead + i] != 1)", "")),
                                     "every dim that broadcasting added or grew"),
        "no_final_reshape": (edited("autograd.unbroadcast", ("return grad.reshape(shape)", "return grad")),
                             "right values, wrong shape"),
    },
    "autograd.formulas": {
        "mul_forgets_unbroadcast": (edited("autograd.formulas", (
            "return unbroadcast(grad * b, a.shape), unbroadcast(grad * a, b.shape)", "return grad * b, grad * a")),
                                    "sum it back with unbroadcast"),
        "mul_swapped": (edited("autograd.formulas", (
            "return unbroadcast(grad * b, a.shape), unbroadcast(grad * a, b.shape)",
            "return unbroadcast(grad * a, a.shape), unbroadcast(grad * b, b.shape)")), "the OTHER input"),
        "div_sign": (edited("autograd.formulas", ("unbroadcast(-grad * a / (b * b), b.shape)",
                                                  "unbroadcast(grad * a / (b * b), b.shape)")), "minus"),
        "tanh_of_saved_result": (edited("autograd.formulas", ("return (grad * (1 - result * result),)",
                                                              "return (grad * (1 - result.tanh() * result.tanh()),)")),
                                 "RESULT"),
        "exp_of_saved_result": (edited("autograd.formulas", ("return (grad * result,)", "return (grad * result.exp(),)")),
                                "RESULT"),
        "sum_no_reshape": (edited("autograd.formulas", ("return (grad.reshape(kept).expand(input_shape),)",
                                                        "return (grad.expand(input_shape),)")),
                           "put them back as size 1"),
        "matmul_2d_only": (edited("autograd.formulas", (  # no 1-d operands, no batch broadcasting
            "    a2 = a.reshape(1, a.shape[0]) if a.ndim == 1 else a  # (..., m, k)\n",
            "    return grad @ b.transpose(-1, -2), a.transpose(-1, -2) @ grad\n"
            "    a2 = a.reshape(1, a.shape[0]) if a.ndim == 1 else a  # (..., m, k)\n")), None),
        "matmul_1d_not_reshaped": (edited("autograd.formulas", (
            "grad_a = unbroadcast(g2 @ b2.transpose(-1, -2), a2.shape).reshape(a.shape)",
            "grad_a = unbroadcast(g2 @ b2.transpose(-1, -2), a2.shape)")), "a is 1-d"),
        "exp_with_torch_function": (edited("autograd.formulas", ("return (grad * result,)",
                                                                 "return (torch.mul(grad, result),)")), None),
        "exp_forgets_tuple": (edited("autograd.formulas", ("return (grad * result,)", "return grad * result")),
                              "trailing comma"),
    },
    "autograd.backward": {
        "overwrites_buffer": (edited("autograd.backward", (
            "buffers[next_fn] = g_in if next_fn not in buffers else buffers[next_fn] + g_in",
            "buffers[next_fn] = g_in")), "add them up"),
        "ignores_hook_result": (edited("autograd.backward", ("                        g = result\n",
                                                             "                        pass\n")),
                                "use what it returns"),
        "never_releases": (edited("autograd.backward", ("if not retain_graph:", "if False:")), "release_variables"),
        "always_releases": (edited("autograd.backward", ("if not retain_graph:", "if True:")), "do not release them"),
        "skips_none_edges_uncounted": (edited("autograd.backward", (  # a None gradient skips the count too
            "                if g_in is not None:\n",
            "                if g_in is None:\n                    continue\n                if True:\n")),
                                       "even when the gradient sent along it is None"),
        "no_dependency_count": (edited("autograd.backward", (  # a node runs as soon as any gradient reaches it
            "                if dependencies[next_fn] == 0:\n",
            "                if True:\n")), "must wait until ALL its consumers"),
        "no_hooks": (edited("autograd.backward", ("for hook in fn.tensor_pre_hooks(0):", "for hook in []:")),
                     "tensor_pre_hooks"),
        "root_grad_fn_only": (edited("autograd.backward", ("start, _ = gradient_edge(root)", "start = root.grad_fn")),
                              "the root may be a leaf"),
    },
    "autograd.logsumexp": {
        "no_max_subtraction": (edited("autograd.logsumexp", (
            "out = (m + torch.log(torch.exp(x - m).sum(dim=dim, keepdim=True))).squeeze(dim)",
            "out = torch.log(torch.exp(x).sum(dim=dim, keepdim=True)).squeeze(dim)")), "subtract the max"),
        # Two edits: forward saves the softmax instead of (x, out), backward uses it (a constant to autograd).
        "saves_softmax_only": (edited("autograd.logsumexp", (
            "ctx.save_for_backward(x, out)", "ctx.save_for_backward(torch.exp(x - out.unsqueeze(dim)))"), (
            "x, out = ctx.saved_tensors\n        return grad_out.unsqueeze(ctx.dim) * torch.exp(x - out.unsqueeze(ctx.dim)), None",
            "(p,) = ctx.saved_tensors\n        return grad_out.unsqueeze(ctx.dim) * p, None")),
                               "backward must be differentiable"),
        # Two edits: forward also saves the exp(x - m) temporary, backward unpacks it.
        "saves_exp_too": (edited("autograd.logsumexp", (
            "ctx.save_for_backward(x, out)", "ctx.save_for_backward(x, out, torch.exp(x - m))"), (
            "x, out = ctx.saved_tensors", "x, out, _ = ctx.saved_tensors")), "save x and the output only"),
        "backward_without_graph": (edited("autograd.logsumexp", (
            "x, out = ctx.saved_tensors", "x, out = (t.detach() for t in ctx.saved_tensors)")),
                                   "backward must be differentiable"),
        "keeps_dim": (edited("autograd.logsumexp", ("keepdim=True))).squeeze(dim)", "keepdim=True)))")),
                      "reduced dim is removed"),
        "calls_torch_logsumexp": (edited("autograd.logsumexp", (
            "out = (m + torch.log(torch.exp(x - m).sum(dim=dim, keepdim=True))).squeeze(dim)",
            "out = torch.logsumexp(x, dim)")), None),
    },
    "autograd.fake_quantize": {
        "plain_ste": (edited("autograd.fake_quantize", ("return grad_out * mask,", "return grad_out,")), "clipped"),
        # Two edits: x is saved beside the mask, and unpacked with it.
        "saves_x_too": (edited("autograd.fake_quantize", ("ctx.save_for_backward(mask)", "ctx.save_for_backward(mask, x)"),
                               ("(mask,) = ctx.saved_tensors", "mask, _ = ctx.saved_tensors")), "1 byte per element"),
        "float_mask": (edited("autograd.fake_quantize", ("ctx.save_for_backward(mask)",
                                                         "ctx.save_for_backward(mask.float())")),
                       "1 byte per element"),
        "mask_from_x": (edited("autograd.fake_quantize", (
            "mask = (q >= quant_min) & (q <= quant_max)", "mask = (x >= quant_min * scale) & (x <= quant_max * scale)")),
                        "not from x"),
        "true_derivative": (edited("autograd.fake_quantize", ("return grad_out * mask,", "return grad_out * 0,")),
                            "straight-through"),
        "floor_not_round": (edited("autograd.fake_quantize", ("q = torch.round(x * (1.0 / scale))",
                                                              "q = torch.floor(x * (1.0 / scale))")), "not down (floor)"),
        "round_half_up": (edited("autograd.fake_quantize", ("q = torch.round(x * (1.0 / scale))",
                                                            "q = torch.floor(x * (1.0 / scale) + 0.5)")),
                          "half to even"),
    },
    "autograd.swiglu": {
        # Two edits: sigmoid(a) is saved as a third tensor, and unpacked.
        "saves_sigmoid": (edited("autograd.swiglu", ("ctx.save_for_backward(a, b)",
                                                     "ctx.save_for_backward(a, b, torch.sigmoid(a))"),
                                 ("a, b = ctx.saved_tensors", "a, b, _ = ctx.saved_tensors")), "recompute s"),
        "missing_term": (edited("autograd.swiglu", ("grad_out * b * s * (1 + a * (1 - s))", "grad_out * b * s")),
                         "term is missing"),
        "backward_detached": (edited("autograd.swiglu", (
            "a, b = ctx.saved_tensors", "a, b, grad_out = ctx.saved_tensors[0].detach(), ctx.saved_tensors[1].detach(), "
                                        "grad_out.detach()")), "differentiable"),
        "only_grad_for_a": (edited("autograd.swiglu", (", grad_out * a * s", "")), None),
        "silu_without_a": (edited("autograd.swiglu", ("return a * torch.sigmoid(a) * b", "return torch.sigmoid(a) * b")),
                           None),
    },
    "autograd.checkpoint": {
        "no_checkpoint": (edited("autograd.checkpoint", ("return CheckpointFunction.apply(fn, x)", "return fn(x)")),
                          "torch.no_grad()"),
        "no_rng_restore": (edited("autograd.checkpoint", ("            torch.set_rng_state(ctx.cpu_state)\n", "")),
                           "dropout mask"),
        "input_grad_only": (edited("autograd.checkpoint", (
            "        torch.autograd.backward(out, grad_out)  # fills x.grad and the parameters' .grad\n"
            "        return None, x.grad",
            "        (grad_x,) = torch.autograd.grad(out, x, grad_out)\n        return None, grad_x")),
                            "parameters inside the block got no gradient"),
        "saves_activations": (edited("autograd.checkpoint", (  # the forward's graph kept alive on ctx
            "        with torch.no_grad():  # no graph: the block's activations are freed as it runs\n"
            "            return fn(x)",
            "        with torch.enable_grad():\n            ctx.out = fn(x.detach().requires_grad_(True))\n"
            "        return ctx.out.detach()")), "torch.no_grad()"),
    },
    "autograd.accumulate": {
        "one_over_k": (edited("autograd.accumulate", ("weight = xs.shape[0] / n", "weight = 1 / micro_batches")),
                       "n_i / N"),
        "no_scaling": (edited("autograd.accumulate", ("(loss * weight).backward()", "loss.backward()")), "scaled down"),
        "no_zero_grad": (edited("autograd.accumulate", ("    model.zero_grad(set_to_none=True)\n", "")), "stale .grad"),
        "full_batch_at_once": (edited("autograd.accumulate", (
            "zip(torch.tensor_split(batch_x, micro_batches), torch.tensor_split(batch_y, micro_batches))",
            "zip([batch_x], [batch_y])")), "split the batch"),
        "calls_forward": (edited("autograd.accumulate", ("model(xs)", "model.forward(xs)")), "model.forward(x)"),
        "loss_not_weighted": (edited("autograd.accumulate", ("total += loss.item() * weight", "total += loss.item()")),
                              None),
    },
}

GPU_BUGGY = {
    "autograd.checkpoint": {
        # The notebook's solution before issue 17: only the CPU generator is saved and restored, so on a GPU the
        # recomputation draws fresh dropout masks from the CUDA generator.
        "cpu_rng_only": (edited("autograd.checkpoint", ("ctx.devices = [x.device] if x.is_cuda else []",
                                                        "ctx.devices = []")), "dropout mask"),
        "cuda_state_not_restored": (edited("autograd.checkpoint", (
            "                torch.cuda.set_rng_state(state, device)\n", "                pass\n")), "dropout mask"),
    },
}
