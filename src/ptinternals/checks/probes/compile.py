"""The compile chapter's probes (sandbox side): run a student's backend, FX pass, partitioner or
regional compile on a workload built from a plain-data spec, and return only data.

The trusted checks (``ptinternals.checks.compile``) import this module too: the same builders and the
same serialisation (op names, canonical expressions) turn torch's own answer into comparable data, so
both sides describe a graph in the same words. No solution lives here: the probes *use* a backend, a
pass or a cut, they do not implement one.

The min-cut and the two prediction exercises are graded with torch absent; they have no probe except
:func:`min_cut_case`, which needs nothing but the standard library, so torch is imported guardedly.
Imports: the standard library, torch, and the chapter's sandbox files.
"""
from __future__ import annotations

import contextlib
import copy
import io
import logging
import warnings

try:
    import torch
    import torch.fx as fx
    import torch.nn.functional as F

    from ptinternals.compile.scaffold import build_program
    from ptinternals.compile.workloads import Program, TinyGPT, fx_graph, fx_inputs
except ImportError:  # an exercise graded without torch (min_cut): only min_cut_case is used
    torch = fx = F = None


@contextlib.contextmanager
def quiet():
    """Programs print and Dynamo warns at graph breaks: keep both out of the check's output (a test cell
    that writes to stderr scores 0 under nbgrader)."""
    dynamo_log = logging.getLogger("torch._dynamo")
    level = dynamo_log.level
    dynamo_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        dynamo_log.setLevel(level)


# ================================================================================================
# Naming what a graph does
# ================================================================================================
def target_name(node) -> str:
    """A node's operation in words both sides agree on: ``torch.sin``, ``operator.add``, ``Tensor.sum``,
    ``torch.nn.functional.gelu``, ``aten.add_.Tensor``, ``fused_add_gelu``."""
    target = node.target
    if node.op == "call_method":
        return f"Tensor.{target}"
    if node.op == "call_module":
        return f"module {target}"
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    name = getattr(target, "__name__", None) or repr(target)
    module = getattr(target, "__module__", None) or ""
    if module in ("_operator", "operator"):
        return f"operator.{name}"
    if module.startswith("torch._C._nn") or module == "torch.nn.functional":
        return f"torch.nn.functional.{name}"
    if not module or module.startswith("torch._C") or module == "torch":
        return f"torch.{name}"
    return f"{module}.{name}" if not module.startswith("ptinternals") else name


def graph_ops(gm) -> list[str]:
    """The operations of a GraphModule, in graph order (placeholders, attributes and the output left out)."""
    return [target_name(n) for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]


def canonical(gm) -> list[str]:
    """Each output of ``gm`` as an expression over its inputs: equal for two graphs that compute the same
    thing the same way, whatever their node names and node order."""
    memo: dict = {}

    def expr(v) -> str:
        if isinstance(v, (tuple, list)):
            return "(" + ", ".join(expr(a) for a in v) + ")"
        if not isinstance(v, fx.Node):
            return repr(v)
        if v not in memo:
            if v.op == "placeholder":
                memo[v] = str(v.target)
            else:
                kwargs = "".join(f", {k}={expr(a)}" for k, a in sorted(v.kwargs.items()))
                memo[v] = f"{target_name(v)}({', '.join(expr(a) for a in v.args)}{kwargs})"
        return memo[v]

    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    return [expr(v) for v in (out if isinstance(out, (tuple, list)) else (out,))]


# ================================================================================================
# compile.recording_backend
# ================================================================================================
def program_input(n: int):
    return torch.linspace(-1.0, 1.0, n)                    # the same values on both sides


def describe_graphs(graphs) -> list:
    """What was kept: ``(type name, ops)`` per item, ops None for something that is not a GraphModule."""
    out = []
    for g in list(graphs):
        is_gm = isinstance(g, fx.GraphModule)
        out.append((type(g).__name__, graph_ops(g) if is_gm else None))
    return out


def record_graphs(entry, statements, sizes):
    """``backend, graphs = entry()``; compile the program with ``backend`` and call it on inputs of each
    size in turn; return the graphs kept and the outputs."""
    made = entry()
    if not (isinstance(made, tuple) and len(made) == 2):
        raise TypeError(f"make_recording_backend() must return a pair (backend, graphs), got {type(made).__name__}")
    backend, graphs = made
    if not isinstance(graphs, list):
        raise TypeError(f"graphs must be a list, got {type(graphs).__name__}")
    fn = build_program(list(statements))
    torch._dynamo.reset()
    try:
        with quiet():
            compiled = torch.compile(fn, backend=backend)
            outputs = [compiled(program_input(n)) for n in sizes]
    finally:
        torch._dynamo.reset()
    return {"graphs": describe_graphs(graphs), "outputs": outputs}


# ================================================================================================
# compile.fuse_add_gelu
# ================================================================================================
def make_fused_op():
    """A function standing for the fused kernel: computes gelu(a + b) and counts its calls."""
    calls = [0]

    def fused_add_gelu(a, b):
        calls[0] += 1
        return F.gelu(a + b)

    return fused_add_gelu, calls


def run_graph(gm):
    """Outputs of ``gm`` on the chapter's FX inputs (fresh copies), as a list of tensors."""
    x, b = fx_inputs(0)
    with torch.no_grad():
        out = gm(x, b)
    return [o.detach().clone() for o in out]


def fuse_case(entry, spec):
    gm = fx_graph(spec)
    fused, calls = make_fused_op()
    count = entry(gm, fused)
    graph = canonical(gm)
    outputs = run_graph(gm)
    return {"count": count, "graph": graph, "outputs": outputs, "fused_calls": calls[0],
            "recompiled": code_is_current(gm)}


# ================================================================================================
# compile.dead_code
# ================================================================================================
def run_with_effects(gm, seed: int = 0) -> dict:
    """Run ``gm`` from a fixed random state; return its outputs, the inputs afterwards (in-place ops
    mutate them) and the next random numbers (a random op that was removed shifts them)."""
    x, b = fx_inputs(1)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = gm(x, b)
    return {"outputs": [o.detach().clone() for o in out], "x_after": x, "b_after": b, "rng_next": torch.rand(4)}


def code_is_current(gm) -> bool:
    """Whether ``gm.code`` (what ``gm(...)`` runs) was generated from ``gm.graph`` as it is now: a pass that
    edits the graph and forgets ``gm.recompile()`` leaves the old code running."""
    return gm.code == gm.graph.python_code(root_module="self").src


def dce_case(entry, spec):
    gm = fx_graph(spec)
    erased = entry(gm)
    return {"erased": erased, "remaining": [n.name for n in gm.graph.nodes], "recompiled": code_is_current(gm),
            **run_with_effects(gm)}


# ================================================================================================
# compile.min_cut (graded without torch)
# ================================================================================================
def label_key(label):
    return (type(label).__name__, repr(label))


def min_cut_case(entry, edges, source, sink):
    """``entry(edges, source, sink)`` on a copy of the edges; the sink side comes back sorted."""
    got = entry([tuple(e) for e in edges], source, sink)
    if isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], (set, frozenset, list, tuple)):
        return (got[0], sorted(got[1], key=label_key))
    return got


# ================================================================================================
# compile.choose_saved
# ================================================================================================
def capture_joint(program_spec, grad, partition: str = "default"):
    """Trace ``Program(spec)`` with AOTAutograd; return ``(joint graph after CSE, num_fwd_outputs,
    names of the tensors the forward saved)``. ``partition``: ``"default"`` (torch's default partitioner,
    the probe's choice: it only needs the joint graph) or ``"min_cut"`` (torch's min-cut partitioner with
    its two long-range heuristics off: the grader's expected answer)."""
    from torch._functorch import config as functorch_config
    from torch._functorch.aot_autograd import aot_function, make_boxed_func
    from torch._functorch.compile_utils import fx_graph_cse
    from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition

    program = Program.from_spec(program_spec)
    xs = program.inputs(0, grad)
    seen: dict = {}
    partitioner = min_cut_rematerialization_partition if partition == "min_cut" else default_partition

    def partition_fn(joint, joint_inputs, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            seen["joint"] = copy.deepcopy(joint)             # torch's partitioner rewrites its argument
        seen["num_fwd_outputs"] = kwargs["num_fwd_outputs"]
        return partitioner(joint, joint_inputs, **kwargs)

    def forward_compiler(gm, example_inputs):
        seen["forward"] = gm
        return make_boxed_func(gm.forward)

    options = {k: False for k in ("ban_recompute_used_far_apart", "ban_recompute_long_fusible_chains")
               if hasattr(functorch_config, k)}
    with functorch_config.patch(**options), quiet():
        compiled = aot_function(program, fw_compiler=forward_compiler, bw_compiler=forward_compiler,
                                partition_fn=partition_fn)
        compiled(*xs)
    joint = fx.GraphModule(seen["joint"], fx_graph_cse(seen["joint"].graph))
    n = seen["num_fwd_outputs"]
    out = next(node for node in seen["forward"].graph.nodes if node.op == "output").args[0]
    flat: list = []
    fx.node.map_aggregate(out, flat.append)
    saved = [s.name for s in flat[n:]
             if isinstance(s, fx.Node) and not isinstance(s.meta.get("val"), (torch.SymInt, torch.SymFloat))]
    return joint, n, saved


def choose_saved_case(entry, program_spec, grad):
    joint, n, _ = capture_joint(program_spec, grad)
    got = entry(joint, n)
    return list(got) if isinstance(got, (list, tuple)) else got


# ================================================================================================
# compile.compile_blocks
# ================================================================================================
def gpt_model(spec, seed: int = 0):
    torch.manual_seed(seed)
    return TinyGPT(spec).eval()


def gpt_tokens(spec, batch: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, int(spec[0]), (batch, int(spec[4])), generator=g)


def counting_backend():
    """A backend that keeps each graph's ops and counts the calls of what it returns."""
    graphs, calls = [], [0]

    def backend(gm, example_inputs):
        graphs.append(graph_ops(gm))

        def run(*args):
            calls[0] += 1
            return gm.forward(*args)

        return run

    return backend, graphs, calls


def compile_blocks_case(entry, spec, batch, train):
    """Compile a TinyGPT's blocks with the student's function and a counting backend; run two forwards
    (the second must reuse the compiled code) and, with ``train``, a backward."""
    model = gpt_model(spec)
    model.train(bool(train))
    tokens = gpt_tokens(spec, batch)
    backend, graphs, calls = counting_backend()
    torch._dynamo.reset()
    try:
        with quiet(), torch.set_grad_enabled(bool(train)):
            returned = entry(model, backend)
            logits = model(tokens)
            grad = None
            if train:
                logits.square().mean().backward()
                grad = model.transformer.h[0].c_attn.weight.grad
            first_calls = calls[0]
            model(tokens)                                  # a second forward reuses the compiled code
    finally:
        torch._dynamo.reset()
    return {"same_model": returned is model, "graphs": list(graphs), "calls_per_forward": first_calls,
            "calls_second_forward": calls[0] - first_calls, "logits": logits.detach(), "grad": grad}


def eager_gpt(spec, batch, train):
    """What compile_blocks_case must reproduce, run eagerly: logits and one weight's gradient."""
    model = gpt_model(spec)
    model.train(bool(train))
    tokens = gpt_tokens(spec, batch)
    if train:
        logits = model(tokens)
        logits.square().mean().backward()
        return logits.detach(), model.transformer.h[0].c_attn.weight.grad
    with torch.no_grad():
        return model(tokens), None


__all__ = ["quiet", "target_name", "graph_ops", "canonical", "record_graphs", "fuse_case", "make_fused_op",
           "run_graph", "dce_case", "run_with_effects", "min_cut_case", "capture_joint", "choose_saved_case",
           "compile_blocks_case", "eager_gpt", "code_is_current"]
