"""Closed-import policies: rules on the objects an answer reaches through its imports, resolved in the grader.

The name rules of :mod:`.policy` ban *names* ("no ``.unfold``"). Some exercises must ban whole parts of torch
("nothing of ``torch.nn.Module``'s machinery", "nothing from ``torch.func``"), which no list of names covers:
``from torch.nn import Module as Base`` and ``ns = torch.nn; ns.Module`` reach the same class. A
:class:`~.policy.Policy` with ``imports`` (the only modules answer cells may import) is judged here instead:
every dotted path an answer reaches through an import (``torch.nn.Module``, ``Base`` after the import above)
is resolved to the object itself, in the grader's process (only allowed roots are imported), and judged by
the object's *home* module (``deny_modules``), its base classes (``deny_subclasses_of``) and an allow list
(``allow_objects``). ``why`` says what the exercise asks for. The course's own dotted entries in ``imports``
(``ptinternals.modules.scaffold``) allow that module only, not the package above or below it.

With imports closed, the hiding rules are the ones below, checked on every answer cell (a violation there
could change how *any* exercise is measured, so it costs every exercise of the notebook): ``eval``/``exec``/
``compile``, ``__import__``, ``globals``/``locals``/``vars``, ``open``, ``__builtins__``; ``getattr``/
``setattr``/``delattr`` only with a literal name (read as ``obj.name``); frame and code attributes, ``mro``,
type-hint evaluation, ``singledispatch``; dunders outside :data:`DUNDERS_OK` (``__setattr__`` and friends
only as ``super().__x__``/``object.__x__``); imports outside ``imports``, relative and star imports; a
``_private`` part of anything imported; a module reached through another module's attribute; a module used
as a value; assignment into anything imported (monkeypatching) or into a computed object; objects from
``deny_modules_anywhere``. In the exercise's own answer cell and, transitively, the answer cells whose
top-level names it reads: the exercise's ``deny_*`` rules, ``no_modules``, ``banned`` and the loop rules;
and the graded name (``Exercise.entry``) bound only in its own answer cell. The modules chapter uses it.
"""
from __future__ import annotations

import ast
import functools
import importlib
import types

from ._runtime import strip_magics

HIDING_NAMES = {"eval", "exec", "compile", "__import__", "globals", "locals", "vars", "breakpoint", "open", "input",
                "help", "memoryview", "__builtins__", "__loader__", "__spec__", "exit", "quit"}
LITERAL_ONLY = {"getattr", "setattr", "delattr"}  # allowed with a literal attribute name, read as `obj.name`
DUNDERS_OK = {"__init__", "__name__", "__qualname__", "__doc__", "__module__", "__class__", "__dict__", "__call__",
              "__len__", "__iter__", "__next__", "__repr__", "__str__", "__eq__", "__hash__", "__contains__",
              "__getitem__", "__setitem__", "__delitem__", "__bool__", "__version__", "__future__"}
VIA_BASE = {"__setattr__", "__getattr__", "__delattr__"}  # only as super().__x__ or object.__x__
BANNED_ATTRIBUTES = {
    "mro", "f_globals", "f_locals", "f_builtins", "f_back", "f_code", "tb_frame", "tb_next", "gi_frame", "gi_code",
    "cr_frame", "cr_code", "ag_frame", "ag_code", "get_type_hints", "ForwardRef", "_evaluate", "singledispatch",
    "singledispatchmethod"}


def allowed_module(name: str, imports: tuple[str, ...]) -> bool:
    """Whether ``name`` may be imported: an entry of ``imports``, or a submodule of an undotted one."""
    return any(name == a or (name.startswith(a + ".") and "." not in a) for a in imports)


def _within(dotted: str, imports: tuple[str, ...]) -> bool:
    """Whether a dotted path starts at an allowed root (``torch...``) or at a dotted entry (the scaffold)."""
    return allowed_module(dotted.split(".")[0], imports) or \
        any("." in a and (dotted == a or dotted.startswith(a + ".")) for a in imports)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _chain(node) -> tuple[str, list[str]] | None:
    """``("torch", ["nn", "Module"])`` for ``torch.nn.Module``; None when the chain does not start at a name."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return (node.id, attrs[::-1]) if isinstance(node, ast.Name) else None


def _target_root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node


def _targets(node) -> list:
    if isinstance(node, (ast.Tuple, ast.List)):
        return [t for elt in node.elts for t in _targets(elt)]
    if isinstance(node, ast.Starred):
        return _targets(node.value)
    return [node]


class _Cell:
    """What one answer cell does, as far as the policy cares: problems found on the spot, paths reached
    through imports (judged later, per policy), imports, top-level bindings, names read, statements."""

    def __init__(self, source: str, aliases: dict[str, str], imports: tuple[str, ...]):
        self.problems: list[tuple[int, str]] = []
        self.reached: list[tuple[int, str, bool]] = []  # (line, dotted path, used as a value)
        self.imports: list[tuple[int, str]] = []
        self.binds: dict[str, int] = {}
        self.loads: set[str] = set()
        self.aliases = dict(aliases)
        self.allowed = imports
        self.body: list[ast.stmt] = []
        try:  # magics are commented out, as the sandbox runs the cell
            tree = ast.parse(strip_magics(source))
        except SyntaxError:  # the sandbox cannot run it either: the exercise fails on its own
            return
        self.body = tree.body
        self.parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        nodes = sorted((n for n in ast.walk(tree) if hasattr(n, "lineno")), key=lambda n: (n.lineno, n.col_offset))
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self._import(node)
        for node in nodes:  # `P = torch.nn.Parameter`: P is an alias too (for the monkeypatching rule)
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                chain = _chain(node.value)
                if chain and chain[0] in self.aliases:
                    self.aliases[node.targets[0].id] = ".".join([self.aliases[chain[0]], *chain[1]])
        for node in nodes:
            self._visit(node)
        self._bindings(tree)

    def _problem(self, node, text: str) -> None:
        self.problems.append((getattr(node, "lineno", 0), text))

    def _import(self, node) -> None:
        allowed = ", ".join(self.allowed)
        if isinstance(node, ast.Import):
            for a in node.names:
                self.imports.append((node.lineno, a.name))
                if not allowed_module(a.name, self.allowed):
                    self._problem(node, f"`import {a.name}`: graded answers may import only {allowed}")
                if any(_private(p) for p in a.name.split(".")):
                    self._problem(node, f"`import {a.name}`: a private module")
                self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            return
        module = node.module or ""
        if node.level:
            self._problem(node, "a relative import")
            return
        self.imports.append((node.lineno, module))
        for a in node.names:
            full = f"{module}.{a.name}"
            if a.name == "*":
                self._problem(node, f"`from {module} import *` hides which names it brings in")
                continue
            if not (allowed_module(module, self.allowed) or allowed_module(full, self.allowed)):
                self._problem(node, f"`from {module} import {a.name}`: graded answers may import only {allowed}")
            if _private(a.name) or any(_private(p) for p in module.split(".")):
                self._problem(node, f"`from {module} import {a.name}`: a private name")
            if a.name in BANNED_ATTRIBUTES or a.name in HIDING_NAMES | LITERAL_ONLY:
                self._problem(node, f"`from {module} import {a.name}`: `{a.name}` is not allowed in graded answers")
            self.aliases[a.asname or a.name] = full
            self.reached.append((node.lineno, full, False))

    def _attribute_name(self, node, attr: str, value) -> None:
        if attr.startswith("__") and attr.endswith("__") and attr not in DUNDERS_OK:
            via_base = isinstance(value, ast.Name) and value.id == "object" or \
                isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"
            if not (attr in VIA_BASE and via_base):
                self._problem(node, f"the attribute `{attr}` (it can reach objects this check cannot follow)")
        if attr in BANNED_ATTRIBUTES:
            self._problem(node, f"the attribute `{attr}`")

    def _visit(self, node) -> None:
        parent = self.parents.get(node)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            self.loads.add(node.id)
            if node.id in HIDING_NAMES:
                self._problem(node, f"`{node.id}` hides what it runs or reads from this check")
            elif node.id in LITERAL_ONLY and not (isinstance(parent, ast.Call) and parent.func is node):
                self._problem(node, f"`{node.id}` used as a value")
            elif node.id in self.aliases and not (isinstance(parent, ast.Attribute) and parent.value is node):
                self.reached.append((node.lineno, self.aliases[node.id], True))
        elif isinstance(node, ast.Attribute):
            self._attribute_name(node, node.attr, node.value)
            if isinstance(parent, ast.Attribute) and parent.value is node:
                return  # only the longest chain is judged
            chain = _chain(node)
            if chain and chain[0] in self.aliases:
                root, attrs = chain
                for attr in attrs:
                    if _private(attr):
                        self._problem(node, f"`{root}.{'.'.join(attrs)}`: `{attr}` is private")
                    if attr == "__dict__":
                        self._problem(node, f"`{root}.{'.'.join(attrs)}`: the namespace of something imported")
                self.reached.append((node.lineno, ".".join([self.aliases[root], *attrs]), True))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in LITERAL_ONLY:
            name = node.args[1] if len(node.args) >= 2 else None
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                self._problem(node, f"`{node.func.id}` with a computed attribute name hides the name from this check")
                return
            self._attribute_name(node, name.value, node.args[0])
            chain = _chain(node.args[0])
            if chain and chain[0] in self.aliases:
                if node.func.id != "getattr":
                    self._problem(node, f"`{node.func.id}` on `{chain[0]}`, which is imported (monkeypatching)")
                self.reached.append((node.lineno, ".".join([self.aliases[chain[0]], *chain[1], name.value]), True))
            elif node.func.id != "getattr" and not isinstance(_target_root(node.args[0]), ast.Name):
                self._problem(node, f"`{node.func.id}` on a computed object")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete, ast.For, ast.withitem)):
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = node.targets
            elif isinstance(node, ast.withitem):
                targets = [node.optional_vars] if node.optional_vars is not None else []
            else:
                targets = [node.target]
            for target in (t for group in targets for t in _targets(group)):
                if not isinstance(target, (ast.Attribute, ast.Subscript)):
                    continue
                root = _target_root(target)
                if isinstance(root, ast.Name) and root.id in self.aliases:
                    self._problem(target, f"assigns into `{root.id}`, which is imported (monkeypatching)")
                elif not isinstance(root, ast.Name):
                    self._problem(target, "assigns an attribute or item of a computed object")
                if isinstance(target, ast.Attribute) and target.attr == "__class__":
                    self._problem(target, "assigns `__class__`")

    def _bindings(self, tree) -> None:
        """Top-level names the cell binds (not inside functions or classes), and ``global`` declarations."""
        def visit(node, top: bool):
            if isinstance(node, ast.Global):
                for name in node.names:
                    self.binds.setdefault(name, node.lineno)
            if top:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    self.binds.setdefault(node.name, node.lineno)
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    for a in node.names:
                        self.binds.setdefault(a.asname or a.name.split(".")[0], node.lineno)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                    self.binds.setdefault(node.id, node.lineno)
            inner = top and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))
            for child in ast.iter_child_nodes(node):
                visit(child, inner)

        for stmt in tree.body:
            visit(stmt, True)


@functools.lru_cache(maxsize=256)
def analyse(source: str, aliases: tuple, imports: tuple[str, ...]) -> _Cell:
    """One cell's analysis, with ``aliases`` (``((name, dotted path), ...)``) already bound by the setup cell."""
    return _Cell(source, dict(aliases), imports)


@functools.lru_cache(maxsize=4096)
def _resolve(dotted: str, imports: tuple[str, ...]) -> tuple:
    """``((prefix, object), ...)`` along an import path, as far as it resolves (imports allowed roots only)."""
    start = next((a for a in imports if "." in a and (dotted == a or dotted.startswith(a + "."))), None)
    if start is None:
        start = dotted.split(".")[0]
        if not allowed_module(start, imports):
            return ()
    obj = importlib.import_module(start)
    steps = [(start, obj)]
    prefix = start
    for part in dotted[len(start) + 1:].split(".") if dotted != start else []:
        prefix = f"{prefix}.{part}"
        try:
            obj = getattr(obj, part)
        except AttributeError:
            if not isinstance(obj, types.ModuleType):
                break
            try:
                obj = importlib.import_module(prefix)
            except ImportError:
                break
        except Exception:  # noqa: BLE001 - a lazy attribute that fails: nothing further to judge
            break
        steps.append((prefix, obj))
    return tuple(steps)


def _home(obj) -> str:
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    module = getattr(obj, "__module__", None)
    return module if isinstance(module, str) else type(obj).__module__


@functools.lru_cache(maxsize=4096)
def _judge(policy, dotted: str, as_value: bool, own: bool) -> str | None:
    """What is wrong with reaching ``dotted`` through an import, or None: under the rules for every answer
    cell (``own`` False), or also under the exercise's own (``own`` True: the cells its answer relies on)."""
    imports = policy.imports
    root = dotted.split(".")[0]
    if own and root in policy.no_modules:
        return f"`{dotted}`: this exercise is written without {' or '.join(policy.no_modules)}"
    if not _within(dotted, imports):
        return f"`{dotted.rsplit('.', 1)[-1]}` comes from {dotted.rsplit('.', 1)[0]}, which graded answers may not use"
    steps = _resolve(dotted, imports)
    deny = policy.deny_modules_anywhere + (policy.deny_modules if own else ())
    allowed = {id(obj) for path in policy.allow_objects for _, obj in _resolve(path, imports)[-1:]} if own else set()
    deny_classes = tuple(obj for path in policy.deny_subclasses_of for _, obj in _resolve(path, imports)[-1:]) \
        if own else ()
    previous = None
    for prefix, obj in steps:
        if isinstance(obj, types.ModuleType):
            if isinstance(previous, types.ModuleType) and obj.__name__ != prefix and \
                    not obj.__name__.startswith(previous.__name__ + "."):
                return f"`{prefix}` reaches the module {obj.__name__} through another module's attribute"
        elif id(obj) not in allowed:
            home = _home(obj)
            if any(home == m or home.startswith(m + ".") for m in deny):
                return f"`{prefix}` (from {home}) is not allowed here"
            if isinstance(obj, type) and deny_classes and issubclass(obj, deny_classes):
                return f"`{prefix}` is a {deny_classes[0].__name__} subclass, not allowed here"
        previous = obj
    if as_value and steps and steps[-1][0] == dotted and isinstance(steps[-1][1], types.ModuleType):
        return f"the module `{dotted}` used as a value: write `{dotted}.<name>` where you need a name from it"
    return None


def _scope(cells: dict, own_cell: str, setup_names: set) -> set:
    """The exercise's answer cell and, transitively, every answer cell whose top-level names it reads."""
    if own_cell not in cells:
        return set()
    scope, todo = {own_cell}, [own_cell]
    while todo:
        cell = cells[todo.pop()]
        wanted = cell.loads - set(cell.binds) - setup_names
        for cid, other in cells.items():
            if cid not in scope and wanted & set(other.binds):
                scope.add(cid)
                todo.append(cid)
    return scope


def closed_violations(ex, policy, sources: dict[str, str], own_cell: str | None,
                      setup_cells: tuple[str, ...] = ("setup",)) -> tuple[list, bool]:
    """``(violations, chapter_wide)`` of ``policy`` (which has ``imports``) in ``sources`` (``{cell id:
    source}``, the chapter's ``setup_cells`` included when grading). ``own_cell``: the exercise's answer
    cell when ``sources`` is the whole notebook; None when it is only the cell that defined the entry
    (instant feedback: every cell given is the exercise's own). ``chapter_wide``: the violations are of the
    rules for every answer cell (they cost every exercise of the notebook)."""
    from .policy import Violation, banned_uses, loop_uses

    imports = policy.imports
    # The names the setup cell imports, which answer cells use without importing them (for instant
    # feedback, where only the answer's own cell is known: ``policy.setup_imports``, the setup cell as written)...
    setup_source = "\n".join(sources[c] for c in setup_cells if c in sources) or policy.setup_imports
    setup = analyse(setup_source, (), imports)
    # ...except its imports from modules the sandbox does not ship (quiz, figures): they do not exist there
    aliases = tuple(sorted((k, v) for k, v in setup.aliases.items() if _within(v, imports)))
    cells = {cid: analyse(src, aliases, imports) for cid, src in sources.items() if cid not in setup_cells}
    found = [Violation(cid, line, text) for cid, cell in cells.items() for line, text in cell.problems]
    found += [Violation(cid, line, text) for cid, cell in cells.items() for line, dotted, as_value in cell.reached
              if (text := _judge(policy, dotted, as_value, False))]
    found += banned_uses([(cid, stmt) for cid, cell in cells.items() for stmt in cell.body],
                         set(policy.banned_anywhere))
    if found:
        return found, own_cell is not None
    scope = set(cells) if own_cell is None else _scope(cells, own_cell, set(setup.binds))
    if own_cell is not None:
        found += [Violation(cid, cell.binds[ex.entry], f"binds `{ex.entry}`, the name {ex.name} grades: define it "
                                                       f"only in that exercise's answer cell")
                  for cid, cell in cells.items() if cid != own_cell and ex.entry in cell.binds]
    mine = [(cid, stmt) for cid in sorted(scope) for stmt in cells[cid].body]
    for cid in sorted(scope):
        cell = cells[cid]
        found += [Violation(cid, line, text) for line, dotted, as_value in cell.reached
                  if (text := _judge(policy, dotted, as_value, True))]
        found += [Violation(cid, line, f"`import {name}`: this exercise is written without "
                                       f"{' or '.join(policy.no_modules)}")
                  for line, name in cell.imports if name.split(".")[0] in policy.no_modules]
    found += banned_uses(mine, set(policy.banned)) + loop_uses(mine, policy)
    return found, False
