"""Mixed-precision training by hand: fp32 master weights, low-precision compute copies, loss scaling.

What ``torch.autocast`` + ``GradScaler`` do, written out (the "O2" recipe of NVIDIA Apex):

    master weights   fp32, owned by the optimizer          4 B/param (+ optimizer state)
    compute copies   bf16/fp16 casts made each forward      2 B/param, thrown away after backward
    forward          matmuls on low-precision copies; the loss in fp32 (like autocast's fp32 list)
    backward         grads of the copies are low precision; cast them to fp32 and ADD them into
                     the masters' ``.grad`` (so accumulation over micro-batches happens in fp32)
    step             unscale (grad / S) -> clip the true gradient -> skip if inf/NaN -> optimizer
                     step on fp32 masters -> update S

Why masters in fp32: an update ``lr * g`` is often below half an ulp of the weight (bf16 has 8
significant bits: 1.0 + 2**-9 == 1.0), so a low-precision weight would never move.

This is bit-for-bit the same arithmetic autocast performs for the provided MLP (autocast casts
``x``, ``W`` and ``b`` for ``linear``, runs relu in the input dtype, casts to fp32 for
``mse_loss``, and the weights' ``.grad`` is the low-precision grad cast back by ``_to_copy``'s
backward), so ``train_steps`` and ``reference_autocast_train_steps`` agree closely; tests allow a
small tolerance on the losses and require identical skipped steps.

The provided setting where fp16 without a scaler fails: ``MLPConfig.loss_weight = 2**-20`` stands
for what makes real gradients tiny (a loss averaged over millions of tokens, a small auxiliary-loss
coefficient, late training with small residuals). dloss/dy is about residual * 2**-27 < 2**-25, so
it rounds to 0 in fp16, every weight gradient is exactly 0, and Adam does not move. With a scale
of 2**16 the same gradients are about residual * 2**-11: fine. bf16 (fp32's exponent range) does not
need the scaler at all. Keep CPU runs tiny: bf16/fp16 matmuls are 12-18x slower than fp32 there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .scaffold import UNDERFLOW_CONFIG, MLPConfig, init_mlp_params, make_regression_data, mlp_forward

__all__ = [
    "UNDERFLOW_CONFIG",
    "MLP",
    "amp_train",
    "MLPConfig",
    "init_mlp_params",
    "make_regression_data",
    "mlp_forward",
    "reference_autocast_train_steps",
    "train_steps",
]

_LOW = (torch.float32, torch.bfloat16, torch.float16)


class MLP(torch.nn.Module):
    """The same network as an nn.Module, for the autocast reference run."""

    def __init__(self, params: dict[str, torch.Tensor]):
        super().__init__()
        self.fc1 = torch.nn.Linear(params["w1"].shape[1], params["w1"].shape[0])
        self.fc2 = torch.nn.Linear(params["w2"].shape[1], params["w2"].shape[0])
        with torch.no_grad():
            for lin, w, b in ((self.fc1, "w1", "b1"), (self.fc2, "w2", "b2")):
                lin.weight.copy_(params[w])
                lin.bias.copy_(params[b])
        self.to(params["w1"].device)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def _make_optimizer(params, optimizer: str, lr: float):
    if optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, eps=1e-12)  # small eps: tiny true gradients still move
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr)
    raise ValueError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")


def _check_args(cfg, data, steps, dtype, clip, accum, lr):
    if not isinstance(cfg, MLPConfig):
        raise TypeError(f"cfg must be an MLPConfig, got {type(cfg).__name__}")
    if not isinstance(data, (list, tuple)) or len(data) == 0:
        raise ValueError("data must be a non-empty list of (x, y) tensor pairs")
    for i, pair in enumerate(data):
        if not (
            isinstance(pair, (list, tuple))
            and len(pair) == 2
            and all(isinstance(t, torch.Tensor) for t in pair)
        ):
            raise TypeError(f"data[{i}] must be an (x, y) pair of tensors")
        x, y = pair
        if x.dim() != 2 or x.shape[1] != cfg.d_in or y.shape != (x.shape[0], cfg.d_out):
            raise ValueError(
                f"data[{i}] must be x (B, {cfg.d_in}) and y (B, {cfg.d_out}), "
                f"got {tuple(x.shape)} and {tuple(y.shape)}"
            )
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be an int >= 0, got {steps!r}")
    if dtype not in _LOW:
        raise ValueError(f"dtype must be torch.float32, torch.bfloat16 or torch.float16, got {dtype!r}")
    if clip is not None and not (isinstance(clip, (int, float)) and clip > 0):
        raise ValueError(f"clip must be None or a float > 0, got {clip!r}")
    if isinstance(accum, bool) or not isinstance(accum, int) or accum < 1:
        raise ValueError(f"accum must be an int >= 1, got {accum!r}")
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ValueError(f"lr must be a float > 0, got {lr!r}")


def _initial_params(cfg: MLPConfig, init, device) -> dict[str, torch.Tensor]:
    """Fresh fp32 copies of ``init`` (checked against ``cfg``'s shapes), or ``init_mlp_params(cfg)``."""
    ref = init_mlp_params(cfg, device=str(device))
    if init is None:
        return ref
    if not isinstance(init, dict) or set(init) != set(ref):
        raise ValueError(f"init must be a dict with keys {sorted(ref)}, got {init!r:.80}")
    out = {}
    for name, p in ref.items():
        q = init[name]
        if not isinstance(q, torch.Tensor) or q.shape != p.shape:
            raise ValueError(f"init[{name!r}] must be a tensor of shape {tuple(p.shape)}")
        out[name] = q.detach().to(device=device, dtype=torch.float32).clone()
    return out


def _finish_step(scaler, optimizer, masters, clip) -> tuple[bool, float]:
    """unscale -> clip -> (maybe) step -> update. Returns (skipped, unscaled grad norm before clipping).
    Parameters without a gradient (frozen ones) take no part, as in clip_grad_norm_ and the optimizer."""
    if scaler is not None:
        scaler.unscale_(optimizer)  # grads are now true gradients; found_inf recorded
    if clip is not None:
        norm = torch.nn.utils.clip_grad_norm_(masters, clip)  # clip AFTER unscale_, never before
    else:
        norms = [torch.linalg.vector_norm(p.grad) for p in masters if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())
    if scaler is None:
        optimizer.step()
        return False, float(norm)
    skipped = bool(sum(v.item() for v in scaler._found_inf_per_device(optimizer).values()))
    scaler.step(optimizer)  # skips optimizer.step() when found_inf
    scaler.update()
    return skipped, float(norm)


def _micro_batch(weights: dict, x, y, dtype, scaler, accum: int, loss_weight: float,
                 master_weights: bool = True) -> float:
    """Forward and (scaled) backward of one micro-batch; returns its unscaled loss.

    With master weights, the forward runs on fresh ``dtype`` copies (2 B/param for bf16/fp16) and their
    gradients, cast to fp32, are ADDED into the masters' ``.grad`` (accumulation happens in fp32). A frozen
    master (``requires_grad=False``) gets a copy that needs no gradient, so it gets none and never moves.
    """
    if master_weights:
        compute = {n: p.detach().to(dtype).requires_grad_(p.requires_grad) for n, p in weights.items()}
    else:
        compute = weights
    pred = mlp_forward(compute, x.to(dtype))  # (B, d_out) in dtype
    loss = F.mse_loss(pred.float(), y.float()) * loss_weight  # fp32 loss, like autocast
    micro = loss / accum
    (scaler.scale(micro) if scaler is not None else micro).backward()
    if master_weights:
        with torch.no_grad():  # low-precision grads -> fp32, accumulated in the masters
            for n, p in weights.items():
                g = compute[n].grad
                if g is not None:
                    p.grad = g.float() if p.grad is None else p.grad + g.float()
    return float(loss.detach())


def amp_train(params, optimizer, data, steps, dtype, scaler=None, clip=None, accum=1, loss_weight=1.0):
    """The chapter's exercise amp.amp_train: train ``params`` (fp32 masters ``w1, b1, w2, b2``, some maybe
    frozen) with ``optimizer`` (which owns them) for ``steps`` steps of ``accum`` micro-batches, computing
    in ``dtype`` without autocast. Returns ``(losses, skipped_steps)``: the mean unscaled micro-batch loss
    of each step, and the steps the scaler skipped (its ``update()`` lowered the scale)."""
    if not isinstance(params, dict) or set(params) != {"w1", "b1", "w2", "b2"}:
        raise ValueError(f"params must be a dict with keys b1, b2, w1, w2, got {params!r:.80}")
    w1, w2 = params["w1"], params["w2"]
    cfg = MLPConfig(w1.shape[1], w1.shape[0], w2.shape[0], loss_weight=loss_weight)
    _check_args(cfg, data, steps, dtype, clip, accum, lr=1.0)
    masters = list(params.values())
    losses, skipped = [], []
    for step in range(steps):
        for p in masters:
            p.grad = None
        total = 0.0
        for k in range(accum):
            x, y = data[(step * accum + k) % len(data)]
            total += _micro_batch(params, x, y, dtype, scaler, accum, loss_weight)
        losses.append(total / accum)
        was_skipped, _ = _finish_step(scaler, optimizer, masters, clip)
        if was_skipped:
            skipped.append(step)
    return losses, skipped


def train_steps(
    cfg: MLPConfig,
    data,
    steps: int,
    dtype: torch.dtype = torch.bfloat16,
    *,
    scaler=None,
    clip: float | None = None,
    accum: int = 1,
    lr: float = 1e-2,
    optimizer: str = "adam",
    master_weights: bool = True,
    init: dict | None = None,
) -> dict:
    """Train the MLP for ``steps`` optimizer steps with manual mixed precision (no autocast).

    Micro-batch ``k`` of step ``s`` is ``data[(s * accum + k) % len(data)]``; each micro-batch loss is
    divided by ``accum`` before scaling. ``scaler`` is None or a GradScaler (this package's or
    torch's). ``master_weights=False`` is the counter-example: the weights themselves live in
    ``dtype`` and the optimizer updates them there (small updates round away; a GradScaler refuses
    the fp16 gradients, as torch's does). Returns plain data: ``losses`` (mean unscaled loss per
    step), ``skipped_steps``, ``scales`` (scale used at each step), ``grad_norms`` (unscaled, before
    clipping), ``zero_grad_fraction`` (share of gradient elements exactly 0) and ``final_params``
    (float32). ``init`` (optional) gives the initial fp32 weights instead of ``init_mlp_params(cfg)``.
    """
    _check_args(cfg, data, steps, dtype, clip, accum, lr)
    device = data[0][0].device
    init = _initial_params(cfg, init, device)
    if master_weights:
        weights = init  # fp32 master weights, 4 B/param, owned by the optimizer
    else:
        weights = {n: p.to(dtype) for n, p in init.items()}  # the only copy, 2 B/param
    for p in weights.values():
        p.requires_grad_(True)
    params = list(weights.values())
    opt = _make_optimizer(params, optimizer, lr)
    out = {"losses": [], "skipped_steps": [], "scales": [], "grad_norms": [], "zero_grad_fraction": []}
    for step in range(steps):
        out["scales"].append(scaler.get_scale() if scaler is not None else 1.0)
        for p in params:
            p.grad = None
        total = 0.0
        for k in range(accum):
            x, y = data[(step * accum + k) % len(data)]
            total += _micro_batch(weights, x, y, dtype, scaler, accum, cfg.loss_weight, master_weights)
        n_zero = sum(int((p.grad == 0).sum()) for p in params)
        out["zero_grad_fraction"].append(n_zero / sum(p.numel() for p in params))
        skipped, norm = _finish_step(scaler, opt, params, clip)
        out["losses"].append(total / accum)
        out["grad_norms"].append(norm)
        if skipped:
            out["skipped_steps"].append(step)
    out["final_params"] = {n: p.detach().float().clone() for n, p in weights.items()}
    return out


def reference_autocast_train_steps(
    cfg: MLPConfig,
    data,
    steps: int,
    dtype: torch.dtype = torch.bfloat16,
    *,
    scaler=None,
    clip: float | None = None,
    accum: int = 1,
    lr: float = 1e-2,
    optimizer: str = "adam",
    init: dict | None = None,
    frozen: tuple = (),
) -> dict:
    """The same training with ``torch.autocast`` and (optionally) a GradScaler: the grader's reference.
    ``frozen`` names parameters (``"w1"``, ``"b1"``, ...) set to ``requires_grad=False``: the optimizer
    still owns them (as ``AdamW(model.parameters())`` does), but they get no gradient and never move."""
    _check_args(cfg, data, steps, dtype, clip, accum, lr)
    device = data[0][0].device
    model = MLP(_initial_params(cfg, init, device))
    named = {"w1": model.fc1.weight, "b1": model.fc1.bias, "w2": model.fc2.weight, "b2": model.fc2.bias}
    if not set(frozen) <= set(named):
        raise ValueError(f"frozen must name parameters among {sorted(named)}, got {frozen!r}")
    for n in frozen:
        named[n].requires_grad_(False)
    params = list(named.values())
    opt = _make_optimizer(params, optimizer, lr)
    out = {"losses": [], "skipped_steps": [], "scales": [], "grad_norms": [], "zero_grad_fraction": []}
    for step in range(steps):
        out["scales"].append(scaler.get_scale() if scaler is not None else 1.0)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for k in range(accum):
            x, y = data[(step * accum + k) % len(data)]
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss = F.mse_loss(model(x), y) * cfg.loss_weight  # mse_loss is on autocast's fp32 list
            total += float(loss.detach())
            micro = loss / accum
            (scaler.scale(micro) if scaler is not None else micro).backward()
        graded = [p for p in params if p.grad is not None]
        n_zero = sum(int((p.grad == 0).sum()) for p in graded)
        out["zero_grad_fraction"].append(n_zero / max(1, sum(p.numel() for p in graded)))
        skipped, norm = _finish_step(scaler, opt, params, clip)
        out["losses"].append(total / accum)
        out["grad_norms"].append(norm)
        if skipped:
            out["skipped_steps"].append(step)
    out["final_params"] = {n: p.detach().clone() for n, p in named.items()}
    return out
