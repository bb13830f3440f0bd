"""Random differentiable programs for the partitioner and FX tests: a list of steps over a pool of
values, turned into a Python function. Each step reads earlier values, so every program is a DAG."""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

UNARY = ("sin", "cos", "exp", "tanh", "sigmoid", "relu", "neg")
BINARY = ("add", "mul", "sub")
OTHER = ("mm", "rowsum", "t")


@dataclass(frozen=True)
class Program:
    n_inputs: int
    steps: tuple                 # (op, i, j) reading values i, j (j unused by unary ops)
    outputs: tuple               # indices of returned values
    size: int

    def __call__(self, *inputs):
        values = list(inputs)
        for op, i, j in self.steps:
            a, b = values[i], values[j]
            if op in UNARY:
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
        outs = tuple(values[k] for k in self.outputs)
        return outs if len(outs) > 1 else outs[0]

    def inputs(self, seed: int = 0, grad=None):
        g = torch.Generator().manual_seed(seed)
        grad = grad if grad is not None else (True,) * self.n_inputs
        return [torch.randn(self.size, self.size, generator=g).mul_(0.5).requires_grad_(r) for r in grad]

    def source(self) -> str:
        lines = [f"v{k} = input{k}" for k in range(self.n_inputs)]
        for k, (op, i, j) in enumerate(self.steps, start=self.n_inputs):
            lines.append(f"v{k} = {op}(v{i}" + (f", v{j})" if op in BINARY + ("mm",) else ")"))
        return "\n".join(lines + [f"return {', '.join(f'v{k}' for k in self.outputs)}"])


def random_program(rng: random.Random, n_steps: int | None = None, ops=UNARY + BINARY + OTHER) -> Program:
    n_inputs = rng.randint(1, 3)
    n_steps = rng.randint(1, 8) if n_steps is None else n_steps
    steps = []
    for k in range(n_steps):
        n_values = n_inputs + k
        op = rng.choice(ops)
        i = rng.randrange(n_values) if rng.random() < 0.4 else n_values - 1   # favour chains
        steps.append((op, i, rng.randrange(n_values)))
    total = n_inputs + n_steps
    outputs = (total - 1,) if rng.random() < 0.7 else (total - 1, rng.randrange(n_inputs, total))
    if len(set(outputs)) < len(outputs):
        outputs = outputs[:1]
    return Program(n_inputs, tuple(steps), outputs, rng.choice((3, 4, 8)))
