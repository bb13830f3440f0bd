"""The training loop around a train step: schedule, batches, evaluation, progress, sampling.

nanoGPT's ``train.py`` main loop, minus what each course part adds (those live in the train step
and in ``train.py``). This module is scaffolding shared by the reference trainer and the capstone
notebook: it calls a ``train_step`` it is given and knows nothing of DDP, AMP or kernels, so the
same loop runs the reference parts and a student's parts.

    for it in range(start, max_iters):
        if it % eval_interval == 0: estimate train/val loss (fixed batches), callback (checkpoint)
        lr = lr_at(it)                               warmup, then cosine decay to min_lr
        batches = grad_accum x get_batch(train)      from the run's own torch.Generator
        loss, grad_norm = train_step(model, optimizer, scaler, batches, amp_dtype, grad_clip)
    evaluate once more at the end

The model follows nanoGPT's protocol: ``model(idx, targets) -> (logits, loss)``.
"""
from __future__ import annotations

import math
import sys
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from .config import GPTConfig
from .corpus import get_batch

EVAL_SEED = 20_240_601  # evaluation batches are the same at every evaluation (a smoother curve)


def lr_at(it: int, config: GPTConfig) -> float:
    """The learning rate of iteration ``it`` (nanoGPT's ``get_lr``).

    Linear warmup over ``warmup_iters`` (lr * (it + 1) / (warmup + 1)), then a half cosine from
    ``learning_rate`` down to ``min_lr`` at ``lr_decay_iters``, then ``min_lr``.
    """
    if isinstance(it, bool) or not isinstance(it, int) or it < 0:
        raise ValueError(f"it must be an int >= 0, got {it!r}")
    if it < config.warmup_iters:
        return config.learning_rate * (it + 1) / (config.warmup_iters + 1)
    if it >= config.lr_decay_iters:
        return config.min_lr
    ratio = (it - config.warmup_iters) / max(1, config.lr_decay_iters - config.warmup_iters)  # 0 -> 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))                                             # 1 -> 0
    return config.min_lr + coeff * (config.learning_rate - config.min_lr)


def autocast_context(device_type: str, amp_dtype: torch.dtype | None):
    """``torch.autocast(device_type, amp_dtype)``, or nothing when ``amp_dtype`` is None."""
    if amp_dtype is None:
        return nullcontext()
    return torch.autocast(device_type=device_type, dtype=amp_dtype)


def make_optimizer(model, config: GPTConfig, device_type: str = "cpu") -> torch.optim.AdamW:
    """nanoGPT's AdamW: weight decay on matrices (matmul weights, embeddings), not on gains and biases;
    the fused single-kernel update on CUDA."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    extra = {"fused": True} if device_type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=config.learning_rate, betas=(config.beta1, config.beta2), **extra)


@torch.no_grad()
def estimate_loss(model, splits: dict, config: GPTConfig, device="cpu", amp_dtype=None) -> dict:
    """Mean loss over ``eval_iters`` fixed batches of each split, in eval mode (no dropout)."""
    was_training = model.training
    model.eval()
    out = {}
    for k, (name, data) in enumerate(splits.items()):
        generator = torch.Generator().manual_seed(EVAL_SEED + k)
        losses = []
        for _ in range(config.eval_iters):
            x, y = get_batch(data, config.batch_size, config.block_size, generator, device)
            with autocast_context(torch.device(device).type, amp_dtype):
                _, loss = model(x, y)
            losses.append(loss.float().item())
        out[name] = sum(losses) / len(losses)
    model.train(was_training)
    return out


class ProgressBar:
    """A one-line bar (redrawn in place in a terminal) or a line every ``log_interval`` iterations."""

    def __init__(self, total: int, *, start: int = 0, tokens_per_iter: int = 0, log_interval: int = 100,
                 enabled: bool = True, width: int = 24, stream=None):
        self.total, self.start, self.tokens_per_iter = total, start, tokens_per_iter
        self.log_interval, self.enabled, self.width = log_interval, enabled, width
        self.stream = stream or sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.rate = None       # tokens/s, exponential moving average over iterations
        self.last_draw = 0.0
        self.t0 = time.perf_counter()

    def update(self, it: int, loss: float, lr: float, step_seconds: float) -> None:
        """After iteration ``it`` (0-based) took ``step_seconds``."""
        if step_seconds > 0 and self.tokens_per_iter:
            rate = self.tokens_per_iter / step_seconds
            self.rate = rate if self.rate is None else 0.9 * self.rate + 0.1 * rate
        if not self.enabled:
            return
        done = it + 1
        now = time.perf_counter()
        if self.tty and (now - self.last_draw > 0.2 or done == self.total):
            self.last_draw = now
            self.stream.write("\r" + self.line(done, loss, lr))
            self.stream.flush()
        elif not self.tty and (done % self.log_interval == 0 or done == self.total):
            self.stream.write(self.line(done, loss, lr) + "\n")
            self.stream.flush()

    def line(self, done: int, loss: float, lr: float) -> str:
        frac = done / max(1, self.total)
        filled = int(round(frac * self.width))
        bar = "#" * filled + "." * (self.width - filled)
        rate = f"{self.rate / 1e3:7.1f}k tok/s" if self.rate else "    ... tok/s"
        left = (self.total - done) * self.tokens_per_iter / self.rate if self.rate else float("nan")
        eta = f"{int(left // 60)}m{int(left % 60):02d}s" if math.isfinite(left) else "--"
        return (f"iter {done:>{len(str(self.total))}}/{self.total} [{bar}] loss {loss:.4f} | {rate} | "
                f"lr {lr:.2e} | eta {eta}")

    def message(self, text: str) -> None:
        if self.enabled:
            self.stream.write(("\r\033[K" if self.tty else "") + text + "\n")
            self.stream.flush()


def new_history() -> dict:
    return {"iter": [], "loss": [], "lr": [], "grad_norm": [], "step_s": [],
            "eval_iter": [], "train_loss": [], "val_loss": [], "eval_elapsed_s": []}


def fit(model, optimizer, config: GPTConfig, train_data: torch.Tensor, val_data: torch.Tensor, train_step, *,
        device="cpu", scaler=None, amp_dtype=None, start_iter: int = 0, generator: torch.Generator | None = None,
        history: dict | None = None, on_eval=None, eval_model=None, is_master: bool = True,
        world_size: int = 1) -> dict:
    """Train from ``start_iter`` to ``config.max_iters``; returns the history (lists, see ``new_history``).

    ``train_step(model, optimizer, scaler, batches, amp_dtype, grad_clip) -> (loss, grad_norm)``
    does one optimizer step on ``batches`` (a list of ``grad_accum`` (x, y) pairs).
    ``eval_model``: the module to evaluate (the unwrapped one when ``model`` is DDP or compiled).
    ``on_eval(it, losses, history)`` runs after each evaluation (``it`` steps done): checkpoints.
    """
    if not callable(train_step):
        raise TypeError(f"train_step must be callable, got {type(train_step).__name__}")
    if not isinstance(start_iter, int) or not 0 <= start_iter <= config.max_iters:
        raise ValueError(f"start_iter must be an int in [0, max_iters={config.max_iters}], got {start_iter!r}")
    generator = generator or torch.Generator().manual_seed(config.seed)
    history = history if history is not None else new_history()
    eval_model = eval_model or model
    splits = {"train": train_data, "val": val_data}
    bar = ProgressBar(config.max_iters, start=start_iter, tokens_per_iter=config.tokens_per_iter(world_size),
                      log_interval=config.log_interval, enabled=config.progress and is_master)
    clock = time.perf_counter()
    elapsed0 = history["eval_elapsed_s"][-1] if history["eval_elapsed_s"] else 0.0

    def evaluate(it: int) -> None:
        losses = estimate_loss(eval_model, splits, config, device, amp_dtype)
        history["eval_iter"].append(it)
        history["train_loss"].append(losses["train"])
        history["val_loss"].append(losses["val"])
        history["eval_elapsed_s"].append(elapsed0 + time.perf_counter() - clock)
        bar.message(f"eval at iter {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if on_eval is not None:
            on_eval(it, losses, history)

    for it in range(start_iter, config.max_iters):
        if config.eval_interval and it % config.eval_interval == 0 and it not in history["eval_iter"]:
            evaluate(it)
        lr = lr_at(it, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batches = [get_batch(train_data, config.batch_size, config.block_size, generator, device)
                   for _ in range(config.grad_accum)]
        t0 = time.perf_counter()
        loss, grad_norm = train_step(model, optimizer, scaler, batches, amp_dtype, config.grad_clip)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        history["iter"].append(it)
        history["loss"].append(float(loss))
        history["lr"].append(lr)
        history["grad_norm"].append(float(grad_norm))
        history["step_s"].append(dt)
        bar.update(it, float(loss), lr, dt)
    if config.max_iters not in history["eval_iter"]:
        evaluate(config.max_iters)
    return history


@torch.no_grad()
def generate(model, idx: torch.Tensor, max_new_tokens: int, block_size: int, temperature: float = 1.0,
             top_k: int = 0, generator: torch.Generator | None = None) -> torch.Tensor:
    """Append ``max_new_tokens`` tokens sampled from ``model``'s next-token distribution to idx (B, T)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    for _ in range(max_new_tokens):
        out = model(idx[:, -block_size:])                                   # crop to the context window
        logits = out[0] if isinstance(out, tuple) else out
        logits = logits[:, -1, :].float() / temperature                     # (B, V): the next token only
        if top_k:
            kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = F.softmax(logits, dim=-1).cpu()
        nxt = torch.multinomial(probs, num_samples=1, generator=generator).to(idx.device)   # (B, 1)
        idx = torch.cat((idx, nxt), dim=1)
    return idx


def sample_text(model, tokenizer, config: GPTConfig, *, prompt: str = "\n", n_tokens: int | None = None,
                device="cpu", seed: int | None = None) -> str:
    """``n_tokens`` characters sampled after ``prompt`` (eval mode, the run's temperature and top_k)."""
    was_training = model.training
    model.eval()
    idx = torch.tensor([tokenizer.encode(prompt)], dtype=torch.long, device=device)
    generator = torch.Generator().manual_seed(config.seed if seed is None else seed)
    n = config.sample_tokens if n_tokens is None else n_tokens
    out = generate(model, idx, n, config.block_size, config.temperature, config.top_k, generator)
    model.train(was_training)
    return tokenizer.decode(out[0, len(prompt):].tolist())
