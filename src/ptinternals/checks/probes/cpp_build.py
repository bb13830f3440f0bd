"""Compile a student's C++ operator inside the grading sandbox: once per source, under a time limit.

Sandbox side (torch and the standard library only). The build is ``torch.utils.cpp_extension.load_inline``
(``is_python_module=False``, ``no_implicit_headers=True``: the source includes what it needs), run in a
child process so that it can be stopped: a build that runs past ``BUILD_TIMEOUT_S`` is killed with its
compiler and reported, and the compiler's first errors become the exception's message. The .so is then
loaded here with ``torch.ops.load_library``.

What makes it cheap to grade many cases and many submissions:

- the namespace, extension name and build folder come from a hash of the source, the flags and the torch
  version (``ptcpp_<12 hex>``, the scheme of the reference's ``ptinternals.dispatch.cpp_op``): a source
  is compiled once and loaded once per process, whatever the number of cases;
- the build folder lives under ``$TMPDIR/ptinternals-cpp-<uid>``. In the sandbox ``TMPDIR`` is the job's
  own writable scratch (``/sandbox/out``: ``/usr`` is read-only and ``/tmp`` an empty tmpfs under
  bubblewrap), so each submission builds once; in a notebook kernel it is the machine's temp folder, so
  re-running a check (or the kernel) reuses the build of an unchanged source.

The build needs g++ and ninja on ``PATH`` (the venv's ``bin``, where the ``ninja`` PyPI package puts it,
is added), torch's headers, and about 10 s of one core for a source that includes ``torch/library.h``,
``ATen/core/Tensor.h`` and a few ATen headers.
"""
from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import tempfile

import torch

CXX_FLAGS = ("-O2",)
BUILD_TIMEOUT_S = 180.0
PLACEHOLDER = re.compile(r"\bNAMESPACE\b")
_LOADED: dict[str, str] = {}  # namespace -> .so loaded into this process


def toolchain_tag() -> str:
    """What a build depends on besides its source: torch's version (its headers and ABI) and Python's."""
    return f"torch {torch.__version__} cuda {torch.version.cuda} py {sys.version_info[0]}.{sys.version_info[1]}"


def namespace_of(source: str, cuda_source: str | None = None) -> str:
    """``ptcpp_<12 hex>``: the namespace, extension name and build folder of ``source``."""
    if not isinstance(source, str) or not PLACEHOLDER.search(source):
        raise ValueError("the C++ source must name its namespace NAMESPACE, as in TORCH_LIBRARY(NAMESPACE, m): "
                         "the grader puts a namespace of its own there")
    text = "\0".join([source, cuda_source or "", *CXX_FLAGS, toolchain_tag()])
    return "ptcpp_" + hashlib.sha256(text.encode()).hexdigest()[:12]


def _search_path() -> str:
    """PATH for the build: the interpreter's own bin first (where the ``ninja`` PyPI package installs)."""
    return os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "/usr/bin:/bin")])


def compiler_missing() -> str | None:
    """Why no C++ operator can be built here (no C++ compiler, no ninja), or None when one can."""
    import shutil

    cxx = os.environ.get("CXX", "c++")  # what torch.utils.cpp_extension runs
    missing = [what for what, tool in ((f"C++ compiler ({cxx!r}, e.g. g++)", cxx), ("ninja (pip install ninja)", "ninja"))
               if shutil.which(tool, path=_search_path()) is None]
    return ("this machine has no " + " and no ".join(missing)) if missing else None


def build_root() -> str:
    return os.path.join(tempfile.gettempdir(), f"ptinternals-cpp-{os.getuid()}")


_BUILD_SCRIPT = """
import sys
sys.path[:0] = {path!r}
from torch.utils.cpp_extension import load_inline
load_inline({name!r}, cpp_sources=[{source!r}], cuda_sources={cuda!r}, is_python_module=False,
            no_implicit_headers=True, extra_cflags={flags!r}, build_directory={folder!r}, verbose=False)
"""


def _compiler_errors(output: str, folder: str) -> str:
    """The compiler's error lines (and the lines under the first one), paths shortened to main.cpp."""
    lines = [line.replace(folder + os.sep, "") for line in output.splitlines()]
    first = next((i for i, line in enumerate(lines) if "error:" in line and "Error:" not in line), None)
    if first is None:
        return "\n".join(lines[-15:])
    picked = lines[first:first + 12]
    more = [line for line in lines[first + 12:] if ": error:" in line][:5]
    return "\n".join(picked + more)


def build(source: str, cuda_source: str | None = None, *, timeout_s: float = BUILD_TIMEOUT_S) -> str:
    """Compile (once) and load (once per process) ``source``; return its namespace.

    Raises RuntimeError with the compiler's errors when it does not compile, TimeoutError when the build
    runs past ``timeout_s``."""
    ns = namespace_of(source, cuda_source)
    if ns in _LOADED:
        return ns
    folder = os.path.join(build_root(), ns)
    so, done = os.path.join(folder, ns + ".so"), os.path.join(folder, "built.ok")
    if not os.path.exists(done):
        os.makedirs(folder, exist_ok=True)
        script = _BUILD_SCRIPT.format(path=list(sys.path), name=ns, source=PLACEHOLDER.sub(ns, source),
                                      cuda=[PLACEHOLDER.sub(ns, cuda_source)] if cuda_source else None,
                                      flags=list(CXX_FLAGS), folder=folder)
        env = dict(os.environ, PATH=_search_path(), MAX_JOBS="1")
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True, text=True)
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the compiler too
            proc.communicate()
            raise TimeoutError(f"building your C++ took more than {timeout_s:.0f} s and was stopped") from None
        if proc.returncode != 0 or not os.path.exists(so):
            raise RuntimeError("your C++ did not build:\n" + _compiler_errors(output, folder))
        with open(done, "w") as f:
            f.write(toolchain_tag())
    torch.ops.load_library(so)
    _LOADED[ns] = so
    return ns


def kernel_origins(qualname: str, keys=("CPU", "CUDA", "Meta", "AutogradCPU")) -> dict[str, tuple[str, str]]:
    """``{key: (kind, file)}`` of the kernels at ``keys`` (``_dispatch_dump_table``): kind as torch prints it
    ("kernel", "autograd kernel", "backend fallback"...) and the file it was registered from, "your C++"
    when that is the build folder's main.cpp."""
    text = torch._C._dispatch_dump_table(qualname) or ""
    root = build_root()
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key.strip() not in keys:
            continue
        kind = rest.rsplit("[", 1)[-1].rstrip("] \n") if "[" in rest else rest.strip()
        where = rest.split("registered at ", 1)[-1].rsplit(" [", 1)[0].strip()
        path = where.rsplit(":", 1)[0]
        origin = "your C++" if path.startswith(root) and path.endswith(".cpp") else os.path.basename(path)
        out[key.strip()] = (("fallthrough " if "fallthrough" in rest else "") + kind, origin)
    return out
