"""Activation checkpointing: same gradients as no checkpointing, fewer saved bytes, same dropout masks."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from ptinternals.autograd.checkpoint import checkpoint, checkpoint_with_hooks
from ptinternals.autograd.saved_tensors import saved_tensor_bytes

WIDTH, DEPTH, BATCH = 48, 4, 17  # non-power-of-two batch


def make_mlp(seed: int = 0, dropout: float = 0.2) -> nn.ModuleList:
    torch.manual_seed(seed)
    return nn.ModuleList(
        nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Dropout(dropout)) for _ in range(DEPTH)
    ).double()


def forward(blocks, x, mode: str):
    for block in blocks:
        if mode == "plain":
            x = block(x)
        elif mode == "reentrant":
            x = checkpoint(block, x)
        else:
            x = checkpoint_with_hooks(block, x)
    return x.pow(2).sum()


def grads_for(mode: str, x_requires_grad: bool = True, seed: int = 1):
    blocks = make_mlp()
    x = torch.randn(BATCH, WIDTH, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    x.requires_grad_(x_requires_grad)
    torch.manual_seed(seed)  # same dropout masks in every mode
    loss = forward(blocks, x, mode)
    loss.backward()
    return loss.detach(), [p.grad for p in blocks.parameters()] + ([x.grad] if x_requires_grad else [])


@pytest.mark.parametrize("mode", ["reentrant", "hooks"])
def test_checkpoint_gradients_equal_plain(mode):
    loss, expected = grads_for("plain")
    loss_ck, got = grads_for(mode)
    torch.testing.assert_close(loss_ck, loss)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


def test_without_rng_preservation_dropout_masks_differ():
    blocks = make_mlp(dropout=0.5)
    x = torch.randn(BATCH, WIDTH, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(3)
    forward(blocks, x, "plain").backward()
    expected = x.grad.clone()
    x.grad = None
    torch.manual_seed(3)
    loss = x
    for block in blocks:
        loss = checkpoint(block, loss, preserve_rng_state=False)
    loss.pow(2).sum().backward()
    assert not torch.allclose(x.grad, expected), "recomputed dropout drew new masks, gradients must differ"


def test_checkpoint_saves_fewer_activation_bytes():
    blocks = make_mlp().float()
    params = list(blocks.parameters())
    x = torch.randn(BATCH, WIDTH, requires_grad=True)
    plain = saved_tensor_bytes(lambda t: forward(blocks, t, "plain"), x, exclude=params)
    ckpt = saved_tensor_bytes(lambda t: forward(blocks, t, "reentrant"), x, exclude=params)
    act = BATCH * WIDTH * 4  # one float32 activation
    # Checkpointed: each block keeps only its input, plus the last output (saved by pow).
    assert ckpt == (DEPTH + 1) * act
    # Plain: per block at least the Linear input and the GELU input (plus dropout's mask: float32 on
    # CPU, bool on CUDA), plus the last output.
    assert plain >= (2 * DEPTH + 1) * act, f"plain {plain} bytes vs checkpointed {ckpt}"
    assert plain > 1.8 * ckpt
    # The hooks variant keeps no saved tensor at all (only Python ints); the inputs live in its closure.
    hooks = saved_tensor_bytes(lambda t: forward(blocks, t, "hooks"), x, exclude=params)
    assert hooks == BATCH * WIDTH * 4  # pow's input: the last block's output, saved outside any checkpoint


def test_reentrant_needs_an_input_that_requires_grad_hooks_does_not():
    blocks = make_mlp()
    x = torch.randn(BATCH, WIDTH, dtype=torch.float64)  # requires_grad=False, like token embeddings' input
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
        out = checkpoint(blocks[0], x)
    assert not out.requires_grad  # the parameters inside would get no gradient
    _, expected = grads_for("plain", x_requires_grad=False)
    _, got = grads_for("hooks", x_requires_grad=False)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


def test_autograd_grad_reentrant_raises_hooks_works():
    blocks = make_mlp(dropout=0.0)
    x = torch.randn(BATCH, WIDTH, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="does not work with torch.autograd.grad"):
        torch.autograd.grad(forward(blocks, x, "reentrant"), x)
    (expected,) = torch.autograd.grad(forward(blocks, x, "plain"), x)
    (got,) = torch.autograd.grad(forward(blocks, x, "hooks"), x)
    torch.testing.assert_close(got, expected)


def test_hooks_variant_supports_retain_graph_and_multiple_outputs():
    w = torch.randn(5, 5, dtype=torch.float64, requires_grad=True)
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)

    def block(t, scale):
        h = (t @ w).tanh()
        return h * scale, h.exp()

    a, b = checkpoint_with_hooks(block, x, 2.0)
    loss = (a * b).sum()
    loss.backward(retain_graph=True)
    first = w.grad.clone()
    loss.backward()  # the saved tensors are recomputed again
    torch.testing.assert_close(w.grad, 2 * first)
    w.grad = None
    a2, b2 = block(x, 2.0)
    (a2 * b2).sum().backward()
    torch.testing.assert_close(w.grad, first)


def test_reentrant_with_non_tensor_args_and_tuple_outputs():
    w = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)

    def block(t, n):
        h = t
        for _ in range(n):
            h = (h @ w).sigmoid()
        return h, h.sum(1)

    h, s = checkpoint(block, x, 3)
    (h.sum() + s.pow(2).sum()).backward()
    gw, gx = w.grad.clone(), x.grad.clone()
    w.grad = x.grad = None
    h, s = block(x, 3)
    (h.sum() + s.pow(2).sum()).backward()
    torch.testing.assert_close(gw, w.grad)
    torch.testing.assert_close(gx, x.grad)


def test_nondeterministic_block_is_detected():
    calls = [0]
    x = torch.randn(3, requires_grad=True)

    def block(t):
        calls[0] += 1
        return t.exp() if calls[0] == 1 else t.exp().exp()  # changes between forward and recompute

    out = checkpoint_with_hooks(block, x)
    with pytest.raises(RuntimeError, match="must run the same ops every time"):
        out.sum().backward()


def test_checkpoint_input_errors():
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(TypeError, match="fn must be callable"):
        checkpoint("layer", x)
    with pytest.raises(TypeError, match="fn must be callable"):
        checkpoint_with_hooks(None, x)
    with pytest.raises(TypeError, match="preserve_rng_state must be a bool"):
        checkpoint(torch.exp, x, preserve_rng_state="yes")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["reentrant", "hooks"])
def test_checkpoint_on_cuda_preserves_cuda_rng(mode):
    """On CUDA the dropout masks come from the CUDA generator: its state must be restored too."""
    blocks = make_mlp(dropout=0.5).cuda()
    x = torch.randn(BATCH, WIDTH, dtype=torch.float64, device="cuda", requires_grad=True)
    torch.manual_seed(11)
    forward(blocks, x, "plain").backward()
    expected = [p.grad.clone() for p in blocks.parameters()] + [x.grad.clone()]
    blocks.zero_grad(set_to_none=True)
    x.grad = None
    torch.manual_seed(11)
    forward(blocks, x, mode).backward()
    for g, e in zip([p.grad for p in blocks.parameters()] + [x.grad], expected, strict=True):
        torch.testing.assert_close(g, e)
