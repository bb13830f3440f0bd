"""Reading the sandbox's files: every kind of hostile file is refused quickly, none is followed or blocks."""
import json
import os
import time

import numpy as np
import pytest

from ptinternals.grading import outfiles
from ptinternals.grading.outfiles import Untrusted


@pytest.fixture
def out(tmp_path):
    fd = outfiles.open_dir(tmp_path)
    yield tmp_path, fd
    os.close(fd)


def test_a_regular_json_file_reads(out):
    path, fd = out
    (path / "r.json").write_text(json.dumps({"a": [1, 2.5, None]}))
    assert outfiles.read_json(fd, "r.json") == {"a": [1, 2.5, None]}


@pytest.mark.parametrize("make, why", [
    (lambda p: os.symlink("/etc/passwd", p / "r.json"), "cannot be opened safely"),
    (lambda p: os.symlink("/dev/zero", p / "r.json"), "cannot be opened safely"),
    (lambda p: os.mkfifo(p / "r.json"), "not a regular file"),
    (lambda p: (p / "r.json").mkdir(), "not a regular file"),
    (lambda p: (p / "r.json").write_text("{not json"), "not valid JSON"),
    (lambda p: (p / "r.json").write_text("[" * 999), "not valid JSON"),
    (lambda p: (p / "r.json").write_bytes(b"\xff\xfe"), "not valid JSON"),
    (lambda p: ((p / "x").write_text("{}"), os.link(p / "x", p / "r.json")), "hard link"),
    (lambda p: (p / "r.json").write_text(" " * 2000), "over the"),
])
def test_hostile_files_are_refused_fast(out, make, why):
    path, fd = out
    make(path)
    t0 = time.perf_counter()
    with pytest.raises(Untrusted, match=why):
        outfiles.read_json(fd, "r.json", cap=1000)
    assert time.perf_counter() - t0 < 1.0


def test_a_missing_file_is_not_an_error_of_its_own(out):
    with pytest.raises(FileNotFoundError):
        outfiles.read_json(out[1], "absent.json")


def test_arrays_round_trip_and_lies_are_refused(out):
    path, fd = out
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.save(path / "a.npy", a, allow_pickle=False)
    assert np.array_equal(outfiles.read_array(fd, "a.npy"), a)
    np.save(path / "o.npy", np.array([object()], dtype=object), allow_pickle=True)
    with pytest.raises(Untrusted, match="dtype"):
        outfiles.read_array(fd, "o.npy")
    # a header that declares 10^12 elements over 48 bytes: refused before anything is allocated
    data = (path / "a.npy").read_bytes().replace(b"(3, 4)", b"(1000000, 1000000)")
    (path / "big.npy").write_bytes(data)
    with pytest.raises(Untrusted, match="declares shape"):
        outfiles.read_array(fd, "big.npy")
    (path / "junk.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(Untrusted, match="not a valid .npy"):
        outfiles.read_array(fd, "junk.npy")


def test_progress_tail_reads_only_the_end(out):
    path, fd = out
    (path / "progress.jsonl").write_text("x" * 100_000 + "\n" + "\n".join(json.dumps({"cell": str(i)}) for i in range(5)))
    lines = outfiles.tail_lines(fd, "progress.jsonl", cap=200)
    assert json.loads(lines[-1]) == {"cell": "4"} and all(len(line) < 200 for line in lines)
    os.unlink(path / "progress.jsonl")
    os.mkfifo(path / "progress.jsonl")
    assert outfiles.tail_lines(fd, "progress.jsonl") == []


def test_the_folder_itself_must_not_be_a_link(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "out")
    with pytest.raises(Untrusted):
        outfiles.open_dir(tmp_path / "out")
