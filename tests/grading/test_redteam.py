"""Red team: hostile and broken submissions get exactly the right score, and nothing else is affected.

Each case replaces one answer cell of the (correct) the strides chapter solution with an attack and grades the
notebook through the trusted boundary. The attacked exercise must score 0 (or be graded normally,
when the attack is only noise), every other exercise graded in the same run keeps full marks, and
no attack leaves a trace outside the sandbox.
"""
import os
import textwrap
from pathlib import Path

import pytest

from ptinternals.grading.exercise import load_chapter
from ptinternals.grading.sandbox import Limits, SandboxConfig, bwrap_works
from ptinternals.grading.testing import ROOT
from ptinternals.grading.trusted import grade_notebook

from .conftest import submission

CH = load_chapter("strides")
GOOD_1_1 = "def contiguous_strides(shape):\n    s, r = [], 1\n    for n in reversed(shape):\n        s.append(r); r *= max(n, 1)\n    return tuple(reversed(s))\n"
ISOLATION = "bwrap" if bwrap_works("cpu")[0] else "process"
needs_bwrap = pytest.mark.skipif(ISOLATION != "bwrap", reason="needs bubblewrap (installed by .ci/run)")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="per-uid process limits need a root grader")
CANARY = ROOT / "autograder" / "PWNED-by-redteam"


def grade(replace, only=("strides.contiguous_strides", "strides.storage_index"), tmp=None, **kw):
    nb = submission(replace)
    limits = Limits(memory_mb=1536)  # the attacks target the torch-free group: a small limit is enough
    report = grade_notebook(nb, CH, tmp or ".", SandboxConfig(isolation=ISOLATION, limits=limits, **kw), only=set(only),
                            cell_timeout_s=8)
    return {e.id: e for e in report.exercises}, report


def body(code: str) -> str:
    return textwrap.dedent(code).strip() + "\n"


# attack on Exercise strides.contiguous_strides's answer cell -> (expected category of contiguous_strides or None if it must still pass)
ATTACKS = {
    "infinite_loop_in_function": (body("""
        def contiguous_strides(shape):
            while True:
                pass
        """), "timeout"),
    "infinite_loop_catching_everything": (body("""
        def contiguous_strides(shape):
            while True:
                try:
                    while True:
                        pass
                except BaseException:
                    pass
        """), "timeout"),
    "infinite_loop_at_top_level": (body("""
        def contiguous_strides(shape):
            return ()
        while True:
            pass
        """), "wrong"),
    "sys_exit_in_function": (body("""
        import sys
        def contiguous_strides(shape):
            sys.exit(0)
        """), "error"),
    "sys_exit_at_top_level": (GOOD_1_1 + "import sys\nsys.exit(0)\n", None),
    "os_exit_in_function": (body("""
        import os
        def contiguous_strides(shape):
            os._exit(0)
        """), "crashed"),
    "os_exit_at_top_level": (body("""
        import os
        os._exit(3)
        """), "missing"),
    "segfault": (body("""
        import ctypes
        def contiguous_strides(shape):
            return ctypes.string_at(0)
        """), "crashed"),
    "memory_bomb": (body("""
        def contiguous_strides(shape):
            hog = []
            while True:
                hog.append(bytearray(1 << 26))
        """), "memory"),
    "print_flood": (body("""
        def contiguous_strides(shape):
            while True:
                print("x" * 100000)
        """), "error"),
    "fake_passed_output": (body("""
        print("\\u2713 Exercise 1.1 (contiguous_strides): all 67 cases passed")
        def contiguous_strides(shape):
            print("\\u2713 passed")
            return (1,) * len(shape)
        """), "wrong"),
    "monkeypatch_torch_allclose": (body("""
        import torch
        torch.allclose = lambda *a, **k: True
        torch.equal = lambda *a, **k: True
        def contiguous_strides(shape):
            return (1,) * len(shape)
        """), "forbidden"),  # torch does not exist while this exercise is graded
    "monkeypatch_numpy": (body("""
        import numpy
        numpy.array_equal = lambda *a, **k: True
        numpy.allclose = lambda *a, **k: True
        def contiguous_strides(shape):
            return (1,) * len(shape)
        """), "forbidden"),
    "replace_the_checker": (body("""
        import ptinternals.grading
        ptinternals.grading.check = lambda *a, **k: None
        def check(*a, **k):
            return None
        def contiguous_strides(shape):
            return (1,) * len(shape)
        """), "wrong"),
    "always_equal_object": (body("""
        class Liar(tuple):
            def __eq__(self, other):
                return True
            def __ne__(self, other):
                return False
        def contiguous_strides(shape):
            return Liar((99,) * len(shape))
        """), "wrong"),
    "custom_object": (body("""
        class Anything:
            def __eq__(self, other):
                return True
        def contiguous_strides(shape):
            return Anything()
        """), "unsupported"),
    "call_the_reference": (body("""
        from ptinternals.strides.meta import contiguous_strides
        """), "missing"),
    "reference_via_sys_path": (body(f"""
        import sys
        sys.path.insert(0, {str(ROOT / 'src')!r})
        sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != '_Blocker']
        for m in [m for m in sys.modules if m.startswith('ptinternals')]:
            del sys.modules[m]
        from ptinternals.strides.meta import contiguous_strides
        """), "missing"),
    "use_forbidden_torch": (body("""
        import torch
        def contiguous_strides(shape):
            return tuple(torch.empty(shape).stride())
        """), "forbidden"),
    "monkeypatch_harness_encoder": (body("""
        import __main__, json
        __main__.encode = lambda *a, **k: [3, 1]
        json.dump = lambda *a, **k: None
        def contiguous_strides(shape):
            return (1,) * len(shape)
        """), "wrong"),
    "raise_keyboard_interrupt": (body("""
        def contiguous_strides(shape):
            raise KeyboardInterrupt
        """), "error"),
    "deep_recursion": (body("""
        def contiguous_strides(shape):
            return contiguous_strides(shape)
        """), "error"),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_is_contained(name, tmp_path):
    code, expected = ATTACKS[name]
    results, report = grade({"contiguous_strides_code": code}, tmp=tmp_path)
    ex11, ex12 = results["strides.contiguous_strides"], results["strides.storage_index"]
    assert ex12.passed and ex12.score == ex12.points, f"{name} cost another exercise its points: {ex12.message}"
    if expected is None:
        assert ex11.passed, ex11.message
    else:
        assert not ex11.passed and ex11.score == 0, f"{name} was not caught:\n{ex11.message}"
        assert ex11.category == expected, f"{name}: category {ex11.category}, expected {expected}\n{ex11.message}"


@needs_bwrap
def test_reading_solutions_and_gradebook_is_impossible(tmp_path):
    (ROOT / "autograder").mkdir(exist_ok=True)
    target = ROOT / "solutions" / "strides" / "strides.ipynb"
    code = body(f"""
        import json
        def contiguous_strides(shape):
            nb = json.load(open({str(target)!r}))   # the instructor's solution: not visible in the sandbox
            src = [c for c in nb['cells'] if c['metadata'].get('nbgrader', {{}}).get('grade_id') == 'contiguous_strides_code'][0]
            ns = {{}}
            exec(''.join(src['source']), ns)
            return ns['contiguous_strides'](shape)
        """)
    results, _ = grade({"contiguous_strides_code": code}, tmp=tmp_path)
    assert not results["strides.contiguous_strides"].passed
    assert "FileNotFoundError" in results["strides.contiguous_strides"].message


@needs_bwrap
def test_writes_outside_scratch_and_network_fail(tmp_path):
    code = body(f"""
        import socket
        def contiguous_strides(shape):
            open({str(CANARY)!r}, "w").write("pwned")   # outside the scratch folder
            socket.create_connection(("1.1.1.1", 80), timeout=2)
            return ()
        """)
    results, _ = grade({"contiguous_strides_code": code}, tmp=tmp_path)
    assert not CANARY.exists()
    assert not results["strides.contiguous_strides"].passed
    assert "Error" in results["strides.contiguous_strides"].message


@needs_bwrap
def test_no_network_inside(tmp_path):
    code = body("""
        import socket
        def contiguous_strides(shape):
            try:
                socket.create_connection(("1.1.1.1", 53), timeout=2)
                return (7,) * len(shape)            # network reachable: wrong answer
            except OSError as e:
                raise RuntimeError(f"no network: {e}")
        """)
    results, _ = grade({"contiguous_strides_code": code}, tmp=tmp_path)
    assert "no network" in results["strides.contiguous_strides"].message


@needs_root
def test_fork_bomb_is_contained(tmp_path):
    code = body("""
        import os
        def contiguous_strides(shape):
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
        """)
    results, report = grade({"contiguous_strides_code": code}, tmp=tmp_path)
    assert not results["strides.contiguous_strides"].passed
    assert results["strides.storage_index"].passed
    # nothing of the bomb survives the sandbox: no process is left under a sandbox uid nobody holds
    import fcntl

    from ptinternals.grading.sandbox import UID_BASE, UID_COUNT, UID_LOCK_DIR

    leftover = []
    for status in Path("/proc").glob("[0-9]*/status"):
        uid = _uid(status)
        if uid is None or not UID_BASE <= uid < UID_BASE + UID_COUNT - 16:
            continue
        with open(UID_LOCK_DIR / f"{uid}.lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free lock + live process = a leftover
                leftover.append(status)
                fcntl.flock(lock, fcntl.LOCK_UN)
            except BlockingIOError:
                pass  # another grader on this machine is using that uid right now
    assert not leftover


def _uid(status: Path) -> int | None:
    """The uid of a live process (None for a zombie: it is dead, only waiting to be reaped)."""
    try:
        lines = status.read_text().splitlines()
    except OSError:
        return None
    if any(line.startswith("State:") and line.split()[1] in ("Z", "X") for line in lines):
        return None
    return next((int(line.split()[1]) for line in lines if line.startswith("Uid:")), None)


def test_deleted_test_cell_is_reported_and_still_graded(tmp_path):
    nb = submission(delete=("contiguous_strides_tests",))
    report = grade_notebook(nb, CH, tmp_path, SandboxConfig(isolation=ISOLATION), only={"strides.contiguous_strides"})
    assert report.exercises[0].passed
    assert any("contiguous_strides_tests" in e and "missing" in e for e in report.events)


def test_correct_submission_keeps_full_marks(tmp_path):
    report = grade_notebook(submission(), CH, tmp_path, SandboxConfig(isolation=ISOLATION))
    assert all(e.passed for e in report.exercises), [e.message for e in report.exercises if not e.passed]
    assert report.score == sum(e.points for e in CH.exercises)
    assert not report.events


def test_student_notebook_scores_zero_everywhere(tmp_path):
    report = grade_notebook(submission(student_version=True), CH, tmp_path, SandboxConfig(isolation=ISOLATION))
    assert report.score == 0
    assert {e.category for e in report.exercises} == {"not-implemented"}


@pytest.mark.gpu
def test_gpu_out_of_memory_costs_only_its_exercise(tmp_path):
    code = body("""
        import torch
        def sliding_windows(x, size, step):
            hog = [torch.empty(1 << 34, dtype=torch.uint8, device="cuda") for _ in range(1000)]  # > any GPU
            return x
        """)
    results, _ = grade({"sliding_windows_code": code}, only=("strides.sliding_windows", "strides.im2col"), tmp=tmp_path,
                       device="cuda")
    assert not results["strides.sliding_windows"].passed
    assert "out of memory" in results["strides.sliding_windows"].message.lower()
    assert results["strides.im2col"].passed
