# %% [markdown]
# # {{title}}
#
# The chapters before this one took PyTorch apart. This one puts a model back together from the pieces you built:
# a character-level GPT, trained on the complete works of Shakespeare (1.1 million characters),
# that writes recognisably Shakespeare-like text after a minute or two on a laptop CPU. Each course part
# plugs in where it acts in a real training run:
#
# | part | chapter | where it acts here |
# |---|---|---|
# | activation checkpointing | 2, autograd | each transformer block's activations are recomputed in backward |
# | the memory report | 4, the caching allocator | peak allocated and reserved bytes of a training step |
# | autocast, GradScaler | 5, mixed precision | the train step: bf16/fp16 matmuls, loss scaling, unscale before clipping |
# | DistributedDataParallel | 6, data parallelism | gradients averaged across ranks, `no_sync` for accumulation |
# | a Triton kernel as an operator | 7, kernels | layer norm through *your* kernel, registered with `torch.library` |
#
# The model is Karpathy's nanoGPT (`model.py`), which is GPT-2's architecture: token and position
# embeddings, pre-norm blocks of causal self-attention and an MLP, and an output head tied to the
# token embedding. Its GPU configuration for this corpus (`train_shakespeare_char.py`: 6 layers of 6
# heads, 384 wide, 10.65 M parameters) reaches a validation loss of 1.47 nats per character in about
# 3 minutes on an A100; the CPU preset here is a 0.4 M-parameter version of it.
#
# **How this notebook works.** Run the cells in order. Each exercise has an *answer cell* (replace
# `raise NotImplementedError()` with your code, pasting what you wrote in earlier chapters where it
# says so; each answer cell imports what it uses) followed by a *check cell*. The grader runs your answer cells in a separate process that
# has torch, triton and `ptinternals.gpt.scaffold` (configuration, corpus, training loop) but not the
# course's reference model, kernels or trainer, so your answers must contain your own code. Quiz
# answers are recorded in `gpt.answers.json` beside this notebook: *practice* questions check your
# answer at once and count no points; *graded* ones only record it (the last answer counts) and are
# scored when your notebook is graded.

# %% [setup]
import math
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run in the interpreter
import torch.nn as nn
import torch.nn.functional as F

from ptinternals.gpt.scaffold import get_batch, load_corpus, make_config
from ptinternals.grading import check
from ptinternals.quiz import quiz_progress, show_quiz
from ptinternals.viz.gpt import plot_loss_curve

torch.manual_seed(0)

# %% [markdown]
# ## 1. The corpus, as tokens
#
# `load_corpus()` reads the packaged text (434 KB of gzip; its SHA-256 is checked, so a damaged copy
# fails loudly), makes a **character-level** vocabulary (the sorted set of the 65 characters that
# occur), encodes the text as one int64 tensor and splits it: the first 90% trains, the last 10%
# validates. A contiguous split means the model is judged on scenes it has never seen.

# %%
tokenizer, train_data, val_data = load_corpus()
print(tokenizer.decode(train_data[:180].tolist()))
print("---")
print(f"vocabulary: {tokenizer.vocab_size} characters {''.join(tokenizer.chars)!r}")
print(f"train: {train_data.numel():,} tokens ({train_data.numel() * 8 / 2**20:.1f} MiB as int64), "
      f"val: {val_data.numel():,} tokens")

# %% [markdown]
# A batch is `B` random windows of `T + 1` tokens: the inputs `x` are the first `T`, the targets `y`
# the last `T`, so `y[b, t] = x[b, t + 1]`. Every position is a training example: predict the next
# character from the ones before it.

# %%
x, y = get_batch(train_data, 2, 12, torch.Generator().manual_seed(0))
for b in range(2):
    print(repr(tokenizer.decode(x[b].tolist())), "->", repr(tokenizer.decode(y[b].tolist())))
print("x:", tuple(x.shape), x.dtype, "| y:", tuple(y.shape))

# %% [markdown]
# **Numbers to beat.** A model that knows nothing scores ln 65 = 4.17 nats per character (every
# character equally likely). Counting characters (a unigram table) scores 3.35 on the validation text;
# counting pairs (a bigram table, what a model that only sees the previous character can learn)
# 2.48. Anything below 2.48 uses more context than one character.

# %%
def table_loss(order: int) -> float:
    """Validation cross-entropy of add-0.1-smoothed unigram (order 1) or bigram (order 2) counts."""
    V = tokenizer.vocab_size
    if order == 1:
        p = (torch.bincount(train_data, minlength=V).double() + 0.1)
        return float(-(p / p.sum()).log()[val_data].mean())
    pairs = torch.bincount(train_data[:-1] * V + train_data[1:], minlength=V * V).double().view(V, V) + 0.1
    logp = (pairs / pairs.sum(1, keepdim=True)).log()
    return float(-logp[val_data[:-1], val_data[1:]].mean())


BASELINES = {"uniform (ln 65)": math.log(65), "unigram": table_loss(1), "bigram": table_loss(2)}
print({k: round(v, 3) for k, v in BASELINES.items()})

# %% [markdown]
# ## 2. The model
#
# For token ids `idx` of shape (B, T), with C = `n_embd` and `n_head` heads of `hs = C / n_head`:
#
# ```
# x = wte[idx] + wpe[0..T-1]                (B, T, C)    token + position embeddings, then dropout
# for each of n_layer blocks:               pre-norm residual blocks
#     x = x + attn(ln_1(x))                 causal self-attention
#     x = x + mlp(ln_2(x))                  C -> 4C -> GELU -> C
# logits = ln_f(x) @ wte.T                  (B, T, V)    the head IS the token embedding (tied)
# ```
#
# **Attention.** `c_attn` maps C to 3C: q, k and v side by side. View each as (B, T, n_head, hs) and
# transpose to (B, n_head, T, hs), so every head is a batch entry. Scores `q @ k^T / sqrt(hs)` are
# (B, n_head, T, T); position t may only look at positions <= t (the **causal mask**: -inf above the
# diagonal before the softmax, or `F.scaled_dot_product_attention(..., is_causal=True)`). The
# weighted values are transposed back and merged to (B, T, C), then projected by `c_proj`.
#
# **Pre-norm.** The residual stream `x` is never normalised in place: each sub-layer reads
# `ln(x)` and *adds* its output. Gradients flow through the additions unchanged, which is what lets
# deep stacks train.
#
# **Tied head.** `lm_head.weight` is the same (V, C) tensor as `transformer.wte.weight`: the
# similarity of the final state to a token's embedding is that token's logit. It saves V x C
# parameters, and a token seen as input also trains the output row.
#
# **Parameter names.** The grader loads fixed weights by nanoGPT's names, so use exactly these
# attributes: `transformer.wte`, `transformer.wpe`, `transformer.drop`, `transformer.h` (a
# `ModuleList` of blocks), `transformer.ln_f`, `lm_head`; in a block `ln_1`, `attn`, `ln_2`, `mlp`;
# `attn.c_attn`, `attn.c_proj`, `attn.attn_dropout`, `attn.resid_dropout`; `mlp.c_fc`, `mlp.gelu`,
# `mlp.c_proj`, `mlp.dropout`. Linear layers have biases only when `config.bias`; `LayerNorm` (ours,
# since nanoGPT's layer norm may have no bias) has `weight` and, when `bias`, `bias`. Initialise like
# GPT-2: every weight N(0, 0.02), biases zero, and each `c_proj.weight` N(0, 0.02 / sqrt(2 n_layer))
# (the residual stream adds 2 per layer; this keeps its variance from growing with depth).
#
# Two switches wire in later parts, so write them now and they will work once those exist: when
# `"layernorm" in kernel_parts(config.kernels)`, `LayerNorm` calls `kernel_layer_norm` (Exercise
# 8.2); when `config.checkpointing` and the model is training with grad enabled, each block runs as
# `checkpoint(block, x)` ({{exercise checkpoint}}).
#
# The reference model (the course's `ptinternals.gpt.GPT`, used in this notebook's demonstrations)
# has this many parameters in the two presets; nanoGPT reports the count without the position
# embeddings:

# %%
import ptinternals.gpt as reference  # the course's reference package: demonstrations only

for name in ("cpu", "gpu"):
    cfg = make_config(name, {"vocab_size": 65})
    model = reference.GPT(cfg)
    per_block = 12 * cfg.n_embd**2 + 2 * cfg.n_embd  # 4C^2 attention + 8C^2 MLP + two LayerNorm gains
    print(f"{name}: {cfg.n_layer} x ({cfg.n_head} heads, C={cfg.n_embd}), context {cfg.block_size}: "
          f"{model.num_params():,} parameters ({per_block:,} per block)")
del model

# %% [markdown]
# ### {{exercise gpt}}: the GPT
#
# Write the model. `GPT(config)` reads `vocab_size, block_size, n_layer, n_head, n_embd, dropout,
# bias` (and the two switches) from `config`; `GPT.forward(idx, targets=None)` returns
# `(logits, loss)`: logits (B, T, V) for every position, and the mean cross-entropy against `targets`
# (B, T) when they are given, else `None`. The check loads fixed weights into your model (by the names
# above) and compares its logits, in float64, with a plain functional implementation; it also checks
# that the head is tied and, on models large enough to measure it, the GPT-2 initialisation your
# model was built with (before the fixed weights replace it). 3 points.

# %% [answer gpt]
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ptinternals.gpt.scaffold import kernel_parts


class LayerNorm(nn.Module):
    """Layer norm over the last dim, bias optional; through kernel_layer_norm when use_kernel."""

    def __init__(self, ndim, bias, use_kernel=False):
        super().__init__()
        ### BEGIN SOLUTION
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None
        self.use_kernel = use_kernel
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        if self.use_kernel:
            return kernel_layer_norm(x, self.weight, self.bias, 1e-5)
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)
        ### END SOLUTION


class CausalSelfAttention(nn.Module):
    """c_attn (C -> 3C), n_head causal heads, c_proj (C -> C); attn_dropout, resid_dropout."""

    def __init__(self, config):
        super().__init__()
        ### BEGIN SOLUTION
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)                 # 3 x (B, T, C)
        hs = C // self.n_head
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)                  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True)                 # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))
        ### END SOLUTION


class MLP(nn.Module):
    """c_fc (C -> 4C), exact GELU, c_proj (4C -> C), dropout."""

    def __init__(self, config):
        super().__init__()
        ### BEGIN SOLUTION
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))
        ### END SOLUTION


class Block(nn.Module):
    """Pre-norm: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, config):
        super().__init__()
        ### BEGIN SOLUTION
        use_kernel = "layernorm" in kernel_parts(config.kernels)
        self.ln_1 = LayerNorm(config.n_embd, config.bias, use_kernel)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, config.bias, use_kernel)
        self.mlp = MLP(config)
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))
        ### END SOLUTION


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        ### BEGIN SOLUTION
        # twin: ptinternals.gpt.model.GPT
        self.config = config
        use_kernel = "layernorm" in kernel_parts(config.kernels)
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
            ln_f=LayerNorm(config.n_embd, config.bias, use_kernel),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight                  # tied: one (V, C) tensor
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * config.n_layer) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        ### END SOLUTION

    def forward(self, idx, targets=None):
        ### BEGIN SOLUTION
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))   # (B, T, C)
        recompute = self.config.checkpointing and self.training and torch.is_grad_enabled()
        for block in self.transformer.h:
            x = checkpoint(block, x) if recompute else block(x)
        logits = self.lm_head(self.transformer.ln_f(x))                                    # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss
        ### END SOLUTION


# %% [tests gpt]
check("gpt.gpt", GPT)
### BEGIN HIDDEN TESTS
check("gpt.gpt", GPT, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("gpt", "q1", "q2", "q3")

# %% [markdown]
# ## 3. Your kernel, as an operator ({{chapter kernels}})
#
# A Triton kernel called from Python works, but to the rest of PyTorch it is invisible: autograd
# needs a backward, `torch.compile` and `FakeTensorMode` need to know output shapes without running
# it, and the dispatcher needs a name to route it by. `torch.library.custom_op` gives the kernel all
# three (`torch/_library/custom_ops.py`):
#
# * a **schema** from the type hints, e.g. `capstone::layer_norm(Tensor x, Tensor weight, Tensor bias,
#   float eps) -> (Tensor, Tensor, Tensor)`, and `mutates_args=()`: it writes none of its inputs;
# * a **fake** implementation (`@op.register_fake`): empty outputs of the right shapes and dtypes;
# * an **autograd** formula (`op.register_autograd(backward, setup_context=...)`), whose backward
#   calls a second custom op, so the backward is opaque and traceable too.
#
# Forward saves `mean` and `rstd` per row (2 floats instead of the normalised row). Backward, per row,
# with `xhat = (x - mean) * rstd` and `g = weight * dy`:
# `dx = (g - (xhat * mean(xhat * g) + mean(g))) * rstd`; `dweight` and `dbias` are sums **over all
# rows** of `dy * xhat` and `dy`, a reduction across programs.
#
# ### {{exercise kernel_layer_norm}}: your layer norm, registered
#
# Paste your {{chapter kernels}} layer-norm kernels (forward and backward) into `make_layer_norm_op()` and
# register them as a custom op `capstone::layer_norm` returning `(y, mean, rstd)`, with a fake
# implementation and an autograd formula; return the op. `kernel_layer_norm` below (given) calls it.
# It must match `F.layer_norm` (values and gradients) for any number of rows (0 included), any
# width (a block is a power of two: mask the rest) and non-contiguous `x`, and, swapped into a model
# (a hidden case), it must train exactly like torch's layer norm. On a CPU the kernels run in Triton's interpreter (slow, but `print` works in a
# kernel). 2 points.

# %% [answer kernel_layer_norm]
import math

import torch
import triton
import triton.language as tl


def make_layer_norm_op():
    """Define your Triton layer-norm kernels, register them as the custom op capstone::layer_norm
    (x, weight, bias, eps) -> (y, mean, rstd) with a fake and an autograd formula; return the op."""
    ### BEGIN SOLUTION
    # twin kernel_layer_norm: ptinternals.gpt.ops.layer_norm
    @triton.jit
    def ln_fwd_kernel(X, Y, W, B, MEAN, RSTD, stride_row, N, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(X + row * stride_row + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / N
        xc = tl.where(mask, x - mean, 0.0)                  # masked lanes must not enter the variance
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / N + eps)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + row * N + cols, xc * rstd * w + b, mask=mask)
        tl.store(MEAN + row, mean)
        tl.store(RSTD + row, rstd)

    @triton.jit
    def ln_bwd_kernel(DY, X, W, MEAN, RSTD, DX, DW_ROWS, stride_row, N, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(X + row * stride_row + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * N + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(MEAN + row)
        rstd = tl.load(RSTD + row)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        g = w * dy
        dx = (g - (xhat * (tl.sum(xhat * g, axis=0) / N) + tl.sum(g, axis=0) / N)) * rstd
        tl.store(DX + row * N + cols, dx, mask=mask)
        tl.store(DW_ROWS + row * N + cols, dy * xhat, mask=mask)   # summed over rows below

    def block_for(n):
        return max(16, triton.next_power_of_2(n))

    @torch.library.custom_op("capstone::layer_norm_backward", mutates_args=())
    def layer_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor,
                            rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        N = x.shape[-1]
        x2, dy2 = x.reshape(-1, N).contiguous(), dy.reshape(-1, N).contiguous()     # (M, N)
        M = x2.shape[0]
        dx = torch.empty_like(x2)
        dw_rows = torch.zeros((M, N), dtype=torch.float32, device=x.device)
        if M:
            ln_bwd_kernel[(M,)](dy2, x2, weight.contiguous(), mean, rstd, dx, dw_rows, x2.stride(0), N,
                                BLOCK=block_for(N))
        return dx.view(x.shape), dw_rows.sum(0).to(weight.dtype), dy2.float().sum(0).to(weight.dtype)

    @layer_norm_backward.register_fake
    def _(dy, x, weight, mean, rstd):
        return torch.empty_like(x), torch.empty_like(weight), torch.empty_like(weight)

    @torch.library.custom_op("capstone::layer_norm", mutates_args=())
    def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        N = x.shape[-1]
        x2 = x.reshape(-1, N).contiguous()                  # (M, N), rows one stride apart
        M = x2.shape[0]
        y = torch.empty_like(x2)
        mean = torch.empty(M, dtype=torch.float32, device=x.device)
        rstd = torch.empty(M, dtype=torch.float32, device=x.device)
        if M:
            ln_fwd_kernel[(M,)](x2, y, weight.contiguous(), bias.contiguous(), mean, rstd, x2.stride(0), N,
                                eps, BLOCK=block_for(N))
        return y.view(x.shape), mean, rstd

    @layer_norm.register_fake
    def _(x, weight, bias, eps):
        M = math.prod(x.shape[:-1])
        return (x.new_empty(x.shape), x.new_empty((M,), dtype=torch.float32),
                x.new_empty((M,), dtype=torch.float32))

    def setup_context(ctx, inputs, output):
        x, weight, bias, eps = inputs
        _, mean, rstd = output
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.mark_non_differentiable(mean, rstd)

    def backward(ctx, dy, _dmean, _drstd):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = layer_norm_backward(dy, x, weight, mean, rstd)
        return dx, dw, db, None

    layer_norm.register_autograd(backward, setup_context=setup_context)
    return layer_norm
    ### END SOLUTION


_LAYER_NORM_OP = []  # your op, made once


def kernel_layer_norm(x, weight, bias=None, eps=1e-5):
    """F.layer_norm(x, (x.shape[-1],), weight, bias, eps) through your custom op (differentiable)."""
    if not _LAYER_NORM_OP:
        _LAYER_NORM_OP.append(make_layer_norm_op())
    if bias is None:
        bias = torch.zeros_like(weight)
    return _LAYER_NORM_OP[0](x, weight, bias, float(eps))[0]


# %% [tests kernel_layer_norm]
check("gpt.kernel_layer_norm", kernel_layer_norm)
### BEGIN HIDDEN TESTS
check("gpt.kernel_layer_norm", kernel_layer_norm, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# The reference GPT has the same switch (`kernels="layernorm"`, plus `"flash"` for {{chapter kernels}}'s flash
# attention and `"softmax"` for its fused softmax, all as custom ops in `ptinternals.gpt.ops`). Two
# training steps of a tiny model with and without the Triton layer norm, from the same weights:

# %%
from ptinternals.gpt.train import train_step as reference_train_step

tiny = make_config("cpu", dict(vocab_size=65, block_size=16, n_layer=1, n_head=2, n_embd=16))
steps = [get_batch(train_data, 4, 16, torch.Generator().manual_seed(s)) for s in range(2)]
for kernels in ("none", "layernorm"):
    torch.manual_seed(0)
    m = reference.GPT(tiny.replace(kernels=kernels))
    opt = m.configure_optimizers("cpu")
    losses = [reference_train_step(m, opt, None, [b], None, 1.0)[0] for b in steps]
    print(f"kernels={kernels:10s} losses {[f'{v:.6f}' for v in losses]}")

# %% [quiz]
show_quiz("gpt", "q4")

# %% [markdown]
# ## 4. Activation checkpointing ({{chapter autograd}})
#
# Backward needs what forward computed: every block saves its layer-norm input and statistics, the
# attention inputs, the MLP's 4C-wide hidden state, dropout masks... For the GPU preset that is
# roughly 30 x B x T x C floats per block. Checkpointing keeps only each block's *input* and runs the
# block's forward again during backward: one extra forward per block for a fraction of the memory.
#
# Two designs (`torch/utils/checkpoint.py`). The **reentrant** one is an `autograd.Function` whose
# forward runs the block under `no_grad` and whose backward recomputes it and calls
# `torch.autograd.backward` inside the backward. The **non-reentrant** one (`use_reentrant=False`,
# torch's default recommendation) runs the block normally under `saved_tensors_hooks` whose `pack`
# stores an index instead of the tensor; the first `unpack` in backward recomputes the block and hands
# the tensors back. The second builds an ordinary graph, so DDP's end-of-backward callback and
# `autograd.grad` work unchanged; the reentrant one runs a nested backward that fires DDP's hooks
# inside it. Either way the recomputation must draw the **same dropout masks**: save the RNG state
# before the block and restore it before recomputing.
#
# ### {{exercise checkpoint}}: `checkpoint(fn, *args)`
#
# Paste your {{chapter autograd}} checkpoint: return `fn(*args)` without keeping `fn`'s activations, recomputed
# in backward with the same RNG state, gradients flowing to `args` and to the parameters used inside
# `fn`. The check wraps every block of a small model and compares its trajectory (with dropout) and
# the bytes it saves for backward with the plain model. 2 points.

# %% [answer checkpoint]
import torch


def checkpoint(fn, *args):
    """fn(*args) without keeping its activations: recomputed in backward with the same RNG state."""
    ### BEGIN SOLUTION
    # twin: ptinternals.gpt.model.checkpoint
    devices = sorted({a.device.index or 0 for a in args if isinstance(a, torch.Tensor) and a.is_cuda})
    cpu_state = torch.get_rng_state()
    cuda_states = [torch.cuda.get_rng_state(d) for d in devices]
    recomputed = {}
    n_saved = [0]

    def pack(t):                     # keep an index, not the tensor
        n_saved[0] += 1
        return n_saved[0] - 1

    def recompute():
        collected = []
        detached = [a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(cpu_state)
            for d, s in zip(devices, cuda_states):
                torch.cuda.set_rng_state(s, d)
            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(
                    lambda t: collected.append(t.detach()), lambda _: None):
                fn(*detached)
        recomputed.update(enumerate(collected))

    def unpack(i):
        if i not in recomputed:
            recompute()
        return recomputed.pop(i)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        return fn(*args)
    ### END SOLUTION


# %% [tests checkpoint]
check("gpt.checkpoint", checkpoint)
### BEGIN HIDDEN TESTS
check("gpt.checkpoint", checkpoint, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# What it buys, measured with {{chapter allocator}}'s tools. On a GPU, `torch.cuda.max_memory_allocated()` after a
# step is the number; on this CPU there is no caching allocator, so `ptinternals.gpt.memory` records
# every storage a training step creates and frees ({{chapter allocator}}'s `trace_allocations`) and replays them
# through {{chapter allocator}}'s model of `CUDACachingAllocator`: the peak a GPU would report, for the same
# tensors. Here, the reference model with a 4-layer, 256-token configuration:

# %%
from ptinternals.gpt.memory import measure_step_memory, resident_tensors

mem_cfg = make_config("cpu", dict(vocab_size=65, n_layer=4, block_size=256, batch_size=8))
xb, yb = get_batch(train_data, 8, 256, torch.Generator().manual_seed(0))
for flag in (False, True):
    torch.manual_seed(0)
    m = reference.GPT(mem_cfg.replace(checkpointing=flag))
    opt = m.configure_optimizers("cpu")
    _, report = measure_step_memory(lambda: reference_train_step(m, opt, None, [(xb, yb)], None, 1.0), "cpu",
                                    resident=resident_tensors(m, opt))
    print(f"checkpointing={flag!s:5s}: peak allocated {report['peak_allocated'] / 2**20:6.1f} MiB, "
          f"peak reserved {report['peak_reserved'] / 2**20:6.1f} MiB")
print(report["source"])

# %% [quiz]
show_quiz("gpt", "q5", "q6")

# %% [markdown]
# ## 5. The train step ({{chapter amp}})
#
# One optimizer step, with everything the earlier chapters added:
#
# ```
# for each micro-batch (gradient accumulation):
#     with autocast(device, amp_dtype):            matmuls in bf16/fp16; the loss in fp32
#         loss = model(x, y)[1] / n_micro          the step's loss is the MEAN over micro-batches
#     scaler.scale(loss).backward()                fp16: x S so small gradients do not underflow
# scaler.unscale_(optimizer)                       the true gradients: clip THEM, not S times them
# norm = clip_grad_norm_(params, grad_clip)        the global norm, over every parameter
# scaler.step(optimizer); scaler.update()          skip the step if a gradient is inf/NaN; adapt S
# optimizer.zero_grad(set_to_none=True)
# ```
#
# bf16 has fp32's exponent range, so it needs no scaler (`scaler` is then `None`); fp16 does. With a
# DDP model (section 6), every micro-batch but the last runs under `model.no_sync()`, so the ranks
# communicate once per step, not once per micro-batch.
#
# ### {{exercise train_step}}: `train_step`
#
# Write `train_step(model, optimizer, scaler, batches, amp_dtype, grad_clip)`: `batches` is a list of
# `(x, y)` micro-batches, `scaler` a GradScaler or `None`, `amp_dtype` a dtype or `None` (full
# precision), `grad_clip` the max norm (0: do not clip, but still measure). Return `(loss, grad_norm)`
# as floats: the mean loss over the micro-batches and the gradient norm **before** clipping. Use
# `model.no_sync()` for all but the last micro-batch when the model has it. 2 points.

# %% [answer train_step]
import contextlib

import torch

from ptinternals.gpt.scaffold import autocast_context


def train_step(model, optimizer, scaler, batches, amp_dtype, grad_clip):
    """One optimizer step on the micro-batches; returns (mean loss, grad norm before clipping)."""
    ### BEGIN SOLUTION
    # twin: ptinternals.gpt.train.train_step
    device_type = next(model.parameters()).device.type
    total = 0.0
    for i, (x, y) in enumerate(batches):
        last = i == len(batches) - 1
        sync = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
        with sync:
            with autocast_context(device_type, amp_dtype):
                _, loss = model(x, y)
                loss = loss / len(batches)
            (scaler.scale(loss) if scaler is not None else loss).backward()
        total += float(loss.detach())
    if scaler is not None:
        scaler.unscale_(optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total, float(norm)
    ### END SOLUTION


# %% [tests train_step]
check("gpt.train_step", train_step)
### BEGIN HIDDEN TESTS
check("gpt.train_step", train_step, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# On a GPU the `gpu` preset trains in bf16 autocast (`amp=True`). On this CPU, bf16 matmuls are
# 12-18x *slower* than fp32 (no AMX), so `amp` is ignored here and the runs are fp32; what autocast
# does to the numbers can still be seen on a tiny model:

# %%
for amp_dtype in (None, torch.bfloat16):
    torch.manual_seed(0)
    m = reference.GPT(tiny)
    opt = m.configure_optimizers("cpu")
    losses = [reference_train_step(m, opt, None, [b], amp_dtype, 1.0)[0] for b in steps]
    print(f"amp_dtype={str(amp_dtype):15s} losses {[f'{v:.5f}' for v in losses]}")

# %% [quiz]
show_quiz("gpt", "q7", "q8")

# %% [markdown]
# ## 6. Data parallel ({{chapter distributed}})
#
# With N ranks, each holds a full replica, trains on its own 1/N of the batch, and before the
# optimizer step the gradients are **averaged** across ranks, so every replica takes the same step:
# the same step one process would take on the whole batch. Three things make it correct: identical
# starting weights (broadcast rank 0's at construction), averaging (all-reduce, then divide by N),
# and waiting for every all-reduce before the optimizer reads `.grad` (at the end of backward). Doing
# the all-reduce per parameter as its gradient becomes ready (a post-accumulate-grad hook) overlaps
# communication with the rest of backward; {{chapter distributed}}'s buckets group small gradients into one message.
#
# The reference trainer runs under `torchrun`, one process per rank, gloo on CPUs and NCCL on GPUs:
#
# ```
# torchrun --standalone --nproc_per_node=2 -m ptinternals.gpt.train --preset cpu --ddp=True
# ```
#
# ### {{exercise ddp}}: `DDP`
#
# Paste your {{chapter distributed}} DDP as `DDP(module)`: an `nn.Module` whose `forward` runs the module, that
# broadcasts rank 0's parameters and buffers when built, averages every gradient across ranks by the
# time `loss.backward()` returns, and has a `no_sync()` context manager under which backward only
# accumulates locally. The check runs two ranks (gloo, forked from the checker) that start from
# *different* weights and each train on half of every batch, as two micro-batches; both must end
# equal to one process trained on the whole batch. 2 points.

# %% [answer ddp]
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn


class DDP(nn.Module):
    """Data parallel over the default process group: same weights everywhere, gradients averaged."""

    def __init__(self, module):
        super().__init__()
        ### BEGIN SOLUTION
        # twin: ptinternals.distributed.ddp.DistributedDataParallel
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=0)              # every replica starts from rank 0's weights
        self.sync = True
        self.pending = []                             # (param, async work) launched this backward
        self.callback_queued = False
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._grad_ready)
        ### END SOLUTION

    def _grad_ready(self, param):
        ### BEGIN SOLUTION
        if not self.sync:
            return                                    # no_sync(): accumulate locally
        if not self.callback_queued:
            self.callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
        param.grad.div_(self.world_size)              # sum over ranks of grad / N = the mean
        self.pending.append(dist.all_reduce(param.grad, async_op=True))
        ### END SOLUTION

    def _finish(self):
        ### BEGIN SOLUTION
        for work in self.pending:                     # every all-reduce done before .grad is read
            work.wait()
        self.pending, self.callback_queued = [], False
        ### END SOLUTION

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        ### BEGIN SOLUTION
        old, self.sync = self.sync, False
        try:
            yield
        finally:
            self.sync = old
        ### END SOLUTION


# %% [tests ddp]
check("gpt.ddp", DDP)
### BEGIN HIDDEN TESTS
check("gpt.ddp", DDP, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("gpt", "q9")

# %% [markdown]
# ## 7. Assemble and train
#
# The scaffold's `fit` is the loop around your train step (nanoGPT's `train.py`): it sets the learning
# rate of each iteration (linear warmup, then a cosine down to `min_lr`), draws `grad_accum`
# micro-batches from its own generator, calls your `train_step`, evaluates on fixed batches every
# `eval_interval` iterations, and prints progress with tokens/s. `make_optimizer` is nanoGPT's AdamW
# (weight decay on matrices only; fused on CUDA).
#
# ### {{exercise train_gpt}}: `train_gpt(preset, overrides)`
#
# Build `make_config(preset, overrides)`, set its `vocab_size` from the corpus
# (`config.replace(vocab_size=...)`), seed with `config.seed`, build your `GPT` on the device
# (CUDA when `config.device` allows and one exists, else the CPU), make the optimizer, pick
# `amp_dtype` (bf16 when `config.amp` on CUDA, else `None`), run `fit` with your `train_step`, and
# return the trained model. The check measures the validation loss itself, from your model's logits on
# held-out text: a 60-step run must beat a unigram table and the graded 800-step run
# (about 35 CPU-seconds) a bigram table, with a loss <= 2.2. 2 points.

# %% [answer train_gpt]
import torch

from ptinternals.gpt.scaffold import fit, load_corpus, make_config, make_optimizer


def train_gpt(preset, overrides):
    """Train your GPT with make_config(preset, overrides); return the trained model."""
    ### BEGIN SOLUTION
    # twin: none (a whole training run; the reference trainer is ptinternals.gpt.train.train(config))
    config = make_config(preset, overrides)
    tokenizer, train_split, val_split = load_corpus()
    config = config.replace(vocab_size=tokenizer.vocab_size)
    device = "cuda" if config.device != "cpu" and torch.cuda.is_available() else "cpu"
    torch.manual_seed(config.seed)
    model = GPT(config).to(device)
    optimizer = make_optimizer(model, config, device)
    amp_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[config.amp_dtype] if config.amp and device == "cuda" else None
    fit(model, optimizer, config, train_split, val_split, train_step, device=device, amp_dtype=amp_dtype)
    return model
    ### END SOLUTION


# %% [tests train_gpt]
check("gpt.train_gpt", train_gpt)
### BEGIN HIDDEN TESTS
check("gpt.train_gpt", train_gpt, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### {{exercise train_gpu}}: the GPU run
#
# `train_gpu(overrides)` trains the `gpu` preset (nanoGPT's shakespeare_char: 6 layers, 6 heads, 384
# wide, context 256, batch 64, dropout 0.2, 5000 iterations) with the parts you choose, e.g.
# `{"amp": True}` for bf16 autocast or `{"kernels": "layernorm"}` for your kernel, and returns the
# model; the `overrides` it is given win over your choices. On a GPU it is graded on the validation
# loss (<= 1.50; nanoGPT reports 1.4697) and on tokens/s over the whole run (>= 300,000; nanoGPT does
# about 455,000 on an A100). Without a GPU the check only builds the preset's model and trains it for
# a step on the CPU, and says that the rest was skipped. 2 points.

# %% [answer train_gpu]
def train_gpu(overrides):
    """Train the gpu preset with your choice of parts; overrides win over your choices."""
    ### BEGIN SOLUTION
    # twin: none (the GPU training run of the gpu preset, built on train_gpt)
    my_choices = {"amp": True}  # bf16 autocast on the GPU's tensor cores
    return train_gpt("gpu", {**my_choices, **overrides})
    ### END SOLUTION


# %% [tests train_gpu]
check("gpt.train_gpu", train_gpu)
### BEGIN HIDDEN TESTS
check("gpt.train_gpu", train_gpu, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("gpt", "q10")

# %% [markdown]
# ## 8. The run
#
# The reference trainer with the `cpu` preset, a 2-layer, 4-head, 128-wide GPT (0.40 M parameters)
# with a 64-character context, trained here for a bounded **200** AdamW steps of 32 windows (0.4 M
# tokens): learning rate 3e-3 after 50 warmup steps, cosine down to 3e-4 at step 200, fp32, an
# evaluation every 50 steps on 10 batches per split. That keeps this run to about 25 CPU-seconds (a
# third of this page); it ends near 2.3 nats per character, already below the bigram table. The full
# preset runs 1000 steps (2.0 M tokens) to about 2.0, in one to two minutes on an idle 2-core laptop
# CPU: `python -m ptinternals.gpt.train --preset cpu`. The full configuration, nanoGPT's 10.65 M-parameter
# Shakespeare run (5000 steps, about 1.47), is the GPU path: `--preset gpu`, the run {{exercise train_gpu}}
# grades. The run reports the first step's memory, evaluates, and samples 300 characters at the end.

# %%
from ptinternals.gpt.train import train

DEMO_STEPS = 200  # of the cpu preset's 1000: a bounded run for this page (the CLI runs all of them)
run = train(make_config("cpu", {"max_iters": DEMO_STEPS, "lr_decay_iters": DEMO_STEPS, "eval_interval": 50,
                                "eval_iters": 10, "log_interval": 50}))

# %% [markdown]
# The loss curve: the training loss of every step (faint), its moving average, and the train and
# validation losses at each evaluation. The dashed lines are the tables from section 1; the model
# passes the bigram table well before the end of these 200 steps, which means it uses more than one
# character of context.

# %%
plot_loss_curve(run.history, tokens_per_iter=run.config.tokens_per_iter(),
                baselines={k: v for k, v in BASELINES.items() if k != "uniform (ln 65)"},
                title=f"GPT (cpu preset, {DEMO_STEPS} steps) on tiny-shakespeare: val loss {run.final_val_loss:.3f} "
                      f"in {run.wall_s:.0f} s")

# %% [markdown]
# And what it writes, 300 characters sampled after a newline at temperature 0.8. After 200 steps many
# words are still half-formed (the spelling is learned one character at a time); the full 1000-step run
# spells most of them, and its line breaks and speaker turns come from the 64-character context:

# %%
print(run.sample)

# %% [markdown]
# ## Summary
#
# * A GPT is embeddings, pre-norm blocks (causal attention, then an MLP, each added to the residual
#   stream) and a head tied to the token embedding: 12 C^2 parameters per block.
# * A Triton kernel becomes a PyTorch operator with `torch.library.custom_op`: a schema, a fake
#   implementation for tracing, and an autograd formula whose backward is another op.
# * Checkpointing trades one extra forward per block for the block's activations; recompute with the
#   same RNG state, and prefer the non-reentrant design, which DDP and `autograd.grad` understand.
# * The train step: autocast around forward and loss, scale the loss for fp16, unscale before
#   clipping, skip steps with inf/NaN, zero the gradients; divide by the number of micro-batches.
# * DDP = identical replicas + averaged gradients, all-reduced as they become ready and awaited
#   before the optimizer step; `no_sync` makes gradient accumulation communicate once.
# * On the GPU, `python -m ptinternals.gpt.train --preset gpu` is nanoGPT's Shakespeare run, and
#   `bench/bench_gpt.py` compares eager PyTorch, the course's kernels and `torch.compile`.
#
# ### Your quiz score so far
# Practice answers count no points; the grader scores your last answer to each graded question (recorded in
# `gpt.answers.json`).

# %% [quiz-grade]
quiz_progress("gpt")
