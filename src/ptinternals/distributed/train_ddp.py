"""Train a tiny model with this chapter's DDP under torchrun; save and resume checkpoints.

    torchrun --standalone --nproc_per_node=2 -m ptinternals.distributed.train_ddp \\
        --steps 20 --save-every 10 --ckpt-dir ckpt --out final.pt
    torchrun --standalone --nproc_per_node=2 -m ptinternals.distributed.train_ddp \\
        --steps 20 --resume ckpt/step10.pt --out resumed.pt     # same final weights as the first run

Multi-node is the same code: ``torchrun --nnodes=2 --node_rank=K --rdzv_endpoint=HOST:PORT ...``
sets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR for every process; ``init_process_group()`` reads them
(the ``env://`` rendezvous). Without torchrun the script runs as a single rank.

What a checkpoint must hold for a resumed run to be *bit-identical* to an uninterrupted one:

- the model's weights (one copy: DDP keeps the replicas equal, so rank 0 saves);
- the optimizer's state (AdamW's moments and step count);
- the step, from which the data position follows: ``DistributedSampler.set_epoch(epoch)`` makes the
  shuffle a function of (seed, epoch), and the batch index within the epoch is step % steps_per_epoch;
- every rank's RNG state (here dropout draws from it; each rank has its own stream, so rank 0
  gathers all of them with ``all_gather_object``).

The file is written to a temporary name and renamed (``os.replace`` is atomic), so a crash while
saving never leaves a truncated checkpoint behind.
"""
from __future__ import annotations

import argparse
import datetime
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data.distributed import DistributedSampler

from .ddp import DistributedDataParallel
from .launch import find_free_port
from .scaffold import TinyMLP, make_dataset  # noqa: F401  (re-exported: the trainer's model and data)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ptinternals.distributed.train_ddp",
                                description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20, help="total optimizer steps")
    p.add_argument("--batch-size", type=int, default=16, help="global batch size (split across ranks)")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-every", type=int, default=0, help="save a checkpoint every K steps (0: never)")
    p.add_argument("--ckpt-dir", type=str, default=None, help="where step{K}.pt checkpoints go")
    p.add_argument("--resume", type=str, default=None, help="checkpoint file to resume from")
    p.add_argument("--stop-after", type=int, default=None,
                   help="exit after this many steps (simulate a crash)")
    p.add_argument("--out", type=str, default=None, help="rank 0 writes losses and final weights here")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    if args.batch_size < 1:
        p.error(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.save_every < 0:
        p.error(f"--save-every must be >= 0, got {args.save_every}")
    if args.save_every and not args.ckpt_dir:
        p.error("--save-every needs --ckpt-dir")
    if args.resume and not os.path.isfile(args.resume):
        p.error(f"--resume: no such checkpoint file {args.resume!r}")
    return args


def setup_process_group(backend: str) -> tuple[int, int, torch.device]:
    """Join the group torchrun describes in the environment, or make a group of one."""
    if "RANK" not in os.environ:  # plain `python -m ...`: a world of one rank
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(find_free_port()))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() and local_world <= torch.cuda.device_count() else "gloo"
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=5))  # env:// rendezvous
    return dist.get_rank(), dist.get_world_size(), device


def rng_state(device: torch.device) -> dict:
    """This rank's generators: the CPU one and, on a GPU, the CUDA one (dropout draws from it there)."""
    return {"cpu": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["cpu"].cpu())
    if device.type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def save_checkpoint(path: str, step: int, model: nn.Module, optimizer, world_size: int,
                    device: torch.device) -> None:
    rng = [None] * world_size
    dist.all_gather_object(rng, rng_state(device))  # every rank's random streams
    if dist.get_rank() == 0:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "rng": rng, "world_size": world_size}
        tmp = f"{path}.tmp"
        torch.save(state, tmp)
        os.replace(tmp, path)  # atomic: readers see the old file or the whole new one
    dist.barrier()


def main(argv=None) -> dict | None:
    """Train; returns rank 0's result dict (losses, final weights). Under an already initialised
    process group (e.g. inside ``run_ranks``) it uses that group and leaves it initialised."""
    args = parse_args(argv)
    own_group = not dist.is_initialized()
    if own_group:
        rank, world, device = setup_process_group(args.backend)
    else:
        from .launch import rank_device

        rank, world, device = dist.get_rank(), dist.get_world_size(), rank_device()
    try:
        if args.batch_size % world:
            raise ValueError(f"--batch-size ({args.batch_size}) must be divisible by the world size "
                             f"({world})")
        per_rank = args.batch_size // world
        torch.manual_seed(args.seed)
        model = TinyMLP().to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        start = 0
        torch.manual_seed(args.seed + 1 + rank)  # each rank its own dropout stream
        if args.resume:
            ckpt = torch.load(args.resume, map_location=device, weights_only=False)
            if ckpt["world_size"] != world:
                raise ValueError(f"checkpoint {args.resume} was written by {ckpt['world_size']} ranks, "
                                 f"this run has {world}: the data split and RNG streams would differ")
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            set_rng_state(ckpt["rng"][rank], device)
            start = ckpt["step"]
        ddp = DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)  # broadcasts rank 0's weights

        data = make_dataset(seed=args.seed)
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed,
                                     drop_last=True)
        steps_per_epoch = len(sampler) // per_rank
        if steps_per_epoch == 0:
            raise ValueError(f"per-rank batch {per_rank} is larger than the per-rank dataset "
                             f"({len(sampler)} samples)")
        losses = []
        last = min(args.steps, args.stop_after) if args.stop_after is not None else args.steps
        for step in range(start, last):
            epoch, pos = divmod(step, steps_per_epoch)
            sampler.set_epoch(epoch)  # the shuffle is a function of (seed, epoch)
            idx = list(sampler)[pos * per_rank: (pos + 1) * per_rank]
            x, y = data.tensors[0][idx].to(device), data.tensors[1][idx].to(device)
            loss = nn.functional.mse_loss(ddp(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # bucket all-reduces run inside; grads are averaged when it returns
            optimizer.step()
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss)
            losses.append(mean_loss.item() / world)
            if rank == 0:
                print(f"step {step + 1}/{args.steps} loss {losses[-1]:.6f}", flush=True)
            if args.save_every and (step + 1) % args.save_every == 0:
                path = os.path.join(args.ckpt_dir, f"step{step + 1}.pt")
                save_checkpoint(path, step + 1, model, optimizer, world, device)
        result = {"start": start, "step": last, "losses": losses,
                  "model": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}}
        if rank == 0 and args.out:
            torch.save(result, args.out)
        return result if rank == 0 else None
    finally:
        if own_group:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
