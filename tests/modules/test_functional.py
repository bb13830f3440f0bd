"""``functional_call`` against ``torch.func.functional_call`` on generated trees."""
from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from ptinternals.modules import Linear, MiniModule, Sequential, build_tree, example_spec, functional_call

from .strategies import both, outcome, tree_specs


def all_names(root) -> list:
    return [n for n, _ in [*root.named_parameters(remove_duplicate=False), *root.named_buffers(remove_duplicate=False)]]


def snapshot(root) -> list:
    return [(n, id(t)) for n, t in [*root.named_parameters(remove_duplicate=False),
                                     *root.named_buffers(remove_duplicate=False)]]


def replacement(name: str, like: torch.Tensor, k: int) -> torch.Tensor:
    """A new value for ``name`` (same shape, other values); requires grad when ``like`` is float."""
    g = torch.Generator().manual_seed(1000 + k)
    if like.is_floating_point():
        return torch.randn(like.shape, generator=g, dtype=like.dtype).requires_grad_(True)
    return torch.full(like.shape, 5, dtype=like.dtype)


@given(tree_specs(), st.data(), st.booleans(), st.booleans(), st.sampled_from(["dict", "two_dicts"]))
def test_functional_call_matches_torch_func(spec, data, tie_weights, strict, packing):
    tn, mn = both(spec)
    names = all_names(tn[0])
    chosen = data.draw(st.lists(st.sampled_from(names), unique=True) if names else st.just([]))
    if data.draw(st.booleans()):
        chosen = chosen + ["not_a_name"]
    lookup = dict([*tn[0].named_parameters(remove_duplicate=False), *tn[0].named_buffers(remove_duplicate=False)])
    x = torch.linspace(-1, 1, 2 * spec["dim"]).reshape(2, spec["dim"])
    before_m = snapshot(mn[0])
    values_before_m = [t.tolist() for _, t in mn[0].named_parameters()]

    def run(call, root):
        # Fresh tensors per world (same values): torch writes entries back into the caller's dict.
        new = {n: replacement(n, lookup.get(n, torch.zeros(())), k) for k, n in enumerate(chosen)}
        passed = dict(new)
        if packing == "two_dicts":
            half = len(chosen) // 2
            arg = (dict(list(new.items())[:half]), dict(list(new.items())[half:]))
        else:
            arg = new
        got = outcome(lambda: call(root, arg, (x,), tie_weights=tie_weights, strict=strict))
        if got[0] != "ok":
            return got
        y = got[1]
        if y.requires_grad:
            y.sum().backward()
        return ("ok", y.tolist(), {n: None if t.grad is None else t.grad.tolist() for n, t in passed.items()})

    got_t = run(torch.func.functional_call, tn[0])
    got_m = run(functional_call, mn[0])
    if got_t[:2] == ("raised", "KeyError"):
        # torch 2.13 bug (stateless._untie_named_tensors_map): two of three or more names of one tied
        # tensor given -> KeyError on the name not given. The reference fills it in instead.
        assert got_m[0] == "ok" or got_m[1] == "ValueError"
        return
    assert got_m == got_t
    # Originals are back, same objects, same values (torch 2.13 not always: pytorch/pytorch#164759).
    assert snapshot(mn[0]) == before_m
    assert [t.tolist() for _, t in mn[0].named_parameters()] == values_before_m


def test_tied_values_conflict_like_torch():
    tn, mn = both(example_spec())
    conflict = {"embed.weight": torch.zeros(3, 3), "head.weight": torch.ones(3, 3)}
    x = torch.ones(1, 3)
    assert outcome(lambda: functional_call(mn[0], conflict, x)) == \
        outcome(lambda: torch.func.functional_call(tn[0], conflict, x))
    ok_t = torch.func.functional_call(tn[0], conflict, x, tie_weights=False)
    ok_m = functional_call(mn[0], conflict, x, tie_weights=False)
    assert torch.equal(ok_t, ok_m)


def test_restores_even_when_forward_raises():
    model = Sequential(Linear(2, 2))
    weight = model[0].weight
    assert outcome(lambda: functional_call(model, {"0.weight": torch.ones(3, 3)}, torch.ones(1, 2)))[0] == "raised"
    assert model[0].weight is weight


def test_grad_through_functional_call_is_per_call():
    model = Sequential(Linear(3, 1))
    params = {k: v.detach() for k, v in model.named_parameters()}
    xs, ys = torch.randn(4, 3), torch.randn(4, 1)

    def loss(p, x, y):
        return ((functional_call(model, p, (x,)) - y) ** 2).mean()

    per_example = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, xs, ys)
    for i in range(4):
        w = params["0.weight"].clone().requires_grad_(True)
        b = params["0.bias"].clone().requires_grad_(True)
        ((xs[i] @ w.T + b - ys[i]) ** 2).mean().backward()
        assert torch.allclose(per_example["0.weight"][i], w.grad) and torch.allclose(per_example["0.bias"][i], b.grad)


def test_shared_module_is_restored_unlike_torch():
    """torch 2.13 leaves the passed tensor inside a module registered twice (pytorch/pytorch#164759)."""
    w, x = torch.zeros(2, 2), torch.ones(1, 2)
    lin = torch.nn.Linear(2, 2)
    original = lin.weight
    torch.func.functional_call(torch.nn.Sequential(lin, lin), {"0.weight": w}, (x,))
    print("torch restored the shared layer:", lin.weight is original)  # False on 2.13
    mine = Linear(2, 2)
    mine_original = mine.weight
    y = functional_call(Sequential(mine, mine), {"0.weight": w}, (x,))
    assert torch.allclose(y, (x @ w.T + mine.bias) @ w.T + mine.bias)  # both calls used w
    assert mine.weight is mine_original


def test_partially_given_tied_group_deviates_from_torch_on_purpose():
    """torch raises KeyError('c') when 2 of 3 tied names are given (a bug); the reference uses the value."""
    def make(world):
        m = type("Tied", (world,), {"forward": lambda self, x: x * self.a})()
        p = torch.nn.Parameter(torch.ones(2))
        for name in "abc":
            m.register_parameter(name, p)
        return m

    z = torch.zeros(2)
    got_t = outcome(lambda: torch.func.functional_call(make(torch.nn.Module), {"a": z, "b": z}, (torch.ones(2),)))
    assert got_t[0] == "ok" or got_t[1] == "KeyError"  # "ok" once fixed upstream
    assert torch.equal(functional_call(make(MiniModule), {"a": z, "b": z}, (torch.ones(2),)), torch.zeros(2))


def test_bad_dicts_raise_like_torch():
    tn, mn = both(example_spec())
    x = torch.ones(1, 3)
    for bad in ([1, 2], ({"embed.weight": torch.ones(3, 3)}, {"embed.weight": torch.ones(3, 3)}), "weights"):
        assert outcome(lambda b=bad: functional_call(mn[0], b, x)) == \
            outcome(lambda b=bad: torch.func.functional_call(tn[0], b, x))


def test_plain_module_built_by_tree_builder_works():
    root = build_tree(example_spec(), MiniModule)[0]
    assert isinstance(root, MiniModule)
    y = functional_call(root, {}, torch.ones(1, 3))
    assert torch.equal(y, root(torch.ones(1, 3)))
