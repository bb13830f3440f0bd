"""The C++ fused_bias_gelu (ptinternals.dispatch.cpp_op): a TORCH_LIBRARY schema and a CPU kernel built with
load_inline, fake and autograd from Python; and the grader's build helper (checks.probes.cpp_build).

Compiles C++ (about 10-20 s once per source on 2 cores; later runs reuse the build folder). Without a C++
compiler or ninja the build tests skip, saying which is missing; the no-compiler path is tested anyway."""
import pytest
import torch
import torch.nn.functional as F

from ptinternals.checks.probes import cpp_build
from ptinternals.dispatch import cpp_op
from ptinternals.grading.exercise import check

needs_compiler = pytest.mark.skipif(cpp_op.compiler_missing() is not None,
                                    reason=f"SKIPPED: {cpp_op.compiler_missing()}: the C++ operator is not built")


@needs_compiler
def test_cpp_kernel_matches_torch_and_passes_opcheck():
    with cpp_op.loaded(with_cuda=False) as op:
        origin = cpp_op.kernel_origin(op)
        assert origin["CPU"].endswith("[kernel]") and "main.cpp" in origin["CPU"], origin  # compiled C++
        assert cpp_op.build_root() in origin["CPU"]
        assert "autograd kernel" in origin["AutogradCPU"], origin
        for dtype in (torch.float32, torch.float64):
            x = torch.randn(6, 5, dtype=dtype).t()  # non-contiguous in, contiguous out
            b = torch.randn(6, dtype=dtype)
            out = op(x, b)
            torch.testing.assert_close(out, F.gelu(x + b))
            assert out.is_contiguous()
        assert op(torch.empty(0, 3), torch.randn(3)).shape == (0, 3)
        x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
        b = torch.randn(4, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(op, (x, b))
        result = torch.library.opcheck(op, (x, b))
        assert set(result.values()) == {"SUCCESS"}, result
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            fake = op(torch.empty(2, 7, 3), torch.empty(3))
        assert fake.shape == (2, 7, 3) and fake.is_contiguous()


@needs_compiler
def test_the_grader_builds_once_and_knows_a_cpp_kernel_from_a_python_one():
    ns = cpp_build.build(cpp_op.CPP_SOURCE)
    assert cpp_build.build(cpp_op.CPP_SOURCE) == ns == cpp_op.namespace_of(cpp_op.CPP_SOURCE)  # one scheme
    qualname = f"{ns}::fused_bias_gelu"
    assert cpp_build.kernel_origins(qualname)["CPU"] == ("kernel", "your C++")
    lib = torch.library.Library(ns, "FRAGMENT")
    try:
        lib.impl("fused_bias_gelu", lambda x, b: F.gelu(x + b), "CPU")  # the cheat: a Python kernel over it
        kind, origin = cpp_build.kernel_origins(qualname)["CPU"]
        assert origin != "your C++"
    finally:
        lib._destroy()
    assert cpp_build.kernel_origins(qualname)["CPU"] == ("kernel", "your C++")


@needs_compiler
def test_a_source_that_does_not_compile_reports_the_compiler_error():
    broken = cpp_op.CPP_SOURCE.replace("#include <ATen/ops/empty.h>", "#include <ATen/ops/empty_typo.h>")
    with pytest.raises(RuntimeError, match="did not build") as info:  # a missing header stops g++ at once
        cpp_build.build(broken)
    assert "main.cpp" in str(info.value) and "empty_typo.h" in str(info.value), str(info.value)


def test_without_a_compiler_the_exercise_says_skipped(monkeypatch, capsys):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    assert "C++ compiler" in cpp_build.compiler_missing() and "C++ compiler" in cpp_op.compiler_missing()
    check("dispatch.cpp_op", cpp_op.FusedBiasGeluCpp)
    out = capsys.readouterr().out
    assert "passed" in out and "SKIPPED: this machine has no C++ compiler" in out, out


def test_a_forged_skip_fails_where_the_grader_can_compile():
    from ptinternals.grading.exercise import get_exercise

    if cpp_build.compiler_missing() is not None:
        pytest.skip(f"SKIPPED: {cpp_build.compiler_missing()}")
    ex = get_exercise("dispatch.cpp_op")
    case = ex.visible_cases()[0]
    assert "has a C++ compiler" in ex.compare(case, {"skipped": "no compiler"}, ex.expected(case))


@pytest.mark.gpu
@pytest.mark.skipif(not cpp_op.cuda_build_available(), reason="needs a GPU and nvcc (CUDA_HOME)")
def test_cuda_kernel_registered_at_cuda_matches_torch():
    with cpp_op.loaded(with_cuda=True) as op:
        origin = cpp_op.kernel_origin(op)
        assert "main.cpp" in origin["CPU"] and "cuda.cu" in origin["CUDA"], origin
        for dtype in (torch.float32, torch.float64):
            x = torch.randn(300, 129, dtype=dtype, device="cuda").t()
            b = torch.randn(300, dtype=dtype, device="cuda")
            torch.testing.assert_close(op(x, b), F.gelu(x + b))
        x = torch.randn(8, 5, dtype=torch.float64, device="cuda", requires_grad=True)
        b = torch.randn(5, dtype=torch.float64, device="cuda", requires_grad=True)
        assert torch.autograd.gradcheck(op, (x, b))
        assert set(torch.library.opcheck(op, (x, b)).values()) == {"SUCCESS"}
