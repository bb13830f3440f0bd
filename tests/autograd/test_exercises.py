"""Tests of the tests: the autograd chapter's checkers accept the solution and reject every known bug; the
scaffold that graded code builds on works without the reference implementation."""
import subprocess
import sys
import textwrap

import pytest
import torch

from ptinternals.grading import CheckFailure, check, load_chapter
from ptinternals.grading.testing import likely_cause, namespace_with, rejects

from .buggy import BUGGY, GPU_BUGGY

CHAPTER = load_chapter("autograd")


def test_hidden_cases_are_many_and_awkward():
    for ex in CHAPTER.exercises:
        assert len(ex.hidden_cases()) >= 20, ex.id
    # the formulas and unbroadcast see size-0, size-1 and non-contiguous tensors
    tensors = [t for c in CHAPTER.exercise("autograd.formulas").hidden_cases() for t in c.args if isinstance(t, torch.Tensor)]
    assert any(t.numel() == 0 for t in tensors) and any(1 in t.shape for t in tensors)
    assert any(not t.is_contiguous() for t in tensors)
    # the engine's programs reuse values, hook, retain, and run backward twice
    steps = [s for c in CHAPTER.exercise("autograd.backward").hidden_cases() for s in c.args[2]]
    assert {"hook", "retain", "mulsg", "sum"} <= {s[0] for s in steps}


def test_formulas_may_not_call_torch_autograd():
    ns = namespace_with(CHAPTER.assignment)
    exec(textwrap.dedent("""
        def exp_backward(grad, result):
            x = result.log().requires_grad_(True)
            return torch.autograd.grad(x.exp(), x, grad)
        MY_FORMULAS["exp"] = exp_backward
    """), ns)
    with pytest.raises(CheckFailure, match="not available in this exercise"):
        check("autograd.formulas", ns["backward_formula"])


def test_checkpoint_may_not_call_torch_checkpoint():
    ns = namespace_with(CHAPTER.assignment)
    exec("import torch.utils.checkpoint\n"
         "def checkpoint(fn, x):\n    return torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=False)\n", ns)
    with pytest.raises(CheckFailure, match="not available in this exercise"):
        check("autograd.checkpoint", ns["checkpoint"])


def test_scaffold_runs_without_the_reference(tmp_path):
    """The sandbox ships only Chapter.sandbox_files: they must import nothing from the reference."""
    from ptinternals.grading.sandbox import build_site

    build_site(tmp_path, CHAPTER.sandbox_files)
    code = textwrap.dedent("""
        import sys, torch
        from ptinternals.autograd.scaffold import Variable, custom_op, gradient_edge, use_formulas
        a = Variable(torch.ones(2), requires_grad=True)
        y = (a * a).sum()
        assert y.grad_fn.name() == "SumBackward0"
        try:
            y.backward()
        except RuntimeError as e:
            assert "no backward engine is installed" in str(e)
        else:
            raise AssertionError("a backward engine was found")
        try:  # no formulas either: a node with no formula says how to plug one in
            y.grad_fn.next_functions[0][0].apply([Variable(torch.ones(2))])
        except RuntimeError as e:
            assert "use_formulas" in str(e)
        with use_formulas({"mul": lambda g, a, b: (g * b, g * a)}):
            grads = y.grad_fn.next_functions[0][0].apply([Variable(torch.ones(2))])
        assert len(grads) == 2
        z = custom_op("DoubleBackward", lambda t: 2 * t, lambda g, x: (g * 2.0,), a)
        assert gradient_edge(z)[0].name() == "DoubleBackward"
        loaded = sorted(m for m in sys.modules if m.startswith("ptinternals"))
        assert loaded == ["ptinternals", "ptinternals.autograd", "ptinternals.autograd.node",
                          "ptinternals.autograd.ops", "ptinternals.autograd.scaffold",
                          "ptinternals.autograd.variable"], loaded
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-I", "-S", "-c",
                             f"import sys; sys.path[:0] = [{str(tmp_path)!r}, {torch.__path__[0].rsplit('/', 1)[0]!r}]\n"
                             + code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def test_scaffold_and_probes_contain_no_solution():
    from pathlib import Path

    import ptinternals

    root = Path(ptinternals.__file__).parent
    texts = {f: (root / f).read_text() for f in CHAPTER.sandbox_files}
    texts["checks/probes/autograd.py"] = (root / "checks/probes/autograd.py").read_text()
    for name, text in texts.items():
        for marker in ("from .formulas", "from .engine", "import formulas", "import engine", "unbroadcast(",
                       "compute_dependencies", "fork_rng", "exp(x - out", "1 + a * (1 - s)", "tensor_split"):
            assert marker not in text, f"{name} contains {marker!r}"


def test_use_formulas_restores_missing_entries_and_use_backward_nests():
    from ptinternals.autograd.scaffold import BACKWARD_FORMULAS, Variable, use_backward, use_formulas

    saved = BACKWARD_FORMULAS.pop("neg")
    try:
        with use_formulas({"neg": lambda g: (-g,)}):
            assert "neg" in BACKWARD_FORMULAS
        assert "neg" not in BACKWARD_FORMULAS
    finally:
        BACKWARD_FORMULAS["neg"] = saved
    calls = []
    x = Variable(torch.ones(2), requires_grad=True)
    with use_backward(lambda *a: calls.append("outer")):
        with use_backward(lambda *a: calls.append("inner")):
            (x * 2.0).sum().backward()
        (x * 2.0).sum().backward()
    assert calls == ["inner", "outer"]


# ---- checkpointing on a GPU: dropout draws from the CUDA generator (issue 17) ------------------------------
GPU_BUGS = [(ex_id, name, src, expect) for ex_id, bugs in GPU_BUGGY.items() for name, (src, expect) in bugs.items()]


@pytest.mark.gpu
@pytest.mark.parametrize("ex_id, name, source, expect", GPU_BUGS, ids=[f"{b[0]}-{b[1]}" for b in GPU_BUGS])
def test_gpu_only_bug_is_rejected_on_a_gpu(ex_id, name, source, expect):
    failure = rejects(ex_id, source)
    assert failure is not None, f"{ex_id}: the checker accepted {name!r} on the GPU"
    assert "(ran on cuda" not in str(failure)
    hint = likely_cause(failure)
    assert hint is not None and expect in hint, str(failure)


def test_gpu_only_bugs_pass_on_the_cpu():
    """Why GPU_BUGGY exists: on the CPU, dropout draws from the CPU generator, which these bugs do restore."""
    if torch.cuda.is_available():
        pytest.skip("on a GPU these bugs are rejected (test_gpu_only_bug_is_rejected_on_a_gpu)")
    for ex_id, _name, source, _ in GPU_BUGS:
        assert rejects(ex_id, source) is None


def _dropout_block(device):
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Dropout(0.5),
                                torch.nn.Linear(16, 16), torch.nn.Dropout(0.5)).double().to(device)
    x = torch.randn(8, 16, dtype=torch.float64, device=device, requires_grad=True)
    return block, x


def _grads(block, x, run, seed=7):
    block.zero_grad(set_to_none=True)
    x.grad = None
    torch.manual_seed(seed)
    run(block, x).pow(2).sum().backward()
    return [x.grad.clone()] + [p.grad.clone() for p in block.parameters()]


def _checkpoints(source=None):
    ns = namespace_with(CHAPTER.assignment, {"checkpoint_code": source} if source else None)
    return ns["checkpoint"]


@pytest.mark.gpu
def test_checkpoint_with_dropout_on_a_cuda_input_matches_torch():
    """The solution and the reference give torch.utils.checkpoint's gradients for dropout on a CUDA input (masks
    from the CUDA generator); restoring only the CPU generator does not."""
    import torch.utils.checkpoint as tuc

    from ptinternals.autograd.checkpoint import checkpoint as reference

    block, x = _dropout_block("cuda")
    expected = _grads(block, x, lambda b, t: tuc.checkpoint(b, t, use_reentrant=True))
    plain = _grads(block, x, lambda b, t: b(t))
    for e, p in zip(expected, plain, strict=True):
        torch.testing.assert_close(e, p)  # torch's checkpoint replays the CUDA masks
    for run in (_checkpoints(), reference):
        for g, e in zip(_grads(block, x, run), expected, strict=True):
            torch.testing.assert_close(g, e)
    cpu_only = _checkpoints(GPU_BUGGY["autograd.checkpoint"]["cpu_rng_only"][0])
    assert not all(torch.allclose(g, e) for g, e in zip(_grads(block, x, cpu_only), expected, strict=True))


@pytest.mark.gpu
def test_checkpoint_is_graded_on_the_gpu_with_dropout():
    ex = CHAPTER.exercise("autograd.checkpoint")
    assert ex.gpu
    cases, expected = ex.cases_and_expected(hidden=True)
    assert any(c.args[3] > 0 and "cuda" in e for c, e in zip(cases, expected, strict=True))
    check("autograd.checkpoint", namespace_with(CHAPTER.assignment)["checkpoint"], hidden=True)


def test_checkpoint_on_the_cpu_matches_torch_utils_checkpoint():
    """The same comparison on the CPU: the solution replays the CPU generator as torch's reentrant checkpoint does."""
    import torch.utils.checkpoint as tuc

    block, x = _dropout_block("cpu")
    expected = _grads(block, x, lambda b, t: tuc.checkpoint(b, t, use_reentrant=True))
    for g, e in zip(_grads(block, x, _checkpoints()), expected, strict=True):
        torch.testing.assert_close(g, e)
    unrestored = _checkpoints(BUGGY["autograd.checkpoint"]["no_rng_restore"][0])
    assert not all(torch.allclose(g, e) for g, e in zip(_grads(block, x, unrestored), expected, strict=True))
