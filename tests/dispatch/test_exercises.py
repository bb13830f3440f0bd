"""Tests of the tests: the dispatch chapter's checkers accept the solution and reject every known bug.

The dispatch chapter's answer cells use names from the locked setup cell (torch, ``KEY_PRIORITY``, ``Ref``...),
so the namespace here runs the setup cell first (``grading.testing.namespace_with`` skips it).
"""
import pytest

from ptinternals.grading import CheckFailure, check, load_chapter
from ptinternals.grading.testing import answer_sources

from .buggy import BUGGY

CHAPTER = load_chapter("dispatch")
def namespace(replace: dict | None = None) -> dict:
    """The solution notebook's setup and answer cells, executed in order (some answers replaced)."""
    ns: dict = {"__name__": "__main__"}
    for gid, src in answer_sources(CHAPTER.assignment).items():
        exec(compile((replace or {}).get(gid, src), f"<{gid}>", "exec"), ns)
    return ns


@pytest.fixture(scope="module")
def solution():
    return namespace()


def test_using_torch_where_forbidden_is_caught(solution):
    ns = dict(solution)
    exec("import torch\ndef tensor_keys(device='cpu', **kw):\n    return str(torch.ones(1))\n", ns)
    with pytest.raises(CheckFailure) as info:
        check("dispatch.tensor_keys", ns["tensor_keys"])
    assert info.value.category == "forbidden"


def test_hidden_cases_are_deterministic_and_awkward():
    for ex in CHAPTER.exercises:
        first = [c.call_text(ex.entry) for c in ex.hidden_cases()]
        assert first == [c.call_text(ex.entry) for c in ex.hidden_cases()], ex.id
    flops = [c.args[0] for c in CHAPTER.exercise("dispatch.flop_counter").hidden_cases()]
    sizes = {s for spec in flops for s in spec[1:] if isinstance(s, int)}
    assert 1 in sizes and any(s % 2 for s in sizes if s > 2)  # size-1 and odd (non-power-of-two) sizes
    op_shapes = [c.args[0] for c in CHAPTER.exercise("dispatch.custom_op").hidden_cases()]
    assert any(0 in s for s in op_shapes) and any(1 in s for s in op_shapes)
    paths = CHAPTER.exercise("dispatch.dispatch_path").hidden_cases()
    kinds = {c.label.split(":")[0] for c in paths}
    assert kinds == {"probe", "probe_", "probe_factory"}
    assert any(c.kwargs.get("modes", [None])[0] == "fake" for c in paths)


@pytest.mark.slow
def test_trusted_grading_of_a_submission(tmp_path):
    """The whole notebook through the sandbox: right answers score, two known bugs score 0 with a hint."""
    from ptinternals.grading.sandbox import SandboxConfig, bwrap_works
    from ptinternals.grading.testing import notebook_with
    from ptinternals.grading.trusted import grade_notebook

    bugs = {"flop_counter_code": BUGGY["dispatch.flop_counter"]["forgets_backward"],
            "custom_op_code": BUGGY["dispatch.custom_op"]["fake_wrong_dtype"]}
    nb = notebook_with(CHAPTER.assignment, {gid: source for gid, (source, _) in bugs.items()})
    isolation = "bwrap" if bwrap_works("cpu")[0] else "process"
    report = grade_notebook(nb, CHAPTER, tmp_path, SandboxConfig(isolation=isolation))
    results = {r.grade_id: r for r in report.exercises}
    for ex in CHAPTER.exercises:
        r = results[ex.grade_id]
        if ex.grade_id.replace("_tests", "_code") in bugs:
            expect = bugs[ex.grade_id.replace("_tests", "_code")][1]
            assert r.score == 0 and r.category == "wrong" and expect in r.message, r.message
        else:
            assert r.passed and r.score == ex.points, r.message


@pytest.mark.gpu
def test_memory_estimate_matches_a_real_cuda_run(solution):
    """On a GPU the truth of Exercise dispatch.memory_estimate is a real CUDA run; the parameters' bytes are what the caching
    allocator reports."""
    import torch

    from ptinternals.checks.dispatch import real_memory
    from ptinternals.checks.probes.dispatch import estimate_memory_probe, memory_model

    cases = [(("mlp", 16, 64, 4, "float32", False), (8, 16), "float32"),
             (("mlp", 100, 257, 3, "float32", True), (7, 100), "float32"),
             (("lm", 50, 16, "float32", True), (2, 9), "int64"),
             (("conv", 3, 5, 3, "float32"), (2, 3, 9, 9), "float32")]
    for spec, shape, dtype in cases:
        ours = estimate_memory_probe(solution["estimate_memory"], spec, shape, dtype, "cuda")
        assert ours == real_memory(spec, shape, dtype, "cuda", run_on="cuda"), spec
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        with torch.device("cuda"):
            model = memory_model(spec)
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() - before == ours["parameters"], spec
        del model
