"""On a GPU (run by autograder/gpu_check.sh): compiled Triton parts under bf16 autocast, CUDA memory
stats, and a short run of the gpu preset with every part switched on."""
import pytest
import torch

from ptinternals.gpt import make_config
from ptinternals.gpt.memory import measure_step_memory, resident_tensors

from .gpt_helpers import fixed_batches, tiny_config

pytestmark = pytest.mark.gpu


def _on_cuda(batches):
    return [(x.cuda(), y.cuda()) for x, y in batches]


def test_compiled_kernels_under_bf16_keep_the_trajectory():
    from ptinternals.gpt import GPT
    from ptinternals.gpt.train import train_step

    cfg = tiny_config(n_embd=64, n_head=4, block_size=32)
    batches = _on_cuda(fixed_batches(3, batch=8, cfg=cfg))
    runs = {}
    for kernels in ("none", "all", "softmax"):
        torch.manual_seed(0)
        model = GPT(cfg.replace(kernels=kernels)).cuda()
        opt = model.configure_optimizers("cuda")
        runs[kernels] = [train_step(model, opt, None, [b], torch.bfloat16, 1.0)[0] for b in batches]
    for kernels in ("all", "softmax"):
        torch.testing.assert_close(torch.tensor(runs[kernels]), torch.tensor(runs["none"]), rtol=2e-2, atol=2e-2)


def test_memory_report_reads_the_caching_allocator():
    from ptinternals.gpt import GPT
    from ptinternals.gpt.train import train_step

    cfg = tiny_config(n_embd=64, n_head=4, block_size=32)
    torch.manual_seed(0)
    model = GPT(cfg).cuda()
    opt = model.configure_optimizers("cuda")
    (x, y), = _on_cuda(fixed_batches(1, batch=8, cfg=cfg))
    _, report = measure_step_memory(lambda: train_step(model, opt, None, [(x, y)], torch.bfloat16, 1.0), "cuda",
                                    resident=resident_tensors(model, opt))
    assert "torch.cuda" in report["source"]
    assert report["peak_reserved"] >= report["peak_allocated"] > report["allocated_before"] > 0


def test_gpu_preset_short_run_with_every_part():
    from ptinternals.gpt.train import train

    cfg = make_config("gpu", dict(max_iters=30, lr_decay_iters=30, warmup_iters=5, eval_interval=15, eval_iters=4,
                                  kernels="all", checkpointing=True, sample_tokens=50, log_interval=10))
    result = train(cfg)
    assert result.device.startswith("cuda") and result.memory["source"].startswith("torch.cuda")
    assert result.history["val_loss"][-1] < result.history["val_loss"][0] - 0.5
    assert result.tokens_per_s > 0 and len(result.sample) == 50
