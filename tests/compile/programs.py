"""Random differentiable programs for the partitioner tests (``workloads.Program``: a list of steps over a
pool of values, each step reading earlier values, so every program is a DAG)."""
from __future__ import annotations

import random

from ptinternals.compile.workloads import Program

UNARY = ("sin", "cos", "exp", "tanh", "sigmoid", "relu", "neg")
BINARY = ("add", "mul", "sub")
OTHER = ("mm", "rowsum", "t")


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


__all__ = ["Program", "random_program"]
