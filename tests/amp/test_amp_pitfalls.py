"""The AMP chapter's "pitfalls" section, checked against the installed torch (2.11 and 2.13 alike)."""
import warnings

import pytest
import torch


def test_torch_cuda_amp_is_a_deprecated_alias():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.amp.GradScaler()
    assert any(issubclass(w.category, FutureWarning) and "torch.amp.GradScaler('cuda'" in str(w.message) for w in caught)


def test_grad_scaler_refuses_to_unscale_fp16_gradients():
    p = torch.nn.Parameter(torch.randn(3).half())
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale((p.float() * 2).sum()).backward()
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler.unscale_(opt)


def test_cuda_autocast_bans_binary_cross_entropy_but_not_the_logits_version():
    at = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCUDA)
    with pytest.raises(RuntimeError, match="unsafe to autocast"):
        torch.ops.aten.binary_cross_entropy.default.redispatch(at, torch.rand(3), torch.rand(3))
    dump = torch._C._dispatch_dump("aten::binary_cross_entropy_with_logits")
    assert "AutocastCUDA" in dump  # registered as an fp32 op, not a ban


def test_bf16_has_8_significant_bits():
    assert torch.finfo(torch.bfloat16).eps == 2.0**-7  # 7 stored mantissa bits + the implicit 1
    assert torch.tensor([256.0, 257.0, 1.003]).bfloat16().tolist() == [256.0, 256.0, 1.0]
