"""GradScaler from scratch: dynamic loss scaling for fp16 training, step for step like torch's.

Why: fp16's smallest subnormal is 2**-24 ~ 6e-8. Gradients of a real network are often smaller, so
in an fp16 backward pass they round to zero ("underflow") and those weights stop learning. Multiply
the loss by S before ``backward()`` and every gradient is S times larger (the chain rule is linear),
back in fp16's range; divide the fp32 gradients by S before the optimizer step and nothing else
changes. If S is too large the fp16 backward overflows to inf/NaN: then skip that step and halve S.

The algorithm (torch/amp/grad_scaler.py):

    scaler.scale(loss).backward()    # loss * S; S lives in a 0-dim float32 tensor (lazily created)
    scaler.unscale_(opt)             # optional: grads *= 1/S, found_inf = any(!isfinite(grads))
    clip_grad_norm_(params, max)     # must come AFTER unscale_: clip the true gradients, not S * g
    scaler.step(opt)                 # unscale_ if not done yet; opt.step() only if found_inf == 0
    scaler.update()                  # found_inf ? S *= 0.5 : (2000 good steps in a row ? S *= 2)

Per optimizer, a stage machine guards the order: READY -> (unscale_) UNSCALED -> (step) STEPPED
-> (update) READY. Unscaling twice in one iteration would divide by S twice, so it raises, like
torch. With gradient accumulation, ``scale(loss)`` every micro-batch, and unscale/step/update once.

Design notes that mirror torch: state stays in device tensors and nothing syncs until ``step`` has
to decide whether to skip (one ``.item()``); 1/S is computed in float64 then rounded to float32;
fp16 *gradients* are refused by ``unscale_`` (master weights and their grads should be fp32).
Not mirrored: the ``_step_supports_amp_scaling`` fast path for fused optimizers (this class always
unscales itself, then calls ``optimizer.step()``), and pickling.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from enum import Enum
from typing import Any

import torch

from .scaler_kernels import amp_foreach_non_finite_check_and_unscale_, amp_update_scale_


class OptState(Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _fresh_optimizer_state() -> dict[str, Any]:
    return {"stage": OptState.READY, "found_inf_per_device": {}}


class GradScaler:
    """Dynamic loss scaler with the constructor, methods and state_dict of ``torch.amp.GradScaler``."""

    def __init__(
        self,
        device: str = "cuda",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        if not isinstance(device, str):
            raise TypeError(
                f"device must be a device type string like 'cuda' or 'cpu', got {type(device).__name__}"
            )
        if (
            isinstance(init_scale, bool)
            or not isinstance(init_scale, (int, float))
            or not (math.isfinite(init_scale) and init_scale > 0)
        ):
            raise ValueError(f"init_scale must be a finite float > 0, got {init_scale!r}")
        if not isinstance(growth_factor, (int, float)) or not growth_factor > 1.0:
            raise ValueError(f"growth_factor must be > 1.0, got {growth_factor!r}")
        if not isinstance(backoff_factor, (int, float)) or not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor!r}")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
            raise ValueError(f"growth_interval must be an int >= 1, got {growth_interval!r}")
        self._device = device
        self._enabled = bool(enabled)
        if device == "cuda" and self._enabled and not torch.cuda.is_available():
            warnings.warn("GradScaler is enabled, but CUDA is not available.  Disabling.", stacklevel=2)
            self._enabled = False
        self._init_scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = growth_interval
        self._init_growth_tracker = 0
        self._scale: torch.Tensor | None = None  # 0-dim float32, created by the first scale()
        self._growth_tracker: torch.Tensor | None = None  # 0-dim int32
        self._per_optimizer_states: dict[int, dict[str, Any]] = defaultdict(_fresh_optimizer_state)

    # -- scale ---------------------------------------------------------------------------------
    def _lazy_init_scale_growth_tracker(self, dev: torch.device) -> None:
        self._scale = torch.full((), self._init_scale, dtype=torch.float32, device=dev)
        self._growth_tracker = torch.full((), self._init_growth_tracker, dtype=torch.int32, device=dev)

    def _require_scale(self, funcname: str) -> torch.Tensor:
        if self._scale is None or self._growth_tracker is None:
            raise RuntimeError(
                f"Attempted {funcname} but the scale was never initialised: "
                "call scaler.scale(loss) earlier in the iteration."
            )
        return self._scale

    def scale(self, outputs):
        """``outputs * S`` for a tensor or a (nested) list/tuple of tensors; identity when disabled."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            if self._scale is None:
                self._lazy_init_scale_growth_tracker(outputs.device)
            # S is a 0-dim float32 tensor: a scalar (0-dim) loss comes out fp32, but an fp16 output
            # with dims stays fp16 (a 0-dim operand does not promote it) and may overflow to inf
            return outputs * self._scale.to(device=outputs.device, non_blocking=True)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise ValueError(f"outputs must be a Tensor or an iterable of Tensors, got {type(outputs).__name__}")

    # -- unscale -------------------------------------------------------------------------------
    def _unscale_grads_(
        self, optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor, allow_fp16: bool
    ) -> dict[torch.device, torch.Tensor]:
        """Group grads by (device, dtype) and run the foreach kernel once per group."""
        per_device_and_dtype: dict[torch.device, dict[torch.dtype, list[torch.Tensor]]] = defaultdict(
            lambda: defaultdict(list)
        )
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.grad is None:
                        continue
                    if not allow_fp16 and param.grad.dtype == torch.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    if param.grad.is_sparse:
                        # duplicate indices would be summed later; check the summed (coalesced) values
                        if param.grad.dtype is torch.float16:
                            param.grad = param.grad.coalesce()
                        to_unscale = param.grad._values()
                    else:
                        to_unscale = param.grad
                    per_device_and_dtype[to_unscale.device][to_unscale.dtype].append(to_unscale)
            found_inf_per_device: dict[torch.device, torch.Tensor] = {}
            for device, per_dtype in per_device_and_dtype.items():
                dev_found_inf = found_inf.to(device, copy=True)
                dev_inv_scale = inv_scale.to(device)
                for grads in per_dtype.values():
                    amp_foreach_non_finite_check_and_unscale_(grads, dev_found_inf, dev_inv_scale)
                found_inf_per_device[device] = dev_found_inf
        return found_inf_per_device

    def unscale_(self, optimizer) -> None:
        """Divide ``optimizer``'s gradients by S in place and record whether any is inf/NaN."""
        if not self._enabled:
            return
        _check_optimizer(optimizer)
        scale = self._require_scale("unscale_")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update()."
            )
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        # 1/S in float64, then rounded to float32 (float32 division can be imprecise under some flags)
        inv_scale = scale.double().reciprocal().float()
        found_inf = torch.full((), 0.0, dtype=torch.float32, device=scale.device)
        state["found_inf_per_device"] = self._unscale_grads_(optimizer, inv_scale, found_inf, False)
        state["stage"] = OptState.UNSCALED

    # -- step ----------------------------------------------------------------------------------
    def step(self, optimizer, *args, **kwargs):
        """Unscale (if not done yet), then ``optimizer.step()`` unless an inf/NaN was found."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        _check_optimizer(optimizer)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._require_scale("step")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        if len(state["found_inf_per_device"]) == 0:
            raise RuntimeError(
                "No inf checks were recorded for this optimizer (did any parameter get a .grad?)."
            )
        retval = None
        # the one host sync of the iteration: do we skip?
        if not sum(v.item() for v in state["found_inf_per_device"].values()):
            retval = optimizer.step(*args, **kwargs)
        state["stage"] = OptState.STEPPED
        return retval

    # -- update --------------------------------------------------------------------------------
    def update(self, new_scale: "float | torch.Tensor | None" = None) -> None:
        """Back off on a skipped step, grow after ``growth_interval`` good ones; reset per-optimizer state."""
        if not self._enabled:
            return
        scale = self._require_scale("update")
        if new_scale is not None:
            if isinstance(new_scale, (int, float)) and not isinstance(new_scale, bool):
                scale.fill_(float(new_scale))
            elif (
                isinstance(new_scale, torch.Tensor) and new_scale.numel() == 1 and not new_scale.requires_grad
            ):
                scale.copy_(new_scale)
            else:
                raise TypeError(
                    "new_scale must be a float or a 1-element tensor with requires_grad=False, "
                    f"got {new_scale!r}"
                )
        else:
            found_infs = [
                fi.to(scale.device)
                for st in self._per_optimizer_states.values()
                for fi in st["found_inf_per_device"].values()
            ]
            if len(found_infs) == 0:
                raise RuntimeError("No inf checks were recorded prior to update().")
            found_inf_combined = found_infs[0].clone()
            for fi in found_infs[1:]:
                found_inf_combined += fi
            amp_update_scale_(
                scale,
                self._growth_tracker,
                found_inf_combined,
                self._growth_factor,
                self._backoff_factor,
                self._growth_interval,
            )
        self._per_optimizer_states = defaultdict(_fresh_optimizer_state)

    # -- inspection and checkpoints ------------------------------------------------------------
    def _found_inf_per_device(self, optimizer) -> dict[torch.device, torch.Tensor]:
        return self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]

    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when disabled). Syncs with the device."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else float(self._scale.item())

    def _get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        return self._init_growth_tracker if self._growth_tracker is None else int(self._growth_tracker.item())

    def is_enabled(self) -> bool:
        return self._enabled

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def state_dict(self) -> dict[str, Any]:
        """scale, growth_factor, backoff_factor, growth_interval, _growth_tracker ({} when disabled)."""
        if not self._enabled:
            return {}
        return {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._get_growth_tracker(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self._enabled:
            return
        if not isinstance(state_dict, dict):
            raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved "
                "from a disabled instance of GradScaler."
            )
        missing = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"} - set(
            state_dict
        )
        if missing:
            raise ValueError(f"state_dict is missing keys {sorted(missing)}")
        self._init_scale = float(state_dict["scale"])
        if self._scale is not None:
            self._scale.fill_(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._init_growth_tracker = int(state_dict["_growth_tracker"])
        if self._growth_tracker is not None:
            self._growth_tracker.fill_(state_dict["_growth_tracker"])


class CPUGradScaler(GradScaler):
    """``GradScaler("cpu", ...)`` with the constructor of the deprecated ``torch.cpu.amp.GradScaler``
    (``torch/cpu/amp/grad_scaler.py``): no device argument. It is the signature of the chapter's exercise
    amp.grad_scaler, whose scripted runs are on the CPU."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        super().__init__("cpu", init_scale, growth_factor, backoff_factor, growth_interval, enabled)


def _check_optimizer(optimizer) -> None:
    if not hasattr(optimizer, "param_groups") or not hasattr(optimizer, "step"):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer (with param_groups and step), "
            f"got {type(optimizer).__name__}"
        )
