"""What the dispatcher chapter's exercises run on, and nothing that solves one: a small transformer block.

Graded code may import this module (``Chapter.sandbox_files``): the grader's probes build their FLOP,
tracing and memory workloads from :class:`Block`, and the notebook uses the same block in its
demonstrations. It imports only torch.

    x (b, s, d) -> LayerNorm -> qkv Linear (d -> 3d) -> causal SDPA over h heads -> proj (d -> d) -> + x
                -> LayerNorm -> Linear (d -> 4d) -> GELU(tanh) -> Linear (4d -> d) -> + x
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """A GPT-style pre-norm transformer block: causal attention (fused SDPA) and a GELU MLP."""

    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.fc, self.out = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)        # 3 x (b, s, d)
        heads = lambda t: t.view(b, s, self.n_head, d // self.n_head).transpose(1, 2)  # noqa: E731  (b, h, s, d/h)
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
