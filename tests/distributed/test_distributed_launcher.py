"""run_ranks never hangs: a mismatched collective, a crashing rank and torch's DETAIL checker.

The three scenarios are started together in threads on first use (each spawn mostly waits: for
start-up, or for its timeout), and each test checks one of them.
"""
import time
from concurrent.futures import ThreadPoolExecutor

from ptinternals.distributed import RankFailedError, RankTimeoutError, run_ranks

from . import distributed_checks as dc

SCENARIOS = {
    "mismatch": (dc.mismatched_collectives, dict(timeout_s=2.0)),
    "detail": (dc.mismatched_collectives, dict(timeout_s=60.0, debug="DETAIL")),
    "dies": (dc.rank_dies, dict(timeout_s=60.0)),
}
_futures: dict = {}


def _timed(fn, kwargs):
    t0 = time.monotonic()
    try:
        run_ranks(fn, 2, **kwargs)
        return None, time.monotonic() - t0
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return exc, time.monotonic() - t0


def outcome(name: str):
    """(exception raised by run_ranks or None, seconds it took) for scenario ``name``."""
    if not _futures:
        pool = ThreadPoolExecutor(max_workers=len(SCENARIOS))
        for key, (fn, kwargs) in SCENARIOS.items():
            _futures[key] = pool.submit(_timed, fn, kwargs)
        pool.shutdown(wait=False)
    return _futures[name].result(timeout=300)


def test_mismatched_collective_times_out_naming_rank_and_collective():
    exc, elapsed = outcome("mismatch")
    assert isinstance(exc, RankTimeoutError), f"expected RankTimeoutError, got {exc!r}"
    msg = str(exc)
    assert "timed out" in msg and "every rank was killed" in msg
    # rank 0 is stuck in its 2nd collective, an all_reduce; rank 1 in a broadcast nobody else calls
    assert "rank 0 (still running): last collective all_reduce #2" in msg, msg
    assert "rank 1 (still running): last collective broadcast #2" in msg, msg
    assert msg.count("NEVER RETURNED") == 2
    assert elapsed < 120, f"run_ranks took {elapsed:.0f} s: it must give up after timeout_s (plus start-up)"


def test_debug_detail_reports_the_mismatch_at_once():
    exc, _ = outcome("detail")
    assert isinstance(exc, RankFailedError), f"expected RankFailedError, got {exc!r}"
    msg = str(exc)
    assert "Detected mismatch between collectives" in msg
    assert "OpType=ALLREDUCE" in msg and "OpType=BROADCAST" in msg


def test_a_dead_rank_is_named_and_nothing_hangs():
    exc, _ = outcome("dies")
    assert isinstance(exc, RankFailedError), f"expected RankFailedError, got {exc!r}"
    msg = str(exc)
    assert "rank 1 died with exit code 3" in msg, msg
