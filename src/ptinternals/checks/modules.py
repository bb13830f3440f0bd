"""The modules chapter's graded exercises: cases drawn over random module trees, expected answers from real
``torch.nn.Module``, teaching messages, and the check of how each answer is written.

Every expected answer is torch's: the probes' scenarios (``ptinternals.checks.probes.modules``) run once on
``torch.nn.Module`` here, in the trusted process, and once on the student's code in the sandbox; hook orders
are traced on torch modules; ``functional_call`` is compared with ``torch.func.functional_call`` (except where
torch 2.13 has a bug, pytorch/pytorch#164759: "every original is back" is judged as an invariant); the bug
hunt is judged against ``BrokenNet``'s own arithmetic and the documented layout; checkpoints are loaded with
``load_state_dict(strict=True)`` after stripping with ``consume_prefix_in_state_dict_if_present``. The
reference package is used only for inputs (trees, chain trees), never for an expected answer.

Hidden cases are drawn with hypothesis over generated trees (:func:`tree_specs`) and always include the
boundary trees of :func:`boundary_specs`: size-0 and size-1 tensors, tied parameters (in two modules and
twice in one), frozen and None parameters, non-persistent, None and int64 buffers, a module shared under two
names and by two parents, empty modules, children named ``"0"``/``"1"``.

How the answers may be written is checked on their source, in the grader's process (each exercise's
``policy``, a closed-import :class:`~ptinternals.grading.policy.Policy`): no answer may be passed by calling
torch's own implementation of what it asks for.
"""
from __future__ import annotations

import dataclasses
import math

import torch
from hypothesis import strategies as st

from ..grading.cases import cases_from, draw
from ..grading.compare import describe
from ..grading.exercise import Case, Chapter, Exercise
from ..grading.policy import Policy
from ..modules.hook_order import chain_tree_to_spec
from ..modules.scaffold import BrokenNet, build_tree, example_spec
from .probes import modules as P

PROBES = "ptinternals.checks.probes.modules"


# ================================================================================================
# Module trees (plain data; see ptinternals.modules.trees) and their text pictures
# ================================================================================================
NAMES = ["weight", "bias", "scale", "proj", "gamma", "mean", "steps", "cache", "0", "1", "w", "b", "layers", "head"]


@st.composite
def tree_specs(draw_, max_nodes: int = 5, max_params: int = 5, max_buffers: int = 3, dims=(0, 1, 2, 3)):
    """Random trees: tied parameters, shared modules, frozen/None parameters, buffers of every kind."""
    dim = draw_(st.sampled_from(dims))
    params = [{"shape": draw_(st.sampled_from([[dim, dim], [dim], []])), "requires_grad": draw_(st.booleans())}
              for _ in range(draw_(st.integers(0, max_params)))]
    buffers = [{"shape": draw_(st.sampled_from([[dim], []])), "dtype": draw_(st.sampled_from(["float32", "int64"]))}
               for _ in range(draw_(st.integers(0, max_buffers)))]
    n_nodes = draw_(st.integers(1, max_nodes))
    entries = [{"params": [], "buffers": [], "children": []} for _ in range(n_nodes)]
    for n in range(1, n_nodes):  # every node below the root hangs from an earlier one: the tree is connected
        entries[draw_(st.integers(0, n - 1))]["children"].append(n)
    for _ in range(draw_(st.integers(0, 2))):  # extra edges: a shared module instance
        if n_nodes >= 2:
            child = draw_(st.integers(1, n_nodes - 1))
            entries[draw_(st.integers(0, child - 1))]["children"].append(child)
    for i in range(len(params)):  # each parameter lives somewhere, sometimes twice (tied)
        for _ in range(draw_(st.sampled_from([1, 1, 1, 2]))):
            entries[draw_(st.integers(0, n_nodes - 1))]["params"].append(i)
    for i in range(len(buffers)):
        entries[draw_(st.integers(0, n_nodes - 1))]["buffers"].append((i, draw_(st.booleans())))
    for _ in range(draw_(st.integers(0, 2))):  # None slots
        kind = draw_(st.sampled_from(["params", "buffers", "children"]))
        entries[draw_(st.integers(0, n_nodes - 1))][kind].append(None if kind != "buffers" else (None, True))
    nodes = []
    for n, e in enumerate(entries):
        count = len(e["params"]) + len(e["buffers"]) + len(e["children"])
        names = list(draw_(st.permutations(NAMES + [f"m{k}" for k in range(count)]))[:count])
        node = {"cls": draw_(st.sampled_from(["Block", "Layer", "Net"])) if n else "Root",
                "params": [[names.pop(), i] for i in e["params"]],
                "buffers": [[names.pop(), i, p] for i, p in e["buffers"]],
                "children": [[names.pop(), c] for c in e["children"]]}
        for kind in ("params", "buffers", "children"):  # registration order is part of the contract
            node[kind] = draw_(st.permutations(node[kind]))
        nodes.append(node)
    return {"dim": dim, "params": params, "buffers": buffers, "nodes": nodes}


def boundary_specs() -> list[tuple[str, dict]]:
    """One fixed tree per boundary class, put in front of every hidden batch (a small draw cannot miss them)."""
    def p(shape, requires_grad=True):
        return {"shape": shape, "requires_grad": requires_grad}

    def b(shape, dtype="float32"):
        return {"shape": shape, "dtype": dtype}

    return [
        ("size-0 tensors (D = 0) and a weight tied between two modules",
         {"dim": 0, "params": [p([0, 0]), p([0])], "buffers": [b([0])],
          "nodes": [{"cls": "Root", "params": [["w", 0]], "buffers": [["mean", 0, True]], "children": [["a", 1]]},
                    {"cls": "Block", "params": [["w", 0], ["b", 1]]}]}),
        ("size-1 tensors (D = 1), a frozen and a None parameter, children named '0' and '1'",
         {"dim": 1, "params": [p([1, 1]), p([1], False), p([])], "buffers": [],
          "nodes": [{"cls": "Root", "params": [["w", 0], ["gamma", 1], ["bias", None]], "children": [["0", 1], ["1", 2]]},
                    {"cls": "Layer", "params": [["s", 2]]}, {"cls": "Layer"}]}),
        ("one Parameter registered twice in one module",
         {"dim": 2, "params": [p([2, 2])], "buffers": [], "nodes": [{"cls": "Root", "params": [["w", 0], ["w2", 0]]}]}),
        ("a block shared under two names and by two parents, an int64 counter, an empty module",
         {"dim": 2, "params": [p([2, 2]), p([2])], "buffers": [b([2]), b([], "int64")],
          "nodes": [{"cls": "Root", "children": [["block", 1], ["again", 1], ["outer", 2], ["empty", 3]]},
                    {"cls": "Block", "params": [["proj", 0]], "buffers": [["mean", 0, True], ["steps", 1, True]]},
                    {"cls": "Outer", "params": [["scale", 1]], "children": [["inner", 1]]}, {"cls": "Empty"}]}),
        ("non-persistent and None buffers, a None child, a frozen-only module",
         {"dim": 3, "params": [p([3], False)], "buffers": [b([3]), b([3])],
          "nodes": [{"cls": "Root", "params": [["scale", 0]],
                     "buffers": [["cache", 0, False], ["running", 1, True], ["none", None, True]],
                     "children": [["gone", None], ["child", 1]]},
                    {"cls": "Child", "buffers": [["cache", 0, False]]}]}),
        ("a root with nothing in it", {"dim": 2, "params": [], "buffers": [], "nodes": [{"cls": "Root"}]}),
        ("the notebook's example tree", example_spec()),
    ]


def tree_text(spec: dict) -> str:
    """``D=2; p0 (2, 2) frozen, b1 int64 () | Root#0(w=p0, block: Block#1(...), again: <#1 again>)``."""
    nodes, seen = spec["nodes"], {0}

    def node_text(i: int) -> str:
        n, parts = nodes[i], []
        parts += [f"{name}={'None' if k is None else f'p{k}'}" for name, k in n.get("params", [])]
        parts += [f"{name}={'None' if k is None else f'b{k}'}{'' if persistent else ' (not persistent)'}"
                  for name, k, persistent in n.get("buffers", [])]
        for name, c in n.get("children", []):
            if c is None:
                parts.append(f"{name}: None")
            elif c in seen:
                parts.append(f"{name}: <#{c} again>")
            else:
                seen.add(c)
                parts.append(f"{name}: {node_text(c)}")
        return f"{n['cls']}#{i}({', '.join(parts)})"

    tensors = [f"p{i} {tuple(q['shape'])}{'' if q['requires_grad'] else ' frozen'}" for i, q in enumerate(spec["params"])]
    tensors += [f"b{i} {tuple(q['shape'])}{'' if q['dtype'] == 'float32' else ' ' + q['dtype']}"
                for i, q in enumerate(spec["buffers"])]
    return f"D={spec['dim']}; {', '.join(tensors) or 'no tensors'} | {node_text(0)}"


def _uses(spec: dict) -> list[tuple[int, str, int | None]]:
    """``(node, kind, index)`` of every slot of the tree (kind "p", "b" or "c")."""
    return [(n, kind[0], entry[1]) for n, node in enumerate(spec["nodes"])
            for kind in ("params", "buffers", "children") for entry in node.get(kind, [])]


def tied_across(spec) -> bool:
    nodes_of: dict = {}
    for n, kind, i in _uses(spec):
        if kind == "p" and i is not None:
            nodes_of.setdefault(i, []).append(n)
    return any(len(set(ns)) > 1 for ns in nodes_of.values())


def tied_within(spec) -> bool:
    return any(len([i for _, i in node.get("params", []) if i is not None]) >
               len({i for _, i in node.get("params", []) if i is not None}) for node in spec["nodes"])


def shared_module(spec) -> bool:
    children = [i for _, kind, i in _uses(spec) if kind == "c" and i is not None]
    return len(children) > len(set(children))


def frozen_used(spec) -> bool:
    return any(kind == "p" and i is not None and not spec["params"][i]["requires_grad"] for _, kind, i in _uses(spec))


def none_slot(spec) -> bool:
    return any(i is None for _, _, i in _uses(spec))


def non_persistent(spec) -> bool:
    return any(not entry[2] for node in spec["nodes"] for entry in node.get("buffers", []) if entry[1] is not None)


def int_buffer(spec) -> bool:
    return any(kind == "b" and i is not None and spec["buffers"][i]["dtype"] == "int64" for _, kind, i in _uses(spec))


def empty_module(spec) -> bool:
    return any(not (node.get("params") or node.get("buffers") or node.get("children")) for node in spec["nodes"])


TREE_CLASSES = {
    "size-0 tensors (D = 0)": lambda c, e: c.args[0]["dim"] == 0,
    "size-1 tensors (D = 1)": lambda c, e: c.args[0]["dim"] == 1,
    "a parameter tied between two modules": lambda c, e: tied_across(c.args[0]),
    "one parameter twice in one module": lambda c, e: tied_within(c.args[0]),
    "a module shared under two names": lambda c, e: shared_module(c.args[0]),
    "a frozen parameter": lambda c, e: frozen_used(c.args[0]),
    "a None slot": lambda c, e: none_slot(c.args[0]),
    "a non-persistent buffer": lambda c, e: non_persistent(c.args[0]),
    "an int64 buffer": lambda c, e: int_buffer(c.args[0]),
    "an empty module": lambda c, e: empty_module(c.args[0]),
}


# ================================================================================================
# Comparing plain data, with the path of the first difference
# ================================================================================================
def first_difference(got, expected, where: str = "result") -> tuple[str, object, object] | None:
    """``(path, expected value, got value)`` at the first place two results differ, or None.

    Floats compare with a small tolerance; ``True`` is not ``1``; lists and tuples are sequences alike.
    """
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return where, expected, got
        for key, value in expected.items():
            if key not in got:
                return f"{where}.{key}", value, "<missing>"
            found = first_difference(got[key], value, f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)):
            return where, expected, got
        for i, (g, e) in enumerate(zip(got, expected)):
            found = first_difference(g, e, f"{where}[{i}]")
            if found:
                return found
        return None if len(got) == len(expected) else (f"{where} (length)", len(expected), len(got))
    if isinstance(expected, float) and type(got) in (int, float):
        if math.isclose(got, expected, rel_tol=1e-5, abs_tol=1e-6) or (math.isnan(got) and math.isnan(expected)):
            return None
        return where, expected, got
    if type(got) is type(expected) and got == expected:
        return None
    return where, expected, got


def difference_text(found, context: dict | None = None) -> str:
    path, e, g = found
    lines = [f"first difference at {path}:", f"  expected {describe(e, 200)}", f"       got {describe(g, 200)}"]
    for name, value in (context or {}).items():
        lines.append(f"  {name}: {describe(value, 300)}")
    return "\n".join(lines)


def _raised(result) -> bool:
    return isinstance(result, (list, tuple)) and len(result) >= 1 and result[0] == "raised"




# ================================================================================================
# How the answers may be written: a closed-import policy (grading/policy_imports.py), judged on the source
# ================================================================================================
# Why static: every measurement made in the sandbox runs in the student's own process and can be forged
# (monkeypatching, a TorchFunctionMode, rebinding the probe's functions); the source of the answer cells cannot,
# and the grader reads it from the submitted notebook. Every exercise shares CHAPTER_RULES (imports only from
# ALLOWED_IMPORTS, nothing of torch.overrides/torch.library/torch._C, no global module hooks, none of the
# constructs that hide a name from the check) and adds what its own answer may not reach: torch's
# implementation of the operation it asks for.
SCAFFOLD = "ptinternals.modules.scaffold"
ALLOWED_IMPORTS = ("__future__", "abc", "bisect", "collections", "contextlib", "copy", "dataclasses", "enum",
                   "functools", "heapq", "itertools", "math", "numbers", "random", "re", "typing", "warnings",
                   "weakref", "torch", SCAFFOLD)
SETUP_IMPORTS = """import warnings
from collections import OrderedDict

import torch
import torch.nn as nn

from ptinternals.modules.scaffold import BrokenNet, ModuleState, build_tree, example_spec
"""  # the graded imports of the notebook's setup cell (tests/modules/test_checks.py keeps them equal)
CHAPTER_RULES = Policy(
    imports=ALLOWED_IMPORTS, setup_imports=SETUP_IMPORTS,
    deny_modules_anywhere=("torch.overrides", "torch.library", "torch.utils._python_dispatch", "torch._C"),
    banned_anywhere=(  # global hooks and switches that change every module's behaviour, the grader's too
        "register_module_forward_pre_hook", "register_module_forward_hook", "register_module_full_backward_pre_hook",
        "register_module_full_backward_hook", "register_module_backward_hook",
        "register_module_buffer_registration_hook", "register_module_module_registration_hook",
        "register_module_parameter_registration_hook", "set_overwrite_module_params_on_conversion",
        "set_swap_module_params_on_conversion"))
MIXIN_DENIED = ("torch.nn.modules", "torch.nn.utils", "torch.nn.parallel", "torch.func", "torch._functorch",
                "torch.utils.hooks", "torch.fx", "torch.jit", "torch.export", "torch.ao", "torch.distributed",
                "torch.quantization", "torch.compiler")


def rules(why: str = "", **own) -> Policy:
    """The chapter's rules, plus what one exercise's own answer may not use (``own``: Policy fields)."""
    return dataclasses.replace(CHAPTER_RULES, why=why, **own)


def mixin_policy(what: str) -> Policy:
    """The five mixin exercises: nothing of torch's Module machinery, only tensors, Parameter/Buffer, autograd
    and RemovableHandle."""
    return rules(f"this exercise asks you to write {what} yourself, not to use torch.nn.Module's",
                 deny_modules=MIXIN_DENIED, deny_subclasses_of=("torch.nn.Module",),
                 allow_objects=("torch.utils.hooks.RemovableHandle",))


class ModulesExercise(Exercise):
    """An exercise of this chapter: its results are plain data compared with :func:`first_difference`, and
    how its answer is written is checked by its ``policy`` (:func:`rules`)."""

    def compare(self, case, got, expected):
        found = first_difference(got, expected)
        return None if found is None else difference_text(found)


# ================================================================================================
# modules.register: __setattr__ / __getattr__ / __delattr__ and register_*
# ================================================================================================
OP_NAMES = ["w", "b", "child", "running", "training", "a.b", "", "forward"]
VALUE_KINDS = ["parameter", "frozen", "tensor", "buffer", "buffer_np", "module", "none", "int"]
WHATS = ["setattr", "register_buffer", "register_parameter", "add_module", "delattr", "getattr"]
VALUE_TEXT = {"parameter": "nn.Parameter", "frozen": "nn.Parameter(requires_grad=False)", "tensor": "torch.randn(2)",
              "buffer": "nn.Buffer", "buffer_np": "nn.Buffer(persistent=False)", "module": "Child()", "none": "None",
              "int": "7"}


def op_text(op) -> str:
    what, name, kind, persistent = op
    value = VALUE_TEXT[kind]
    if what == "setattr":
        return f"m.{name} = {value}" if name.isidentifier() else f"setattr(m, {name!r}, {value})"
    if what == "register_buffer":
        return f"m.register_buffer({name!r}, {value}{'' if persistent else ', persistent=False'})"
    if what in ("register_parameter", "add_module"):
        return f"m.{what}({name!r}, {value})"
    if what == "delattr":
        return f"del m.{name}" if name.isidentifier() else f"delattr(m, {name!r})"
    return f"m.{name}" if name.isidentifier() else f"getattr(m, {name!r})"


def ops_label(ops, early=None) -> str:
    if early:
        return f"class Early(Module) assigning a {early} before super().__init__()"
    return "; ".join(op_text(op) for op in ops) or "no operations"


class Register(ModulesExercise):
    id, entry, points = "modules.register", "Registration", 1
    title = "registration: __setattr__, __getattr__, __delattr__ and register_*"
    probe = f"{PROBES}:register_probe"
    policy = mixin_policy("registration (__setattr__, register_*)")

    def _case(self, ops, early=None, label=""):
        ops = [tuple(op) for op in ops]
        kwargs = {"early": early} if early else {}
        return Case((ops,), kwargs, label=(label + ": " if label else "") + ops_label(ops, early))

    boundary_classes = {
        "a plain tensor assigned": lambda c, e: any(op[0] == "setattr" and op[2] == "tensor" for op in c.args[0]),
        "None over a parameter": lambda c, e: any(op[:3] == ("setattr", "w", "none") for op in c.args[0]) and any(
            op[0] == "setattr" and op[1] == "w" and op[2] in ("parameter", "frozen") for op in c.args[0]),
        "a dotted or empty name (bad input that must raise)": lambda c, e: any(op[1] in ("a.b", "") for op in c.args[0]),
        "a non-persistent buffer": lambda c, e: any(op[2] == "buffer_np" for op in c.args[0]),
        "a module assigned before __init__": lambda c, e: c.kwargs.get("early") == "module",
        "a deleted name read again": lambda c, e: any(a[0] == "delattr" and b[0] == "getattr" and a[1] == b[1]
                                                     for a, b in zip(c.args[0], c.args[0][1:])),
    }

    def visible_cases(self):
        c = self._case
        return [
            c([("setattr", "w", "parameter", True), ("setattr", "b", "tensor", True), ("getattr", "b", "none", True),
               ("setattr", "running", "buffer", True)], label="a Parameter, a plain tensor, an nn.Buffer"),
            c([("register_buffer", "running", "tensor", False), ("register_buffer", "running", "tensor", True),
               ("delattr", "running", "none", True), ("getattr", "running", "none", True)],
              label="a buffer made persistent, deleted, then read"),
            c([("setattr", "w", "parameter", True), ("setattr", "w", "tensor", True), ("setattr", "w", "none", True),
               ("register_parameter", "a.b", "parameter", True), ("add_module", "child", "int", True)],
              label="the errors torch raises, and None keeping a slot"),
            c([("setattr", "b", "tensor", True), ("setattr", "b", "buffer", True), ("delattr", "b", "none", True),
               ("setattr", "b", "buffer_np", True)], label="a plain attribute cannot silently become a buffer"),
            c([("setattr", "child", "module", True), ("setattr", "child", "tensor", True),
               ("setattr", "child", "none", True), ("setattr", "child", "parameter", True)],
              label="a child slot, then a Parameter under the same name"),
            c([], early="parameter", label="too early"),
        ]

    def hidden_cases(self):
        fixed = [self._case([], early=kind) for kind in ("parameter", "module", "buffer", "register_buffer", "plain")]
        fixed += [
            self._case([("setattr", "w", "frozen", True), ("setattr", "w", "none", True), ("getattr", "w", "none", True),
                        ("setattr", "w", "parameter", True), ("delattr", "w", "none", True), ("delattr", "w", "none", True)]),
            self._case([("setattr", "b", "buffer_np", True), ("setattr", "b", "tensor", True), ("setattr", "b", "none", True),
                        ("register_buffer", "b", "tensor", True), ("delattr", "b", "none", True)]),
            self._case([("setattr", "b", "buffer_np", True), ("setattr", "b", "parameter", True), ("delattr", "b", "none", True),
                        ("setattr", "b", "buffer_np", True), ("setattr", "b", "module", True), ("getattr", "b", "none", True)]),
            self._case([("setattr", "child", "tensor", True), ("setattr", "child", "module", True),
                        ("getattr", "child", "none", True), ("add_module", "w", "module", True), ("delattr", "w", "none", True),
                        ("getattr", "w", "none", True)]),
            self._case([("setattr", "training", "parameter", True), ("getattr", "training", "none", True),
                        ("add_module", "forward", "module", True), ("register_parameter", "", "parameter", True),
                        ("register_buffer", "running", "int", True), ("add_module", "a.b", "module", True),
                        ("add_module", "", "module", True), ("register_buffer", "", "tensor", True)]),
        ]
        names = st.sampled_from(["w", "w", "b", "b", "child", "child", *OP_NAMES])  # names that meet again, mostly
        ops = st.tuples(st.sampled_from(WHATS), names, st.sampled_from(VALUE_KINDS), st.booleans())
        return fixed + [self._case(seq) for seq in draw(st.lists(ops, min_size=1, max_size=12), 60)]

    def expected(self, case):
        return P.register_run(torch.nn.Module, list(case.args[0]), case.kwargs.get("early"))

    def compare(self, case, got, expected):
        if not isinstance(got, list) or len(got) != len(expected):
            return f"the probe returned {describe(got)} (the run stopped early?)"
        ops = case.args[0]
        for k, (g, e) in enumerate(zip(got, expected)):
            step = op_text(ops[k]) if ops else ops_label(ops, case.kwargs.get("early"))
            if first_difference(g["outcome"], e["outcome"]):
                return (f"operation {k}: {step}\n  expected {_outcome_text(e['outcome'])}\n"
                        f"       got {_outcome_text(g['outcome'])}")
            found = first_difference(g["state"], e["state"], "module")
            if found:
                return f"after operation {k}: {step}\n" + difference_text(found)
        return None

    def diagnose(self, case, got, expected):
        ops = case.args[0]
        for k, (g, e) in enumerate(zip(got, expected)):
            ge, ee = g["outcome"], e["outcome"]
            if case.kwargs.get("early") and first_difference(ge, ee):
                return ("before ModuleState.__init__ has run there are no dicts: `self.__dict__.get('_parameters')` "
                        "is None, and torch raises AttributeError for a Parameter, a module or a buffer")
            what, name, kind, _ = ops[k] if ops else ("", "", "", True)
            if what == "getattr" and ee[0] == "raised" and ge != ee:
                return "__getattr__ must raise AttributeError, or `hasattr(module, name)` raises instead of saying False"
            if ee[0] == "ok" and _raised(ge) and ge[1] == "KeyError" and what == "setattr":
                before = expected[k - 1]["state"] if k else {}
                if any(name in before.get(place, {}) for place in ("plain", "parameters", "buffers", "modules")):
                    return "remove the name from the other places (`__dict__` and the other dicts) before registering it"
                return "__getattr__ must raise AttributeError for an unknown name: `hasattr(self, name)` (as in the " \
                       "register_* checks) lets any other exception through"
            if first_difference(ge, ee):
                return None
            gs, es = g["state"], e["state"]
            if kind == "tensor" and name in gs["buffers"] and name in es["plain"]:
                return ("a plain tensor assigned to a new name is an ordinary attribute in torch; only nn.Buffer or "
                        "register_buffer make a buffer")
            if kind == "none" and name in es["parameters"] and name not in gs["parameters"]:
                return "assigning None to a parameter keeps the slot (its value None): every walk skips None entries"
            if gs["non_persistent"] != es["non_persistent"]:
                return ("`_non_persistent_buffers_set` follows the buffer: add the name for persistent=False, discard "
                        "it when the buffer is registered persistent again or deleted")
            if first_difference(gs, es):
                return None
        return None


def _outcome_text(outcome) -> str:
    if outcome[0] == "raised":
        return f"an exception ({outcome[1]})"
    return "no exception" + ("" if len(outcome) < 2 or outcome[1] is None else f", value {describe(outcome[1])}")


# ================================================================================================
# modules.traverse: named_modules, named_parameters, named_buffers and friends
# ================================================================================================
class Traverse(ModulesExercise):
    id, entry, points = "modules.traverse", "Traversal", 1
    title = "traversal: named_modules, named_parameters, named_buffers, children"
    probe = f"{PROBES}:traverse_probe"
    policy = mixin_policy("the traversals")

    boundary_classes = {**TREE_CLASSES,
                        "a dotted prefix": lambda c, e: "." in c.kwargs.get("prefix", ""),
                        "remove_duplicate=False": lambda c, e: c.kwargs.get("remove_duplicate") is False,
                        "recurse=False": lambda c, e: c.kwargs.get("recurse") is False}

    def visible_cases(self):
        bounds = dict(boundary_specs())
        example = example_spec()
        return [Case((example,), {}, label="the notebook's example tree: " + tree_text(example)),
                Case((example,), {"prefix": "model", "remove_duplicate": False},
                     label="prefix 'model', remove_duplicate=False: every name, shared ones included"),
                Case((bounds["one Parameter registered twice in one module"],), {"recurse": False},
                     label="recurse=False, one Parameter twice in one module"),
                Case((bounds["a root with nothing in it"],), {}, label="a root with nothing in it")]

    def hidden_cases(self):
        out = [Case((spec,), {"prefix": prefix, "remove_duplicate": rd}, label=f"{label}: {tree_text(spec)}")
               for (label, spec), prefix, rd in zip(boundary_specs(), ["", "a.b", "", "model", "", "", "x"],
                                                     [True, False, True, False, True, True, False])]

        def case(spec, prefix, recurse, rd):
            return Case((spec,), {"prefix": prefix, "recurse": recurse, "remove_duplicate": rd}, label=tree_text(spec))

        return out + draw(st.builds(case, tree_specs(), st.sampled_from(["", "", "model", "a.b"]), st.booleans(),
                                    st.booleans()), 45)

    def expected(self, case):
        kw = case.kwargs
        return P.traverse_run(torch.nn.Module, case.args[0], kw.get("prefix", ""), kw.get("recurse", True),
                              kw.get("remove_duplicate", True), register=True)

    def compare(self, case, got, expected):
        if not isinstance(got, dict):
            return f"the probe returned {describe(got)}"
        for method, want in expected.items():
            found = first_difference(got.get(method), want, method)
            if found:
                call = {"named_modules_memo": "named_modules(memo={the last node}, prefix=...)",
                        "unchanged": "the module's dicts after all the walks"}.get(method, f"{method}(...)")
                return f"{call}: " + difference_text(found, {"expected": want, "     got": got.get(method)})
        return None

    def diagnose(self, case, got, expected):
        for method, want in expected.items():
            have = got.get(method)
            if not first_difference(have, want):
                continue
            if method == "unchanged":
                return "walking the tree must not change it"
            names = [x[0] for x in have if isinstance(x, (list, tuple)) and x and isinstance(x[0], str)] \
                if isinstance(have, list) else []
            if any(n.startswith(".") for n in names):
                return "names are joined with '.' only when the prefix is not empty (the root's own members have no dot)"
            labels_got = [x[-1] if isinstance(x, (list, tuple)) else x for x in have] if isinstance(have, list) else []
            labels_want = [x[-1] if isinstance(x, (list, tuple)) else x for x in want]
            if "?" in labels_got and "?" not in labels_want:
                return "None entries (a None parameter, buffer or child slot) are never yielded"
            if len(labels_got) < len(labels_want) and not case.kwargs.get("remove_duplicate", True):
                return "with remove_duplicate=False every name comes out, a shared module's and a tied tensor's too"
            if len(labels_got) > len(labels_want) and len(set(map(str, labels_got))) < len(labels_got):
                return ("a shared module or a tied tensor is yielded once, under the first name reached, unless "
                        "remove_duplicate=False (named_children always de-duplicates); compare objects, not names")
            if sorted(map(str, labels_got)) == sorted(map(str, labels_want)):
                return "order: pre-order over _modules; for tensors, a module's own entries, then its children's"
            return None
        return None


# ================================================================================================
# modules.convert: _apply and to
# ================================================================================================
class Convert(ModulesExercise):
    id, entry, points = "modules.convert", "Conversion", 1
    title = "conversion: _apply and to keep parameters' identity"
    probe = f"{PROBES}:convert_probe"
    policy = mixin_policy("_apply and to")

    boundary_classes = {**TREE_CLASSES,
                        "the overwrite flag": lambda c, e: c.kwargs.get("overwrite") is True,
                        "a non-idempotent _apply": lambda c, e: c.args[1] == "apply_times_2",
                        "recurse=False": lambda c, e: c.args[1] == "apply_float64_no_recurse",
                        "an integer dtype (bad input that must raise)": lambda c, e: e["outcome"][0] == "raised",
                        "a dtype with 8 exponent bits and 7 mantissa bits (bfloat16)": lambda c, e: "bfloat16" in c.args[1]}

    def visible_cases(self):
        example = example_spec()
        return [Case((example, "to_float64"), label="model.to(torch.float64) after backward, optimizer built before"),
                Case((example, "to_dtype_float16"), label="model.to(dtype=torch.float16): an int64 buffer stays int64"),
                Case((example, "apply_times_2"), label="model._apply(lambda t: t * 2): a tied weight is visited twice"),
                Case((example, "to_float64"), {"overwrite": True},
                     label="set_overwrite_module_params_on_conversion(True): new Parameter objects")]

    def hidden_cases(self):
        out = [Case((spec, conv), {"overwrite": overwrite}, label=f"{label}: {conv}: {tree_text(spec)}")
               for (label, spec), conv, overwrite in zip(boundary_specs(), ["to_float64", "apply_times_2", "apply_times_2",
                                                                            "to_bfloat16_non_blocking", "to_cpu_float64",
                                                                            "to_int64", "apply_float64_no_recurse"],
                                                         [False, False, True, False, False, False, False])]

        def case(spec, conv, overwrite):
            return Case((spec, conv), {"overwrite": overwrite}, label=f"{conv}{' (overwrite flag)' if overwrite else ''}: "
                                                                      f"{tree_text(spec)}")

        return out + draw(st.builds(case, tree_specs(max_nodes=4), st.sampled_from(sorted(P.CONVERSIONS)),
                                    st.sampled_from([False, False, True])), 40)

    def expected(self, case):
        spec, conversion = case.args
        return P.convert_run(torch.nn.Module, spec, conversion, case.kwargs.get("overwrite", False), register=True)

    def compare(self, case, got, expected):
        if not isinstance(got, dict):
            return f"the probe returned {describe(got)}"
        found = first_difference(got.get("outcome"), expected["outcome"], "outcome")
        if found:
            return f"the conversion itself ({case.args[1]}): expected {_outcome_text(expected['outcome'])}, " \
                   f"got {_outcome_text(got.get('outcome') or ('?',))} (`to`/`_apply` return the module itself)"
        for k, want in enumerate(expected["slots"]):
            have = (got.get("slots") or [])[k:k + 1]
            found = first_difference(have[0] if have else None, want, f"slot {want['slot']} (node.kind.name)")
            if found:
                return difference_text(found, {"expected": {k2: v for k2, v in want.items() if k2 != "values"},
                                               "     got": {k2: v for k2, v in (have[0] if have else {}).items()
                                                            if k2 != "values"}})
        found = first_difference(got.get("optimizer_params_in_model"), expected["optimizer_params_in_model"],
                                 "optimizer_params_in_model")
        return None if found is None else "the optimizer built before the conversion: " + difference_text(found)

    def diagnose(self, case, got, expected):
        overwrite = case.kwargs.get("overwrite", False)
        for want, have in zip(expected["slots"], got.get("slots") or []):
            if not first_difference(have, want):
                continue
            kind = want["slot"].split(".")[1]
            if kind == "param" and want["same_object"] and not have.get("same_object"):
                return "the optimizer holds the Parameter objects: keep them and replace their data (param.data = ...)"
            if kind == "param" and overwrite and not want["same_object"] and have.get("same_object"):
                return ("with torch.__future__.get_overwrite_module_params_on_conversion() on, _apply puts a new "
                        "Parameter(fn(param), param.requires_grad) into _parameters")
            if want["dtype"] != have.get("dtype"):
                if want["dtype"] == "int64":
                    return "`to` changes the dtype of floating-point (and complex) tensors only: an int64 buffer " \
                           "stays int64"
                if kind == "buffer":
                    return "buffers are converted too: replace each non-None buffer by fn(buf) in _buffers"
                if want["slot"].split(".")[0] != "0":
                    return "_apply converts the children first (recursively, each child once), then the module's " \
                           "own tensors"
            if want.get("grad_dtype") != have.get("grad_dtype"):
                return "a parameter's .grad is converted with it (by the same rule), so the two keep matching"
            if case.args[1] == "apply_times_2" and want["dtype"] == have.get("dtype"):
                return ("_apply visits each module's own `_parameters` (a tensor tied into two modules is converted "
                        "twice, as in torch); do not walk parameters() from every module")
            return None
        return None


# ================================================================================================
# modules.state_dict: state_dict and load_state_dict
# ================================================================================================
CHECKPOINT_EDITS = ["drop", "extra_leaf", "extra_child", "extra_unknown_child", "rename_prefix", "reshape",
                    "not_tensor", "scalar_as_1", "dtype", "no_metadata", "scalar_as_2", "scalar_as_1x2", "scalar_as_0"]
SCALAR_AS = {"scalar_as_1": (1,), "scalar_as_2": (2,), "scalar_as_1x2": (1, 2), "scalar_as_0": (0,)}


def edited_checkpoint(spec: dict, edits: list, picks: list) -> tuple[list, list | None]:
    """A torch checkpoint of ``spec`` (seed 1: other values than the model's), damaged by ``edits``.

    Returns it as data: ``(items, metadata)``; ``picks`` choose the keys edits apply to.
    """
    sd = build_tree(spec, torch.nn.Module, seed=1)[0].state_dict()
    items, metadata = list(sd.items()), [[k, dict(v)] for k, v in sd._metadata.items()]
    for edit, pick in zip(edits, picks):
        keys = [k for k, _ in items]
        key = keys[pick % len(keys)] if keys else None
        if edit == "drop" and keys:
            items = [(k, v) for k, v in items if k != key]
        elif edit == "extra_leaf":
            items.append(("surplus", torch.zeros(1)))
        elif edit == "extra_child" and keys:
            items.append((key.rpartition(".")[0] + (".stray" if "." in key else "stray"), torch.zeros(1)))
        elif edit == "extra_unknown_child":
            items.append(("nowhere.weight", torch.zeros(1)))
        elif edit == "rename_prefix":  # saved from a wrapper: every key gains "module."
            items = [("module." + k, v) for k, v in items]
            metadata = [["module" + ("." + k if k else ""), v] for k, v in metadata]
        elif edit == "reshape" and keys:
            items = [(k, torch.zeros(2, 5) if k == key else v) for k, v in items]
        elif edit == "not_tensor" and keys:
            items = [(k, [1.0, 2.0] if k == key else v) for k, v in items]
        elif edit in SCALAR_AS:  # (1,): 0.3-era checkpoints saved 0-dim values so; other shapes must not load
            shape = SCALAR_AS[edit]
            items = [(k, (v.reshape(1) if shape == (1,) else torch.zeros(shape, dtype=v.dtype))
                      if isinstance(v, torch.Tensor) and v.dim() == 0 else v) for k, v in items]
        elif edit == "dtype" and keys:
            items = [(k, v.double() if k == key and isinstance(v, torch.Tensor) else v) for k, v in items]
        elif edit == "no_metadata":
            metadata = None
    return [list(kv) for kv in items], metadata


class StateDictExercise(ModulesExercise):
    id, entry, points = "modules.state_dict", "StateDict", 1
    title = "checkpoints: state_dict and load_state_dict with torch's strict reporting"
    probe = f"{PROBES}:state_dict_probe"
    policy = mixin_policy("state_dict and load_state_dict")

    def _case(self, spec, edits, picks, strict=True, assign=False, label=""):
        items, metadata = edited_checkpoint(spec, edits, picks)
        text = f"edits {edits or 'none'}, strict={strict}, assign={assign}: {tree_text(spec)}"
        return Case((spec, items, metadata), {"strict": strict, "assign": assign},
                    label=(label + "; " if label else "") + text)

    boundary_classes = {**TREE_CLASSES,
                        "strict=False with missing keys": lambda c, e: not c.kwargs["strict"] and e["load"][0] == "ok"
                        and bool(e["load"][1]),
                        "assign=True": lambda c, e: c.kwargs["assign"],
                        "a shape mismatch": lambda c, e: any("size mismatch" in x for x in e["load"][2])
                        if e["load"][0] == "raised" else False,
                        "a value that is not a tensor": lambda c, e: any(not isinstance(v, torch.Tensor)
                                                                         for _, v in c.args[1]),
                        "a 0-dim tensor saved as shape (1,)": lambda c, e: any(
                            isinstance(v, torch.Tensor) and v.shape == (1,) for _, v in c.args[1]),
                        "a checkpoint without _metadata": lambda c, e: c.args[2] is None,
                        "a float64 value for a float32 tensor": lambda c, e: any(
                            isinstance(v, torch.Tensor) and v.dtype == torch.float64 for _, v in c.args[1]),
                        "the checkpoint checked after the call": lambda c, e: e["input_unchanged"] is True}

    def visible_cases(self):
        example, c = example_spec(), self._case
        return [c(example, [], [], label="a clean checkpoint"),
                c(example, ["drop", "extra_leaf"], [0, 0], strict=False, label="strict=False still reports"),
                c(example, ["rename_prefix"], [0], strict=True, label="saved from DataParallel (module.)"),
                c(example, ["reshape"], [2], strict=False, label="a shape mismatch is an error even with strict=False"),
                c(example, ["dtype"], [0], assign=True, label="assign=True takes the checkpoint's tensors")]

    def hidden_cases(self):
        out = [self._case(spec, edits, [1, 2], strict, assign, label=label)
               for (label, spec), edits, strict, assign in zip(
                   boundary_specs(), [["scalar_as_1"], ["not_tensor"], ["no_metadata", "drop"], ["extra_child"], [],
                                      ["extra_unknown_child", "dtype"], ["scalar_as_1", "no_metadata"]],
                   [True, False, False, True, True, False, True], [False, True, False, True, False, False, True])]

        example = example_spec()
        out += [self._case(example, ["dtype"], [k], label="a float64 value is copied into the model's float32 tensor")
                for k in (0, 1, 3)]
        size_1 = dict(boundary_specs())["size-1 tensors (D = 1), a frozen and a None parameter, children named '0' and '1'"]
        out += [self._case(example, ["not_tensor"], [1], strict=False, label="a value that is not a tensor, "
                           "before other tensors of the same module"),
                self._case(size_1, [], [], label="a clean checkpoint of (1,)-shaped tensors"),
                self._case(example, ["reshape", "reshape", "extra_leaf", "drop"], [1, 2, 0, 5],
                           label="two shape mismatches, a stray key and a missing one: the order of the lines"),
                *[self._case(size_1, [edit], [0], strict=False, label=f"a 0-dim tensor saved as shape {SCALAR_AS[edit]}")
                  for edit in ("scalar_as_2", "scalar_as_1x2", "scalar_as_0")]]

        def case(spec, edits, picks, strict, assign):
            return self._case(spec, edits, picks, strict, assign)

        return out + draw(st.builds(case, tree_specs(max_nodes=4), st.lists(st.sampled_from(CHECKPOINT_EDITS), max_size=3),
                                    st.lists(st.integers(0, 20), min_size=3, max_size=3), st.booleans(), st.booleans()), 40)

    def expected(self, case):
        spec, items, metadata = case.args
        return P.state_dict_run(torch.nn.Module, spec, items, metadata, case.kwargs["strict"], case.kwargs["assign"],
                                register=True)

    def compare(self, case, got, expected):
        if not isinstance(got, dict):
            return f"the probe returned {describe(got)}"
        what = {"keys": "state_dict() keys", "metadata": "state_dict()._metadata", "aliases": "state_dict() values "
                "(detached aliases of the live tensors: [key, same storage and no grad])", "keep_vars":
                "state_dict(keep_vars=True) values (the Parameters themselves)", "prefixed": "state_dict(prefix='net.') keys",
                "load": "load_state_dict(...) result: ['ok', missing, unexpected, repr is '<All keys matched "
                "successfully>', a 2-tuple] or ['raised', type, graded lines]", "input_unchanged":
                "the checkpoint passed in is left as it was", "after": "the module's tensors after loading"}
        for key, want in expected.items():
            found = first_difference(got.get(key), want, key)
            if found:
                context = {"expected": want, "     got": got.get(key)} if key != "after" else {}
                return f"{what[key]}:\n" + difference_text(found, context)
        return None

    def diagnose(self, case, got, expected):
        spec, items, metadata = case.args
        strict = case.kwargs["strict"]
        extra = set(map(str, got.get("keys") or [])) - set(expected["keys"])
        if extra and all(k.rpartition(".")[2] in _non_persistent_names(spec) for k in extra):
            return "buffers registered with persistent=False are not saved by state_dict"
        if first_difference(got.get("metadata"), expected["metadata"]):
            return ("_metadata has one entry per module, keyed by its path without the trailing dot ('' for the root), "
                    "value {'version': module._version}")
        load, want = got.get("load"), expected["load"]
        if isinstance(load, (list, tuple)) and first_difference(load, want):
            if want[0] == "ok" and load[0] == "ok" and not strict and (want[1] or want[2]) and not (load[1] or load[2]):
                return "with strict=False torch still reports missing and unexpected keys: it only does not raise"
            mismatch = [line for line in want[2] if "size mismatch" in line] if want[0] == "raised" else []
            if mismatch and (load[0] == "ok" or not any("size mismatch" in str(x) for x in load[2:])):
                return "a shape mismatch is an error even with strict=False"
            if _unexpected_keys(load) > _unexpected_keys(want):
                return "a key under a child's prefix is the child's to judge: a module reports as unexpected only keys " \
                       "under its own prefix that name neither its own tensor nor a child"
            return None
        for w, h in zip(expected["after"], got.get("after") or []):
            if first_difference(h, w) and not case.kwargs["assign"] and (
                    w["dtype"] != h.get("dtype") or w["shares_checkpoint_storage"] != h.get("shares_checkpoint_storage")):
                return "load_state_dict copies into the existing tensors (param.copy_(value)): dtype and identity " \
                       "stay the model's unless assign=True"
        return None


def _unexpected_keys(load) -> set:
    """The unexpected keys a load reported: from its result, or from the "Unexpected key(s)" line of its error."""
    if not isinstance(load, (list, tuple)) or len(load) < 3:
        return set()
    if load[0] == "ok":
        return set(map(str, load[2]))
    line = next((x for x in load[2] if str(x).startswith("Unexpected key(s)")), "")
    return set(line.split(": ", 1)[1].rstrip(". ").replace('"', "").split(", ")) if line else set()


def _non_persistent_names(spec) -> set:
    return {name for node in spec["nodes"] for name, _, persistent in node.get("buffers", []) if not persistent}


# ================================================================================================
# modules.call: __call__ with forward and backward hooks
# ================================================================================================
HOOK_KINDS = ["fpre", "fpre_kw", "fhook", "fhook_kw", "fhook_always", "bpre", "bhook"]


@st.composite
def hook_plans(draw_, n_nodes: int):
    """Up to 8 hooks ``(node, kind, prepend, modify)`` on random nodes."""
    return draw_(st.lists(st.tuples(st.integers(0, n_nodes - 1), st.sampled_from(HOOK_KINDS), st.booleans(),
                                    st.booleans()), max_size=8))


def plan_text(plan) -> str:
    return ", ".join(f"{kind}@#{node}{' prepend' if prepend else ''}{' changes' if modify else ''}"
                     for node, kind, prepend, modify in plan) or "no hooks"


class Call(ModulesExercise):
    id, entry, points = "modules.call", "Calling", 1
    title = "__call__: forward pre-hooks, forward hooks and full backward hooks"
    probe = f"{PROBES}:call_probe"
    policy = mixin_policy("__call__ and the hooks (BackwardHook included)")
    timeout_s = 30.0

    def _case(self, spec, scenario="plan", plan=(), x_requires_grad=True, grad_mode=True, remove=(), label=""):
        plan = [tuple(h) for h in plan]
        text = {"plan": f"hooks: {plan_text(plan)}; x.requires_grad={x_requires_grad}, grad mode {grad_mode}"
                        f"{', then handles ' + str(list(remove)) + ' removed' if remove else ''}: {tree_text(spec)}",
                "forward_only": f"root.forward(x), not root(x); hooks: {plan_text(plan)}: {tree_text(spec)}",
                "always_call": "forward raises; hooks with and without always_call",
                "always_call_failing_hook": "forward raises and an always_call hook raises too",
                "kwargs": "a with_kwargs pre-hook rewrites kwargs; hooks with and without kwargs",
                "two_inputs": "forward(x, y), y needing no grad, two outputs: what forward and backward hooks see",
                "hook_raises": "a forward hook raises after an always_call hook ran",
                "bad_returns": "hooks returning the wrong shape of result"}[scenario]
        return Case((spec, scenario), {"plan": plan, "x_requires_grad": x_requires_grad, "grad_mode": grad_mode,
                                       "remove": list(remove)}, label=(label + ": " if label else "") + text)

    boundary_classes = {**TREE_CLASSES,
                        "an input that needs no grad": lambda c, e: not c.kwargs["x_requires_grad"],
                        "torch.no_grad()": lambda c, e: not c.kwargs["grad_mode"],
                        "forward raises (always_call)": lambda c, e: c.args[1] == "always_call_failing_hook",
                        "hook returns of the wrong shape (bad input that must raise)": lambda c, e:
                            c.args[1] == "bad_returns",
                        "prepend on every kind": lambda c, e: {h[1] for h in c.kwargs["plan"] if h[2]} >= set(HOOK_KINDS),
                        "a removed hook": lambda c, e: bool(c.kwargs["remove"]),
                        "a tensor input that needs no grad next to one that does": lambda c, e:
                            c.args[1] == "two_inputs"}

    def visible_cases(self):
        c, example = self._case, example_spec()
        every = [(n, k, False, False) for n in range(5) for k in ("fpre", "fhook", "bpre", "bhook")]
        return [c(example, plan=every, label="every kind of hook on every module: the order"),
                c(example, plan=[(2, "fhook", False, True), (2, "fpre", True, True), (0, "fpre", False, True),
                                 (0, "fhook", True, False)], label="hooks that change args and outputs, prepend"),
                c(example, plan=[(4, "bpre", False, True), (4, "bhook", False, True), (2, "bhook", True, False)],
                  label="backward hooks that change gradients"),
                c(example, "always_call"), c(example, "kwargs"),
                c(example, "forward_only", plan=[(0, "fpre", False, False), (2, "fhook", False, False)])]

    def hidden_cases(self):
        c = self._case
        out = [c(spec, plan=[(n, k, n % 2 == 0, (n + i) % 3 == 0) for n in range(len(spec["nodes"]))
                             for i, k in enumerate(HOOK_KINDS)], x_requires_grad=i % 2 == 0, label=label)
               for i, (label, spec) in enumerate(boundary_specs())]
        example = example_spec()
        prepends = [(0, kind, prepend, False) for kind in HOOK_KINDS for prepend in (False, True, False, True)]
        out += [c(example, "always_call_failing_hook"), c(example, "bad_returns"), c(example, "two_inputs"),
                c(example, "hook_raises"), c(example, plan=prepends, label="four hooks of each kind, two prepended"),
                c(example, plan=[(0, "fpre", False, True), (0, "fhook", False, True), (0, "bhook", False, True)],
                  grad_mode=False, label="under torch.no_grad()"),
                c(example, plan=[(1, "fhook", False, True), (1, "fhook", True, True), (1, "bhook", False, False)],
                  remove=[0], label="a removed hook")]

        def case(d):
            spec = d(tree_specs(max_nodes=4, dims=(1, 2)))
            return c(spec, plan=d(hook_plans(len(spec["nodes"]))), x_requires_grad=d(st.booleans()),
                     grad_mode=d(st.sampled_from([True, True, False])))

        return out + draw(cases_from(case), 40)

    def expected(self, case):
        spec, scenario = case.args
        kw = case.kwargs
        return P.call_run(torch.nn.Module, spec, scenario, kw["plan"], kw["x_requires_grad"], kw["grad_mode"],
                          kw["remove"], register=True)

    def compare(self, case, got, expected):
        if not isinstance(got, dict):
            return f"the probe returned {describe(got)}"
        what = {"events": "hook calls [kind, node, k] (k: the hook's position in the plan)", "forward_events":
                "hook calls during the forward", "y": "the output", "y_requires_grad": "output.requires_grad",
                "x_grad": "x.grad after backward", "grads": "the parameters' .grad after backward", "outcome":
                "the call's outcome", "outcomes": "the calls' outcomes"}
        for key, want in expected.items():
            found = first_difference(got.get(key), want, key)
            if found:
                context = {"expected": want, "     got": got.get(key)} if key == "events" else {}
                return f"{what.get(key, key)}:\n" + difference_text(found, context)
        return None

    def diagnose(self, case, got, expected):
        spec, scenario = case.args
        plan = case.kwargs["plan"]
        if not isinstance(got, dict):  # the student's code raised
            if scenario == "plan" and any(h[1] == "fpre" and h[3] for h in plan):
                return "a forward pre-hook's non-None return replaces args; a bare value is wrapped in a 1-tuple"
            got = {}
        if scenario.startswith("always_call") and first_difference(got.get("events"), expected["events"]):
            return "hooks registered with always_call=True run even when forward raises (with result None), and " \
                   "the original exception propagates"
        if scenario == "kwargs":
            return "hooks registered with_kwargs=True get kwargs too, and such a pre-hook may return (args, kwargs)"
        if scenario == "hook_raises":
            return "when a forward hook raises, only the always_call hooks that have not run yet are run"
        if scenario == "two_inputs":
            return "the identity Function must mark the tensors that need no grad non-differentiable, and backward " \
                   "hooks receive tuples with one entry per tensor input/output (None where no gradient flows)"
        if scenario == "bad_returns":
            return "a hook's return of the wrong shape is a RuntimeError (a with_kwargs pre-hook must return a " \
                   "2-tuple; backward hooks one gradient per input/output)"
        if scenario == "forward_only":
            return "module.forward(x) runs forward alone: the module's own hooks are skipped (its children are " \
                   "still called through __call__)"
        g_events, e_events = got.get("events") or [], expected.get("events") or []
        e_fwd = expected["forward_events"]
        if first_difference(g_events[:e_fwd], e_events[:e_fwd]):
            if sorted(map(str, g_events[:e_fwd])) == sorted(map(str, e_events[:e_fwd])) and any(h[2] for h in plan):
                return "prepend=True puts the hook first among this module's hooks of its kind"
            return None
        if not first_difference(g_events, e_events):
            if first_difference(got.get("y"), expected["y"]):
                if any(h[1] in ("fhook", "fhook_kw", "fhook_always") and h[3] for h in plan):
                    return "a non-None return of a forward hook replaces the output, and later hooks see the replacement"
                if any(h[1] == "fpre" and h[3] for h in plan):
                    return "a forward pre-hook's non-None return replaces args; a bare value is wrapped in a 1-tuple"
            if any(h[1] == "bpre" and h[3] for h in plan):
                return "a backward pre-hook's non-None return replaces grad_output for the rest of the backward"
            if any(h[1] == "bhook" and h[3] for h in plan):
                return "a full backward hook's non-None return replaces the gradients w.r.t. the module's inputs"
            return None
        return ("backward hooks fire when the gradient w.r.t. the module's inputs is ready: pass the tensor inputs "
                "through an identity autograd Function and hook its node (when no input requires grad, the full "
                "backward hooks fire from the output's node, right after the pre-hooks)")


# ================================================================================================
# modules.hook_order: predict the order of hook calls (plain Python)
# ================================================================================================
@st.composite
def chain_trees(draw_, max_modules: int = 7):
    """Chain trees: each module multiplies by its own parameter (trainable, frozen or none), then calls its
    children in order; ``{"same_as": path}`` calls a module defined earlier again."""
    budget = [draw_(st.integers(1, max_modules))]
    defined: list[str] = []

    def make(path: str, ancestors: frozenset):
        defined.append(path)
        node = {"name": path.rpartition(".")[2] or "net",
                "param": draw_(st.sampled_from(["trainable", "frozen", None])), "children": []}
        for k in range(draw_(st.integers(0, 3))):
            candidates = [d for d in defined if d not in ancestors | {path}]
            if candidates and draw_(st.integers(0, 4)) == 0:
                node["children"].append({"same_as": draw_(st.sampled_from(candidates))})
            elif budget[0] > 1:
                budget[0] -= 1
                node["children"].append(make((path + "." if path else "") + f"c{k}", ancestors | {path}))
        return node

    return make("", frozenset())


def chain_text(tree) -> str:
    def one(node):
        if "same_as" in node:
            return f"<{node['same_as'] or 'net'} again>"
        kids = ", ".join(one(c) for c in node.get("children", []))
        return f"{node['name']}[{node.get('param') or '-'}]" + (f"({kids})" if kids else "")

    return one(tree)


def fresh_strings(tree):
    """The tree with every string rebuilt at run time: not the interned literals of this file (as in the
    graded run, where the tree arrives as JSON), so an answer that compares strings with `is` fails here too."""
    if isinstance(tree, dict):
        return {k: fresh_strings(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [fresh_strings(v) for v in tree]
    return "".join(list(tree)) if isinstance(tree, str) else tree


def torch_hook_order(tree: dict, input_requires_grad: bool) -> list[tuple[str, str]]:
    """What torch does: the chain tree built on torch.nn.Module, every hook recording, forward then backward."""
    from ..viz.modules import trace_hook_calls

    root = build_tree(chain_tree_to_spec(tree), torch.nn.Module)[0]
    x = torch.ones(3, 2, requires_grad=input_requires_grad)
    backward = root(x).requires_grad
    return [(e["kind"], e["module"]) for e in trace_hook_calls(root, x, backward=backward)]


class HookOrder(ModulesExercise):
    id, entry, points = "modules.hook_order", "hook_order", 2
    title = "predict the order of hook calls, forward and backward (plain Python)"
    forbid = ("torch", "numpy")
    policy = rules("predict the order without running anything", no_modules=("torch", "numpy"))

    boundary_classes = {
        "a root only": lambda c, e: not c.args[0].get("children"),
        "an input that needs no grad": lambda c, e: not c.args[1],
        "a module called twice": lambda c, e: "same_as" in str(c.args[0]),
        "no backward at all (nothing requires grad)": lambda c, e: not any(k.startswith("bwd") for k, _ in e),
        "a frozen module before a trainable one": lambda c, e: "'frozen'" in str(c.args[0])
                                                               and "'trainable'" in str(c.args[0]),
    }

    def visible_cases(self):
        stem_head = {"name": "net", "param": None, "children": [{"name": "stem", "param": "frozen", "children": []},
                                                                 {"name": "head", "param": "trainable", "children": []}]}
        shared = {"name": "net", "param": None, "children": [
            {"name": "stem", "param": "frozen", "children": []},
            {"name": "body", "param": "trainable", "children": [{"same_as": "stem"}]}]}
        return [Case((stem_head, True), label="input requires grad: " + chain_text(stem_head)),
                Case((stem_head, False), label="input without grad: the frozen stem's output needs none: "
                                              + chain_text(stem_head)),
                Case((shared, True), label="stem called twice: " + chain_text(shared))]

    def hidden_cases(self):
        root_only = {"name": "net", "param": None, "children": []}
        frozen_root = {"name": "net", "param": "frozen", "children": []}
        deep = {"name": "net", "param": None, "children": [
            {"name": "a", "param": "frozen", "children": [{"name": "b", "param": None, "children": []}]},
            {"name": "c", "param": "trainable", "children": [{"same_as": "a.b"}, {"same_as": "a"}]}]}
        fixed = [Case((fresh_strings(t), r), label=f"{label}, input requires grad {r}: {chain_text(t)}")
                 for label, t in (("a root only", root_only), ("a frozen root", frozen_root), ("shared inside", deep))
                 for r in (True, False)]
        return fixed + draw(st.builds(lambda t, r: Case((fresh_strings(t), r),
                                                        label=f"input requires grad {r}: {chain_text(t)}"),
                                      chain_trees(), st.booleans()), 60)

    def expected(self, case):
        return torch_hook_order(*case.args)

    def compare(self, case, got, expected):
        if not isinstance(got, (list, tuple)):
            return f"expected a list of (kind, path) pairs, got {describe(got)}"
        got = [tuple(e) if isinstance(e, (list, tuple)) else e for e in got]
        found = first_difference(got, expected, "events")
        if found is None:
            return None
        return difference_text(found, {"expected": expected, "     got": got})

    def diagnose(self, case, got, expected):
        got = [tuple(e) if isinstance(e, (list, tuple)) else e for e in got]
        fwd = [e for e in expected if e[0] in ("pre", "fwd")]
        if [e for e in got if isinstance(e, tuple) and e[:1] in (("pre",), ("fwd",))] != fwd:
            return "forward: a module's pre-hook fires before its children's, its forward hook after them; a " \
                   "module called twice fires its hooks twice"
        expected_backward = {p for k, p in expected if k.startswith("bwd")}
        got_backward = {e[1] for e in got if isinstance(e, tuple) and len(e) == 2 and str(e[0]).startswith("bwd")}
        if got_backward - expected_backward:
            return "a module whose output does not require grad gets no backward hook call at all"
        if expected_backward - got_backward:
            return "a module's output requires grad when its input does, or when it has a trainable parameter of its " \
                   "own (a frozen one does not count); then it gets backward hook calls"
        for k, (kind, path) in enumerate(expected[:-1]):
            if kind == "bwd-pre" and expected[k + 1] == ("bwd", path) and (kind, path) in got:
                i = got.index((kind, path))
                if got[i + 1:i + 2] != [("bwd", path)]:
                    return "when no input of a module requires grad, its full backward hooks fire right after its " \
                           "backward pre-hooks (from the output's node), before its children's"
        if sorted(map(str, got)) == sorted(map(str, expected)):
            return "backward runs the calls in reverse: the last module called gets its gradient first"
        return None


# ================================================================================================
# modules.functional_call: swap, call, restore (on real torch modules)
# ================================================================================================
def tensor_names(spec: dict) -> tuple[list[str], list[set]]:
    """Every parameter and buffer name of the tree (duplicates included), and the tied groups among them."""
    root = build_tree(spec, torch.nn.Module)[0]
    named = [*root.named_parameters(remove_duplicate=False), *root.named_buffers(remove_duplicate=False)]
    groups: dict = {}
    for name, t in named:
        groups.setdefault(id(t), set()).add(name)
    return [n for n, _ in named], [g for g in groups.values() if len(g) > 1]


def torch_trips_on(spec: dict, names: list, tie_weights: bool) -> bool:
    """torch 2.13 raises KeyError when 2 of 3 or more names of one tied tensor are given (its
    ``_untie_named_tensors_map`` looks up every name of the group): such cases are left out."""
    if not tie_weights:
        return False
    _, groups = tensor_names(spec)
    return any(2 <= len(g & set(names)) < len(g) for g in groups)


class FunctionalCall(ModulesExercise):
    id, entry, points = "modules.functional_call", "functional_call", 1
    title = "functional_call: a module as a pure function of its tensors"
    probe = f"{PROBES}:functional_call_probe"
    policy = rules(
        "this exercise asks you to write functional_call (torch.func and torch.nn.utils.stateless do it for you)",
        deny_modules=("torch.func", "torch._functorch", "torch.nn.utils.stateless",
                      "torch.nn.utils._named_member_accessor", "torch.nn.utils.parametrize"),
        banned=("load_state_dict", "_load_from_state_dict", "functional_call", "_reparametrize_module",
                "swap_tensor", "NamedMemberAccessor"))

    def _case(self, spec, names, tie_weights=True, strict=False, scenario="plain", label=""):
        text = f"{{{', '.join(names)}}} given, tie_weights={tie_weights}, strict={strict}" + \
               {"raises": ", forward raises", "bare_args": ", args a bare tensor"}.get(scenario, "") + f": {tree_text(spec)}"
        return Case((spec, list(names)), {"tie_weights": tie_weights, "strict": strict, "scenario": scenario},
                    label=(label + ": " if label else "") + text)

    boundary_classes = {**TREE_CLASSES,
                        "strict=True with an unknown name": lambda c, e: c.kwargs["strict"] and "not_a_name" in c.args[1],
                        "tie_weights=False": lambda c, e: not c.kwargs["tie_weights"],
                        "no name given": lambda c, e: not c.args[1],
                        "forward raises": lambda c, e: c.kwargs["scenario"] == "raises",
                        "args a bare tensor": lambda c, e: c.kwargs["scenario"] == "bare_args",
                        "the dict checked after the call": lambda c, e: e["input_unchanged"] is True}

    def visible_cases(self):
        c, example = self._case, example_spec()
        bounds = dict(boundary_specs())
        shared = bounds["a block shared under two names and by two parents, an int64 counter, an empty module"]
        return [c(example, ["block.proj", "block.running_mean"], label="a parameter and a buffer"),
                c(example, ["embed.weight"], label="one name of a tied weight: both names use it"),
                c(example, ["embed.weight"], tie_weights=False, label="tie_weights=False: only that name"),
                c(shared, ["block.proj"], label="a module registered under two names (pytorch/pytorch#164759)"),
                c(example, ["block.proj"], strict=True, label="strict=True with names missing"),
                c(example, ["block.proj"], scenario="raises", label="forward raises: restore anyway")]

    def hidden_cases(self):
        out = []
        for label, spec in boundary_specs():
            names, _ = tensor_names(spec)
            for tie, strict, pick, scenario in ((True, False, names[:1] + ["not_a_name"], "plain"),
                                                (True, True, names, "plain"), (False, False, names[::2], "bare_args"),
                                                (True, False, names[-1:], "plain"),
                                                (False, True, names + ["not_a_name"], "plain"),
                                                (True, True, names[1:] + ["not_a_name"], "plain")):
                if not torch_trips_on(spec, pick, tie):
                    out.append(self._case(spec, pick, tie, strict, scenario, label=label))

        def case(d):
            spec = d(tree_specs())
            names, _ = tensor_names(spec)
            chosen = d(st.lists(st.sampled_from(names), unique=True)) if names else []
            if d(st.booleans()):
                chosen.append("not_a_name")
            tie, strict = d(st.booleans()), d(st.sampled_from([False, False, True]))
            scenario = d(st.sampled_from(["plain"] * 5 + ["raises"]))
            return None if torch_trips_on(spec, chosen, tie) else self._case(spec, chosen, tie, strict, scenario)

        return out + [c for c in draw(cases_from(case), 45) if c is not None]

    def expected(self, case):
        spec, names = case.args
        kw = case.kwargs
        report = P.functional_call_run(torch.func.functional_call, spec, names, kw["tie_weights"], kw["strict"],
                                       kw["scenario"])
        # Judged on their own terms, not as torch 2.13 does them: every original object is back afterwards
        # (torch restores first-in-first-out and can leave a passed tensor in a module registered twice,
        # pytorch/pytorch#164759), and the caller's dict is left as it was.
        report["restored"] = []
        report["input_unchanged"] = True
        return report

    def compare(self, case, got, expected):
        if not isinstance(got, dict):
            return f"the probe returned {describe(got)}"
        what = {"outcome": "the call's outcome", "type": "the exception", "lines": "the strict error's lines",
                "y": "the output", "during_call": "during the call (a forward pre-hook looks): [name, the slot holds "
                "the tensor given for it]", "grads": "the gradients of output.sum() reaching the tensors you were given",
                "restored": "slots not restored afterwards (node.kind.name)", "input_unchanged":
                "the dict you were given is left as it was"}
        for key, want in expected.items():
            found = first_difference(got.get(key), want, key)
            if found:
                return f"{what.get(key, key)}:\n" + difference_text(found)
        return None

    def diagnose(self, case, got, expected):
        spec, names = case.args
        kw = case.kwargs
        if got.get("outcome") != expected["outcome"]:
            if got.get("type") == "TypeError":
                return "setattr refuses a plain tensor on a parameter's name: write into the owner's _parameters " \
                       "or _buffers dict directly"
            if expected["outcome"] == "raised" and kw["strict"]:
                return "with strict=True the given names must be exactly all parameter and buffer names " \
                       "(duplicates included): RuntimeError listing unexpected and missing keys"
            if expected.get("type") == "ValueError":
                return "with tie_weights, two different tensors for one tied group are a ValueError"
            return None
        if expected["outcome"] == "raised" and got.get("lines") != expected.get("lines") and kw["tie_weights"]:
            return "with tie_weights=True, a value given for one name of a tied tensor is used for all its names " \
                   "(so strict counts them all as given)"
        if expected["outcome"] == "ok" and got.get("y") != expected.get("y") and kw["tie_weights"]:
            _, groups = tensor_names(spec)
            if any(g & set(names) for g in groups):
                return "with tie_weights=True, a value given for one name of a tied tensor is used for all its names"
        grads_got, grads_want = dict(map(tuple, got.get("grads") or [])), dict(map(tuple, expected["grads"]))
        if any(grads_want.get(n) is not None and grads_got.get(n) is None for n in grads_want):
            return "put the given tensors themselves into the module (not their values: `param.data = value` " \
                   "or copy_ keep the module's own tensors, so no gradient reaches the ones you were given)"
        if got.get("restored"):
            if kw["scenario"] == "raises":
                return "restore the originals in a `finally`: forward may raise"
            return "restore every original, in reverse order of the swaps (last in, first out): a slot reached " \
                   "through two names was swapped twice"
        if got.get("input_unchanged") is False:
            return "work on a copy of the dict you were given"
        return None


# ================================================================================================
# modules.fix_model: the bug hunt, part 1
# ================================================================================================
class FixModel(ModulesExercise):
    id, entry, points = "modules.fix_model", "FixedNet", 1
    title = "bug hunt: fix BrokenNet's module plumbing"
    probe = f"{PROBES}:fix_model_probe"
    policy = CHAPTER_RULES  # subclassing nn.Module is the point: the chapter-wide rules only

    boundary_classes = {
        "depth 0": lambda c, e: c.args[1] == 0,
        "a sequence of length 1": lambda c, e: c.args[3] == 1,
        "T == max_len": lambda c, e: c.args[3] == c.args[2],
        "max_len 1": lambda c, e: c.args[2] == 1,
    }

    def visible_cases(self):
        return [Case((4, 2, 8, 5, 0), label="FixedNet(dim=4, depth=2, max_len=8) on x of shape (2, 5, 4)")]

    def hidden_cases(self):
        fixed = [Case((3, 0, 4, 1, 1), label="depth 0, a sequence of length 1"),
                 Case((3, 1, 1, 1, 2), label="max_len 1"), Case((5, 3, 6, 6, 3), label="T == max_len")]
        return fixed + draw(st.builds(lambda d, n, t, s: Case((d, n, 6, t, s), label=f"FixedNet({d}, {n}, 6), T={t}"),
                                      st.integers(3, 5), st.integers(0, 3), st.integers(1, 6), st.integers(0, 99)), 10)

    def expected(self, case):
        dim, depth, max_len, T, seed = case.args
        torch.manual_seed(seed)
        broken = BrokenNet(dim, depth, max_len)  # its arithmetic is right: the output to match
        x = torch.randn(2, T, dim, generator=torch.Generator().manual_seed(seed + 1))
        names = [f"blocks.{i}.{w}" for i in range(depth) for w in ("weight", "bias")] + ["norm.weight", "norm.bias"]
        return {"parameters": names, "state_dict": ["scale"] + names, "buffers": ["mask", "scale"],
                "y": broken(x).detach().tolist(), "hook_calls": depth, "mask_dtype_after_to": "float64",
                "blocks_trained": [True] * depth}

    def compare(self, case, got, expected):
        if not isinstance(got, dict):
            return f"the probe returned {describe(got)}"
        what = {"parameters": "named_parameters() names", "state_dict": "state_dict() keys", "buffers":
                "named_buffers() names (sorted)", "y": "the output (BrokenNet's arithmetic, same weights)",
                "hook_calls": "forward hooks on the blocks: calls in one forward", "mask_dtype_after_to":
                "mask.dtype after .to(torch.float64)", "blocks_trained": "one SGD step changes each block's weight"}
        for key, want in expected.items():
            found = first_difference(got.get(key), want, key)
            if found:
                return f"{what[key]}:\n" + difference_text(found, {"expected": want, "     got": got.get(key)}
                                                            if key != "y" else {})
        return None

    def diagnose(self, case, got, expected):
        params, state = got.get("parameters") or [], got.get("state_dict") or []
        if "mask" in params:
            return "the mask is not trained: register it as a buffer, not a Parameter"
        if "mask" in state:
            return "register the mask with persistent=False: it is derived from max_len, so it is not saved and " \
                   "checkpoints without it still load strictly"
        if any(n.startswith("block") and not n.startswith("blocks.") for n in params):
            return "register the blocks in an nn.ModuleList named `blocks`: checkpoints are keyed blocks.0.weight..."
        if case.args[1] and not any(n.startswith("blocks.") for n in params):
            return "a Python list (or dict) of layers is a plain attribute: parameters(), state_dict() and .to() never " \
                   "see it; use nn.ModuleList"
        if got.get("hook_calls") == 0 and expected["hook_calls"]:
            return "call each block as `block(x)`, not `block.forward(x)`: forward() alone skips every hook"
        if got.get("mask_dtype_after_to") not in (None, "float64"):
            return "a tensor stored as a plain attribute is not moved by .to(): register it as a buffer"
        return None


# ================================================================================================
# modules.load_checkpoint: the bug hunt, part 2
# ================================================================================================
class Compiled(torch.nn.Module):
    """What ``torch.compile`` returns, as far as ``state_dict`` goes: the model as the child ``_orig_mod``
    (``torch.compile`` itself would import dynamo: about 10 s)."""

    def __init__(self, model):
        super().__init__()
        self._orig_mod = model


WRAPS = {"bare": lambda m: m, "dp": torch.nn.DataParallel, "compile": Compiled,
         "dp_compile": lambda m: Compiled(torch.nn.DataParallel(m)), "compile_dp": lambda m: torch.nn.DataParallel(Compiled(m))}
CHECKPOINT_DAMAGE = ["none", "drop_first", "drop_num_batches", "no_metadata", "drop_num_batches_no_metadata",
                     "rename_all", "extra_key", "drop_num_batches_stray_metadata"]


def wrapped_checkpoint(recipe: str, wrap: str, damage: str) -> tuple[list, list | None]:
    """A checkpoint of the recipe's model (other values than the target's) saved through a wrapper, damaged."""
    source = P.make_model(recipe, seed=1)
    with torch.no_grad():
        for t in source.state_dict().values():
            t.add_(1)
    sd = WRAPS[wrap](source).state_dict()
    items = [[k, v.clone()] for k, v in sd.items()]
    metadata = [[k, dict(v)] for k, v in sd._metadata.items()]
    if damage == "drop_first" and items:
        items = items[1:]
    if damage.startswith("drop_num_batches"):
        items = [kv for kv in items if not kv[0].endswith("num_batches_tracked")]
    if damage.endswith("no_metadata"):
        metadata = None
    if damage.endswith("stray_metadata"):  # entries for modules nobody has (version 1): stripping must leave them
        metadata = [*metadata, ["a", {"version": 1}], ["z", {"version": 1}]]
    if damage == "rename_all":
        items = [["encoder." + k, v] for k, v in items]
    if damage == "extra_key":
        items.append(["stray.weight", torch.zeros(1)])
    return items, metadata


def expected_load(model, checkpoint):
    """The rule the notebook states, with torch's own stripping and loading: candidates by stripping one wrapper
    prefix at a time while every key has one, the best match (least stripped on a tie), loaded strictly."""
    from collections import OrderedDict

    from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

    def copy(sd):
        out = OrderedDict(sd)
        if hasattr(sd, "_metadata"):
            out._metadata = OrderedDict(sd._metadata)
        return out

    candidates = [copy(checkpoint)]
    while candidates[-1]:
        prefix = next((p for p in ("module.", "_orig_mod.") if all(k.startswith(p) for k in candidates[-1])), None)
        if prefix is None:
            break
        nxt = copy(candidates[-1])
        consume_prefix_in_state_dict_if_present(nxt, prefix)
        candidates.append(nxt)
    own = set(model.state_dict())
    best = max(candidates, key=lambda c: sum(k in own for k in c))
    return model.load_state_dict(best, strict=True)


class LoadCheckpoint(ModulesExercise):
    id, entry, points = "modules.load_checkpoint", "load_checkpoint", 1
    title = "bug hunt: a checkpoint loader that cannot fail silently"
    probe = f"{PROBES}:load_checkpoint_probe"
    policy = rules("this exercise asks you to strip the prefixes yourself", deny_modules=("torch.nn.modules.utils",),
                   banned=("consume_prefix_in_state_dict_if_present",))

    def _case(self, recipe, wrap, damage):
        items, metadata = wrapped_checkpoint(recipe, wrap, damage)
        return Case((recipe, items, metadata), label=f"model {recipe}, saved through {wrap}, damage: {damage}")

    boundary_classes = {
        "a child really called module": lambda c, e: c.args[0] == "has_module_child",
        "two wrappers stacked": lambda c, e: any(k.startswith(("_orig_mod.module.", "module._orig_mod."))
                                                 for k, _ in c.args[1]),
        "no _metadata": lambda c, e: c.args[2] is None,
        "a missing key that must raise": lambda c, e: e["outcome"] == "raised",
        "an empty model and checkpoint": lambda c, e: c.args[0] == "empty",
        "the checkpoint checked after the call": lambda c, e: e["input_unchanged"] is True,
    }

    def visible_cases(self):
        c = self._case
        return [c("linear_bn", "bare", "none"), c("linear_bn", "dp", "none"), c("linear_bn", "dp_compile", "none"),
                c("has_module_child", "bare", "none"), c("linear_bn", "dp", "drop_num_batches")]

    def hidden_cases(self):
        cases = [self._case(r, w, d) for r in ("linear_bn", "has_module_child", "encoder", "linear")
                 for w in WRAPS for d in ("none", "drop_first")]
        cases += [self._case(r, w, d) for r in ("linear_bn",) for w in ("bare", "dp", "compile_dp")
                  for d in CHECKPOINT_DAMAGE[2:]]
        cases += [self._case("encoder", w, d) for w in ("dp", "compile") for d in ("rename_all", "extra_key")]
        cases += [self._case("bn", w, d) for w in ("bare", "dp", "dp_compile")
                  for d in ("none", "drop_num_batches", "drop_num_batches_stray_metadata")]
        return cases + [self._case("empty", "bare", "none"), self._case("empty", "dp", "extra_key")]

    def expected(self, case):
        return P.load_checkpoint_run(expected_load, *case.args)

    def compare(self, case, got, expected):
        if not isinstance(got, dict):
            return f"the probe returned {describe(got)}"
        what = {"outcome": "the outcome", "result": "load_state_dict's result [missing, unexpected]", "type":
                "the exception", "lines": "the error's lines", "values": "the model's state_dict values afterwards",
                "input_unchanged": "the checkpoint you were given (keys and _metadata) is left as it was"}
        for key, want in expected.items():
            found = first_difference(got.get(key), want, key)
            if found:
                return f"{what[key]}:\n" + difference_text(found, {"expected": want, "     got": got.get(key)}
                                                            if key in ("lines", "result") else {})
        return None

    def diagnose(self, case, got, expected):
        recipe, items, metadata = case.args
        if got.get("input_unchanged") is False:
            return "do not modify the caller's checkpoint (or its _metadata): build new dicts"
        if expected["outcome"] == "raised" and got.get("outcome") == "ok":
            if any((got.get("result") or [[], []])):
                return "load strictly: a strict=False load reports the keys it could not match but raises nothing"
            if metadata is not None and any("num_batches_tracked" in line for line in expected["lines"]):
                return "keep `_metadata` (stripped like the keys): without it BatchNorm reads the checkpoint as very " \
                       "old and silently keeps its own num_batches_tracked"
            return "load strictly: a strict=False load reports the keys it could not match but raises nothing"
        if got.get("outcome") == "raised" and got.get("lines") != expected.get("lines"):
            if any("module" in line for line in got.get("lines") or []):
                return "strip a wrapper prefix only at the start of keys, and only while every key has it; compare " \
                       "the candidates with the model's own keys (a child may really be called `module`)"
        return None


EXERCISES = [Register(), Traverse(), Convert(), StateDictExercise(), Call(), HookOrder(), FunctionalCall(), FixModel(),
             LoadCheckpoint()]


CHAPTER = Chapter("modules", EXERCISES, sandbox_files=("modules/scaffold.py", "modules/trees.py"))

__all__ = ["CHAPTER", "EXERCISES", "boundary_specs", "chain_trees", "tree_specs"]
