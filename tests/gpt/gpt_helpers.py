"""Shared by the capstone's tests: a tiny config, fixed batches, and functions run inside ranks."""
import torch

from ptinternals.gpt import GPT, make_config
from ptinternals.gpt.train import train_step

TINY = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=12, dropout=0.0, batch_size=4,
            progress=False, memory_report=False, sample_tokens=0)


def tiny_config(**changes):
    return make_config("cpu", {**TINY, **changes})


def fixed_batches(steps: int, batch: int = 4, seed: int = 1, cfg=None):
    cfg = cfg or tiny_config()
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        x = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size), generator=g)
        y = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size), generator=g)
        out.append((x, y))
    return out


def trajectory(cfg, batches, *, amp_dtype=None, scaler=None, split=1, seed=0):
    """(losses, grad norms, final state) of train_step over ``batches`` from seeded weights."""
    torch.manual_seed(seed)
    model = GPT(cfg)
    opt = model.configure_optimizers("cpu")
    losses, norms = [], []
    for step, (x, y) in enumerate(batches):
        micro = list(zip(x.chunk(split), y.chunk(split)))
        torch.manual_seed(100 + step)  # dropout masks: the same in every variant
        loss, norm = train_step(model, opt, scaler, micro, amp_dtype, 1.0)
        losses.append(loss)
        norms.append(norm)
    return losses, norms, {k: v.detach().clone() for k, v in model.state_dict().items()}


def ddp_rank(rank, world_size, steps, out_dir):
    """Inside run_ranks: DDP over halves of each batch, two micro-batches per rank (no_sync); then the
    whole reference train() with ddp=True, saving a checkpoint (one start-up for both checks)."""
    from ptinternals.distributed import DistributedDataParallel

    cfg = tiny_config()
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = model.configure_optimizers("cpu")
    ddp = DistributedDataParallel(model)
    losses = []
    for x, y in fixed_batches(steps, batch=8):
        xs, ys = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
        losses.append(train_step(ddp, opt, None, list(zip(xs.chunk(2), ys.chunk(2))), None, 1.0)[0])
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    from ptinternals.gpt.train import train

    cfg = tiny_config(ddp=True, max_iters=4, eval_interval=2, eval_iters=1, out_dir=out_dir,
                      vocab_size=0, memory_report=True)
    result = train(cfg)
    return losses, state, result.history["loss"], result.memory is not None
