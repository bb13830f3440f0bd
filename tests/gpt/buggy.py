"""Known-buggy implementations of the gpt chapter's exercises: each one must be rejected by its checker.

Each bug is a mistake students really make. Most are the solution's answer cell with one edit (so
each source is a complete replacement for that exercise's answer cell, as the end-to-end tests need);
``expect`` words must appear in the failure message (the checker's likely cause, or its description).
"""
from ptinternals.grading.testing import answer_sources

SOLUTION = answer_sources("gpt")


def edit(grade_id: str, *pairs: tuple[str, str]) -> str:
    """The solution's answer cell ``grade_id`` with each (old, new) replacement applied (old must occur)."""
    src = SOLUTION[grade_id]
    for old, new in pairs:
        if old not in src:
            raise AssertionError(f"{grade_id}: {old!r} is not in the solution cell")
        src = src.replace(old, new)
    return src


#: Exercises graded through another's answer cell: a bug there may fail them too (tests/test_notebooks.py).
SLOW_HIDDEN = {"gpt.train_gpt"}  # its hidden case is the graded 800-step training run (a slow test)
DEPENDS_ON = {"gpt.train_gpt": ("gpt.gpt", "gpt.train_step"),
              "gpt.train_gpu": ("gpt.gpt", "gpt.train_step", "gpt.train_gpt")}

GPT = "gpt_code"
LN = "kernel_layer_norm_code"
STEP = "train_step_code"
DDP = "ddp_code"
RUN = "train_gpt_code"
GPU = "train_gpu_code"

BUGGY = {
    "gpt.gpt": {
        "no_causal_mask": (edit(GPT, ("is_causal=True", "is_causal=False")), "no causal mask"),
        "scale_by_n_embd": (edit(GPT, ("is_causal=True)", "is_causal=True, scale=1.0 / math.sqrt(C))")),
                            "1/sqrt(head size)"),
        "post_norm": (edit(GPT, ("x = x + self.attn(self.ln_1(x))\n        return x + self.mlp(self.ln_2(x))",
                                 "x = self.ln_1(x + self.attn(x))\n        return self.ln_2(x + self.mlp(x))")),
                      "post-norm"),
        "untied_head": (edit(GPT, ("        self.transformer.wte.weight = self.lm_head.weight", "")), "not tied"),
        "tanh_gelu": (edit(GPT, ("nn.GELU()", "nn.GELU(approximate='tanh')")), "tanh"),
        "heads_split_wrong": (edit(GPT, *[(f"{t} = {t}.view(B, T, self.n_head, hs).transpose(1, 2)",
                                           f"{t} = {t}.view(B, T, hs, self.n_head).permute(0, 3, 1, 2)")
                                          for t in "qkv"]), "heads are split"),
        "no_final_norm": (edit(GPT, ("self.lm_head(self.transformer.ln_f(x))", "self.lm_head(x)")), "ln_f"),
        "no_position_embedding": (edit(GPT, ("self.transformer.wte(idx) + self.transformer.wpe(pos)",
                                             "self.transformer.wte(idx)")), "position embeddings"),
    },
    "gpt.kernel_layer_norm": {
        "unbiased_variance": (edit(LN, ("tl.sum(xc * xc, axis=0) / N + eps",
                                        "tl.sum(xc * xc, axis=0) / (N - 1) + eps")),
                              "N - 1"),
        "masked_lanes_in_variance": (edit(LN, ("xc = tl.where(mask, x - mean, 0.0)", "xc = x - mean")),
                                     "masked lanes"),
        "dx_without_the_mean_terms": (edit(LN, ("dx = (g - (xhat * (tl.sum(xhat * g, axis=0) / N) + "
                                                "tl.sum(g, axis=0) / N)) * rstd", "dx = g * rstd")), "x.grad"),
        "dweight_from_one_row": (edit(LN, ("dw_rows.sum(0).to(weight.dtype)", "dw_rows[:1].sum(0).to(weight.dtype)")),
                                 "ALL rows"),
        "no_fake": (edit(LN, ("    @layer_norm.register_fake\n    def _(x, weight, bias, eps):",
                              "    def _(x, weight, bias, eps):")), "register_fake"),
        "calls_torch": ("""
import torch
import torch.nn.functional as F


def make_layer_norm_op():
    return None


def kernel_layer_norm(x, weight, bias=None, eps=1e-5):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
""", "torch's own layer norm"),
        "not_an_operator": ("""
import torch


def make_layer_norm_op():
    return None


def kernel_layer_norm(x, weight, bias=None, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps) * weight
    return y if bias is None else y + bias
""", "no custom op"),
    },
    "gpt.checkpoint": {
        "no_rng_restore": (edit("checkpoint_code", ("            torch.set_rng_state(cpu_state)\n", "")), "dropout masks"),
        "keeps_activations": ("""
def checkpoint(fn, *args):
    return fn(*args)
""", "activations are still saved"),
        "output_cut_from_the_graph": ("""
import torch


def checkpoint(fn, *args):
    with torch.no_grad():
        out = fn(*args)
    return out.requires_grad_()
""", "no .grad"),
        "recompute_without_grad": (edit("checkpoint_code", ("            with torch.enable_grad(), torch.autograd",
                                                       "            with torch.no_grad(), torch.autograd")), None),
    },
    "gpt.train_step": {
        "no_division_by_micro_batches": (edit(STEP, ("                loss = loss / len(batches)\n", "")),
                                         "divide each micro-batch"),
        "clip_before_unscale": (edit(STEP, ("    if scaler is not None:\n        scaler.unscale_(optimizer)\n", ""),
                                     ("    if scaler is not None:\n        scaler.step(optimizer)",
                                      "    if scaler is not None:\n        scaler.unscale_(optimizer)\n"
                                      "        scaler.step(optimizer)")), "unscale_"),
        "no_zero_grad": (edit(STEP, ("    optimizer.zero_grad(set_to_none=True)\n", "")), "zero the gradients"),
        "no_autocast": (edit(STEP, ("with autocast_context(device_type, amp_dtype):",
                                    "with contextlib.nullcontext():")),
                        "autocast"),
        "norm_after_clipping": (edit(STEP, ("    return total, float(norm)",
                                            "    return total, float(torch.nn.utils.clip_grad_norm_(params, "
                                            "float('inf')))")),
                                "BEFORE clipping"),
    },
    "gpt.ddp": {
        "sum_not_mean": (edit(DDP, ("        param.grad.div_(self.world_size)", "")), "summed over ranks"),
        "no_broadcast": (edit(DDP, ("                dist.broadcast(t, src=0)", "                pass")),
                         "broadcast rank 0"),
        "communicates_inside_no_sync": (edit(DDP, ("        if not self.sync:\n            return", "")),
                                        "inside no_sync"),
        "broadcast_instead_of_all_reduce": (edit(DDP, ("dist.all_reduce(param.grad, async_op=True)",
                                                       "dist.broadcast(param.grad, src=0, async_op=True)")), None),
    },
    "gpt.train_gpt": {
        "returns_an_untrained_model": (edit(RUN, ("    fit(model, optimizer", "    0 and fit(model, optimizer")),
                                       "not trained"),
        "stops_after_a_few_steps": (edit(RUN, ("    config = config.replace(vocab_size=tokenizer.vocab_size)",
                                               "    config = config.replace(vocab_size=tokenizer.vocab_size, "
                                               "max_iters=4, lr_decay_iters=4, warmup_iters=0)")),
                                    "learned little"),
        "vocab_size_not_set": (edit(RUN, ("    config = config.replace(vocab_size=tokenizer.vocab_size)\n", "")), None),
    },
    "gpt.train_gpu": {
        "cpu_preset": (edit(GPU, ('train_gpt("gpu"', 'train_gpt("cpu"')), "cpu preset"),
        "no_dropout": (edit(GPU, ('my_choices = {"amp": True}', 'my_choices = {"amp": True, "dropout": 0.0}')),
                       "dropout=0.0"),
        "short_context": (edit(GPU, ('my_choices = {"amp": True}', 'my_choices = {"amp": True, "block_size": 128}')),
                          "block_size=128"),
    },
}
