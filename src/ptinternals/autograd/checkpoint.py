"""Activation checkpointing from scratch: keep a block's inputs, recompute its activations in backward.

Mirrors torch/utils/checkpoint.py, both designs:

- ``checkpoint``  the *reentrant* ``CheckpointFunction``: a ``torch.autograd.Function`` whose
  forward runs the block under ``no_grad`` (no graph, no saved activations) and saves only the
  inputs; its backward re-runs the block with grad enabled and calls ``torch.autograd.backward``
  on the recomputed outputs (a backward inside the backward: "reentrant"). Limits, as in torch: it
  cannot serve ``torch.autograd.grad`` (the inner backward accumulates into ``.grad``), and if no
  *input* requires grad the output does not either, so parameters inside get no gradient.
- ``checkpoint_with_hooks``  the *non-reentrant* design (``use_reentrant=False``): the block runs
  normally, building its graph, but under ``saved_tensors_hooks`` whose pack hook stores an index
  instead of the tensor. The first unpack in backward re-runs the block to get the tensors back.
  The graph is the ordinary one, so ``autograd.grad`` and parameter-only gradients just work.

Both restore the RNG state of the forward before recomputing (``preserve_rng_state``): a dropout
mask drawn again must be the same mask. Every device has its own generator and an op draws from the
one of the device its tensor is on (dropout on a GPU tensor: the CUDA generator), so the state saved
is the CPU's plus that of each CUDA device an input lives on, restored inside
``torch.random.fork_rng(devices=...)`` (torch's ``get_device_states``/``set_device_states``). Memory: a block of L layers of width H on a batch B keeps
``B*H*4`` bytes (its float32 input) instead of about ``2*L*B*H*4`` (each layer's matmul input and
activation output); the cost is one extra forward of the block.
"""
from __future__ import annotations

import warnings

import torch


def _capture_rng_state(args) -> dict:
    """CPU generator state, plus that of every CUDA device an argument lives on."""
    devices = sorted({a.device.index if a.device.index is not None else torch.cuda.current_device()
                      for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda"})
    return {"cpu": torch.get_rng_state(), "devices": devices,
            "cuda": [torch.cuda.get_rng_state(d) for d in devices]}


class _restored_rng:
    """Run a block with the RNG as it was at ``state``, then put the current RNG state back."""

    def __init__(self, state: dict | None):
        self.state = state

    def __enter__(self):
        if self.state is None:
            return self
        self._fork = torch.random.fork_rng(devices=self.state["devices"])
        self._fork.__enter__()
        torch.set_rng_state(self.state["cpu"])
        for d, s in zip(self.state["devices"], self.state["cuda"], strict=True):
            torch.cuda.set_rng_state(s, d)
        return self

    def __exit__(self, *exc):
        if self.state is not None:
            return self._fork.__exit__(*exc)
        return False


def _check_args(fn, preserve_rng_state) -> None:
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(preserve_rng_state, bool):
        raise TypeError(f"preserve_rng_state must be a bool, got {type(preserve_rng_state).__name__}")


# ----------------------------------------------------------------------------- reentrant version
class CheckpointFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run_function, preserve_rng_state, *args):
        ctx.run_function = run_function
        ctx.rng_state = _capture_rng_state(args) if preserve_rng_state else None
        # Tensors go through save_for_backward (version-checked, counted by saved_tensors_hooks);
        # other arguments (ints, flags) are kept as they are.
        ctx.tensor_positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        ctx.other_args = [None if isinstance(a, torch.Tensor) else a for a in args]
        ctx.save_for_backward(*(args[i] for i in ctx.tensor_positions))
        with torch.no_grad():  # no graph: the block's activations are freed as it runs
            return run_function(*args)

    @staticmethod
    def backward(ctx, *grad_outputs):
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError("checkpoint() (reentrant) does not work with torch.autograd.grad(); call "
                               ".backward() or use checkpoint_with_hooks()")
        args = list(ctx.other_args)
        for pos, t in zip(ctx.tensor_positions, ctx.saved_tensors, strict=True):
            args[pos] = t.detach().requires_grad_(t.requires_grad)  # fresh leaves to collect input grads
        with _restored_rng(ctx.rng_state), torch.enable_grad():
            outputs = ctx.run_function(*args)  # the recomputation: same ops, same dropout masks
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs, strict=False)
                 if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
        if not pairs:
            raise RuntimeError("none of the checkpointed block's outputs requires grad: checkpoint() is "
                               "not needed")
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])  # fills params' .grad too
        input_grads = tuple(a.grad if isinstance(a, torch.Tensor) else None for a in args)
        return (None, None) + input_grads


def checkpoint(fn, *args, preserve_rng_state: bool = True):
    """``fn(*args)`` without keeping its activations; recomputed in backward (reentrant design)."""
    _check_args(fn, preserve_rng_state)
    if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        warnings.warn("None of the inputs have requires_grad=True. Gradients will be None (reentrant "
                      "checkpoint); use checkpoint_with_hooks() for blocks whose input needs no grad",
                      stacklevel=2)
    return CheckpointFunction.apply(fn, preserve_rng_state, *args)


# --------------------------------------------------------------------------- non-reentrant version
def checkpoint_with_hooks(fn, *args, preserve_rng_state: bool = True):
    """``fn(*args)`` with its graph built but its saved tensors replaced by recompute-on-unpack.

    Pack: the n-th saved tensor of the block becomes the Python int ``n`` (no tensor is kept).
    Unpack: the first time an index is missing, re-run the block under another pack hook that
    collects the saved tensors in the same order, then hand back tensor ``n`` (and forget it, so
    recomputed activations are freed as backward consumes them). The block must be deterministic
    given the RNG state: same ops, same order.
    """
    _check_args(fn, preserve_rng_state)
    rng_state = _capture_rng_state(args) if preserve_rng_state else None
    recomputed: dict = {}
    num_saved = [0]

    def recompute() -> None:
        saved: list = []

        def collect(t):
            saved.append(t.detach())  # unpack re-attaches grad_fn for saved outputs (SavedVariable)
            return None

        detached = [a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                    for a in args]
        with _restored_rng(rng_state), torch.enable_grad(), \
                torch.autograd.graph.saved_tensors_hooks(collect, lambda _: None):
            fn(*detached)
        if len(saved) != num_saved[0]:
            raise RuntimeError(f"checkpoint_with_hooks: the recomputed block saved {len(saved)} tensors "
                               f"but the original saved {num_saved[0]}; fn must run the same ops every time")
        recomputed.update(enumerate(saved))

    def pack(t):
        index = num_saved[0]
        num_saved[0] += 1
        return index

    def unpack(index):
        if index not in recomputed:  # first unpack of this backward (or a retain_graph re-run)
            recompute()
        return recomputed.pop(index)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        return fn(*args)
