"""Method checks the student's code cannot forge: a static policy on the submission's source.

Some exercises give points for *how* an answer is computed ("a view built with as_strided, not
``unfold``"; "integer operations, not a cast to bfloat16"; "your own GradScaler, not torch's"). A
measurement taken while the code runs can always be forged by that code (it shares the process:
``DisableTorchFunction``, monkeypatching, ``ctypes``). The grader therefore reads the answer cells'
*source*, here, in its own process, where the student's code never runs:

1. :attr:`Policy.banned`: names the exercise's own code must not use (as an attribute ``x.unfold``,
   in an import ``from torch.nn.functional import unfold``, or as a string ``"unfold"``). Checked on
   the exercise's answer cell and, transitively, every top-level definition (in any answer cell) it
   refers to by name. :attr:`Policy.banned_anywhere`: the same, on every answer cell.
2. :data:`HIDING`: the constructs that would hide a name from (1) or change what a visible name
   means, checked on every answer cell: dynamic lookup (``getattr``, ``vars``, ``globals``,
   ``eval``/``exec``/``compile``, ``__import__``/``importlib``, ``sys.modules``, ``operator.attrgetter``,
   ``str.format`` field lookups, ``typing.get_type_hints``), escapes from Python (``ctypes``, ``pickle``,
   ``marshal``, ``gc``, ``inspect``, frames), star imports, private attributes (``x._name``, except
   ``self._name`` and the chapter's :attr:`Chapter.policy_allow`), dunder attributes other than the
   plain-class ones, and monkeypatching (assigning an attribute of an imported module, or any
   attribute named like one of torch's functions).

3. Closed imports (:attr:`Policy.imports`, judged in :mod:`.policy_imports`): answer cells import only
   the listed modules, and what they reach through them is resolved to the objects themselves and judged
   by home module (:attr:`Policy.deny_modules`, ``deny_modules_anywhere``) and base class
   (:attr:`Policy.deny_subclasses_of`), so no alias reaches a banned class (``from torch.nn import
   Module as Base``). Such a policy brings its own hiding rules in place of (2) (``getattr`` with a
   literal name and ``object.__setattr__`` stay allowed; ``Chapter.policy_allow`` is not needed); the
   name rules of (1), ``no_modules`` and the loop rules still apply, on the exercise's cells.

A violation fails the exercise (category ``forbidden``) with the construct, cell and line. Only
exercises with a :class:`Policy` (or a ``forbid`` module that cannot be made absent, such as
``struct``) are checked; ``ptgrade validate`` runs the same check for students before they submit.
"""
from __future__ import annotations

import ast
import builtins
import dataclasses
import re
import string
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Policy:
    banned: tuple[str, ...] = ()  # in the exercise's own code and what it refers to ("@": the operator)
    banned_anywhere: tuple[str, ...] = ()  # in every answer cell
    why: str = ""  # what to do instead (ends the message)
    no_modules: tuple[str, ...] = ()  # modules the exercise's own code must not use at all (e.g. torch)
    # Rules about loops, in the exercise's own code (the profiling chapter: what makes the host wait):
    in_loops: tuple[str, ...] = ()  # calls (``item``, ``print``) not allowed inside a for/while body
    mask_index_in_loops: bool = False  # no ``x[y >= 0]`` (a boolean mask) inside a loop
    tensor_tests_in_loops: bool = False  # no if/while/assert inside a loop whose condition calls torch
    # Closed imports (grading/policy_imports.py): answer cells may import only ``imports``; what they reach
    # through them is resolved to the objects and judged by home module and base class. Setting ``imports``
    # replaces the hiding rules above by that module's (the name, no_modules and loop rules still apply).
    imports: tuple[str, ...] = ()  # the modules answer cells may import ("torch": its submodules too)
    setup_imports: str = ""  # the setup cell's imports as written (instant feedback sees only the answer's cell)
    deny_modules: tuple[str, ...] = ()  # no object whose home module is one of these (or below), in own code
    deny_modules_anywhere: tuple[str, ...] = ()  # the same, in every answer cell
    deny_subclasses_of: tuple[str, ...] = ()  # no subclass of these classes (dotted paths), in own code
    allow_objects: tuple[str, ...] = ()  # dotted paths own code may reach all the same

    def __post_init__(self):
        closed = ("setup_imports", "deny_modules", "deny_modules_anywhere", "deny_subclasses_of", "allow_objects")
        unused = [f for f in closed if getattr(self, f) and not self.imports]
        if unused:
            raise ValueError(f"Policy fields {', '.join(unused)} need `imports` (the closed-import rules)")


@dataclass(frozen=True)
class Violation:
    cell: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.what} (answer cell {self.cell}, line {self.line})"


# ---- the constructs that hide a name ------------------------------------------------------------
HIDING_NAMES = {  # builtins (as bare names) that look names up by string or reach the interpreter
    "getattr", "setattr", "delattr", "vars", "eval", "exec", "compile", "globals", "locals", "__import__",
    "breakpoint", "__builtins__",
}
HIDING_MODULES = {  # imported or named in any way
    "importlib", "builtins", "ctypes", "cffi", "pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal",
    "shelve", "copyreg", "gc", "inspect", "pydoc", "pkgutil", "runpy", "code", "codeop", "timeit", "profile",
    "cProfile", "pdb", "bdb", "trace", "traceback", "types", "mock", "zipimport", "imp", "sysconfig", "site",
    "faulthandler", "tracemalloc", "dis", "ast", "symtable", "linecache", "sys", "subprocess", "pty", "multiprocessing",
    "concurrent", "unittest",
}
MODULE_ATTRS = {  # reached as an attribute too (`os.sys`): names no honest attribute has
    "sys", "builtins", "importlib", "gc", "inspect", "ctypes", "cffi", "pickle", "cPickle", "_pickle", "dill",
    "cloudpickle", "marshal", "shelve", "copyreg", "pydoc", "pkgutil", "runpy", "codeop", "zipimport", "imp",
    "tracemalloc", "faulthandler", "sysconfig", "subprocess", "pty", "_thread",
}
HIDING_ATTRS = {  # attributes that look things up by string or expose frames and the import system
    "modules", "attrgetter", "methodcaller", "get_type_hints", "get_annotations", "ForwardRef", "format_map",
    "Formatter", "settrace", "setprofile", "exc_info", "exception", "enter_context", "import_module",
    "locate", "resolve_name", "getmembers", "getattr_static", "load_library", "load_inline", "cpp_extension",
    "CompilationUnit", "overrides", "get_overridable_functions", "get_testing_overrides",
    # a new process runs code given as a string
    "system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve", "execl", "execle",
    "execlp", "execlpe", "execvp", "execvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve",
    "spawnvp", "spawnvpe", "startfile",
}
FRAME_ATTR = re.compile(r"^(f|tb|gi|cr|ag|co)_[a-z_]+$")
PLAIN_DUNDERS = {  # what a plain class or a plain call needs
    "__init__", "__call__", "__name__", "__qualname__", "__doc__", "__len__", "__iter__", "__next__", "__getitem__",
    "__setitem__", "__contains__", "__enter__", "__exit__", "__repr__", "__str__", "__eq__", "__ne__", "__lt__",
    "__le__", "__gt__", "__ge__", "__hash__", "__bool__", "__post_init__", "__new__", "__torch_function__",
    "__torch_dispatch__",
}
SELF_NAMES = {"self", "cls", "ctx"}
_BUILTINS = frozenset(dir(builtins))


@lru_cache(maxsize=None)
def _torch_callables() -> frozenset[str]:
    """Names of torch's functions and Tensor methods: assigning an attribute so named is monkeypatching."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:  # pragma: no cover (the grader always has torch)
        return frozenset()
    names = set()
    objs = [torch, torch.Tensor, F, torch.nn.Module]
    try:
        import torch.distributed as dist

        objs.append(dist)
    except ImportError:  # pragma: no cover
        pass
    for obj in objs:
        for name in dir(obj):
            if name.startswith("_"):
                continue
            try:
                if callable(getattr(obj, name)) and not isinstance(getattr(type(obj), name, None), property):
                    names.add(name)
            except Exception:  # noqa: BLE001 (a lazy attribute that fails: not a function)
                continue
    for settable in ("grad", "data", "requires_grad", "weight", "bias", "training", "name", "T"):
        names.discard(settable)
    return frozenset(names)


# ================================================================================================
# Parsing the submission
# ================================================================================================
@dataclass
class _Cell:
    id: str
    tree: ast.Module


def _parse(cells: list[dict]) -> tuple[list[_Cell], list[Violation]]:
    from ._runtime import strip_magics

    parsed, problems = [], []
    for c in cells:
        try:
            parsed.append(_Cell(c["id"], ast.parse(strip_magics(c["source"]))))
        except SyntaxError as e:  # the cell cannot run anyway; its exercise fails as "missing"
            problems.append(Violation(c["id"], e.lineno or 0, f"a syntax error ({e.msg})"))
    return parsed, problems


def _import_bound(cells: list[_Cell]) -> dict[str, str]:
    """Names bound by an import, anywhere, to the module path they stand for."""
    bound = {}
    for cell in cells:
        for node in ast.walk(cell.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                for a in node.names:
                    bound[a.asname or a.name] = f"{node.module or ''}.{a.name}"
    changed = True
    while changed:  # aliases by plain assignment: T = torch.Tensor
        changed = False
        for cell in cells:
            for node in ast.walk(cell.tree):
                if isinstance(node, ast.Assign) and _root(node.value) in bound:
                    for t in node.targets:
                        if isinstance(t, ast.Name) and t.id not in bound:
                            bound[t.id] = bound[_root(node.value)]
                            changed = True
    return bound


def _root(node) -> str | None:
    """``a`` for ``a.b.c`` (a pure attribute chain), else None."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _top_level_bindings(cells: list[_Cell]) -> dict[str, list[tuple[str, ast.AST]]]:
    """Top-level name -> the statements (any cell) that bind it."""
    out: dict[str, list] = {}
    for cell in cells:
        for stmt in cell.tree.body:
            for name in _bound_names(stmt):
                out.setdefault(name, []).append((cell.id, stmt))
    return out


def _bound_names(stmt) -> set[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    names = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not stmt:
            continue
    return names


def reachable(cells: list[_Cell], start_cell: str, entry: str | None = None) -> list[tuple[str, ast.AST]]:
    """The statements the exercise's code can depend on: its answer cell; transitively, every top-level
    statement (any answer cell) binding a name it loads; and every top-level statement that could put
    something into one of those names from elsewhere (an attribute or item stored on it, a method
    called on it, or it passed to a call: ``shared.helper = torch``, ``registry.append(f)``, ``setup(shared)``)."""
    bindings = _top_level_bindings(cells)
    # names the submission binds itself (a module it imports cannot carry what another cell puts in it:
    # assigning an attribute of a module is monkeypatching, refused everywhere)
    defined = {n for n, stmts in bindings.items() if any(not isinstance(s, (ast.Import, ast.ImportFrom)) for _, s in stmts)}
    mutations = _mutation_sites(cells, defined)
    todo = [(c.id, stmt) for c in cells if c.id == start_cell for stmt in c.tree.body]
    todo += bindings.get(entry, []) if entry else []  # the entry point, wherever it is defined
    seen: set[int] = set()
    out = []
    while todo:
        cell_id, stmt = todo.pop()
        if id(stmt) in seen:
            continue
        seen.add(id(stmt))
        out.append((cell_id, stmt))
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                todo += bindings.get(node.id, []) + mutations.get(node.id, [])
    return out


def _mutation_sites(cells: list[_Cell], defined: set[str]) -> dict[str, list[tuple[str, ast.AST]]]:
    """Submission-defined name -> the top-level statements (any depth inside them) that may change
    what it holds without rebinding it at the top level."""
    out: dict[str, list] = {}
    for cell in cells:
        for stmt in cell.tree.body:
            names = set()
            for node in ast.walk(stmt):
                if isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)):
                    names.add(_root(node.value if isinstance(node, ast.Attribute) else _subscript_base(node)))
                elif isinstance(node, ast.Call):
                    if isinstance(node.func, ast.Attribute):
                        names.add(_root(node.func.value))
                    for arg in [*node.args, *(k.value for k in node.keywords)]:
                        names.add(_root(arg) if not isinstance(arg, ast.Subscript) else _root(_subscript_base(arg)))
                elif isinstance(node, ast.Global):
                    names |= set(node.names)
            for name in names & defined:
                out.setdefault(name, []).append((cell.id, stmt))
    return out


def _subscript_base(node):
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return node


# ================================================================================================
# The checks
# ================================================================================================
def _uses(node, names: set[str]) -> str | None:
    """The banned name ``node`` uses, if any: attribute, import path part or imported name, string."""
    if isinstance(node, ast.Attribute) and node.attr in names:
        return f".{node.attr}"
    if isinstance(node, ast.Name) and node.id in names and node.id in _BUILTINS:  # memoryview(...)
        return node.id
    if "@" in names and isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.MatMult):
        return "the @ operator (a matrix product)"
    if isinstance(node, ast.Import):
        for a in node.names:
            hit = next((p for p in a.name.split(".") if p in names), None)
            if hit:
                return f"import {a.name}"
    if isinstance(node, ast.ImportFrom):
        parts = (node.module or "").split(".") + [a.name for a in node.names]
        hit = next((p for p in parts if p in names), None)
        if hit:
            return f"from {node.module} import {hit}" if hit in [a.name for a in node.names] else f"from {node.module} import"
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 200:
        text = node.value.strip()
        hit = next((n for n in names if text == n or re.fullmatch(rf"(torch|aten|numpy|np|F)([.:]+\w+)*[.:]+{re.escape(n)}"
                                                                  rf"(\.\w+)?", text)), None)
        if hit:
            return f"the string {node.value!r}"
    return None


def banned_uses(stmts, names: set[str]) -> list[Violation]:
    out = []
    for cell_id, stmt in stmts:
        for node in ast.walk(stmt):
            hit = _uses(node, names)
            if hit:
                out.append(Violation(cell_id, getattr(node, "lineno", 0), hit))
    return out


def module_uses(stmts, modules: set[str], bound: dict[str, str]) -> list[Violation]:
    """Any use of ``modules`` (torch, numpy): their imports, and names bound to them, in ``stmts``."""
    out = []
    aliases = {name for name, path in bound.items() if path.split(".")[0] in modules} | modules
    if "numpy" in modules:
        aliases.add("np")
    for cell_id, stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] in modules for a in node.names):
                out.append(Violation(cell_id, node.lineno, f"import {node.names[0].name}"))
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in modules:
                out.append(Violation(cell_id, node.lineno, f"from {node.module} import"))
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in aliases:
                out.append(Violation(cell_id, node.lineno, f"{node.id} (the {bound.get(node.id, node.id)} module)"))
    return out


LOOKUP_BUILTINS = {"getattr": "load", "hasattr": "load", "setattr": "store", "delattr": "store"}


def _allowed_chain_nodes(tree, allow: set[str]) -> set[int]:
    """Attribute nodes covered by a dotted entry of ``allow`` (``"_C._disabled_torch_function_impl"``
    allows ``torch._C`` only on the way to that one attribute)."""
    chains = [a.split(".") for a in allow if "." in a]
    ok: set[int] = set()
    for node in ast.walk(tree):
        for chain in chains:
            cur, matched = node, []
            for part in reversed(chain):
                if isinstance(cur, ast.Attribute) and cur.attr == part:
                    matched.append(cur)
                    cur = cur.value
                else:
                    matched = []
                    break
            ok |= {id(m) for m in matched}
    return ok


def _attribute_problem(attr: str, base, allow: set[str], allowed_node: bool) -> str | None:
    if attr in HIDING_ATTRS or attr in MODULE_ATTRS or FRAME_ATTR.match(attr):
        return f".{attr}"
    if attr.startswith("__") and attr.endswith("__"):
        return None if attr in PLAIN_DUNDERS else f".{attr}"
    own = (isinstance(base, ast.Name) and base.id in SELF_NAMES) or (
        isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super")
    if attr.startswith("_") and attr not in allow and not allowed_node and not own:
        return f".{attr} (a private attribute)"
    return None


def loop_uses(stmts, policy: Policy) -> list[Violation]:
    """The loop rules of ``policy`` on ``stmts``: device reads inside a for/while body."""
    if not (policy.in_loops or policy.mask_index_in_loops or policy.tensor_tests_in_loops):
        return []
    out = []
    for cell_id, stmt in stmts:
        for loop in (n for n in ast.walk(stmt) if isinstance(n, (ast.For, ast.While, ast.AsyncFor))):
            body = loop.body + loop.orelse
            masks = {t.id for b in body for a in ast.walk(b) if isinstance(a, ast.Assign) and _is_condition(a.value)
                     for t in a.targets if isinstance(t, ast.Name)}
            for sub in (n for b in body for n in ast.walk(b)):
                if isinstance(sub, ast.Call):
                    f = sub.func
                    called = f.attr if isinstance(f, ast.Attribute) else (f.id if isinstance(f, ast.Name) else "")
                    if called in policy.in_loops:
                        out.append(Violation(cell_id, sub.lineno, f"`{called}(...)` inside the loop of line {loop.lineno}"))
                if policy.mask_index_in_loops and isinstance(sub, ast.Subscript):
                    index = sub.slice.elts if isinstance(sub.slice, ast.Tuple) else [sub.slice]
                    if any(_is_condition(i) or (isinstance(i, ast.Name) and i.id in masks) for i in index):
                        out.append(Violation(cell_id, sub.lineno, f"indexing with a boolean mask inside the loop of "
                                             f"line {loop.lineno} (it becomes nonzero(): the host reads the count)"))
                if policy.tensor_tests_in_loops and isinstance(sub, (ast.If, ast.While, ast.Assert, ast.IfExp)) \
                        and _calls_torch(sub.test):
                    out.append(Violation(cell_id, sub.lineno, f"a tensor decides a condition inside the loop of line "
                                         f"{loop.lineno} (bool() of a device tensor reads it on the host)"))
    return out


def _is_condition(node) -> bool:
    return isinstance(node, (ast.Compare, ast.BoolOp)) or (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not))


def _calls_torch(node) -> bool:
    """Whether an expression calls torch (``torch.isnan(x)``) or a tensor-looking method (``x.isnan()``)."""
    methods = {"any", "all", "isnan", "isfinite", "isinf", "item", "sum", "max", "min", "mean", "eq", "ne", "ge",
               "gt", "le", "lt", "equal", "allclose"}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            if _root(sub.func) in ("torch", "F") or sub.func.attr in methods:
                return True
    return False


def hiding_uses(cells: list[_Cell], allow: set[str], bound: dict[str, str]) -> list[Violation]:
    """Every construct of :data:`HIDING` in the answer cells."""
    out: list[Violation] = []
    torch_names = _torch_callables()

    def add(cell, node, what):
        out.append(Violation(cell.id, getattr(node, "lineno", 0), what))

    def patching(cell, node, base, attr):
        root = _root(base)
        if root in bound or (attr in torch_names and root not in SELF_NAMES):
            add(cell, node, f"assigning .{attr} (monkeypatching {ast.unparse(base)[:60]})")

    local = _locally_defined(cells)
    for cell in cells:
        chain_ok = _allowed_chain_nodes(cell.tree, allow)
        for node in ast.walk(cell.tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in LOOKUP_BUILTINS \
                    and node.func.id not in local and len(node.args) >= 2:
                # getattr(x, "name") is as visible as x.name; a computed name hides it
                name = node.args[1]
                if isinstance(name, ast.Constant) and isinstance(name.value, str):
                    problem = _attribute_problem(name.value, node.args[0], allow, False)
                    if problem:
                        add(cell, node, f"{node.func.id}(..., {name.value!r}): {problem}")
                    if LOOKUP_BUILTINS[node.func.id] == "store":
                        patching(cell, node, node.args[0], name.value)
                elif node.func.id not in allow:
                    add(cell, node, f"{node.func.id} with a computed attribute name")
            elif isinstance(node, ast.Name):
                if node.id in LOOKUP_BUILTINS:
                    continue  # judged at its call above (a bare reference passes it on: see the next line)
                if node.id in HIDING_NAMES or (node.id in HIDING_MODULES and isinstance(node.ctx, ast.Load)
                                               and node.id not in local):
                    add(cell, node, f"{node.id}")
                elif node.id.startswith("__") and node.id.endswith("__") and node.id not in PLAIN_DUNDERS \
                        and isinstance(node.ctx, ast.Load) and node.id != "__name__":
                    add(cell, node, f"{node.id}")
                elif node.id in SELF_NAMES and isinstance(node.ctx, (ast.Store, ast.Del)):
                    add(cell, node, f"rebinding {node.id}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                module = node.names[0].name if isinstance(node, ast.Import) else (node.module or "")
                from_hiding = isinstance(node, ast.ImportFrom) and module.split(".")[0] in HIDING_MODULES
                paths = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [module] + [a.name for a in node.names]
                for k, path in enumerate(paths):
                    parts = path.split(".")
                    imported_name = isinstance(node, ast.ImportFrom) and k > 0  # `from m import NAME`
                    # the course's own modules are named by chapter (ptinternals.compile is not the builtin)
                    course_module = not imported_name and parts[0] == "ptinternals"
                    # builtins' names matter as imported names (`from m import getattr`), not as parts of a
                    # module's path (functorch.compile is a module, not the builtin compile)
                    builtin_names = HIDING_NAMES | LOOKUP_BUILTINS.keys() if imported_name else set()
                    if (not imported_name and parts[0] in HIDING_MODULES) or from_hiding or (not course_module and
                            any(p in HIDING_ATTRS or p in builtin_names or p in MODULE_ATTRS for p in parts)):
                        add(cell, node, f"import of {path}")
                    elif any(p.startswith("_") and p not in allow and p != "__future__" for p in parts):
                        add(cell, node, f"import of the private {path}")
                    elif path == "*":
                        add(cell, node, f"from {node.module} import * (a star import hides names)")
            elif isinstance(node, ast.Attribute):
                problem = _attribute_problem(node.attr, node.value, allow, id(node) in chain_ok)
                if problem:
                    add(cell, node, problem)
                elif node.attr == "format" and not _plain_format(node.value):
                    add(cell, node, ".format with a field lookup (use an f-string)")
                if isinstance(node.ctx, (ast.Store, ast.Del)):
                    patching(cell, node, node.value, node.attr)
        for node in ast.walk(cell.tree):  # a lookup builtin passed on (map(getattr, ...)) or rebound
            if isinstance(node, ast.Name) and node.id in LOOKUP_BUILTINS and node.id not in local \
                    and node.id not in allow and not _is_call_target(cell.tree, node):
                add(cell, node, f"{node.id} used other than as a direct call")
    return out


def _is_call_target(tree, name_node) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.func is name_node:
            return True
    return False


def _plain_format(receiver) -> bool:
    """``"{} {:.3f}".format(...)`` looks nothing up; ``"{0.attr}"`` or a non-literal receiver might."""
    if not (isinstance(receiver, ast.Constant) and isinstance(receiver.value, str)):
        return False
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(receiver.value) if f]
    except ValueError:
        return False
    return not any("." in f or "[" in f for f in fields)


def _locally_defined(cells: list[_Cell]) -> set[str]:
    """Names the submission itself defines (a parameter called ``types`` is not the ``types`` module)."""
    names = set()
    for cell in cells:
        for node in ast.walk(cell.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.ImportFrom):  # `from torch.profiler import profile`: judged at the import
                names |= {a.asname or a.name for a in node.names}
    return names


# ================================================================================================
# One exercise
# ================================================================================================
def effective_policy(ex) -> Policy | None:
    """The exercise's policy, with ``forbid`` modules that cannot be made absent (e.g. ``struct``) banned."""
    from .exercise import ABSENTABLE

    policy = getattr(ex, "policy", None)
    extra = tuple(m for m in ex.forbid if m not in ABSENTABLE)
    if not extra:
        return policy
    policy = policy or Policy(why=f"{ex.name} is to be written without {', '.join(ex.forbid)}")
    return dataclasses.replace(policy, banned_anywhere=policy.banned_anywhere + extra)


def check_policy(ex, cells: list[dict], allow: tuple[str, ...] = ()) -> list[Violation]:
    """The violations of ``ex``'s policy in the student's answer ``cells`` ([] when it has none)."""
    return _violations(ex, cells, allow, own_cell=ex.answer_cell)[0]


def _violations(ex, cells: list[dict], allow: tuple[str, ...], own_cell: str | None,
                setup_cells: tuple[str, ...] = ("setup",)) -> tuple[list[Violation], bool]:
    """``(violations, chapter_wide)``: chapter_wide when they cost every exercise (closed imports only)."""
    policy = effective_policy(ex)
    if policy is None:
        return [], False
    if policy.imports:
        from .policy_imports import closed_violations

        found, chapter_wide = closed_violations(ex, policy, {c["id"]: c["source"] for c in cells}, own_cell,
                                                setup_cells)
        return _in_order(found, cells), chapter_wide
    parsed, _ = _parse(cells)  # a cell that does not parse never runs (the run reports it): the rest is checked
    bound = _import_bound(parsed)
    mine = reachable(parsed, ex.answer_cell, ex.entry)
    everything = [(c.id, stmt) for c in parsed for stmt in c.tree.body]
    found = banned_uses(mine, set(policy.banned)) + banned_uses(everything, set(policy.banned_anywhere))
    if policy.no_modules:
        found += module_uses(mine, set(policy.no_modules), bound)
    found += loop_uses(mine, policy)
    found += hiding_uses(parsed, set(allow), bound)
    return _in_order(found, cells), False


def _in_order(found: list[Violation], cells: list[dict]) -> list[Violation]:
    unique = {(v.cell, v.line, v.what): v for v in found}
    order = [c["id"] for c in cells]
    return sorted(unique.values(), key=lambda v: (order.index(v.cell) if v.cell in order else 0, v.line, v.what))


def policy_problem(ex, sources: dict[str, str], own_cell: str | None = None) -> str | None:
    """``Exercise.source_problem`` for an exercise with a :class:`Policy`: the message, or None.

    ``sources``: ``{cell id: source}``, the whole notebook when grading (``own_cell`` is the exercise's
    answer cell; the chapter's locked setup cells are the course's, not judged), or the cell(s) that
    defined the entry point for instant feedback (``own_cell`` None)."""
    if effective_policy(ex) is None:
        return None
    from .exercise import load_chapter

    chapter = load_chapter(ex.id)
    if effective_policy(ex).imports:  # closed imports read the setup cell's imports too
        cells = [{"id": cid, "source": src} for cid, src in sources.items()]
    else:
        cells = [{"id": cid, "source": src} for cid, src in sources.items() if cid not in chapter.setup_cells]
    violations, chapter_wide = _violations(ex, cells, chapter.policy_allow, own_cell, chapter.setup_cells)
    return describe_violations(ex, violations, chapter_wide=chapter_wide) if violations else None


def describe_violations(ex, violations: list[Violation], limit: int = 5, chapter_wide: bool = False) -> str:
    policy = effective_policy(ex)
    lines = [f"{ex.name} scores 0: its code (or code it relies on) uses what this exercise is to be done without:"]
    lines += [f"  - {v}" for v in violations[:limit]]
    if len(violations) > limit:
        lines.append(f"  - ... and {len(violations) - limit} more")
    if policy is not None and policy.why and not chapter_wide:
        lines.append(f"  {policy.why}")
    if chapter_wide:
        lines.append("  every answer cell is checked for this, because such code could change how any exercise is "
                     "measured: it costs every exercise of the notebook until it is removed")
    lines.append("  (checked on your source before it runs: dynamic lookups such as getattr, private attributes, "
                 "eval and monkeypatching are not accepted in this chapter's graded cells)")
    return "\n".join(lines)


# ================================================================================================
# Name groups several chapters' policies share
# ================================================================================================
COPIES = ("clone", "contiguous", "copy_", "stack", "cat")  # what makes a copy where a view is asked for
AUTOGRAD = ("autograd", "backward", "vjp", "jvp", "jacrev", "jacfwd", "jacobian", "hessian", "functorch", "func")
HOST_MATH = ("numpy", "tolist", "item")  # computing a kernel's answer on the host, out of torch's sight
DATA_PARALLEL = ("DistributedDataParallel", "FullyShardedDataParallel", "fully_shard", "fsdp", "ZeroRedundancyOptimizer",
                 "replicate", "parallel", "optim_state_dict")
COLLECTIVES = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor",
               "all_to_all", "all_to_all_single", "broadcast", "reduce", "gather", "scatter", "all_gather_object",
               "broadcast_object_list", "functional_collectives")
STRUCT_LIKE = ("memoryview", "cast", "array", "frombytes", "unpack", "pack", "unpack_from", "pack_into", "iter_unpack")
LOW_PRECISION_CASTS = ("bfloat16", "float16", "half", "BFloat16Tensor", "HalfTensor", "type", "autocast", "struct",
                       "numpy", "tolist", "memoryview", "cast", "float8_e4m3fn", "float8_e5m2")
