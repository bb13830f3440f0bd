"""Turn the allocator history recorded on a real GPU into a model trace, and replay it faithfully.

Input: ``torch.cuda.memory._snapshot()["device_traces"][device]`` -- recorded with
``torch.cuda.memory._record_memory_history(max_entries=...)`` -- whose entries are dicts with
``action`` in {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
"oom", "snapshot", ...}, ``addr``, ``size`` and ``stream`` (see ``record_trace`` in
c10/cuda/CUDACachingAllocator.cpp).

The translation:

- ``alloc`` -> ("alloc", id, size, stream); the recorded size is the unrounded request.
- ``free_requested`` directly followed by its ``free_completed`` -> ("free", id).
- ``free_requested`` whose ``free_completed`` comes later: the block was used on another stream
  (record_stream) -> ("record_stream", id, s), ("free", id), and at the ``free_completed``:
  ("sync", s), with s a stand-in stream per such block (the recorded trace does not say which).
- a run of ``segment_free`` -> ("empty_cache",). The OOM-retry path of a malloc
  (``release_cached_blocks``) frees the same segments; only ``release_available_cached_blocks``
  (with ``max_split_size_mb`` set) frees fewer, which this translation does not tell apart.
- ``segment_alloc`` entries are not events (the model decides when to cudaMalloc) but their
  addresses feed the simulated driver (``DeviceMemory(address_oracle=...)``), so the model breaks
  ties between equal-size blocks on the same addresses as the GPU did.
- With ``expandable_segments:True`` the GPU maps and unmaps pages instead: ``segment_map`` entries
  are not events either (their addresses feed ``DeviceMemory(reservation_oracle=...)``, so each
  expandable segment is reserved where the GPU reserved it), and ``segment_unmap`` entries belong to
  the run of releases of ``release_cached_blocks`` (-> ("empty_cache",)). Replay such a trace with the
  recording's config (``parse_alloc_conf("expandable_segments:True")``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .allocator import CachingAllocator
from .config import AllocatorConfig
from .device import DeviceMemory
from .snapshot import PENDING_STREAM_BASE, restore_segments
from .trace import ReplayResult, replay

_IGNORED = ("snapshot", "user_defined")


@dataclass
class ImportedTrace:
    """A recorded device trace, translated. ``trace`` is a model trace; the rest drives a faithful replay."""

    trace: list[tuple] = field(default_factory=list)
    segment_allocs: list[tuple[int, int]] = field(default_factory=list)  # (addr, size) per cudaMalloc
    segment_maps: list[tuple[int, int]] = field(default_factory=list)  # (addr, size) per segment_map
    alloc_addrs: list[int] = field(default_factory=list)  # recorded address of each alloc, in order
    entry_to_event: list[int] = field(default_factory=list)  # entry i -> number of events before it
    initial_segments: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    device: int = 0  # the CUDA device the entries came from

    def replay(
        self,
        capacity: int = 1 << 50,
        *,
        non_pytorch_bytes: int = 0,
        config: AllocatorConfig | None = None,
        use_recorded_addresses: bool = True,
        trace: list | None = None,
    ) -> ReplayResult:
        """Replay in a model allocator that starts from ``initial_segments``, on the recorded addresses.

        ``capacity`` and ``non_pytorch_bytes`` describe the GPU (what cudaMalloc can get: they
        matter only if the recording came close to running out). ``trace`` replaces ``self.trace``
        (e.g. the same trace with step markers inserted).
        """
        oracle = self.segment_allocs if use_recorded_addresses else None
        maps = [addr for addr, _ in self.segment_maps] if use_recorded_addresses else None
        device = DeviceMemory(capacity, non_pytorch_bytes=non_pytorch_bytes, address_oracle=oracle,
                              reservation_oracle=maps)
        allocator = CachingAllocator(config=config, device=device, device_index=self.device)
        restored = restore_segments(allocator, self.initial_segments, device=self.device)
        live = {initial_id(addr): blk for addr, blk in restored.live.items()}
        return replay(self.trace if trace is None else trace, allocator=allocator, live=live)


def initial_id(addr: int) -> str:
    """The trace id of a block that was already live when recording started."""
    return f"init@{addr:#x}"


def _initial_state(segments: list[dict], device: int) -> tuple[dict, dict]:
    """Live and pending blocks of a starting snapshot, numbered like ``restore_segments`` does."""
    live: dict[int, object] = {}
    pending: dict[int, int] = {}
    for seg in sorted((s for s in segments if s.get("device", device) == device), key=lambda s: s["address"]):
        addr = seg["address"]
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                live[addr] = initial_id(addr)
            elif b["state"] == "active_pending_free":
                pending[addr] = PENDING_STREAM_BASE + len(pending)
            addr += b["size"]
    return live, pending


def trace_from_device_trace(
    entries: list[dict],
    *,
    initial_segments: list[dict] | None = None,
    device: int = 0,
) -> ImportedTrace:
    """Translate recorded ``device_traces`` entries (oldest first) into an :class:`ImportedTrace`.

    ``initial_segments``: the ``segments`` of a snapshot taken when recording started, if the
    allocator was not empty then; frees of blocks allocated before recording refer to them.
    """
    if not isinstance(entries, (list, tuple)):
        raise TypeError(f"entries must be a list of trace entries, got {type(entries).__name__}")
    out = ImportedTrace(initial_segments=list(initial_segments or []), device=device)
    live, pending = _initial_state(out.initial_segments, device)  # address -> id / stand-in stream
    next_id = 0
    next_stream = PENDING_STREAM_BASE + len(pending)
    n = len(entries)
    i = 0
    while i < n:
        e = entries[i]
        out.entry_to_event.append(len(out.trace))
        if not isinstance(e, dict) or "action" not in e:
            raise ValueError(f"entries[{i}] must be a dict with an 'action', got {e!r}")
        act = e["action"]
        if act == "alloc":
            addr = e["addr"]
            if addr in live:
                raise ValueError(f"entries[{i}]: alloc at {addr:#x}, which is already live")
            live[addr] = next_id
            out.trace.append(("alloc", next_id, e["size"], e["stream"]))
            out.alloc_addrs.append(addr)
            next_id += 1
        elif act == "free_requested":
            addr = e["addr"]
            if addr not in live:
                raise ValueError(
                    f"entries[{i}]: free of {addr:#x}, which was never allocated in this trace: recording "
                    "started after the allocation (pass initial_segments=) or the ring buffer wrapped "
                    "(raise max_entries)"
                )
            ident = live.pop(addr)
            nxt = entries[i + 1] if i + 1 < n else None
            if nxt is not None and nxt.get("action") == "free_completed" and nxt.get("addr") == addr:
                out.trace.append(("free", ident))
                i += 1
                out.entry_to_event.append(len(out.trace))
            else:
                stream = next_stream
                next_stream += 1
                out.trace += [("record_stream", ident, stream), ("free", ident)]
                pending[addr] = stream
        elif act == "free_completed":
            addr = e["addr"]
            if addr not in pending:
                raise ValueError(
                    f"entries[{i}]: free_completed of {addr:#x} without a pending free_requested"
                )
            out.trace.append(("sync", pending.pop(addr)))
        elif act == "segment_alloc":
            out.segment_allocs.append((e["addr"], e["size"]))
        elif act == "segment_map":
            out.segment_maps.append((e["addr"], e["size"]))
        elif act in ("segment_free", "segment_unmap"):
            # a run of cudaFrees and unmaps: empty_cache(), or the OOM-retry path of a malloc
            # (release_cached_blocks: the same thing; release_available_cached_blocks: only some
            # oversize blocks). Replayed as empty_cache, which gives the same state in the first two cases.
            out.trace.append(("empty_cache",))
            while i + 1 < n and entries[i + 1].get("action") in ("segment_free", "segment_unmap"):
                i += 1
                out.entry_to_event.append(len(out.trace))
            if i + 1 < n and entries[i + 1].get("action") in ("segment_alloc", "segment_map"):
                out.notes.append(
                    f"entries[{i}]: cudaFrees right before a cudaMalloc (empty_cache, or a "
                    "malloc's OOM-retry path), replayed as empty_cache"
                )
        elif act == "oom":
            out.notes.append(f"entries[{i}]: OutOfMemoryError recorded (device_free={e.get('device_free')})")
        elif act not in _IGNORED:
            out.notes.append(f"entries[{i}]: ignored action {act!r}")
        i += 1
    out.entry_to_event.append(len(out.trace))  # position after the last entry
    return out


def insert_step_markers(imported: ImportedTrace, boundaries: list[int]) -> list[tuple]:
    """The imported trace with ("step", k) after the events of entries[:boundaries[k]]."""
    if any(b < 0 or b >= len(imported.entry_to_event) for b in boundaries):
        raise IndexError(f"boundaries must lie in [0, {len(imported.entry_to_event) - 1}], got {boundaries}")
    if list(boundaries) != sorted(boundaries):
        raise ValueError(f"boundaries must be non-decreasing, got {boundaries}")
    positions = [imported.entry_to_event[b] for b in boundaries]
    trace, k = [], 0
    for pos, ev in enumerate(imported.trace):
        while k < len(positions) and positions[k] == pos:
            trace.append(("step", k))
            k += 1
        trace.append(ev)
    while k < len(positions):
        trace.append(("step", k))
        k += 1
    return trace


def segment_layout(segments: list[dict], device: int | None = None) -> list[tuple]:
    """Snapshot segments as comparable tuples (address, total_size, ((size, state), ...)), sorted."""
    return sorted(
        (s["address"], s["total_size"], tuple((b["size"], b["state"]) for b in s["blocks"]))
        for s in segments
        if device is None or s.get("device", device) == device
    )


def replay_snapshot(
    snapshot: dict,
    *,
    device: int = 0,
    initial_segments: list[dict] | None = None,
    config: AllocatorConfig | None = None,
) -> dict:
    """Replay the history in a real ``torch.cuda.memory._snapshot()`` (e.g. a pickle from
    ``torch.cuda.memory._dump_snapshot``) and check the model ends in the snapshot's state.

    Returns {"result": ReplayResult, "final_state_matches": bool, "mismatched_segments": [...]}.
    ``initial_segments``: the allocator's segments when recording started (empty if omitted).
    """
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot or "segments" not in snapshot:
        raise ValueError(
            "snapshot must be a torch.cuda.memory._snapshot() dict with 'segments' and 'device_traces'"
        )
    traces = snapshot["device_traces"]
    if not 0 <= device < len(traces):
        raise IndexError(f"device {device} out of range: the snapshot has traces for {len(traces)} devices")
    imported = trace_from_device_trace(traces[device], initial_segments=initial_segments, device=device)
    result = imported.replay(config=config)
    model = segment_layout(result.allocator.snapshot()["segments"])
    real = segment_layout(snapshot["segments"], device)
    mismatched = sorted(set(model) ^ set(real))
    return {"result": result, "final_state_matches": not mismatched, "mismatched_segments": mismatched}
