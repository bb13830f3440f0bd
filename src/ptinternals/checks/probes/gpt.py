"""The gpt chapter's probes (sandbox side): drive the student's GPT, kernel op, checkpoint, train step, DDP and run.

Each part is swapped into ``ProbeLM``, a small character model built here from torch only (an
embedding, residual MLP blocks with layer norm and dropout, a tied head: no attention, so it is not
a solution to anything), and trained for a few steps; the grader compares the trajectory with the
same model trained with torch's own part, computed in the trusted process from this module. What a
plain call cannot return is measured here: the ops a function dispatched, whether it runs under
FakeTensorMode, the bytes saved for backward, gradient reductions launched inside ``no_sync``, wall time.
Imports: torch and the standard library only.
"""
from __future__ import annotations

import contextlib
import math
import time
import types

import torch
import torch.nn.functional as F
from torch import nn

GPT_DEFAULTS = dict(dropout=0.0, bias=False, kernels="none", checkpointing=False, compile=False)


# ------------------------------------------------------------------------------------ the test bench
class ProbeBlock(nn.Module):
    """x + MLP(LN(x)) with dropout: (B, T, C) -> (B, T, C)."""

    def __init__(self, width: int, dropout: float, layer_norm):
        super().__init__()
        self.ln_weight = nn.Parameter(torch.ones(width))
        self.ln_bias = nn.Parameter(torch.zeros(width))
        self.fc = nn.Linear(width, 2 * width)
        self.proj = nn.Linear(2 * width, width)
        self.drop = nn.Dropout(dropout)
        self.layer_norm = layer_norm

    def forward(self, x):
        h = self.layer_norm(x, self.ln_weight, self.ln_bias, 1e-5)
        return x + self.drop(self.proj(F.gelu(self.fc(h))))


def torch_layer_norm(x, weight, bias, eps):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


class ProbeLM(nn.Module):
    """A small next-character model: embed -> blocks -> LN -> tied head. ``wrap(block, x)`` runs a block."""

    def __init__(self, vocab: int, width: int, n_blocks: int, dropout: float = 0.0, layer_norm=None, wrap=None, *,
                 head: bool = False, unused: bool = False):
        super().__init__()
        layer_norm = layer_norm or torch_layer_norm
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(ProbeBlock(width, dropout, layer_norm) for _ in range(n_blocks))
        self.ln_weight = nn.Parameter(torch.ones(width))
        self.ln_bias = nn.Parameter(torch.zeros(width))
        self.layer_norm, self.wrap = layer_norm, wrap
        if head:  # tied as GPT ties it: one Parameter registered under two names (embed.weight, head.weight)
            self.head = nn.Linear(width, vocab, bias=False)
            self.head.weight = self.embed.weight
        if unused:  # a parameter forward never reads: its .grad stays None
            self.unused = nn.Parameter(torch.zeros(width))

    def forward(self, idx, targets):
        x = self.embed(idx)                                             # (B, T, C)
        for block in self.blocks:
            x = self.wrap(block, x) if self.wrap is not None else block(x)
        h = self.layer_norm(x, self.ln_weight, self.ln_bias, 1e-5)
        logits = self.head(h) if hasattr(self, "head") else h @ self.embed.weight.T    # (B, T, V)
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_probe(state: dict, frozen=(), **kwargs) -> ProbeLM:
    """ProbeLM shaped like ``state`` (with a module-tied head / an unused parameter when ``state`` has
    ``head.weight`` / ``unused``), loaded from it, with the parameters named in ``frozen`` set to
    ``requires_grad=False`` (their .grad stays None, as does the unused one's)."""
    model = ProbeLM(*_shape(state), head="head.weight" in state, unused="unused" in state, **kwargs)
    model.load_state_dict(state)
    names = dict(model.named_parameters(remove_duplicate=False))
    unknown = sorted(set(frozen) - set(names))
    if unknown:
        raise ValueError(f"frozen names no parameter of the probe model: {unknown}")
    for name in frozen:
        names[name].requires_grad_(False)
    return model


def probe_state(vocab: int, width: int, n_blocks: int, seed: int, *, head: bool = False, unused: bool = False) -> dict:
    """Deterministic weights for ProbeLM (non-trivial norms and biases); ``head``: the tied head is also
    registered as ``head.weight`` (the same tensor as ``embed.weight``); ``unused``: a parameter forward
    never reads."""
    g = torch.Generator().manual_seed(seed)
    model = ProbeLM(vocab, width, n_blocks, head=head, unused=unused)
    state = {k: (torch.randn(v.shape, generator=g) * (0.3 if v.dim() > 1 else 0.2) + (1.0 if "ln_weight" in k else 0.0))
             for k, v in model.state_dict().items() if k != "head.weight"}
    if head:
        state["head.weight"] = state["embed.weight"]
    return state


def _shape(state: dict) -> tuple[int, int, int]:
    vocab, width = state["embed.weight"].shape
    return vocab, width, len({k.split(".")[1] for k in state if k.startswith("blocks.")})


def _params_out(model) -> dict:
    return {k: v.detach().float().cpu() for k, v in model.state_dict().items()}


def probe_trajectory(state, batches, *, dropout=0.0, layer_norm=None, wrap=None, lr=0.1, seed=0, frozen=(),
                     weight_decay=0.0) -> dict:
    """Train ProbeLM from ``state`` on ``batches`` with plain SGD steps; the default parts are torch's.
    (SGD, not Adam: Adam divides out a gradient's scale, which would hide a gradient 2x too large.
    With ``weight_decay``, torch's SGD skips a parameter whose .grad is None: a zero gradient would decay it.)"""
    device = batches[0][0].device
    model = build_probe(state, frozen, dropout=dropout, layer_norm=layer_norm, wrap=wrap).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr, weight_decay=weight_decay)
    losses = []
    for step, (x, y) in enumerate(batches):
        torch.manual_seed(seed + step)                                  # the same dropout draws in every run
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return {"losses": losses, "params": _params_out(model)}


# --------------------------------------------------------------------------------- gpt.gpt the model
@contextlib.contextmanager
def _stand_ins(entry, calls: list):
    """Put, in the globals of ``entry``'s forward, torch's own parts in place of the other exercises' that
    GPT calls (``kernel_layer_norm``, ``checkpoint``), recording each call, so that this exercise does not
    depend on those (in the notebook they are defined after GPT); restore the globals afterwards."""
    from torch.utils.checkpoint import checkpoint as torch_checkpoint

    def layer_norm(x, weight, bias=None, eps=1e-5):
        calls.append("kernel_layer_norm")
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)

    def checkpoint(fn, *args):
        calls.append("checkpoint")
        return torch_checkpoint(fn, *args, use_reentrant=False)

    namespace = getattr(getattr(entry, "forward", None), "__globals__", None)
    if namespace is None:  # not a Python class: nothing to stand in for
        yield set()
        return
    stand_ins = {"kernel_layer_norm": layer_norm, "checkpoint": checkpoint}
    missing = object()
    saved = {k: namespace.get(k, missing) for k in stand_ins}
    namespace.update(stand_ins)
    try:
        yield {k for k, v in saved.items() if v is not missing}  # the names GPT's module defined itself
    finally:
        for k, v in saved.items():
            if v is missing:
                namespace.pop(k, None)
            else:
                namespace[k] = v


def gpt_forward(entry, config: dict, state: dict, idx, targets):
    """Build ``entry(config)``, load ``state`` (nanoGPT's names), run forward in float64, eval mode; then,
    in training mode with grad enabled, the bytes autograd saves with config.checkpointing off and on."""
    calls = []
    with _stand_ins(entry, calls) as replaced:
        out = _gpt_forward(entry, config, state, idx, targets)
        if "logits" in out:
            # None: the module has no kernel_layer_norm of its own and GPT never called ours (it may call
            # its op by another name, as the reference does): nothing to judge
            n = calls.count("kernel_layer_norm")
            out["kernel_layer_norm_calls"] = n if n or "kernel_layer_norm" in replaced else None
            saved = {}
            for flag in (False, True):
                model = entry(types.SimpleNamespace(**{**GPT_DEFAULTS, **config, "checkpointing": flag}))
                model.load_state_dict(state, strict=False)
                model = model.double().to(idx.device).train()
                saved[flag] = _saved_bytes(lambda model=model: model(idx, targets))[1]
            out["saved_bytes"] = {"checkpointing=False": saved[False], "checkpointing=True": saved[True]}
    return out


def _gpt_forward(entry, config: dict, state: dict, idx, targets):
    cfg = types.SimpleNamespace(**{**GPT_DEFAULTS, **config})
    torch.manual_seed(0)
    model = entry(cfg)
    theirs = dict(model.named_parameters(remove_duplicate=False))
    missing = sorted(set(state) - set(model.state_dict()))
    extra = sorted(set(theirs) - set(state))
    if missing or extra:
        return {"missing": missing, "extra": extra}
    with torch.no_grad():  # the initialisation, before the fixed weights replace it: (numel, mean, std, min, max)
        init = {k: (p.numel(), float(p.double().mean()), float(p.double().std()) if p.numel() > 1 else 0.0,
                    float(p.min()), float(p.max())) for k, p in theirs.items()}
    model.load_state_dict(state, strict=False)
    model = model.double().to(idx.device).eval()
    with torch.no_grad():
        out = model(idx)
        logits = out[0] if isinstance(out, (tuple, list)) else out
        out_t = model(idx, targets)
        loss = out_t[1] if isinstance(out_t, (tuple, list)) and len(out_t) > 1 else None
    wte, head = model.get_parameter("transformer.wte.weight"), model.get_parameter("lm_head.weight")
    unique = {p.data_ptr(): p.numel() for p in model.parameters()}
    return {"logits": logits, "loss": None if loss is None else float(loss),
            "tied": wte.data_ptr() == head.data_ptr(), "n_params": sum(unique.values()), "init": init}


# ----------------------------------------------------------------------------- gpt.kernel_layer_norm the kernel op
def _dispatched(fn, custom_calls=None):
    """(result, sorted names of the ops fn dispatched at the top level); each call of an op outside aten
    and prim is appended to ``custom_calls`` as (op, args, kwargs, output)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    names = set()

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            names.add(str(func))
            out = func(*args, **(kwargs or {}))
            if custom_calls is not None and not str(func).startswith(("aten.", "prim.")):
                custom_calls.append((func, args, kwargs or {}, out))
            return out

    with Recorder():
        out = fn()
    return out, sorted(names)


def _fake_mismatches(custom_calls) -> list[str]:
    """Rerun each recorded custom-op call on fake copies of its inputs (FakeTensorMode: the op's fake
    implementation, what torch.compile traces) and name every output whose shape, dtype or device differs
    from the real call's, as torch.library.opcheck's fake test does."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._pytree import tree_flatten, tree_map

    problems = []
    for op, args, kwargs, real in custom_calls:
        mode = FakeTensorMode()
        fargs, fkwargs = tree_map(lambda t, mode=mode: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t,
                                  (args, kwargs))
        try:
            with mode:
                fake = op(*fargs, **fkwargs)
        except Exception as e:  # no register_fake, or a fake implementation that reads data
            problems.append(f"{op}: under FakeTensorMode it raised {type(e).__name__}: {str(e)[:200]}")
            continue
        real_flat, fake_flat = tree_flatten(real)[0], tree_flatten(fake)[0]
        if len(real_flat) != len(fake_flat):
            problems.append(f"{op}: the real op returned {len(real_flat)} outputs, the fake {len(fake_flat)}")
            continue
        for i, (r, f) in enumerate(zip(real_flat, fake_flat)):
            if not isinstance(r, torch.Tensor):
                continue
            got = (tuple(f.shape), f.dtype, f.device.type) if isinstance(f, torch.Tensor) else type(f).__name__
            if got != (tuple(r.shape), r.dtype, r.device.type):
                problems.append(f"{op}: output {i} is {(tuple(r.shape), r.dtype, r.device.type)} (shape, dtype, "
                                f"device) but its fake implementation gives {got}")
    return problems


def layer_norm_op(entry, x=None, weight=None, bias=None, eps=1e-5, *, dy=None, swapped_into_model=None):
    """``entry(x, weight, bias, eps)``: forward, backward with ``dy``, the ops dispatched, and a run under
    FakeTensorMode; or, with ``swapped_into_model=(state, batches)``, a ProbeLM trajectory with ``entry``
    as its layer norm."""
    if swapped_into_model is not None:
        state, batches = swapped_into_model
        return probe_trajectory(state, batches, layer_norm=entry)
    plain = (x.detach(), weight.detach(), None if bias is None else bias.detach())
    before = [None if t is None else t.clone() for t in plain]
    x = x.detach().requires_grad_(True)
    weight = weight.detach().requires_grad_(True)
    bias = None if bias is None else bias.detach().requires_grad_(True)
    custom_calls = []
    y, forward_ops = _dispatched(lambda: entry(x, weight, bias, eps), custom_calls)
    _, backward_ops = _dispatched(lambda: y.backward(dy), custom_calls)
    modified = [name for name, t, b in zip(("x", "weight", "bias"), plain, before)
                if t is not None and not torch.equal(t, b)]
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode()
        fx, fw, fb = (None if t is None else mode.from_tensor(t) for t in plain)
        with mode:
            fake = tuple(entry(fx, fw, fb, eps).shape)
    except Exception as e:  # no register_fake, or an implementation that reads data
        fake = f"{type(e).__name__}: {str(e)[:300]}"
    return {"y": y, "dx": x.grad, "dw": weight.grad, "db": None if bias is None else bias.grad,
            "forward_ops": forward_ops, "backward_ops": backward_ops, "fake_shape": fake, "modified": modified,
            "fake_mismatches": _fake_mismatches(custom_calls)}


# --------------------------------------------------------------------------- gpt.checkpoint checkpointing
def _saved_bytes(fn):
    """Bytes of the tensors autograd saves for backward while ``fn()`` runs (outside checkpointed regions)."""
    total = [0]

    def pack(t):
        total[0] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, total[0]


def checkpoint_probe(entry, state, batches, dropout: float, frozen=()):
    """A ProbeLM whose blocks run through ``entry(block, x)``: its trajectory, gradients of the first
    step, and the bytes saved for backward, next to the same model without checkpointing. ``frozen``:
    parameters with requires_grad=False (a frozen embedding: the first block's input needs no grad)."""
    device = batches[0][0].device
    result = {}
    x, y = batches[0]
    for name, wrap in (("plain", None), ("checkpointed", lambda block, h: entry(block, h))):
        model = build_probe(state, frozen, dropout=dropout, wrap=wrap).to(device)
        torch.manual_seed(1234)
        (logits, loss), saved = _saved_bytes(lambda model=model: model(x, y))
        loss.backward()
        grads = {k: (p.grad.detach().float().cpu() if p.grad is not None else None)
                 for k, p in model.named_parameters()}
        result[name] = {"saved_bytes": saved, "loss": float(loss.detach()), "grads": grads}
    traj = probe_trajectory(state, batches, dropout=dropout, wrap=lambda block, x: entry(block, x), frozen=frozen)
    return {"trajectory": traj, "loss": result["checkpointed"]["loss"], "grads": result["checkpointed"]["grads"],
            "saved_bytes": result["checkpointed"]["saved_bytes"], "plain_saved_bytes": result["plain"]["saved_bytes"]}


# ------------------------------------------------------------------------------ gpt.train_step the train step
def _matmul_dtypes(fn):
    """(result, dtypes of the matmul outputs fn dispatched): shows whether autocast was on."""
    from torch.utils._python_dispatch import TorchDispatchMode

    dtypes = set()
    matmuls = ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.matmul", "aten.linear")

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if str(func).startswith(matmuls) and isinstance(out, torch.Tensor):
                dtypes.add(str(out.dtype).replace("torch.", ""))
            return out

    with Recorder():
        out = fn()
    return out, sorted(dtypes)


def _as_float(v):
    return float(v.detach()) if isinstance(v, torch.Tensor) else float(v)


def train_step_probe(entry, state, steps, amp: str, grad_clip: float, lr: float = 0.1, frozen=(),
                     weight_decay: float = 0.0, no_sync: bool = False):
    """Run ``entry(model, optimizer, scaler, batches, amp_dtype, grad_clip)`` for each step's batches
    (a list of micro-batches) on ProbeLM; ``amp`` is "none", "bfloat16" or "float16" (+ GradScaler).
    ``frozen`` parameters (and an unused one) reach the optimizer with .grad None. ``no_sync``: the model
    has a ``no_sync()`` context manager, as a DDP model has; each forward records whether it ran inside."""
    device = steps[0][0][0].device
    model = build_probe(state, frozen).to(device)
    inside, forwards = [False], []
    if no_sync:
        @contextlib.contextmanager
        def recording_no_sync():
            inside[0] = True
            try:
                yield
            finally:
                inside[0] = False

        model.no_sync = recording_no_sync
        model.register_forward_pre_hook(lambda module, args: forwards.append(inside[0]))
    opt = torch.optim.SGD(model.parameters(), lr=lr, weight_decay=weight_decay)
    amp_dtype = None if amp == "none" else getattr(torch, amp)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**12) if amp == "float16" else None
    losses, norms, dtypes = [], [], set()
    for micro in steps:
        out, seen = _matmul_dtypes(lambda micro=micro: entry(model, opt, scaler, list(micro), amp_dtype, grad_clip))
        dtypes.update(seen)
        loss, norm = out
        losses.append(_as_float(loss))
        norms.append(_as_float(norm))
    grads_left = sum(1 for p in model.parameters() if p.grad is not None and bool(p.grad.abs().sum() > 0))
    grads_kept = sum(1 for p in model.parameters() if p.grad is not None)  # zero_grad(set_to_none=True) frees all
    return {"losses": losses, "grad_norms": norms, "params": _params_out(model), "matmul_dtypes": sorted(dtypes),
            "grads_left": grads_left, "grads_kept": grads_kept, "no_sync_forwards": forwards if no_sync else None}


# ----------------------------------------------------------------------------------------- gpt.ddp DDP
def ddp_probe(entry, state0, state1, batches, lr: float = 0.1, timeout_s: float = 60.0, frozen=(),
              weight_decay: float = 0.0):
    """Two ranks (fork, gloo on the CPU, through the sandbox's launcher ``ranks.spawn``) train ProbeLM
    wrapped in ``entry``; each rank starts from its own weights and gets half of every batch as two
    micro-batches, the first under ``no_sync()``. ``frozen`` parameters are set requires_grad=False before
    wrapping. Returns both ranks' losses, collective counts, weights."""
    from ptinternals.checks.probes.ranks import RankCrashError, RankHangError, spawn

    states = [{k: v.detach().cpu() for k, v in s.items()} for s in (state0, state1)]
    batches = [(x.cpu(), y.cpu()) for x, y in batches]

    def body(rank, world, cls, trace):
        import torch.distributed as dist

        calls = {"in_no_sync": 0, "total": 0}
        inside = [False]
        originals = {}
        for name in ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_reduce_coalesced"):
            if hasattr(dist, name):
                originals[name] = getattr(dist, name)

                # inside no_sync only gradient reductions count: torch's DDP may broadcast there too (buffers in
                # forward; the rebuilt bucket order once, in the first forward after the first backward)
                reduces = name in ("all_reduce", "reduce_scatter", "all_reduce_coalesced")

                def counted(*a, _f=originals[name], _reduces=reduces, **k):
                    calls["total"] += 1
                    calls["in_no_sync"] += inside[0] and _reduces
                    return _f(*a, **k)

                setattr(dist, name, counted)
        model = build_probe(states[rank], frozen)                      # each rank starts from different weights
        ddp = cls(model)
        opt = torch.optim.SGD(model.parameters(), lr=lr, weight_decay=weight_decay)
        losses = []
        for x, y in batches:
            xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]       # this rank's half of the batch
            (x1, x2), (y1, y2) = xs.chunk(2), ys.chunk(2)             # two micro-batches
            inside[0] = True
            with ddp.no_sync():
                out = ddp(x1, y1)
                (out[1] / 2).backward()
            inside[0] = False
            out = ddp(x2, y2)
            (out[1] / 2).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(out[1].detach()))
        for name, f in originals.items():
            setattr(dist, name, f)
        return {"losses": losses, "calls": calls,
                "params": {k: v.detach().clone() for k, v in model.state_dict().items()}}

    try:
        results = spawn(body, 2, entry, deadline_s=timeout_s, what="DDP")
    except (RankCrashError, RankHangError) as e:
        return {"error": str(e)}
    return {f"rank{r}": res for r, res in enumerate(results)}


def single_process_reference(state, batches, lr: float = 0.1, frozen=(), weight_decay: float = 0.0) -> dict:
    """What DDP over 2 ranks must equal: one process, the full batch (the expected side of ddp_probe)."""
    return probe_trajectory(state, batches, lr=lr, frozen=frozen, weight_decay=weight_decay)


# ------------------------------------------------------------------------------------ gpt.train_gpt/gpt.train_gpu runs
@torch.no_grad()
def _val_loss(model, val, block_size: int, n_windows: int, device) -> float:
    g = torch.Generator().manual_seed(4321)
    ix = torch.randint(val.numel() - block_size - 1, (n_windows,), generator=g)
    offsets = torch.arange(block_size + 1)
    windows = val.cpu()[ix[:, None] + offsets[None, :]].to(device)
    losses = []
    for chunk in windows.split(16):
        out = model(chunk[:, :-1])
        logits = out[0] if isinstance(out, (tuple, list)) else out
        losses.append(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1),
                                      reduction="sum"))
    return float(sum(losses) / windows[:, 1:].numel())


@torch.no_grad()
def _is_causal(model, val, T: int, device) -> bool | str:
    """Do the logits at positions < T/2 ignore the tokens after them? (A model that sees the future
    scores a low loss by copying the next character: the loss alone would not tell.)"""
    try:
        x = val.cpu()[:2 * T].view(2, T).clone().to(device)
        changed = x.clone()
        changed[:, T // 2:] = (changed[:, T // 2:] + 1) % max(int(val.max()) + 1, 2)
        a, b = (out[0] if isinstance(out, (tuple, list)) else out for out in (model(x), model(changed)))
        return bool(torch.allclose(a[:, :T // 2].float(), b[:, :T // 2].float(), rtol=1e-3, atol=1e-3))
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:200]}"


class CPUAutocastError(RuntimeError):
    """A module ran forward under CPU autocast during a training run (``config.amp`` is for CUDA)."""


def _refuse_cpu_autocast(module, args):
    """A global forward pre-hook: stop the run at the first forward under CPU autocast (bf16 matmuls are
    12-18x slower than fp32 on these CPUs, so the run would only end by its time limit)."""
    if torch.is_autocast_enabled("cpu"):
        raise CPUAutocastError(f"{type(module).__name__}.forward ran under torch.autocast('cpu', "
                               f"{torch.get_autocast_dtype('cpu')})")


def train_run(entry, preset: str, overrides: dict, val, block_size: int, n_windows: int = 64,
              tokens_per_run: int = 0, on_gpu: bool = False):
    """Time ``entry(...)`` (a training run that returns the model), then measure the model's validation
    loss here, on windows of the held-out split, from its logits (not from a loss it reports)."""
    if on_gpu and not torch.cuda.is_available():
        return {"skipped": "this case needs a GPU and there is none here"}
    t0 = time.perf_counter()
    handle = nn.modules.module.register_module_forward_pre_hook(_refuse_cpu_autocast)
    try:
        model = entry(overrides) if preset in ("gpu", "gpu-smoke") else entry(preset, overrides)
    except CPUAutocastError as e:
        return {"cpu_autocast": str(e)}
    finally:
        handle.remove()
    seconds = time.perf_counter() - t0
    if not isinstance(model, nn.Module):
        return {"not_a_module": type(model).__name__}
    device = next(model.parameters()).device
    model.eval()
    try:
        loss = _val_loss(model, val, block_size, n_windows, device)
        val_error = None
    except Exception as e:  # e.g. a context shorter than the preset's: still report the model's shape
        loss, val_error = float("nan"), f"{type(e).__name__}: {str(e)[:300]}"
    causal = _is_causal(model, val, min(block_size, 32), device)
    unique = {p.data_ptr(): p for p in model.parameters()}
    n_params = sum(p.numel() for p in unique.values())
    wpe = dict(model.named_parameters()).get("transformer.wpe.weight")
    config = getattr(model, "config", None)
    fields = {k: getattr(config, k) for k in ("n_layer", "n_head", "n_embd", "block_size", "dropout", "bias")
              if config is not None and hasattr(config, k)}
    return {"val_loss": loss, "seconds": seconds, "device": device.type,
            "tokens_per_s": tokens_per_run / seconds if tokens_per_run and seconds > 0 else 0.0,
            "n_params": n_params - (wpe.numel() if wpe is not None else 0), "config": fields,
            "finite": math.isfinite(loss), "val_error": val_error, "causal": causal}
