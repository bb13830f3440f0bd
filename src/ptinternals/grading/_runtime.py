"""The sandbox side of the grading boundary: run student code, return only data.

This file runs in two places:

* inside the grading sandbox, as a script (``python -I -S _runtime.py JOB_DIR OUT_DIR``), in a fresh
  process that holds no grader state: it reads a secret key from stdin (before any student code runs),
  executes the student's answer cells, calls each exercise's entry point on the cases the grader chose,
  and writes the results as JSON plus ``.npy`` arrays (never pickle), each result sealed with an HMAC
  under that key, then ends its own process. In a *plain* job (exercises that forbid torch or numpy,
  which are then absent from the sandbox) it imports neither, and inputs and results are plain JSON.
  The grade is computed elsewhere, by the trusted process that reads these files.
* inside the student's own kernel, imported by ``ptinternals.grading.check`` for instant feedback,
  so that both paths call and encode student code in exactly the same way.

It imports only the standard library at module level (numpy and torch lazily), because it must work
in a sandbox where the course's reference implementations (and maybe torch and numpy) do not exist.
"""
from __future__ import annotations

import hashlib
import hmac
import io
import json
import math
import os
import signal
import sys
import time
import traceback
import types

FORMAT_VERSION = 1
MAX_MESSAGE = 2000


# ================================================================================================
# Encoding: Python/torch values <-> JSON tree + named arrays
# ================================================================================================
class Raised:
    """What an entry point raised, as data: ``Raised("ValueError", "shape[1] must be >= 0")``."""

    __slots__ = ("type", "message")

    def __init__(self, type_name: str, message: str):
        self.type, self.message = type_name, message

    def __repr__(self) -> str:
        return f"raised {self.type}: {self.message}"

    def __eq__(self, other) -> bool:
        return isinstance(other, Raised) and (self.type, self.message) == (other.type, other.message)


class Unsupported:
    """A value of a type the boundary does not carry (it is never equal to anything)."""

    __slots__ = ("type", "text")

    def __init__(self, type_name: str, text: str):
        self.type, self.text = type_name, text

    def __repr__(self) -> str:
        return f"<a {self.type} object, which the grader cannot compare: {self.text}>"


class TensorInfo:
    """A tensor that crossed the boundary: its values (a CPU tensor) and its metadata.

    ``shares_storage_with`` lists the argument positions whose storage the tensor aliases (computed
    on the sandbox side from ``untyped_storage().data_ptr()``): that is how "no copy" is checked.
    """

    __slots__ = ("values", "shape", "stride", "storage_offset", "dtype", "device", "shares_storage_with", "requires_grad")

    def __init__(self, values, shape, stride, storage_offset, dtype, device, shares_storage_with, requires_grad):
        self.values, self.shape, self.stride = values, tuple(shape), tuple(stride)
        self.storage_offset, self.dtype, self.device = storage_offset, dtype, device
        self.shares_storage_with, self.requires_grad = tuple(shares_storage_with), requires_grad

    def __repr__(self) -> str:
        return f"tensor(shape={self.shape}, stride={self.stride}, dtype={self.dtype}, device={self.device})"


def _exact(x, base):
    """The plain ``base`` value of ``x``: subclasses (with a rigged ``__eq__``) are stripped."""
    if base is int:
        return int.__add__(x, 0)
    if base is float:
        return float.__float__(x)  # the base method: keeps -0.0, ignores an overridden __float__
    if base is str:
        return str.__str__(x)
    if base is tuple:
        return tuple.__getitem__(x, slice(None))
    if base is list:
        return list.__getitem__(x, slice(None))
    raise TypeError(base)


def encode(obj, arrays: dict, ctx: dict | None = None, depth: int = 0, plain: bool = False):
    """Turn ``obj`` into a JSON-able tree; tensors/arrays go into ``arrays`` under generated names.

    ``plain``: the run has no torch and no numpy (they are absent from its filesystem): only Python's
    own values cross (ints, floats, strings, tuples, lists, dicts, None, bools, exceptions), and
    ``sys.modules`` is never consulted, whatever a cell put there.
    """
    ctx = ctx or {}
    if depth > 50:
        return {"__unsupported__": "deep structure", "text": "nested more than 50 levels"}
    if obj is None or obj is True or obj is False:
        return obj
    if isinstance(obj, BaseException):
        return {"__raised__": type(obj).__name__, "message": _exc_message(obj)}
    if isinstance(obj, Raised) or (type(obj).__name__ == "Raised" and hasattr(obj, "type") and hasattr(obj, "message")):
        # by name too: in the sandbox this module runs as __main__, so a probe's Raised is another class
        return {"__raised__": str(obj.type), "message": str(obj.message)[:MAX_MESSAGE]}
    if isinstance(obj, int) and not isinstance(obj, bool):
        return _exact(obj, int)
    if isinstance(obj, float):
        f = _exact(obj, float)
        return f if math.isfinite(f) else {"__float__": repr(f)}
    if isinstance(obj, str):
        return _exact(obj, str)[:100_000]
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(x, arrays, ctx, depth + 1, plain) for x in _exact(obj, tuple)]}
    if isinstance(obj, list):
        return [encode(x, arrays, ctx, depth + 1, plain) for x in _exact(obj, list)]
    if type(obj) is dict:
        return {"__dict__": [[encode(k, arrays, ctx, depth + 1, plain), encode(v, arrays, ctx, depth + 1, plain)]
                             for k, v in dict.items(obj)]}
    if type(obj) is slice:
        return {"__slice__": [encode(obj.start, arrays, ctx, depth + 1, plain), encode(obj.stop, arrays, ctx, depth + 1, plain),
                              encode(obj.step, arrays, ctx, depth + 1, plain)]}
    torch = None if plain else sys.modules.get("torch")
    np = None if plain else sys.modules.get("numpy")
    if torch is not None and not isinstance(torch, _Forbidden):
        if isinstance(obj, torch.Size):
            return {"__tuple__": [int(s) for s in obj]}
        if isinstance(obj, torch.dtype):
            return {"__dtype__": str(obj).replace("torch.", "")}
        if isinstance(obj, torch.device):
            return {"__device__": str(obj)}
        if isinstance(obj, torch.Tensor):
            return _encode_tensor(obj, arrays, ctx)
    if np is not None and not isinstance(np, _Forbidden) and isinstance(obj, (np.ndarray, np.generic)):
        arr = np.asarray(obj)
        if arr.dtype == object:
            return {"__unsupported__": "numpy object array", "text": ""}
        name = f"a{len(arrays)}"
        arrays[name] = np.ascontiguousarray(arr)
        return {"__ndarray__": name}
    try:
        text = object.__repr__(obj)
    except Exception:
        text = "?"
    return {"__unsupported__": type(obj).__name__, "text": text[:200]}


def _encode_tensor(t, arrays: dict, ctx: dict):
    import torch

    t = torch.Tensor._make_subclass(torch.Tensor, t.detach()) if type(t) is not torch.Tensor and not t.is_nested else t.detach()
    name = f"a{len(arrays)}"
    values = t.to("cpu") if t.device.type != "meta" else None
    if values is not None:
        values = values.contiguous()
        if values.dtype == torch.bfloat16:  # numpy has no bf16: ship the bit pattern
            arrays[name] = values.view(torch.int16).numpy()
        elif values.dtype.is_floating_point and values.element_size() == 1:  # fp8 formats: bit pattern too
            arrays[name] = values.view(torch.uint8).numpy()
        else:
            arrays[name] = values.numpy()
    shares = []
    if t.device.type != "meta":
        ptr = t.untyped_storage().data_ptr()
        shares = [i for i, p in ctx.get("arg_storages", []) if p == ptr and ptr != 0]
    return {
        "__tensor__": name if values is not None else None,
        "shape": list(t.shape),
        "stride": list(t.stride()) if t.layout == torch.strided else [],
        "storage_offset": t.storage_offset() if t.layout == torch.strided else 0,
        "dtype": str(t.dtype).replace("torch.", ""),
        "device": t.device.type,
        "shares_storage_with": shares,
        "requires_grad": bool(getattr(t, "requires_grad", False)),
    }


MAX_DIMS = 64


def _dtype_named(torch, name):
    """The torch dtype called ``name`` ("float32"); anything else in torch's namespace is refused."""
    dtype = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{str(name)[:40]!r} is not a torch dtype")
    return dtype


def _int_list(x, what: str, min_value=None) -> tuple:
    if not isinstance(x, list) or len(x) > MAX_DIMS or any(type(v) is not int for v in x):
        raise ValueError(f"{what} must be a list of at most {MAX_DIMS} ints")
    if min_value is not None and any(v < min_value for v in x):
        raise ValueError(f"{what} has a value below {min_value}")
    return tuple(x)


def decode(tree, arrays: dict, *, to_torch: bool = True, device: str = "cpu", plain: bool = False, depth: int = 0):
    """Inverse of :func:`encode`. Tensors come back as torch tensors (inputs) or ``TensorInfo`` (results).

    Results (``to_torch=False``) come from the sandbox, so their shape is checked as they are read:
    dtypes must be dtypes, shapes must match the bytes, a meta tensor (no values) or a tensor in a
    ``plain`` run is an :class:`Unsupported` value; anything malformed raises ValueError.
    """
    if depth > 100:
        if to_torch:
            raise ValueError("nested more than 100 levels")
        return Unsupported("deep structure", "nested more than 100 levels")

    def sub(x):
        return decode(x, arrays, to_torch=to_torch, device=device, plain=plain, depth=depth + 1)

    if isinstance(tree, list):
        return [sub(x) for x in tree]
    if not isinstance(tree, dict):
        if tree is None or isinstance(tree, (bool, int, float, str)):
            return tree
        raise ValueError(f"cannot decode a {type(tree).__name__}")
    if "__tuple__" in tree:
        return tuple(sub(x) for x in tree["__tuple__"])
    if "__dict__" in tree:
        return {sub(k): sub(v) for k, v in tree["__dict__"]}
    if "__float__" in tree:
        return float(str(tree["__float__"])[:40])
    if "__raised__" in tree:
        return Raised(str(tree["__raised__"])[:200], str(tree.get("message", ""))[:MAX_MESSAGE])
    if "__unsupported__" in tree:
        return Unsupported(str(tree["__unsupported__"])[:200], str(tree.get("text", ""))[:200])
    if "__slice__" in tree:
        return slice(*(sub(x) for x in tree["__slice__"]))
    if plain:  # no torch or numpy value can come from a run without them
        if to_torch:
            raise ValueError(f"a plain job cannot carry {sorted(tree)[:1]}")
        return Unsupported("tensor or array", "a run without torch and numpy cannot return one")
    import torch

    if "__dtype__" in tree:
        return _dtype_named(torch, tree["__dtype__"])
    if "__device__" in tree:
        return torch.device(str(tree["__device__"])[:40])
    if "__ndarray__" in tree:
        return arrays[tree["__ndarray__"]]
    if "__tensor__" in tree:
        dtype = _dtype_named(torch, tree["dtype"])
        shape = _int_list(tree["shape"], "shape", 0)
        if tree["__tensor__"] is None:
            if not to_torch:  # a meta (or otherwise value-less) tensor: nothing the grader can compare
                return Unsupported("meta tensor", f"a tensor without values, shape {shape}")
            values = torch.empty(shape, dtype=dtype, device="meta")
        else:
            arr = arrays[tree["__tensor__"]]
            values = torch.from_numpy(arr.copy())
            if values.dtype != dtype:  # bf16 / fp8 travelled as their bit patterns
                if values.element_size() != dtype.itemsize:
                    raise ValueError(f"values of {values.dtype} cannot be a {dtype} tensor")
                values = values.view(dtype)
            numel = 1
            for s in shape:
                numel *= s
            if values.numel() != numel:
                raise ValueError(f"shape {shape} needs {numel} values, got {values.numel()}")
            values = values.reshape(shape)
        if not to_torch:
            stride = _int_list(tree["stride"], "stride")
            if stride and len(stride) != len(shape):
                raise ValueError("stride and shape differ in length")
            offset = tree["storage_offset"]
            shares = tree.get("shares_storage_with", [])
            if type(offset) is not int or not isinstance(shares, list) or not all(type(i) is int for i in shares):
                raise ValueError("malformed tensor metadata")
            return TensorInfo(values, shape, stride, offset, str(tree["dtype"]), str(tree["device"])[:20],
                              shares, bool(tree.get("requires_grad", False)))
        # An input: rebuild the exact layout (non-contiguous strides included) on the target device.
        stride, offset = tuple(tree["stride"]), int(tree["storage_offset"])
        t = values.to(device)
        if stride and (stride != tuple(t.stride()) or offset):
            extent = 1 + offset + sum((s - 1) * st for s, st in zip(shape, stride)) if values.numel() else 0
            base = torch.zeros(max(extent, 1), dtype=dtype, device=device)
            # Scatter through storage positions (not view.copy_): stride-0 (expanded) layouts overlap.
            positions = torch.arange(max(extent, 1), device=device).as_strided(shape, stride, offset)
            base[positions.flatten()] = t.flatten()
            t = base.as_strided(shape, stride, offset)
        if tree.get("requires_grad"):
            t.requires_grad_(True)
        return t
    raise ValueError(f"cannot decode {sorted(tree)[:3]}")


def _exc_message(e: BaseException) -> str:
    try:
        msg = str(e)
    except Exception:
        msg = "<unprintable message>"
    return msg[:MAX_MESSAGE]


class _AfterImport:
    """A meta-path finder that calls ``fix(module)`` once module ``name`` has been imported, then leaves.
    Used for torch 2.11's Inductor, whose precompiled C++ header (120-160 MB, over the sandbox's file-size
    limit) has no environment switch: ``cpp_cache_precompile_headers`` is set to False when (if ever)
    student code imports ``torch._inductor.config``, as 2.13 does from TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS.
    A convenience, not a defence: student code may undo it, and only fails its own build then."""

    def __init__(self, name: str, fix):
        self.name, self.fix = name, fix

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, fix = spec.loader.exec_module, self.fix

        def exec_then_fix(module):
            exec_module(module)
            fix(module)

        spec.loader.exec_module = exec_then_fix
        return spec


def _no_precompiled_header(config) -> None:
    if os.environ.get("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS") == "0":
        config.cpp_cache_precompile_headers = False


# ================================================================================================
# Forbidden modules (an exercise that must be solved without torch gets a stub instead of torch)
# ================================================================================================
class ForbiddenModuleError(RuntimeError):
    pass


class _Forbidden(types.ModuleType):
    def __init__(self, name: str, exercise: str = "this exercise"):
        super().__init__(name)
        object.__setattr__(self, "_why", f"{name} is not available in {exercise}: implement the algorithm yourself "
                                         f"(the grader runs this exercise with {name} unavailable)")

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        raise ForbiddenModuleError(f"{object.__getattribute__(self, '_why')} [used: {self.__name__}.{attr}]")


class _Blocker:
    """A meta-path finder that refuses some imports (reference implementations, forbidden modules)."""

    def __init__(self, blocked_prefixes, allowed, message):
        self.blocked, self.allowed, self.message = tuple(blocked_prefixes), set(allowed), message

    def find_spec(self, name, path=None, target=None):
        if name in self.allowed:
            return None
        for prefix in self.blocked:
            if name == prefix or name.startswith(prefix + "."):
                raise ImportError(self.message.format(name=name))
        return None


# ================================================================================================
# Calling student code
# ================================================================================================
class CaseTimeout(BaseException):
    """Raised by the per-exercise alarm; a BaseException so ``except Exception`` cannot swallow it."""


def call_case(entry, case_args, case_kwargs, probe=None):
    """Call ``entry`` (or ``probe(entry, ...)``) on one case; return the result or a ``Raised``."""
    try:
        fn = probe if probe is not None else entry
        if probe is not None:
            return probe(entry, *case_args, **case_kwargs)
        return fn(*case_args, **case_kwargs)
    except CaseTimeout:
        raise
    except NotImplementedError as e:
        return Raised("NotImplementedError", _exc_message(e))
    except RecursionError as e:
        return Raised("RecursionError", _exc_message(e))
    except Exception as e:
        return Raised(type(e).__name__, _exc_message(e))


def arg_storages(args, kwargs):
    """(position, storage pointer) of every tensor argument, to tell views from copies."""
    torch = sys.modules.get("torch")
    out = []
    if torch is None or isinstance(torch, _Forbidden):
        return out
    for i, a in enumerate(list(args) + list(kwargs.values())):
        if isinstance(a, torch.Tensor) and a.device.type != "meta":
            out.append((i, a.untyped_storage().data_ptr()))
    return out


def strip_magics(source: str) -> str:
    """IPython magics and shell escapes are not Python: comment them out."""
    lines = []
    for line in source.splitlines():
        stripped = line.lstrip()
        lines.append(("# " + line) if stripped.startswith(("%", "!")) else line)
    return "\n".join(lines)


def _load_probe(spec: str | None):
    if not spec:
        return None
    module, _, func = spec.partition(":")
    __import__(module)
    return getattr(sys.modules[module], func)


# ================================================================================================
# The sandbox entry point
# ================================================================================================
def _write_json(path, obj, _dump=json.dump, _replace=os.replace, _open=open):
    tmp = path + ".tmp"
    with _open(tmp, "w") as f:
        _dump(obj, f)
    _replace(tmp, path)


def _read_key(stream) -> bytes:
    """The run's secret key, sent by the grader on stdin and read before any student code runs.

    Each result file carries an HMAC of its content (and of its arrays' bytes) under this key, so a
    result file written or altered by the student's own code (which can write to the output folder,
    and read the harness's files, but never saw the key) is refused. stdin is closed afterwards."""
    try:
        key = bytes.fromhex(stream.readline().strip())
    except (OSError, ValueError):
        key = b""
    try:
        stream.close()
        os.close(0)
    except OSError:
        pass
    return key


def seal(key: bytes, payload: bytes, _new=hmac.new, _sha256=hashlib.sha256) -> bytes:
    """``payload`` prefixed by the hex HMAC-SHA256 of it under ``key`` and a newline (see :func:`unseal`).
    The hash functions are bound when this module loads: a cell that replaces ``hmac`` learns nothing."""
    return _new(key, payload, _sha256).hexdigest().encode() + b"\n" + payload


def unseal(key: bytes, data: bytes) -> bytes | None:
    """The payload of a sealed file, or None when its HMAC does not match ``key``."""
    mac, _, payload = data.partition(b"\n")
    ok = hmac.compare_digest(mac, hmac.new(key, payload, hashlib.sha256).hexdigest().encode())
    return payload if ok and key else None


def main(job_dir: str, out_dir: str) -> int:
    # Everything the harness needs is bound *before* student code runs, so rebinding names in
    # json/os/numpy from a cell cannot change what the harness writes.
    _open, _dump, _dumps, _replace, _time, _now = open, json.dump, json.dumps, os.replace, time.perf_counter, time.time
    _encode, _decode, _call, _storages, _probe = encode, decode, call_case, arg_storages, _load_probe
    _setitimer, _signal, _exit, _join = signal.setitimer, signal.signal, os._exit, os.path.join
    _stdout, _stderr = sys.stdout, sys.stderr
    with _open(_join(job_dir, "job.json")) as f:
        job = json.load(f)
    if job.get("format") != FORMAT_VERSION:
        raise SystemExit(f"job format {job.get('format')} != {FORMAT_VERSION}")
    key = _read_key(sys.stdin) if job.get("key_on_stdin") else b""
    _seal, _sha256, _bytesio = seal, hashlib.sha256, io.BytesIO
    plain = bool(job.get("plain"))  # no torch, no numpy: inputs and results are plain JSON
    sys.path[:0] = [p for p in job.get("sys_path", []) if p not in sys.path]
    sys.setrecursionlimit(5000)
    # Modules this run must not see: the reference implementations (absent from the sandbox's copy of
    # the course package; this finder only makes the error message say why).
    sys.meta_path.insert(0, _Blocker(job.get("blocked_modules", []), job.get("allowed_modules", []),
                                     "{name} is not available while grading: graded code must not call the "
                                     "course's reference implementation"))
    if job.get("forbid") and not job.get("forbid_absent"):
        # Process isolation cannot make a package absent: a finder refuses the import, a speed bump
        # only (``ptgrade`` requires --allow-weak-isolation to grade like this).
        sys.meta_path.insert(0, _Blocker(job["forbid"], (), "{name} is not available in this exercise: implement "
                                                             "the algorithm yourself"))
    if not plain:
        import numpy as np  # noqa: F401  (imported before student code, for the encoder)
        import torch

        torch.manual_seed(0)
        _data_ptr = torch.UntypedStorage.data_ptr  # noqa: F841  (bound early)
        if "torch._inductor.config" in sys.modules:
            _no_precompiled_header(sys.modules["torch._inductor.config"])
        else:  # importing it costs 2.5 s: only when student code does
            sys.meta_path.insert(0, _AfterImport("torch._inductor.config", _no_precompiled_header))
    _np = None if plain else sys.modules["numpy"]
    _np_save = None if plain else _np.save

    arrays_in = {}
    for name in job.get("input_arrays", []):
        arrays_in[name] = _np.load(_join(job_dir, name + ".npy"), allow_pickle=False)

    progress = _join(out_dir, "progress.jsonl")

    def mark(event: dict) -> None:
        event["t"] = _now()  # read by the grader to tell where a killed run stopped (never trusted for limits)
        with _open(progress, "a") as f:
            f.write(_dumps(event) + "\n")
            f.flush()

    def on_alarm(signum, frame):
        raise CaseTimeout()

    # 1. The student's answer cells, in notebook order, in one fresh namespace.
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    cell_reports = []
    for cell in job["cells"]:
        if cell["id"] in job.get("skip_cells", []):
            cell_reports.append({"id": cell["id"], "status": "skipped"})
            continue
        mark({"cell": cell["id"]})
        t0 = _time()
        _signal(signal.SIGALRM, on_alarm)
        _setitimer(signal.ITIMER_REAL, float(job.get("cell_timeout_s", 30)))
        try:
            source = strip_magics(cell["source"])
            import linecache

            # Register the source, as IPython does for notebook cells: tracebacks show lines, and
            # tools that read their function's source (triton.jit, inspect.getsource) work.
            filename = f"<cell {cell['id']}>"
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
            if cell.get("tolerant"):
                # The course's own locked cells (imports of notebook-only helpers such as quizzes and
                # figures, which do not exist here): run statement by statement, keep going on errors.
                import ast

                for stmt in ast.parse(source).body:
                    try:
                        exec(compile(ast.Module([stmt], []), f"<cell {cell['id']}>", "exec"), ns)
                    except Exception:
                        pass
            else:
                exec(compile(source, f"<cell {cell['id']}>", "exec"), ns)
            cell_reports.append({"id": cell["id"], "status": "ok", "s": _time() - t0})
            mark({"cell_done": cell["id"]})
        except CaseTimeout:
            cell_reports.append({"id": cell["id"], "status": "error", "error": "Timeout",
                                 "message": f"the cell ran past {job.get('cell_timeout_s', 30)} s", "where": ""})
        except BaseException as e:  # SystemExit and KeyboardInterrupt included: a cell may not end grading
            tb = traceback.extract_tb(e.__traceback__)
            where = next((f"line {fr.lineno}" for fr in reversed(tb) if fr.filename.startswith("<cell")), "")
            cell_reports.append({"id": cell["id"], "status": "error", "error": type(e).__name__,
                                 "message": _exc_message(e), "where": where})
        finally:
            _setitimer(signal.ITIMER_REAL, 0)
    _write_json(_join(out_dir, "cells.json"), cell_reports, _dump, _replace, _open)

    # 2. Each exercise: look up its entry point, run its cases under a time limit, write the results.
    for ex in job["exercises"]:
        if ex["id"] in job.get("skip_exercises", []):
            continue
        mark({"exercise": ex["id"]})
        t0 = _time()
        arrays_out: dict = {}
        results = []
        entry = ns.get(ex["entry"])
        status = "ok"
        if entry is None:
            status = "missing"
        else:
            try:
                probe = _probe(ex.get("probe"))
                _signal(signal.SIGALRM, on_alarm)
                _setitimer(signal.ITIMER_REAL, float(ex.get("timeout_s", 20)))
                for case in ex["cases"]:
                    device = ex.get("device", job.get("device", "cpu"))
                    args = _decode(case["args"], arrays_in, device=device, plain=plain)
                    kwargs = _decode(case.get("kwargs", {"__dict__": []}), arrays_in, device=device, plain=plain)
                    storages = [] if plain else _storages(args, kwargs)
                    got = _call(entry, args, kwargs, probe)
                    if isinstance(got, Raised) and got.type == "MemoryError":
                        status = "memory"  # do not run a memory bomb once per case
                        break
                    results.append(_encode(got, arrays_out, {"arg_storages": storages}, plain=plain))
            except CaseTimeout:
                status = "timeout"
            except BaseException as e:  # an error in the probe or decoding: report, do not die
                status = "harness-error"
                results.append(_encode(Raised(type(e).__name__, _exc_message(e)), arrays_out, plain=True))
            finally:
                _setitimer(signal.ITIMER_REAL, 0)
        out_name = ex["id"].replace("/", "_")
        digests = {}
        for name, arr in arrays_out.items():
            buf = _bytesio()
            _np_save(buf, arr, allow_pickle=False)
            data = buf.getvalue()
            digests[name] = _sha256(data).hexdigest()  # sealed with the result: an altered array is refused
            with _open(_join(out_dir, f"{out_name}.{name}.npy"), "wb") as f:
                f.write(data)
        payload = _dumps({"id": ex["id"], "status": status, "results": results, "arrays": digests,
                          "s": _time() - t0}).encode()
        tmp = _join(out_dir, f"{out_name}.result.json.tmp")
        with _open(tmp, "wb") as f:
            f.write(_seal(key, payload))
        _replace(tmp, _join(out_dir, f"{out_name}.result.json"))
    mark({"done": True})
    # End the process here: a thread the student started (daemon or not) cannot keep it alive.
    for stream in (_stdout, _stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 (a stream a cell closed or replaced)
            pass
    _exit(0)
    return 0  # pragma: no cover (only when os._exit was made a no-op, which it cannot be from here)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
