"""A second, deliberately plain GPT forward: functions of a state dict, one op per line.

``GPT`` in ``model.py`` is modules and switches; this is the same mathematics written the long way,
straight from the equations (the causal mask as an explicit -inf triangle, the softmax by
``torch.softmax``, heads by ``view``/``transpose``), in float64 by default. The tests and the
chapter's checker compare models against it on fixed weights: two independent writings of one
function agreeing to ~1e-12 is strong evidence both are right.

Weights are read by nanoGPT's names; the output head is ``transformer.wte.weight`` (tied).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _linear(x, sd, prefix):
    bias = sd.get(prefix + ".bias")
    y = x @ sd[prefix + ".weight"].T                                 # (..., in) @ (in, out)
    return y + bias if bias is not None else y


def _layer_norm(x, sd, prefix, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)               # biased, like torch
    y = (x - mean) / torch.sqrt(var + eps) * sd[prefix + ".weight"]
    bias = sd.get(prefix + ".bias")
    return y + bias if bias is not None else y


def reference_forward(state_dict: dict, idx: torch.Tensor, n_head: int, dtype: torch.dtype = torch.float64):
    """logits (B, T, V) of a GPT with weights ``state_dict`` on token ids ``idx`` (B, T)."""
    if not isinstance(state_dict, dict) or "transformer.wte.weight" not in state_dict:
        raise ValueError("state_dict must be a GPT state dict with nanoGPT's parameter names")
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2:
        raise ValueError("idx must be a (B, T) tensor of token ids")
    sd = {k: v.detach().to(dtype) for k, v in state_dict.items()}
    wte, wpe = sd["transformer.wte.weight"], sd["transformer.wpe.weight"]     # (V, C), (T_max, C)
    B, T = idx.shape
    C = wte.shape[1]
    if C % n_head:
        raise ValueError(f"n_embd {C} is not divisible by n_head {n_head}")
    if T > wpe.shape[0]:
        raise ValueError(f"sequence length {T} exceeds block_size {wpe.shape[0]}")
    hs = C // n_head
    n_layer = len({k.split(".")[2] for k in sd if k.startswith("transformer.h.")})
    x = wte[idx] + wpe[:T]                                                    # (B, T, C)
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)      # True above the diagonal
    for i in range(n_layer):
        p = f"transformer.h.{i}"
        h = _layer_norm(x, sd, p + ".ln_1")
        qkv = _linear(h, sd, p + ".attn.c_attn")                             # (B, T, 3C)
        q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
        q, k, v = (t.reshape(B, T, n_head, hs).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        scores = q @ k.transpose(-2, -1) / math.sqrt(hs)                      # (B, nh, T, T)
        weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        y = (weights @ v).transpose(1, 2).reshape(B, T, C)                    # (B, T, C)
        x = x + _linear(y, sd, p + ".attn.c_proj")
        h = _layer_norm(x, sd, p + ".ln_2")
        h = F.gelu(_linear(h, sd, p + ".mlp.c_fc"))                           # exact (erf) GELU
        x = x + _linear(h, sd, p + ".mlp.c_proj")
    x = _layer_norm(x, sd, "transformer.ln_f")
    return x @ wte.T                                                          # (B, T, V), tied head


def reference_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, written out: logsumexp minus the target's logit."""
    flat = logits.reshape(-1, logits.shape[-1])
    t = targets.reshape(-1)
    return (torch.logsumexp(flat, dim=-1) - flat[torch.arange(t.numel()), t]).mean()
