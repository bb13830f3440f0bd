"""Reading what the sandbox wrote, without trusting it.

Everything in the sandbox's output folder (results, arrays, progress, cell reports) was written by a
process the student's code controls. So the grader:

* opens each file relative to the folder's own descriptor, with ``O_NOFOLLOW | O_NONBLOCK``: a symbolic
  link (to ``/dev/zero``, to a host file) fails to open, a FIFO does not block;
* accepts only a regular file with one link (``fstat``), under a size cap, and reads at most that cap;
* parses JSON and ``.npy`` arrays itself, checking an array's header (dtype, shape) against the bytes
  actually there before anything is allocated.

Anything unexpected raises :class:`Untrusted` with a reason, which the caller turns into a harness
failure of one exercise ("crashed"), never a crash or a hang of the grader.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import stat

MAX_JSON_BYTES = 16 << 20  # a result file of one exercise
MAX_ARRAY_BYTES = 64 << 20  # one returned array
MAX_PROGRESS_TAIL = 64 << 10  # what the watchdog and the blame step read of progress.jsonl


class Untrusted(Exception):
    """A file from the sandbox that the grader will not use, and why."""


def open_dir(path: str | os.PathLike) -> int:
    """A descriptor of the output folder itself (not following a link put in its place)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise Untrusted(f"the output folder cannot be opened ({e.strerror})") from None


def read_bytes(dir_fd: int, name: str, cap: int, *, tail: bool = False) -> bytes:
    """The bytes of the regular file ``name`` in ``dir_fd`` (its last ``cap`` bytes when ``tail``)."""
    if "/" in name or name in ("", ".", ".."):
        raise Untrusted(f"{name!r} is not a plain file name")
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as e:  # ELOOP: a symbolic link; ENXIO/EACCES and others: not ours to read
        raise Untrusted(f"{name} cannot be opened safely ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted(f"{name} is not a regular file (mode {stat.filemode(st.st_mode)})")
        if st.st_nlink != 1:
            raise Untrusted(f"{name} is a hard link ({st.st_nlink} names)")
        if st.st_size > cap and not tail:
            raise Untrusted(f"{name} is {st.st_size} bytes, over the {cap}-byte limit")
        if tail and st.st_size > cap:
            os.lseek(fd, st.st_size - cap, os.SEEK_SET)
        chunks, left = [], cap + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > cap:  # it grew while being read
            if not tail:
                raise Untrusted(f"{name} grew past the {cap}-byte limit while being read")
            data = data[-cap:]
        return data
    finally:
        os.close(fd)


def read_json(dir_fd: int, name: str, cap: int = MAX_JSON_BYTES):
    """Parsed JSON of ``name``; :class:`Untrusted` for anything but a small, well-formed file."""
    data = read_bytes(dir_fd, name, cap)
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError) as e:
        raise Untrusted(f"{name} is not valid JSON ({type(e).__name__})") from None


#: the dtypes a returned array may have (object arrays, structured or void dtypes are refused)
ARRAY_KINDS = "biufc"


def read_array(dir_fd: int, name: str, cap: int = MAX_ARRAY_BYTES, sha256: str | None = None):
    """A ``.npy`` array, validated before allocation: simple dtype, shape matching the bytes present, and
    (when given) the SHA-256 of its bytes that the harness sealed into the result file."""
    data = read_bytes(dir_fd, name, cap)
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise Untrusted(f"{name} is not the array the harness wrote (its bytes were changed)")
    return parse_array(name, data)


def parse_array(name: str, data: bytes):
    import numpy as np
    from numpy.lib import format as npy

    f = io.BytesIO(data)
    try:
        version = npy.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = npy.read_array_header_1_0(f)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = npy.read_array_header_2_0(f)
        else:
            raise ValueError(f"npy version {version}")
    except Exception as e:  # numpy raises ValueError and others for a damaged header
        raise Untrusted(f"{name} is not a valid .npy array ({type(e).__name__}: {str(e)[:100]})") from None
    if dtype.kind not in ARRAY_KINDS or dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise Untrusted(f"{name} has dtype {dtype}, which the grader does not read")
    if not all(isinstance(s, int) and 0 <= s for s in shape):
        raise Untrusted(f"{name} has an invalid shape {shape}")
    count = 1
    for s in shape:
        count *= s
    body = data[f.tell():]
    if count * dtype.itemsize != len(body):
        raise Untrusted(f"{name} declares shape {shape} of {dtype} ({count * dtype.itemsize} bytes) "
                        f"but holds {len(body)} bytes")
    arr = np.frombuffer(body, dtype=dtype, count=count).copy()
    return arr.reshape(shape, order="F" if fortran else "C")


def tail_lines(dir_fd: int, name: str, cap: int = MAX_PROGRESS_TAIL, max_lines: int = 1000) -> list[str]:
    """The last complete lines of a text file (progress), read safely; [] when absent or unusable."""
    try:
        data = read_bytes(dir_fd, name, cap, tail=True)
    except (FileNotFoundError, Untrusted):
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    if len(data) >= cap and lines:
        lines = lines[1:]  # the first line was cut by the tail
    return lines[-max_lines:]


def exists(dir_fd: int, name: str) -> bool:
    """Whether ``name`` is present at all (any kind of file, a link not followed)."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except OSError:
        return False


def folder_bytes(path: str | os.PathLike, stop_above: int | None = None) -> int:
    """Bytes used by the files under ``path`` (links not followed), stopping early past ``stop_above``."""
    total = 0
    for root, dirs, files in os.walk(path, followlinks=False):
        for name in files + dirs:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            total += st.st_blocks * 512
            if stop_above is not None and total > stop_above:
                return total
    return total
