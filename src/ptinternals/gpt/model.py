"""A character-level GPT: nanoGPT's ``model.py``, with the course's parts behind switches.

The architecture (GPT-2's, as in Karpathy's nanoGPT), for an input of token ids ``idx`` (B, T)::

    x = wte[idx] + wpe[0..T-1]                      (B, T, C)   token + position embeddings
    for each of n_layer blocks (pre-norm residual):
        x = x + attn(ln_1(x))                       causal self-attention, n_head heads of C / n_head
        x = x + mlp(ln_2(x))                        C -> 4C -> GELU -> C
    logits = ln_f(x) @ wte.T                        (B, T, V)   the output head is tied to wte

Parameter names are nanoGPT's (``transformer.h.0.attn.c_attn.weight``...), so its checkpoints'
layout and this model's ``state_dict`` agree. Initialisation is GPT-2's: N(0, 0.02) for weights,
zeros for biases, and N(0, 0.02 / sqrt(2 * n_layer)) for each residual projection (``c_proj``),
so the residual stream's variance does not grow with depth.

Switches (``GPTConfig``):

- ``kernels``: layer norms through the Triton custom op, attention through the Triton flash
  attention op or through an explicit ``softmax(QK^T / sqrt(d) + mask) V`` with the Triton softmax
  op (``ptinternals.gpt.ops``). "none": ``F.layer_norm`` and ``F.scaled_dot_product_attention``.
- ``checkpointing``: each block runs under ``ptinternals.autograd.checkpoint_with_hooks`` while
  training: its activations are dropped after forward and recomputed in backward (one extra forward
  per block, with the same dropout masks), so saved activations shrink from all blocks' to the
  blocks' inputs.
"""
from __future__ import annotations

import math
from dataclasses import fields

import torch
import torch.nn.functional as F
from torch import nn

from .config import GPTConfig, kernel_parts
from .loop import generate, make_optimizer


def checkpoint(fn, *args):
    """``fn(*args)`` recomputed in backward: the autograd chapter's non-reentrant checkpoint
    (``checkpoint_with_hooks``, torch.utils.checkpoint with ``use_reentrant=False``), which restores the
    CPU and every CUDA device's RNG before recomputing, so dropout redraws the same masks."""
    from ..autograd.checkpoint import checkpoint_with_hooks

    return checkpoint_with_hooks(fn, *args)


def _ops():
    from . import ops  # imports triton: only when a kernel is switched on

    return ops


class LayerNorm(nn.Module):
    """LayerNorm over the last dim with an optional bias (nanoGPT's; the Triton op when ``use_kernel``)."""

    def __init__(self, ndim: int, bias: bool, use_kernel: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None
        self.use_kernel = use_kernel

    def forward(self, x):
        if self.use_kernel:
            return _ops().layer_norm(x, self.weight, self.bias, 1e-5)
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    """n_head heads attend over the tokens at or before their own position."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v at once
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout
        parts = kernel_parts(config.kernels)
        self.attention = "flash" if "flash" in parts else "softmax" if "softmax" in parts else "sdpa"

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)                  # 3 x (B, T, C)
        hs = C // self.n_head
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)                   # (B, nh, T, hs), a view
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        if self.attention == "flash":
            y = _ops().flash_attention(q, k, v, causal=True)                 # (B, nh, T, hs)
        elif self.attention == "softmax":
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))          # (B, nh, T, T) scores
            future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            att = _ops().softmax(att.masked_fill(future, float("-inf")))
            y = self.attn_dropout(att) @ v                                   # (B, nh, T, hs)
        else:  # torch picks flash / memory-efficient / math kernels itself
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                               is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)                    # heads side by side again
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()                                               # exact (erf) GELU
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))           # (B, T, C) -> 4C -> C


class Block(nn.Module):
    """Pre-norm residual block: the residual stream x is never normalised in place."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        use_kernel = "layernorm" in kernel_parts(config.kernels)
        self.ln_1 = LayerNorm(config.n_embd, config.bias, use_kernel)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, config.bias, use_kernel)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        if not isinstance(config, GPTConfig):  # like nanoGPT, any object carrying the fields will do
            names = [f.name for f in fields(GPTConfig) if hasattr(config, f.name)]
            if not names:
                raise TypeError(f"config must be a GPTConfig (or carry its fields), got {type(config).__name__}")
            config = GPTConfig(**{name: getattr(config, name) for name in names})
        if config.vocab_size < 1:
            raise ValueError("config.vocab_size must be >= 1 (0 means 'from the corpus': "
                             "use config.replace(vocab_size=tokenizer.vocab_size))")
        self.config = config
        self.checkpointing = config.checkpointing
        use_kernel = "layernorm" in kernel_parts(config.kernels)
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),             # (V, C)
            wpe=nn.Embedding(config.block_size, config.n_embd),             # (T_max, C)
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
            ln_f=LayerNorm(config.n_embd, config.bias, use_kernel),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight                   # weight tying: one (V, C) tensor
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters, each counted once (wte is lm_head); without position embeddings by default,
        which is how nanoGPT reports its "10.65M" for the Shakespeare model."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def forward(self, idx, targets=None):
        """logits (B, T, V) and, with targets (B, T), the mean cross-entropy (else None)."""
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"idx must be a (B, T) int64 tensor of token ids, got "
                             f"{tuple(idx.shape) if isinstance(idx, torch.Tensor) else type(idx).__name__}")
        B, T = idx.shape
        if not 1 <= T <= self.config.block_size:
            raise ValueError(f"sequence length {T} must be in 1..block_size={self.config.block_size}")
        pos = torch.arange(T, dtype=torch.long, device=idx.device)               # (T,)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # (B, T, C)
        recompute = self.checkpointing and self.training and torch.is_grad_enabled()
        for block in self.transformer.h:
            x = checkpoint(block, x) if recompute else block(x)                   # checkpoint keeps only x
        logits = self.lm_head(self.transformer.ln_f(x))                          # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def configure_optimizers(self, device_type: str = "cpu") -> torch.optim.AdamW:
        """AdamW with weight decay on matrices only (``loop.make_optimizer``), from this model's config."""
        return make_optimizer(self, self.config, device_type)

    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, top_k: int = 0,
                 generator: torch.Generator | None = None):
        """Append ``max_new_tokens`` sampled tokens to idx (B, T), one at a time (no KV cache)."""
        return generate(self, idx, max_new_tokens, self.config.block_size, temperature, top_k, generator)
