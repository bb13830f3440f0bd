"""Gradient accumulation equals one large-batch step, for even and uneven micro-batches."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from ptinternals.autograd.accumulation import accumulate_grads


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 11), nn.Tanh(), nn.Linear(11, 3)).double()


def batch(n: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g)


def full_batch_grads(model, loss_fn, x, y):
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@given(n=st.integers(1, 23), k=st.integers(1, 23), reduction=st.sampled_from(["mean", "sum"]))
def test_accumulation_equals_full_batch(n, k, reduction):
    k = min(k, n)
    model = make_model()
    x, y = batch(n)
    loss_fn = lambda out, target: TF.cross_entropy(out, target, reduction=reduction)  # noqa: E731
    expected_loss, expected = full_batch_grads(model, loss_fn, x, y)
    loss = accumulate_grads(model, loss_fn, x, y, k, reduction=reduction)
    torch.testing.assert_close(loss, expected_loss)
    for p, e in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, e)


def test_plain_one_over_k_is_wrong_for_uneven_micro_batches():
    """Why we weight by n_i / N: with 10 samples in 3 micro-batches (4, 3, 3), 1/k is biased."""
    model = make_model()
    x, y = batch(10)
    _, expected = full_batch_grads(model, TF.cross_entropy, x, y)
    model.zero_grad(set_to_none=True)
    for xs, ys in zip(torch.tensor_split(x, 3), torch.tensor_split(y, 3), strict=True):
        (TF.cross_entropy(model(xs), ys) / 3).backward()
    assert not all(torch.allclose(p.grad, e) for p, e in zip(model.parameters(), expected, strict=True))


def test_zero_grad_false_adds_to_existing_grads():
    model = make_model()
    x, y = batch(8)
    accumulate_grads(model, TF.cross_entropy, x, y, 2)
    once = [p.grad.clone() for p in model.parameters()]
    accumulate_grads(model, TF.cross_entropy, x, y, 4, zero_grad=False)
    for p, g in zip(model.parameters(), once, strict=True):
        torch.testing.assert_close(p.grad, 2 * g)


def test_accumulation_input_errors():
    model = make_model()
    x, y = batch(8)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        accumulate_grads(lambda t: t, TF.cross_entropy, x, y, 2)
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        accumulate_grads(model, "ce", x, y, 2)
    with pytest.raises(ValueError, match="same batch size"):
        accumulate_grads(model, TF.cross_entropy, x, y[:5], 2)
    with pytest.raises(ValueError, match=r"micro_batches must be in \[1, batch size = 8\], got 9"):
        accumulate_grads(model, TF.cross_entropy, x, y, 9)
    with pytest.raises(ValueError, match="micro_batches must be in"):
        accumulate_grads(model, TF.cross_entropy, x, y, 0)
    with pytest.raises(TypeError, match="micro_batches must be an int"):
        accumulate_grads(model, TF.cross_entropy, x, y, 2.0)
    with pytest.raises(ValueError, match="reduction must be"):
        accumulate_grads(model, TF.cross_entropy, x, y, 2, reduction="none")
    with pytest.raises(ValueError, match="empty"):
        accumulate_grads(model, TF.cross_entropy, x[:0], y[:0], 1)
    with pytest.raises(ValueError, match="one-element tensor"):
        accumulate_grads(model, lambda o, t: TF.cross_entropy(o, t, reduction="none"), x, y, 2)
    with pytest.raises(TypeError, match="batch_x must be a torch.Tensor"):
        accumulate_grads(model, TF.cross_entropy, x.tolist(), y, 2)
