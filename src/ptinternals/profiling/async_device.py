"""A simulated asynchronous GPU: a host clock, streams of queued work, events, copies and a tiny allocator.

What it models (CUDA's execution model, as PyTorch uses it):

- **The host runs ahead.** ``launch`` costs the host ``launch_overhead_us`` (cudaLaunchKernel) and
  returns; the kernel starts on the device when its stream is free, possibly much later. Host
  time (``perf_counter``) and device time are different clocks of the same simulated world.
- **Streams are queues**: work on one stream runs in order; different streams may overlap.
  ``Event.record`` marks a point in a stream; ``Stream.wait_event`` makes later work on another
  stream wait for it (cudaStreamWaitEvent), without blocking the host.
- **The host waits** only in ``synchronize`` (cudaDeviceSynchronize), ``Stream.synchronize``,
  ``Event.synchronize`` and blocking copies (``memcpy_and_sync``, see ``sync_rules``).
- **Copies** (``copy``): pinned memory with ``non_blocking=True`` is a DMA queued on the stream; a
  pageable ``non_blocking`` host-to-device copy first blocks the host while it stages the bytes;
  ``non_blocking=False`` is a copy followed by a stream sync.
- **The launch queue is finite**: with ``queue_depth`` operations in flight the next launch blocks
  the host until the oldest finishes.
- **A first call is slow** (``first_call_us`` per kernel name: module loading, autotuning) and
  optional seeded **jitter** delays some host launches or device kernels: why timings need warm-up
  and medians.
- **Memory and streams** (``alloc``/``free``/``Buffer.record_stream``): a freed block is reusable at
  once by its own stream; if it was used on another stream, ``record_stream`` makes the free wait
  until that stream's work is done (CUDACachingAllocator ``recordStream``/``insert_events``). Every
  read or write a launch declares is checked: overlapping accesses to one block from different
  streams, at least one a write, are recorded in ``races``.

Times are microseconds (ints stay exact); ``Event.elapsed_time`` returns milliseconds like CUDA's.
Simplifications: one device; a stream runs one operation at a time; copies in both directions and
kernels on different streams overlap freely (an H200 has separate copy engines).
"""
from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field


@dataclass(frozen=True)
class WorkRecord:
    """One operation as it ran: host launch interval and device interval (``start == end`` for markers)."""

    name: str
    kind: str          # device: "kernel", "h2d", "d2h", "event"; host only (stream -1): "host", "wait"
    stream: int
    launch_start: float
    launch_end: float
    start: float
    end: float


def _check_time(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of microseconds, got {type(value).__name__}")
    if not value >= 0:  # also rejects NaN
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


class Stream:
    """A queue of device work (``torch.cuda.Stream``). ``busy_until``: when its last queued op ends."""

    def __init__(self, device: "SimulatedDevice", stream_id: int):
        self.device = device
        self.id = stream_id
        self.busy_until = 0.0
        self._not_before = 0.0  # from wait_event: the next op may not start earlier

    def wait_event(self, event: "Event") -> None:
        """Later work on this stream waits until ``event`` completes (cudaStreamWaitEvent); the host does not wait."""
        if event.time is None:
            return  # like CUDA: waiting on a never-recorded event is a no-op
        self._not_before = max(self._not_before, event.time)

    def wait_stream(self, other: "Stream") -> None:
        """Later work here waits for everything queued on ``other`` so far."""
        ev = self.device.Event()
        ev.record(other)
        self.wait_event(ev)

    def synchronize(self) -> None:
        """The host waits until this stream is idle."""
        self.device._host_wait(self.busy_until)

    def query(self) -> bool:
        return self.busy_until <= self.device.host_time

    def __repr__(self) -> str:
        return f"Stream({self.id}, busy_until={self.busy_until})"


class Event:
    """A marker in a stream (``torch.cuda.Event``); ``time`` is when the device reaches it."""

    def __init__(self, device: "SimulatedDevice", enable_timing: bool = True):
        self.device = device
        self.enable_timing = enable_timing
        self.time: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        self.device._record_event(self, stream or self.device.current_stream)

    def query(self) -> bool:
        return self.time is None or self.time <= self.device.host_time

    def synchronize(self) -> None:
        if self.time is not None:
            self.device._host_wait(self.time)

    def elapsed_time(self, end: "Event") -> float:
        """Milliseconds from this event to ``end``, like CUDA (both must be recorded and complete)."""
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("elapsed_time needs events created with enable_timing=True")
        if self.time is None or end.time is None:
            raise RuntimeError("elapsed_time: both events must be recorded first")
        if not (self.query() and end.query()):
            raise RuntimeError("elapsed_time: an event has not completed yet (synchronize on it first)")
        return (end.time - self.time) / 1000.0


@dataclass
class Buffer:
    """A device allocation: ``block`` is the cached block it occupies; ``stream`` the one it belongs to."""

    block: int
    nbytes: int
    stream: int
    used_on: set = field(default_factory=set)   # other streams, from record_stream
    freed: bool = False

    def record_stream(self, stream: Stream) -> None:
        """``Tensor.record_stream``: this block is in use on ``stream`` too; its free must wait for it."""
        if stream.id != self.stream:
            self.used_on.add(stream.id)


class SimulatedDevice:
    """One GPU and its host, on simulated clocks. See the module docstring for the model."""

    def __init__(self, *, launch_overhead_us: float = 5.0, queue_depth: int = 1024, first_call_us: float = 0.0,
                 pinned_gb_per_s: float = 50.0, pageable_gb_per_s: float = 12.0, sync_overhead_us: float = 0.0,
                 host_jitter: tuple[float, float] = (0.0, 0.0), device_jitter: tuple[float, float] = (0.0, 0.0),
                 seed: int = 0):
        self.launch_overhead_us = _check_time("launch_overhead_us", launch_overhead_us)
        self.first_call_us = _check_time("first_call_us", first_call_us)
        self.sync_overhead_us = _check_time("sync_overhead_us", sync_overhead_us)
        for name, v in (("pinned_gb_per_s", pinned_gb_per_s), ("pageable_gb_per_s", pageable_gb_per_s)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name} must be a number > 0, got {v!r}")
        if isinstance(queue_depth, bool) or not isinstance(queue_depth, int) or queue_depth < 1:
            raise ValueError(f"queue_depth must be an int >= 1, got {queue_depth!r}")
        for name, (p, us) in (("host_jitter", host_jitter), ("device_jitter", device_jitter)):
            if not 0 <= p <= 1:
                raise ValueError(f"{name} probability must be in [0, 1], got {p}")
            _check_time(f"{name} delay", us)
        self.pinned_gb_per_s, self.pageable_gb_per_s = pinned_gb_per_s, pageable_gb_per_s
        self.queue_depth = queue_depth
        self.host_jitter, self.device_jitter = host_jitter, device_jitter
        self._rng = random.Random(seed)
        self.host_time = 0.0
        self.streams = {0: Stream(self, 0)}
        self.current_stream = self.streams[0]
        self.records: list[WorkRecord] = []
        self.races: list[tuple[str, int, str]] = []   # (description, block, other op name)
        self._in_flight: list[float] = []              # heap of end times of queued device work
        self._seen: set[str] = set()
        self._free_blocks: dict[tuple[int, int], list[tuple[float, int]]] = {}  # (stream, nbytes) -> [(ready, block)]
        self._accesses: dict[int, list[tuple[float, float, int, bool, str]]] = {}  # block -> (start, end, stream, write, op)
        self._next_block = 0

    # ---- clocks ----------------------------------------------------------------------------------
    def perf_counter(self) -> float:
        """The host clock in seconds (what ``time.perf_counter`` reads in a real program)."""
        return self.host_time / 1e6

    def host_work(self, us: float, name: str = "host work") -> None:
        """The host spends ``us`` microseconds in Python (data loading, bookkeeping)."""
        start = self.host_time
        self.host_time += _check_time("us", us)
        if us:
            self.records.append(WorkRecord(name, "host", -1, start, self.host_time, start, self.host_time))

    def _host_wait(self, until: float) -> None:
        start = self.host_time
        self.host_time = max(self.host_time, until) + self.sync_overhead_us
        if self.host_time > start:
            self.records.append(WorkRecord("wait", "wait", -1, start, self.host_time, start, self.host_time))

    def synchronize(self) -> None:
        """``torch.cuda.synchronize()``: the host waits for every stream."""
        self._host_wait(max(s.busy_until for s in self.streams.values()))

    # ---- streams and events ----------------------------------------------------------------------
    def Stream(self) -> Stream:  # noqa: N802 - mirrors torch.cuda.Stream
        s = Stream(self, len(self.streams))
        self.streams[s.id] = s
        return s

    def Event(self, enable_timing: bool = True) -> Event:  # noqa: N802 - mirrors torch.cuda.Event
        return Event(self, enable_timing)

    def _record_event(self, event: Event, stream: Stream) -> None:
        # The event completes when the work queued before it is done, and not before it was enqueued.
        event.time = max(self.host_time, stream.busy_until, stream._not_before)
        self.records.append(WorkRecord("event", "event", stream.id, self.host_time, self.host_time,
                                       event.time, event.time))

    # ---- device work -------------------------------------------------------------------------------
    def _enqueue(self, name: str, kind: str, duration: float, stream: Stream, host_cost: float,
                 reads=(), writes=()) -> WorkRecord:
        launch_start = self.host_time
        heap = self._in_flight
        while heap and heap[0] <= self.host_time:
            heapq.heappop(heap)
        if len(heap) >= self.queue_depth:  # the launch queue is full: wait for the oldest op to finish
            self.host_time = heapq.heappop(heap)
        p, us = self.host_jitter
        if p and self._rng.random() < p:
            self.host_time += us
        self.host_time += host_cost
        if kind == "kernel" and name not in self._seen:
            self._seen.add(name)
            duration += self.first_call_us
        p, us = self.device_jitter
        if p and duration and self._rng.random() < p:
            duration += us
        start = max(self.host_time, stream.busy_until, stream._not_before)
        end = start + duration
        stream.busy_until = end
        heapq.heappush(heap, end)
        rec = WorkRecord(name, kind, stream.id, launch_start, self.host_time, start, end)
        self.records.append(rec)
        for buf, write in [(b, False) for b in reads] + [(b, True) for b in writes]:
            self._access(buf, rec, write)
        return rec

    def launch(self, name: str, duration_us: float, stream: Stream | None = None, *, reads=(), writes=()) -> WorkRecord:
        """Enqueue a kernel of ``duration_us`` on ``stream`` (default: the current stream)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        return self._enqueue(name, "kernel", _check_time("duration_us", duration_us), stream or self.current_stream,
                             self.launch_overhead_us, reads, writes)

    def launch_graph(self, kernels, stream: Stream | None = None) -> list[WorkRecord]:
        """Replay a captured CUDA graph: ``kernels`` is [(name, duration_us)], launched with *one*
        launch overhead (cudaGraphLaunch) and run back to back on ``stream``."""
        kernels = list(kernels)
        if not kernels:
            raise ValueError("kernels must hold at least one (name, duration_us) pair")
        stream = stream or self.current_stream
        first = self._enqueue(kernels[0][0], "kernel", _check_time("duration_us", kernels[0][1]), stream,
                              self.launch_overhead_us)
        out = [first]
        for name, us in kernels[1:]:
            out.append(self._enqueue(name, "kernel", _check_time("duration_us", us), stream, 0.0))
        return out

    def chrome_trace(self) -> dict:
        """The run as a Chrome trace, in the layout ``prof.export_chrome_trace`` writes for CUDA: host
        ops (``cpu_op``) around their runtime calls (``cuda_runtime``), device work on one row per
        stream (``kernel``/``gpu_memcpy``) linked to its op by ``External id``."""
        events = []
        for i, r in enumerate(self.records):
            if r.kind == "event":
                continue
            if r.stream < 0:
                name, cat = ("host work", "user_annotation") if r.kind == "host" else ("cudaStreamSynchronize",
                                                                                     "cuda_runtime")
                events.append({"ph": "X", "cat": cat, "name": name if r.kind == "wait" else r.name, "pid": 0,
                               "tid": 1, "ts": r.start, "dur": r.end - r.start, "args": {}})
                continue
            runtime = "cudaLaunchKernel" if r.kind == "kernel" else "cudaMemcpyAsync"
            args = {"External id": i}
            events.append({"ph": "X", "cat": "cpu_op", "name": f"aten::{r.name}", "pid": 0, "tid": 1,
                           "ts": r.launch_start, "dur": r.launch_end - r.launch_start, "args": dict(args)})
            events.append({"ph": "X", "cat": "cuda_runtime", "name": runtime, "pid": 0, "tid": 1,
                           "ts": r.launch_start, "dur": r.launch_end - r.launch_start, "args": dict(args)})
            events.append({"ph": "X", "cat": "kernel" if r.kind == "kernel" else "gpu_memcpy",
                           "name": r.name if r.kind == "kernel" else f"Memcpy {'HtoD' if r.kind == 'h2d' else 'DtoH'}",
                           "pid": 1, "tid": 7 + r.stream, "ts": r.start, "dur": r.end - r.start, "args": dict(args)})
        return {"traceEvents": events, "displayTimeUnit": "ms", "traceName": "simulated device"}

    def copy_us(self, nbytes: int, pinned: bool) -> float:
        """Duration of a host<->device transfer of ``nbytes`` (pinned memory is DMA'd directly)."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be an int >= 0, got {nbytes!r}")
        gbps = self.pinned_gb_per_s if pinned else self.pageable_gb_per_s
        return nbytes / (gbps * 1e3)  # bytes / (bytes per microsecond)

    def copy(self, nbytes: int, direction: str = "h2d", *, pinned: bool = False, non_blocking: bool = False,
             stream: Stream | None = None, buffer: Buffer | None = None, name: str | None = None) -> WorkRecord:
        """A host<->device copy of ``nbytes`` on ``stream`` (``Tensor.to(device, non_blocking=...)``).

        ``buffer`` is the device side of the copy (written by h2d, read by d2h)."""
        if direction not in ("h2d", "d2h"):
            raise ValueError(f"direction must be 'h2d' or 'd2h', got {direction!r}")
        stream = stream or self.current_stream
        name = name or f"Memcpy {'HtoD' if direction == 'h2d' else 'DtoH'}"
        io = {"writes": [buffer]} if (buffer is not None and direction == "h2d") else (
            {"reads": [buffer]} if buffer is not None else {})
        if non_blocking and pinned:                      # a DMA on the stream; the host moves on
            return self._enqueue(name, direction, self.copy_us(nbytes, True), stream, self.launch_overhead_us, **io)
        if non_blocking and direction == "h2d":          # pageable: the host stages the bytes first
            self.host_time += self.copy_us(nbytes, False)
            return self._enqueue(name, direction, self.copy_us(nbytes, True), stream, self.launch_overhead_us, **io)
        rec = self._enqueue(name, direction, self.copy_us(nbytes, pinned), stream, self.launch_overhead_us, **io)
        stream.synchronize()                             # memcpy_and_sync: copy, then wait for the stream
        return rec

    # ---- memory: a caching allocator in miniature --------------------------------------------------
    def alloc(self, nbytes: int, stream: Stream | None = None) -> Buffer:
        """A block for ``nbytes`` on ``stream``: a cached free block of that size when one is ready."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be an int >= 0, got {nbytes!r}")
        stream = stream or self.current_stream
        pool = self._free_blocks.setdefault((stream.id, nbytes), [])
        ready = [i for i, (t, _) in enumerate(pool) if t <= self.host_time]  # process_events: done events only
        if ready:
            _, block = pool.pop(ready[0])
        else:
            block, self._next_block = self._next_block, self._next_block + 1
        return Buffer(block, nbytes, stream.id)

    def free(self, buf: Buffer) -> None:
        """The tensor dies on the host. Reusable at once by its stream, or after the recorded streams' work."""
        if buf.freed:
            raise ValueError(f"block {buf.block} is already free")
        buf.freed = True
        ready = self.host_time
        for sid in buf.used_on:  # insert_events: an event on each stream the block was used on
            ready = max(ready, self.streams[sid].busy_until)
        self._free_blocks.setdefault((buf.stream, buf.nbytes), []).append((ready, buf.block))

    def _access(self, buf: Buffer, rec: WorkRecord, write: bool) -> None:
        if buf.freed:
            self.races.append((f"{rec.name} uses block {buf.block} after it was freed", buf.block, rec.name))
        history = self._accesses.setdefault(buf.block, [])
        for start, end, sid, other_write, other in history:
            overlap = max(rec.start, start) < min(rec.end, end)  # a shared instant of positive length
            if overlap and sid != rec.stream and (write or other_write):
                self.races.append((f"{rec.name} ({'write' if write else 'read'}, stream {rec.stream}) overlaps "
                                   f"{other} (stream {sid}) on block {buf.block}", buf.block, other))
        history.append((rec.start, rec.end, rec.stream, write, rec.name))

    # ---- summaries --------------------------------------------------------------------------------
    def device_busy_us(self, kinds=("kernel",)) -> float:
        """Time at least one op of ``kinds`` runs (the union of their intervals)."""
        spans = sorted((r.start, r.end) for r in self.records if r.kind in kinds and r.end > r.start)
        busy, cur_s, cur_e = 0.0, None, None
        for s, e in spans:
            if cur_e is None or s > cur_e:
                if cur_e is not None:
                    busy += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        return busy + (cur_e - cur_s if cur_e is not None else 0.0)
