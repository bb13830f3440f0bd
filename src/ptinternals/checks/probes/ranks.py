"""Run a student's distributed code in real ranks, and never hang: the sandbox's one multi-rank launcher.

Every multi-rank check (the distributed chapter's, the capstone's DDP) goes through :func:`spawn`: it
forks ``world_size`` ranks from the process that holds the student's code (fork, not spawn: the
student's classes were defined by ``exec`` and exist only in this process's memory), each rank joins a
gloo process group (``FileStore`` rendezvous in a scratch folder, loopback TCP), runs a *body* (build
a model, call the student's class, run a few steps) and sends plain data back through a pipe. The
grade is computed elsewhere, from that data.

Distributed code fails by hanging. Inside each rank every ``torch.distributed`` call is wrapped to
record, in a small shared-memory slot, the call it is in ("recv #4 (src=0, tensor[3] float32)").
When the ranks overstay their deadline the parent asks each stuck rank for its Python stack
(``faulthandler`` on SIGUSR1), kills every rank, and raises :class:`RankHangError` naming the rank,
the call it is stuck in, and the line of the student's code. A rank that raises or dies stops the
others at once (:class:`RankCrashError`). A hang is remembered per entry point, so the remaining
cases of the same exercise fail at once instead of each waiting for the deadline.

It imports only the standard library and torch. (The reference package's ``distributed.launch`` is the
readable torchrun-like launcher the notebook demonstrates; this one is the grader's.)
"""
from __future__ import annotations

import datetime
import functools
import io
import json
import mmap
import os
import pickle
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
import weakref

DEFAULT_DEADLINE_S = 12.0  # per spawn: the bodies finish in well under a second on a laptop
SLOT = 4096  # bytes of shared memory per rank for "the call I am in"
_HUNG: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # entry -> message of its last hang

# The torch.distributed entry points recorded in each rank (the ones the chapter's code may call).
TRACED = (
    "init_process_group", "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "all_gather_single",
    "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "reduce", "gather", "scatter",
    "all_to_all", "all_to_all_single", "barrier", "monitored_barrier", "send", "recv", "isend", "irecv",
    "batch_isend_irecv", "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
)
GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_single")  # their outputs are tracked (FSDP)
P2P_SEND, P2P_RECV = ("send", "isend"), ("recv", "irecv")


class RankHangError(TimeoutError):
    """The ranks did not finish before the deadline (every rank was killed)."""


class RankCrashError(RuntimeError):
    """A rank raised an exception or died (every rank was killed)."""


# ================================================================================================
# Inside a rank: what it is doing, for the parent to read
# ================================================================================================
def _describe(args, kwargs) -> str:
    import torch

    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            return f"tensor{list(a.shape)} {str(a.dtype).replace('torch.', '')}"
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            return f"{len(a)} tensors of {list(a[0].shape)}"
        if isinstance(a, (list, tuple)) and a and hasattr(a[0], "op") and hasattr(a[0], "tensor"):
            return ", ".join(f"{getattr(o.op, '__name__', '?')}(peer {o.peer}, {list(o.tensor.shape)})" for o in a)
    return ""


def _peer(name, args, kwargs):
    for key in ("dst", "group_dst", "src", "group_src"):
        if kwargs.get(key) is not None:
            return int(kwargs[key])
    if len(args) > 1 and isinstance(args[1], int):
        return args[1]
    return None


class Trace:
    """The rank-side record: every torch.distributed call, the probe's own marks, gathered buffers."""

    def __init__(self, slot: mmap.mmap, rank: int):
        self.slot, self.rank = slot, rank
        self.seq = 0
        self.depth = 0
        self.events: list[tuple] = []  # (kind, name, info, time); kind "call" (outermost), "p2p", "mark"
        self.gathered: list = []  # (StorageWeakRef, nbytes) of every all-gather output
        self.peak_gathered = 0
        self.t0 = time.perf_counter()

    def _write(self, state: dict) -> None:
        data = json.dumps(state).encode()[: SLOT - 8]
        self.slot.seek(0)
        self.slot.write(len(data).to_bytes(4, "little") + data)

    def mark(self, name: str, info=None) -> None:
        self.events.append(("mark", name, info, time.perf_counter() - self.t0))

    def calls(self, since: int = 0) -> list[str]:
        return [e[1] for e in self.events[since:] if e[0] == "call"]

    def live_gathered_bytes(self) -> int:
        self.gathered = [(ref, nb) for ref, nb in self.gathered if not ref.expired()]
        return sum(nb for _, nb in self.gathered)

    def sample(self) -> None:
        self.peak_gathered = max(self.peak_gathered, self.live_gathered_bytes())

    def wrap(self, name: str, original):
        trace = self

        @functools.wraps(original)
        def traced(*args, **kwargs):
            outer = trace.depth == 0
            if outer:
                trace.seq += 1
                detail = _describe(args, kwargs)
                info = {"async": bool(kwargs.get("async_op", False)), "detail": detail,
                        "numel": _numel_of(args[0]) if args else 0}
                trace.events.append(("call", name, info, time.perf_counter() - trace.t0))
                trace._write({"seq": trace.seq, "name": name, "detail": detail, "in": True, "t": time.time()})
                trace.sample()
            if name in P2P_SEND + P2P_RECV:
                trace.events.append(("p2p", name, {"peer": _peer(name, args, kwargs),
                                                   "numel": _numel_of(args[0]) if args else 0},
                                     time.perf_counter() - trace.t0))
            trace.depth += 1
            try:
                out = original(*args, **kwargs)
            finally:
                trace.depth -= 1
            if name in GATHERS and args:
                _track(trace, args[0])
            if outer:
                trace.sample()
                trace._write({"seq": trace.seq, "name": name, "detail": detail, "in": False, "t": time.time()})
            return out

        traced.__ptinternals_original__ = original
        return traced


def _numel_of(x) -> int:
    import torch

    if isinstance(x, torch.Tensor):
        return x.numel()
    if isinstance(x, (list, tuple)):
        return sum(t.numel() for t in x if isinstance(t, torch.Tensor))
    return 0


def _track(trace: Trace, out) -> None:
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef

    tensors = [out] if isinstance(out, torch.Tensor) else [t for t in out if isinstance(t, torch.Tensor)]
    for t in tensors:
        storage = t.untyped_storage()
        trace.gathered.append((StorageWeakRef(storage), storage.nbytes()))


def _install_trace(trace: Trace, namespaces) -> None:
    """Wrap the torch.distributed functions in this (forked) rank: the module attributes, and any name
    in the student's namespace that was bound to one of them before the fork."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    originals = {}
    for name in TRACED:
        fn = getattr(c10d, name, None) or getattr(dist, name, None)
        if fn is None:
            continue
        fn = getattr(fn, "__ptinternals_original__", fn)
        originals[id(fn)] = trace.wrap(name, fn)
        for module in (dist, c10d):
            if hasattr(module, name):
                setattr(module, name, originals[id(fn)])
    for ns in namespaces:
        for key, value in list(ns.items()):
            if callable(value) and id(value) in originals:
                ns[key] = originals[id(value)]


def _student_namespaces(entry) -> list[dict]:
    out = []
    for obj in (entry, getattr(entry, "__init__", None)):
        g = getattr(obj, "__globals__", None)
        if isinstance(g, dict) and all(g is not o for o in out):
            out.append(g)
    return out


def _library_frame(filename: str) -> bool:
    """True for frames that are not the student's: torch, the standard library, the grader."""
    return any(part in filename for part in ("site-packages", "/lib/python", "/torch/", "ptinternals/grading",
                                             "ptinternals/distributed/scaffold"))


def _student_frames(tb, limit: int = 4) -> str:
    """The frames of a traceback that are the student's code (not torch, not this probe)."""
    frames = [f for f in traceback.extract_tb(tb) if not _library_frame(f.filename)]
    lines = [f"{f.filename} line {f.lineno}, in {f.name}: {(f.line or '').strip()}" for f in frames[-limit:]]
    return "\n".join("      " + ln for ln in lines)


def _rank_main(rank, world_size, body, entry, store_path, slot, result_w, release_r, dump_path, init,
               deadline_s, env):
    """The child: join the group, run ``body``, send ``("ok", data)`` or what went wrong."""
    sys.stdout = sys.stderr = io.StringIO()  # prints from a rank never reach the notebook or the grader
    payload = None
    trace = Trace(slot, rank)
    try:
        import faulthandler

        # What the process itself writes to fd 1 and 2 (a C++ 'terminate called after...' when gloo
        # aborts) goes to a file the parent shows when this rank dies.
        log = os.open(dump_path + ".log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        faulthandler.disable()  # a fatal signal is reported by the parent, not dumped here
        dump = open(dump_path, "w")
        faulthandler.register(signal.SIGUSR1, file=dump, all_threads=False, chain=False)
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # N ranks share the cores; and OpenMP after fork wants one thread
        torch.manual_seed(1234 + rank)
        os.environ.update(env)
        _install_trace(trace, _student_namespaces(entry))
        if init:
            store = dist.FileStore(store_path, world_size)
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                    timeout=datetime.timedelta(seconds=deadline_s + 30))
            trace.events.clear()
            trace.seq = 0
        data = body(rank, world_size, entry, trace)
        payload = ("ok", data)
    except NotImplementedError as e:
        payload = ("notimpl", str(e))
    except BaseException as e:  # noqa: BLE001 - everything goes back to the parent as text
        last = next((ev for ev in reversed(trace.events) if ev[0] == "call"), None)
        payload = ("error", type(e).__name__, str(e)[:1500], _student_frames(e.__traceback__),
                   f"{last[1]} #{sum(1 for ev in trace.events if ev[0] == 'call')} ({last[2]['detail']})"
                   if last else "")
    try:
        data = pickle.dumps(payload)
    except Exception as e:  # noqa: BLE001
        data = pickle.dumps(("error", type(e).__name__, f"the probe could not send this rank's result: {e}", "", ""))
    view = memoryview(data)
    while view:
        n = os.write(result_w, view[:65536])
        view = view[n:]
    os.close(result_w)
    # Stay in the group until the parent has every result: a rank that leaves early makes its peers'
    # pending collectives fail with "connection closed" instead of telling the real story.
    select.select([release_r], [], [], deadline_s + 5)


# ================================================================================================
# The parent: fork, collect, and turn hangs and crashes into messages
# ================================================================================================
def _read_slot(slot: mmap.mmap):
    slot.seek(0)
    n = int.from_bytes(slot.read(4), "little")
    if not 0 < n < SLOT:
        return None
    try:
        return json.loads(slot.read(n).decode())
    except ValueError:
        return None


def _stack_of(dump_path: str) -> str:
    try:
        text = open(dump_path).read()
    except OSError:
        return ""
    keep = [ln.strip() for ln in text.splitlines()
            if ln.strip().startswith("File") and not _library_frame(ln)]
    # faulthandler prints the innermost frame first; show the student's frames, innermost first
    return "\n".join("      " + ln for ln in keep[:4])


def _tail_of(path: str, lines: int = 4) -> str:
    try:
        with open(path, errors="replace") as f:
            text = f.read()[-4000:]
    except OSError:
        return ""
    keep = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
    return "\n".join("      " + ln[:300] for ln in keep)


def _describe_state(state, now: float) -> str:
    if not state:
        return "no torch.distributed call yet"
    where = f"{state['name']} #{state['seq']}" + (f" ({state['detail']})" if state.get("detail") else "")
    if state.get("in"):
        return f"INSIDE {where} for {now - state['t']:.1f} s, never returned"
    return f"last call {where} returned; now in other code (or waiting on an async op's Work.wait())"


def rank_deadline_s() -> float:
    """Seconds a spawn may take: ``PTINTERNALS_RANK_DEADLINE_S`` (tests shorten it), else the default."""
    try:
        return max(1.0, float(os.environ.get("PTINTERNALS_RANK_DEADLINE_S", DEFAULT_DEADLINE_S)))
    except ValueError:
        return DEFAULT_DEADLINE_S


def spawn(body, world_size: int, entry, *, init: bool = True, deadline_s: float | None = None,
          env: dict | None = None, what: str = "") -> list:
    """Run ``body(rank, world_size, entry, trace)`` in ``world_size`` forked ranks; return their results.

    Raises ``NotImplementedError`` when a rank did (the student's stub), :class:`RankCrashError` when
    a rank raised or died, :class:`RankHangError` past ``deadline_s``. Every rank is gone when it returns.
    """
    deadline_s = deadline_s or rank_deadline_s()
    try:
        hung = _HUNG.get(entry)
    except TypeError:  # not weak-referenceable
        hung = None
    if hung:
        raise RankHangError(hung + "\n  (this case was not run: an earlier case of this check already hung)")
    # torch.optim (and torch's DDP) import torch._dynamo on first use, which takes seconds: import it
    # once here, so that the forked ranks inherit it instead of each importing it again.
    import torch._dynamo  # noqa: F401

    tmp = tempfile.mkdtemp(prefix="pt-ranks-")
    store_path = os.path.join(tmp, "store")
    env = dict(env or {})
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if not init:  # the student's code joins the group itself, from the environment torchrun sets
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size),
                   LOCAL_WORLD_SIZE=str(world_size), GROUP_RANK="0", ROLE_RANK="0")
    release_r, release_w = os.pipe()
    procs = []  # (pid, result_r, slot, dump_path)
    payloads: dict[int, tuple] = {}
    buffers: dict[int, bytearray] = {}
    exited: dict[int, int] = {}
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        for rank in range(world_size):
            slot = mmap.mmap(-1, SLOT)
            result_r, result_w = os.pipe()
            dump_path = os.path.join(tmp, f"stack{rank}.txt")
            rank_env = dict(env)
            if not init:
                rank_env.update(RANK=str(rank), LOCAL_RANK=str(rank))
            pid = os.fork()
            if pid == 0:  # the rank
                code = 0
                try:
                    os.close(result_r)
                    os.close(release_w)
                    _rank_main(rank, world_size, body, entry, store_path, slot, result_w, release_r, dump_path,
                               init, deadline_s, rank_env)
                except BaseException:  # noqa: BLE001
                    code = 70
                finally:
                    os._exit(code)
            os.close(result_w)
            procs.append((pid, result_r, slot, dump_path))
            buffers[rank] = bytearray()
        deadline = time.monotonic() + deadline_s
        first_error_at = None
        while len(payloads) < world_size:
            open_fds = {p[1]: r for r, p in enumerate(procs) if r not in payloads}
            wait = max(0.0, min(deadline, first_error_at + 0.5 if first_error_at else deadline) - time.monotonic())
            ready, _, _ = select.select(list(open_fds), [], [], min(wait, 0.1))
            for fd in ready:
                r = open_fds[fd]
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    buffers[r] += chunk
                    continue
                try:
                    payloads[r] = pickle.loads(bytes(buffers[r]))
                except Exception:  # noqa: BLE001 - died while writing, or wrote nothing
                    payloads[r] = ("died", None)
                if payloads[r][0] != "ok" and first_error_at is None:
                    first_error_at = time.monotonic()
            for r, (pid, _, _, _) in enumerate(procs):  # died without a word (segfault, os._exit)?
                if r not in exited:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        exited[r] = status
            now = time.monotonic()
            if first_error_at is not None and now > first_error_at + 0.5:
                break
            if now > deadline:
                break
        if len(payloads) == world_size and all(p[0] == "ok" for p in payloads.values()):
            return [payloads[r][1] for r in range(world_size)]
        notimpl = [r for r, p in payloads.items() if p[0] == "notimpl"]
        if notimpl:
            raise NotImplementedError(payloads[notimpl[0]][1])
        now = time.time()
        states = {r: _read_slot(p[2]) for r, p in enumerate(procs)}
        failed = sorted(r for r, p in payloads.items() if p[0] in ("error", "died"))
        lines = []
        if failed:
            for r in failed:
                p = payloads[r]
                if p[0] == "error":
                    _, etype, msg, frames, last = p
                    lines.append(f"rank {r} raised {etype}: {msg}")
                    if frames:
                        lines.append("    in your code:\n" + frames)
                    if last:
                        lines.append(f"    its last torch.distributed call: {last}")
                else:
                    status = exited.get(r)
                    how = (f"signal {signal.Signals(os.WTERMSIG(status)).name}" if status is not None
                           and os.WIFSIGNALED(status) else f"exit code {os.WEXITSTATUS(status)}"
                           if status is not None else "no result")
                    lines.append(f"rank {r} died ({how}) while {_describe_state(states[r], now)}")
                    said = _tail_of(procs[r][3] + ".log")
                    if said:
                        lines.append("    its last words:\n" + said)
            for r in range(world_size):
                if r not in failed:
                    state = "finished" if r in payloads else _describe_state(states[r], now)
                    lines.append(f"rank {r}: {state}")
            head = (f"{what}: " if what else "") + f"with {world_size} ranks, " + lines[0]
            raise RankCrashError("\n  ".join([head] + lines[1:]))
        # Nobody failed, somebody is stuck: ask the stuck ranks where they are, then report.
        stuck = [r for r in range(world_size) if r not in payloads]
        for r in stuck:
            try:
                os.kill(procs[r][0], signal.SIGUSR1)
            except ProcessLookupError:
                pass
        time.sleep(0.3)
        lines = [f"{what + ': ' if what else ''}with {world_size} ranks, timed out after {deadline_s:g} s "
                 f"(every rank was killed)."]
        for r in range(world_size):
            if r in payloads:
                lines.append(f"rank {r}: finished its work and is waiting for the others")
                continue
            lines.append(f"rank {r}: {_describe_state(states[r], now)}")
            stack = _stack_of(procs[r][3])
            if stack:
                lines.append("    stuck at (innermost first):\n" + stack)
        lines.append("Every rank must make the same collective calls in the same order with matching sizes, "
                     "and every send needs a matching recv: a rank waiting for a message its peer never "
                     "sends waits forever.")
        message = "\n  ".join(lines)
        try:
            _HUNG[entry] = message
        except TypeError:  # not weak-referenceable: nothing to remember
            pass
        raise RankHangError(message)
    finally:
        os.close(release_w)  # releases ranks that finished
        for pid, *_ in procs:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid, result_r, slot, _ in procs:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            os.close(result_r)
            slot.close()
        os.close(release_r)
        shutil.rmtree(tmp, ignore_errors=True)
