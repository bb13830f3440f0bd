"""Train the capstone GPT: the reference train step, and a run with every course part switchable.

    python -m ptinternals.gpt.train --preset cpu                        # ~2 min on a laptop CPU
    python -m ptinternals.gpt.train --preset gpu --kernels=flash         # nanoGPT's Shakespeare run
    torchrun --standalone --nproc_per_node=2 -m ptinternals.gpt.train --preset cpu --ddp=True
    python -m ptinternals.gpt.train --out_dir=run1 --max_iters=500       # then, to continue:
    python -m ptinternals.gpt.train --out_dir=run1 --max_iters=1500 --resume=True

The train step (nanoGPT's inner loop, with the course's parts where they act)::

    for each of grad_accum micro-batches:            DDP's no_sync() on all but the last: one
        with autocast(bf16 / fp16):                   all-reduce per optimizer step (the distributed chapter)
            loss = model(x, y)[1] / grad_accum        matmuls in low precision (the amp chapter)
        scaler.scale(loss).backward()                 x S for fp16; S = 1 (disabled) otherwise
    scaler.unscale_(optimizer)                        true gradients before clipping
    clip_grad_norm_(params, grad_clip)                the global norm, over every parameter
    scaler.step(optimizer); scaler.update()           skip the step on inf/NaN (fp16)
    optimizer.zero_grad(set_to_none=True)             frees the grads until the next backward

``train(config)`` sets up the device, the process group (torchrun's environment, gloo on CPUs,
NCCL on GPUs), the data, the model with its switches, the optimizer and scaler, resumes from
``out_dir/ckpt.pt`` when asked, measures the first step's memory, runs ``loop.fit`` and finally
samples text. It returns a :class:`TrainResult` (rank 0's view).
"""
from __future__ import annotations

import datetime
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .checkpoint import check_compatible, load_checkpoint, restore, save_checkpoint
from .config import GPTConfig, apply_overrides, preset
from .corpus import load_corpus
from .loop import autocast_context, fit, sample_text
from .memory import format_memory_report, measure_step_memory, resident_tensors
from .model import GPT


def train_step(model, optimizer, scaler, batches, amp_dtype=None, grad_clip: float = 0.0) -> tuple[float, float]:
    """One optimizer step on ``batches`` (a list of (x, y)); returns (mean loss, grad norm before clipping).

    ``scaler``: a GradScaler (``ptinternals.amp.GradScaler`` or torch's) or None. ``amp_dtype``: the
    autocast dtype or None for full precision. ``model`` may be wrapped in DDP (``no_sync``).
    """
    if not batches:
        raise ValueError("batches must hold at least one (x, y) pair")
    device_type = next(model.parameters()).device.type
    n = len(batches)
    total = torch.zeros((), device=batches[0][0].device)
    for i, (x, y) in enumerate(batches):
        sync = nullcontext() if i == n - 1 or not hasattr(model, "no_sync") else model.no_sync()
        with sync:
            with autocast_context(device_type, amp_dtype):
                _, loss = model(x, y)
                loss = loss / n                        # the step's loss is the mean over micro-batches
            (scaler.scale(loss) if scaler is not None else loss).backward()
        total += loss.detach().float()
    if scaler is not None:
        scaler.unscale_(optimizer)                     # clip the true gradients, not S times them
    params = [p for group in optimizer.param_groups for p in group["params"]]
    max_norm = grad_clip if grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)   # inf: measure only
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(total), float(grad_norm)


@dataclass
class TrainResult:
    config: GPTConfig
    model: GPT
    tokenizer: object
    history: dict
    memory: dict | None
    sample: str
    wall_s: float
    tokens_per_s: float
    device: str
    world_size: int = 1
    rank: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def final_val_loss(self) -> float:
        return self.history["val_loss"][-1]

    @property
    def final_train_loss(self) -> float:
        return self.history["train_loss"][-1]


def resolve_device(config: GPTConfig) -> str:
    if config.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' but torch.cuda.is_available() is False; use --device=cpu or "
                           "--preset cpu")
    if config.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return config.device


def amp_dtype_for(config: GPTConfig, device_type: str) -> torch.dtype | None:
    """bf16/fp16 autocast on CUDA when ``amp``; None (fp32) on the CPU, where bf16 matmuls are slower."""
    if not config.amp or device_type != "cuda":
        return None
    return getattr(torch, config.amp_dtype)


def setup_distributed(config: GPTConfig, device: str) -> tuple[int, int, torch.device, bool]:
    """(rank, world_size, this rank's device, whether we created the process group)."""
    if not config.ddp:
        return 0, 1, torch.device(device), False
    if dist.is_initialized():                                   # e.g. inside run_ranks
        rank, world = dist.get_rank(), dist.get_world_size()
        local = int(os.environ.get("LOCAL_RANK", rank))
        return rank, world, torch.device("cuda", local) if device == "cuda" else torch.device("cpu"), False
    if "RANK" not in os.environ:                                # plain python: a world of one
        from ..distributed.launch import find_free_port

        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(find_free_port()))
    local = int(os.environ.get("LOCAL_RANK", 0))
    backend = config.backend
    if backend == "auto":
        backend = "nccl" if device == "cuda" else "gloo"
    if backend == "nccl" and device != "cuda":
        raise ValueError("backend='nccl' needs device='cuda'")
    rank_device = torch.device("cuda", local) if device == "cuda" else torch.device("cpu")
    if rank_device.type == "cuda":
        torch.cuda.set_device(rank_device)
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=10))   # env:// (torchrun's)
    return dist.get_rank(), dist.get_world_size(), rank_device, True


def train(config: GPTConfig) -> TrainResult:
    """Run ``config`` to ``max_iters``; returns rank 0's result (every rank gets one)."""
    if not isinstance(config, GPTConfig):
        raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
    t_start = time.perf_counter()
    device = resolve_device(config)
    rank, world, dev, own_group = setup_distributed(config, device)
    is_master = rank == 0
    log = print if (is_master and config.progress) else (lambda *a, **k: None)
    notes = []
    try:
        tokenizer, train_data, val_data = load_corpus(config.data_path or None, config.train_fraction)
        if config.vocab_size not in (0, tokenizer.vocab_size):
            raise ValueError(f"vocab_size={config.vocab_size} but the corpus has {tokenizer.vocab_size} characters")
        config = config.replace(vocab_size=tokenizer.vocab_size)
        amp_dtype = amp_dtype_for(config, dev.type)
        if config.amp and amp_dtype is None:
            notes.append("amp=True is ignored on the CPU: training in fp32 (bf16 matmuls are slower there)")
        if dev.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True      # fp32 matmuls on tensor cores (TF32)
            torch.backends.cudnn.allow_tf32 = True
        torch.manual_seed(config.seed)                        # same initial weights on every rank
        model = GPT(config).to(dev)
        optimizer = model.configure_optimizers(dev.type)
        from ..amp import GradScaler  # the amp chapter's, same API as torch.amp's

        scaler = GradScaler(dev.type, enabled=amp_dtype == torch.float16)
        batch_generator = torch.Generator().manual_seed(config.seed + rank)   # each rank its own windows
        torch.manual_seed(config.seed + 1 + rank)             # each rank its own dropout stream
        start_iter, history = 0, None
        ckpt_path = os.path.join(config.out_dir, "ckpt.pt") if config.out_dir else ""
        if config.resume:
            ckpt = load_checkpoint(ckpt_path)
            check_compatible(ckpt, config, world)
            start_iter = restore(ckpt, model=model, optimizer=optimizer, scaler=scaler,
                                 batch_generator=batch_generator, device=dev, rank=rank)
            history = ckpt["history"]
            log(f"resumed from {ckpt_path} at iteration {start_iter}")
        eval_model = model
        train_model = torch.compile(model) if config.compile else model
        if config.ddp:
            from ..distributed import DistributedDataParallel

            train_model = DistributedDataParallel(train_model)   # broadcasts rank 0's weights
        log(f"GPT: {model.num_params() / 1e6:.2f}M parameters (without position embeddings), "
            f"{config.n_layer} layers x {config.n_head} heads x {config.n_embd}; context {config.block_size}; "
            f"device {dev}{f', {world} ranks' if world > 1 else ''}; kernels={config.kernels}, "
            f"amp={amp_dtype}, checkpointing={config.checkpointing}, compile={config.compile}")
        for note in notes:
            log("note: " + note)

        memory = {}
        measure_first = [config.memory_report and start_iter < config.max_iters]

        def step(*args):                                       # train_step, the first call measured
            if not measure_first[0]:
                return train_step(*args)
            measure_first[0] = False
            result, report = measure_step_memory(lambda: train_step(*args), dev,
                                                 resident=resident_tensors(model, optimizer))
            memory.update(report)
            log(format_memory_report(report))
            return result

        def on_eval(it, losses, hist):
            if ckpt_path and it > start_iter:
                save_checkpoint(ckpt_path, model=model, optimizer=optimizer, scaler=scaler, iter_num=it,
                                config=config, history=hist, tokenizer=tokenizer,
                                batch_generator=batch_generator, device=dev)

        t_loop = time.perf_counter()
        history = fit(train_model, optimizer, config, train_data, val_data, step, device=dev,
                      scaler=scaler, amp_dtype=amp_dtype, start_iter=start_iter, generator=batch_generator,
                      history=history, on_eval=on_eval, eval_model=eval_model, is_master=is_master,
                      world_size=world)
        loop_s = time.perf_counter() - t_loop
        steps_run = config.max_iters - start_iter
        timed = history["step_s"][-steps_run:][1:] if steps_run > 1 else history["step_s"][-steps_run:]
        # the first step is left out: it was measured (memory), compiled or autotuned
        tokens_per_s = len(timed) * config.tokens_per_iter(world) / sum(timed) if timed and sum(timed) else 0.0
        sample = ""
        if config.sample_tokens and is_master:
            sample = sample_text(model, tokenizer, config, device=dev)
        wall = time.perf_counter() - t_start
        log(f"done: {steps_run} iterations in {loop_s:.1f} s ({tokens_per_s / 1e3:.1f}k tokens/s in train "
            f"steps); val loss {history['val_loss'][-1]:.4f}")
        return TrainResult(config, model, tokenizer, history, memory or None, sample, wall, tokens_per_s,
                           str(dev), world, rank, notes)
    finally:
        if own_group:
            dist.destroy_process_group()


USAGE = """usage: python -m ptinternals.gpt.train [--preset cpu|gpu] [--key=value ...]

Every field of ptinternals.gpt.config.GPTConfig is a --key=value override (type-checked), e.g.
  --max_iters=500 --kernels=flash --amp=True --checkpointing=True --out_dir=run1 --resume=True
Under torchrun, add --ddp=True."""


def parse_args(argv: list[str]) -> GPTConfig:
    """``--preset NAME`` (or ``--preset=NAME``) plus ``--key=value`` overrides -> a checked config."""
    name, rest, i = "cpu", [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            raise SystemExit(USAGE)
        if arg == "--preset":
            if i + 1 >= len(argv):
                raise ValueError("--preset needs a value: cpu or gpu")
            name, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--preset="):
            name = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return apply_overrides(preset(name), rest)


def main(argv: list[str] | None = None) -> TrainResult:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        config = parse_args(argv)
    except (ValueError, TypeError) as e:
        print(f"error: {e}\n\n{USAGE}", file=sys.stderr)
        raise SystemExit(2) from None
    result = train(config)
    if result.rank == 0 and result.sample and config.progress:
        print("---- sample ----\n" + result.sample)
    return result


if __name__ == "__main__":
    main()
