# %% [markdown]
# # {{title}}
#
# You write `a.add(b)`. Between that line and the loop that adds numbers, PyTorch makes a chain of
# decisions: should autograd record this? Should autocast change the dtype first? Does a
# `TorchDispatchMode` want to see it? Is `a` a tensor subclass? A FakeTensor with no data? Which
# device's kernel computes the result? All of them are made by one mechanism, the **dispatcher**,
# and all of them are open to you from Python.
#
# This chapter follows that journey and then uses it:
#
# 1. the path of an op: Python binding, operator (`OpOverload`), **dispatch key set**, kernel;
# 2. how the key set of the inputs and the **thread-local include/exclude sets** pick each kernel
#    (you will predict the path of an op and check it against the real dispatcher);
# 3. `__torch_function__` versus `__torch_dispatch__`, and **TorchDispatchMode**: a FLOP counter
#    and a tracer that records the ATen graph of a forward *and* backward pass;
# 4. **tensor subclasses** built with `_make_wrapper_subclass`: an int8 weight that trains;
# 5. **`torch.library.custom_op`** with fake and autograd registrations, `opcheck` and
#    `torch.compile(fullgraph=True)`;
# 6. **meta and fake tensors**: the memory of a model too big for this machine, without allocating it.
#
# **How this notebook works.** Run the cells in order. Each exercise has an *answer cell* (replace
# `raise NotImplementedError()` with your code) followed by a *check cell* that gives instant
# feedback. Only the code inside answer cells is graded; define any helper you need inside the same
# answer cell. The grader runs your code in a separate process, without the course's reference
# implementation, on many more cases than the visible ones, and compares with real PyTorch. Quiz
# answers are recorded in `dispatch.answers.json` beside this notebook: *practice* questions check
# your answer at once and count no points; *graded* ones only record it (the last answer counts) and
# are scored when your notebook is graded.

# %% [setup]
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.weak import WeakIdKeyDictionary

from ptinternals.grading import check
from ptinternals.quiz import quiz_progress, show_quiz
from ptinternals.viz.dispatch import draw_dispatch_path, draw_key_set

aten = torch.ops.aten

# The runtime dispatch keys this chapter follows, HIGHEST priority first (c10/core/DispatchKey.h;
# the three Autograd keys share one priority bit and the backend bit orders them, Meta > CUDA > CPU).
KEY_PRIORITY = [
    "PythonDispatcher", "PreDispatch", "PythonTLSSnapshot",
    "AutocastCUDA", "AutocastCPU",
    "AutogradMeta", "AutogradCUDA", "AutogradCPU",
    "ADInplaceOrView", "Conjugate", "Functionalize", "Python", "BackendSelect",
    "SparseMeta", "SparseCUDA", "SparseCPU",
    "Meta", "CUDA", "CPU",
]
BACKEND_OF_DEVICE = {"cpu": "CPU", "cuda": "CUDA", "meta": "Meta"}


class Ref:
    """In a recorded graph (the graph_tracer exercise): the value made by node `node`, or its `index`-th output."""

    __slots__ = ("node", "index")

    def __init__(self, node, index=None):
        self.node, self.index = node, index

    def __repr__(self):
        return f"%{self.node}" if self.index is None else f"%{self.node}[{self.index}]"


_ = torch.manual_seed(0)

# %% [markdown]
# The demonstrations below use the course's reference implementation, `ptinternals.dispatch`, which
# models the dispatcher in Python and holds finished versions of this chapter's tools. (It is not
# available when your answers are graded.)

# %%
from ptinternals.dispatch import (  # noqa: E402  (demonstrations only)
    FlopCounter as ReferenceFlopCounter,
    HiddenCopyDetector,
    OpLogger,
    QuantizedTensor,
    estimate_training_memory,
    explain_dispatch,
    function_vs_dispatch,
    fused_bias_gelu,
    trace_forward_backward,
)
from ptinternals.dispatch.fake_memory import format_bytes  # noqa: E402
from ptinternals.dispatch.recorded_path import record_dispatch_path  # noqa: E402

# %% [markdown]
# ## 1. From `a.add(b)` to a kernel
#
# **The Python binding.** `Tensor.add` is generated C++ (`torch/csrc/autograd/generated/
# python_variable_methods.cpp`, from `aten/src/ATen/native/native_functions.yaml`). It parses the
# arguments, picks the matching *overload* of the operator, releases the GIL and calls
# `at::_ops::add_Tensor::call(self, other, alpha)`.
#
# **The operator.** Every ATen operator is registered with the dispatcher under a name and a
# *schema*. From Python, `torch.ops.aten.add` is an `OpOverloadPacket`: the family of all `add`
# overloads. `torch.ops.aten.add.Tensor` is one `OpOverload`: one schema, one dispatch table.

# %%
packet = torch.ops.aten.add
print(type(packet).__name__, "with overloads", packet.overloads()[:6], "...")
print(type(packet.Tensor).__name__, packet.Tensor._schema)
print("aten.add.Scalar:", packet.Scalar._schema)

# %% [markdown]
# **The dispatch table.** An operator holds one kernel slot per *dispatch key*. Some slots hold a
# kernel written for that key (`CPU`: the CPU implementation; `Meta`: a shape-only implementation
# written in Python in `torch/_meta_registrations.py`), some were filled from an *alias* key (a
# `CompositeExplicitAutograd` kernel serves every backend without its own), some from a global
# *fallback*. `torch._C._dispatch_dump_table` prints it (`OperatorEntry::dumpComputedTable`):

# %%
print("torch", torch.__version__, "(CUDA build)" if torch.version.cuda else "(CPU-only build)")
table = torch._C._dispatch_dump_table("aten::add.Tensor").splitlines()
for line in table:
    key = line.split(":")[0]
    if key in ("CPU", "CUDA", "Meta", "AutogradCPU", "AutocastCPU", "ADInplaceOrView", "Python", "BackendSelect"):
        where = line.split("registered at ")[-1].split(" [")[0].split("/")[-1]  # file:line of the registration
        print(f"{key:16s}", line.split("[")[-1].rstrip("]"), "  <-", where)

# %% [markdown]
# (On a CPU-only build, like the torch 2.13 the book is built with, the `CUDA` slot holds a
# `CompositeExplicitAutogradNonFunctional` kernel; a CUDA build, like the GPU machine's torch 2.11,
# registers a real CUDA kernel there. The file names and line numbers are those of the torch printed
# above.)
#
# **The call.** `Dispatcher::call` (`aten/src/ATen/core/dispatch/Dispatcher.h`) does three things:
#
# 1. computes the **dispatch key set**: the union of the key sets of the tensor arguments, plus the
#    thread-local *included* keys, minus the thread-local *excluded* keys, minus the keys at which this
#    operator has a *fallthrough* kernel (`DispatchKeyExtractor::computeDispatchKeySet`);
# 2. takes the key of **highest priority** in that set;
# 3. calls that key's kernel.
#
# That kernel does its job and usually *redispatches*: it calls the same operator again with a key
# set narrowed to the keys below itself. The Autograd kernel records the graph and hands on to the
# kernels below autograd; the CPU kernel at the end of the chain computes. The path of `a.add(b)`
# for two plain CPU tensors:

# %%
a, b = torch.randn(3), torch.randn(3, requires_grad=True)
steps = explain_dispatch("aten::add.Tensor", a, b)
draw_dispatch_path(steps, "a.add(b) on the CPU")

# %% [markdown]
# ## 2. Dispatch keys and key sets
#
# A **dispatch key** names a reason to intercept an op. The ones this chapter follows, from the
# highest priority down:
#
# | key | kernel's job | lives in |
# |---|---|---|
# | `PythonTLSSnapshot` | save the thread-local state so `__torch_dispatch__` sees it | `PythonFallbackKernel.cpp` |
# | `AutocastCPU`, `AutocastCUDA` | cast the inputs to the autocast dtype | `aten/src/ATen/autocast_mode.cpp` |
# | `AutogradCPU`, `AutogradCUDA`, `AutogradMeta` | record the backward graph | `torch/csrc/autograd/generated/VariableType_*.cpp` |
# | `ADInplaceOrView` | bump version counters, set up views | `ADInplaceOrViewType_*.cpp` |
# | `Conjugate` | materialise a lazy `.conj()` | `ConjugateFallback.cpp` |
# | `Functionalize` | turn mutations into pure ops (`torch.compile`) | `FunctionalizeFallbackKernel.cpp` |
# | `Python` | hand the op to `__torch_dispatch__` (modes, subclasses) | `PythonFallbackKernel.cpp` |
# | `BackendSelect` | factory functions: pick the backend from `device=` | `RegisterBackendSelect.cpp` |
# | `CPU`, `CUDA`, `Meta`, `SparseCPU`, ... | compute (Meta: shapes only) | `RegisterCPU.cpp`, ... |
#
# A `DispatchKeySet` is a 64-bit mask (`c10/core/DispatchKeySet.h`): 16 *backend* bits (CPU, CUDA,
# ..., Meta) and one bit per *functionality* (Dense, Sparse, Python, Autograd, Autocast...). A
# per-backend key is a pair: `AutogradCPU` = functionality bit `Autograd` + backend bit `CPU`. The
# priority of a key is the index of its functionality bit, and among backends the higher backend
# bit wins. Picking the next kernel is a count-leading-zeros.
#
# The *order* of the keys in the table above holds in every recent release; their *bit numbers* do
# not. On torch 2.13 (the book's) there are 46 functionality bits and `Python` is functionality 13;
# on torch 2.11 (the GPU machine's) there are 47 and `Python` is 12, because 2.13 moved the `Fake` key
# from just above `Python` to just below it and deleted the `Named` key. The figure is drawn from the
# torch that runs this notebook, whose version it prints.

# %%
t = torch.ones(2, 3)
ks = torch._C._dispatch_keys(t)
print(ks, "| torch", torch.__version__, "| Python is functionality", int(torch._C.DispatchKey.Python))
draw_key_set(ks, f"torch.ones(2, 3) on torch {torch.__version__}: {ks}")

# %% [markdown]
# What goes into a tensor's key set is decided when it is made (`TensorImpl`'s constructor):
#
# * its **backend key**: layout x device (`CPU`, `Meta`, `SparseCPU`...);
# * `ADInplaceOrView` and `Autograd<device>`, for *every* tensor not made under
#   `torch.inference_mode()`, **whatever `requires_grad` says** (the Autograd kernel checks
#   `requires_grad` when it runs; giving the key to every tensor keeps the key set fixed);
# * `Autocast<device>` for devices that have one (cpu and cuda here; meta has none). Autocast is
#   *off* because the thread-local state **excludes** that key by default;
# * `Python` and `PythonTLSSnapshot` for a tensor subclass with `__torch_dispatch__` (FakeTensor is one);
# * `Functionalize` for a `FunctionalTensorWrapper`, `Conjugate` for a lazily conjugated view.

# %%
with torch.inference_mode():
    inference_tensor = torch.ones(2)
with FakeTensorMode():
    fake_cuda = torch.ones(2, device="cuda")  # metadata says cuda; no memory anywhere
for name, x in [("requires_grad=True", torch.ones(2, requires_grad=True)), ("inference tensor", inference_tensor),
                ("meta", torch.ones(2, device="meta")), ("conj view", torch.ones(2, dtype=torch.cfloat).conj()),
                ("FakeTensor on 'cuda'", fake_cuda)]:
    print(f"{name:22s}", torch._C._dispatch_keys(x))

# %% [markdown]
# ### {{exercise tensor_keys}}: the dispatch keys a tensor carries
#
# Write `tensor_keys(device="cpu", *, requires_grad=False, inference=False, subclass=None,
# functional=False, conj=False, sparse=False)` returning the names of the runtime keys in
# `torch._C._dispatch_keys(t)` for a tensor `t` made that way, as a list (any order). `device` is
# `"cpu"`, `"meta"` or `"cuda"`; `subclass` is `None`, `"wrapper"` (a `_make_wrapper_subclass` with
# `__torch_dispatch__`) or `"fake"` (a FakeTensor); `functional` means a `FunctionalTensorWrapper`
# around the tensor; `conj` a lazily conjugated complex view; `sparse` a sparse COO tensor. (The
# cases only combine what torch can build: no `requires_grad` inference tensors, wrappers around
# plain dense tensors, FakeTensors not wrapped in a functional tensor.) Plain Python: no torch.
# `BACKEND_OF_DEVICE` from the setup cell maps a device to its backend key.

# %% [answer tensor_keys]
def tensor_keys(device="cpu", *, requires_grad=False, inference=False, subclass=None, functional=False,
                conj=False, sparse=False):
    """The names of the dispatch keys of a tensor made this way."""
    ### BEGIN SOLUTION
    # twin: ptinternals.dispatch.keys.tensor_keys
    backend = BACKEND_OF_DEVICE[device]
    keys = {"Sparse" + backend if sparse else backend}
    if not inference:  # every non-inference tensor, requires_grad or not
        keys |= {"ADInplaceOrView", "Autograd" + backend}
    if backend in ("CPU", "CUDA"):
        keys.add("Autocast" + backend)
    if subclass is not None:
        keys |= {"Python", "PythonTLSSnapshot"}
    if functional:
        keys.add("Functionalize")
    if conj:
        keys.add("Conjugate")
    return sorted(keys)
    ### END SOLUTION


# %% [tests tensor_keys]
check("dispatch.tensor_keys", tensor_keys)
### BEGIN HIDDEN TESTS
check("dispatch.tensor_keys", tensor_keys, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("dispatch", "q1", "q2")

# %% [markdown]
# ## 3. The thread-local include and exclude sets
#
# Context managers change what runs *without touching any tensor*: they edit two thread-local key
# sets (`c10/core/impl/LocalDispatchKeySet.h`) that `computeDispatchKeySet` ORs in (included) and
# masks out (excluded):
#
# | context | included | excluded |
# |---|---|---|
# | default | `BackendSelect`, `ADInplaceOrView` | every `Autocast*` key |
# | `torch.autocast("cpu")` | | `AutocastCPU` **removed** from the excluded set |
# | `torch.inference_mode()` | `ADInplaceOrView` removed | + every `Autograd*` key |
# | a `TorchDispatchMode` is active | + `Python`, `PythonTLSSnapshot` | |
# | `torch.no_grad()` | (nothing changes) | (nothing changes) |
#
# `torch.no_grad()` is the surprise: it flips `GradMode`, a flag the Autograd kernel reads. The
# Autograd kernel still runs; it just records no graph. And under `inference_mode` a tensor made
# *outside* it still carries `ADInplaceOrView` itself, so an in-place op on it still bumps its
# version counter: the excluded set removes keys, the included set only adds them.

# %%
def tls():
    inc = str(torch._C._dispatch_tls_local_include_set())[15:-1]
    exc = [k for k in str(torch._C._dispatch_tls_local_exclude_set())[15:-1].split(", ") if k in KEY_PRIORITY]
    return f"include {{{inc}}}  exclude {{{', '.join(exc)}}}"


class Quiet(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


print(f"{'default':18s}", tls())
with torch.no_grad():
    print(f"{'no_grad':18s}", tls())
with torch.autocast("cpu", dtype=torch.bfloat16):
    print(f"{'autocast(cpu)':18s}", tls())
with torch.inference_mode():
    print(f"{'inference_mode':18s}", tls())
with Quiet():
    print(f"{'a dispatch mode':18s}", tls())

# %% [markdown]
# ### What each kernel does next
#
# The rules that decide the rest of the path (`Dispatcher.h` `redispatch`, and each kernel's source):
#
# * **Pass-through kernels** (`PythonTLSSnapshot`, the Autograd kernels, `ADInplaceOrView`)
#   redispatch with the key set narrowed to the keys **below** themselves.
# * An **Autocast** kernel casts the inputs and calls the op **again from the top** (a fresh key set
#   from the tensors and the TLS) with its own key added to the *excluded* set, so it runs once.
# * **Python** (`pythonFallback`) first excludes every key *above* Python for the duration. If modes
#   are active, the **innermost** mode handles the op: it is popped off the stack while its
#   `__torch_dispatch__` runs, and its `func(*args)` is a fresh call (Python stays included only if
#   other modes remain). With no mode, the first tensor **subclass** handles it: a wrapper unwraps and
#   calls the op on its plain inner tensors; a FakeTensor enters its FakeTensorMode and calls the op
#   again. With neither, the Python key is simply dropped.
# * **FakeTensorMode** handles an op by running its **Meta** kernel: a fresh call with `Meta` added to
#   the included set and `Python`, `PythonTLSSnapshot` excluded (`in_kernel_invocation_manager` in
#   `torch/_subclasses/fake_tensor.py`: `_set_meta_in_tls_dispatch_include(True)` and
#   `_DisableTorchDispatch`). Whatever device the fake tensors claim, the path ends in `Meta` (the
#   highest backend bit), and no outer mode sees the op.
# * **BackendSelect** (factory functions such as `torch.empty`, which have no tensor to take a key
#   from) redispatches to the backend of the `device=` argument (cpu when none is given).
# * A **backend kernel** (`CPU`, `CUDA`, `Meta`) computes. The path ends.
#
# We can watch the real dispatcher follow these rules. We cannot put a print inside `aten::add`, but
# we can define our own operator with `torch.library` and register a Python kernel at *every* key,
# each logging the key the dispatcher picked (`Library.impl(..., with_keyset=True)`) and then doing
# what PyTorch's own kernel at that key does. `ptinternals.dispatch.recorded_path` defines three such
# probes: `probe(a, b)` (like `add`), `probe_(a, b)` (in place, like `add_`) and
# `probe_factory(size, device=)` (like `empty`). The grader uses them as the truth.

# %%
cpu = {"device": "cpu"}
for label, kwargs in [("plain", {}), ("no_grad", {"grad_mode": False}), ("inference_mode", {"inference_mode": True}),
                      ("autocast('cpu')", {"autocast": "cpu"}), ("one dispatch mode", {"modes": ["python"]})]:
    print(f"{label:18s}", record_dispatch_path("probe", cpu, cpu, **kwargs))
print(f"{'in place':18s}", record_dispatch_path("probe_", cpu, cpu))
print(f"{'factory on meta':18s}", record_dispatch_path("probe_factory", factory_device="meta"))

# %%
draw_dispatch_path(explain_dispatch("aten::mm", "cpu", "cpu", autocast="cpu", modes=["python"]),
                   "mm under autocast('cpu') inside a TorchDispatchMode (autocast calls the op again)")

# %% [markdown]
# ### {{exercise dispatch_path}}: predict the dispatch path
#
# Write `dispatch_path(tensors, *, fallthrough=(), modes=(), grad_mode=True, inference_mode=False,
# autocast=None, factory_device=None)` returning the keys whose kernels run, in order, **leaving out
# `PythonTLSSnapshot`** (it only saves the TLS and passes on; the probes cannot observe it).
#
# * `tensors`: a list of descriptions, each a dict of `tensor_keys`' arguments (`device`,
#   `requires_grad`, `inference`, `subclass`); all on one device;
# * `fallthrough`: the keys at which this operator has a fallthrough kernel (remove them from the key
#   set before picking; for `probe` they are `BackendSelect` and `ADInplaceOrView`);
# * `modes`: the active dispatch modes, outermost first, each `"python"` (a plain
#   `TorchDispatchMode` that calls `func(*args)`) or `"fake"` (a `FakeTensorMode`, always outermost,
#   with FakeTensor inputs); FakeTensors may also be used with no `"fake"` mode active (made under one
#   earlier): then the FakeTensor subclass handles the op and enters its mode;
# * `autocast`: `None` or `"cpu"`; `factory_device`: the `device=` of a factory call (no tensors).
#
# Follow the rules above with sets of key names; `KEY_PRIORITY` (setup cell) orders them, highest
# first. Use your `tensor_keys`. Plain Python: no torch. This is the chapter's main exercise: 3 points.

# %% [answer dispatch_path]
def dispatch_path(tensors, *, fallthrough=(), modes=(), grad_mode=True, inference_mode=False, autocast=None,
                  factory_device=None):
    """The dispatch keys whose kernels run for one call of an op, in order (no PythonTLSSnapshot)."""
    ### BEGIN SOLUTION
    # twin: ptinternals.dispatch.dispatcher.dispatch_path
    rank = {key: i for i, key in enumerate(KEY_PRIORITY)}  # 0 = highest priority
    autograd_keys = {"AutogradCPU", "AutogradCUDA", "AutogradMeta"}
    above_python = {k for k in KEY_PRIORITY if rank[k] < rank["Python"]}
    path = []

    def call(tensors, included, excluded, modes):
        """Dispatcher::call: a fresh key set from the tensors and the thread-local sets."""
        ks = set(included)
        for t in tensors:
            ks |= set(tensor_keys(**t))
        run(ks - excluded - set(fallthrough), tensors, included, excluded, modes)

    def run(ks, tensors, included, excluded, modes):
        key = min(ks, key=rank.__getitem__)
        if key != "PythonTLSSnapshot":
            path.append(key)
        if key in ("PythonTLSSnapshot", "ADInplaceOrView") or key in autograd_keys:
            return run({k for k in ks if rank[k] > rank[key]}, tensors, included, excluded, modes)
        if key.startswith("Autocast"):
            return call(tensors, included, excluded | {key}, modes)
        if key == "BackendSelect":
            return run({BACKEND_OF_DEVICE[factory_device or "cpu"]}, tensors, included, excluded, modes)
        if key != "Python":
            return  # a backend kernel computes the result
        excluded = excluded | above_python
        if modes:  # the innermost mode handles it, popped off the stack while it runs
            mode, rest = modes[-1], modes[:-1]
            if not rest:
                included = included - {"Python", "PythonTLSSnapshot"}
            if mode == "fake":
                return call(tensors, included | {"Meta"}, excluded | {"Python", "PythonTLSSnapshot"}, rest)
            return call(tensors, included, excluded, rest)
        owners = [t["subclass"] for t in tensors if t.get("subclass")]  # no mode left: a subclass handles it
        if owners[:1] == ["fake"]:  # FakeTensor.__torch_dispatch__ enters its mode and calls again
            return call(tensors, included | {"Python", "PythonTLSSnapshot"}, excluded, ["fake"])
        inner = [dict(t, subclass=None) if t.get("subclass") == "wrapper" else t for t in tensors]
        return call(inner, included, excluded, modes)  # a wrapper calls the op on its inner tensors

    included, excluded = {"BackendSelect", "ADInplaceOrView"}, {"AutocastCPU", "AutocastCUDA"}
    if autocast is not None:
        excluded = excluded - {"Autocast" + BACKEND_OF_DEVICE[autocast]}
    if inference_mode:
        included = included - {"ADInplaceOrView"}
        excluded = excluded | autograd_keys
    if modes:
        included = included | {"Python", "PythonTLSSnapshot"}
    call(tensors, included, excluded, list(modes))
    return path
    ### END SOLUTION


# %% [tests dispatch_path]
check("dispatch.dispatch_path", dispatch_path)
### BEGIN HIDDEN TESTS
check("dispatch.dispatch_path", dispatch_path, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### Reading "no kernel" errors
#
# When the highest-priority key of the key set has no kernel, the dispatcher raises
# `NotImplementedError: Could not run '<op>' with arguments from the '<key>' backend`, followed by
# the list of keys that *do* have kernels. Read it as: "the key set picked `<key>`; nobody registered
# a kernel there". The usual causes: an op implemented only for CUDA called on a CPU tensor; a custom
# op with no fake/Meta kernel reaching FakeTensorMode or `torch.compile` (whose error says *"no fake
# impl or Meta kernel registered"*); or a tensor on an unexpected device.

# %%
lib = torch.library.Library("ch03_demo", "FRAGMENT")
lib.define("only_meta(Tensor self) -> Tensor")
lib.impl("only_meta", lambda x: torch.empty_like(x), "Meta")
try:
    torch.ops.ch03_demo.only_meta(torch.zeros(2))
except NotImplementedError as e:
    print(str(e).split("\n")[0][:200])
print("on a meta tensor:", torch.ops.ch03_demo.only_meta(torch.zeros(2, device="meta")))

# %% [quiz]
show_quiz("dispatch", "q3", "q8")

# %% [markdown]
# ## 4. `__torch_function__` versus `__torch_dispatch__`
#
# PyTorch offers two places to intercept calls from Python, at two very different heights:
#
# * **`__torch_function__`** (`torch/overrides.py`; a `TorchFunctionMode` for all tensors) sees the
#   *public Python API call* (`torch.nn.functional.linear`, `Tensor.__add__`) **before** the
#   dispatcher: before autograd, before any decomposition.
# * **`__torch_dispatch__`** (`torch/utils/_python_dispatch.py`; a `TorchDispatchMode` for all
#   tensors) is the kernel at the `Python` dispatch key: it sees **ATen ops after autograd** and after
#   `CompositeImplicitAutograd` operators (`linear`, `matmul`, `scaled_dot_product_attention`) have
#   decomposed into the ops that do the work. The backward pass's ops come through it too, because
#   the autograd engine calls ATen ops like anyone else.

# %%
x, w, bias = torch.randn(4, 8, requires_grad=True), torch.randn(16, 8, requires_grad=True), torch.randn(16)
seen = function_vs_dispatch(lambda: F.linear(x, w, bias).sum().backward())
print("__torch_function__ saw:", seen["torch_function"])
print("__torch_dispatch__ saw:", seen["torch_dispatch"])

# %% [markdown]
# A `TorchDispatchMode` is a context manager. Inside `with mode:`, every op lands in
# `mode.__torch_dispatch__(func, types, args, kwargs)` with `func` an `OpOverload` (`aten.mm.default`)
# and real tensor arguments. The mode is popped off the stack while its handler runs, so
# `func(*args, **kwargs)` inside it goes straight to the kernels below. The reference `OpLogger`:

# %%
q, k, v = torch.randn(3, 1, 2, 5, 8)  # (batch 1, 2 heads, 5 positions, head dim 8) each
with OpLogger() as log:
    F.scaled_dot_product_attention(q, k, v, is_causal=True)
print(log)

# %% [markdown]
# ### Counting FLOPs
#
# `torch.utils.flop_counter.FlopCounterMode` is such a mode: a table of formulas, one per op that
# does matmul-like work, and a counter. The convention: one multiply-add is **2 FLOPs**, so an
# `(m, k) @ (k, n)` product costs `2*m*k*n`; elementwise ops, softmax and bias adds count 0.
#
# On this CPU, `F.scaled_dot_product_attention` runs the fused kernel
# `aten._scaled_dot_product_flash_attention_for_cpu`, for which FlopCounterMode has **no formula**:
# it counts attention as free.

# %%
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

q = torch.randn(2, 4, 128, 32)
with FlopCounterMode(display=False) as fcm:
    F.scaled_dot_product_attention(q, q, q, is_causal=True)
with ReferenceFlopCounter() as ours:
    F.scaled_dot_product_attention(q, q, q, is_causal=True)
print("FlopCounterMode:", fcm.get_total_flops(), "| ptinternals FlopCounter:", ours.total,
      "= 2 bmms of 2*b*h*s*s*d:", 2 * 2 * 2 * 4 * 128 * 128 * 32)

# %% [markdown]
# ### {{exercise flop_counter}}: a FLOP-counting TorchDispatchMode
#
# Complete `FlopCounter`: `counter.total` must hold the FLOPs of every op run inside `with counter:`,
# forward and backward, counted like FlopCounterMode and *also* counting the CPU attention kernels
# (the grader teaches FlopCounterMode torch's own attention formulas to compare). Count these ops
# (`func._overloadpacket` is `aten.mm` for `aten.mm.default`):
#
# | op | FLOPs |
# |---|---|
# | `aten.mm(a, b)`: a `(m, k)`, b `(k, n)` | `2*m*k*n` |
# | `aten.addmm(bias, a, b)` | the same, on `args[1]`, `args[2]` |
# | `aten.bmm(a, b)`: a `(B, m, k)`, b `(B, k, n)` | `2*B*m*k*n` |
# | `aten.baddbmm(c, a, b)` | the same, on `args[1]`, `args[2]` |
# | `aten.convolution(x, w, ...)` (forward) | `2 * batch * c_out * (c_in/groups) * prod(kernel) * prod(out spatial)`, with `w` of shape `(c_out, c_in/groups, *kernel)` |
# | `aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, ...)`: q `(b, h, s_q, d)`, k `(b, h, s_k, d)`, v `(b, h, s_k, d_v)` | two bmms: `2*b*h*s_q*s_k*(d + d_v)` |
# | `aten._scaled_dot_product_flash_attention_for_cpu_backward(grad_out, q, k, v, ...)` | recompute `QK^T`, then `dV`, `dP`, `dQ`, `dK`: `2*b*h*s_q*s_k*(3*d + 2*d_v)` |
#
# (The models are `nn.Linear` stacks, batched matmuls, a convolution, attention and a GPT-style block.
# Write the counting yourself: while your counter runs, the grader empties FlopCounterMode's table of
# formulas.)

# %% [answer flop_counter]
class FlopCounter(TorchDispatchMode):
    """`with FlopCounter() as fc: ...` leaves the FLOPs of every ATen op that ran in `fc.total`."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ### BEGIN SOLUTION
        # twin: ptinternals.dispatch.flops.FlopCounter
        out = func(*args, **(kwargs or {}))
        self.total += self.flops(func._overloadpacket, args, out)
        return out

    @staticmethod
    def flops(packet, args, out):
        if packet is aten.mm or packet is aten.addmm:
            a, b = args[-2:] if packet is aten.addmm else args[:2]
            (m, k), n = a.shape, b.shape[1]
            return 2 * m * k * n  # (m, k) @ (k, n): m*n dot products of length k
        if packet is aten.bmm or packet is aten.baddbmm:
            a, b = args[1:3] if packet is aten.baddbmm else args[:2]
            (batch, m, k), n = a.shape, b.shape[2]
            return 2 * batch * m * k * n
        if packet is aten.convolution:
            x, w = args[0], args[1]
            c_out, c_in_per_group, *kernel = w.shape
            return 2 * x.shape[0] * c_out * c_in_per_group * math.prod(kernel) * math.prod(out.shape[2:])
        if packet is aten._scaled_dot_product_flash_attention_for_cpu:
            q, k, v = args[:3]
        elif packet is aten._scaled_dot_product_flash_attention_for_cpu_backward:
            q, k, v = args[1:4]
        else:
            return 0
        b, h, s_q, d = q.shape
        s_k, d_v = k.shape[2], v.shape[3]
        if packet is aten._scaled_dot_product_flash_attention_for_cpu:
            return 2 * b * h * s_q * s_k * (d + d_v)  # Q K^T, then P V
        return 2 * b * h * s_q * s_k * (3 * d + 2 * d_v)  # Q K^T again, dV, dP, dQ, dK
        ### END SOLUTION


# %% [tests flop_counter]
check("dispatch.flop_counter", FlopCounter)
### BEGIN HIDDEN TESTS
check("dispatch.flop_counter", FlopCounter, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# What the numbers mean: a training step costs about **3x** its forward pass in FLOPs (backward
# computes two products per forward product: the gradient for the input and for the weight). For
# attention the backward is 2.5x the forward. The reference counter on a small GPT-style block:

# %%
from ptinternals.dispatch.scaffold import Block  # noqa: E402

block, xb = Block(64, 4), torch.randn(2, 32, 64, requires_grad=True)
with ReferenceFlopCounter() as fwd:
    out = block(xb)
with ReferenceFlopCounter() as bwd:
    out.sum().backward()
print(f"forward {fwd.total / 1e6:.2f} MFLOP, backward {bwd.total / 1e6:.2f} MFLOP, ratio {bwd.total / fwd.total:.2f}")
print({k: v for k, v in bwd.by_op.items()})

# %% [quiz]
show_quiz("dispatch", "q4", "q5")

# %% [markdown]
# ## 5. Tracing: the ATen graph of a training step
#
# A dispatch mode that *records* instead of counting is a tracer. Each op that reaches
# `__torch_dispatch__` becomes a node; its arguments point at the nodes that produced them. Tensor
# **identity** is the link: remember each output tensor as "made by node n"; a later op taking that
# tensor gets an edge to n. This is the idea behind `make_fx` (`torch/fx/experimental/
# proxy_tensor.py`, which uses proxies instead of identities) and behind AOTAutograd, which traces
# forward and backward into one graph before `torch.compile` hands it to a backend. The reference:

# %%
lin = nn.Linear(3, 2)
graph = trace_forward_backward(lambda x: lin(x).square().mean(), torch.randn(4, 3, requires_grad=True),
                               params=dict(lin.named_parameters()))
print(graph)

# %% [markdown]
# ### {{exercise graph_tracer}}: record the ATen graph of forward and backward
#
# Complete `GraphTracer`. The grader names the inputs and parameters with
# `tracer.placeholder(tensor, name)`, runs `with tracer:` the forward pass and `loss.backward()`, then
# calls `tracer.output(loss, *grads)` (after the `with`). `tracer.nodes` must then be a list of
# tuples `(name, target, args, kwargs)`, in execution order:
#
# * `(name, "placeholder", (), {})` for each `placeholder` call;
# * `(name, "constant", (tensor,), {})` for a tensor an op uses that the graph neither produced nor
#   took as a placeholder (e.g. a mask captured by a closure);
# * `(name, func, args, kwargs)` for each op, with `func` the `OpOverload` and every tensor in
#   `args`/`kwargs` (they may be nested in lists) replaced by `Ref(node)`, or `Ref(node, i)` when it is
#   the `i`-th output of an op that returns several tensors (`native_layer_norm`, `split`...);
# * `("output", "output", (refs...), {})` last.
#
# Names must be unique. The grader compares your call nodes (ops and the names of their kwargs) with
# the ops torch dispatched, then **replays** your graph on new input values, op by op, and compares
# the loss and gradients with an eager run on those values. Mind object lifetimes: `id()` of a freed
# tensor is reused, so either keep the tensors alive or use `torch.utils.weak.WeakIdKeyDictionary`
# (a dict keyed by tensor identity). `tree_map(fn, args)` (setup cell) maps `fn` over nested args.

# %% [answer graph_tracer]
class GraphTracer(TorchDispatchMode):
    """Records every ATen op as a node; tensors become Refs to the nodes that made them."""

    def __init__(self):
        super().__init__()
        self.nodes = []
        self._ref_of = WeakIdKeyDictionary()  # tensor -> Ref of the node that made it (a weak, identity-keyed dict)

    def placeholder(self, t, name):
        ### BEGIN SOLUTION
        # twin: ptinternals.dispatch.tracing.GraphTracer
        self.nodes.append((name, "placeholder", (), {}))
        self._ref_of[t] = Ref(name)
        ### END SOLUTION

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ### BEGIN SOLUTION
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = f"{func._overloadpacket.__name__}_{len(self.nodes)}"
        self.nodes.append((name, func, tree_map(self._ref, args), tree_map(self._ref, kwargs)))
        if isinstance(out, torch.Tensor):
            self._ref_of[out] = Ref(name)  # an in-place op re-points its tensor at the new node
        elif isinstance(out, (tuple, list)):
            for i, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    self._ref_of[o] = Ref(name, i)
        return out

    def _ref(self, x):
        if not isinstance(x, torch.Tensor):
            return x
        if x not in self._ref_of:  # neither produced nor a placeholder: a constant
            name = f"const_{len(self.nodes)}"
            self.nodes.append((name, "constant", (x,), {}))
            self._ref_of[x] = Ref(name)
        return self._ref_of[x]
        ### END SOLUTION

    def output(self, *values):
        ### BEGIN SOLUTION
        self.nodes.append(("output", "output", tuple(self._ref(v) for v in values), {}))
        ### END SOLUTION


# %% [tests graph_tracer]
check("dispatch.graph_tracer", GraphTracer)
### BEGIN HIDDEN TESTS
check("dispatch.graph_tracer", GraphTracer, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# A recorded graph is a program. `torch.fx` can run it: the reference's `AtenGraph.to_fx()` turns its
# record into a `GraphModule` that reproduces the loss and gradients.

# %%
gm = graph.to_fx()
replayed = gm(*graph.example_inputs())
print("replayed loss", float(replayed[0]), "| gradient shapes", [tuple(g.shape) for g in replayed[1:]])

# %% [markdown]
# Compilers prefer graphs without mutation. Before AOTAutograd hands a graph on, it **functionalizes**
# it: tensors are wrapped in `FunctionalTensorWrapper`s, whose `Functionalize` key routes every op to
# a kernel that replaces in-place ops and views by their out-of-place versions
# (`FunctionalizeFallbackKernel.cpp`, `torch/_subclasses/functional_tensor.py`). `make_fx` (the
# proxy-based tracer) shows the effect:

# %%
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402


def bump(x):
    y = x.clone()
    y.add_(1)            # in place
    y[0].mul_(2)         # in place, through a view
    return y


def call_targets(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


print("traced as written:", call_targets(make_fx(bump)(torch.zeros(3))))
print("functionalized:   ", call_targets(make_fx(torch.func.functionalize(bump))(torch.zeros(3))))

# %% [markdown]
# ## 6. Tensor subclasses: a wrapper around int8 data
#
# A subclass with `__torch_dispatch__` gets the `Python` key, so every ATen op on it lands in its
# handler, **below autograd**: autograd sees an ordinary tensor of the *logical* dtype and records
# as usual; the handler decides what the op means for the data inside.
#
# A **wrapper subclass** is made with `torch.Tensor._make_wrapper_subclass(cls, shape, dtype=...,
# device=...)` (`torch/csrc/autograd/python_variable.cpp`): a tensor with metadata and **no storage
# of its own**. The real data lives in ordinary tensors held as attributes. This is how FakeTensor,
# DTensor, torchao's quantised tensors and `torch.testing._internal.two_tensor.TwoTensor` are built.
# Three details matter:
#
# * `__torch_function__ = torch._C._disabled_torch_function_impl`, else the default
#   `Tensor.__torch_function__` would try to re-wrap every result in your class;
# * `nn.Parameter(t)` calls `t.detach()`: handle `aten.detach.default` to keep your class;
# * ops you do not handle can **fall back**: convert to plain tensors and run the op.
#
# The reference `QuantizedTensor` stores an int8 weight and multiplies by the scales *inside* `mm`:

# %%
w = torch.randn(512, 256)
qt = QuantizedTensor.quantize(w, axis=0)
print(qt, "| inner:", qt.int_data.dtype, tuple(qt.int_data.shape), "+", qt.scale.dtype, tuple(qt.scale.shape))
print("keys:", torch._C._dispatch_keys(qt))
print("bytes: fp32", w.numel() * 4, "-> int8 + scales", qt.int_data.numel() + qt.scale.numel() * 4)
print("max |w - dequantize(q)| =", float((qt.dequantize() - w).abs().max()), "<= scale/2 =", float(qt.scale.max() / 2))

# %% [markdown]
# ### {{exercise int8_tensor}}: an int8 weight that survives a training step
#
# Complete `Int8Tensor`, a wrapper subclass for 2-d weights with symmetric, **per-output-row** int8
# quantisation:
#
# * `Int8Tensor(int_data, scale)`: `int_data` int8 of shape `(out, in)`, `scale` float of shape
#   `(out,)`; the wrapper has `int_data`'s shape, `scale`'s (floating) dtype and `int_data`'s device;
#   keep the two as attributes with exactly these names;
# * `Int8Tensor.quantize(w)`: `scale = max|w[row]| / 127`, `int_data = round(w / scale)` clamped to
#   `[-127, 127]`, as int8 (what `torch.quantize_per_channel(w, scale, zero_points=0, axis=0,
#   dtype=torch.qint8).int_repr()` gives);
# * `dequantize()`: `int_data * scale` per row, in `scale`'s dtype;
# * `__torch_dispatch__`: `aten.detach.default` returns a new `Int8Tensor` over the same data; every
#   other op dequantises its `Int8Tensor` arguments and runs on plain tensors.
#
# The grader replaces the weights of a `Linear -> ReLU -> LayerNorm -> Linear` model by
# `nn.Parameter(Int8Tensor.quantize(w), requires_grad=False)`, runs a forward, backward and SGD step
# (the biases, the LayerNorm and the input still train), and compares with the same model whose
# weights are torch's dequantised values.

# %% [answer int8_tensor]
class Int8Tensor(torch.Tensor):
    """A 2-d weight stored as int8 codes with one float scale per output row."""

    @staticmethod
    def __new__(cls, int_data, scale):
        ### BEGIN SOLUTION
        # twin: ptinternals.dispatch.quantized.Int8Tensor
        # no storage of its own: shape of the codes, logical dtype of the scales
        return torch.Tensor._make_wrapper_subclass(cls, int_data.shape, dtype=scale.dtype, device=int_data.device)
        ### END SOLUTION

    def __init__(self, int_data, scale):
        self.int_data, self.scale = int_data, scale  # int8 (out, in): 1 byte each; float (out,)

    @classmethod
    def quantize(cls, w):
        ### BEGIN SOLUTION
        scale = w.abs().amax(dim=1) / 127  # (out,)
        codes = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(codes, scale)
        ### END SOLUTION

    def dequantize(self):
        ### BEGIN SOLUTION
        return self.int_data.to(self.scale.dtype) * self.scale[:, None]
        ### END SOLUTION

    def __repr__(self):
        return f"Int8Tensor(shape={tuple(self.shape)}, dtype={self.dtype})"

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        ### BEGIN SOLUTION
        kwargs = kwargs or {}
        if func is aten.detach.default:  # nn.Parameter(t) calls t.detach()
            return cls(args[0].int_data, args[0].scale)
        plain = lambda x: x.dequantize() if isinstance(x, Int8Tensor) else x  # noqa: E731
        return func(*tree_map(plain, args), **tree_map(plain, kwargs))
        ### END SOLUTION


# %% [tests int8_tensor]
check("dispatch.int8_tensor", Int8Tensor)
### BEGIN HIDDEN TESTS
check("dispatch.int8_tensor", Int8Tensor, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# Where does the `Python` step sit on the path of `F.linear(x, weight)` when `weight` is a wrapper?
# `linear` is `CompositeImplicitAutograd`: at `AutogradCPU` it decomposes into `t` and `addmm`, each
# dispatched afresh. `t(weight)` reaches the subclass; `addmm` on plain tensors never does:

# %%
x2 = torch.randn(2, 256)
with OpLogger() as log:
    F.linear(x2, qt)
print(log)

# %% [quiz]
show_quiz("dispatch", "q6")

# %% [markdown]
# ## 7. Custom operators with `torch.library`
#
# A Python function is invisible to the dispatcher: autograd differentiates through it op by op,
# FakeTensorMode runs it op by op, and `torch.compile` traces into it (and breaks the graph at
# anything it cannot trace). `torch.library.custom_op` (`torch/_library/custom_ops.py`) makes it a
# real **operator** instead: it infers a schema from the type hints and registers your function as
# the kernel of every backend (`CompositeExplicitAutograd`, a "default backend kernel"). Two more
# registrations make it a first-class citizen:
#
# * **`register_fake`**: the shape/dtype rule, run on FakeTensors (`torch.compile` and
#   FakeTensorMode call it instead of the kernel). It returns an empty tensor of the output's
#   metadata and computes nothing;
# * **`register_autograd(backward, setup_context=...)`**: `setup_context(ctx, inputs, output)` saves
#   what backward needs; `backward(ctx, grad_out)` returns one gradient per input. It is registered at
#   the `Autograd` alias key, so the op is one node in the autograd graph.
#
# `torch.library.opcheck(op, args)` then tests the schema, the fake kernel against the real one, the
# autograd registration and the op under AOTAutograd. The reference `ptinternals::fused_bias_gelu`:

# %%
for line in torch._C._dispatch_dump_table("ptinternals::fused_bias_gelu").splitlines():
    key = line.split(":")[0]
    if key in ("CPU", "CUDA", "Meta", "AutogradCPU"):
        print(f"{key:12s}", line.split("[")[-1].rstrip("]"))
xs = torch.randn(8, 16, dtype=torch.float64, requires_grad=True)
bs = torch.randn(16, dtype=torch.float64, requires_grad=True)
print(torch.library.opcheck(fused_bias_gelu, (xs, bs)))

# %% [markdown]
# Under `torch.compile(fullgraph=True)`, Dynamo never looks inside the op: the fake kernel gives it the
# output's metadata, so the op stays one opaque node and there is no graph break. (The `aot_eager`
# backend stops after AOTAutograd; inductor would also generate code, at about 16 s per cold compile
# on this CPU.)

# %%
def f(x, b):
    return fused_bias_gelu(x @ x.t(), b).sum(-1) * 2


xc, bc = torch.randn(4, 4), torch.randn(4)
explanation = torch._dynamo.explain(f)(xc, bc)
print("graphs:", explanation.graph_count, "| graph breaks:", explanation.graph_break_count)
print("\n".join(line.split(";")[0] for line in explanation.graphs[0].code.strip().splitlines()[-4:]))

# %% [markdown]
# ### {{exercise custom_op}}: a custom operator
#
# Write `define_op(namespace)` that defines `f"{namespace}::fused_bias_gelu"` with
# `torch.library.custom_op(..., mutates_args=())` and returns it. The op computes `gelu(x + bias)`
# with the exact GELU `0.5 * z * (1 + erf(z / sqrt(2)))`, `bias` of shape `(x.shape[-1],)`. Register:
#
# * a fake kernel (the output has `x`'s shape, dtype and device);
# * an autograd formula: `d gelu(z) / dz = Phi(z) + z * phi(z)` with `Phi(z) = 0.5 * (1 + erf(z /
#   sqrt(2)))` and `phi(z) = exp(-z^2 / 2) / sqrt(2 pi)`; the gradient for `bias` sums over every
#   dimension but the last.
#
# The grader calls `define_op` with a fresh namespace per case (re-registering a name in one process
# would collide), and checks values and gradients against `F.gelu`, the fake kernel under
# FakeTensorMode (on `"cpu"` and on `"cuda"`), the dispatch table, `opcheck` and
# `torch.compile(..., backend="aot_eager", fullgraph=True)`.

# %% [answer custom_op]
def define_op(namespace):
    """Define and return f"{namespace}::fused_bias_gelu" with fake and autograd registrations."""
    ### BEGIN SOLUTION
    # twin: ptinternals.dispatch.custom_ops.define_fused_bias_gelu
    inv_sqrt2, inv_sqrt_2pi = 1 / math.sqrt(2), 1 / math.sqrt(2 * math.pi)

    @torch.library.custom_op(f"{namespace}::fused_bias_gelu", mutates_args=())
    def fused_bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        z = x + bias  # read x [.., N] and bias [N], write out [.., N]
        return 0.5 * z * (1 + torch.erf(z * inv_sqrt2))

    @fused_bias_gelu.register_fake
    def _(x, bias):
        return torch.empty_like(x)  # metadata only

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)  # recompute z = x + bias in backward rather than save it

    def backward(ctx, grad_out):
        x, bias = ctx.saved_tensors
        z = x + bias
        grad_z = grad_out * (0.5 * (1 + torch.erf(z * inv_sqrt2)) + z * torch.exp(-0.5 * z * z) * inv_sqrt_2pi)
        return grad_z, grad_z.reshape(-1, grad_z.shape[-1]).sum(0)

    fused_bias_gelu.register_autograd(backward, setup_context=setup_context)
    return fused_bias_gelu
    ### END SOLUTION


# %% [tests custom_op]
check("dispatch.custom_op", define_op)
### BEGIN HIDDEN TESTS
check("dispatch.custom_op", define_op, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("dispatch", "q7", "q9")

# %% [markdown]
# ### The same operator in C++
#
# `custom_op` registers a *Python* function as the kernel: every call runs the interpreter, and its
# body is three ATen ops, each a pass over memory. PyTorch's own operators, and the kernels of
# libraries such as torchvision, are C++ functions registered in the same dispatch tables from C++
# (`torch/library.h`):
#
# * `TORCH_LIBRARY(ns, m) { m.def("fused_bias_gelu(Tensor x, Tensor bias) -> Tensor"); }` declares the
#   schema: the dispatcher gets an operator `ns::fused_bias_gelu` with an empty table;
# * `TORCH_LIBRARY_IMPL(ns, CPU, m) { m.impl("fused_bias_gelu", &fused_bias_gelu_cpu); }` puts a kernel in
#   its CPU slot (`TORCH_LIBRARY_IMPL(ns, CUDA, m)` in its CUDA slot). The kernel's C++ signature follows
#   the schema: `Tensor` arguments arrive as `const at::Tensor&`, the result is an `at::Tensor`;
# * inside the kernel, `AT_DISPATCH_FLOATING_TYPES(dtype, name, [&] { ... })` is a `switch` over the
#   dtype that compiles the lambda once per floating type, with `scalar_t` the element type; one pass over
#   the data reads `x` and `bias` and writes the output (for fp32, 8 bytes per element).
#
# `torch.utils.cpp_extension.load_inline(name, cpp_sources=[source], is_python_module=False)` writes the
# source to `main.cpp` in a build folder, runs ninja and g++ into `name.so` and loads it with
# `torch.ops.load_library`: the .so's static initialisers run the two blocks, and the op appears as
# `torch.ops.ns.fused_bias_gelu`. The compile is the slow part: **about 10 s on a 2-core CPU** for a source
# that includes only `torch/library.h` and a few ATen headers (`no_implicit_headers=True`), about 35 s with
# load_inline's default `#include <torch/extension.h>` (all of ATen and pybind11). A second build of the
# same source finds its .so and compiles nothing. What C++ cannot easily do is left to Python, as PyTorch
# recommends: `torch.library.register_fake` and `torch.library.register_autograd` work on any operator,
# C++ ones included. The reference builds its C++ kernel (and, on a machine with a GPU and nvcc, a CUDA
# kernel registered at `CUDA` the same way) and shows where each slot's kernel came from:

# %%
import time  # noqa: E402

from ptinternals.dispatch import cpp_op  # noqa: E402

if cpp_op.compiler_missing():
    print(f"SKIPPED: {cpp_op.compiler_missing()}: the C++ operator needs g++ and ninja (pip install ninja)")
else:
    with cpp_op.loaded() as cpp_gelu:
        for key, origin in cpp_op.kernel_origin(cpp_gelu).items():
            print(f"{key:12s}", origin.replace(cpp_op.build_root(), "<build>"))
        print(torch.library.opcheck(cpp_gelu, (xs, bs)))
        xt, bt = torch.randn(2048, 1024), torch.randn(1024)
        for name, fn in [("C++ kernel", cpp_gelu), ("custom_op (Python)", fused_bias_gelu),
                         ("F.gelu(x + bias)", lambda x, b: F.gelu(x + b))]:
            fn(xt, bt)  # warm up
            t0 = time.perf_counter()
            for _ in range(5):
                fn(xt, bt)
            print(f"{name:20s} {(time.perf_counter() - t0) / 5 * 1e3:6.2f} ms for 2 M elements")

# %% [markdown]
# ### {{exercise cpp_op}}: the operator in C++
#
# Complete `FusedBiasGeluCpp`:
#
# * `source()` returns the C++: a kernel computing `gelu(x + bias)` with the exact GELU
#   `0.5 * z * (1 + erf(z / sqrt(2)))` (`std::erf`) for every floating dtype, `bias` of shape
#   `(x.shape[-1],)`, inputs of any strides (`.contiguous()` gives you dense rows); the schema in
#   `TORCH_LIBRARY(NAMESPACE, m)` and the kernel in `TORCH_LIBRARY_IMPL(NAMESPACE, CPU, m)`. Write the word
#   `NAMESPACE` where the namespace goes: the grader puts a namespace of its own there, one per version
#   of your source (a namespace can be defined once per process). Include what you use:
#   `<torch/library.h>`, `<ATen/core/Tensor.h>`, `<ATen/Dispatch.h>`, `<ATen/ops/empty.h>`,
#   `<ATen/Parallel.h>` (for `at::parallel_for`), `<cmath>`.
# * `register(namespace, lib)` adds the fake kernel and the autograd formula of
#   `f"{namespace}::fused_bias_gelu"` with `torch.library.register_fake(..., lib=lib)` and
#   `torch.library.register_autograd(..., lib=lib)`: registrations that belong to the `Library` fragment
#   `lib`, which the grader destroys after each case. The fake kernel must describe what your C++ returns,
#   strides included (opcheck compares them). The backward is {{exercise custom_op}}'s: `gelu_derivative`
#   (given in the cell) computes gelu'(z).
#
# The grader compiles your source with `load_inline` once per version of it (about 10 s here; checking an
# unchanged source again reuses the build), then checks values and gradients against `F.gelu`, fake
# tensors, the dispatch table, `opcheck` and `torch.compile`. The CPU kernel must be your compiled C++ (the
# dispatch table says where each kernel came from) and compute gelu itself: the grader watches the ATen
# ops your kernel calls, and `aten::gelu` is not allowed. On a machine without a C++ compiler or ninja,
# the cell above and this check print SKIPPED and say what is missing (the grading machines have both).

# %% [answer cpp_op]
def gelu_derivative(z):
    """gelu'(z) = Phi(z) + z * phi(z): the formula of your backward in the custom_op exercise, given here."""
    return 0.5 * (1 + torch.erf(z / math.sqrt(2))) + z * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


class FusedBiasGeluCpp:
    """fused_bias_gelu with a C++ CPU kernel: the C++ source, and the Python registrations."""

    @staticmethod
    def source():
        """The C++ source; NAMESPACE stands for the operator's namespace."""
        ### BEGIN SOLUTION
        # twin: ptinternals.dispatch.cpp_op.FusedBiasGeluCpp
        return r"""
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>

at::Tensor fused_bias_gelu_cpu(const at::Tensor& x, const at::Tensor& bias) {
  TORCH_CHECK(x.dim() >= 1 && bias.dim() == 1 && bias.size(0) == x.size(-1),
              "fused_bias_gelu: bias must have shape (x.shape[-1],)");
  TORCH_CHECK(x.scalar_type() == bias.scalar_type(), "fused_bias_gelu: x and bias must have the same dtype");
  const at::Tensor xc = x.contiguous(), bc = bias.contiguous();  // any strides in: rows of N, densely
  at::Tensor out = at::empty(xc.sizes(), xc.options());            // contiguous out
  const int64_t n = bc.numel(), total = xc.numel();
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "fused_bias_gelu_cpu", [&] {
    const scalar_t* xp = xc.const_data_ptr<scalar_t>();
    const scalar_t* bp = bc.const_data_ptr<scalar_t>();
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, total, 4096, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const scalar_t z = xp[i] + bp[i % n];
        op[i] = scalar_t(0.5) * z * (scalar_t(1) + std::erf(z * scalar_t(M_SQRT1_2)));
      }
    });
  });
  return out;
}

TORCH_LIBRARY(NAMESPACE, m) {
  m.def("fused_bias_gelu(Tensor x, Tensor bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(NAMESPACE, CPU, m) {
  m.impl("fused_bias_gelu", &fused_bias_gelu_cpu);
}
"""
        ### END SOLUTION

    @staticmethod
    def register(namespace, lib):
        """The fake kernel and autograd formula of f"{namespace}::fused_bias_gelu", registered into lib."""
        ### BEGIN SOLUTION
        qualname = f"{namespace}::fused_bias_gelu"

        def fake(x, bias):
            return x.new_empty(x.shape)  # the C++ kernel returns a contiguous tensor

        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(*inputs)

        def backward(ctx, grad_out):
            x, bias = ctx.saved_tensors
            grad_z = grad_out * gelu_derivative(x + bias)
            return grad_z, grad_z.reshape(-1, grad_z.shape[-1]).sum(0)

        torch.library.register_fake(qualname, fake, lib=lib)
        torch.library.register_autograd(qualname, backward, setup_context=setup_context, lib=lib)
        ### END SOLUTION


# %% [tests cpp_op]
check("dispatch.cpp_op", FusedBiasGeluCpp)
### BEGIN HIDDEN TESTS
check("dispatch.cpp_op", FusedBiasGeluCpp, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## 8. Meta and fake tensors: arithmetic without data
#
# A **meta** tensor has shape, dtype and strides and no data; every op runs its Meta kernel, which
# computes the output's metadata. A **FakeTensor** (`torch/_subclasses/fake_tensor.py`) is a wrapper
# subclass around a meta tensor that *claims* a real device: under `FakeTensorMode`, factories return
# FakeTensors and every op runs its Meta kernel or `register_fake` rule. Shapes, dtypes and storage
# sizes are exact; nothing is computed and no device memory is touched. This is how `torch.compile`
# traces, and how you can "run" a model that does not fit on your machine:

# %%
with FakeTensorMode():
    big = nn.Linear(32768, 32768)  # 1.07 G parameters, 4 GiB of fp32
    out = big(torch.empty(8, 32768))
print(type(big.weight).__name__, tuple(out.shape), "| storage bytes of the weight:",
      format_bytes(big.weight.untyped_storage().nbytes()))

# %% [markdown]
# Storage sizes being exact, a `TorchDispatchMode` can count what a training step would allocate:
# parameters, gradients, optimizer state (AdamW keeps `exp_avg` and `exp_avg_sq`: two more copies),
# and the **activations**: the tensors autograd saves for backward. `torch.autograd.graph.
# saved_tensors_hooks(pack, unpack)` calls `pack(t)` on each of them. On CUDA, each storage costs a
# multiple of **512 bytes** (the caching allocator rounds every request, `CUDACachingAllocator.cpp`
# `round_size`). The reference `estimate_training_memory` does it for a full step, peak included:

# %%
estimate = estimate_training_memory(lambda: nn.Sequential(nn.Linear(4096, 16384), nn.GELU(), nn.Linear(16384, 4096)),
                                    (32, 4096), device="cuda")
print({k: format_bytes(v) if isinstance(v, int) else v for k, v in estimate.items()})

# %% [markdown]
# **A warning for machines without a GPU**: fake tensors on `device="cuda"` work for shapes, but
# the moment *autograd* touches one (a parameter with `requires_grad`, a backward pass), the autograd
# engine asks the CUDA driver about the device. On a CPU-only build of PyTorch (the book's torch 2.13)
# the process **aborts** (C++ `terminate`, not an exception: c10 has no CUDA device guard to give it);
# on a CUDA build that sees no GPU (torch 2.11's wheel on a CPU machine) it raises *"hasPrimaryContext
# expects a valid device index"*. So build fake models on the CPU and apply the CUDA rules (the
# 512-byte rounding) yourself, as the reference does (its `traced_on` says where it traced); with a
# GPU in the machine, `device="cuda"` works directly.
#
# The same `TorchDispatchMode` machinery finds hidden copies: `.contiguous()` on a transposed
# tensor, `.float()` in a bf16 model, `reshape` of a non-viewable tensor.

# %%
def attention_heads(x):  # (b, s, h*d) -> (b*h, s, d), written with a copy in the middle
    b, s, hd = x.shape
    return x.view(b, s, 4, hd // 4).transpose(1, 2).reshape(b * 4, s, hd // 4)


with HiddenCopyDetector() as detector:
    attention_heads(torch.randn(2, 16, 32))
print(detector.report())

# %% [markdown]
# ### {{exercise memory_estimate}}: a training step's memory, estimated with FakeTensorMode
#
# Write `estimate_memory(model_fn, input_shape, input_dtype=torch.float32, device="cuda")` returning
# a dict with:
#
# * `"parameters"`: bytes of all parameters;
# * `"gradients"`: bytes of the `.grad` tensors backward would create (parameters with
#   `requires_grad=True` only);
# * `"optimizer_state"`: bytes of AdamW's state, `exp_avg` and `exp_avg_sq` per trainable parameter
#   (same shape and dtype; its 0-d `step` counters do not count);
# * `"activations"`: bytes of the storages autograd saves during the forward pass, each storage
#   counted once, leaving out the parameters' storages (a saved `weight.t()` is a view of one) and the
#   input's;
# * `"output_shape"`: the shape of the model's output, as a tuple.
#
# `model_fn()` builds the model; it refuses to run outside `FakeTensorMode` (some cases have
# gigabytes of parameters). Make the input with `torch.empty` (floating `input_dtype`) or
# `torch.zeros` (integer token ids) of `input_shape`, on the CPU (see the warning above). For
# `device="cuda"`, round each storage up to a multiple of 512 bytes; for `"cpu"`, do not round. Fake
# storages all report `data_ptr() == 0`: tell them apart by `id(t.untyped_storage())`, keeping the
# storage objects alive while you hold their ids. The grader compares with a real run.

# %% [answer memory_estimate]
def estimate_memory(model_fn, input_shape, input_dtype=torch.float32, device="cuda"):
    """Bytes of one training step (AdamW), from a forward pass on fake tensors."""
    ### BEGIN SOLUTION
    # twin: ptinternals.dispatch.fake_memory.estimate_memory
    def nbytes(storage):
        n = storage.nbytes()
        return 512 * ((n + 511) // 512) if device == "cuda" else n

    with FakeTensorMode():
        model = model_fn()
        make = torch.empty if input_dtype.is_floating_point else torch.zeros
        x = make(input_shape, dtype=input_dtype)
        params = list(model.parameters())
        trainable = [p for p in params if p.requires_grad]
        skip = {id(t.untyped_storage()) for t in params + [x]}
        saved = {}

        def pack(t):
            storage = t.untyped_storage()
            if id(storage) not in skip:
                saved[id(storage)] = storage  # keep it alive: its id stays unique
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(x)
    gradients = sum(nbytes(p.untyped_storage()) for p in trainable)
    return {"parameters": sum(nbytes(p.untyped_storage()) for p in params), "gradients": gradients,
            "optimizer_state": 2 * gradients, "activations": sum(nbytes(s) for s in saved.values()),
            "output_shape": tuple(out.shape)}
    ### END SOLUTION


# %% [tests memory_estimate]
check("dispatch.memory_estimate", estimate_memory)
### BEGIN HIDDEN TESTS
check("dispatch.memory_estimate", estimate_memory, hidden=True)
### END HIDDEN TESTS

# %% [quiz]
show_quiz("dispatch", "q10", "q11")

# %% [markdown]
# ## Summary
#
# * An op call is a walk down a **dispatch key set**: the union of the inputs' keys, plus the
#   thread-local included keys, minus the excluded ones and the op's fallthroughs; the highest key's
#   kernel runs and usually redispatches below itself.
# * Context managers work by editing the thread-local sets (`inference_mode`, `autocast`, modes);
#   `no_grad` is a flag the Autograd kernel reads.
# * `__torch_function__` sees Python API calls before autograd; `__torch_dispatch__` sees ATen ops
#   after autograd and decompositions, forward and backward: the place for FLOP counters, memory
#   trackers and tracers.
# * Wrapper subclasses (`_make_wrapper_subclass`) put any data layout behind the tensor interface,
#   below autograd.
# * `torch.library.custom_op` + `register_fake` + `register_autograd` make a function a real
#   operator: `opcheck` passes and `torch.compile(fullgraph=True)` keeps it as one node.
# * Meta and fake tensors give exact shapes and bytes with no data: plan memory before you allocate.
#
# Next: {{chapter allocator}} follows those bytes into the CUDA caching allocator.
#
# ### Your quiz score so far
# Practice answers count no points; the grader scores your last answer to each graded question (recorded in
# `dispatch.answers.json`).

# %% [quiz-grade]
quiz_progress("dispatch")
