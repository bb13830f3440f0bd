"""estimate_training_memory (FakeTensorMode) against real runs: CPU here, CUDA on the GPU machine."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from ptinternals.dispatch.fake_memory import (
    estimate_training_memory,
    fake_backward_supported,
    format_bytes,
    training_step_memory,
)
from ptinternals.dispatch.modes import round_cuda_allocation


class Attention(nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads, self.ln, self.qkv, self.out = heads, nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.out(a)
        return x + self.mlp(x)


def mlp(d_in=16, hidden=48, d_out=4):
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))


EXACT_KEYS = ("parameters", "gradients", "optimizer_state", "activations", "input", "baseline",
              "peak_forward", "peak")


@settings(max_examples=6)
@given(batch=st.sampled_from([1, 3, 8]), hidden=st.sampled_from([5, 48]))
def test_fake_estimate_equals_a_real_cpu_step(batch, hidden):
    est = estimate_training_memory(lambda: mlp(hidden=hidden), (batch, 16), device="cpu")
    torch.manual_seed(0)
    real = training_step_memory(mlp(hidden=hidden), torch.randn(batch, 16))
    assert {k: est[k] for k in EXACT_KEYS} == {k: real[k] for k in EXACT_KEYS}
    assert est["traced_on"] == "cpu"


def test_mlp_numbers_by_hand():
    b, d_in, h, d_out = 8, 16, 48, 4
    est = estimate_training_memory(lambda: mlp(d_in, h, d_out), (b, d_in), device="cpu")
    n_params = d_in * h + h + h * d_out + d_out
    assert est["parameters"] == est["gradients"] == 4 * n_params
    assert est["optimizer_state"] == 2 * 4 * n_params  # AdamW: exp_avg + exp_avg_sq
    # saved for backward, beyond params and input: the ReLU output [b, h] (saved by ReLU and by addmm, once)
    assert est["activations"] == 4 * b * h
    assert est["peak"] >= est["baseline"] + est["activations"] + est["gradients"]


def test_attention_block_estimate_equals_a_real_cpu_step():
    est = estimate_training_memory(lambda: Attention(), (2, 8, 32), device="cpu")
    torch.manual_seed(0)
    real = training_step_memory(Attention(), torch.randn(2, 8, 32))
    assert {k: est[k] for k in EXACT_KEYS} == {k: real[k] for k in EXACT_KEYS}


def test_cuda_estimate_rounds_like_the_caching_allocator():
    cpu = estimate_training_memory(lambda: mlp(), (3, 16), device="cpu")
    cuda = estimate_training_memory(lambda: mlp(), (3, 16), device="cuda")
    assert cuda["device"] == "cuda:0" or cuda["device"] == "cuda"
    assert cuda["traced_on"] == ("cuda" if fake_backward_supported("cuda") else "cpu")
    # four parameters, each its own storage rounded up to 512 B
    sizes = [16 * 48 * 4, 48 * 4, 48 * 4 * 4, 4 * 4]
    assert cuda["parameters"] == sum(round_cuda_allocation(s) for s in sizes)
    assert cuda["parameters"] >= cpu["parameters"] and cuda["peak"] >= cpu["peak"]


def test_fake_cuda_backward_needs_a_visible_gpu_not_just_a_cuda_build():
    # torch 2.11's PyPI wheel is a CUDA build; on a CPU machine its autograd engine rejects device 0
    assert fake_backward_supported("cuda") == torch.cuda.is_available()
    assert not fake_backward_supported(f"cuda:{torch.cuda.device_count()}")  # one past the last GPU
    assert fake_backward_supported("cpu") and fake_backward_supported("meta")


def test_bf16_and_token_inputs():
    est = estimate_training_memory(lambda: nn.Sequential(nn.Embedding(100, 16), nn.Linear(16, 100)), (4, 10),
                                   device="cpu", dtype=torch.bfloat16, input_dtype=torch.long)
    assert est["parameters"] == 2 * (100 * 16 + 16 * 100 + 100)
    assert est["input"] == 4 * 10 * 8


def test_activations_match_a_real_saved_tensor_count():
    """Independent of the estimator's code path: count what autograd saves on a real CPU forward."""
    torch.manual_seed(0)
    model, x = Attention(), torch.randn(2, 8, 32)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        model(x).float().mean()
    skip = {x.untyped_storage().data_ptr()} | {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved}
    expected = sum(n for ptr, n in storages.items() if ptr not in skip)
    assert estimate_training_memory(lambda: Attention(), (2, 8, 32), device="cpu")["activations"] == expected


def test_invalid_inputs():
    with pytest.raises(TypeError, match="callable"):
        estimate_training_memory(mlp(), (2, 16))
    with pytest.raises(ValueError, match="input_shape"):
        estimate_training_memory(mlp, (2, -1))
    with pytest.raises(TypeError, match="floating-point"):
        estimate_training_memory(mlp, (2, 16), dtype=torch.int32)
    with pytest.raises(TypeError, match="nn.Module"):
        estimate_training_memory(lambda: "model", (2, 16), device="cpu")
    with pytest.raises(TypeError, match="nn.Module"):
        training_step_memory("model", torch.zeros(1))
    assert format_bytes(512) == "512 B" and format_bytes(3 * 1024**2) == "3.0 MiB"


@pytest.mark.gpu
def test_estimate_predicts_cuda_max_memory_allocated():
    """The estimate (fake CUDA tensors, allocator rounding) against a real step's max_memory_allocated.
    Kernel workspaces (cuBLAS) are invisible to the estimate, so allow 10% + 8 MiB."""
    def model_fn():
        return nn.Sequential(*[Attention(d=256, heads=8) for _ in range(4)])

    shape = (8, 256, 256)
    est = estimate_training_memory(model_fn, shape, device="cuda")
    assert est["traced_on"] == "cuda"
    torch.manual_seed(0)
    real = training_step_memory(model_fn().cuda(), torch.randn(shape, device="cuda"), round_to_cuda=True)
    for key in ("parameters", "gradients", "optimizer_state", "activations"):
        assert est[key] == real[key], key
    measured = real["cuda_max_allocated"]
    assert abs(est["peak"] - measured) <= 0.10 * measured + 8 * 2**20, (est["peak"], measured)
