"""Tests of the tests: the distributed chapter's checkers accept the solution, reject every known bug, and never hang.

The multi-rank checks fork their ranks (about 0.2 s each); the deadline for a stuck rank is shortened
here through ``PTINTERNALS_RANK_DEADLINE_S`` so the hang tests take seconds, not the default 12 s.
"""
import os
import time

import pytest

os.environ["PTINTERNALS_RANK_DEADLINE_S"] = "4"

import torch._dynamo  # noqa: E402,F401  (the probe imports it before its first fork; do it before timing)

from ptinternals.grading import CheckFailure, check, load_chapter  # noqa: E402
from ptinternals.grading.testing import answer_sources  # noqa: E402

from .buggy import BUGGY  # noqa: E402

CHAPTER = load_chapter("distributed")
_NS: dict = {}


def solution_namespace() -> dict:
    """The setup cell and every answer cell of the solution, executed (the answers use the setup's
    imports, which ``grading.testing.namespace_with`` does not run)."""
    if not _NS:
        _NS["__name__"] = "__main__"
        for gid, src in answer_sources(CHAPTER.assignment).items():  # notebook order, setup first
            exec(compile(src, f"<{gid}>", "exec"), _NS)
    return _NS


# ------------------------------------------------------------------------------------------------
# hangs and crashes: clear messages naming the rank and the call, never a hung checker
# ------------------------------------------------------------------------------------------------
HANGING_RING = """
def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:  # rank 0 waits for a message nobody sends
        inbox = torch.empty(1, dtype=tensor.dtype)
        dist.recv(inbox, src=n - 1)
"""

CRASHING_DDP = """
class NaiveDDP(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        if dist.get_rank() == 1:
            raise ValueError("rank 1 refuses")
        dist.broadcast(next(module.parameters()).data, src=0)

    def forward(self, x):
        return self.module(x)

    def finish_gradient_synchronization(self):
        pass
"""

DYING_RANK = """
def ring_all_reduce(tensor):
    import os
    if dist.get_rank() == 1:
        os._exit(3)
    dist.barrier()
"""


def _failure(ex_id: str, source: str) -> tuple[CheckFailure, float]:
    ns = dict(solution_namespace())
    exec(compile(source, "<cell ex6_x_code>", "exec"), ns)
    t0 = time.monotonic()
    with pytest.raises(CheckFailure) as info:
        check(ex_id, ns[CHAPTER.exercise(ex_id).entry], hidden=True)
    return info.value, time.monotonic() - t0


def test_a_hung_collective_is_named_and_stops_at_the_deadline():
    failure, elapsed = _failure("distributed.ring_all_reduce", HANGING_RING)
    text = str(failure)
    assert failure.category == "error"
    assert "RankHangError" in text and "timed out after 4 s" in text, text
    assert "rank 0: INSIDE recv #1" in text, text  # the rank, and the call it is stuck in
    assert "<cell ex6_x_code>" in text and "line 6" in text, text  # where, in the student's code
    assert "rank 1: finished" in text, text
    # the first case hangs for the deadline; every later case of the same entry fails at once
    assert elapsed < 4 + 6, f"took {elapsed:.1f} s"


def test_a_rank_that_raises_stops_the_others_at_once():
    failure, elapsed = _failure("distributed.naive_ddp", CRASHING_DDP)
    text = str(failure)
    assert "rank 1 raised ValueError: rank 1 refuses" in text, text
    assert "<cell ex6_x_code> line 7" in text, text
    assert "rank 0: INSIDE broadcast #1" in text, text
    assert elapsed < 8, f"a crash must not wait for the deadline (3 cases x 4 s; took {elapsed:.1f} s)"


def test_a_rank_that_dies_is_named():
    failure, _ = _failure("distributed.ring_all_reduce", DYING_RANK)
    assert "rank 1 died (exit code 3)" in str(failure), str(failure)


def test_probe_deadline_comes_before_the_sandbox_watchdog():
    from ptinternals.checks.probes import ranks as probe

    for ex in CHAPTER.exercises:
        if ex.probe and ex.probe.endswith("record_torch_calls"):
            continue
        spawns = len(ex.all_cases())
        if ex.id == "distributed.train_resume":
            spawns *= 3
        # a hang costs one deadline (later cases of the entry fail at once); slow-but-finishing code
        # may use every spawn's deadline: the exercise's limit must cover that, so the probe reports first
        assert ex.timeout_s >= probe.DEFAULT_DEADLINE_S * spawns, ex.id


def test_hidden_cases_cover_awkward_sizes():
    """World sizes 1-4, lengths 0, 1, < N and not divisible by N, non-contiguous and integer tensors."""
    ring = CHAPTER.exercise("distributed.ring_all_reduce")
    sizes = {c.args[0] for c in ring.all_cases()}
    assert sizes == {1, 2, 3, 4}
    tensors = [(c.args[0], t[0]) for c in ring.all_cases() for t in c.args[1]]
    assert any(x.numel() == 0 for _, x in tensors) and any(x.numel() == 1 for _, x in tensors)
    assert any(0 < x.numel() < n for n, x in tensors) and any(x.numel() % n for n, x in tensors if x.numel() > n)
    assert any(not x.is_contiguous() for _, x in tensors) and any(not x.is_floating_point() for _, x in tensors)
    assert any(x.numel() > 1000 for _, x in tensors)
    for ex_id in ("distributed.naive_ddp", "distributed.bucketed_ddp", "distributed.no_sync", "distributed.sharded_adamw", "distributed.fully_sharded"):
        assert {c.args[0] for c in CHAPTER.exercise(ex_id).all_cases()} >= {2, 3, 4}, ex_id
    zero = CHAPTER.exercise("distributed.sharded_adamw")
    cases, expected = zero.cases_and_expected()
    assert any(e["numel"] % c.args[0] for c, e in zip(cases, expected)), "a short last shard"
    assert any(e["numel"] % c.args[0] == 0 for c, e in zip(cases, expected)), "no padding at all"


def test_run_ranks_can_fork_a_function_defined_anywhere():
    from ptinternals.distributed import run_ranks

    def local(rank, world_size):  # not importable by name: only a forked rank can run it
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(rank)])
        dist.all_reduce(t)
        return t.item()

    assert run_ranks(local, 3, start_method="fork", timeout_s=30) == [3.0, 3.0, 3.0]
    with pytest.raises(TypeError, match="start_method='fork'"):
        run_ranks(local, 2)


# ------------------------------------------------------------------------------------------------
# the whole notebook through the trusted sandbox
# ------------------------------------------------------------------------------------------------
def _graded(replace: dict | None = None, student: bool = False):
    from ptinternals.grading.sandbox import SandboxConfig, bwrap_works
    from ptinternals.grading.testing import notebook_with
    from ptinternals.grading.trusted import grade_notebook

    nb = notebook_with(CHAPTER.assignment, replace, student=student)
    isolation = "bwrap" if bwrap_works("cpu")[0] else "process"
    t0 = time.monotonic()
    report = grade_notebook(nb, CHAPTER, ".", SandboxConfig(isolation=isolation))
    return {e.id: e for e in report.exercises}, report, time.monotonic() - t0


@pytest.mark.slow
def test_a_hang_and_a_bug_cost_only_their_exercises_through_the_sandbox(monkeypatch):
    monkeypatch.delenv("PTINTERNALS_RANK_DEADLINE_S")  # the sandbox sees a clean environment anyway
    results, report, seconds = _graded({"ring_all_reduce_code": HANGING_RING,
                                        "sharded_adamw_code": BUGGY["distributed.sharded_adamw"]["missing_grad_as_zero"][0]})
    ring = results["distributed.ring_all_reduce"]
    assert ring.score == 0 and ring.category == "error", ring.message
    assert "RankHangError" in ring.message and "rank 0: INSIDE recv #1" in ring.message, ring.message
    assert "line 6 in ring_all_reduce" in ring.message, ring.message
    zero = results["distributed.sharded_adamw"]
    assert zero.score == 0 and zero.category == "wrong" and "weight decay" in zero.message, zero.message
    others = [e for i, e in results.items() if i not in ("distributed.ring_all_reduce", "distributed.sharded_adamw")]
    assert all(e.passed and e.score == e.points for e in others), [e.message for e in others if not e.passed]
    assert report.sandbox_runs == 1 and not report.events, report.events
    assert seconds < 120, f"grading took {seconds:.0f} s"


@pytest.mark.slow
def test_student_notebook_scores_zero_everywhere_through_the_sandbox():
    results, report, _ = _graded(student=True)
    assert {e.category for e in results.values()} == {"not-implemented"}, \
        {i: e.message for i, e in results.items() if e.category != "not-implemented"}
    assert sum(e.score for e in results.values()) == 0
    assert not report.cell_errors, report.cell_errors
