"""Start N ranks on one machine, run a function in each, and never hang.

This is what ``torchrun`` and ``torch.multiprocessing.spawn`` do for you, made small enough to read
(torch/distributed/run.py, torch/multiprocessing/spawn.py). A *rank* is one process; every rank
calls ``dist.init_process_group`` with the same rendezvous address (MASTER_ADDR:MASTER_PORT) and
world size, and from then on they talk only through collectives.

``run_ranks(fn, world_size, *args)`` spawns ``world_size`` fresh interpreters ("spawn" start method:
nothing is inherited but what is pickled), sets the same environment variables that torchrun sets
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), initialises the process group (gloo on
CPU; nccl when there is one GPU per rank), runs ``fn(rank, world_size, *args)`` and returns the
per-rank results in rank order.

Distributed programs fail by *hanging*: a rank that calls a collective its peers never call waits
forever (or until the backend's 30-minute default timeout). So every rank writes each collective it
enters and leaves to a small trace file, and the parent enforces ``timeout_s``: on timeout it kills
every rank and raises :class:`RankTimeoutError` naming the ranks still running and the last
collective each one entered. ``debug="DETAIL"`` sets ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, under which
torch wraps the process group in a checker (c10d ProcessGroupWrapper) that compares every
collective's fingerprint across ranks *before* running it and raises on a mismatch.

Start-up costs seconds per rank (each imports torch): run many checks in one ``fn``.
"""
from __future__ import annotations

import datetime
import os
import pickle
import queue as queue_module
import shutil
import socket
import tempfile
import time
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# The torch.distributed entry points the trace records (the ones this chapter's code calls).
TRACED_COLLECTIVES = (
    "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "all_gather_single",
    "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "reduce", "gather", "scatter",
    "all_to_all_single", "barrier", "monitored_barrier", "send", "recv", "batch_isend_irecv",
    "all_gather_object", "broadcast_object_list",
)  # not isend/irecv: P2POp checks that its op *is* dist.isend or dist.irecv, so they stay unwrapped
_TRACE_FILE = "rank{}.trace"


class RankError(RuntimeError):
    """A rank failed or hung; the message names the rank and its last collective."""


class RankTimeoutError(RankError, TimeoutError):
    """Some rank did not finish within ``timeout_s`` (every rank was killed)."""


class RankFailedError(RankError):
    """Some rank raised an exception or died (every rank was killed)."""


# --------------------------------------------------------------------------------------------------
# Small helpers usable inside a rank
# --------------------------------------------------------------------------------------------------
def default_backend(world_size: int) -> str:
    """"nccl" when every rank can have its own GPU, else "gloo" (which runs on CPU tensors)."""
    if torch.cuda.is_available() and world_size <= torch.cuda.device_count():
        return "nccl"
    return "gloo"


def rank_device() -> torch.device:
    """The device this rank should put its tensors on: cuda:LOCAL_RANK under nccl, else cpu."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", dist.get_rank())))
    return torch.device("cpu")


def find_free_port() -> int:
    """A TCP port nobody listens on now (the rendezvous port for MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _describe_args(args: tuple, kwargs: dict) -> str:
    """'tensor[4, 3] float32' for the first tensor argument (what the trace shows)."""
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            return f"tensor{list(a.shape)} {str(a.dtype).replace('torch.', '')}"
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            return f"{len(a)} tensors, first {list(a[0].shape)} {str(a[0].dtype).replace('torch.', '')}"
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], dist.P2POp):
            ops = ", ".join(f"{op.op.__name__}(peer={op.peer}, {list(op.tensor.shape)})" for op in a)
            return ops
    return ""


def install_collective_trace(path: str) -> None:
    """Wrap ``torch.distributed``'s collectives so each call appends 'enter'/'exit' lines to ``path``.

    Line format: ``<seq>\\t<enter|exit>\\t<name>\\t<detail>\\t<time>``. An 'enter' without its 'exit'
    means the rank is (or died) inside that call. For async calls, 'exit' means *issued*.
    """
    if getattr(dist, "_ptinternals_trace", None) is not None:
        return
    trace = open(path, "a", buffering=1)  # line-buffered: each event reaches the OS at once
    counter = [0]

    def wrap(name: str, original: Callable) -> Callable:
        def traced(*args, **kwargs):
            counter[0] += 1
            seq = counter[0]
            detail = _describe_args(args, kwargs)
            trace.write(f"{seq}\tenter\t{name}\t{detail}\t{time.time():.6f}\n")
            out = original(*args, **kwargs)
            trace.write(f"{seq}\texit\t{name}\t{detail}\t{time.time():.6f}\n")
            return out

        traced.__wrapped__ = original
        traced.__name__ = name
        return traced

    for name in TRACED_COLLECTIVES:
        if hasattr(dist, name):
            setattr(dist, name, wrap(name, getattr(dist, name)))
    dist._ptinternals_trace = trace


def read_last_collective(path: str) -> dict | None:
    """Parse a trace file: the last collective entered, and whether it returned."""
    try:
        with open(path) as f:
            lines = [ln.rstrip("\n").split("\t") for ln in f if ln.strip()]
    except OSError:
        return None
    entered = [ln for ln in lines if len(ln) >= 5 and ln[1] == "enter"]
    if not entered:
        return None
    seq, _, name, detail, t = entered[-1][:5]
    returned = any(ln[0] == seq and ln[1] == "exit" for ln in lines)
    return {"seq": int(seq), "name": name, "detail": detail, "returned": returned, "count": len(entered)}


# --------------------------------------------------------------------------------------------------
# The rank side
# --------------------------------------------------------------------------------------------------
def _rank_main(rank, world_size, port, backend, fn, args, kwargs, results, release, trace_dir,
               pg_timeout_s, num_threads, debug):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size), PTINTERNALS_RANK_TRACE_DIR=trace_dir,
    )
    if debug is not None:
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = debug
        dist.set_debug_level_from_env()  # c10d read the variable when torch was imported
    torch.set_num_threads(num_threads)  # N ranks share the machine's cores
    try:
        install_collective_trace(os.path.join(trace_dir, _TRACE_FILE.format(rank)))
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=pg_timeout_s))
        results.put(("ready", rank, None))
        out = fn(rank, world_size, *args, **kwargs)
        results.put(("ok", rank, pickle.dumps(out)))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent as text
        results.put(("error", rank, traceback.format_exc()))
    # Wait until the parent has every result: a rank that tears down its process group early
    # makes its peers' pending collectives fail with "connection closed" instead of the real story.
    release.wait(timeout=pg_timeout_s)
    if dist.is_initialized():
        dist.destroy_process_group()


# --------------------------------------------------------------------------------------------------
# The parent side
# --------------------------------------------------------------------------------------------------
def _collective_report(trace_dir: str, world_size: int, finished, raised=(), dead=()) -> str:
    lines = []
    for r in range(world_size):
        last = read_last_collective(os.path.join(trace_dir, _TRACE_FILE.format(r)))
        state = ("finished fn" if r in finished else "raised" if r in raised else "died" if r in dead
                 else "still running")
        if last is None:
            lines.append(f"  rank {r} ({state}): no collective entered")
            continue
        where = ("returned" if last["returned"] else "raised inside it" if r in raised
                 else "died inside it" if r in dead else "ENTERED, NEVER RETURNED (waiting here)")
        detail = f" ({last['detail']})" if last["detail"] else ""
        lines.append(f"  rank {r} ({state}): last collective {last['name']} #{last['seq']}{detail}: {where}")
    return "\n".join(lines)


_HINT = ("Every rank must call the same collectives, in the same order, with matching shapes; a rank "
         "inside a collective that a peer never calls waits forever. Compare the last collectives "
         "above, or rerun with debug='DETAIL' (TORCH_DISTRIBUTED_DEBUG=DETAIL) to have torch check "
         "each collective's fingerprint across ranks.")


def _validate(fn, world_size, backend, timeout_s, start_timeout_s, num_threads, debug, start_method="spawn"):
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if start_method not in ("spawn", "fork", "forkserver"):
        raise ValueError(f"start_method must be 'spawn', 'fork' or 'forkserver', got {start_method!r}")
    if start_method != "fork":  # a forked rank inherits fn; the others import it by name
        try:
            pickle.dumps(fn)
        except Exception as exc:
            raise TypeError(f"fn must be a module-level function (spawned ranks import it by name); "
                            f"{getattr(fn, '__qualname__', fn)!r} cannot be pickled: {exc} "
                            f"(start_method='fork' inherits it instead)") from None
    if not isinstance(world_size, int) or isinstance(world_size, bool):
        raise TypeError(f"world_size must be an int, got {type(world_size).__name__}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if backend not in (None, "gloo", "nccl"):
        raise ValueError(f"backend must be None, 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and not (torch.cuda.is_available() and world_size <= torch.cuda.device_count()):
        raise ValueError(f"backend='nccl' needs one GPU per rank: world_size={world_size}, "
                         f"GPUs={torch.cuda.device_count() if torch.cuda.is_available() else 0}")
    for name, value in (("timeout_s", timeout_s), ("start_timeout_s", start_timeout_s)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise ValueError(f"{name} must be a number > 0, got {value!r}")
    if not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be an int >= 1, got {num_threads!r}")
    if debug not in (None, "OFF", "INFO", "DETAIL"):
        raise ValueError(f"debug must be None, 'OFF', 'INFO' or 'DETAIL', got {debug!r}")


def run_ranks(fn: Callable, world_size: int, *args: Any, backend: str | None = None,
              timeout_s: float = 60.0, start_timeout_s: float = 120.0, num_threads: int = 1,
              debug: str | None = None, start_method: str = "spawn", **kwargs: Any) -> list:
    """Run ``fn(rank, world_size, *args, **kwargs)`` in ``world_size`` spawned ranks; return results.

    - ``fn`` must be importable (module level) and return something picklable.
    - ``start_method``: "spawn" (default) starts fresh interpreters, as torchrun does: each imports torch
      (seconds). "fork" copies this process: instant, ``fn`` may be defined anywhere (a notebook cell),
      but only safe before CUDA is initialised, hence gloo only.
    - ``backend``: None picks nccl when there is a GPU per rank, else gloo.
    - ``timeout_s`` counts from the moment every rank has initialised its process group;
      ``start_timeout_s`` bounds the start-up (imports + rendezvous).
    - A rank that raises or dies -> :class:`RankFailedError`; too slow -> :class:`RankTimeoutError`.
      Either way every rank is killed first, so this call never hangs.
    """
    _validate(fn, world_size, backend, timeout_s, start_timeout_s, num_threads, debug, start_method)
    backend = backend or default_backend(world_size)
    if start_method == "fork" and backend == "nccl":
        raise ValueError("start_method='fork' cannot be used with nccl: CUDA does not survive a fork")
    ctx = mp.get_context(start_method)
    results = ctx.Queue()
    release = ctx.Event()
    trace_dir = tempfile.mkdtemp(prefix="ptinternals_ranks_")
    port = find_free_port()
    pg_timeout_s = float(timeout_s) + float(start_timeout_s) + 60.0  # the parent's timeout fires first
    procs = [
        ctx.Process(target=_rank_main, name=f"rank{r}", daemon=True,
                    args=(r, world_size, port, backend, fn, args, kwargs, results, release, trace_dir,
                          pg_timeout_s, num_threads, debug))
        for r in range(world_size)
    ]
    ready: set[int] = set()
    outputs: dict[int, Any] = {}
    errors: dict[int, str] = {}
    t_start = time.monotonic()
    t_all_ready: float | None = None
    what = f"world_size={world_size}, backend={backend}"
    try:
        for p in procs:
            p.start()
        while len(outputs) < world_size:
            try:
                kind, rank, payload = results.get(timeout=0.05)
                if kind == "ready":
                    ready.add(rank)
                    if len(ready) == world_size:
                        t_all_ready = time.monotonic()
                elif kind == "ok":
                    outputs[rank] = pickle.loads(payload)
                else:
                    errors[rank] = payload
            except queue_module.Empty:
                pass
            # A rank that raised: give the others a moment to report their own errors, then stop.
            if errors:
                deadline = time.monotonic() + 0.5
                while time.monotonic() < deadline:
                    try:
                        kind, rank, payload = results.get(timeout=0.05)
                        if kind == "error":
                            errors[rank] = payload
                    except queue_module.Empty:
                        pass
                dead = {r: p.exitcode for r, p in enumerate(procs)
                        if p.exitcode is not None and r not in outputs and r not in errors}
                report = _collective_report(trace_dir, world_size, set(outputs), set(errors), set(dead))
                body = "\n".join(f"--- rank {r} ---\n{errors[r].rstrip()}" for r in sorted(errors))
                head = (f"rank {min(dead)} died with exit code {dead[min(dead)]} without reporting, and "
                        if dead else "") + f"rank {min(errors)} raised"
                raise RankFailedError(f"run_ranks: {head} ({what}); ranks that raised: {sorted(errors)}; "
                                      f"ranks that died: {sorted(dead)}\nLast collective per rank:\n"
                                      f"{report}\n{body}")
            # A rank that died without a word (segfault, os._exit, OOM-killer).
            for r, p in enumerate(procs):
                if r not in outputs and r not in errors and p.exitcode is not None:
                    time.sleep(0.2)
                    try:  # its last message may still be in the pipe
                        while True:
                            kind, rank, payload = results.get_nowait()
                            if kind == "ok":
                                outputs[rank] = pickle.loads(payload)
                            elif kind == "error":
                                errors[rank] = payload
                    except queue_module.Empty:
                        pass
                    if r not in outputs and r not in errors:
                        report = _collective_report(trace_dir, world_size, set(outputs), set(errors), {r})
                        raise RankFailedError(f"run_ranks: rank {r} died with exit code {p.exitcode} before "
                                              f"returning ({what})\nLast collective per rank:\n{report}")
            now = time.monotonic()
            if t_all_ready is None and now - t_start > start_timeout_s:
                missing = sorted(set(range(world_size)) - ready)
                raise RankTimeoutError(f"run_ranks: ranks {missing} did not initialise the process group "
                                       f"within start_timeout_s={start_timeout_s} ({what})")
            if t_all_ready is not None and now - t_all_ready > timeout_s:
                running = sorted(set(range(world_size)) - set(outputs))
                report = _collective_report(trace_dir, world_size, set(outputs))
                raise RankTimeoutError(
                    f"run_ranks: timed out after timeout_s={timeout_s} waiting for rank "
                    f"{running[0]} ({what}); ranks still running: {running}; every rank was killed.\n"
                    f"Last collective per rank:\n{report}\n{_HINT}")
        return [outputs[r] for r in range(world_size)]
    finally:
        release.set()
        deadline = time.monotonic() + (5.0 if len(outputs) == world_size else 0.0)
        started = [p for p in procs if p.pid is not None]
        for p in started:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in started:
            if p.is_alive():
                p.kill()
        for p in started:
            p.join(timeout=5.0)
        results.close()
        shutil.rmtree(trace_dir, ignore_errors=True)
