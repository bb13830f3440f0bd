"""The min-cut and default partitioners against AOTAutograd's own choices on random programs.

Each program is traced once per partitioner with ``aot_function`` (a few hundred ms each), so the
random run is kept small; the boundary classes have their own deterministic programs."""
import functools
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ptinternals.compile.aot_capture import capture_aot, saved_by_forward, saved_roots
from ptinternals.compile.fx_cse import eliminate_common_subexpressions
from ptinternals.compile.joint_graph import classify_nodes, dist_from_bw, node_bytes
from ptinternals.compile.partition import (
    build_network,
    default_partition,
    default_saved,
    extract_forward_backward,
    min_cut_partition,
    min_cut_saved,
    torch_min_cut_config,
)
from ptinternals.compile.save_costs import saving_cost

from .programs import Program, random_program


@functools.lru_cache(maxsize=None)
def captured(program, partition, grad=None):
    xs = program.inputs(0, grad)
    with torch_min_cut_config():
        return capture_aot(program, *xs, partition=partition), xs


def eager_grads(program, xs):
    xs = [x.detach().requires_grad_(x.requires_grad) for x in xs]
    outs = program(*xs)
    outs = [o for o in (outs if isinstance(outs, tuple) else (outs,)) if o.requires_grad]
    wrt = [x for x in xs if x.requires_grad]
    return torch.autograd.grad(sum(o.sum() for o in outs), wrt, allow_unused=True)


def run_partition(part, joint, xs):
    """Our forward then our backward on real tensors, tangents all ones: the gradients of sum(outputs)."""
    primals = [x.detach() for x in xs]
    fw_out = part.forward(*primals)
    saved = fw_out[len(fw_out) - len(part.saved):] if part.saved else ()
    tangents = [torch.ones(n.meta["val"].shape) for n in joint.graph.nodes
                if n.op == "placeholder" and "tangents" in n.name]
    grads = part.backward(*saved, *tangents)
    return [g for g, x in zip(grads, xs) if x.requires_grad]


def assert_grads_equal(got, want):
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert (g is None) == (w is None), f"gradient {k}: got {g}, eager autograd gives {w}"
        if g is not None:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def check_against_torch(program, grad=None):
    cap, xs = captured(program, "min_cut", grad)
    ours = min_cut_partition(cap.joint, cap.num_fwd_outputs)
    assert ours.saved == cap.saved, f"{program.source()}\ntorch saved {cap.saved}, ours {ours.saved}"
    assert_grads_equal(run_partition(ours, eliminate_common_subexpressions(cap.joint), xs), eager_grads(program, xs))
    dcap, _ = captured(program, "default", grad)
    assert default_saved(dcap.joint, dcap.num_fwd_outputs) == dcap.saved
    mine = default_partition(dcap.joint, dcap.num_fwd_outputs)
    assert_grads_equal(run_partition(mine, dcap.joint, xs), eager_grads(program, xs))
    return cap


@settings(max_examples=12)
@given(st.integers(0, 10**6))
def test_partitioners_choose_what_aot_autograd_chooses(seed):
    check_against_torch(random_program(random.Random(seed)))


BOUNDARIES = {
    # one op: save the input, recompute nothing (cos(x) is cheaper to recompute than to save)
    "single op": Program(1, (("sin", 0, 0),), (1,), 4),
    # every value the same size: ties everywhere, decided by the canonical cut
    "ties": Program(1, (("sin", 0, 0), ("cos", 1, 1), ("exp", 2, 2), ("mul", 3, 1)), (4,), 3),
    # a matmul cannot be recomputed: its output is saved when needed
    "banned matmuls": Program(2, (("mm", 0, 1), ("relu", 2, 2), ("mm", 3, 1), ("tanh", 4, 4)), (5,), 4),
    # a reduction whose output is 4x smaller than its input is never recomputed
    "reduction": Program(1, (("exp", 0, 0), ("rowsum", 1, 1), ("sigmoid", 2, 2)), (3,), 8),
    # an output that is also used by later ops, and two outputs
    "two outputs": Program(2, (("mul", 0, 1), ("sin", 2, 2), ("add", 3, 2)), (4, 2), 3),
}


@pytest.mark.parametrize("name", sorted(BOUNDARIES))
def test_boundary_programs(name):
    check_against_torch(BOUNDARIES[name])


def test_frozen_input_and_output_that_is_an_input():
    check_against_torch(BOUNDARIES["banned matmuls"], grad=(True, False))   # w frozen: no gradient for it

    def returns_input(x, w):
        return x, (x * w).sin()
    x, w = torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    with torch_min_cut_config():
        cap = capture_aot(returns_input, x, w)
    assert cap.num_fwd_outputs == 2 and min_cut_saved(cap.joint, 2) == cap.saved


def test_in_place_ops_are_functionalised_first():
    def f(x, w):
        y = x * 2
        y.mul_(w)                    # in-place in the program, a mul in the joint graph
        return y.sin()
    x, w = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    with torch_min_cut_config():
        cap = capture_aot(f, x, w)
    assert not any(str(n.target).endswith("_.Tensor") for n in cap.joint.graph.nodes)
    assert min_cut_partition(cap.joint, 1).saved == cap.saved


def test_views_only_have_no_backward_graph():
    with pytest.raises(RuntimeError, match="views of the inputs"):
        capture_aot(lambda x: x.t(), torch.randn(2, 3, requires_grad=True))


@settings(max_examples=8)
@given(st.integers(0, 10**6))
def test_min_cut_never_costs_more_than_saving_everything(seed):
    """The default choice is one valid cut of the same network, so the minimum is at most its cost."""
    cap, _ = captured(random_program(random.Random(seed)), "default")
    joint = eliminate_common_subexpressions(cap.joint)
    info = classify_nodes(joint, cap.num_fwd_outputs)
    dist = dist_from_bw(joint, info)
    by_name = {n.name: n for n in joint.graph.nodes}

    def cost(names):
        return sum(saving_cost(by_name[s], dist[by_name[s]]) for s in names)
    net, banned = build_network(joint, cap.num_fwd_outputs)
    assert cost(min_cut_saved(joint, cap.num_fwd_outputs)) <= cost(default_saved(joint, cap.num_fwd_outputs))
    assert all(reason for reason in banned.values())
    assert saved_roots(joint, cap.saved) <= {n.name for n in joint.graph.nodes}


def test_partition_errors_teach():
    cap, _ = captured(BOUNDARIES["single op"], "min_cut")
    with pytest.raises(ValueError, match=r"num_fwd_outputs must be an int in 0..2"):
        classify_nodes(cap.joint, 3)
    with pytest.raises(ValueError, match=r"\['nope'\] are not nodes"):
        extract_forward_backward(cap.joint, 1, ["nope"])
    with pytest.raises(ValueError, match="neither saved nor one of its inputs"):
        extract_forward_backward(cap.joint, 1, [])          # the backward needs x or cos(x)
    with pytest.raises(TypeError, match="GraphModule"):
        classify_nodes(cap.joint.graph, 1)
    bare = torch.fx.symbolic_trace(lambda x: x.sin())
    with pytest.raises(ValueError, match="no 'val' metadata"):
        node_bytes(next(n for n in bare.graph.nodes if n.op == "call_method"))
    with pytest.raises(ValueError, match="partition must be"):
        capture_aot(torch.sin, torch.randn(2, requires_grad=True), partition="greedy")
    assert saved_by_forward(cap.forward, cap.num_fwd_outputs) == cap.saved
