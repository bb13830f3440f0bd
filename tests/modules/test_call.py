"""``__call__``: hook order (forward and backward), return values and gradients are torch's."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.modules.module as torch_module
from hypothesis import given
from hypothesis import strategies as st

import ptinternals.modules as mini
from ptinternals.checks.modules import hook_plans as local_plans
from ptinternals.checks.probes import modules as P
from ptinternals.modules import MiniModule

from .strategies import both, index_of, outcome, tree_specs

GLOBAL_KINDS = ["g_fpre", "g_fhook", "g_fhook_kw", "g_bpre", "g_bhook"]  # module-global hooks: tests only


def make_hook(kind: str, k: int, modify: bool, events: list, label: dict):
    """The probe's hook; a global kind behaves as its local one (``g_fpre`` as ``fpre``)."""
    return P.make_hook(kind.removeprefix("g_"), k, modify, events, label)


def register(world: str, module, kind: str, hook, prepend: bool):
    if not kind.startswith("g_"):
        return P.register_hook(module, kind, hook, prepend)
    api = torch_module if world == "torch" else mini
    if kind == "g_fpre":
        return api.register_module_forward_pre_hook(hook)
    if kind in ("g_fhook", "g_fhook_kw"):
        return api.register_module_forward_hook(hook, with_kwargs=kind == "g_fhook_kw")
    if kind == "g_bpre":
        return api.register_module_full_backward_pre_hook(hook)
    return api.register_module_full_backward_hook(hook)


@st.composite
def hook_plans(draw, n_nodes: int):
    """The checker's plans of local hooks, after up to two global ones."""
    glob = draw(st.lists(st.tuples(st.just(0), st.sampled_from(GLOBAL_KINDS), st.just(False), st.booleans()),
                         max_size=2))
    return glob + draw(local_plans(n_nodes))


def run_world(world: str, nodes, plan, x_requires_grad: bool, grad_mode: bool):
    events: list = []
    label = index_of(nodes)
    handles = []
    try:
        for k, (node, kind, prepend, modify) in enumerate(plan):
            hook = make_hook(kind, k, modify, events, label)
            handles.append(register(world, nodes[node], kind, hook, prepend))
        x = torch.linspace(-1, 1, 2 * nodes[0].dim).reshape(2, -1).requires_grad_(x_requires_grad)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Full backward hook is firing when ... no inputs require gradients"
            with torch.set_grad_enabled(grad_mode):
                y = nodes[0](x)
            forward_events = len(events)
            if y.requires_grad:
                y.sum().backward()
        grads = [None if p.grad is None else p.grad.tolist() for p in nodes[0].parameters()]
        return {"events": events, "forward_events": forward_events, "y": y.tolist(), "y_grad": y.requires_grad,
                "x_grad": None if x.grad is None else x.grad.tolist(), "grads": grads}
    finally:
        for h in handles:
            h.remove()


@given(tree_specs(max_nodes=4, dims=(1, 2)), st.data(), st.booleans(), st.sampled_from([True, True, False]))
def test_hook_order_and_effects_match_torch(spec, data, x_requires_grad, grad_mode):
    plan = data.draw(hook_plans(len(spec["nodes"])))
    tn, mn = both(spec)
    for nodes in (tn, mn):
        nodes[0].dim = spec["dim"]
    got_t = run_world("torch", tn, plan, x_requires_grad, grad_mode)
    got_m = run_world("mini", mn, plan, x_requires_grad, grad_mode)
    assert got_m == got_t


def test_forward_skips_every_hook():
    tn, mn = both(mini.example_spec())
    for world, nodes in (("torch", tn), ("mini", mn)):
        events = []
        label = index_of(nodes)
        handles = [register(world, m, kind, make_hook(kind, 0, False, events, label), False)
                   for m in nodes for kind in ("fpre", "fhook", "bpre", "bhook")]
        nodes[0].forward(torch.ones(2, 3, requires_grad=True)).sum().backward()
        # the root's own hooks are skipped; its children are still called through __call__
        assert {node for _, node, _ in events} == {1, 2, 3, 4} and len(events) == 4 * 5
        events.clear()
        nodes[0](torch.ones(2, 3, requires_grad=True)).sum().backward()
        assert len(events) == 4 * 6  # every call: the root, and the shared block twice
        for h in handles:
            h.remove()


def boom_class(world):
    class Boom(world):
        def forward(self, x):
            raise ValueError("forward failed")

    return Boom


def always_call_run(world, api, failing_hook: bool):
    events = []
    m = boom_class(world)()
    m.register_forward_hook(lambda mod, a, out: events.append(("plain", out)))
    m.register_forward_hook(lambda mod, a, out: events.append(("always", out)), always_call=True)

    def bad(mod, a, out):
        events.append(("bad", out))
        raise KeyError("hook failed too")

    if failing_hook:
        m.register_forward_hook(bad, always_call=True)
    g = api.register_module_forward_hook(lambda mod, a, out: events.append(("global", out)), always_call=True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = outcome(lambda: m(torch.ones(1)))
    finally:
        g.remove()
    return got, events, [str(w.message) for w in caught]


@pytest.mark.parametrize("failing_hook", [False, True])
def test_always_call_hooks_run_after_an_error(failing_hook):
    got_t = always_call_run(torch.nn.Module, torch_module, failing_hook)
    got_m = always_call_run(MiniModule, mini, failing_hook)
    assert got_m == got_t
    assert got_m[0] == ("raised", "ValueError", "forward failed")


def kwargs_run(world):
    class Scale(world):
        def forward(self, x, *, factor=1.0):
            return x * factor

    m, seen = Scale(), []
    m.register_forward_pre_hook(lambda mod, args, kwargs: (args, {"factor": kwargs["factor"] * 10}), with_kwargs=True)
    m.register_forward_hook(lambda mod, args, kwargs, o: seen.append(kwargs["factor"]), with_kwargs=True)
    m.register_forward_hook(lambda mod, args, o: seen.append(len(args)))
    return m(torch.ones(2), factor=2.0).tolist(), seen


def test_kwargs_reach_with_kwargs_hooks_only():
    assert kwargs_run(MiniModule) == kwargs_run(torch.nn.Module) == ([20.0, 20.0], [20.0, 1])


def test_bad_hook_returns_raise_torch_errors():
    def attempts(world):
        cls = type("Lin", (world,), {"forward": lambda self, x: x * 2})
        a = cls()
        a.register_forward_pre_hook(lambda m, args, kwargs: (1, 2, 3), with_kwargs=True)
        b = cls()
        b.register_full_backward_hook(lambda m, gi, go: (None, None))
        c = cls()
        c.register_full_backward_pre_hook(lambda m, go: (None, None, None))
        x = torch.ones(2, requires_grad=True)
        return [outcome(lambda: a(x)), outcome(lambda: b(x).sum().backward()),
                outcome(lambda: c(x).sum().backward())]

    assert attempts(MiniModule) == attempts(torch.nn.Module)


def test_removed_hook_does_not_fire_and_prepend_orders():
    m = MiniModule()
    m.forward = lambda x: x
    events = []
    h1 = m.register_forward_hook(lambda *a: events.append(1))
    m.register_forward_hook(lambda *a: events.append(2), prepend=True)
    with m.register_forward_hook(lambda *a: events.append(3)):
        m(torch.ones(1))
    m(torch.ones(1))
    h1.remove()
    h1.remove()  # removing twice is harmless
    m(torch.ones(1))
    assert events == [2, 1, 3, 2, 1, 2]
    assert not m._forward_hooks_with_kwargs and not m._forward_hooks_always_called


def test_eval_is_not_no_grad():
    model = mini.Sequential(mini.Linear(3, 3), mini.Dropout(0.5), mini.BatchNorm1d(3))
    model.eval()
    y = model(torch.randn(4, 3))
    assert y.requires_grad and y.grad_fn is not None  # eval() records a graph
    with torch.no_grad():
        assert not model(torch.randn(4, 3)).requires_grad
    steps = model[2].num_batches_tracked.item()
    model.train()
    model(torch.randn(4, 3))
    assert model[2].num_batches_tracked.item() == steps + 1



@pytest.mark.parametrize("kind", ["fpre", "fhook", "bpre", "bhook"])
def test_prepend_puts_a_hook_first_like_torch(kind):
    orders = []
    for world in (torch.nn.Module, MiniModule):
        m = type("Twice", (world,), {"forward": lambda self, x: x * 2})()
        events: list = []
        for k, prepend in enumerate([False, True, False, True]):
            register("w", m, kind, make_hook(kind, k, False, events, {}), prepend)
        m(torch.ones(2, requires_grad=True)).sum().backward()
        orders.append([k for _, _, k in events])
    assert orders[1] == orders[0] == [3, 1, 0, 2]
