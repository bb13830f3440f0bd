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


def _cuda_run(**changes):
    from ptinternals.gpt.train import train

    cfg = tiny_config(**{**dict(vocab_size=0, max_iters=6, eval_interval=3, eval_iters=1, batch_size=4,
                                block_size=16, n_embd=16, dropout=0.2, device="cuda", memory_report=False),
                         **changes})
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):  # the math backend: dropout from the CUDA generator, no atomics in backward
        return train(cfg)


def test_resume_on_cuda_continues_exactly(tmp_path):
    """Issue 17: dropout on a GPU draws from the CUDA generator; the checkpoint saves and restores it (and
    every other device's), so the resumed run takes the uninterrupted run's steps bit for bit."""
    from ptinternals.gpt.checkpoint import load_checkpoint

    straight = _cuda_run()
    first = _cuda_run(out_dir=str(tmp_path), max_iters=3)
    assert first.device.startswith("cuda")
    ckpt = load_checkpoint(str(tmp_path / "ckpt.pt"))
    assert len(ckpt["rng"][0]["cuda"]) == torch.cuda.device_count()
    resumed = _cuda_run(out_dir=str(tmp_path), resume=True)
    assert resumed.history["loss"] == straight.history["loss"]
    for k, v in straight.model.state_dict().items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k
    # The same resume without the CUDA generators' states draws other dropout masks: the test can fail.
    ckpt["rng"][0]["cuda"] = [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())]
    torch.save(ckpt, tmp_path / "ckpt.pt")
    other = _cuda_run(out_dir=str(tmp_path), resume=True)
    assert other.history["loss"][3:] != straight.history["loss"][3:]
