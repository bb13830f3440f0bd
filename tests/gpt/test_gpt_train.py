"""The trainer: schedule, a short run, exact resume from a checkpoint, memory report, CLI errors."""
import math

import pytest
import torch

from ptinternals.gpt import lr_at, make_config
from ptinternals.gpt.train import main, parse_args, train

from .gpt_helpers import tiny_config


def test_lr_schedule_is_nanogpts():
    cfg = make_config("cpu", dict(learning_rate=1e-3, min_lr=1e-4, warmup_iters=10, lr_decay_iters=110))
    assert lr_at(0, cfg) == pytest.approx(1e-3 / 11)
    assert lr_at(9, cfg) == pytest.approx(1e-3 * 10 / 11)
    assert lr_at(10, cfg) == pytest.approx(1e-3)
    assert lr_at(60, cfg) == pytest.approx(1e-4 + 0.5 * (1e-3 - 1e-4))
    assert lr_at(110, cfg) == lr_at(5000, cfg) == pytest.approx(1e-4)
    lrs = [lr_at(i, cfg) for i in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    with pytest.raises(ValueError, match="it must be"):
        lr_at(-1, cfg)


def _run(**changes):
    cfg = tiny_config(**{**dict(vocab_size=0, max_iters=6, eval_interval=3, eval_iters=1, batch_size=4,
                                block_size=16, n_embd=16, dropout=0.1), **changes})
    return train(cfg)


def test_resume_continues_exactly(tmp_path):
    straight = _run()
    first = _run(out_dir=str(tmp_path), max_iters=3)
    assert (tmp_path / "ckpt.pt").exists() and first.history["eval_iter"] == [0, 3]
    resumed = _run(out_dir=str(tmp_path), resume=True)
    assert resumed.history["loss"] == straight.history["loss"]           # same batches, same dropout
    assert resumed.history["val_loss"] == straight.history["val_loss"]
    for k, v in straight.model.state_dict().items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k
    with pytest.raises(ValueError, match="n_layer"):
        _run(out_dir=str(tmp_path), resume=True, n_layer=3)


def test_checkpoint_rng_holds_every_cuda_device(monkeypatch):
    """Issue 17: the checkpoint keeps the generator of every CUDA device (dropout on a GPU draws from its
    device's generator), and restores each one; a rank on a device the checkpoint lacks is refused. (The
    real thing on a GPU: tests/gpt/test_gpt_gpu.py::test_resume_on_cuda_continues_exactly.)"""
    from ptinternals.gpt import checkpoint as ck

    states = [torch.full((16,), 7, dtype=torch.uint8), torch.full((16,), 9, dtype=torch.uint8)]
    restored = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in states])
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, d: restored.__setitem__(d, s.clone()))
    g = torch.Generator().manual_seed(3)
    saved = ck.rng_state(torch.device("cuda", 1), g)
    assert [s.tolist() for s in saved["cuda"]] == [s.tolist() for s in states]
    cpu_before = torch.get_rng_state()
    torch.rand(5)
    ck.set_rng_state(saved, torch.device("cuda", 1), torch.Generator())
    assert torch.equal(torch.get_rng_state(), cpu_before)
    assert sorted(restored) == [0, 1] and all(torch.equal(restored[d], states[d]) for d in (0, 1))
    with pytest.raises(ValueError, match="no CUDA RNG state for cuda:1"):
        ck.set_rng_state(dict(saved, cuda=saved["cuda"][:1]), torch.device("cuda", 1), g)
    assert ck.rng_state(torch.device("cpu"), g)["cuda"] is not None  # CUDA started in this process: kept too
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert ck.rng_state(torch.device("cpu"), g)["cuda"] is None       # a CPU run that never touched CUDA


def test_short_run_learns_and_reports(capsys):
    result = _run(progress=True, memory_report=True, sample_tokens=20, max_iters=20, eval_interval=10,
                  log_interval=10, learning_rate=2e-2, min_lr=1e-3, warmup_iters=2, lr_decay_iters=20,
                  eval_iters=2)
    out = capsys.readouterr().out
    assert "peak allocated" in out and "CUDACachingAllocator" in out and "tok/s" in out
    assert result.history["val_loss"][-1] < result.history["val_loss"][0] - 0.3
    assert abs(result.history["val_loss"][0] - math.log(65)) < 0.15
    assert result.memory["peak_reserved"] >= result.memory["peak_allocated"] > result.memory["allocated_before"]
    assert len(result.sample) == 20 and result.tokens_per_s > 0


@pytest.mark.parametrize("argv, match", [
    (["--preset", "tpu"], "unknown preset"), (["--max_iters=ten"], "expected a int"),
    (["--n_layers=3"], "unknown config key"), (["--preset"], "needs a value"),
    (["max_iters=3"], "--key=value"), (["--kernels=cuda"], "unknown part"),
])
def test_cli_rejects_bad_input(argv, match, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert match in capsys.readouterr().err


def test_cli_help_and_parsing():
    with pytest.raises(SystemExit, match="usage"):
        main(["--help"])
    cfg = parse_args(["--preset=gpu", "--max_iters=3", "--kernels=flash"])
    assert cfg.n_layer == 6 and cfg.max_iters == 3 and cfg.kernels == "flash"
    with pytest.raises(TypeError):
        train({"max_iters": 1})
