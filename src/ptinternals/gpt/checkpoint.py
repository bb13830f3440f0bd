"""Save and resume a training run so that the resumed run is the uninterrupted one, bit for bit.

A checkpoint (nanoGPT's ``ckpt.pt``, plus what exact resumption needs) holds:

- ``model``: the unwrapped module's ``state_dict`` (not DDP's or ``torch.compile``'s wrapper, whose
  keys carry ``module.`` / ``_orig_mod.`` prefixes); tied weights are stored once by torch.save;
- ``optimizer``: AdamW's moments and step counts, and the learning rate of each group;
- ``scaler``: the GradScaler's scale and growth tracker (fp16 only; ``None`` otherwise);
- ``iter_num``: optimizer steps done; the loop continues at that iteration;
- ``rng``: per rank, the state of every random generator the run draws from: the CPU generator
  (``torch.get_rng_state()``), the generator of **each CUDA device** (``torch.cuda.get_rng_state_all()``:
  dropout on a GPU tensor draws from its device's CUDA generator, which ``torch.get_rng_state()``
  neither reads nor restores, so a resume that restored only the CPU state would draw other dropout
  masks than the uninterrupted run), and the batch generator's state (which windows come next). In DDP
  every rank has its own streams, so rank 0 gathers all of them with ``all_gather_object`` before writing;
- ``config``, ``tokenizer`` and ``history`` (losses so far, for the loss curve).

The file is written under a temporary name and renamed (``os.replace`` is atomic on POSIX), so a
crash mid-save leaves the previous checkpoint intact.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from .config import GPTConfig

#: Fields that shape the model: a checkpoint cannot be resumed under different values.
ARCHITECTURE_FIELDS = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "bias")


def rng_state(device: torch.device, batch_generator: torch.Generator) -> dict:
    """This rank's random streams: the CPU generator, every CUDA device's generator (when the run uses
    CUDA, or anything in this process has started it), and the batch generator.

    ``cuda`` is a list indexed by device (``torch.cuda.get_rng_state_all()``, as torch.utils.checkpoint's
    ``get_device_states`` saves one state per device in use), or None when CUDA is not in use.
    """
    device = torch.device(device)
    uses_cuda = torch.cuda.is_available() and (device.type == "cuda" or torch.cuda.is_initialized())
    return {"cpu": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if uses_cuda else None,
            "batches": batch_generator.get_state()}


def set_rng_state(state: dict, device: torch.device, batch_generator: torch.Generator) -> None:
    """Restore what :func:`rng_state` saved: the CPU generator, each CUDA device's generator that exists
    here, and the batch generator. Raises ValueError when this rank computes on a CUDA device whose
    generator the checkpoint does not hold (its dropout masks could not continue the saved run)."""
    device = torch.device(device)
    cuda = state.get("cuda")
    if isinstance(cuda, torch.Tensor):  # a checkpoint of the earlier format: this rank's device only
        cuda = {device.index or 0: cuda} if device.type == "cuda" else {}
    else:
        cuda = dict(enumerate(cuda or ()))
    if device.type == "cuda" and (device.index or 0) not in cuda:
        raise ValueError(f"the checkpoint holds no CUDA RNG state for {device} (it has "
                         f"{len(cuda)} device state(s)): it was not written by a run on this device")
    torch.set_rng_state(state["cpu"].cpu())
    if cuda and torch.cuda.is_available():
        for index, cuda_state in cuda.items():
            if index < torch.cuda.device_count():   # a device this machine lacks draws nothing here
                torch.cuda.set_rng_state(cuda_state.cpu(), index)
    batch_generator.set_state(state["batches"].cpu())


def save_checkpoint(path: str, *, model, optimizer, scaler, iter_num: int, config: GPTConfig, history: dict,
                    tokenizer, batch_generator: torch.Generator, device: torch.device) -> None:
    """Write the checkpoint (rank 0 writes; every rank must call this under DDP)."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"path must be a non-empty str, got {path!r}")
    distributed = dist.is_available() and dist.is_initialized()
    mine = rng_state(device, batch_generator)
    if distributed:
        rngs = [None] * dist.get_world_size()
        dist.all_gather_object(rngs, mine)
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rngs, rank, world = [mine], 0, 1
    if rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "scaler": scaler.state_dict() if scaler is not None and scaler.is_enabled() else None,
                 "iter_num": iter_num, "config": config.to_dict(), "history": history,
                 "tokenizer": tokenizer.state_dict(), "rng": rngs, "world_size": world}
        tmp = f"{path}.tmp"
        torch.save(state, tmp)
        os.replace(tmp, path)  # atomic: readers see the old file or the whole new one
    if distributed:
        dist.barrier()


def load_checkpoint(path: str) -> dict:
    """Read a checkpoint to the CPU (tensors move to the device when loaded into model/optimizer)."""
    if not isinstance(path, str) or not os.path.isfile(path):
        raise ValueError(f"no checkpoint file at {path!r}")
    return torch.load(path, map_location="cpu", weights_only=True)


def check_compatible(ckpt: dict, config: GPTConfig, world_size: int) -> None:
    """Raise ValueError when ``config`` cannot continue the run stored in ``ckpt``."""
    saved = ckpt["config"]
    diffs = [f"{k}: checkpoint {saved[k]!r}, now {getattr(config, k)!r}" for k in ARCHITECTURE_FIELDS
             if saved.get(k) != getattr(config, k)]
    if diffs:
        raise ValueError("the checkpoint's model differs from this config: " + "; ".join(diffs))
    if ckpt["world_size"] != world_size:
        raise ValueError(f"the checkpoint was written by {ckpt['world_size']} rank(s), this run has "
                         f"{world_size}: the batches and random streams would differ")


def restore(ckpt: dict, *, model, optimizer, scaler, batch_generator: torch.Generator, device: torch.device,
            rank: int = 0) -> int:
    """Load everything into the live objects; returns the iteration to continue from."""
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    if scaler is not None and ckpt.get("scaler") is not None:
        scaler.load_state_dict(ckpt["scaler"])
    set_rng_state(ckpt["rng"][rank], device, batch_generator)
    return int(ckpt["iter_num"])
