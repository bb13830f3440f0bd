"""Hooks, accumulation, retain_graph, in-place checks and input errors: the same scenario on both engines.

Each scenario takes ``leaf(values)`` and runs identically on torch tensors and on Variables (the API
is the same), logging what hooks see; the logs must be equal.
"""
from __future__ import annotations

import math

import pytest
import torch

from ptinternals.autograd import Variable, engine, no_grad
from ptinternals.autograd import formulas as F


def torch_leaf(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def mini_leaf(values):
    return Variable(torch.tensor(values, dtype=torch.float64), requires_grad=True)


def both(scenario):
    """Run ``scenario(leaf)`` on torch and on the mini engine; return both logs."""
    return scenario(torch_leaf), scenario(mini_leaf)


def vals(g):
    return None if g is None else g.data.tolist()


def same(a, b) -> bool:
    """Logs are equal: same structure, floats equal up to rounding."""
    if isinstance(a, float) or isinstance(b, float):
        numbers = isinstance(a, (int, float)) and isinstance(b, (int, float))
        return numbers and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def scenario_leaf_used_twice(leaf):
    log = []
    x = leaf([1.0, 2.0])
    x.register_hook(lambda g: log.append(("x hook", vals(g))))
    x.register_post_accumulate_grad_hook(lambda t: log.append(("x post", vals(t.grad))))
    y = x * 3.0
    z = x * y  # x used twice (directly and through y): the hook must see the *sum*, once
    z.sum().backward()
    log.append(("x.grad", vals(x.grad)))
    return log


def scenario_hook_order_and_retain_grad(leaf):
    log = []
    x = leaf([1.0, -2.0, 3.0])
    y = x * 2.0
    y.retain_grad()  # registered *before* the hook below, still sees the hook's modified grad
    y.register_hook(lambda g: (log.append(("y hook 1", vals(g))), g * 10.0)[1])
    y.register_hook(lambda g: log.append(("y hook 2", vals(g))))
    z = (y.tanh() + y).sum()
    z.register_hook(lambda g: log.append(("z hook", vals(g))))
    x.register_hook(lambda g: log.append(("x hook", vals(g))))
    z.backward()
    log.append(("y.grad", vals(y.grad)))
    log.append(("x.grad", vals(x.grad)))
    return log


def scenario_accumulation_across_backwards(leaf):
    log = []
    x = leaf([0.5, 1.5])
    x.register_post_accumulate_grad_hook(lambda t: log.append(("post", vals(t.grad))))
    y = (x * x).sum()
    y.backward(retain_graph=True)
    g = x.grad
    y.backward()  # accumulates in place: the same .grad object, now 2x
    log.append(("same object", g is x.grad))
    log.append(("x.grad", vals(x.grad)))
    handle = x.register_hook(lambda g: g * 0.0)
    handle.remove()  # a removed hook never runs
    (x * 1.0).sum().backward()
    log.append(("after removed hook", vals(x.grad)))
    return log


def scenario_create_graph_accumulation(leaf):
    log = []
    x = leaf([1.0, 2.0])
    y = (x ** 3).sum()
    y.backward(create_graph=True)  # x.grad = 3x^2, with a graph
    log.append(("grad has graph", x.grad.requires_grad))
    g = x.grad
    x.grad.sum().backward()  # d/dx sum(3x^2) = 6x, accumulated out of place under grad mode off?
    log.append(("x.grad", vals(x.grad)))
    log.append(("same object", g is x.grad))
    return log


def scenario_hook_replaces_gradient_flowing_down(leaf):
    log = []
    a = leaf([1.0, 2.0])
    b = a.exp()
    c = b * 2.0
    c.register_hook(lambda g: g * 0.5)
    c.sum().backward()
    log.append(("a.grad", vals(a.grad)))
    return log


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
@pytest.mark.parametrize("scenario", [
    scenario_leaf_used_twice, scenario_hook_order_and_retain_grad, scenario_accumulation_across_backwards,
    scenario_create_graph_accumulation, scenario_hook_replaces_gradient_flowing_down,
], ids=lambda f: f.__name__.removeprefix("scenario_"))
def test_scenario_logs_equal_torch(scenario):
    expected, got = both(scenario)
    assert same(got, expected), f"torch: {expected}\nours:  {got}"


def test_grad_runs_tensor_hooks_before_capturing_like_torch():
    results = []
    for leaf, grad_fn in ((torch_leaf, torch.autograd.grad), (mini_leaf, engine.grad)):
        x = leaf([1.0, 2.0])
        x.register_hook(lambda g: g * 2.0)
        h = x * 3.0
        h.register_hook(lambda g: g + 1.0)
        out = (h * h).sum()
        gx, gh = grad_fn(out, [x, h], retain_graph=True)
        results.append((vals(gx), vals(gh), x.grad))
    assert same(results[1][:2], results[0][:2]) and results[1][2] is None and results[0][2] is None, results


# ----------------------------------------------------------------------------- graph lifetime
SECOND_BACKWARD = {
    "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
    "div": lambda x, y: x / y, "neg": lambda x, y: -x, "pow": lambda x, y: x ** 2,
    "exp": lambda x, y: x.exp(), "log": lambda x, y: x.log(),
    "tanh": lambda x, y: x.tanh(), "sigmoid": lambda x, y: x.sigmoid(), "relu": lambda x, y: x.relu(),
    "sum": lambda x, y: x.sum(0), "mean": lambda x, y: x.mean(), "reshape": lambda x, y: x.reshape(-1),
    "transpose": lambda x, y: x.transpose(0, 1), "expand": lambda x, y: x.expand(3, 2, 2),
    "matmul": lambda x, y: x @ y, "scalar_mul": lambda x, y: x * 2.0,
}


@pytest.mark.parametrize("op", sorted(SECOND_BACKWARD))
def test_second_backward_raises_exactly_when_torch_does(op):
    """Nodes that saved tensors fail on a second backward; nodes that saved only shapes do not."""
    fn = SECOND_BACKWARD[op]
    outcomes = []
    for leaf in (torch_leaf, mini_leaf):
        x, y = leaf([[1.0, 2.0], [3.0, 4.0]]), leaf([[0.5, 1.0], [1.5, 2.0]])
        out = fn(x, y).sum()
        out.backward()
        try:
            out.backward()
            outcomes.append("ok")
        except RuntimeError as e:
            assert "Trying to backward through the graph a second time" in str(e)
            outcomes.append("raised")
    assert outcomes[1] == outcomes[0], f"{op}: torch {outcomes[0]}, ours {outcomes[1]}"


def test_retain_graph_allows_second_backward():
    x = mini_leaf([1.0, 2.0])
    y = x.exp().sum()
    y.backward(retain_graph=True)
    y.backward()
    torch.testing.assert_close(x.grad.data, 2 * torch.tensor([1.0, 2.0], dtype=torch.float64).exp())


def test_inplace_on_saved_tensor_raises_version_error_like_torch():
    messages = []
    for leaf in (torch_leaf, mini_leaf):
        x = leaf([1.0, 2.0])
        y = x.exp()      # ExpBackward0 saves its result y (version 0)
        y.add_(1.0)      # version 1
        with pytest.raises(RuntimeError, match="modified by an inplace operation") as info:
            y.sum().backward()
        messages.append(str(info.value))
    for message in messages:
        assert "is at version 1; expected version 0" in message


def test_inplace_without_saved_tensor_is_fine_and_correct():
    grads = []
    for leaf in (torch_leaf, mini_leaf):
        x, b = leaf([1.0, 2.0]), leaf([3.0, 4.0])
        y = x * 2.0        # MulBackward0 saves x and the scalar, not y
        y.add_(b * b)      # rebases y's history onto AddBackward0
        y.tanh().sum().backward()
        grads.append((vals(x.grad), vals(b.grad)))
    assert same(grads[1], grads[0]), grads


def test_inplace_on_leaf_requiring_grad_raises():
    x = mini_leaf([1.0])
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        x.add_(1.0)
    with no_grad():
        x.add_(1.0)  # allowed: how an optimizer updates parameters
    assert x.data.item() == 2.0


# ------------------------------------------------------------------------------ engine checks
def test_engine_rejects_formula_that_forgets_to_unbroadcast():
    def add_backward_no_unbroadcast(grad, a_shape, b_shape):
        return grad, grad

    a, b = mini_leaf([[1.0], [2.0]]), mini_leaf([1.0, 2.0, 3.0])
    with F.use_formulas({"add": add_backward_no_unbroadcast}):
        loss = (a + b).sum()
        with pytest.raises(RuntimeError, match=r"invalid gradient at index 0 - got \[2, 3\] but expected"):
            loss.backward()


def test_engine_rejects_wrong_number_of_gradients():
    a, b = mini_leaf([1.0]), mini_leaf([2.0])
    with F.use_formulas({"mul": lambda grad, a, b: (grad * b,)}):
        with pytest.raises(RuntimeError, match="incorrect number of gradients"):
            (a * b).sum().backward()


def test_backward_input_errors():
    x = mini_leaf([1.0, 2.0])
    with pytest.raises(ValueError, match="only for scalar outputs"):
        (x * 2.0).backward()
    with pytest.raises(ValueError, match="Mismatch in shape"):
        (x * 2.0).backward(torch.ones(3))
    with pytest.raises(TypeError, match="must be a Variable, a torch.Tensor or None"):
        (x * 2.0).backward([1.0])
    with pytest.raises(TypeError, match="grad_outputs must be None"):
        (x * 2.0).backward("ones")
    with pytest.raises(RuntimeError, match="does not require grad"):
        Variable(torch.ones(())).backward()
    with pytest.raises(TypeError, match="root must be a Variable"):
        engine.backward(torch.ones(()))
    with pytest.raises(TypeError, match="retain_graph"):
        engine.backward(x.sum(), retain_graph="yes")
    with pytest.raises(TypeError, match="create_graph"):
        engine.backward(x.sum(), create_graph=1)


def test_variable_and_hook_input_errors():
    with pytest.raises(TypeError, match="data must be a torch.Tensor"):
        Variable([1.0, 2.0])
    with pytest.raises(TypeError, match="only floating point"):
        Variable(torch.ones(2, dtype=torch.int64), requires_grad=True)
    c = Variable(torch.ones(2))
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        c.register_hook(lambda g: g)
    with pytest.raises(RuntimeError, match="requires_grad=False"):
        c.retain_grad()
    x = mini_leaf([1.0, 2.0])
    with pytest.raises(TypeError, match="hook must be callable"):
        x.register_hook("not a function")
    with pytest.raises(RuntimeError, match="non-leaf"):
        (x * 2.0).register_post_accumulate_grad_hook(lambda t: None)
    with pytest.raises(RuntimeError, match="only change requires_grad flags of leaf"):
        (x * 2.0).requires_grad = False
    with pytest.raises(ValueError, match="assigned grad has shape"):
        x.grad = Variable(torch.ones(3))


def test_op_input_errors():
    x = mini_leaf([[1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match="not broadcastable"):
        x + Variable(torch.ones(2))
    with pytest.raises(TypeError, match="Python number"):
        x * "2"
    with pytest.raises(ValueError, match="contraction dim"):
        x @ Variable(torch.ones(2, 2))
    with pytest.raises(ValueError, match="at least 1 dimension"):
        x.sum() @ x
    with pytest.raises(IndexError, match="Dimension out of range"):
        x.sum(dim=2)
    with pytest.raises(ValueError, match="names a dimension twice"):
        x.sum(dim=(1, -1))
    with pytest.raises(ValueError, match="must not be empty"):
        x.mean(dim=())
    with pytest.raises(TypeError, match="exponent"):
        x ** x
    with pytest.raises(ValueError, match="reshape"):
        x.reshape(4)
    with pytest.raises(ValueError, match="cannot expand"):
        x.expand(2, 4)
    with pytest.raises(TypeError, match="floating point"):
        Variable(torch.ones(2, dtype=torch.int64)).mean()


def test_inplace_on_aliased_value_with_graph_is_refused():
    """torch regenerates the aliases' graphs (CopySlices); the mini engine refuses rather than be wrong."""
    a = mini_leaf([1.0, 2.0])
    y = a * 2.0
    v = y.reshape(2, 1)  # a view of y
    with pytest.raises(RuntimeError, match="view"):
        y.add_(1.0)
    with pytest.raises(RuntimeError, match="view"):
        v.add_(1.0)
    z = a * 3.0
    z.add_(1.0)  # no views: fine
    with no_grad():
        v.add_(1.0)  # no graph recorded: fine
