"""The distributed chapter's probes (sandbox side): the bodies each rank runs around the student's code.

Each probe hands a *body* to :func:`ptinternals.checks.probes.ranks.spawn` (the sandbox's multi-rank
launcher, with its hang diagnosis): build a model, call the student's class, run a few steps, and
return plain data (weights, gradients, where the collectives happened relative to backward). The bodies
drive the student's code and measure; they implement none of the chapter's mechanisms.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import types

import torch
from torch import nn

from ptinternals.checks.probes.ranks import P2P_RECV, P2P_SEND, spawn


# ================================================================================================
# Helpers for the bodies: the models the checks train, built the same way here and on the trusted side
# ================================================================================================
class TiedPair(nn.Module):
    """Two square layers sharing one weight: a parameter used twice inside one unit."""

    def __init__(self, width):
        super().__init__()
        self.a, self.b = nn.Linear(width, width), nn.Linear(width, width)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


class Maybe(nn.Module):
    """A square layer that only some ranks use (``active``): its gradient is None on the others."""

    def __init__(self, width):
        super().__init__()
        self.inner = nn.Linear(width, width)
        self.active = True

    def forward(self, x):
        return self.inner(x) if self.active else x


def build_model(arch, state=None):
    """The model ``arch`` describes, with ``state``'s values (a state dict) when given.

    ``arch["layers"]``: ("linear", in, out), ("tanh",), ("pair", width) or ("maybe", width), the children of
    an nn.Sequential. ``arch["tie"]``: [(name, source)] makes parameter ``name`` the same object as
    ``source``; ``arch["unused"]``: children that get an extra parameter ``unused`` their forward never
    reads; ``arch["noncontig"]``: parameters stored column-major; ``arch["frozen"]``: parameters with
    requires_grad=False.
    """
    kinds = {"linear": lambda a, b: nn.Linear(a, b), "tanh": nn.Tanh, "pair": TiedPair, "maybe": Maybe}
    model = nn.Sequential(*[kinds[kind](*args) for kind, *args in arch["layers"]])
    for name, source in arch.get("tie", ()):
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner), attr, model.get_parameter(source))
    for k in arch.get("unused", ()):
        model[k].register_parameter("unused", nn.Parameter(torch.zeros(3)))
    for name in arch.get("noncontig", ()):
        owner, _, attr = name.rpartition(".")
        p = model.get_parameter(name)
        setattr(model.get_submodule(owner), attr, nn.Parameter(p.detach().t().contiguous().t()))
    if state is not None:
        model.load_state_dict(state)
    for name in arch.get("frozen", ()):
        model.get_parameter(name).requires_grad_(False)
    return model


def set_active(model, rank: int, arch) -> None:
    """``arch["rank0_only"]``: the ``maybe`` children only rank 0 uses."""
    for k in arch.get("rank0_only", ()):
        model[k].active = rank == 0


def _shard(t, rank, world_size):
    n = t.shape[0] // world_size
    return t[rank * n:(rank + 1) * n]


def _clone_all(ts):
    return [None if t is None else t.detach().clone() for t in ts]


def _ready_hooks(model, trace):
    """The probe's own post-accumulate-grad hooks, registered before the student's: 'grad i is ready'."""
    for i, p in enumerate(model.parameters()):
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda param, i=i: trace.mark("ready", i))


class _WatchedWork:
    """An async collective's Work handle that remembers whether the code waited on it (or took its future)."""

    def __init__(self, work, log: list):
        self._work, self.waited = work, False
        log.append(self)

    def wait(self, *args, **kwargs):
        self.waited = True
        return self._work.wait(*args, **kwargs)

    def get_future(self):
        self.waited = True  # code that chains on the future synchronises through it
        return self._work.get_future()

    def __getattr__(self, name):
        return getattr(self._work, name)


def _watch_async_all_reduce(entry, log: list) -> None:
    """In this rank, ``dist.all_reduce(..., async_op=True)`` returns a handle that records ``wait()``."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from ptinternals.checks.probes.ranks import _student_namespaces

    traced = dist.all_reduce

    def all_reduce(*args, **kwargs):
        work = traced(*args, **kwargs)
        return _WatchedWork(work, log) if kwargs.get("async_op") and work is not None else work

    all_reduce.__ptinternals_original__ = getattr(traced, "__ptinternals_original__", traced)
    dist.all_reduce = c10d.all_reduce = all_reduce
    for ns in _student_namespaces(entry):
        for key, value in list(ns.items()):
            if value is traced:
                ns[key] = all_reduce


def _overlap(trace, since: int) -> dict:
    """Where the all-reduces of one backward happened, relative to the gradients becoming ready."""
    ev = trace.events[since:]
    order = [(e[1], e[2]) for e in ev if e[0] in ("call", "mark")]
    ready = [k for k, (name, _) in enumerate(order) if name == "ready"]
    reduces = [(k, info) for k, (name, info) in enumerate(order) if name == "all_reduce"]
    end = next((k for k, (name, _) in enumerate(order) if name == "backward_returned"), len(order))
    return {"n_ready": len(ready),
            "all_reduce_numels": [info["numel"] for _, info in reduces],
            "all_reduce_async": [info["async"] for _, info in reduces],
            "first_reduce_before_last_ready": bool(reduces and ready and reduces[0][0] < ready[-1]),
            "reduces_during_backward": sum(1 for k, _ in reduces if k < end),
            "other_calls": sorted({name for name, _ in order if name not in ("ready", "backward_returned",
                                                                             "all_reduce")})}


# ================================================================================================
# Exercise distributed.ring_all_reduce: ring all-reduce
# ================================================================================================
def ring_all_reduce(entry, world_size, tests):
    """``tests[t][r]`` is rank r's input of test t; each rank calls ``entry(x)`` (in place) on each."""

    def body(rank, n, fn, trace):
        outs, p2p = [], []
        for per_rank in tests:
            x = per_rank[rank]
            start = len(trace.events)
            fn(x)
            ev = trace.events[start:]
            p2p.append({"sent": sum(e[2]["numel"] for e in ev if e[0] == "p2p" and e[1] in P2P_SEND),
                        "to": sorted({e[2]["peer"] for e in ev if e[0] == "p2p" and e[1] in P2P_SEND}, key=str),
                        "from": sorted({e[2]["peer"] for e in ev if e[0] == "p2p" and e[1] in P2P_RECV}, key=str),
                        "calls": sorted({e[1] for e in ev if e[0] == "call"})})
            outs.append(x)
        return {"out": outs, "p2p": p2p}

    return spawn(body, world_size, entry, what="ring_all_reduce")


# ================================================================================================
# Exercises distributed.naive_ddp and distributed.bucketed_ddp: DDP (per-parameter hooks, then buckets)
# ================================================================================================
def _start_model(spec, rank: int, perturb: float = 0.0):
    model = build_model(spec["arch"], spec["state"])
    if perturb:
        with torch.no_grad():
            for p in model.parameters():  # replicas start different (a tied parameter once)
                p.add_(perturb * rank)
    set_active(model, rank, spec["arch"])
    return model


def ddp_steps(entry, world_size, spec):
    """Wrap a model whose replicas start different, run ``spec['steps']`` SGD steps on each rank's
    shard of the batch; report the weights after wrapping, the grads when each ``loss.backward()``
    returned (nobody calls a "finish" method: DDP must be done by then), the final weights, and where
    the all-reduces happened relative to backward, and whether each was waited on before it returned."""
    kwargs = dict(spec.get("kwargs", {}))

    def body(rank, n, cls, trace):
        model = _start_model(spec, rank, spec["perturb"])
        _ready_hooks(model, trace)
        works: list = []
        _watch_async_all_reduce(cls, works)
        ddp = cls(model, **kwargs)
        after_wrap = _clone_all(model.parameters())
        opt = torch.optim.SGD(model.parameters(), lr=spec["lr"])
        x, y = _shard(spec["x"], rank, n), _shard(spec["y"], rank, n)
        grads, overlaps = [], []
        for _ in range(spec["steps"]):
            opt.zero_grad(set_to_none=True)
            since, launched = len(trace.events), len(works)
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            trace.mark("backward_returned")
            grads.append(_clone_all(p.grad for p in model.parameters()))
            overlaps.append(_overlap(trace, since) | {"unwaited": sum(not w.waited for w in works[launched:])})
            opt.step()
        return {"after_wrap": after_wrap, "grads": grads, "final": _clone_all(model.parameters()),
                "overlap": overlaps}

    return spawn(body, world_size, entry, what=getattr(entry, "__name__", "DDP"))


# ================================================================================================
# Exercise distributed.no_sync: no_sync
# ================================================================================================
def no_sync_steps(entry, world_size, spec):
    """``spec['micro']`` micro-batches per step, all but the last inside ``ddp.no_sync()``; then one
    optimizer step; twice. Reports the grads when each backward returned and the collectives issued."""
    kwargs = dict(spec.get("kwargs", {}))

    def body(rank, n, cls, trace):
        model = _start_model(spec, rank)
        _ready_hooks(model, trace)
        works: list = []
        _watch_async_all_reduce(cls, works)
        ddp = cls(model, **kwargs)
        opt = torch.optim.SGD(model.parameters(), lr=spec["lr"])
        x, y = _shard(spec["x"], rank, n), _shard(spec["y"], rank, n)
        m = spec["micro"]
        xs, ys = x.chunk(m), y.chunk(m)
        rounds = []
        for _ in range(spec["steps"]):
            opt.zero_grad(set_to_none=True)
            record = {"local_grads": [], "calls_in_no_sync": [], "synced_grads": None}
            for k in range(m - 1):
                since = len(trace.events)
                with ddp.no_sync():
                    loss = torch.nn.functional.mse_loss(ddp(xs[k]), ys[k]) / m
                    loss.backward()
                record["calls_in_no_sync"] += trace.calls(since)
                record["local_grads"].append(_clone_all(p.grad for p in model.parameters()))
            since, launched = len(trace.events), len(works)
            loss = torch.nn.functional.mse_loss(ddp(xs[-1]), ys[-1]) / m
            loss.backward()
            trace.mark("backward_returned")
            record["synced_grads"] = _clone_all(p.grad for p in model.parameters())
            record["synced_calls"] = trace.calls(since)
            record["unwaited"] = sum(not w.waited for w in works[launched:])
            opt.step()
            rounds.append(record)
        return {"rounds": rounds, "final": _clone_all(model.parameters())}

    return spawn(body, world_size, entry, what=getattr(entry, "__name__", "DDP"))


# ================================================================================================
# Exercise distributed.sharded_adamw: ZeRO-1
# ================================================================================================
def _state_bytes(obj, exclude: set) -> tuple[int, str]:
    """Bytes of the tensors reachable from ``obj`` (its attributes, containers, inner optimizers),
    each storage counted once, leaving out the model's parameters and gradients (``exclude``) and the
    ``.grad`` of the tensors found (gradients are not optimizer state); and the name of a torch.distributed
    optimizer found on the way ("" when none: the exercise is to write one)."""
    seen_objs: set[int] = set()
    storages: dict[int, int] = {}
    found = ""
    stack = [(obj, 0)]
    while stack:
        o, depth = stack.pop()
        if id(o) in seen_objs or depth > 12:
            continue
        seen_objs.add(id(o))
        if type(o).__module__.startswith("torch.distributed.optim"):
            found = found or f"torch's {type(o).__name__}"
        if isinstance(o, torch.Tensor):
            if o.device.type == "meta":
                continue
            s = o.untyped_storage()
            if s.data_ptr() not in exclude and s.nbytes():
                storages[s.data_ptr()] = max(storages.get(s.data_ptr(), 0), s.nbytes())
            continue  # a tensor's .grad is a gradient, not optimizer state: not counted
        if isinstance(o, (nn.Module, types.ModuleType, types.FunctionType, types.MethodType, type)):
            continue
        if isinstance(o, dict):
            stack += [(v, depth + 1) for v in list(o.values())]
            stack += [(k, depth + 1) for k in list(o.keys()) if not isinstance(k, (str, int))]
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack += [(v, depth + 1) for v in list(o)]
        elif hasattr(o, "__dict__") and not isinstance(o, type) and type(o).__module__.split(".")[0] != "torch" \
                or isinstance(o, torch.optim.Optimizer):
            stack += [(v, depth + 1) for v in list(vars(o).values())]
    return sum(storages.values()), found


def zero_steps(entry, world_size, spec):
    """Train the same model on every rank with the student's sharded optimizer (each rank has its own
    shard of the batch, and plain local gradients); report the weights and the optimizer's bytes."""
    def body(rank, n, cls, trace):
        model = _start_model(spec, rank)
        opt = cls(model.parameters(), **spec["hyper"])
        x, y = _shard(spec["x"], rank, n), _shard(spec["y"], rank, n)
        weights, state, found = [], [], ""
        for _ in range(spec["steps"]):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            weights.append(_clone_all(model.parameters()))
            exclude = {p.untyped_storage().data_ptr() for p in model.parameters()}
            exclude |= {p.grad.untyped_storage().data_ptr() for p in model.parameters() if p.grad is not None}
            nbytes, found = _state_bytes(opt, exclude)
            state.append(nbytes)
        return {"weights": weights, "state_bytes": state, "torch_zero": found}

    return spawn(body, world_size, entry, what=getattr(entry, "__name__", "sharded optimizer"))


# ================================================================================================
# Exercise distributed.fully_sharded: FSDP2's design
# ================================================================================================
def _torch_fsdp(model) -> str:
    """What in ``model`` comes from torch.distributed.fsdp or DTensor ("" when nothing does)."""
    for m in model.modules():
        if type(m).__module__.startswith("torch.distributed"):
            return f"a {type(m).__name__} module"
    for p in model.parameters():
        if type(p).__module__.startswith("torch.distributed") or type(p).__name__ in ("DTensor", "FlatParameter"):
            return f"a {type(p).__name__} parameter"
    return ""


def fsdp_steps(entry, world_size, spec):
    """Wrap an nn.Sequential in the student's FSDP2-shaped wrapper and train ``steps`` SGD steps on
    ``model.parameters()``; report the model's named shards right after wrapping and at the end, losses,
    the outputs on a fixed input, and the peak bytes of gathered (all-gather output) buffers alive at once.
    A wrapper that refuses the model (at construction or first forward) reports why instead."""
    def body(rank, n, cls, trace):
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        model = _start_model(spec, rank)
        x, y = _shard(spec["x"], rank, n), _shard(spec["y"], rank, n)
        try:
            fsdp = cls(model)
        except (ValueError, TypeError, RuntimeError, NotImplementedError) as e:
            if isinstance(e, NotImplementedError) and not str(e):
                raise
            return {"refused": f"{type(e).__name__}: {e}"}
        named = list(model.named_parameters())
        shards = _clone_all(p for _, p in named)
        handles = [register_module_forward_pre_hook(lambda *a: trace.sample()),
                   register_module_forward_hook(lambda *a: trace.sample())]
        for _, p in named:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda p: trace.sample())
        opt = torch.optim.SGD(model.parameters(), lr=spec["lr"], momentum=0.5)
        losses = []
        try:
            for step in range(spec["steps"]):
                opt.zero_grad(set_to_none=True)
                try:
                    loss = torch.nn.functional.mse_loss(fsdp(x), y)
                except (ValueError, RuntimeError) as e:  # torch refuses shared parameters at the first forward
                    if step:
                        raise
                    return {"refused": f"{type(e).__name__}: {e} (at the first forward)"}
                loss.backward()
                trace.sample()
                opt.step()
                losses.append(loss.item())
            with torch.no_grad():
                out = fsdp(spec["x_eval"])
        finally:
            for h in handles:
                h.remove()
        trace.sample()
        calls = trace.calls()
        return {"names": [name for name, _ in named], "shards": shards, "torch_fsdp": _torch_fsdp(model),
                "requires_grad": [p.requires_grad for _, p in named], "losses": losses,
                "out": out.detach().clone(), "final": _clone_all(model.parameters()),
                "peak_gathered": trace.peak_gathered,
                "gathers": sum(calls.count(c) for c in ("all_gather", "all_gather_into_tensor", "all_gather_single"))}

    return spawn(body, world_size, entry, what=getattr(entry, "__name__", "FSDP"))


# ================================================================================================
# Exercise distributed.train_resume: a torchrun trainer that resumes
# ================================================================================================
def train_resume(entry, world_size, config, stop_after, resume_step):
    """Three launches of ``entry(config)`` in ``world_size`` ranks, with the environment torchrun sets:
    A) the whole run, saving checkpoints; B) a run that stops after ``stop_after`` steps (a crash);
    C) a run resumed from B's ``step{resume_step}.pt``. Reports what rank 0 returned in A and C, and
    the files B left in its checkpoint folder."""
    tmp = tempfile.mkdtemp(prefix="pt-train-")

    def launch(label, **overrides):
        cfg = {**config, "resume": None, "stop_after": None, **overrides}

        def body(rank, n, fn, trace):
            out = fn(dict(cfg))
            return out if rank == 0 else None

        return spawn(body, world_size, entry, init=False, what=f"train, run {label}")[0]

    try:
        a = launch("A (uninterrupted)", ckpt_dir=os.path.join(tmp, "a"))
        b_dir = os.path.join(tmp, "b")
        launch(f"B (stops after step {stop_after})", ckpt_dir=b_dir, stop_after=stop_after)
        saved = sorted(os.listdir(b_dir)) if os.path.isdir(b_dir) else []
        resume = os.path.join(b_dir, f"step{resume_step}.pt")
        c = launch(f"C (resumed from step{resume_step}.pt)", ckpt_dir=os.path.join(tmp, "c"), resume=resume) \
            if os.path.exists(resume) else None
        return {"a": a, "c": c, "files_b": saved}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
