# %% [markdown]
# # {{title}}
#
# `torch.compile(model)` is one line, and behind it is a pipeline of four stages, each an FX graph
# pass you can watch and rebuild:
#
# ```text
#  Python bytecode --Dynamo--> FX graph (torch ops) + guards
#                  --AOTAutograd--> joint forward+backward ATen graph --partitioner--> forward | backward
#                  --Inductor--> fused loops --> C++ (CPU) or Triton (GPU) kernels + library calls
# ```
#
# * **Dynamo** (`torch/_dynamo`) hooks CPython's frame evaluation (PEP 523), executes your function's
#   bytecode *symbolically*, and records every tensor operation into an FX graph. It also writes down
#   **guards**, the assumptions under which that graph stays valid, and when it meets something it
#   cannot record it **breaks** the graph.
# * **FX** (`torch/fx`) is the graph format every stage speaks: nodes, an interpreter, and passes.
# * **AOTAutograd** (`torch/_functorch`) traces the backward ahead of time into one *joint* graph and
#   decides which forward values to **save** and which to **recompute**: a minimum cut, the
#   activation-checkpointing trade-off of {{chapter autograd}} solved per graph.
# * **Inductor** (`torch/_inductor`) fuses the ATen ops into loops and writes the kernels: Triton on a
#   GPU, the kind you wrote in {{chapter kernels}}; C++ with OpenMP on a CPU.
#
# You will build a backend that records what Dynamo captures, predict graph breaks and recompilations
# (and check the predictions against Dynamo), write FX passes, build the min-cut partitioner and compare
# its choices with AOTAutograd's, read Inductor's generated code, and compile the capstone model of
# {{chapter gpt}}.
#
# **What compile time costs here.** Dynamo and AOTAutograd cost milliseconds to a second per small
# graph: they trace Python, they generate nothing. Inductor costs seconds: it lowers and fuses the graph
# (about a second), writes C++ (or Triton), and then a compiler builds it: on a 2-core machine `g++`
# takes several seconds per kernel, and the very first build in a fresh cache also builds a
# precompiled header. A graph compiled before, in any process, is loaded from Inductor's on-disk cache
# (`TORCHINDUCTOR_CACHE_DIR`, by default `/tmp/torchinductor_<user>`) in well under a second. So this
# notebook builds with Inductor exactly once, in its last section (one block of the capstone model,
# reused by every block); where it reads Inductor's code it stops Inductor after the code is written,
# before anything is built, and everywhere else it uses backends that generate no code.
#
# **How this notebook works.** Run the cells in order. Each exercise has an *answer cell* (replace
# `raise NotImplementedError()` with your code) and a *check cell*. The grader runs your answer cells in
# a separate process, without the course's reference code, on many more cases than the visible ones,
# and compares with what PyTorch itself does (Dynamo's real graph and recompile counts, AOTAutograd's
# saved tensors, Inductor's own records). The two predictions and the min-cut run with torch, numpy and
# networkx absent: they are plain Python. The grader also reads your answer cells' source and gives 0 to
# an answer that calls the machinery it is asked to rebuild (torch's rewriter, its dead code
# elimination, its partitioner, `explain`, networkx) or hides a name (`getattr` with a computed name,
# `eval`, `importlib`, private attributes of torch, monkeypatching). Quiz answers are recorded in
# `compile.answers.json` beside this notebook: **your first answer to each question counts**.

# %% [setup]
import dis
import operator

import torch
import torch.fx as fx
import torch.nn.functional as F

from ptinternals.grading import check
from ptinternals.quiz import quiz_progress, show_quiz

torch.manual_seed(0)

# %% [markdown]
# The reference implementation of this chapter lives in `ptinternals.compile`; the demonstrations use it
# (and torch), never your answers, so every cell runs before you have solved anything.

# %%
from ptinternals.compile import backends, explain, recompiles
from ptinternals.viz.compile import draw_fx_graph, draw_partition

# %% [markdown]
# ## 1. Dynamo: from bytecode to a graph
#
# CPython runs a function by interpreting its bytecode. PEP 523 lets a C extension replace the
# interpreter's *frame evaluation* function, and Dynamo does exactly that
# (`torch/csrc/dynamo/eval_frame.c`): when a frame of a compiled function starts, Dynamo gets it first.
# On the first call it *symbolically executes* the bytecode (`torch/_dynamo/symbolic_convert.py`): every
# value becomes a `VariableTracker` (a tensor is a `TensorVariable` holding a fake tensor: shape, dtype,
# device, no data), and every torch operation on one is appended to an FX graph instead of being run.

# %%
def f(x, w):
    a = torch.sin(x)
    b = a * w
    return (torch.relu(b) + a).sum()

dis.dis(f)  # what Dynamo reads: LOAD_GLOBAL torch, LOAD_ATTR sin, CALL, BINARY_OP * ...

# %% [markdown]
# At the end of the frame Dynamo hands the graph to a **backend**: any function
# `backend(gm: torch.fx.GraphModule, example_inputs) -> callable`. The callable replaces the traced
# bytecode from then on. Inductor is one backend; `"eager"` (run the graph as it is) and `"aot_eager"`
# (AOTAutograd, then run) are others. Ours records what it is given and runs it unchanged.

# %%
rec = backends.RecordingBackend()
compiled_f = rec.compile(f)
x, w = torch.randn(4, 4), torch.randn(4, 4)
print(compiled_f(x, w), f(x, w))
g = rec.graphs[0]
print("compile id", g.compile_id, "| inputs", g.example_inputs, "| ops", g.ops)
print(g.code)
draw_fx_graph(g.graph_module, "what Dynamo captured from f")

# %% [markdown]
# ### {{exercise recording_backend}}: a backend that keeps every graph
#
# Write `make_recording_backend()` returning a pair `(backend, graphs)`: `graphs` is a list, and
# `backend(gm, example_inputs)` appends `gm` (the `GraphModule` itself) to it and returns a callable
# that computes exactly what the graph computes. The check compiles programs with your backend
# (`torch.compile(fn, backend=backend)`), calls them (some on several input sizes, which recompiles), and
# compares the graphs you kept with the ones torch's own recording backend is handed for the same calls:
# as many, in the same order, with the same operations; and the results with eager mode.

# %% [answer recording_backend]
def make_recording_backend():
    """(backend, graphs): backend keeps each GraphModule it is given in graphs and runs it unchanged."""
    ### BEGIN SOLUTION
    # twin: ptinternals.compile.backends.make_recording_backend
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return backend, graphs
    ### END SOLUTION


# %% [tests recording_backend]
check("compile.recording_backend", make_recording_backend)
### BEGIN HIDDEN TESTS
check("compile.recording_backend", make_recording_backend, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. Graph breaks
#
# Some bytecode cannot become graph nodes: a `print` (a side effect on the outside world), a branch on a
# tensor's *value* (`if x.sum() > 0:` - the fake tensor has no value), `.item()` feeding Python. Dynamo
# then **breaks the graph**: it compiles what it has so far, lets CPython run the offending instruction,
# and continues in a *resume function* (a new frame, `torch_dynamo_resume_in_f_at_<line>`) that it
# compiles separately. `torch._dynamo.explain` reports what happened; `fullgraph=True` turns any break
# into an error.

# %%
def with_print(x):
    y = x.sin()
    print("hello from Python")
    return y.cos() + 1

s = explain.explain_graphs(with_print, torch.ones(3))
print("graphs:", s.graph_count, "| explain's graph_break_count:", s.graph_break_count,
      "| breaks reported:", s.breaks_hit)
print("ops per graph:", s.ops_per_graph)
print("reason:", s.break_reasons[0].reason, "at line", s.break_reasons[0].lineno)

# %% [markdown]
# Two counting details matter. A region with **no** tensor op compiles to nothing, so a `print` at the
# very start costs no graph, and `explain` does not even report that break (each reported reason is
# attached to a compiled graph). And `graph_break_count` is defined as `graph_count - 1`, not as the
# number of breaks: a trailing `print` gives 1 graph, `graph_break_count` 0, and one reported reason.
#
# A break inside a called function is worse than one in the caller: the caller's graph ends at the
# call, the callee runs as its own frame (compiled once, reused by later calls), and the caller resumes
# after the call in a new region.

# %%
import logging

from ptinternals.compile.graph_breaks import predict_graphs
from ptinternals.compile.scaffold import STATEMENTS, build_program

torch._logging.set_logs(dynamo=logging.ERROR)  # Dynamo warns at every .item() break; the counts say it here

for name, lines in STATEMENTS.items():
    print(f"{name:12s} {' | '.join(lines)}")
for program in (["op", "print"], ["print", "op"], ["op", "helper", "op"], ["item", "branch"]):
    got = explain.count_breaks(build_program(program), torch.ones(3))
    print(program, "-> (graphs, reported breaks) =", got)

# %% [markdown]
# ### {{exercise predict_graphs}}: predict Dynamo's graphs and breaks
#
# Programs are lists of the statement names above (`build_program` turns one into a real function).
# Write `predict_graphs(statements)` returning `(graph_count, breaks)` exactly as
# `torch._dynamo.explain` reports them (`graph_count`, `len(break_reasons)`) - without running Dynamo:
# the check runs your predictor with torch absent and compares with `explain` on many programs,
# including the empty program, programs made only of breaks, breaks at the start and at the end,
# repeated breaks and repeated helper calls.

# %% [answer predict_graphs]
def predict_graphs(statements):
    """(graph_count, breaks reported by explain) for a straight-line program of statement names."""
    ### BEGIN SOLUTION
    # twin: ptinternals.compile.graph_breaks.predict_graphs
    graphs = breaks = ops = 0
    helper_compiled = False
    for s in statements:
        if s in ("op", "no_grad"):
            ops += 1
            continue
        if s in ("item", "branch"):
            ops += 1                  # sum (and gt) join the region before the break
        if ops > 0:                   # every other statement ends the region at a break
            graphs += 1
            breaks += 1
        ops = 1 if s in ("item", "branch") else 0
        if s == "helper" and not helper_compiled:
            graphs, breaks, helper_compiled = graphs + 2, breaks + 1, True
    return graphs + (ops > 0), breaks
    ### END SOLUTION


# %% [tests predict_graphs]
check("compile.predict_graphs", predict_graphs)
### BEGIN HIDDEN TESTS
check("compile.predict_graphs", predict_graphs, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("compile", "q1", "q2")

# %% [markdown]
# ## 3. Guards and recompilation
#
# A compiled graph is only valid for inputs like the ones it was traced with. Dynamo writes the
# assumptions down as **guards** (`torch/_dynamo/guards.py`) and checks them, in C++, on every call:

# %%
def scaled(x, n, flag):
    y = x.sin() * n
    return y.cos() if flag else y

rec = backends.RecordingBackend()
compiled_scaled = rec.compile(scaled)
compiled_scaled(torch.randn(4), 2, True)
for guard in rec.graphs[0].guards:
    print(f"{guard.kind:28s} {guard.source:10s} {'; '.join(guard.code)[:70]}")

# %% [markdown]
# `TENSOR_MATCH` checks dtype, device, requires_grad, sizes and strides in one C++ call (what is printed
# are only its Python-side extras); `CONSTANT_MATCH` pins a Python value; `SHAPE_ENV` holds the
# relations between symbolic sizes once some are dynamic; the rest pin global state (grad mode, the
# default device...), so calling under `torch.no_grad()` recompiles too.

# %% [markdown]
# Each compiled frame keeps a small cache of entries (guards + code). A call runs the newest entry whose
# guards pass; when none passes, Dynamo **recompiles**. It is also smart about *why*: when a size
# changes, it recompiles once with that dimension **symbolic** ("automatic dynamic shapes"), and that
# graph then serves every size - except 0 and 1, which are always specialised because so much code
# branches on them. Python ints become symbolic the same way. After `recompile_limit` (8) entries Dynamo
# gives up on the frame and runs it eagerly.

# %%
from ptinternals.compile.scaffold import CallSpec, make_args

calls = [CallSpec((4,)), CallSpec((4,)), CallSpec((5,)), CallSpec((9,)), CallSpec((1,)),
         CallSpec((9,), n=3), CallSpec((9,), n=7), CallSpec((9,), flag=False), CallSpec((9,), dtype="float64")]
report = recompiles.run_and_count(scaled, [make_args(c) for c in calls])
for c, r in zip(calls, report.calls):
    why = r.reasons[0] if r.reasons else ""   # the newest entry's failed guard (every entry tried reports one)
    print(f"shape={c.shape!s:5s} n={c.n} flag={c.flag!s:5s} {c.dtype:8s} compiled={r.compiled}  {why[:60]}")

# %% [markdown]
# ### {{exercise predict_compiles}}: which calls recompile?
#
# `scaffold.f` is the function above. Each call of it is described as plain data, a dict such as
# `CallSpec((9,), n=3).as_dict()`:
# `{"shape": (9,), "dtype": "float32", "requires_grad": False, "transposed": False, "stride": (1,), "n": 3, "flag": True}`
# (`transposed`: `x` is the transpose of a contiguous tensor; `stride`: `x.stride()`). Write
# `predict_compiles(calls)` returning, for each call in order, `1` if Dynamo compiles during it and `0`
# if not (a cache hit - or the recompile limit reached). Model the cache: guards on dtype,
# requires_grad, rank, sizes (static, or symbolic: any size >= 2), strides (exact ones when every size
# is static, else those of the entry's layout for the call's sizes), `n` and `flag`; automatic dynamic
# dims and ints (a dim whose size differed from the *first* call's, or an `n` that differed, stays
# symbolic in every later compile; a change of rank makes every dim symbolic); newest entry first; at
# most `recompile_limit` entries. The check runs your function without torch (it is pure Python) and
# compares with Dynamo's real compile counts on random call sequences.

# %% [answer predict_compiles]
def predict_compiles(calls, recompile_limit=8):
    """1 if Dynamo compiles scaffold.f during the call, else 0, for each call (a dict) in order."""
    ### BEGIN SOLUTION
    # twin: ptinternals.compile.guard_rules.predict_compiles
    entries, out = [], []
    first = None                    # (shape, n) of the first compiled call
    dynamic_dims, all_dynamic, n_dynamic = set(), False, False

    def layout_strides(shape, transposed):
        """x.stride() of a contiguous tensor of this shape, or of the transpose of one."""
        base = shape[::-1] if transposed else shape
        strides, running = [], 1
        for size in reversed(base):
            strides.append(running)
            running *= max(size, 1)
        strides = tuple(reversed(strides))
        return strides[::-1] if transposed else strides

    def accepts(e, c):
        shape = tuple(c["shape"])
        if (c["dtype"], c["requires_grad"], c["flag"], len(shape)) != (e["dtype"], e["rg"], e["flag"], len(e["sizes"])):
            return False
        for want, size in zip(e["sizes"], shape):
            if (want is None and size < 2) or (want is not None and want != size):
                return False
        strides = e["strides"] or layout_strides(shape, e["transposed"])
        return tuple(c["stride"]) == strides and (e["n"] is None or e["n"] == c["n"])

    for c in calls:
        shape = tuple(c["shape"])
        if any(accepts(e, c) for e in reversed(entries)) or len(entries) >= recompile_limit:
            out.append(0)
            continue
        if first is None:
            first = (shape, c["n"])
        else:
            if len(shape) != len(first[0]):
                all_dynamic = True
            else:
                dynamic_dims |= {d for d, (a, b) in enumerate(zip(shape, first[0])) if a != b}
            n_dynamic |= c["n"] != first[1]
        sizes = tuple(None if (all_dynamic or d in dynamic_dims) and s >= 2 else s for d, s in enumerate(shape))
        static = None not in sizes
        entries.append({"dtype": c["dtype"], "rg": c["requires_grad"], "flag": c["flag"], "sizes": sizes,
                        "strides": tuple(c["stride"]) if static else None, "transposed": c["transposed"],
                        "n": None if n_dynamic else c["n"]})
        out.append(1)
    return out
    ### END SOLUTION


# %% [tests predict_compiles]
check("compile.predict_compiles", predict_compiles)
### BEGIN HIDDEN TESTS
check("compile.predict_compiles", predict_compiles, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# Two ways to avoid the recompile-then-generalise dance when you know a dimension varies:
# `torch._dynamo.mark_dynamic(x, 0)` before the first call, or `torch.compile(fn, dynamic=True)`. And
# `torch.compile(fn, dynamic=False)` does the opposite: one compile per size. `TORCH_LOGS=recompiles`
# prints the failing guard of every recompilation, like the reasons above.

# %% [quiz]
show_quiz("compile", "q3", "q4", "q5")

# %% [markdown]
# ## 4. FX: graphs, the interpreter, and passes
#
# An FX graph is a list of `Node`s in topological order. Each has an `op` (`placeholder`,
# `call_function`, `call_method`, `call_module`, `get_attr`, `output`), a `target` (what it calls),
# `args`/`kwargs` (other nodes or constants) and `users`. A `GraphModule` generates Python code from its
# graph (`gm.code`) and runs it. `torch.fx.symbolic_trace` builds a graph by running a function on
# proxies; Dynamo builds the same kind of graph from bytecode; `make_fx` builds one of ATen ops
# ({{chapter dispatch}}).

# %%
gm = fx.symbolic_trace(lambda x, b: F.gelu(x + b).sum(-1))
gm.graph.print_tabular()

# %% [markdown]
# `torch.fx.Interpreter` runs a graph node by node; a pass that needs *values* subclasses it. Shape
# propagation records every node's shape and bytes; run under `FakeTensorMode` it costs nothing even
# for a 64 GiB input. Another interpreter finds the op that produced the first NaN.

# %%
from ptinternals.compile.fx_interpreter import first_non_finite
from ptinternals.compile.fx_shape_prop import propagate_shapes

big = torch.empty(2**20, 2**14, device="meta")                     # 64 GiB of float32, never allocated
print({k: (v.shape, v.nbytes) for k, v in propagate_shapes(fx.symbolic_trace(lambda x: x.sum(0)), big,
                                                           fake=True).items()})
print(first_non_finite(fx.symbolic_trace(lambda x: ((x - 1).log() * 2).exp()), torch.tensor([0.5, 2.0])))

# %% [markdown]
# A **pattern replacement** pass finds a small subgraph and swaps it for another. Matching walks
# *backwards* from the pattern's output (a value has one producer but many users, so the walk is
# deterministic), binds pattern inputs to whatever sits there, and requires constants to agree. A match
# can only be replaced if it is self-contained: no matched node except the last may be used outside it.
# Here `gelu(x + b)` becomes one call of the dispatcher chapter's custom op `fused_bias_gelu`, inside a
# Dynamo backend, so a compiled program really runs the fused op:

# %%
from ptinternals.compile.fx_pattern import fuse_bias_gelu

def mlp(x, b1, b2):
    h = F.gelu(x + b1)                       # fused
    shared = h + b2
    return F.gelu(shared) + shared           # not fused: `shared` is used outside the pattern

def fusing_backend(gm, example_inputs):
    print("fused", fuse_bias_gelu(gm), "pattern(s)")
    print(gm.code)
    return gm.forward

x, b1, b2 = torch.randn(3, 8), torch.randn(8), torch.randn(8)
print(torch.allclose(torch.compile(mlp, backend=fusing_backend)(x, b1, b2), mlp(x, b1, b2), atol=1e-6))

# %% [markdown]
# ### {{exercise fuse_add_gelu}}: a pattern-replacement pass
#
# Write `fuse_add_gelu(gm, fused_op)`: replace every self-contained `F.gelu(a + b)` in `gm` (a graph of
# torch-level ops, as `symbolic_trace` and Dynamo record them: `operator.add`, then
# `torch._C._nn.gelu`, which is what `F.gelu` is) by one `call_function` node calling `fused_op(a, b)`,
# recompile `gm`, and return how many you replaced. Follow torch's matcher: candidates in graph order,
# no overlapping matches, `a` and `b` bound to two *different* nodes or constants, and skip a match
# whose `add` has another user. The check compares your graph with the one
# `torch.fx.subgraph_rewriter.replace_pattern` produces, and the outputs with the original graph's, on
# random graphs; calling torch's matcher or rewriter is refused.

# %% [answer fuse_add_gelu]
def fuse_add_gelu(gm, fused_op):
    """Replace each self-contained gelu(a + b) in gm by fused_op(a, b); return the number replaced."""
    ### BEGIN SOLUTION
    # twin: ptinternals.compile.fx_pattern.fuse_add_gelu
    graph, taken, count = gm.graph, set(), 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not F.gelu or len(node.args) != 1 or node.kwargs:
            continue
        add = node.args[0]
        if not (isinstance(add, fx.Node) and add.op == "call_function" and add.target is operator.add
                and len(add.args) == 2 and not add.kwargs):
            continue
        a, b = add.args
        if (isinstance(a, fx.Node) and a is b) or add in taken or node in taken or set(add.users) != {node}:
            continue
        taken.update((add, node))
        with graph.inserting_before(node):
            fused = graph.call_function(fused_op, (a, b))
        node.replace_all_uses_with(fused)
        graph.erase_node(node)
        graph.erase_node(add)
        count += 1
    gm.recompile()
    return count
    ### END SOLUTION


# %% [tests fuse_add_gelu]
check("compile.fuse_add_gelu", fuse_add_gelu)
### BEGIN HIDDEN TESTS
check("compile.fuse_add_gelu", fuse_add_gelu, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### {{exercise dead_code}}: dead code elimination that keeps side effects
#
# Write `eliminate_dead_code(gm)`: erase every node whose value nobody uses and whose execution changes
# nothing else, in one backward walk (erasing a node can make its inputs dead), recompile `gm` and return
# the erased names in the order you erased them. Keep placeholders and the output, ATen ops whose schema
# mutates an argument (`op._schema.is_mutable`), random ops (ATen ops tagged
# `torch.Tag.nondeterministic_seeded`; at the torch level `torch.rand`, `torch.rand_like` and friends,
# and the dropouts `F.dropout`...), the functions in `torch.fx.node._side_effectful_functions` (such as
# `operator.setitem`), and **in-place methods** (`call_method` whose name ends in one `_`: `x.add_(1)`).
# torch's own `Graph.eliminate_dead_code` erases those last ones and torch-level dropout: it would
# change what the program does. The check compares your graph with torch's pass given that rule, and
# runs the original and pruned graphs: outputs, mutated inputs and the random generator's next numbers
# must agree.

# %% [answer dead_code]
def eliminate_dead_code(gm):
    """Erase unused side-effect-free nodes (one reverse pass); return their names in erase order."""
    ### BEGIN SOLUTION
    # twin: ptinternals.compile.fx_dce.eliminate_dead_code
    from torch.fx.node import _side_effectful_functions

    random_fns = {torch.rand, torch.randn, torch.randint, torch.randperm, torch.rand_like, torch.randn_like,
                  torch.randint_like, torch.normal, torch.poisson, torch.bernoulli, torch.multinomial,
                  torch.dropout, F.dropout, F.dropout1d, F.dropout2d, F.alpha_dropout}

    def impure(node):
        if node.op in ("placeholder", "output"):
            return True
        if node.op == "call_method":
            return node.target.endswith("_") and not node.target.endswith("__")
        if node.op != "call_function":
            return False
        op = node.target
        if isinstance(op, torch._ops.OpOverloadPacket):
            op = op.default
        if isinstance(op, torch._ops.OpOverload):
            return (op._schema.is_mutable or torch.Tag.nondeterministic_seeded in op.tags
                    or op in _side_effectful_functions)
        try:
            return op in random_fns or op in _side_effectful_functions
        except TypeError:
            return False

    removed = []
    for node in reversed(list(gm.graph.nodes)):
        if not node.users and not impure(node):
            removed.append(node.name)
            gm.graph.erase_node(node)
    gm.recompile()
    return removed
    ### END SOLUTION


# %% [tests dead_code]
check("compile.dead_code", eliminate_dead_code)
### BEGIN HIDDEN TESTS
check("compile.dead_code", eliminate_dead_code, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("compile", "q6")

# %% [markdown]
# ## 5. AOTAutograd: the joint graph, and what to save
#
# For training, `torch.compile` hands each Dynamo graph to AOTAutograd. It traces forward *and*
# backward with fake tensors into one ATen-level **joint graph**: functionalised (in-place ops become
# out-of-place ones, so the graph is pure), with placeholders `primals_*` (the inputs) and `tangents_*`
# (the incoming gradients), and outputs: the forward's results, then one gradient per input. A
# **partitioner** cuts it in two; the forward returns its outputs *plus the tensors it saves*, the
# backward takes those and the tangents. `capture_aot` records every step:

# %%
from ptinternals.compile.aot_capture import capture_aot
from ptinternals.compile.fx_cse import eliminate_common_subexpressions
from ptinternals.compile.partition import default_saved, min_cut_partition

def block(x, w):
    a = torch.sin(x)
    b = a * w
    c = torch.relu(b) + a
    return (c @ w).cos().sum()

x = torch.randn(64, 64, requires_grad=True)
w = torch.randn(64, 64, requires_grad=True)
cap = capture_aot(block, x, w)                  # torch's min-cut partitioner
joint = eliminate_common_subexpressions(cap.joint)
print(joint.code)
print("AOTAutograd saves:", cap.saved, f"({cap.saved_bytes:,} bytes)")

# %% [markdown]
# Eager autograd (and AOTAutograd's *default* partitioner) saves every forward value the backward
# reads. The **min-cut partitioner** saves as few bytes as it can and recomputes the rest in the
# backward, where a recomputed pointwise op is nearly free: Inductor fuses it into a backward kernel
# that reads its inputs anyway, while every saved byte costs a write and a read of memory. It is a
# minimum cut: split every node into `n_in -> n_out` with capacity = the cost of saving `n`; data
# dependencies become infinite edges; the source feeds what cannot be recomputed (the inputs, matmuls,
# random ops...), the sink drains what the backward needs. Every finite cut is a valid choice of saved
# tensors; the cheapest one wins. The picture: blue forward, orange backward, green saved, hatched
# recomputed.

# %%
mine = min_cut_partition(cap.joint, cap.num_fwd_outputs)
print("ours:", mine.saved, f"{mine.saved_bytes:,} bytes; recomputed in backward: {mine.recomputed}")
print("default partitioner would save:", default_saved(joint, cap.num_fwd_outputs))
draw_partition(joint, cap.num_fwd_outputs, mine.saved)

# %% [markdown]
# ### {{exercise min_cut}}: maximum flow and the minimum cut
#
# Write `min_cut(edges, source, sink)`: `edges` is a list of `(u, v, capacity)` (capacity a number >= 0
# or `math.inf`; a repeated `(u, v)` replaces the earlier capacity); return `(value, sink_side)`, the
# minimum cut's capacity and the set of nodes on the sink's side. Use Edmonds-Karp (augment along
# shortest paths of the residual graph until none is left). When several cuts are minimal, return the
# one torch gets from `networkx.minimum_cut`: the sink side is the set of nodes that can still reach the
# sink in the final residual graph. If a path of infinite capacity joins source and sink, raise
# `ValueError`. The check compares with networkx on random networks full of ties; your function runs
# with torch, numpy and networkx absent.

# %% [answer min_cut]
def min_cut(edges, source, sink):
    """(minimum cut value, set of nodes on the sink side) of a directed network."""
    ### BEGIN SOLUTION
    # twin: ptinternals.compile.maxflow.min_cut
    import math
    from collections import defaultdict, deque

    capacity = {}
    for u, v, c in edges:
        capacity[u, v] = c                       # a repeated edge replaces its capacity
    residual = defaultdict(lambda: defaultdict(float))
    for (u, v), c in capacity.items():
        residual[u][v] += c
        residual[v][u] += 0.0
    while True:
        parent, queue = {source: None}, deque([source])
        while queue and sink not in parent:
            u = queue.popleft()
            for v, r in residual[u].items():
                if r > 0 and v not in parent:
                    parent[v] = u
                    queue.append(v)
        if sink not in parent:
            break
        path, v = [], sink
        while parent[v] is not None:
            path.append((parent[v], v))
            v = parent[v]
        push = min(residual[u][v] for u, v in path)
        if math.isinf(push):
            raise ValueError("a path of infinite capacity joins source and sink: no finite cut")
        for u, v in path:
            residual[u][v] -= push
            residual[v][u] += push
    sink_side, queue = {sink}, deque([sink])
    while queue:
        v = queue.popleft()
        for u in list(residual):
            if residual[u].get(v, 0) > 0 and u not in sink_side:
                sink_side.add(u)
                queue.append(u)
    value = sum(c for (u, v), c in capacity.items() if u not in sink_side and v in sink_side)
    return value, sink_side
    ### END SOLUTION


# %% [tests min_cut]
check("compile.min_cut", min_cut)
### BEGIN HIDDEN TESTS
check("compile.min_cut", min_cut, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### {{exercise choose_saved}}: the partitioner's network
#
# Write `choose_saved(joint, num_fwd_outputs)` returning the names of the nodes to save, in graph order,
# as AOTAutograd's min-cut partitioner chooses them. The cost model is given
# (`ptinternals.compile.save_costs`, torch's own rules: `saving_cost(node, dist)` and
# `ban_reason(node, info)`), and so are the node classes (`ptinternals.compile.joint_graph`:
# `classify_nodes`, `dist_from_bw`, `op_kind`, `is_primal`). Build the network, for every node but the
# output, in graph order:
#
# * a node in `info.required_bw`: if it is in `info.tangents_closure` add `n_in -> sink` (infinite) and
#   go to the next node; otherwise add `n_out -> sink` (infinite) and continue below;
# * `source -> n_in` (infinite) for a primal, and for a node in `info.required_fw` that has a
#   `ban_reason` - but never for a view (`"view" in op_kind(node)`);
# * `n_in -> n_out` with capacity `saving_cost(node, dist[node])`, and `n_out -> user_in` (infinite)
#   for every user.
#
# Cut it with your `min_cut`; the saved nodes are those whose `n_in` is on the source side and `n_out`
# on the sink side. (If nothing needs a gradient, `info.required_bw` is empty: return an empty list.)
# The check captures joint graphs of random programs with AOTAutograd (after the same common
# subexpression elimination torch runs first) and compares with the tensors AOTAutograd's min-cut
# partitioner saves, with its two long-range heuristics switched off (they are described below).

# %% [answer choose_saved]
def choose_saved(joint, num_fwd_outputs):
    """Names of the joint graph's nodes that the min-cut partitioner saves, in graph order."""
    ### BEGIN SOLUTION
    # twin: ptinternals.compile.partition.min_cut_saved
    import math

    from ptinternals.compile.joint_graph import classify_nodes, dist_from_bw, is_primal, op_kind
    from ptinternals.compile.save_costs import ban_reason, saving_cost

    info = classify_nodes(joint, num_fwd_outputs)
    if not info.required_bw:
        return []
    dist = dist_from_bw(joint, info)
    edges = []
    for node in joint.graph.nodes:
        if node.op == "output":
            continue
        if node in info.required_bw:
            if node in info.tangents_closure:
                edges.append((node.name + "_in", "sink", math.inf))
                continue
            edges.append((node.name + "_out", "sink", math.inf))
        banned = is_primal(node) or (node in info.required_fw and ban_reason(node, info) is not None)
        if banned and "view" not in op_kind(node):
            edges.append(("source", node.name + "_in", math.inf))
        edges.append((node.name + "_in", node.name + "_out", saving_cost(node, dist[node])))
        edges.extend((node.name + "_out", user.name + "_in", math.inf) for user in node.users)
    _, sink_side = min_cut(edges, "source", "sink")
    return [n.name for n in joint.graph.nodes
            if n.op != "output" and n.name + "_out" in sink_side and n.name + "_in" not in sink_side]
    ### END SOLUTION


# %% [tests choose_saved]
check("compile.choose_saved", choose_saved)
### BEGIN HIDDEN TESTS
check("compile.choose_saved", choose_saved, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# This is activation checkpointing ({{chapter autograd}}) decided per graph by a solver: torch's
# `checkpoint` makes you pick the region, the partitioner weighs every tensor. The real partitioner
# adds heuristics that rarely matter in small graphs (it refuses to recompute a value used "far apart"
# or at the end of a long fusible chain) and a memory budget
# (`torch._functorch.config.activation_memory_budget`: below 1 it trades compute for memory further).

# %% [quiz]
show_quiz("compile", "q7", "q8")

# %% [markdown]
# ## 6. Inductor: fusion and the code it writes
#
# Inductor lowers every ATen op to a loop body over an index space, then its *scheduler* fuses nodes
# that can share a pass over memory: pointwise ops into each other, pointwise producers into the
# reduction that reads them, and on the CPU whole groups of loop nests under one outer loop. Matmuls are
# not generated: they become `extern_kernels.mm(...)` calls into the BLAS library, and fusion stops at
# them. Everything is written into one Python module, the *output code* (`TORCH_LOGS=output_code`
# prints it; `TORCH_COMPILE_DEBUG=1` keeps it, with the IR before and after fusion, in a debug folder).
#
# `generate_code` runs Dynamo, AOTAutograd, lowering, fusion and code generation, keeps the module and
# the scheduler's record of what each kernel fused, and stops there: nothing is built, so it costs a
# couple of seconds instead of the compiler's tens. It can also write the Triton kernels a GPU would
# get (Inductor's `cpu_backend="triton"`), on this CPU.

# %%
import time

from ptinternals.compile.inductor import generate_code, kernel_source

def mm_between(x, w):
    h = x.sin() @ w                  # pointwise, then a library matmul
    return (h.relu() + 1).sum(-1), torch.softmax(h, -1)

written = {}
for backend in ("cpp", "triton"):
    t0 = time.perf_counter()
    written[backend] = out = generate_code(mm_between, torch.randn(64, 96), torch.randn(96, 32), backend=backend)
    print(f"{backend}: code written in {time.perf_counter() - t0:.1f} s (not built)")
    for name, ops in out.fusion:
        print("   the scheduler fused", ops, "into", name)
    print("   library calls:", out.library)
cpp_code = written["cpp"].code[0]
print(cpp_code[cpp_code.index("def call("):][:1100])

# %% [markdown]
# Read `call(args)` from the top: it unpacks the inputs, allocates each buffer with `empty_strided`
# (sizes and strides decided at compile time), runs the first kernel (the `sin`), calls the BLAS
# matmul through `extern_kernels.mm`, and runs one kernel for everything after the matmul that reads
# it row by row: the `relu`, `+ 1` and `sum` of the first output share one pass. Each kernel is defined
# once, near the top of the module, with its source: C++ with OpenMP pragmas and vector types here,
# a `@triton.jit` function in the Triton version.

# %%
print(kernel_source(cpp_code, written["cpp"].kernel_names[0])[:1200])
print(kernel_source(written["triton"].code[0], written["triton"].kernel_names[0])[:1200])

# %% [markdown]
# ### {{exercise read_kernels}}: read Inductor's output code
#
# Write `read_kernels(code)` for one output-code module: return a pair `(kernels, extern)`. `kernels`
# lists, in definition order, `(name, ops)` for every generated kernel - the names bound at module level
# to `async_compile.cpp_pybinding(...)`, `async_compile.cpp(...)` or `async_compile.triton(...)` - where
# `ops` is the tuple of ATen op names in the kernel's name: strip the prefix (`cpp_fused_`,
# `triton_poi_fused_`, `triton_per_fused_`, `triton_red_fused_`) and the `_<number>` suffix, and split
# the rest at `_` into names torch knows (`torch._C._dispatch_get_all_op_names()` lists `aten::add.Tensor`
# and friends; op names contain `_` too, so prefer the split with the fewest pieces). `extern` lists the
# `extern_kernels.<name>(` calls in order. The check compares with what Inductor generated for many
# programs, C++ and Triton: the kernels with Inductor's own list of the kernels it defined, the ops with
# the scheduler's record (as above), the library calls with the extern kernels of its graph; and with a
# module written in Inductor's format whose kernel names make the split rule matter (there, any split into
# the fewest known names is right).

# %% [answer read_kernels]
def read_kernels(code):
    """([(kernel name, ATen ops in its name)], [extern_kernels calls]) of one Inductor output-code module."""
    ### BEGIN SOLUTION
    # twin: ptinternals.compile.inductor.read_kernels
    import re

    known = {name.split("::", 1)[1].split(".")[0] for name in torch._C._dispatch_get_all_op_names()
             if name.startswith(("aten::", "prims::"))}

    def split_ops(body):
        best = {0: ()}                            # position -> fewest pieces covering body[:position]
        for i in range(len(body) + 1):
            if i not in best or (i > 0 and (i == len(body) or body[i] != "_")):
                continue
            start = i + 1 if i > 0 else 0
            for j in range(start + 1, len(body) + 1):
                if (j == len(body) or body[j] == "_") and body[start:j] in known:
                    if j not in best or len(best[i]) + 1 < len(best[j]):
                        best[j] = best[i] + (body[start:j],)
        return best.get(len(body), (body,))

    kernels = []
    for m in re.finditer(r"^(\w+) = async_compile\.(?:cpp_pybinding|cpp|triton)\(", code, re.MULTILINE):
        name = m.group(1)
        body = re.sub(r"^(cpp|triton_poi|triton_per|triton_red|triton_tem|triton)_fused_", "", name)
        kernels.append((name, split_ops(re.sub(r"_\d+$", "", body))))
    return kernels, re.findall(r"\bextern_kernels\.(\w+)\(", code)
    ### END SOLUTION


# %% [tests read_kernels]
check("compile.read_kernels", read_kernels)
### BEGIN HIDDEN TESTS
check("compile.read_kernels", read_kernels, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# Compile **modes** change what Inductor does, not what Dynamo captures. `mode="reduce-overhead"` records
# the compiled graph into a **CUDA graph** and replays it with one launch (it removes the per-kernel
# launch cost, {{chapter kernels}}; it needs static input addresses, so inputs are copied into place).
# `mode="max-autotune"` benchmarks several Triton templates (and CUDA graphs) for each matmul and
# keeps the fastest, at the price of much longer compiles. Neither changes anything on this CPU.

# %% [quiz]
show_quiz("compile", "q9", "q10")

# %% [markdown]
# ## 7. The capstone, compiled
#
# Compiling the whole GPT of {{chapter gpt}} traces every block: compile time grows with depth. Every
# block runs the same code on parameters of the same shapes, and since Dynamo treats a module's
# parameters as graph *inputs*, one compiled graph can serve them all. **Regional compilation**
# compiles each block (`block.compile()`), so Dynamo traces one block once and every other block
# reuses it; the embeddings and the head stay eager. Here is the notebook's one real Inductor build
# (see the cost note at the top): the first call pays for tracing, code generation and `g++`; the
# timing runs that follow reuse the compiled kernels.

# %%
from ptinternals.compile.speed import compare_gpt

report = compare_gpt(batch=8, regional=True, reps=10)
print(report)

# %% [markdown]
# The compile time printed is what the first call cost. Of it, Dynamo and AOTAutograd take about a
# second and Inductor's lowering and code generation about two (as `generate_code` showed); the rest
# is `g++` building the block's four kernels - and, the first time in a fresh cache, a precompiled
# header. Run the cell again: Dynamo traces again, but Inductor finds the graph in its on-disk cache
# and nothing is built. On this CPU the speed-up is modest: most of the time is matmuls, which the
# compiled code sends to the same BLAS library as eager mode. On a GPU, where each small eager op costs
# a kernel launch and a trip through memory, fusion and CUDA graphs matter far more; the GPU check
# (`bench/bench_compile.py`) measures it there.
#
# ### {{exercise compile_blocks}}: regional compilation
#
# Write `compile_blocks(model, backend)`: compile every transformer block of a `ptinternals.gpt.GPT`
# (`model.transformer.h`) in place with `backend`, and return the model. The check passes a counting
# backend and models built like the capstone's (several depths and widths, inference and training),
# and requires one compiled graph whatever the depth, no embedding or head in it, every block running
# compiled code on every forward, and logits and gradients equal to eager mode's.

# %% [answer compile_blocks]
def compile_blocks(model, backend="inductor"):
    """Compile each block of model.transformer.h in place (one graph serves them all); return model."""
    ### BEGIN SOLUTION
    # twin: ptinternals.compile.speed.compile_blocks
    for block in model.transformer.h:
        block.compile(backend=backend)
    return model
    ### END SOLUTION


# %% [tests compile_blocks]
check("compile.compile_blocks", compile_blocks)
### BEGIN HIDDEN TESTS
check("compile.compile_blocks", compile_blocks, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## What to remember
#
# * Dynamo turns bytecode into FX graphs guarded by checks on the inputs; a graph break splits a frame
#   into separately compiled regions; changing a guarded property recompiles (sizes and ints once, then
#   symbolically).
# * FX passes are graph rewrites over nodes; matching is backwards from an anchor, and a rewrite needs
#   a self-contained match; DCE must know what has side effects.
# * AOTAutograd decides save-versus-recompute per graph with a minimum cut on a cost model of bytes.
# * Inductor fuses everything between library calls into generated kernels, and its output code is
#   readable: kernel names list the ops they fused.
# * Compile time is paid once per new guard set: milliseconds for Dynamo and AOTAutograd, seconds for
#   Inductor's code generation and the C++/Triton build, which its on-disk cache saves on later runs.
#
# Next: {{chapter gpt}} trains the capstone model; compile its blocks there with your `compile_blocks`.

# %% [quiz]
show_quiz("compile", "q11", "q12")

# %% [quiz-grade]
quiz_progress("compile")
