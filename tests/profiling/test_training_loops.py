"""The hidden-sync training loop and its fix: same losses, and the syncs the detector counts."""
import pytest
import torch

from ptinternals.profiling import SyncDetector
from ptinternals.profiling.training_loops import (
    make_batches,
    make_model,
    train_with_hidden_syncs,
    train_without_syncs,
)


def _run(train, batches, seed=0):
    with SyncDetector() as det:
        model = make_model(seed)
    det.events.clear()                                   # the model's own copy to the device is not the loop's
    with det:
        losses = train(model, batches)
    return losses, det


@pytest.mark.parametrize("steps, batch", [(4, 8), (1, 1), (3, 2)])
def test_fixed_loop_gives_the_same_losses_with_one_sync(steps, batch):
    batches = make_batches(steps, steps, batch, unlabelled=0.3 if batch > 1 else 0.0)
    slow, d_slow = _run(train_with_hidden_syncs, batches)
    fast, d_fast = _run(train_without_syncs, batches)
    assert fast == pytest.approx(slow, rel=1e-5, abs=1e-6)
    per_step = {"host_to_device": 2, "bool_mask_index": 2, "scalar_read": 2}
    slow_reasons = [e.reason for e in d_slow.implicit()]
    assert all(slow_reasons.count(r) == n * steps for r, n in per_step.items())
    assert [e.reason for e in d_fast.implicit()] == ["device_to_host"] and d_fast.stalls() == []


def test_no_steps_no_syncs():
    losses, det = _run(train_without_syncs, [])
    assert losses == [] and det.events == []


def test_a_batch_without_labels_raises_in_both_loops():
    batches = make_batches(0, 3, 4, all_unlabelled_at=1)
    for train in (train_with_hidden_syncs, train_without_syncs):
        with pytest.raises(ValueError, match="NaN"):
            _run(train, batches)


def test_pageable_non_blocking_copies_are_stalls():
    with SyncDetector() as det:
        x = torch.randn(4)
        x.to("cuda", non_blocking=True)
        x.pin_memory().to("cuda", non_blocking=True)
    assert [(e.kind, e.reason) for e in det.events] == [("stall", "pageable_async")]


def test_bad_arguments():
    with pytest.raises(ValueError, match="steps"):
        make_batches(0, -1)
    with pytest.raises(ValueError, match="unlabelled"):
        make_batches(0, 2, unlabelled=2.0)
    with pytest.raises(TypeError, match="rule"):
        SyncDetector(rule=3)
