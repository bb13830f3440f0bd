"""The inputs the compile chapter's exercises are checked on, built from plain-data specs.

A spec is a tuple of ints and strings, so it crosses the grading boundary as data; the same builder
then makes the same graph, program or model on both sides (the grader's and the sandbox's):

- :func:`fx_graph`: an FX graph of torch-level ops, as ``symbolic_trace`` and Dynamo record them, for
  the pattern-replacement and dead-code passes (``fx_pattern``, ``fx_dce``). Some steps are impure
  (in-place methods, in-place ATen ops, random ops, ``setitem``) so that dead code elimination has
  something to get wrong.
- :class:`Program`: a differentiable straight-line program for AOTAutograd and the partitioner
  (``partition``): unary and binary pointwise ops, a matmul, a row reduction, a transpose, an in-place op.
- :class:`TinyGPT`: a transformer with the capstone's structure (``ptinternals.gpt.model.GPT``:
  ``transformer.wte/wpe/h/ln_f`` and ``lm_head``, pre-norm blocks of causal attention and an MLP),
  small enough to compile in a check.

Imports only torch: shipped to the grading sandbox (``Chapter.sandbox_files``).
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

__all__ = ["FX_STEPS", "IMPURE_STEPS", "fx_graph", "fx_inputs", "Program", "PROGRAM_OPS", "TinyGPT"]

aten = torch.ops.aten

# ---- FX graphs of torch-level ops ------------------------------------------------------------------
# step (op, i, j): one new value from value i (and j); value 0 is the input x (4, 6), b (6,) is a bias.
FX_STEPS = ("sin", "relu", "exp", "add", "add_self", "add_bias", "add_const", "const_add", "mul2", "mul2f",
            "gelu", "gelu_bias", "gelu_tanh", "sum")
IMPURE_STEPS = ("add_", "aten_add_", "aten_sin", "rand_like", "dropout", "setitem", "bernoulli")


def _step(g: fx.Graph, op: str, a: fx.Node, other: fx.Node, b: fx.Node) -> fx.Node:
    """Append the nodes of one step to ``g``; return the node holding its value."""
    call = g.call_function
    if op in ("sin", "exp"):
        return call(getattr(torch, op), (a,))
    if op == "relu":
        return call(torch.relu, (a,))
    if op == "add":
        return call(operator.add, (a, other))
    if op == "add_self":                                   # a + a: one input bound twice
        return call(operator.add, (a, a))
    if op == "add_bias":
        return call(operator.add, (a, b))
    if op == "add_const":
        return call(operator.add, (a, 2))
    if op == "const_add":
        return call(operator.add, (2.0, a))
    if op == "mul2":
        return call(operator.mul, (a, 2))
    if op == "mul2f":
        return call(operator.mul, (a, 2.0))
    if op == "gelu":
        return call(F.gelu, (a,))
    if op == "gelu_bias":                                  # the pattern itself, two nodes
        return call(F.gelu, (call(operator.add, (a, b)),))
    if op == "gelu_tanh":                                  # gelu(a + other) with a keyword: another function
        return call(F.gelu, (call(operator.add, (a, other)),), {"approximate": "tanh"})
    if op == "sum":
        return g.call_method("sum", (a, -1), {"keepdim": True})
    # impure steps: their value is the (mutated or random) tensor; the node may have no user
    if op == "add_":                                       # x.add_(1): an in-place *method*
        return g.call_method("add_", (a, 1))
    if op == "aten_add_":                                  # aten.add_.Tensor: a mutable schema
        return call(aten.add_.Tensor, (a, other))
    if op == "aten_sin":                                   # a pure ATen op
        return call(aten.sin.default, (a,))
    if op == "rand_like":
        return call(torch.rand_like, (a,))
    if op == "dropout":                                    # F.dropout in training mode draws random numbers
        return call(F.dropout, (a,), {"p": 0.5, "training": True})
    if op == "setitem":                                    # a[0] = 0.0: operator.setitem mutates a
        call(operator.setitem, (a, 0, 0.0))
        return a
    if op == "bernoulli":                                  # an ATen random op (nondeterministic_seeded)
        return call(aten.bernoulli.default, (call(torch.sigmoid, (a,)),))
    raise ValueError(f"unknown step {op!r}; known: {FX_STEPS + IMPURE_STEPS}")


def fx_graph(spec) -> fx.GraphModule:
    """The GraphModule of ``spec = (steps, outputs)``: inputs ``x`` (4, 6) and ``b`` (6,), one value per
    step ``(op, i, j)`` (reading values ``i`` and ``j``; value 0 is ``x``), returning the values ``outputs``
    as a tuple (an output may be ``x`` itself)."""
    try:
        steps, outputs = spec
        steps = [(str(op), int(i), int(j)) for op, i, j in steps]
        outputs = [int(k) for k in outputs]
    except (TypeError, ValueError):
        raise ValueError(f"spec must be (steps, outputs) with steps (op, i, j), got {spec!r}") from None
    g = fx.Graph()
    x, b = g.placeholder("x"), g.placeholder("b")
    values = [x]
    for k, (op, i, j) in enumerate(steps):
        if not (0 <= i <= k and 0 <= j <= k):
            raise ValueError(f"step {k} reads values {i}, {j}: only 0..{k} exist")
        values.append(_step(g, op, values[i], values[j], b))
    if not outputs or any(not 0 <= k < len(values) for k in outputs):
        raise ValueError(f"outputs must be indices in 0..{len(values) - 1}, got {outputs}")
    g.output(tuple(values[k] for k in outputs))
    return fx.GraphModule(nn.Module(), g)


def fx_inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, b)`` for :func:`fx_graph`: x (4, 6), b (6,) float32 (96 + 24 bytes)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(4, 6, generator=gen), torch.randn(6, generator=gen)


# ---- differentiable programs ---------------------------------------------------------------------
PROGRAM_OPS = ("sin", "cos", "exp", "tanh", "sigmoid", "relu", "neg", "add", "mul", "sub", "mm", "rowsum", "t",
               "inplace")
_UNARY = ("sin", "cos", "exp", "tanh", "sigmoid", "relu", "neg")


@dataclass(frozen=True)
class Program:
    """``n_inputs`` square (size, size) float32 inputs; each step ``(op, i, j)`` appends one value read
    from values ``i`` (and ``j``); the program returns the values ``outputs`` (an input may be one)."""

    n_inputs: int
    steps: tuple
    outputs: tuple
    size: int

    def __post_init__(self):
        if not 1 <= self.n_inputs <= 4 or not 1 <= self.size <= 64:
            raise ValueError(f"n_inputs must be in 1..4 and size in 1..64, got {self.n_inputs}, {self.size}")
        for k, (op, i, j) in enumerate(self.steps):
            if op not in PROGRAM_OPS:
                raise ValueError(f"unknown op {op!r}; known: {PROGRAM_OPS}")
            if not (0 <= i < self.n_inputs + k and 0 <= j < self.n_inputs + k):
                raise ValueError(f"step {k} reads values {i}, {j}: only 0..{self.n_inputs + k - 1} exist")
        if not self.outputs or any(not 0 <= o < self.n_inputs + len(self.steps) for o in self.outputs):
            raise ValueError(f"outputs {self.outputs} name values that do not exist")

    @classmethod
    def from_spec(cls, spec) -> "Program":
        n_inputs, steps, outputs, size = spec
        return cls(int(n_inputs), tuple((str(o), int(i), int(j)) for o, i, j in steps),
                   tuple(int(o) for o in outputs), int(size))

    @property
    def spec(self) -> tuple:
        return (self.n_inputs, self.steps, self.outputs, self.size)

    def __call__(self, *inputs):
        values = list(inputs)
        for op, i, j in self.steps:
            a, b = values[i], values[j]
            if op in _UNARY:
                values.append(getattr(torch, op)(a))
            elif op == "add":
                values.append(a + b)
            elif op == "mul":
                values.append(a * b)
            elif op == "sub":
                values.append(a - b)
            elif op == "mm":
                values.append(a @ b)
            elif op == "rowsum":              # a reduction broadcast back: (n, n) -> (n, 1) -> (n, n)
                values.append(a - a.sum(-1, keepdim=True))
            elif op == "t":
                values.append(a.t() * 1.0)
            elif op == "inplace":             # an in-place op on a fresh value: functionalised away
                c = a + 1.0
                c.mul_(b)
                values.append(c)
        outs = tuple(values[k] for k in self.outputs)
        return outs if len(outs) > 1 else outs[0]

    def inputs(self, seed: int = 0, grad=None) -> list[torch.Tensor]:
        """The inputs (size x size, values of N(0, 0.25)); ``grad[k]`` says whether input k requires grad."""
        g = torch.Generator().manual_seed(seed)
        grad = tuple(grad) if grad is not None else (True,) * self.n_inputs
        return [torch.randn(self.size, self.size, generator=g).mul_(0.5).requires_grad_(bool(r)) for r in grad]

    def source(self) -> str:
        lines = [f"v{k} = input{k}" for k in range(self.n_inputs)]
        for k, (op, i, j) in enumerate(self.steps, start=self.n_inputs):
            two = op in ("add", "mul", "sub", "mm", "inplace")
            lines.append(f"v{k} = {op}(v{i}" + (f", v{j})" if two else ")"))
        return "; ".join(lines + [f"return {', '.join(f'v{k}' for k in self.outputs)}"])


# ---- a transformer shaped like the capstone's GPT -------------------------------------------------
class _Block(nn.Module):
    """Pre-norm block: x + attn(ln_1(x)), then x + mlp(ln_2(x)) (``ptinternals.gpt.model.Block``)."""

    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.c_fc, self.mlp_proj = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):                                  # x: (B, T, C)
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class TinyGPT(nn.Module):
    """``TinyGPT((vocab_size, n_layer, n_head, n_embd, block_size))``: the capstone GPT's structure."""

    def __init__(self, spec):
        super().__init__()
        vocab_size, n_layer, n_head, n_embd, block_size = (int(v) for v in spec)
        if n_layer < 1 or n_embd % n_head:
            raise ValueError(f"need n_layer >= 1 and n_embd divisible by n_head, got {spec!r}")
        self.block_size = block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList(_Block(n_embd, n_head) for _ in range(n_layer)), ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        for p in self.parameters():                        # small weights: logits of order 1
            if p.dim() > 1:
                nn.init.normal_(p, std=0.5 / math.sqrt(p.shape[-1]))

    def forward(self, idx):                                # idx: (B, T) token ids -> logits (B, T, vocab)
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))
