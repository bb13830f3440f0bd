"""Traversal and checkpoint keys: the reference walks generated trees exactly as torch.nn.Module does."""
from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from ptinternals.modules import MiniModule, build_tree, example_spec

from .strategies import both, index_of, tree_specs


def aliasing(named) -> list:
    """For each yielded tensor, the position of the first yield of the same object (the tying pattern)."""
    seen: dict = {}
    return [seen.setdefault(id(t), k) for k, (_, t) in enumerate(named)]


def module_path(named, nodes) -> list:
    idx = index_of(nodes)
    return [(name, idx[id(m)]) for name, m in named]


@given(tree_specs(), st.sampled_from(["", "model", "a.b"]), st.booleans())
def test_named_modules_match_torch(spec, prefix, remove_duplicate):
    tn, mn = both(spec)
    assert module_path(tn[0].named_modules(prefix=prefix, remove_duplicate=remove_duplicate), tn) == \
        module_path(mn[0].named_modules(prefix=prefix, remove_duplicate=remove_duplicate), mn)
    assert [n for n, _ in tn[0].named_children()] == [n for n, _ in mn[0].named_children()]
    assert len(list(tn[0].modules())) == len(list(mn[0].modules()))


@given(tree_specs(), st.sampled_from(["", "model"]), st.booleans(), st.booleans())
def test_named_parameters_and_buffers_match_torch(spec, prefix, recurse, remove_duplicate):
    tn, mn = both(spec)
    for method in ("named_parameters", "named_buffers"):
        t = list(getattr(tn[0], method)(prefix=prefix, recurse=recurse, remove_duplicate=remove_duplicate))
        m = list(getattr(mn[0], method)(prefix=prefix, recurse=recurse, remove_duplicate=remove_duplicate))
        assert [n for n, _ in t] == [n for n, _ in m], method
        assert aliasing(t) == aliasing(m), method
        assert all(torch.equal(a, b) and a.requires_grad == b.requires_grad for (_, a), (_, b) in zip(t, m))
    assert len(list(tn[0].parameters())) == len(list(mn[0].parameters()))
    assert len(list(tn[0].buffers(recurse=False))) == len(list(mn[0].buffers(recurse=False)))


@given(tree_specs(), st.booleans())
def test_state_dict_keys_order_and_metadata_match_torch(spec, keep_vars):
    tn, mn = both(spec)
    t, m = tn[0].state_dict(keep_vars=keep_vars), mn[0].state_dict(keep_vars=keep_vars)
    assert list(t) == list(m)
    assert t._metadata == m._metadata
    for key in t:
        assert torch.equal(t[key], m[key]) and t[key].dtype == m[key].dtype
        assert t[key].requires_grad == m[key].requires_grad  # detached unless keep_vars
    # values alias the module's tensors (no copy), tied parameters appear under every name
    for key, value in m.items():
        owner = mn[0].get_submodule(key.rpartition(".")[0])
        leaf = key.rpartition(".")[2]
        live = owner._parameters.get(leaf, owner._buffers.get(leaf))
        assert value.data_ptr() == live.data_ptr()
    assert list(tn[0].state_dict(prefix="net.")) == list(mn[0].state_dict(prefix="net."))


@given(tree_specs(), st.booleans())
def test_train_eval_reach_every_module(spec, mode):
    tn, mn = both(spec)
    tn[0].train(mode)
    mn[0].train(mode)
    assert [m.training for m in tn] == [m.training for m in mn] == [mode] * len(tn)
    tn[0].eval()
    mn[0].eval()
    assert not any(m.training for m in mn)


def test_example_tree_dedups_shared_block_and_tied_weight():
    nodes = build_tree(example_spec(), MiniModule)
    net = nodes[0]
    assert [n for n, _ in net.named_modules()] == ["", "embed", "block", "empty", "head"]
    assert [n for n, _ in net.named_modules(remove_duplicate=False)] == ["", "embed", "block", "again", "empty",
                                                                        "head"]
    assert [n for n, _ in net.named_parameters()] == ["embed.weight", "block.proj", "block.scale", "block.gamma"]
    names = [n for n, _ in net.named_parameters(remove_duplicate=False)]
    assert names == ["embed.weight", "block.proj", "block.scale", "block.gamma", "again.proj", "again.scale",
                     "again.gamma", "head.weight"]
    assert "block.cache" not in net.state_dict() and "block.cache" in dict(net.named_buffers())
    assert net.get_parameter("head.weight") is net.get_parameter("embed.weight")


def test_requires_grad_and_zero_grad_match_torch():
    tn, mn = both(example_spec())
    for nodes in (tn, mn):
        nodes[0](torch.ones(2, 3)).sum().backward()
    assert [p.grad is None for p in tn[0].parameters()] == [p.grad is None for p in mn[0].parameters()]
    tn[0].zero_grad(set_to_none=False)
    mn[0].zero_grad(set_to_none=False)
    assert [None if p.grad is None else p.grad.abs().sum().item() for p in mn[0].parameters()] == \
        [None if p.grad is None else p.grad.abs().sum().item() for p in tn[0].parameters()]
    mn[0].zero_grad()
    assert all(p.grad is None for p in mn[0].parameters())
    mn[0].requires_grad_(False)
    assert not any(p.requires_grad for p in mn[0].parameters())


def test_apply_is_post_order_like_torch():
    tn, mn = both(example_spec())
    seen_t, seen_m = [], []
    it, im = index_of(tn), index_of(mn)
    tn[0].apply(lambda m: seen_t.append(it[id(m)]))
    mn[0].apply(lambda m: seen_m.append(im[id(m)]))
    assert seen_t == seen_m
