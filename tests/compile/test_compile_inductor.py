"""Inductor's output read back: kernels, what they fused, library calls; and the capstone compiled.

The expensive part of this chapter's tests: each compilation costs seconds (C++ generated and built),
so one function is compiled per module and every check reads that one result. The cache folder set in
``conftest.py`` makes repeated runs load the compiled kernels instead of building them."""
import pytest
import torch

from ptinternals.compile.inductor import (
    compile_and_read,
    extern_calls,
    generate_code,
    kernel_defs,
    kernel_ops,
    kernel_source,
)


def mm_between(x, w):
    h = x.sin() @ w                  # pointwise, then a library matmul
    return (h.relu() + 1).sum(-1)    # pointwise ops fused into the reduction that reads them


@pytest.fixture(scope="module")
def compiled():
    from torch._inductor import metrics

    metrics.reset()
    x, w = torch.randn(16, 24), torch.randn(24, 8)
    out = compile_and_read(mm_between, x, w, fusion=True)
    return out, (x, w), metrics.generated_kernel_count


def test_kernels_fusion_and_library_calls(compiled):
    out, (x, w), loop_nests = compiled
    torch.testing.assert_close(out.result, mm_between(x, w))
    assert len(out.code) == 1
    kernels = out.kernels
    assert [k.language for k in kernels] == ["cpp", "cpp"]
    assert [set(k.ops) for k in kernels] == [{"sin"}, {"add", "relu", "sum"}]
    # the ops read back from the names are the ops Inductor's scheduler fused (its nodes' origins)
    assert [(f"cpp_{name}", ops) for name, ops in out.fusion] == [(k.name.rsplit("_", 1)[0], k.ops) for k in kernels]
    assert out.extern == ["mm"]                        # the matmul is a library call, not generated
    assert loop_nests >= len(kernels)                  # metrics count loop nests, not functions


def test_code_written_without_building_is_the_code_compiled(compiled):
    """generate_code stops Inductor after codegen: same kernels, same fusion, same library calls as a real
    compile, and the Triton version fuses the same ops (under Triton's names)."""
    out, (x, w), _ = compiled
    written = generate_code(mm_between, x, w)
    assert written.result is None and [k.name for k in written.kernels] == [k.name for k in out.kernels]
    assert written.fusion == out.fusion and written.extern == out.extern == ["mm"]
    assert written.kernel_names == [k.name for k in out.kernels] and written.library == ["extern_kernels.mm"]
    triton = generate_code(mm_between, x, w, backend="triton")
    assert [k.language for k in triton.kernels] == ["triton", "triton"]
    assert [k.ops for k in triton.kernels] == [k.ops for k in out.kernels]
    assert triton.kernel_names[1].startswith("triton_per_fused_")       # a persistent reduction: one row per block
    assert "@triton.jit" in kernel_source(triton.code[0], triton.kernel_names[0])


SNIPPET = '''
cpp_fused_add_cos_0 = async_compile.cpp_pybinding(['const float*', 'float*'], r\'\'\'
extern "C" void kernel(const float* in_ptr0, float* out_ptr0) {}
\'\'\')
triton_per_fused__softmax_native_layer_norm_1 = async_compile.triton('triton_per_fused_...', \'\'\'...\'\'\')
def call(args):
    extern_kernels.addmm(arg0_1, arg1_1, arg2_1, alpha=1, beta=1, out=buf0)
    cpp_fused_add_cos_0(buf0, buf1)
    extern_kernels.bmm(buf1, buf1, out=buf2)
'''


def test_reading_output_code_without_compiling():
    defs = kernel_defs(SNIPPET)
    assert [(k.name, k.language, k.ops) for k in defs] == [
        ("cpp_fused_add_cos_0", "cpp", ("add", "cos")),
        ("triton_per_fused__softmax_native_layer_norm_1", "triton", ("_softmax", "native_layer_norm"))]
    assert extern_calls(SNIPPET) == ["addmm", "bmm"]
    assert kernel_ops("cpp_fused_not_an_op_here_0") == ("not_an_op_here",)   # unknown: returned whole
    assert kernel_defs("def call(args):\n    return ()") == []
    assert kernel_source(SNIPPET, "cpp_fused_add_cos_0").endswith("{}\n\'\'\')")
    with pytest.raises(ValueError, match="no kernel named 'nope'"):
        kernel_source(SNIPPET, "nope")
    for fn in (kernel_defs, extern_calls, kernel_ops):
        with pytest.raises(TypeError, match="must be a str"):
            fn(None)
    with pytest.raises(ValueError, match="mode must be a torch.compile mode"):
        compile_and_read(mm_between, mode="fastest")


def test_capstone_compiled_per_block_matches_eager():
    from ptinternals.compile.speed import compare_gpt, compile_blocks
    from ptinternals.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    tiny = GPT(GPTConfig(vocab_size=17, n_layer=2, n_head=2, n_embd=16, block_size=8, dropout=0.0))
    report = compare_gpt(tiny, batch=2, regional=True, reps=2)
    assert report.max_abs_diff < 1e-4 and report.seq_len == 8 and report.how.startswith("regional")
    assert report.eager_ms > 0 and report.compiled_ms > 0 and report.compile_s > 0
    assert "tok/s" in str(report)
    with pytest.raises(ValueError, match="seq_len must be <= block_size=8"):
        compare_gpt(tiny, seq_len=9)
    with pytest.raises(TypeError, match="ptinternals.gpt.GPT"):
        compare_gpt(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="blocks in model.transformer.h"):
        compile_blocks(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="batch must be a positive int"):
        compare_gpt(tiny, batch=0)


def test_regional_compilation_compiles_one_graph_for_every_block():
    from ptinternals.compile.backends import RecordingBackend
    from ptinternals.compile.speed import compile_blocks
    from ptinternals.gpt import GPT, GPTConfig

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, n_layer=3, n_head=2, n_embd=8, block_size=8, dropout=0.0)).eval()
    idx = torch.randint(0, 11, (2, 8))
    with torch.no_grad():
        want = model(idx)[0]
        rec = RecordingBackend()
        assert compile_blocks(model, backend=rec) is model
        torch.testing.assert_close(model(idx)[0], want)
    assert rec.graph_count == 1                       # three blocks, one compiled graph
    assert not any("embedding" in op for op in rec.graphs[0].ops)   # the embeddings stay eager
