"""``load_state_dict``: strict reporting, errors and the loaded values are torch's, on generated checkpoints."""
from __future__ import annotations

import warnings
from collections import OrderedDict

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ptinternals.modules import IncompatibleKeys, Linear, MiniModule, Sequential, build_tree, example_spec

from .strategies import both, outcome, tree_specs

EDITS = ["drop", "extra_leaf", "extra_child", "extra_unknown_child", "rename_prefix", "reshape", "not_tensor",
         "scalar_as_1", "dtype"]


def edit_checkpoint(sd: OrderedDict, edits: list, data) -> OrderedDict:
    """Apply random edits to a checkpoint (the ways real checkpoints go wrong)."""
    sd = OrderedDict(sd)
    sd._metadata = OrderedDict()
    for edit in edits:
        keys = list(sd)
        if edit == "drop" and keys:
            del sd[data.draw(st.sampled_from(keys))]
        elif edit == "extra_leaf":
            sd["surplus"] = torch.zeros(1)
        elif edit == "extra_child" and keys:
            key = data.draw(st.sampled_from(keys))
            sd[key.rpartition(".")[0] + (".stray" if "." in key else "stray")] = torch.zeros(1)
        elif edit == "extra_unknown_child":
            sd["nowhere.weight"] = torch.zeros(1)
        elif edit == "rename_prefix":  # the checkpoint of a wrapped model: every key gains "module."
            sd = OrderedDict(("module." + k, v) for k, v in sd.items())
        elif edit == "reshape" and keys:
            key = data.draw(st.sampled_from(keys))
            sd[key] = torch.zeros(2, 5)
        elif edit == "not_tensor" and keys:
            sd[data.draw(st.sampled_from(keys))] = [1.0, 2.0]
        elif edit == "scalar_as_1":  # 0.3-era checkpoints: a 0-dim value saved as shape (1,)
            for k, v in list(sd.items()):
                if isinstance(v, torch.Tensor) and v.dim() == 0:
                    sd[k] = v.reshape(1)
        elif edit == "dtype" and keys:
            key = data.draw(st.sampled_from(keys))
            if isinstance(sd[key], torch.Tensor):
                sd[key] = sd[key].double()
    return sd


def result_of(root, sd, strict, assign):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = outcome(lambda: root.load_state_dict(sd, strict=strict, assign=assign))
    if got[0] == "ok":
        keys = got[1]
        return ("ok", list(keys.missing_keys), list(keys.unexpected_keys), repr(keys))
    return got


def values(root) -> list:
    return [(n, t.dtype, t.requires_grad, type(t).__name__, t.tolist())
            for n, t in [*root.named_parameters(remove_duplicate=False), *root.named_buffers(remove_duplicate=False)]]


@given(tree_specs(), st.lists(st.sampled_from(EDITS), max_size=3), st.booleans(), st.booleans(), st.data())
def test_load_state_dict_matches_torch(spec, edits, strict, assign, data):
    tn, mn = both(spec, seed=0)
    source = build_tree(spec, torch.nn.Module, seed=1)[0].state_dict()  # other values: a load is visible
    sd = edit_checkpoint(source, edits, data)
    before_t = list(tn[0].parameters())  # objects, not ids: a freed object's id can be reused
    before_m = list(mn[0].parameters())
    got_t = result_of(tn[0], OrderedDict(sd), strict, assign)
    got_m = result_of(mn[0], OrderedDict(sd), strict, assign)
    assert got_m == got_t
    assert values(mn[0]) == values(tn[0])
    assert [a is p for a, p in zip(before_m, mn[0].parameters())] == \
        [a is p for a, p in zip(before_t, tn[0].parameters())]


@given(tree_specs())
def test_round_trip_restores_every_value(spec):
    tn, mn = both(spec, seed=0)
    trained = build_tree(spec, MiniModule, seed=3)[0]
    assert repr(mn[0].load_state_dict(trained.state_dict())) == "<All keys matched successfully>"
    got, want = mn[0].state_dict(), trained.state_dict()
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
    # non-persistent buffers are not in the checkpoint: they keep the model's own values
    fresh = build_tree(spec, MiniModule, seed=0)[0]
    non_persistent = {f"{p}{'.' if p else ''}{n}" for p, m in fresh.named_modules() for n in m._non_persistent_buffers_set}
    for name, buf in mn[0].named_buffers():
        if name in non_persistent:
            assert torch.equal(buf, fresh.get_buffer(name))


def test_strict_false_reports_what_torch_reports_for_a_wrapped_checkpoint():
    t = torch.nn.Sequential(torch.nn.Linear(3, 2))
    m = Sequential(Linear(3, 2))
    ckpt = OrderedDict(("module." + k, v) for k, v in t.state_dict().items())  # saved from DataParallel
    got_t = t.load_state_dict(ckpt, strict=False)
    got_m = m.load_state_dict(ckpt, strict=False)
    assert isinstance(got_m, IncompatibleKeys) and tuple(got_m) == tuple(got_t)
    assert got_m.missing_keys == ["0.weight", "0.bias"]  # loaded nothing, said so, raised nothing


def test_version_metadata_reaches_load_from_state_dict():
    seen = {}

    class Versioned(MiniModule):
        _version = 2

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(2))

        def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args):
            seen[prefix] = local_metadata.get("version")
            super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)

    root = Sequential(Versioned())
    sd = root.state_dict()
    assert sd._metadata["0"] == {"version": 2}
    root.load_state_dict(sd)
    assert seen == {"0.": 2}
    plain = OrderedDict(sd)  # a dict without _metadata: version None, as for very old checkpoints
    root.load_state_dict(plain)
    assert seen == {"0.": None}


def test_extra_state_like_torch():
    def make(world):
        class WithExtra(world):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(torch.zeros(1))
                self.note = "a"

            def get_extra_state(self):
                return {"note": self.note}

            def set_extra_state(self, state):
                self.note = state["note"]

        return WithExtra()

    t, m = make(torch.nn.Module), make(MiniModule)
    assert list(m.state_dict()) == list(t.state_dict()) == ["w", "_extra_state"]
    sd = {"w": torch.ones(1), "_extra_state": {"note": "b"}}
    assert tuple(m.load_state_dict(sd)) == tuple(t.load_state_dict(sd))
    assert m.note == t.note == "b"
    assert result_of(m, {"w": torch.ones(1)}, True, False) == result_of(t, {"w": torch.ones(1)}, True, False)
    plain_t, plain_m = type("Plain", (torch.nn.Module,), {})(), type("Plain", (MiniModule,), {})()
    assert result_of(plain_m, {"_extra_state": 1}, True, False) == result_of(plain_t, {"_extra_state": 1}, True, False)


def test_assign_keeps_requires_grad_and_takes_the_tensor():
    m = Linear(2, 2)
    m.bias.requires_grad_(False)
    new = {"weight": torch.ones(2, 2, dtype=torch.float64), "bias": torch.zeros(2)}
    m.load_state_dict(new, assign=True)
    assert m.weight.dtype == torch.float64 and m.weight.requires_grad and not m.bias.requires_grad
    assert isinstance(m.weight, torch.nn.Parameter)
    assert m.weight.data_ptr() == new["weight"].data_ptr()  # no copy


def test_meta_model_warns_without_assign():
    with torch.device("meta"):
        m = Linear(2, 2)
    with pytest.warns(UserWarning, match="assign=True"):
        m.load_state_dict({"weight": torch.ones(2, 2), "bias": torch.ones(2)})
    assert m.weight.is_meta
    m.load_state_dict({"weight": torch.ones(2, 2), "bias": torch.ones(2)}, assign=True)
    assert not m.weight.is_meta and m.weight.sum().item() == 4


def test_tied_weights_saved_under_both_names_and_loaded():
    nodes = build_tree(example_spec(), MiniModule)
    sd = nodes[0].state_dict()
    assert "embed.weight" in sd and "head.weight" in sd
    assert sd["embed.weight"].data_ptr() == sd["head.weight"].data_ptr()
