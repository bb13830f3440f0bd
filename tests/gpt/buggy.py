"""Known-buggy implementations of the gpt chapter's exercises: each one must be rejected by its checker.

Each bug is a mistake students really make, written as the solution plus one edit
(``edited(exercise_id, (old, new))``: the bug is the edit a reader sees, and it stays a complete
replacement for the answer cell, as the end-to-end tests need). Its second element is the hint the
failure must give: words of its "likely cause" line, or None when no likely cause may appear (the
checker cannot tell this mistake from its symptom, or the failure message itself already names it).
"""
from ptinternals.grading.testing import edited

TESTS_OF_TESTS = {"hints", "twins", "boundaries"}

#: Exercises graded through another's answer cell: a bug there may fail them too (tests/test_notebooks.py).
SLOW_HIDDEN = {"gpt.train_gpt"}  # its hidden case is the graded 800-step training run (a slow test)
DEPENDS_ON = {"gpt.train_gpt": ("gpt.gpt", "gpt.train_step"),
              "gpt.train_gpu": ("gpt.gpt", "gpt.train_step", "gpt.train_gpt")}

_QKV = ("        q = q.view(B, T, self.n_head, hs).transpose(1, 2)                  # (B, nh, T, hs)\n"
        "        k = k.view(B, T, self.n_head, hs).transpose(1, 2)\n"
        "        v = v.view(B, T, self.n_head, hs).transpose(1, 2)\n")
_OP_CALL = "    return _LAYER_NORM_OP[0](x, weight, bias, float(eps))[0]"

BUGGY = {
    "gpt.gpt": {
        "no_causal_mask": (edited("gpt.gpt", ("is_causal=True", "is_causal=False")), "no causal mask"),
        "scale_by_n_embd": (edited("gpt.gpt", ("is_causal=True)", "is_causal=True, scale=1.0 / math.sqrt(C))")),
                            "1/sqrt(head size)"),
        "post_norm": (edited("gpt.gpt", ("x = x + self.attn(self.ln_1(x))\n        return x + self.mlp(self.ln_2(x))",
                                         "x = self.ln_1(x + self.attn(x))\n        return self.ln_2(x + self.mlp(x))")),
                      "post-norm"),
        # the logits are right: the message says "not tied", and no likely cause is needed
        "untied_head": (edited("gpt.gpt", ("        self.transformer.wte.weight = self.lm_head.weight", "")), None),
        "tanh_gelu": (edited("gpt.gpt", ("nn.GELU()", "nn.GELU(approximate='tanh')")), "tanh"),
        "heads_split_wrong": (edited("gpt.gpt", (_QKV, "".join(
            f"        {t} = {t}.view(B, T, hs, self.n_head).permute(0, 3, 1, 2)\n" for t in "qkv"))),
                              "heads are split"),
        "no_final_norm": (edited("gpt.gpt", ("self.lm_head(self.transformer.ln_f(x))", "self.lm_head(x)")), "ln_f"),
        "no_position_embedding": (edited("gpt.gpt", ("self.transformer.wte(idx) + self.transformer.wpe(pos)",
                                                     "self.transformer.wte(idx)")), "position embeddings"),
        # the logits are right (the grader loads fixed weights): the message names the initialisation
        "c_proj_not_scaled": (edited("gpt.gpt", ("0.02 / math.sqrt(2 * config.n_layer) if name.endswith", "0.02 if "
                                                 "name.endswith")), None),
        "biases_left_at_torch_default": (edited("gpt.gpt", ("            elif name.endswith(\"bias\"):\n"
                                                            "                nn.init.zeros_(p)\n", "")), None),
        # the values are right: the message says what autograd saved with the switch off and on
        "checkpointing_switch_ignored": (edited("gpt.gpt", ("x = checkpoint(block, x) if recompute else block(x)",
                                                            "x = block(x)")), None),
    },
    "gpt.kernel_layer_norm": {
        "unbiased_variance": (edited("gpt.kernel_layer_norm", ("tl.sum(xc * xc, axis=0) / N + eps",
                                                               "tl.sum(xc * xc, axis=0) / (N - 1) + eps")), "N - 1"),
        "masked_lanes_in_variance": (edited("gpt.kernel_layer_norm",
                                            ("xc = tl.where(mask, x - mean, 0.0)", "xc = x - mean")), "masked lanes"),
        "dx_without_the_mean_terms": (edited("gpt.kernel_layer_norm", (
            "dx = (g - (xhat * (tl.sum(xhat * g, axis=0) / N) + tl.sum(g, axis=0) / N)) * rstd", "dx = g * rstd")),
                                      "x.grad"),
        "dweight_from_one_row": (edited("gpt.kernel_layer_norm", ("dw_rows.sum(0).to(weight.dtype)",
                                                                  "dw_rows[:1].sum(0).to(weight.dtype)")), "ALL rows"),
        "no_fake": (edited("gpt.kernel_layer_norm", ("    @layer_norm.register_fake\n    def _(x, weight, bias, eps):",
                                                     "    def _(x, weight, bias, eps):")), "register_fake"),
        "no_fake_for_the_backward_op": (edited("gpt.kernel_layer_norm", (
            "    @layer_norm_backward.register_fake\n", "")), "register_fake"),
        # the message names the op, the output and both shapes: no likely cause is needed
        "fake_mean_of_the_first_dim_only": (edited("gpt.kernel_layer_norm", ("M = math.prod(x.shape[:-1])",
                                                                             "M = x.shape[0]")), None),
        # the answer is right and the message names the shortcut: no likely cause is needed
        "calls_torch": (edited("gpt.kernel_layer_norm", (_OP_CALL, "    return torch.nn.functional.layer_norm("
                                                                   "x, (x.shape[-1],), weight, bias, float(eps))")),
                        None),
        "not_an_operator": (edited("gpt.kernel_layer_norm", (_OP_CALL, (
            "    mean = x.mean(-1, keepdim=True)\n"
            "    var = ((x - mean) ** 2).mean(-1, keepdim=True)\n"
            "    return (x - mean) / torch.sqrt(var + eps) * weight + bias"))), None),
    },
    "gpt.checkpoint": {
        "no_rng_restore": (edited("gpt.checkpoint", ("            torch.set_rng_state(cpu_state)\n", "")),
                           "dropout masks"),
        "keeps_activations": (edited("gpt.checkpoint", (
            "    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):\n        return fn(*args)",
            "    return fn(*args)")), "activations are still saved"),
        "output_cut_from_the_graph": (edited("gpt.checkpoint", ("        return fn(*args)",
                                                                "        return fn(*args).detach().requires_grad_()")),
                                      None),
        "recompute_without_grad": (edited("gpt.checkpoint", ("            with torch.enable_grad(), torch.autograd",
                                                             "            with torch.no_grad(), torch.autograd")), None),
        # torch's reentrant checkpoint has this flaw: when no INPUT needs grad (a frozen embedding before the
        # first block), the parameters inside the block get no gradient either
        "no_graph_when_inputs_need_no_grad": (edited("gpt.checkpoint", (
            "    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):\n        return fn(*args)",
            "    if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):\n"
            "        with torch.no_grad():\n            return fn(*args)\n"
            "    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):\n        return fn(*args)")), None),
    },
    "gpt.train_step": {
        "no_division_by_micro_batches": (edited("gpt.train_step", ("                loss = loss / len(batches)\n", "")),
                                         "divide each micro-batch"),
        # without unscale_, clip_grad_norm_ measures and clips the scaled gradients (scaler.step unscales later)
        "clip_before_unscale": (edited("gpt.train_step",
                                       ("    if scaler is not None:\n        scaler.unscale_(optimizer)\n", "")),
                                "unscale_"),
        "no_zero_grad": (edited("gpt.train_step", ("    optimizer.zero_grad(set_to_none=True)\n", "")),
                         "zero the gradients"),
        # the message says that .grad is kept as zeros and why None is asked for: no likely cause is needed
        "grads_kept_as_zeros": (edited("gpt.train_step", ("zero_grad(set_to_none=True)", "zero_grad(set_to_none=False)")),
                                None),
        # the message says which dtype the matmuls ran in: no likely cause is needed
        "no_autocast": (edited("gpt.train_step", ("with autocast_context(device_type, amp_dtype):",
                                                  "with contextlib.nullcontext():")), None),
        "norm_after_clipping": (edited("gpt.train_step", ("    return total, float(norm)",
                                                          "    return total, float(torch.nn.utils.clip_grad_norm_("
                                                          "params, float('inf')))")), "BEFORE clipping"),
        # the message says which forwards ran inside no_sync(): no likely cause is needed
        "no_sync_around_the_last_micro_batch": (edited("gpt.train_step", ("last = i == len(batches) - 1",
                                                                          "last = i == 0")), None),
        "no_clipping": (edited("gpt.train_step", ("grad_clip if grad_clip > 0 else float(\"inf\")",
                                                  "float(\"inf\")")), "clip the gradient norm"),
        # a missing gradient taken as zero: weight decay then moves frozen and unused parameters (issue 16's
        # ZeroRedundancyAdamW bug), which torch's optimizers skip
        "missing_grads_as_zeros": (edited("gpt.train_step", (
            "    if scaler is not None:\n        scaler.step(optimizer)",
            "    for p in params:\n        if p.grad is None:\n            p.grad = torch.zeros_like(p)\n"
            "    if scaler is not None:\n        scaler.step(optimizer)")), None),
    },
    "gpt.ddp": {
        "sum_not_mean": (edited("gpt.ddp", ("        param.grad.div_(self.world_size)", "")), "summed over ranks"),
        "no_broadcast": (edited("gpt.ddp", ("                dist.broadcast(t, src=0)", "                pass")),
                         "broadcast rank 0"),
        # the message counts the collectives inside no_sync(): no likely cause is needed
        "communicates_inside_no_sync": (edited("gpt.ddp", ("        if not self.sync:\n            return", "")), None),
        "broadcast_instead_of_all_reduce": (edited("gpt.ddp", ("dist.all_reduce(param.grad, async_op=True)",
                                                               "dist.broadcast(param.grad, src=0, async_op=True)")),
                                            None),
        # every parameter reduced at the end of backward, a missing .grad as zeros: weight decay then moves the
        # frozen and unused parameters, which torch's SGD skips (their .grad is None)
        "missing_grads_as_zeros": (edited("gpt.ddp", (
            "        for work in self.pending:",
            "        for p in self.module.parameters():\n            if p.grad is None:\n"
            "                p.grad = torch.zeros_like(p)\n        for work in self.pending:")), None),
    },
    "gpt.train_gpt": {
        "returns_an_untrained_model": (edited("gpt.train_gpt", ("    fit(model, optimizer", "    0 and fit(model, optimizer")),
                                       "not trained"),
        # a high loss has many causes: the checker must not guess which
        "stops_after_a_few_steps": (edited("gpt.train_gpt", ("    config = config.replace(vocab_size=tokenizer.vocab_size)",
                                                             "    config = config.replace(vocab_size=tokenizer.vocab_size, "
                                                             "max_iters=4, lr_decay_iters=4, warmup_iters=0)")), None),
        "vocab_size_not_set": (edited("gpt.train_gpt",
                                      ("    config = config.replace(vocab_size=tokenizer.vocab_size)\n", "")), None),
        # the message says autocast ran on the CPU: no likely cause is needed
        "autocast_on_the_cpu": (edited("gpt.train_gpt", ("if config.amp and device == \"cuda\" else None",
                                                         "if config.amp else None")), None),
        "cuda_without_asking_torch": (edited("gpt.train_gpt", ("config.device != \"cpu\" and torch.cuda.is_available()",
                                                               "config.device != \"cpu\"")), None),
    },
    "gpt.train_gpu": {
        "cpu_preset": (edited("gpt.train_gpu", ('train_gpt("gpu"', 'train_gpt("cpu"')), "cpu preset"),
        # the message names the field that differs from the preset: no likely cause is needed
        "no_dropout": (edited("gpt.train_gpu", ('my_choices = {"amp": True}',
                                                'my_choices = {"amp": True, "dropout": 0.0}')), None),
        "short_context": (edited("gpt.train_gpu", ('my_choices = {"amp": True}',
                                                   'my_choices = {"amp": True, "block_size": 128}')), None),
    },
}
