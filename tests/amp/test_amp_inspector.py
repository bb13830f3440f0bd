"""The autocast inspector and the policy tables, checked against what autocast really does."""

import pytest
import torch
import torch.nn.functional as F

from ptinternals.amp.autocast_policy import (
    BANNED,
    POLICIES,
    autocast_output_dtype,
    autocast_policy,
    dtype_name,
    registered_autocast_ops,
)
from ptinternals.amp.inspector import (
    AutocastDtypeMode,
    OpRecord,
    ProbeNet,
    inspect_autocast,
    layer_output_dtypes,
    predict_probe_dtypes,
    summarize,
)

LOW = [torch.bfloat16, torch.float16]
ALONE = ([], [])  # no other floating inputs


def test_linear_under_cpu_autocast():
    lin = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    recs = inspect_autocast(
        lambda: F.mse_loss(lin(x), torch.zeros(3, 4)), device_type="cpu", dtype=torch.bfloat16
    )
    assert all(isinstance(r, OpRecord) for r in recs)
    casts = [r for r in recs if r.op == "_to_copy" and r.output_dtype == "bfloat16"]
    assert len(casts) == 3  # x, weight, bias
    (mm,) = [r for r in recs if r.op == "addmm"]  # linear arrives decomposed: t + addmm
    assert mm == OpRecord("addmm", ("bfloat16", "bfloat16", "bfloat16"), "bfloat16")
    (loss,) = [r for r in recs if r.op == "mse_loss"]
    assert loss.input_dtypes == ("float32", "float32") and loss.output_dtype == "float32"
    assert summarize(recs)["float32"][-1] == "mse_loss"


def test_weight_cast_cache():
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8)

    def n_weight_casts(cache):
        recs = inspect_autocast(lambda: lin(lin(x)), dtype=torch.bfloat16, cache_enabled=cache)
        return sum(r.op == "_to_copy" and r.input_dtypes == ("float32",) for r in recs)

    assert n_weight_casts(True) == 3  # x, W, b once; the second use of W, b hits the cache
    assert n_weight_casts(False) == 5  # W and b cast again


def test_backward_runs_in_forward_dtypes():
    lin = torch.nn.Linear(8, 4)
    recs = inspect_autocast(lambda: lin(torch.randn(3, 8)).float().sum(), dtype=torch.float16, backward=True)
    mms = [r for r in recs if r.op == "mm"]  # backward matmuls: grad_input and grad_weight
    assert mms and all(r.output_dtype == "float16" for r in mms)
    assert recs[-1].op == "_to_copy" and recs[-1].output_dtype == "float32"  # grads cast back for fp32 leaves


def _probe_ops(device):
    """(aten op name for the policy table, callable on an (8, 8) input, extra fp32 inputs before/after it).

    Argument order matters for promote ops (autocast's ``prioritize`` walks them in order)."""
    w = torch.randn(8, 8, device=device)
    zeros = torch.zeros(8, 8, device=device)
    target = torch.zeros(8, dtype=torch.long, device=device)
    return [
        ("linear", lambda a: F.linear(a, w), ([], ["float32"])),
        ("matmul", lambda a: a @ a.t(), ALONE),
        ("mm", lambda a: torch.mm(a, a.t()), ALONE),
        ("bmm", lambda a: torch.bmm(a[None], a.t()[None]), ALONE),
        ("softmax", lambda a: F.softmax(a, -1), ALONE),
        ("log_softmax", lambda a: F.log_softmax(a, -1), ALONE),
        ("layer_norm", lambda a: F.layer_norm(a, (8,)), ALONE),
        ("gelu", F.gelu, ALONE),
        ("relu", F.relu, ALONE),
        ("exp", torch.exp, ALONE),
        ("sum", lambda a: a.sum(), ALONE),
        ("mse_loss", lambda a: F.mse_loss(a, zeros), ([], ["float32"])),
        ("cat", lambda a: torch.cat([a, zeros]), ([], ["float32"])),
        ("addcmul", lambda a: torch.addcmul(zeros, a, a), (["float32"], [None])),
        ("cross_entropy_loss", lambda a: F.cross_entropy(a, target), ALONE),
    ]


def _check_predictions(device, low, in_dtype):
    wrong = []
    for op, fn, extra in _probe_ops(device):
        x = torch.randn(8, 8, device=device).to(in_dtype)
        before, after = extra
        ins = before + [dtype_name(in_dtype)] + [dtype_name(in_dtype) if a is None else a for a in after]
        try:
            want = autocast_output_dtype(op, ins, device, low)
        except RuntimeError as e:  # predicted failure: autocast must fail the same way
            with pytest.raises(RuntimeError, match="prioritize"), torch.autocast(device, dtype=low):
                fn(x)
            assert "prioritize" in str(e)
            continue
        with torch.autocast(device, dtype=low):
            out = fn(x)
        if dtype_name(out.dtype) != want:
            wrong.append(f"{op}: predicted {want}, {device} autocast gave {dtype_name(out.dtype)}")
    assert not wrong, "; ".join(wrong)


@pytest.mark.parametrize("low", LOW, ids=dtype_name)
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=dtype_name)
def test_policy_predictions_match_cpu_autocast(low, in_dtype):
    _check_predictions("cpu", low, in_dtype)


@pytest.mark.parametrize("low", LOW, ids=dtype_name)
def test_probe_layer_dtypes_cpu(low):
    x, t = ProbeNet.example_inputs()
    got = layer_output_dtypes(ProbeNet(), x, t, device_type="cpu", dtype=low)
    want = predict_probe_dtypes("cpu", low)
    assert got == want, f"measured {got}, predicted {want}"
    n = dtype_name(low)
    assert want == {"fc1": n, "act": n, "norm": n, "fc2": n, "softmax": n, "loss_fn": "float32"}


@pytest.mark.gpu
@pytest.mark.parametrize("low", LOW, ids=dtype_name)
def test_probe_layer_dtypes_cuda(low):
    x, t = ProbeNet.example_inputs(device="cuda")
    got = layer_output_dtypes(ProbeNet().to("cuda"), x, t, device_type="cuda", dtype=low)
    n = dtype_name(low)
    want = {"fc1": n, "act": n, "norm": "float32", "fc2": n, "softmax": "float32", "loss_fn": "float32"}
    assert predict_probe_dtypes("cuda", low) == want
    assert got == want, f"ran on cuda: measured {got}, predicted {want}"


@pytest.mark.gpu
@pytest.mark.parametrize("low", LOW, ids=dtype_name)
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.float16], ids=dtype_name)
def test_policy_predictions_match_cuda_autocast(low, in_dtype):
    _check_predictions("cuda", low, in_dtype)


def test_cpu_and_cuda_policies_differ_where_documented():
    for op in ("softmax", "log_softmax", "layer_norm", "exp", "sum", "pow"):
        assert autocast_policy(op, "cpu") == "none" and autocast_policy(op, "cuda").startswith("fp32"), op
    for op in ("linear", "matmul", "bmm", "addmm", "conv2d", "scaled_dot_product_attention"):
        assert autocast_policy(op, "cpu") == autocast_policy(op, "cuda") == "lower_precision_fp", op
    assert autocast_policy("mse_loss", "cpu") == autocast_policy("aten.mse_loss.default", "cuda") == "fp32"
    assert autocast_policy("cat", "cpu") == "promote" and autocast_policy("cat", "cuda") == "none"
    assert autocast_policy("binary_cross_entropy", "cpu") == "fp32"
    with pytest.raises(RuntimeError, match="banned"):
        autocast_policy("binary_cross_entropy", "cuda")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_policy_lists_are_what_this_torch_registers(device):
    # every aten op with an Autocast<device> kernel has a policy, and none without one (2.13 and 2.11)
    listed = set().union(*POLICIES[device].values()) | set(BANNED[device])
    assert listed == set(registered_autocast_ops(device))


def test_version_and_build_differences_in_the_cuda_lists():
    torch_2_11 = torch.__version__.startswith("2.11.")
    assert autocast_policy("rms_norm", "cuda") == ("none" if torch_2_11 else "fp32")  # 2.13 added rms_norm
    cudnn = torch.backends.cudnn.is_available()  # a CUDA build with cuDNN registers AutocastRNN.cpp
    assert autocast_policy("_cudnn_rnn", "cuda") == ("fp16" if cudnn else "none")
    if cudnn:
        assert autocast_output_dtype("_cudnn_rnn", ["float32"], "cuda", "bfloat16") == "float16"


def test_mode_can_be_used_directly_and_ignores_detach():
    x = torch.randn(2, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16), AutocastDtypeMode() as mode:
        F.softmax(x, -1)
    assert [r.op for r in mode.records] == ["_softmax"]  # softmax saves its output: a detach, ignored
    with AutocastDtypeMode(ignore=()) as mode:
        torch.randn(2, 3, requires_grad=True).softmax(-1)
    assert "detach" in [r.op for r in mode.records]


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda: inspect_autocast(42), TypeError, "fn must be callable"),
        (lambda: inspect_autocast(lambda: None, device_type="tpu"), ValueError, "device_type must be"),
        (lambda: inspect_autocast(lambda: None, dtype=torch.float64), ValueError, "dtype must be"),
        (lambda: inspect_autocast(lambda: torch.ones(2), backward=True), ValueError, "backward=True needs"),
        (lambda: layer_output_dtypes("model"), TypeError, "model must be an nn.Module"),
        (lambda: autocast_policy("", "cpu"), TypeError, "op must be"),
        (lambda: autocast_policy("linear", "xla"), ValueError, "device_type must be"),
        (
            lambda: autocast_output_dtype("linear", ["float32"], "cpu", "float32"),
            ValueError,
            "autocast_dtype must be",
        ),
        (
            lambda: autocast_output_dtype("linear", [], "cpu", "bf16"),
            ValueError,
            "input_dtypes must be a non-empty",
        ),
        (lambda: autocast_output_dtype("linear", ["int64"], "cpu", "bf16"), ValueError, "floating-point"),
        (lambda: autocast_output_dtype("linear", ["float64"], "cpu", "bf16"), ValueError, "float64"),
        (lambda: dtype_name("float12"), ValueError, "dtype must be one of"),
        (lambda: summarize("records"), TypeError, "records must be a list"),
    ],
)
def test_invalid_inputs_raise_clear_errors(call, exc, words):
    with pytest.raises(exc, match=words):
        call()
