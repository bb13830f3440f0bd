"""Red team, the grader's own inputs: everything in the sandbox's output folder is the student's to write.

Each hostile notebook tampers with what the harness wrote (results, arrays, progress) or with the folder
itself; the grader must refuse what it cannot trust (that exercise: "crashed"), never crash, hang or read a
host file, and the next student (the victim) must be graded normally right after.
"""

import pytest

from .redteam import ISOLATION, assert_victim_graded, body, grade, needs_bwrap, scored_zero

PLAIN = ("strides.contiguous_strides", "strides.storage_index")  # a run without torch or numpy
TENSORS = ("strides.sliding_windows", "strides.im2col")  # a run with torch, results with arrays
FIRST_RESULT = "/sandbox/out/strides.contiguous_strides.result.json" if ISOLATION == "bwrap" else None

# storage_index's answer, called second, tampers with contiguous_strides' result (already written), then answers
# right: contiguous_strides must be refused ("crashed"), storage_index graded normally.
STORAGE_INDEX_TAIL = """
def storage_index(index, shape, strides, offset):
    tamper()
    if len(index) != len(shape):
        raise IndexError("an index needs one entry per dim")
    for i, size in zip(index, shape):
        if not -size <= i < size:
            raise IndexError("index out of range")
    return offset + sum((i % size) * st for i, size, st in zip(index, shape, strides))
"""
TAMPER = {
    "fifo": "os.unlink(R); os.mkfifo(R)",
    "link_to_dev_zero": "os.unlink(R); os.symlink('/dev/zero', R)",
    "link_to_a_host_file": "os.unlink(R); os.symlink('/etc/passwd', R)",
    "directory": "os.unlink(R); os.mkdir(R)",
    "malformed_json": "open(R, 'w').write('{\"id\": ')",
    "deep_json": "open(R, 'w').write('[' * 5000)",
    "huge_sparse_file": "os.truncate(R, 60 << 20)",  # sparse, under the per-file limit, over the JSON cap
    "hard_link": "os.unlink(R); os.link('/sandbox/out/cells.json', R)",
    "seal_reused_on_new_content": ("mac, _, payload = open(R, 'rb').read().partition(b'\\n'); "
                                   "open(R, 'wb').write(mac + b'\\n' + payload.replace(b'\"ok\"', b'\"ok\" '))"),
    "forged_result_with_correct_answers": (
        "import json; job = json.load(open('/sandbox/job/job.json')); "
        "ex = [e for e in job['exercises'] if e['id'] == 'strides.contiguous_strides'][0]; "
        "open(R, 'wb').write(b'0' * 64 + b'\\n' + json.dumps({'id': ex['id'], 'status': 'ok', 'arrays': {}, 's': 0, "
        "'results': [{'__tuple__': [1] * len(c['args']['__tuple__'][0]['__tuple__'])} for c in ex['cases']]}).encode())"),
}


@needs_bwrap
@pytest.mark.parametrize("attack", sorted(TAMPER))
def test_a_tampered_result_file_is_refused_and_harms_no_one(attack, tmp_path):
    code = body(f"""
        import os
        R = {FIRST_RESULT!r}
        def tamper():
            if os.path.lexists(R) and not os.path.exists(R + '.done'):
                open(R + '.done', 'w').close()
                {TAMPER[attack]}
        """) + STORAGE_INDEX_TAIL
    results, report, seconds = grade("strides", {"storage_index_code": code}, PLAIN, tmp_path)
    scored_zero(results["strides.contiguous_strides"], "crashed")
    assert "refused" in results["strides.contiguous_strides"].message
    assert results["strides.storage_index"].passed, results["strides.storage_index"].message
    assert seconds < 30
    assert_victim_graded("strides", PLAIN, tmp_path)


@needs_bwrap
@pytest.mark.parametrize("attack, code", [
    ("array_header_lies", "import glob\n"
     "def tamper():\n    for p in glob.glob('/sandbox/out/strides.sliding_windows.*.npy'):\n"
     "        data = open(p, 'rb').read()\n        open(p, 'wb').write(data.replace(b'(', b'(1000000, ', 1))\n"),
    ("array_replaced", "import glob\n"
     "def tamper():\n    for p in glob.glob('/sandbox/out/strides.sliding_windows.*.npy'):\n"
     "        data = open(p, 'rb').read()\n        open(p, 'wb').write(data[:-4] + bytes(4))\n"),
])
def test_tampered_arrays_are_refused(attack, code, tmp_path):
    im2col = code + body("""
        def im2col(x, kernel_size, stride):
            tamper()
            c, h, w = x.shape
            kh, kw = kernel_size
            ho, wo = (h - kh) // stride + 1, (w - kw) // stride + 1
            sc, sh, sw = x.stride()
            return x.as_strided((c, kh, kw, ho, wo), (sc, sh, sw, stride * sh, stride * sw))
        """)
    results, _, _ = grade("strides", {"im2col_code": im2col}, TENSORS, tmp_path)
    scored_zero(results["strides.sliding_windows"], "crashed")
    assert results["strides.im2col"].passed, results["strides.im2col"].message


@needs_bwrap
def test_a_read_only_output_folder_crashes_only_this_submission(tmp_path):
    """The harness cannot write its results: nothing of the run is usable, and nothing else is touched."""
    code = body("""
        import os
        os.chmod('/sandbox/out', 0o500)
        def contiguous_strides(shape):
            s, r = [], 1
            for n in reversed(shape):
                s.append(r); r *= max(n, 1)
            return tuple(reversed(s))
        """)
    results, report, seconds = grade("strides", {"contiguous_strides_code": code}, PLAIN, tmp_path)
    for r in results.values():
        scored_zero(r, "crashed")
    assert report.sandbox_runs == 1 and seconds < 30, (report.sandbox_runs, seconds)
    assert_victim_graded("strides", PLAIN, tmp_path)


@needs_bwrap
def test_progress_lines_are_not_trusted(tmp_path):
    """Junk, unknown exercise ids, a forged "done" and a 20 MB progress file: no crash, no hang."""
    code = body("""
        import json, os, time
        def contiguous_strides(shape):
            with open('/sandbox/out/progress.jsonl', 'a') as f:
                f.write('not json\\n' * 200000)
                for step in ('strides.no_such_exercise', 'no_such_cell', 'strides.view_strides'):
                    f.write(json.dumps({'exercise': step, 't': 0, 'limit': 1e9}) + '\\n')
                f.write(json.dumps({'done': True}) + '\\n')
            time.sleep(60)
        """)
    results, report, seconds = grade("strides", {"contiguous_strides_code": code}, PLAIN, tmp_path)
    scored_zero(results["strides.contiguous_strides"])
    assert seconds < 30, f"a forged 'done' held the grader {seconds:.0f} s"
    assert_victim_graded("strides", PLAIN, tmp_path)


@needs_bwrap
def test_a_meta_tensor_result_is_a_wrong_answer_not_a_crash(tmp_path):
    code = body("""
        import torch
        def sliding_windows(x, size, step):
            return torch.empty(3, 4, device="meta")
        """)
    results, _, _ = grade("strides", {"sliding_windows_code": code}, TENSORS, tmp_path)
    scored_zero(results["strides.sliding_windows"], "wrong", "unsupported")
    assert results["strides.im2col"].passed


@needs_bwrap
def test_a_huge_result_costs_only_its_exercise(tmp_path):
    code = body("""
        import torch
        def sliding_windows(x, size, step):
            return torch.zeros(20_000_000)    # 80 MB: past the per-file limit of the output folder
        """)
    results, _, seconds = grade("strides", {"sliding_windows_code": code}, TENSORS, tmp_path)
    scored_zero(results["strides.sliding_windows"])
    assert results["strides.im2col"].passed
    assert seconds < 60


def _timing_attack(kind: str) -> str:
    return {
        # swallows every alarm, and keeps writing progress lines that claim fresh steps with huge limits
        "alarm_and_progress_games": body("""
            import json, signal, threading, time
            signal.signal(signal.SIGALRM, signal.SIG_IGN)
            def spam():
                while True:
                    with open('/sandbox/out/progress.jsonl', 'a') as f:
                        for step in ('contiguous_strides_code', 'strides.contiguous_strides', 'storage_index_code'):
                            f.write(json.dumps({'cell': step, 'exercise': step, 't': time.time(), 'limit': 1e9}) + '\\n')
                    time.sleep(0.05)
            threading.Thread(target=spam).start()
            def contiguous_strides(shape):
                while True:
                    try:
                        time.sleep(1)
                    except BaseException:
                        pass
            """),
        # non-daemon threads that never end (a few: the process limit counts threads too)
        "threads_that_never_end": body("""
            import threading, time
            for _ in range(5):
                threading.Thread(target=lambda: time.sleep(10**6)).start()
            def contiguous_strides(shape):
                s, r = [], 1
                for n in reversed(shape):
                    s.append(r); r *= max(n, 1)
                return tuple(reversed(s))
            """),
    }[kind]


@pytest.mark.parametrize("kind, passes, max_s", [("alarm_and_progress_games", False, 150),
                                                 ("threads_that_never_end", True, 30)])
def test_time_games_are_bounded(kind, passes, max_s, tmp_path):
    results, report, seconds = grade("strides", {"contiguous_strides_code": _timing_attack(kind)}, PLAIN, tmp_path)
    assert results["strides.contiguous_strides"].passed is passes, results["strides.contiguous_strides"].message
    assert seconds < max_s, f"{kind} held the grader {seconds:.0f} s"
    print(f"\n{kind}: graded in {seconds:.1f} s ({report.sandbox_runs} sandbox runs)")
    assert_victim_graded("strides", PLAIN, tmp_path)
