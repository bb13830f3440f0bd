"""Manual mixed precision vs torch.autocast + GradScaler; the fp16 underflow demonstration."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ptinternals.amp.grad_scaler import GradScaler
from ptinternals.amp.trainer import (
    UNDERFLOW_CONFIG,
    MLPConfig,
    init_mlp_params,
    make_regression_data,
    reference_autocast_train_steps,
    train_steps,
)

CFG = MLPConfig()
DATA = make_regression_data(CFG, n_batches=3, batch_size=16)


def _compare(ours, ref, rtol=1e-5):
    assert ours["skipped_steps"] == ref["skipped_steps"], (
        f"skipped steps {ours['skipped_steps']} vs autocast reference {ref['skipped_steps']}"
    )
    assert ours["scales"] == ref["scales"], f"scales {ours['scales']} vs reference {ref['scales']}"
    for i, (a, b) in enumerate(zip(ours["losses"], ref["losses"], strict=True)):
        assert a == pytest.approx(b, rel=rtol, abs=1e-12), f"step {i}: loss {a} vs reference {b}"
    for n in ref["final_params"]:
        assert torch.allclose(ours["final_params"][n], ref["final_params"][n], rtol=1e-4, atol=1e-6), n


@settings(max_examples=6)
@given(
    st.sampled_from([torch.bfloat16, torch.float16]),
    st.sampled_from([None, 2.0**16, 2.0**28]),
    st.integers(1, 3),
    st.sampled_from([None, 0.5]),
    st.integers(1, 3),
)
def test_manual_mixed_precision_matches_autocast(dtype, init_scale, accum, clip, growth_interval):
    def scaler(cls):
        return (
            None if init_scale is None else cls("cpu", init_scale=init_scale, growth_interval=growth_interval)
        )

    ours = train_steps(CFG, DATA, 6, dtype, scaler=scaler(GradScaler), clip=clip, accum=accum)
    ref = reference_autocast_train_steps(
        CFG, DATA, 6, dtype, scaler=scaler(torch.amp.GradScaler), clip=clip, accum=accum
    )
    _compare(ours, ref)


def test_overflowing_scale_skips_the_same_steps_as_torch():
    kw = dict(clip=1.0, accum=2)
    ours = train_steps(CFG, DATA, 8, torch.float16, scaler=GradScaler("cpu", init_scale=2.0**30), **kw)
    ref = reference_autocast_train_steps(
        CFG, DATA, 8, torch.float16, scaler=torch.amp.GradScaler("cpu", init_scale=2.0**30), **kw
    )
    assert len(ours["skipped_steps"]) >= 3, "a 2**30 scale must overflow fp16 gradients at first"
    assert ours["skipped_steps"] == list(range(len(ours["skipped_steps"])))  # skipped until S backed off
    _compare(ours, ref)


def test_fp32_and_torch_scaler_paths_work_too():
    a = train_steps(CFG, DATA, 3, torch.float32, optimizer="sgd", lr=0.05)
    b = reference_autocast_train_steps(CFG, DATA, 3, torch.float32, optimizer="sgd", lr=0.05)
    _compare(a, b, rtol=1e-6)
    c = train_steps(
        CFG, DATA, 3, torch.float16, scaler=torch.amp.GradScaler("cpu")
    )  # torch's scaler, duck-typed
    assert c["skipped_steps"] == [] and len(c["losses"]) == 3


def _improvement(result):
    first, last = result["losses"][:4], result["losses"][-4:]  # 4 batches = one pass over the data
    return sum(last) / sum(first)


def test_fp16_without_scaler_underflows_and_with_scaler_trains():
    data = make_regression_data(UNDERFLOW_CONFIG, n_batches=4, batch_size=32)
    no_scaler = train_steps(UNDERFLOW_CONFIG, data, 16, torch.float16)
    scaled = train_steps(UNDERFLOW_CONFIG, data, 16, torch.float16, scaler=GradScaler("cpu"))
    bf16 = train_steps(UNDERFLOW_CONFIG, data, 16, torch.bfloat16)
    fp32 = train_steps(UNDERFLOW_CONFIG, data, 16, torch.float32)
    # fp16, no scaler: every gradient element flushed to exactly zero, the weights never move
    assert all(f == 1.0 for f in no_scaler["zero_grad_fraction"]), no_scaler["zero_grad_fraction"][:3]
    assert _improvement(no_scaler) == pytest.approx(1.0)
    init = init_mlp_params(UNDERFLOW_CONFIG)
    for n, p in no_scaler["final_params"].items():
        assert torch.equal(p, init[n]), f"{n} moved although all its fp16 gradients were 0"
        assert not torch.equal(fp32["final_params"][n], init[n])  # in fp32 it moved
    # ... with the scaler (or in bf16, fp32's exponent range) it trains like fp32
    assert max(scaled["zero_grad_fraction"]) < 0.5
    for r in (scaled, bf16, fp32):
        assert _improvement(r) < 0.6, f"loss went from {r['losses'][:4]} to {r['losses'][-4:]}"
    assert scaled["skipped_steps"] == []


@pytest.mark.parametrize(
    "kwargs, exc, words",
    [
        (dict(dtype=torch.float64), ValueError, "dtype must be"),
        (dict(accum=0), ValueError, "accum must be an int >= 1"),
        (dict(clip=-1.0), ValueError, "clip must be None or a float > 0"),
        (dict(steps=-1), ValueError, "steps must be an int >= 0"),
        (dict(data=[]), ValueError, "data must be a non-empty list"),
        (dict(data=[(torch.randn(4, 3), torch.randn(4, 8))]), ValueError, "data\\[0\\] must be x"),
        (dict(cfg="mlp"), TypeError, "cfg must be an MLPConfig"),
        (dict(optimizer="lamb"), ValueError, "optimizer must be 'adam' or 'sgd'"),
    ],
)
def test_invalid_inputs_raise_clear_errors(kwargs, exc, words):
    args = dict(cfg=CFG, data=DATA, steps=1, dtype=torch.bfloat16)
    args.update(kwargs)
    with pytest.raises(exc, match=words):
        train_steps(args.pop("cfg"), args.pop("data"), args.pop("steps"), args.pop("dtype"), **args)


def test_config_validates():
    with pytest.raises(ValueError, match="d_hidden must be an int >= 1"):
        MLPConfig(d_hidden=0)
    with pytest.raises(ValueError, match="loss_weight must be a finite float > 0"):
        MLPConfig(loss_weight=0.0)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        make_regression_data(CFG, batch_size=0)


def test_master_weights_keep_small_updates_that_bf16_weights_lose():
    init = init_mlp_params(CFG)
    n = sum(p.numel() for p in init.values())
    kw = dict(optimizer="sgd", lr=1e-4)
    pure = train_steps(CFG, DATA, 8, torch.bfloat16, master_weights=False, **kw)
    mixed = train_steps(CFG, DATA, 8, torch.bfloat16, **kw)
    # lr * grad ~ 1e-5 is far below half an ulp of a bf16 weight ~0.1 (2**-11 ~ 5e-4): rounded away
    pure_moved = sum(int((pure["final_params"][k] != init[k].bfloat16().float()).sum()) for k in init)
    mixed_moved = sum(int((mixed["final_params"][k] != init[k]).sum()) for k in init)
    assert pure_moved / n < 0.05 and mixed_moved / n > 0.95, (pure_moved / n, mixed_moved / n)
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):  # torch's rule too
        train_steps(CFG, DATA, 1, torch.float16, master_weights=False, scaler=GradScaler("cpu"))


@pytest.mark.parametrize("frozen", [(), ("b1",), ("w1", "b1")])
def test_amp_train_with_frozen_masters_matches_autocast(frozen):
    """ptinternals.amp.trainer.amp_train (the exercise's twin) against torch.autocast + torch's GradScaler,
    with some masters frozen (requires_grad=False, still owned by the optimizer): those never move."""
    from ptinternals.amp.trainer import amp_train

    cfg = MLPConfig(d_in=6, d_hidden=10, d_out=3)
    data = make_regression_data(cfg, n_batches=2, batch_size=8)
    init = init_mlp_params(cfg)
    params = {n: p.clone().requires_grad_(n not in frozen) for n, p in init.items()}
    opt = torch.optim.Adam(list(params.values()), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=1)
    losses, skipped = amp_train(params, opt, data, 3, torch.float16, scaler=scaler, clip=0.5, accum=2)
    ref = reference_autocast_train_steps(cfg, data, 3, torch.float16, scaler=torch.amp.GradScaler(
        "cpu", init_scale=2.0**16, growth_interval=1), clip=0.5, accum=2, init=init, frozen=frozen)
    assert skipped == ref["skipped_steps"]
    assert losses == pytest.approx(ref["losses"], rel=1e-3)  # fp16 sums in another order: the checker's 0.1%
    for n, p in params.items():
        assert torch.allclose(p.detach(), ref["final_params"][n], rtol=1e-3, atol=1e-5), n
        if n in frozen:
            assert torch.equal(p.detach(), init[n]), f"{n} is frozen and moved"


def test_amp_train_and_frozen_names_validate():
    from ptinternals.amp.trainer import amp_train

    params = init_mlp_params(CFG)
    opt = torch.optim.SGD(list(params.values()), lr=0.1)
    with pytest.raises(ValueError, match="params must be a dict with keys b1, b2, w1, w2"):
        amp_train({"w1": params["w1"]}, opt, DATA, 1, torch.bfloat16)
    with pytest.raises(ValueError, match="accum must be an int >= 1"):
        amp_train(params, opt, DATA, 1, torch.bfloat16, accum=0)
    with pytest.raises(ValueError, match="frozen must name parameters among"):
        reference_autocast_train_steps(CFG, DATA, 1, torch.bfloat16, frozen=("w3",))
