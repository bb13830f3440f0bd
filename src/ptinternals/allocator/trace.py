"""Allocation traces: a compact event format, and a replayer that runs them through the model.

A trace is a list of events (tuples or JSON lists)::

    ("alloc", id, nbytes, stream)     a tensor's storage of nbytes is created on stream
    ("free", id)                      ... and dies
    ("record_stream", id, stream)     Tensor.record_stream(stream): used on another stream too
    ("sync", stream)                  that stream's queued work has finished (events complete)
    ("empty_cache",)                  torch.cuda.empty_cache()
    ("step", k)                       a marker: the end of training step k (stats are kept here)

Ids are ints or strings, unique among live allocations (an id may be reused after its free);
streams are non-negative ints (0 is the default stream). ``replay`` returns the allocator's
statistics after every event, so a trace answers "how much memory does this program reserve, and
does it fit in a GPU of this size?" without a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .allocator import CachingAllocator, OutOfMemoryError
from .block import Block
from .config import AllocatorConfig, GiB
from .device import DeviceMemory

Event = tuple
_ARITY = {"alloc": 4, "free": 2, "record_stream": 3, "sync": 2, "empty_cache": 1, "step": 2}


def _check_event(i: int, ev: object) -> tuple:
    if not isinstance(ev, (tuple, list)) or not ev:
        raise ValueError(
            f"trace[{i}] must be a non-empty tuple like ('alloc', id, nbytes, stream), got {ev!r}"
        )
    kind = ev[0]
    if kind not in _ARITY:
        raise ValueError(f"trace[{i}]: unknown event {kind!r}; expected one of {sorted(_ARITY)}")
    if len(ev) != _ARITY[kind]:
        raise ValueError(f"trace[{i}]: {kind!r} takes {_ARITY[kind] - 1} fields, got {len(ev) - 1}: {ev!r}")
    if kind in ("alloc", "free", "record_stream"):
        ident = ev[1]
        if isinstance(ident, bool) or not isinstance(ident, (int, str)):
            raise TypeError(f"trace[{i}]: id must be an int or str, got {type(ident).__name__}")
    if kind == "alloc":
        n = ev[2]
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"trace[{i}]: nbytes must be a non-negative int, got {n!r}")
    if kind in ("alloc", "record_stream", "sync"):
        s = ev[-1] if kind != "sync" else ev[1]
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"trace[{i}]: stream must be a non-negative int, got {s!r}")
    return tuple(ev)


def validate_trace(trace: Iterable[Event]) -> list[tuple]:
    """Check a trace's form and its ids (no double alloc, no free of an unknown id); returns tuples."""
    if isinstance(trace, (str, bytes)) or not isinstance(trace, Iterable):
        raise TypeError(f"trace must be a list of events, got {type(trace).__name__}")
    live: set = set()
    out = []
    for i, ev in enumerate(trace):
        ev = _check_event(i, ev)
        kind = ev[0]
        if kind == "alloc":
            if ev[1] in live:
                raise ValueError(f"trace[{i}]: id {ev[1]!r} is allocated twice without a free")
            live.add(ev[1])
        elif kind in ("free", "record_stream"):
            if ev[1] not in live:
                raise ValueError(f"trace[{i}]: {kind} of id {ev[1]!r}, which is not live")
            if kind == "free":
                live.remove(ev[1])
        out.append(ev)
    return out


@dataclass
class ReplayResult:
    """Statistics after each event of a replay (lists have one entry per event that ran)."""

    reserved_bytes: list[int] = field(default_factory=list)
    allocated_bytes: list[int] = field(default_factory=list)
    active_bytes: list[int] = field(default_factory=list)
    segments: list[int] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)  # one dict per ("step", k) marker
    alloc_ptrs: list[int | None] = field(default_factory=list)  # address of each alloc, in order
    oom: dict | None = None  # {"event_index", "message", ...} when an allocation failed
    allocator: CachingAllocator | None = None  # the final state (snapshot(), memory_stats(), ...)

    @property
    def events(self) -> int:
        return len(self.reserved_bytes)

    @property
    def peak_reserved(self) -> int:
        return self.allocator.max_memory_reserved() if self.allocator else 0

    @property
    def peak_allocated(self) -> int:
        return self.allocator.max_memory_allocated() if self.allocator else 0

    def summary(self) -> dict:
        return {
            "events": self.events,
            "peak_reserved": self.peak_reserved,
            "peak_allocated": self.peak_allocated,
            "oom": None if self.oom is None else self.oom["event_index"],
            "final_segments": self.segments[-1] if self.segments else 0,
        }


def replay(
    trace: Sequence[Event],
    capacity: int = 80 * GiB,
    *,
    config: AllocatorConfig | None = None,
    device: DeviceMemory | None = None,
    memory_fraction: float | None = None,
    stop_on_oom: bool = True,
    allocator: CachingAllocator | None = None,
    live: dict | None = None,
) -> ReplayResult:
    """Run ``trace`` through a fresh model allocator (or ``allocator``) and record its statistics.

    On an OutOfMemoryError the result's ``oom`` says where and why; with ``stop_on_oom=False`` the
    failed allocation is skipped (as if the program caught the error) and the replay continues.
    ``live`` maps ids to Blocks already allocated in ``allocator`` (from ``restore_segments``).
    """
    if allocator is None:
        if device is not None:
            allocator = CachingAllocator(config=config, device=device, memory_fraction=memory_fraction)
        else:
            allocator = CachingAllocator(capacity, config=config, memory_fraction=memory_fraction)
    elif config is not None or device is not None or memory_fraction is not None:
        raise ValueError(
            "pass config/device/memory_fraction to the allocator, not to replay(), when allocator is given"
        )
    if isinstance(trace, (str, bytes)) or not isinstance(trace, Iterable):
        raise TypeError(f"trace must be a list of events, got {type(trace).__name__}")
    blocks: dict = dict(live or {})  # id -> Block (None for 0-byte or failed allocations)
    failed: set = set()
    result = ReplayResult(allocator=allocator)
    stats = allocator.stats
    for i, raw in enumerate(trace):
        ev = _check_event(i, raw)
        kind = ev[0]
        if kind == "alloc":
            _, ident, nbytes, stream = ev
            if ident in blocks:
                raise ValueError(f"trace[{i}]: id {ident!r} is allocated twice without a free")
            try:
                block: Block | None = allocator.malloc(nbytes, stream)
            except OutOfMemoryError as e:
                result.oom = {
                    "event_index": i,
                    "id": ident,
                    "nbytes": nbytes,
                    "message": str(e),
                    "alloc_size": e.alloc_size,
                    "allocated_bytes": e.allocated_bytes,
                    "reserved_bytes": e.reserved_bytes,
                    "device_free": e.device_free,
                }
                if stop_on_oom:
                    break
                failed.add(ident)
                block = None
            else:
                if block is not None:
                    block.handle = ident
                result.alloc_ptrs.append(None if block is None else block.ptr)
            blocks[ident] = block
        elif kind == "free":
            ident = ev[1]
            if ident not in blocks:
                raise ValueError(f"trace[{i}]: free of id {ident!r}, which is not live")
            allocator.free(blocks.pop(ident))
            failed.discard(ident)
        elif kind == "record_stream":
            ident = ev[1]
            if ident not in blocks:
                raise ValueError(f"trace[{i}]: record_stream of id {ident!r}, which is not live")
            allocator.record_stream(blocks[ident], ev[2])
        elif kind == "sync":
            allocator.sync(ev[1])
        elif kind == "empty_cache":
            allocator.empty_cache()
        # ("step", k): a marker only
        result.reserved_bytes.append(stats.reserved_bytes["all"].current)
        result.allocated_bytes.append(stats.allocated_bytes["all"].current)
        result.active_bytes.append(stats.active_bytes["all"].current)
        result.segments.append(stats.segment["all"].current)
        if kind == "step":
            result.steps.append(
                {
                    "step": ev[1],
                    "event_index": i,
                    "reserved_bytes": result.reserved_bytes[-1],
                    "allocated_bytes": result.allocated_bytes[-1],
                    "segments": result.segments[-1],
                    "peak_reserved": stats.reserved_bytes["all"].peak,
                    "peak_allocated": stats.allocated_bytes["all"].peak,
                }
            )
    return result


def fits(
    trace: Sequence[Event],
    capacity: int,
    *,
    config: AllocatorConfig | None = None,
    memory_fraction: float | None = None,
) -> bool:
    """Whether ``trace`` runs without an OutOfMemoryError on a GPU of ``capacity`` bytes."""
    return replay(trace, capacity, config=config, memory_fraction=memory_fraction).oom is None


def memory_timeline(trace: Sequence[Event]) -> list[tuple[int, int, int]]:
    """``(allocated_bytes, active_bytes, reserved_bytes)`` after each event of ``trace``, replayed on an
    ample GPU: what ``torch.cuda.memory_stats()`` would report after each step of the program."""
    r = replay(trace, 1 << 50)  # 1 PiB: the question is the timeline, not an OOM
    return list(zip(r.allocated_bytes, r.active_bytes, r.reserved_bytes, strict=True))


def predict_peak_reserved(trace: Sequence[Event], config: AllocatorConfig | None = None) -> int:
    """Exercise (f), reference: the peak of ``torch.cuda.memory_reserved()`` while running ``trace``
    on an ample GPU (what ``torch.cuda.max_memory_reserved()`` reports afterwards)."""
    result = replay(trace, 1 << 50, config=config)  # 1 PiB: never OOM
    return result.peak_reserved
