"""Tests of the tests: the autograd chapter's checkers accept the solution and reject every known bug; the
scaffold that graded code builds on works without the reference implementation."""
import subprocess
import sys
import textwrap

import pytest
import torch

from ptinternals.grading import CheckFailure, check, load_chapter
from ptinternals.grading.testing import namespace_with

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
