"""GradScaler from scratch vs torch.amp.GradScaler("cpu"): kernels, trajectories, stage errors, clipping."""

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ptinternals.amp.grad_scaler import GradScaler
from ptinternals.amp.scaler_kernels import (
    amp_foreach_non_finite_check_and_unscale_,
    amp_update_scale_,
    update_scale,
)

scales = st.one_of(
    st.sampled_from([1.0, 2.0**16, 2.0**-20, 3.0e38, 1e-40]), st.floats(2.0**-100, 2.0**127, width=32)
)
factors_up = st.one_of(st.just(2.0), st.floats(1.0001, 8.0))
factors_down = st.one_of(st.just(0.5), st.floats(0.01, 0.9999))


@given(scales, st.integers(0, 5), st.booleans(), factors_up, factors_down, st.integers(1, 6))
def test_update_scale_matches_torch_kernel(scale, tracker, found, growth, backoff, interval):
    s = torch.tensor(scale, dtype=torch.float32)
    t = torch.tensor(tracker, dtype=torch.int32)
    torch._amp_update_scale_(s, t, torch.tensor(float(found)), growth, backoff, interval)
    got = update_scale(
        float(torch.tensor(scale, dtype=torch.float32)), tracker, found, growth, backoff, interval
    )
    assert got == (s.item(), t.item()), f"update_scale gave {got}, torch's kernel {(s.item(), t.item())}"
    # the in-place tensor version
    s2, t2 = torch.tensor(scale, dtype=torch.float32), torch.tensor(tracker, dtype=torch.int32)
    amp_update_scale_(s2, t2, torch.tensor(float(found)), growth, backoff, interval)
    assert (s2.item(), t2.item()) == (s.item(), t.item())


def test_update_scale_rules():
    assert update_scale(65536.0, 0, True) == (32768.0, 0)  # backoff, count restarts
    assert update_scale(65536.0, 1998, False) == (65536.0, 1999)
    assert update_scale(65536.0, 1999, False) == (131072.0, 0)  # 2000th good step: grow
    assert update_scale(3.0e38, 0, False, growth_interval=1) == (
        float(torch.tensor(3.0e38)),
        0,
    )  # never to inf


grad_values = st.one_of(
    st.floats(-1e3, 1e3, width=32),
    st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e38, 0.0, -0.0, 1e-30]),
)


@given(
    st.lists(grad_values, min_size=0, max_size=40),
    st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    st.sampled_from([1.0, 2.0**-16, 1 / 3, 0.1]),
    st.booleans(),
)
def test_unscale_kernel_matches_torch(values, dtype, inv, prefound):
    g_ref = torch.tensor(values, dtype=torch.float32).to(dtype)
    g_got = g_ref.clone()
    f_ref, f_got = torch.tensor(float(prefound)), torch.tensor(float(prefound))
    inv_t = torch.tensor(inv, dtype=torch.float32)
    torch._amp_foreach_non_finite_check_and_unscale_([g_ref], f_ref, inv_t)
    amp_foreach_non_finite_check_and_unscale_([g_got], f_got, inv_t)
    assert f_got.item() == f_ref.item(), f"found_inf {f_got.item()} != torch {f_ref.item()} for {values}"
    same = (g_got == g_ref) | (torch.isnan(g_got) & torch.isnan(g_ref))
    assert same.all(), f"unscaled grads differ: {g_got} vs {g_ref}"


# One scripted iteration: per-parameter multipliers c (loss = sum(w * c)), explicit unscale_ or not,
# clip or not, two micro-batches (accumulation) or one.
iteration = st.fixed_dictionaries(
    {
        "c1": st.lists(grad_values, min_size=3, max_size=3),
        "c2": st.lists(grad_values, min_size=2, max_size=2),
        "explicit_unscale": st.booleans(),
        "clip": st.sampled_from([None, 0.5]),
        "micro_batches": st.integers(1, 2),
    }
)


def _run(scaler_cls, script, init_scale, growth, backoff, interval):
    torch.manual_seed(0)
    w1 = torch.nn.Parameter(torch.randn(3))
    w2 = torch.nn.Parameter(torch.randn(2))
    opt = torch.optim.SGD([w1, w2], lr=0.01)
    scaler = scaler_cls(
        "cpu", init_scale=init_scale, growth_factor=growth, backoff_factor=backoff, growth_interval=interval
    )
    trace = []
    for it in script:
        opt.zero_grad(set_to_none=True)
        for _ in range(it["micro_batches"]):
            loss = (w1 * torch.tensor(it["c1"])).sum() + (w2 * torch.tensor(it["c2"])).sum()
            scaler.scale(loss).backward()
        if it["explicit_unscale"] or it["clip"]:
            scaler.unscale_(opt)
        if it["clip"]:
            torch.nn.utils.clip_grad_norm_([w1, w2], it["clip"])
        before = (w1.detach().clone(), w2.detach().clone())
        scaler.step(opt)
        skipped = torch.equal(before[0], w1.detach()) and torch.equal(before[1], w2.detach())
        scaler.update()
        trace.append(
            (
                scaler.get_scale(),
                scaler.state_dict()["_growth_tracker"],
                skipped,
                w1.detach().clone(),
                w2.detach().clone(),
            )
        )
    return trace


@settings(max_examples=30)
@given(
    st.lists(iteration, min_size=1, max_size=8),
    st.sampled_from([2.0**16, 2.0**30, 1.0, 2.0**120]),
    factors_up,
    factors_down,
    st.integers(1, 3),
)
def test_trajectory_equals_torch_gradscaler(script, init_scale, growth, backoff, interval):
    ours = _run(GradScaler, script, init_scale, growth, backoff, interval)
    ref = _run(torch.amp.GradScaler, script, init_scale, growth, backoff, interval)
    for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
        assert a[:3] == b[:3], (
            f"iteration {i}: (scale, growth_tracker, skipped) ours {a[:3]} vs torch {b[:3]}"
        )
        for pa, pb in zip(a[3:], b[3:], strict=True):
            assert torch.equal(pa, pb) or torch.equal(torch.isnan(pa), torch.isnan(pb)), (
                f"iteration {i}: params differ"
            )


def test_skipped_step_and_backoff_then_growth():
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=1.0)
    s = GradScaler("cpu", init_scale=8.0, growth_interval=2)
    for c, want_scale, want_w in [(float("inf"), 4.0, 1.0), (1.0, 4.0, 0.0), (1.0, 8.0, -1.0)]:
        opt.zero_grad()
        s.scale((w * c).sum()).backward()
        s.step(opt)
        s.update()
        assert s.get_scale() == want_scale and w[0].item() == want_w


def _one_backward(scaler, w, opt):
    opt.zero_grad()
    scaler.scale((w * 3).sum()).backward()


@pytest.mark.parametrize("cls", [GradScaler, torch.amp.GradScaler], ids=["ours", "torch"])
def test_stage_errors_like_torch(cls):
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    s = cls("cpu")
    _one_backward(s, w, opt)
    s.unscale_(opt)
    with pytest.raises(RuntimeError, match="unscale_\\(\\) has already been called on this optimizer"):
        s.unscale_(opt)
    s.step(opt)
    with pytest.raises(RuntimeError, match="unscale_\\(\\) is being called after step\\(\\)"):
        s.unscale_(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called since the last update\\(\\)"):
        s.step(opt)
    s.update()
    _one_backward(s, w, opt)
    s.unscale_(opt)  # allowed again after update()
    with pytest.raises(RuntimeError, match="Closure use is not currently supported"):
        s.step(opt, closure=lambda: None)


def test_unscale_divides_once_and_clipping_sees_true_gradients():
    """Clip after unscale_: the clipped grads equal those of an unscaled fp32 run."""
    torch.manual_seed(0)
    w_ref = torch.nn.Parameter(torch.randn(4))
    w = torch.nn.Parameter(w_ref.detach().clone())
    c = torch.tensor([3.0, -4.0, 12.0, 0.5])
    (w_ref * c).sum().backward()
    norm_ref = torch.nn.utils.clip_grad_norm_([w_ref], 1.0)
    opt = torch.optim.SGD([w], lr=0.1)
    s = GradScaler("cpu", init_scale=2.0**10)
    s.scale((w * c).sum()).backward()
    assert torch.equal(w.grad, c * 2.0**10)  # scaled
    s.unscale_(opt)
    norm = torch.nn.utils.clip_grad_norm_([w], 1.0)
    assert norm.item() == pytest.approx(norm_ref.item()) and torch.allclose(w.grad, w_ref.grad)
    # clipping BEFORE unscale_ would clip S*g to norm 1, then divide by S: a gradient 1024x too small
    assert norm.item() == pytest.approx(13.0 * math.sqrt(1 + 0.25 / 169))


def test_two_optimizers_share_found_inf():
    def run(cls):
        a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
        oa, ob = torch.optim.SGD([a], lr=1.0), torch.optim.SGD([b], lr=1.0)
        s = cls("cpu", init_scale=4.0)
        out = []
        for ca, cb in [(1.0, float("nan")), (1.0, 1.0), (float("inf"), 1.0)]:
            oa.zero_grad()
            ob.zero_grad()
            s.scale((a * ca).sum() + (b * cb).sum()).backward()
            s.step(oa)
            s.step(ob)
            s.update()
            out.append((s.get_scale(), a.tolist(), b.tolist()))
        return out

    got, ref = run(GradScaler), run(torch.amp.GradScaler)
    assert str(got) == str(ref)  # str: NaN == NaN


def test_state_dict_round_trip_and_interop_with_torch():
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    s = GradScaler("cpu", init_scale=2.0**8, growth_interval=3)
    for c in (1.0, float("inf"), 1.0):
        _one_backward(s, w, opt) if c == 1.0 else (opt.zero_grad(), s.scale((w * c).sum()).backward())
        s.step(opt)
        s.update()
    sd = s.state_dict()
    assert sd == {
        "scale": 128.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 3,
        "_growth_tracker": 1,
    }
    t = torch.amp.GradScaler("cpu")
    t.load_state_dict(sd)
    assert t.state_dict() == sd
    s2 = GradScaler("cpu")
    s2.load_state_dict(t.state_dict())
    assert s2.state_dict() == sd and s2.get_scale() == 128.0
    with pytest.raises(RuntimeError, match="empty"):
        s2.load_state_dict({})
    with pytest.raises(ValueError, match="missing keys"):
        s2.load_state_dict({"scale": 1.0})


def test_disabled_and_fp16_grads():
    w = torch.nn.Parameter(torch.ones(2))
    s = GradScaler("cpu", enabled=False)
    loss = (w * 2).sum()
    assert s.scale(loss) is loss and s.get_scale() == 1.0 and s.state_dict() == {}
    h = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
    oh = torch.optim.SGD([h], lr=0.1)
    s = GradScaler("cpu")
    s.scale((h.float() * 2).sum()).backward()
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        s.unscale_(oh)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA fallback")
def test_cuda_scaler_without_cuda_warns_and_disables():
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        s = GradScaler("cuda")
    assert not s.is_enabled() and any("CUDA is not available" in str(r.message) for r in rec)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"growth_factor": 1.0}, "growth_factor must be > 1.0"),
        ({"backoff_factor": 1.0}, "backoff_factor must be in"),
        ({"growth_interval": 0}, "growth_interval must be an int >= 1"),
        ({"init_scale": float("inf")}, "init_scale must be a finite float > 0"),
        ({"init_scale": -1.0}, "init_scale must be"),
    ],
)
def test_constructor_validates(kwargs, words):
    with pytest.raises(ValueError, match=words):
        GradScaler("cpu", **kwargs)


def test_other_invalid_inputs():
    s = GradScaler("cpu")
    with pytest.raises(RuntimeError, match="call scaler.scale\\(loss\\)"):
        s.update()
    with pytest.raises(ValueError, match="outputs must be a Tensor"):
        s.scale("loss")
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer"):
        s.scale(torch.ones(()))
        s.unscale_(object())
    with pytest.raises(TypeError, match="growth_tracker must be an int"):
        update_scale(1.0, 0.5, False)
    with pytest.raises(ValueError, match="growth_tracker must be >= 0"):
        update_scale(1.0, -1, False)
    with pytest.raises(ValueError, match="scale must be a 1-element"):
        amp_update_scale_(torch.ones(2), torch.zeros((), dtype=torch.int32), torch.zeros(()), 2.0, 0.5, 10)
    with pytest.raises(TypeError, match="grads\\[0\\] must be a floating-point tensor"):
        amp_foreach_non_finite_check_and_unscale_(
            [torch.ones(2, dtype=torch.int64)], torch.zeros(()), torch.ones(())
        )
    # a list of losses is scaled element-wise
    a, b = s.scale([torch.ones(()), (torch.ones(()), torch.ones(()))])
    assert a.item() == 2.0**16 and b[1].item() == 2.0**16
