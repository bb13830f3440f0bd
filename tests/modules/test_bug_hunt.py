"""The bug hunt: FixedNet fixes BrokenNet's plumbing without changing its arithmetic; checkpoints load or raise."""
from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from ptinternals.modules.bug_hunt import FixedNet, load_checkpoint
from ptinternals.modules.scaffold import BrokenNet

from .strategies import outcome


@settings(max_examples=12)
@given(st.integers(1, 4), st.integers(0, 3), st.integers(1, 6), st.integers(0, 5))
def test_fixed_net_same_arithmetic_registered_plumbing(dim, depth, T, seed):
    torch.manual_seed(seed)
    broken = BrokenNet(dim, depth, max_len=6)
    fixed = FixedNet(dim, depth, max_len=6)
    with torch.no_grad():  # copy every weight (the broken model's list is not in its state_dict)
        for b, f in zip([*broken.blocks, broken.norm], [*fixed.blocks, fixed.norm]):
            f.load_state_dict(b.state_dict())
    x = torch.randn(2, T, dim)
    assert torch.allclose(broken(x), fixed(x))
    assert [n for n, _ in fixed.named_parameters()] == \
        [f"blocks.{i}.{w}" for i in range(depth) for w in ("weight", "bias")] + ["norm.weight", "norm.bias"]
    assert list(broken.state_dict()) == ["scale", "norm.weight", "norm.bias"]  # the blocks were never saved
    assert "mask" in dict(fixed.named_buffers()) and "mask" not in fixed.state_dict()
    fired = []
    for block in fixed.blocks:
        block.register_forward_hook(lambda m, a, o: fired.append(1))
    fixed(x)
    assert len(fired) == depth
    assert fixed.to(torch.float64).mask.dtype == torch.float64


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))


class HasModuleChild(nn.Module):
    def __init__(self):
        super().__init__()
        self.module = nn.Linear(2, 2)  # a child really called "module"


class Compiled(nn.Module):
    """What torch.compile returns (OptimizedModule) as far as state_dict goes: the model as child _orig_mod.

    (Not torch.compile itself: importing dynamo costs ~10 s of this chapter's test budget. On torch 2.13,
    ``torch.compile(nn.Sequential(nn.Linear(2, 2))).state_dict()`` has the keys ``_orig_mod.0.weight``...)
    """

    def __init__(self, model):
        super().__init__()
        self._orig_mod = model


@pytest.mark.parametrize("wrap", ["bare", "dp", "compile", "dp_compile"])
def test_wrapped_checkpoints_load(wrap):
    source = model()
    for p in source.parameters():
        p.data.add_(1)
    wrapped = {"bare": lambda: source, "dp": lambda: nn.DataParallel(source), "compile": lambda: Compiled(source),
               "dp_compile": lambda: Compiled(nn.DataParallel(source))}[wrap]()
    ckpt = wrapped.state_dict()
    keys_before = list(ckpt)
    target = model()
    assert repr(load_checkpoint(target, ckpt)) == "<All keys matched successfully>"
    assert all(torch.equal(a, b) for a, b in zip(target.state_dict().values(), source.state_dict().values()))
    assert list(ckpt) == keys_before  # the caller's dict is untouched


def test_a_child_called_module_is_not_a_wrapper():
    source = HasModuleChild()
    target = HasModuleChild()
    load_checkpoint(target, source.state_dict())
    assert torch.equal(target.module.weight, source.module.weight)
    dp = nn.DataParallel(source).state_dict()  # "module.module.weight": one prefix to strip
    load_checkpoint(target, dp)
    del dp["module.module.bias"]  # one prefix helps, the second would not: strip once, then report the gap
    assert outcome(lambda: load_checkpoint(target, dp))[2].endswith('Missing key(s) in state_dict: "module.bias". ')


def test_missing_keys_raise_instead_of_loading_nothing():
    ckpt = OrderedDict((k, v) for k, v in model().state_dict().items() if "num_batches" not in k)
    ckpt._metadata = model().state_dict()._metadata  # version 2 BatchNorm: the key is required
    target = model()
    assert outcome(lambda: load_checkpoint(target, ckpt)) == outcome(lambda: model().load_state_dict(ckpt))
    assert "Missing key(s)" in outcome(lambda: load_checkpoint(target, ckpt))[2]
    renamed = OrderedDict(("encoder." + k, v) for k, v in model().state_dict().items())
    assert outcome(lambda: load_checkpoint(target, renamed))[0] == "raised"


def test_errors():
    with pytest.raises(TypeError, match="checkpoint must be a mapping"):
        load_checkpoint(model(), [1])
    with pytest.raises(TypeError, match="model must be a module with load_state_dict"):
        load_checkpoint(3, {})
