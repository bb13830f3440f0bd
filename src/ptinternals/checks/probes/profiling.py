"""The profiling chapter's probes (sandbox side): drive a student's rule, timer, loop or trace reader and
return only data.

What each probe measures that a plain call cannot:

- ``sync_rule_call`` / ``sync_rule_program``: the student's ``sync_reason`` on one ATen call built here
  (real tensors, a placement this probe controls), or plugged into the detector's recorder while a
  generated CUDA program runs emulated; whether the call modified its inputs.
- ``timer_probe``: a simulated device behind a *recording proxy* that offers only the timing protocol
  (``synchronize``, ``Event``, ``perf_counter``); the call log comes back, the trusted side replays it.
- ``formula_probe``: the value, and how many simulated devices the call built (a formula builds none).
- ``loop_probe``: a simulated device behind a recording proxy of its stream API; the call log comes
  back and the trusted side replays it on its own simulator (races, waits, timings).
- ``trace_probe``: a trace reader called with torch's profiler tree code switched off.
- ``train_probe``: a training loop run on the emulated device under a recorder that describes every
  ATen op (no rule here: the trusted side judges the description) and the host-boundary events.
- ``capstone_probe``: a stand-in for the capstone's step in three counted parts, and the trace the
  student's profiler wrote.

What an answer's code may not do is checked by the trusted grader on the notebook's source
(``grading.policy``), never on source text reported from here.
Imports: torch, the standard library and the chapter's scaffold modules only; no solution lives here.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch import nn

from ptinternals.profiling import async_device
from ptinternals.profiling.placement import Placement
from ptinternals.profiling.scaffold import make_batches, make_model
from ptinternals.profiling.sync_recorder import SyncRecorder


# ================================================================================================
# profiling.sync_reason
# ================================================================================================
def build_value(desc, placement: Placement, gen: torch.Generator):
    """A tensor (or list of them) from a description: ``("t", dtype, shape, place, layout)`` with place
    "device"/"host" and layout "contiguous"/"transposed"/"expanded"; lists and scalars as they are."""
    if isinstance(desc, list):
        return [build_value(d, placement, gen) for d in desc]
    if not (isinstance(desc, tuple) and desc and desc[0] == "t"):
        return desc
    _, dtype_name, shape, place, layout = desc
    dtype = getattr(torch, dtype_name)
    shape = tuple(shape)
    if layout == "transposed" and len(shape) == 2:
        base_shape = (shape[1], shape[0])
    elif layout == "expanded" and shape:
        base_shape = (1,) + shape[1:]
    else:
        base_shape = shape
    if dtype == torch.bool:
        t = torch.rand(base_shape, generator=gen) > 0.5
    elif dtype.is_floating_point:
        t = torch.randn(base_shape, generator=gen).to(dtype)
    else:
        t = torch.randint(0, max(1, min(shape or (1,))), base_shape, generator=gen).to(dtype)
    if layout == "transposed" and len(shape) == 2:
        t = t.t()
    elif layout == "expanded" and shape:
        t = t.expand(shape)
    if place == "device":
        placement.mark_device(t)
    return t


def _tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    return []


def sync_rule_case(entry, kind: str, *case):
    """One case of the sync_reason exercise: ``("call", op, args, kwargs)`` or ``("program", source, name, n)``."""
    if kind == "call":
        return sync_rule_call(entry, *case)
    if kind == "program":
        return sync_rule_program(entry, *case)
    raise ValueError(f"unknown case kind {kind!r}")


def sync_rule_call(entry, op: str, args: list, kwargs: dict, seed: int = 0):
    """``entry(func, args, kwargs, on_device)`` on one call of ATen op ``op`` ("aten.index_put_.default").

    Returns ``{"reason", "modified"}``: the verdict, and the positions of inputs the call changed (a
    rule only looks)."""
    packet, overload = op.split(".")[1:]
    func = getattr(getattr(torch.ops.aten, packet), overload)
    placement = Placement()
    gen = torch.Generator().manual_seed(seed)
    real_args = tuple(build_value(d, placement, gen) for d in args)
    real_kwargs = {k: build_value(d, placement, gen) for k, d in kwargs.items()}
    tensors = _tensors((real_args, real_kwargs))
    before = [(t._version, t.clone()) for t in tensors]
    lists = [(i, list(a)) for i, a in enumerate(real_args) if isinstance(a, list)]
    reason = entry(func, real_args, real_kwargs, placement.on_device)
    modified = [f"tensor input {i}" for i, (t, (version, values)) in enumerate(zip(tensors, before))
                if t._version != version or not torch.equal(t, values)]
    modified += [f"list argument {i}" for i, items in lists
                 if len(real_args[i]) != len(items) or any(a is not b for a, b in zip(real_args[i], items))]
    return {"reason": reason, "modified": modified}


def sync_rule_program(entry, source: str, name: str, n: int = 8):
    """Run a generated CUDA program (emulated) under the recorder with ``entry`` as its ATen rule; return
    the (line, reason) of every implicit sync on a line of the program."""
    namespace = {"torch": torch, "F": F, "n": n, "device": "cuda"}
    with SyncRecorder(entry, emulate=True) as recorder:
        exec(compile(source, name, "exec"), namespace)  # noqa: S102 - the course's own generated program
    return [(int(e.where.rsplit(":", 1)[1]), e.reason) for e in recorder.implicit()
            if e.where.startswith(name + ":")]


# ================================================================================================
# profiling.time_gpu: the timing protocol, recorded
# ================================================================================================
def simulated_device(config: dict) -> async_device.SimulatedDevice:
    """A simulated device from a case's configuration (the trusted side builds the same one)."""
    keys = ("launch_overhead_us", "first_call_us", "queue_depth", "host_jitter", "device_jitter", "seed",
            "pinned_gb_per_s", "pageable_gb_per_s")
    return async_device.SimulatedDevice(**{k: (tuple(v) if isinstance(v, list) else v)
                                           for k, v in config.items() if k in keys})


class _Namespace:
    """A plain object for proxies: only the attributes given (methods are closures over the device)."""

    def __init__(self, **attrs):
        self.__dict__.update(attrs)


def timing_proxy(sim, log: list):
    """What ``torch.cuda`` offers a timer: ``synchronize``, ``Event(enable_timing=True)`` (``record``,
    ``synchronize``, ``query``, ``elapsed_time``) and ``perf_counter``. Every call is logged."""
    events: dict[int, object] = {}

    def make_event(enable_timing=True):
        ev, eid = sim.Event(enable_timing), len(events)
        events[eid] = ev
        log.append(("event", eid))

        def record(stream=None):
            if stream is not None:
                raise TypeError("this device has one stream: call record() without arguments")
            log.append(("record", eid))
            ev.record()

        def synchronize():
            log.append(("event_sync", eid))
            ev.synchronize()

        def elapsed_time(end):
            other = getattr(end, "_eid", None)
            if other not in events:
                raise TypeError("elapsed_time(end) takes another Event of this device")
            log.append(("elapsed", eid, other))
            return ev.elapsed_time(events[other])

        return _Namespace(record=record, synchronize=synchronize, query=lambda: ev.query(),
                          elapsed_time=elapsed_time, _eid=eid)

    def synchronize():
        log.append(("synchronize",))
        sim.synchronize()

    def perf_counter():
        log.append(("perf_counter",))
        return sim.perf_counter()

    return _Namespace(synchronize=synchronize, Event=make_event, perf_counter=perf_counter)


def timer_probe(entry, config: dict, kernels: list, **kwargs):
    """``entry(fn, device, **kwargs)`` where ``fn()`` launches ``kernels`` ([(name, us)]) on a simulated
    device seen through :func:`timing_proxy`. Returns the result and the protocol's call log."""
    sim = simulated_device(config)
    log: list = []

    def fn():
        log.append(("fn",))
        for name, us in kernels:
            sim.launch(name, us)

    result = entry(fn, timing_proxy(sim, log), **kwargs)
    return {"result": result, "log": log}


# ================================================================================================
# profiling.predict_step: a formula builds no simulator
# ================================================================================================
def formula_probe(entry, *args, **kwargs):
    """The value of ``entry(*args, **kwargs)`` and the number of simulated devices built during the call."""
    built = []
    original = async_device.SimulatedDevice.__init__

    def counting_init(self, *a, **k):
        built.append(1)
        original(self, *a, **k)

    async_device.SimulatedDevice.__init__ = counting_init
    try:
        value = entry(*args, **kwargs)
    finally:
        async_device.SimulatedDevice.__init__ = original
    return {"value": value, "simulated": len(built)}


# ================================================================================================
# profiling.train_prefetch: the stream API, recorded
# ================================================================================================
def stream_proxy(sim, log: list):
    """The simulated device's stream API (``Stream``, ``current_stream``, ``Event``, ``host_work``,
    ``alloc``, ``free``, ``copy``, ``launch``, ``synchronize``), each call logged with ids for streams,
    events and buffers. Calls run on ``sim`` too, so mistakes raise at once with the device's message."""
    streams = {0: sim.current_stream}
    events: dict[int, object] = {}
    buffers: dict[int, object] = {}
    proxies: dict[int, object] = {}

    def sid_of(stream, what="stream"):
        if stream is None:
            return None
        sid = getattr(stream, "_sid", None)
        if sid not in streams:
            raise TypeError(f"{what} must be a stream of this device (device.Stream() or device.current_stream)")
        return sid

    def eid_of(event):
        eid = getattr(event, "_eid", None)
        if eid not in events:
            raise TypeError("expected an event of this device (device.Event())")
        return eid

    def bid_of(buf):
        bid = getattr(buf, "_bid", None)
        if bid not in buffers:
            raise TypeError("expected a buffer from device.alloc(...)")
        return bid

    def stream_obj(sid):
        if sid in proxies:
            return proxies[sid]
        real = streams[sid]

        def wait_event(event):
            eid = eid_of(event)
            log.append(("wait_event", sid, eid))
            real.wait_event(events[eid])

        def wait_stream(other):
            osid = sid_of(other)
            log.append(("wait_stream", sid, osid))
            real.wait_stream(streams[osid])

        def synchronize():
            log.append(("stream_sync", sid))
            real.synchronize()

        proxies[sid] = _Namespace(wait_event=wait_event, wait_stream=wait_stream, synchronize=synchronize,
                                  query=lambda: real.query(), id=sid, _sid=sid)
        return proxies[sid]

    def Stream():  # noqa: N802 - mirrors torch.cuda.Stream
        real = sim.Stream()
        streams[real.id] = real
        log.append(("stream", real.id))
        return stream_obj(real.id)

    def Event(enable_timing=True):  # noqa: N802
        eid = len(events)
        real = events[eid] = sim.Event(enable_timing)
        log.append(("event", eid))

        def record(stream=None):
            sid = sid_of(stream) if stream is not None else 0
            log.append(("record", eid, sid))
            real.record(streams[sid])

        def synchronize():
            log.append(("event_sync", eid))
            real.synchronize()

        return _Namespace(record=record, synchronize=synchronize, query=lambda: real.query(), _eid=eid)

    def host_work(us, name="host work"):
        log.append(("host_work", us))
        sim.host_work(us, name)

    def alloc(nbytes, stream=None):
        sid = sid_of(stream) if stream is not None else 0
        real = sim.alloc(nbytes, streams[sid])
        bid = len(buffers)
        buffers[bid] = real
        log.append(("alloc", bid, nbytes, sid))

        def record_stream(s):
            osid = sid_of(s)
            log.append(("record_stream", bid, osid))
            real.record_stream(streams[osid])

        return _Namespace(record_stream=record_stream, nbytes=nbytes, _bid=bid)

    def free(buf):
        bid = bid_of(buf)
        log.append(("free", bid))
        sim.free(buffers[bid])

    def copy(nbytes, direction="h2d", *, pinned=False, non_blocking=False, stream=None, buffer=None, name=None):
        sid = sid_of(stream) if stream is not None else 0
        bid = bid_of(buffer) if buffer is not None else None
        log.append(("copy", nbytes, direction, bool(pinned), bool(non_blocking), sid, bid, name))
        sim.copy(nbytes, direction, pinned=pinned, non_blocking=non_blocking, stream=streams[sid],
                 buffer=buffers[bid] if bid is not None else None, name=name)

    def launch(name, duration_us, stream=None, *, reads=(), writes=()):
        sid = sid_of(stream) if stream is not None else 0
        r, w = [bid_of(b) for b in reads], [bid_of(b) for b in writes]
        log.append(("launch", name, duration_us, sid, r, w))
        sim.launch(name, duration_us, streams[sid], reads=[buffers[b] for b in r], writes=[buffers[b] for b in w])

    def synchronize():
        log.append(("synchronize",))
        sim.synchronize()

    return _Namespace(Stream=Stream, Event=Event, current_stream=stream_obj(0), host_work=host_work, alloc=alloc,
                      free=free, copy=copy, launch=launch, synchronize=synchronize)


def loop_probe(entry, config: dict, batches: list, compute_us: float, host_us: float):
    """``entry(device, batches, compute_us, host_us)`` on a recording proxy; returns the call log."""
    sim = simulated_device(config)
    log: list = []
    result = entry(stream_proxy(sim, log), list(batches), compute_us, host_us)
    return {"result": result, "log": log}


# ================================================================================================
# profiling.op_times: torch's profiler tree code is what the exercise builds
# ================================================================================================
def trace_probe(entry, trace: dict, *args, **kwargs):
    """``entry(trace, ...)`` with ``EventList``'s tree code and ``FunctionEvent`` switched off; reports
    whether the trace was modified."""
    from torch.autograd import profiler_util

    before = json.dumps(trace, sort_keys=True)
    blocked = [(profiler_util.EventList, n) for n in ("_build_tree", "_populate_cpu_children", "_remove_dup_nodes",
                                                       "key_averages")] + [(profiler_util.FunctionEvent, "__init__")]
    saved = [(owner, n, owner.__dict__[n]) for owner, n in blocked]

    def unavailable(*a, **k):
        raise RuntimeError("torch's profiler tree code (EventList, FunctionEvent) is what this exercise asks you "
                           "to write: it is switched off while your answer is checked")

    try:
        for owner, n in blocked:
            setattr(owner, n, unavailable)
        value = entry(trace, *args, **kwargs)
    finally:
        for owner, n, original in saved:
            setattr(owner, n, original)
    return {"value": value, "modified": json.dumps(trace, sort_keys=True) != before}


# ================================================================================================
# profiling.train_fast: every ATen op described, judged on the trusted side
# ================================================================================================
def describe_value(x, on_device):
    """A JSON-able description of an op argument: a tensor as ``{"tensor": [dtype, shape, on_device]}``."""
    if isinstance(x, torch.Tensor):
        return {"tensor": [str(x.dtype).replace("torch.", ""), list(x.shape), bool(on_device(x))]}
    if isinstance(x, (list, tuple)):
        return [describe_value(v, on_device) for v in x]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return repr(x)[:60]


def _program_line() -> str:
    """``file:line`` of the innermost frame outside torch, the chapter's scaffold and this probe."""
    skip = (os.path.dirname(os.path.abspath(torch.__file__)), os.path.dirname(os.path.abspath(async_device.__file__)),
            os.path.abspath(__file__))
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(skip):
            return f"{os.path.basename(path)}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


class _Describer:
    """The recorder's rule: note every ATen call (name, described args, program line), judge none."""

    def __init__(self):
        self.calls: list = []

    def __call__(self, func, args, kwargs, on_device):
        self.calls.append([str(func), describe_value(list(args), on_device),
                           {k: describe_value(v, on_device) for k, v in kwargs.items()}, _program_line()])
        return None


def train_probe(entry, seed: int, steps: int, batch: int, unlabelled: float, all_unlabelled_at, pin: bool,
                lr: float | None = None):
    """Train ``make_model(seed)`` on ``make_batches(...)`` with ``entry`` on the emulated CUDA device.

    Returns the losses, the final parameters, whether they stayed on the device, whether the batches
    changed, every ATen call of the run (described) and the host-boundary events."""
    describer = _Describer()
    recorder = SyncRecorder(describer, emulate=True)
    with recorder:
        model = make_model(seed, "cuda")
        batches = make_batches(seed, steps, batch, unlabelled, all_unlabelled_at, pin)
    before = [(t.clone(), t._version) for xy in batches for t in xy]
    recorder.events.clear()
    describer.calls.clear()
    with recorder:
        losses = entry(model, batches) if lr is None else entry(model, batches, lr=lr)
    unchanged = all(torch.equal(t, v) and t._version == n for (v, n), t in zip(before, [t for xy in batches for t in xy]))
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    on_device = all(recorder.placement.on_device(p) for p in model.parameters())
    events = [[e.op, e.reason, e.kind, e.where] for e in recorder.events]
    return {"losses": losses, "params": params, "params_on_device": on_device, "batches_unchanged": unchanged,
            "aten": describer.calls, "events": events}


# ================================================================================================
# profiling.capstone_costs: a stand-in for the capstone's step, and the student's trace
# ================================================================================================
class StandInLM(nn.Module):
    """The capstone's shape (embedding, pre-norm transformer blocks, final norm, tied head) built from
    torch's own ``nn.TransformerEncoderLayer``: the grading sandbox has no reference GPT."""

    def __init__(self, vocab: int, width: int, n_layer: int, n_head: int, block: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(block, width)
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(width, n_head, 4 * width, dropout=0.0,
                                                               activation="gelu", batch_first=True, norm_first=True)
                                    for _ in range(n_layer))
        self.norm = nn.LayerNorm(width)
        self.register_buffer("causal", torch.ones(block, block, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.embed(idx) + self.pos(torch.arange(T))                     # (B, T, C)
        for blk in self.blocks:
            x = blk(x, src_mask=self.causal[:T, :T], is_causal=True)
        logits = self.norm(x) @ self.embed.weight.T                         # (B, T, V)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def capstone_parts(n_layer: int = 1, batch: int = 4, seed: int = 0, vocab: int = 65, width: int = 32, block: int = 16):
    """``(forward, backward, optimizer)`` of one training step of :class:`StandInLM` with AdamW and
    gradient clipping (the capstone's phases), on fixed random batches; a shared dict counts the calls."""
    torch.manual_seed(seed)
    model = StandInLM(vocab, width, n_layer, 2, block)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    gen = torch.Generator().manual_seed(seed)
    data = torch.randint(0, vocab, (8, batch, block + 1), generator=gen)
    state = {"calls": [0, 0, 0], "loss": None}

    def forward():
        i = state["calls"][0] % len(data)
        state["calls"][0] += 1
        state["loss"] = model(data[i, :, :-1], data[i, :, 1:])
        return state["loss"]

    def backward():
        state["calls"][1] += 1
        state["loss"].backward()

    def optimizer():
        state["calls"][2] += 1
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return forward, backward, optimizer, state


HOST_EVENT_KEYS = ("name", "cat", "ph", "ts", "dur", "pid", "tid")


def trace_host_events(path: str) -> list | None:
    """The complete (``"ph": "X"``) events of an exported trace, reduced to the keys the checks read;
    None when there is no readable trace at ``path``."""
    try:
        with open(path) as f:
            data = json.load(f)
        return [{k: e.get(k) for k in HOST_EVENT_KEYS} for e in data["traceEvents"]
                if isinstance(e, dict) and e.get("ph") == "X"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def capstone_probe(entry, n_layer: int, batch: int, seed: int):
    """``entry(forward, backward, optimizer, trace_path)``; returns its names, the parts' call counts and the
    trace it wrote."""
    forward, backward, optimizer, state = capstone_parts(n_layer, batch, seed)
    folder = tempfile.mkdtemp(prefix="ptprof-")
    path = os.path.join(folder, "capstone_trace.json")
    names = entry(forward, backward, optimizer, path)
    return {"names": names, "calls": list(state["calls"]), "events": trace_host_events(path)}
