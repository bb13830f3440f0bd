"""The amp chapter scaffolding: the small MLP that the mixed-precision exercises train (no solution inside).

Graded code may import this module (it is listed in the chapter's ``sandbox_files``), so it holds only
the model, its initialisation and its data: the training loop is the student's (exercise amp.amp_train) and the
reference's (``ptinternals.amp.trainer``). It imports nothing from the reference package.

    x (B, d_in) fp32 --Linear w1 (d_hidden, d_in), b1--> (B, d_hidden) --ReLU--> --Linear w2, b2--> (B, d_out)

``mlp_forward`` runs in whatever dtype its inputs have: pass bf16 copies of the weights and a bf16 ``x``
and every matmul runs in bf16 (2 bytes per element read and written instead of 4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class MLPConfig:
    """A 2-layer MLP regression: (B, d_in) -> Linear -> ReLU -> Linear -> (B, d_out), MSE loss."""

    d_in: int = 16
    d_hidden: int = 32
    d_out: int = 8
    seed: int = 0
    loss_weight: float = 1.0  # multiplies the mse loss; 2**-20 makes fp16 gradients underflow

    def __post_init__(self):
        for name in ("d_in", "d_hidden", "d_out"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if not isinstance(self.loss_weight, (int, float)) or not (
            math.isfinite(self.loss_weight) and self.loss_weight > 0
        ):
            raise ValueError(f"loss_weight must be a finite float > 0, got {self.loss_weight!r}")


UNDERFLOW_CONFIG = MLPConfig(loss_weight=2.0**-20)


def init_mlp_params(cfg: MLPConfig, device: str = "cpu") -> dict[str, torch.Tensor]:
    """fp32 master weights: w1 (d_hidden, d_in), b1 (d_hidden,), w2 (d_out, d_hidden), b2 (d_out,)."""
    if not isinstance(cfg, MLPConfig):
        raise TypeError(f"cfg must be an MLPConfig, got {type(cfg).__name__}")
    g = torch.Generator().manual_seed(cfg.seed)

    def uniform(shape, fan_in):  # nn.Linear's default init range, +-1/sqrt(fan_in)
        bound = 1.0 / math.sqrt(fan_in)
        return ((torch.rand(shape, generator=g) * 2 - 1) * bound).to(device)

    return {
        "w1": uniform((cfg.d_hidden, cfg.d_in), cfg.d_in),
        "b1": uniform((cfg.d_hidden,), cfg.d_in),
        "w2": uniform((cfg.d_out, cfg.d_hidden), cfg.d_hidden),
        "b2": uniform((cfg.d_out,), cfg.d_hidden),
    }


def mlp_forward(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """(B, d_in) -> (B, d_out) in whatever dtype ``params`` and ``x`` have (they must agree)."""
    h = F.relu(F.linear(x, params["w1"], params["b1"]))  # (B, d_hidden)
    return F.linear(h, params["w2"], params["b2"])  # (B, d_out)


def make_regression_data(
    cfg: MLPConfig, n_batches: int = 4, batch_size: int = 32, seed: int = 1, device: str = "cpu"
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n_batches`` of (x (B, d_in) fp32, y (B, d_out) fp32) from a random "teacher" MLP plus noise."""
    if not isinstance(cfg, MLPConfig):
        raise TypeError(f"cfg must be an MLPConfig, got {type(cfg).__name__}")
    for name, v in (("n_batches", n_batches), ("batch_size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    g = torch.Generator().manual_seed(seed)
    teacher = init_mlp_params(MLPConfig(cfg.d_in, cfg.d_hidden, cfg.d_out, seed=seed + 1000))
    data = []
    for _ in range(n_batches):
        x = torch.randn(batch_size, cfg.d_in, generator=g)
        y = 3.0 * mlp_forward(teacher, x) + 0.01 * torch.randn(batch_size, cfg.d_out, generator=g)
        data.append((x.to(device), y.to(device)))
    return data


# ---- the GradScaler driver: what the notebook demonstrates and the grader runs on a student's class ----
def scaler_trajectory(make_scaler, params, script, lr: float = 0.1) -> dict:
    """Run ``script`` with ``make_scaler()`` and SGD(lr) on fp32 copies of ``params``; record everything.

    ``script`` is a list of steps; a step is ``{"micro": [[g for each param] per micro-batch],
    "unscale": bool, "twice": bool}``. Each micro-batch's loss is ``sum((p.half().float() * g).sum())``,
    so ``p.grad`` is S * g rounded through float16 (overflowing to inf past 65504, as a real fp16
    backward does); a ``g`` of None leaves its parameter out of that loss (no gradient from it, so a
    parameter with None in every micro-batch keeps ``.grad`` None, like a frozen or unused one). ``unscale`` calls ``scaler.unscale_(opt)`` before ``step`` (as you do before
    clipping); ``twice`` then calls it a second time, which must raise RuntimeError.
    """
    ps = [p.detach().to(torch.float32).clone().requires_grad_(True) for p in params]
    opt = torch.optim.SGD(ps, lr=lr)
    n_steps = [0]
    real_step = opt.step

    def counted_step(*args, **kwargs):  # the scaler calls optimizer.step() only on good steps
        n_steps[0] += 1
        return real_step(*args, **kwargs)

    opt.step = counted_step
    scaler = make_scaler()
    out = {"scales": [], "stepped": [], "params": [], "grads": [], "twice": []}
    for spec in script:
        out["scales"].append(float(scaler.get_scale()))
        opt.zero_grad(set_to_none=True)
        for grads in spec["micro"]:
            loss = sum(((p.half().float()) * g).sum() for p, g in zip(ps, grads) if g is not None)
            scaler.scale(loss).backward()
        twice = "not asked"
        if spec.get("unscale"):
            scaler.unscale_(opt)
            if spec.get("twice"):
                try:
                    scaler.unscale_(opt)
                    twice = "no error"
                except Exception as e:  # noqa: BLE001 - the type is the answer
                    twice = type(e).__name__
        before = n_steps[0]
        scaler.step(opt)
        scaler.update()
        out["stepped"].append(n_steps[0] > before)
        out["twice"].append(twice)
        out["grads"].append([p.grad.detach().clone() if p.grad is not None else None for p in ps])
        out["params"].append([p.detach().clone() for p in ps])
    out["scales"].append(float(scaler.get_scale()))
    return out
