"""The mini engine against real torch autograd: random programs, second order, graph structure."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ptinternals.autograd import Variable, compute_dependencies, engine
from ptinternals.autograd import grad as mini_grad
from ptinternals.viz.autograd import walk_graph

from .autograd_helpers import assert_grads_close, broadcast_shapes, make_tensor

# Every op is written once and run on both engines: Variable mirrors torch.Tensor's API.
UNARY = {
    "tanh": lambda v: v.tanh(),
    "sigmoid": lambda v: v.sigmoid(),
    "relu": lambda v: v.relu(),
    "neg": lambda v: -v,
    "square": lambda v: v ** 2,
    "cube_tanh": lambda v: v.tanh() ** 3,
    "exp_tanh": lambda v: v.tanh().exp(),
    "log_sigmoid": lambda v: v.sigmoid().log(),
    "reshape_roundtrip": lambda v: (v * 1.5).reshape(-1).reshape(tuple(v.shape)),
    "transpose_roundtrip": lambda v: v.transpose(0, -1).tanh().transpose(0, -1) if v.ndim else v.tanh(),
    "sum_keepdim": lambda v: v.sum(dim=0, keepdim=True) if v.ndim else v.sum(),
    "mean_keepdim": lambda v: v.mean(dim=-1, keepdim=True) if v.ndim and v.shape[-1] else v.sum(),
    "sum_all": lambda v: v.sum(),
    "mean_all": lambda v: v.mean() if v.numel() else v.sum(),
    "expand": lambda v: v.sum(0, keepdim=True).expand(*v.shape) if v.ndim else v,
    "clone": lambda v: v.clone(),
}
BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / (b * b + 1.0),
    "rsub_scalar": lambda a, b: 2.0 - a * b,
    "scale_add": lambda a, b: 0.5 * a + b,
    "matmul": lambda a, m: a @ m if a.ndim and a.shape[-1] == m.shape[0] else a * 1.0,
}


@st.composite
def programs(draw):
    base, shapes = draw(broadcast_shapes(n=3, min_dims=1, max_dims=3))
    square = (base[-1], base[-1])  # a matrix leaf that `@` can use without changing the shape
    steps = []
    usable = [0, 1, 2]  # values that broadcast to `base`; value 3 is the matrix, used only by `@`
    for _ in range(draw(st.integers(2, 8))):
        if draw(st.booleans()):
            steps.append(("u", draw(st.sampled_from(sorted(UNARY))), draw(st.sampled_from(usable))))
        else:
            name = draw(st.sampled_from(sorted(BINARY)))
            b = 3 if name == "matmul" else draw(st.sampled_from(usable))
            steps.append(("b", name, draw(st.sampled_from(usable)), b))
        usable.append(len(usable) + 1)
    nc = draw(st.lists(st.booleans(), min_size=4, max_size=4))
    return list(shapes) + [square], steps, nc, draw(st.integers(0, 2**16))


def run_program(values, steps, seed):
    values = list(values)
    for step in steps:
        if step[0] == "u":
            values.append(UNARY[step[1]](values[step[2]]))
        else:
            values.append(BINARY[step[1]](values[step[2]], values[step[3]]))
    # Weight every value with its own random constant so every path carries a distinct gradient.
    loss = None
    for i, v in enumerate(values):
        term = (v * make_tensor(tuple(v.shape), seed + 100 + i)).sum()
        loss = term if loss is None else loss + term
    return loss


def leaves_for(shapes, nc, seed):
    pairs = enumerate(zip(shapes, nc, strict=True))
    data = [make_tensor(s, seed + i, non_contiguous=c) for i, (s, c) in pairs]
    return ([d.clone().requires_grad_(True) for d in data], [Variable(d, requires_grad=True) for d in data])


def second_order(first_grads, leaves, grad_fn, seed):
    """d/dleaves of sum_i <g_i, w_i>; all None when no first-order gradient has a graph.

    (torch may keep a graph whose derivative is 0, e.g. relu's mask; we may not: both mean zero.)
    """
    s = None
    for i, g in enumerate(first_grads):
        if g is not None and g.requires_grad:
            term = (g * make_tensor(tuple(g.shape), seed + 7 + i)).sum()
            s = term if s is None else s + term
    return [None] * len(leaves) if s is None else grad_fn(s, leaves, allow_unused=True)


@given(programs())
def test_random_programs_gradients_equal_torch(program):
    shapes, steps, nc, seed = program
    theirs, ours = leaves_for(shapes, nc, seed)
    t_loss, m_loss = run_program(theirs, steps, seed), run_program(ours, steps, seed)
    torch.testing.assert_close(m_loss.data, t_loss.detach(), equal_nan=True)
    t_loss.backward()
    m_loss.backward()
    assert_grads_close([v.grad for v in ours], [t.grad for t in theirs], shapes, msg=f"steps={steps}")


@given(programs())
def test_random_programs_second_order_equal_torch(program):
    shapes, steps, nc, seed = program
    theirs, ours = leaves_for(shapes, nc, seed)
    t_loss, m_loss = run_program(theirs, steps, seed), run_program(ours, steps, seed)
    t_g = torch.autograd.grad(t_loss, theirs, create_graph=True, allow_unused=True)
    m_g = mini_grad(m_loss, ours, create_graph=True, allow_unused=True)
    assert_grads_close(m_g, t_g, shapes, msg="first order")

    expected = second_order(t_g, theirs, torch.autograd.grad, seed)
    got = second_order(m_g, ours, mini_grad, seed)
    assert_grads_close(got, expected, shapes, msg=f"second order, {steps}")


@pytest.mark.parametrize("op", sorted(UNARY) + sorted(BINARY))
@settings(max_examples=12)
@given(case=broadcast_shapes(n=2, min_dims=1, max_dims=3), nc=st.booleans(), seed=st.integers(0, 2**16))
def test_each_op_first_and_second_order_equal_torch(op, case, nc, seed):
    """Every op alone, on broadcasting (and non-contiguous) inputs: d/dx and d2/dx2 against torch."""
    base, (sa, sb) = case
    shapes = [sa, sb, (base[-1], base[-1])]
    steps = [("u", op, 0)] if op in UNARY else [("b", op, 0, 2 if op == "matmul" else 1)]
    theirs, ours = leaves_for(shapes, [nc, False, False], seed)
    t_loss, m_loss = run_program(theirs, steps, seed), run_program(ours, steps, seed)
    t_g = torch.autograd.grad(t_loss, theirs, create_graph=True, allow_unused=True)
    m_g = mini_grad(m_loss, ours, create_graph=True, allow_unused=True)
    assert_grads_close(m_g, t_g, shapes, msg=f"{op} first order")
    expected = second_order(t_g, theirs, torch.autograd.grad, seed)
    assert_grads_close(second_order(m_g, ours, mini_grad, seed), expected, shapes, msg=f"{op} second order")


def mlp_program(x, w1, b1, w2):
    h = (x @ w1 + b1).tanh()
    y = (h @ w2).sigmoid()
    return (y * y).mean() + (h.exp().sum() * 0.01) - (w1 / 2.0).mean()


def test_graph_structure_and_names_equal_torch():
    data = [make_tensor(s, i) for i, s in enumerate([(8, 5), (5, 7), (7,), (7, 3)])]
    t = mlp_program(*[d.clone().requires_grad_(True) for d in data])
    m = mlp_program(*[Variable(d, requires_grad=True) for d in data])
    assert walk_graph(m) == walk_graph(t)


def test_execution_order_equals_torch():
    """Same ready-queue priority (highest sequence_nr first): nodes run in torch's order."""
    data = [make_tensor(s, i) for i, s in enumerate([(8, 5), (5, 7), (7,), (7, 3)])]
    orders = []
    torch_leaves = [d.clone().requires_grad_(True) for d in data]
    for leaves in (torch_leaves, [Variable(d, requires_grad=True) for d in data]):
        loss = mlp_program(*leaves)
        order, seen, stack = [], set(), [loss.grad_fn]
        while stack:  # a node prehook on every op node records when the engine runs it
            fn = stack.pop()
            if fn is None or fn in seen:
                continue
            seen.add(fn)
            if "AccumulateGrad" not in fn.name():
                fn.register_prehook(lambda grads, fn=fn, order=order: order.append(fn.name()))
            stack.extend(n for n, _ in fn.next_functions)
        loss.backward()
        orders.append(order)
    assert orders[1] == orders[0]


def test_compute_dependencies_counts_incoming_edges():
    x = Variable(torch.randn(3), requires_grad=True)
    y = x * x  # MulBackward0 with two edges to x's AccumulateGrad
    z = y + y.exp()
    deps = compute_dependencies(z.grad_fn)
    assert deps[y.grad_fn] == 2  # used by the add and by the exp
    assert deps[x._get_grad_accumulator()] == 2
    with pytest.raises(TypeError, match="root must be a Node"):
        compute_dependencies(z)


def test_deep_chain_does_not_recurse():
    x = Variable(torch.ones(()), requires_grad=True)
    y = x
    for _ in range(3000):
        y = y * 1.0
    y.backward()
    assert x.grad.item() == 1.0


def test_grad_matches_torch_and_leaves_grad_untouched():
    a_t, b_t = make_tensor((3, 1), 0).requires_grad_(True), make_tensor((4,), 1).requires_grad_(True)
    a, b = Variable(a_t.detach().clone(), requires_grad=True), Variable(b_t.detach(), requires_grad=True)
    h_t, h = a_t * b_t, a * b
    out_t, out = (h_t.tanh() * b_t).sum(), (h.tanh() * b).sum()
    expected = torch.autograd.grad(out_t, [h_t, a_t])
    got = mini_grad(out, [h, a])
    assert_grads_close(got, expected)
    assert a.grad is None and b.grad is None
    with pytest.raises(RuntimeError, match="appears to not have been used"):
        mini_grad((a * 2.0).sum(), [a, b])
    assert mini_grad((a * 2.0).sum(), [a, b], allow_unused=True)[1] is None
    with pytest.raises(RuntimeError, match="does not require grad"):
        mini_grad(out, [Variable(torch.ones(2))])


def test_backward_from_leaf_and_multiple_roots():
    x = Variable(torch.ones(2), requires_grad=True)
    x.backward(torch.full((2,), 3.0))
    assert x.grad.data.tolist() == [3.0, 3.0]
    y = Variable(torch.ones(2), requires_grad=True)
    engine.backward([(y * 2.0).sum(), (y * y).sum()])
    assert y.grad.data.tolist() == [4.0, 4.0]


def test_no_grad_records_nothing():
    x = Variable(torch.randn(3), requires_grad=True)
    from ptinternals.autograd import no_grad

    with no_grad():
        y = x * 2.0
    assert y.grad_fn is None and not y.requires_grad
    z = x.detach() * 2.0
    assert z.grad_fn is None and x.detach().data.data_ptr() == x.data.data_ptr()


def test_use_backward_plugs_in_another_engine():
    calls = []

    def student_backward(root, grad=None, retain_graph=None, create_graph=False):
        calls.append(root)
        return engine.backward(root, grad, retain_graph, create_graph)

    x = Variable(torch.ones(2), requires_grad=True)
    with engine.use_backward(student_backward):
        (x * 3.0).sum().backward()
    assert len(calls) == 1 and x.grad.data.tolist() == [3.0, 3.0]
    with pytest.raises(TypeError, match="callable"):
        engine.use_backward(42)


@pytest.mark.gpu
def test_mini_engine_on_cuda_tensors():
    """Values are plain torch tensors: the engine runs unchanged on CUDA data."""
    data = [make_tensor(s, i).cuda() for i, s in enumerate([(8, 5), (5, 7), (7,), (7, 3)])]
    theirs = [d.clone().requires_grad_(True) for d in data]
    ours = [Variable(d, requires_grad=True) for d in data]
    mlp_program(*theirs).backward()
    mlp_program(*ours).backward()
    for v, t in zip(ours, theirs, strict=True):
        assert v.grad.device.type == "cuda"
        torch.testing.assert_close(v.grad.data, t.grad)
