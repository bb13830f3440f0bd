"""torchrun + this chapter's DDP: a run resumed from a checkpoint ends bit-identical to an uninterrupted one.

The uninterrupted 6-step run (saving at step 3) happens inside the 2-rank spawn of
test_distributed_ranks.py (``check_train``: the same script under ``run_ranks``); here one torchrun
launch resumes it from step 3 in fresh processes.
"""
import os
import subprocess
import sys

import torch

from . import distributed_checks as dc


def torchrun(cwd, *args, timeout=240):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "ptinternals.distributed.train_ddp", *args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_torchrun_resume_is_bit_identical_to_the_uninterrupted_run():
    uninterrupted = dc.suite_results(2)[0]["world"]["train"]
    assert "error" not in uninterrupted, uninterrupted.get("error")
    work = dc.WORKDIR
    ckpt = torch.load(os.path.join(work, "ckpt", "step3.pt"), weights_only=False)
    assert ckpt["step"] == 3 and ckpt["world_size"] == 2 and len(ckpt["rng"]) == 2
    assert not torch.equal(ckpt["rng"][0]["cpu"], ckpt["rng"][1]["cpu"]), "each rank's RNG stream is saved"
    out = torchrun(work, *dc.TRAIN_ARGS[:2], "--resume", "ckpt/step3.pt", "--out", "resumed.pt")
    assert "step 6/6" in out
    full = torch.load(os.path.join(work, "full.pt"), weights_only=False)
    resumed = torch.load(os.path.join(work, "resumed.pt"), weights_only=False)
    assert full["losses"] == uninterrupted["losses"]
    assert resumed["start"] == 3 and resumed["step"] == 6
    assert resumed["losses"] == full["losses"][3:], "a resumed run must see the same data, dropout, weights"
    for name, value in full["model"].items():
        assert torch.equal(value, resumed["model"][name]), f"{name} differs after resuming"
