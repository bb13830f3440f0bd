"""A chapter's checks module, cut down for the student edition: judging code without case-drawing code.

``ptinternals/checks/<slug>.py`` holds, per exercise, the code that draws cases (``visible_cases``,
``hidden_cases``, hypothesis strategies), the code that computes expected answers (``expected``,
sometimes from the reference) and the code that judges a result (``compare``, ``diagnose``,
``summary``). The student edition needs only the last, plus the cases and answers as data
(``grading.visible``). :func:`slice_checks` keeps exactly that, from the one source, by reachability
over the module's syntax tree:

1. in each ``Exercise`` class of the chapter (and its base classes in the module): the attributes the
   base ``Exercise`` defines (``id``, ``entry``, ``points``, ``forbid``, ``probe``, ``timeout_s``...)
   and the judging methods, minus the class's ``withheld_from_students`` (replaced by a method that
   returns None); then every member those reach through ``self.``, ``cls.``, ``super()`` or a class of
   the module. Case-drawing and expected-answer methods are never roots, so they go unless judging
   code calls them;
2. at module level: every function, class, constant and import the kept code names, transitively,
   plus ``EXERCISES`` and ``CHAPTER`` and the dataclasses the recorded data refers to.

Every import that survives must name a module the edition ships; otherwise :class:`EditionError`
says which method needed it (ship that module as a ``Chapter.student_files`` teaching helper, or
withhold the method).
"""
from __future__ import annotations

import ast
import importlib
import symtable
import sys
from dataclasses import dataclass, field

from ..grading.exercise import Exercise

JUDGING = ("compare", "diagnose", "summary")
CASE_MAKING = frozenset({"visible_cases", "hidden_cases", "expected", "cases_and_expected", "all_cases",
                         "boundary_classes"})  # what the hidden cases must cover: about them, not judging
WITHHOLDABLE = frozenset({"compare", "diagnose", "summary"})


class EditionError(Exception):
    """The student edition cannot be built as asked (the message says what to change)."""


@dataclass
class Sliced:
    source: str
    kept: list[str] = field(default_factory=list)  # "Class.member" and top-level names kept, for the manifest
    withheld: list[str] = field(default_factory=list)  # "Class.method" replaced by a stub
    dropped: list[str] = field(default_factory=list)  # top-level names and members left out


def _interface() -> set[str]:
    names = set()
    for klass in Exercise.__mro__[:-1]:
        names |= {n for n in vars(klass) if not n.startswith("__")}
    return (names - CASE_MAKING) | set(JUDGING)


def _strip_annotations(node: ast.AST) -> ast.AST:
    """Function annotations are never evaluated (``from __future__ import annotations``): ignore them."""
    for sub in ast.walk(node):
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
            sub.returns = None
            for a in sub.args.args + sub.args.posonlyargs + sub.args.kwonlyargs + [sub.args.vararg, sub.args.kwarg]:
                if a is not None:
                    a.annotation = None
    return node


def _globals_used(node: ast.AST) -> set[str]:
    """Module-level names ``node`` (a top-level statement) reads, in any nested scope."""
    return names_read(ast.unparse(_strip_annotations(_copy(node))))


def names_read(source: str) -> set[str]:
    """Module-level names the code ``source`` reads, in any nested scope (a function body reads them when
    called): what symtable marks referenced at top level, or global in a nested scope."""
    table = symtable.symtable(source, "<slice>", "exec")
    out = set()

    def walk(t, top: bool):
        for s in t.get_symbols():
            if s.is_referenced() and (top or s.is_global()):
                out.add(s.get_name())
        for child in t.get_children():
            walk(child, False)

    walk(table, True)
    return out


def _copy(node):
    return ast.parse(ast.unparse(node)).body[0]


def _binds(stmt: ast.stmt) -> set[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    table = symtable.symtable(ast.unparse(stmt), "<binds>", "exec")
    return {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}


def _member_name(stmt: ast.stmt) -> set[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def _attribute_refs(node: ast.AST, class_names: set[str]) -> set[str]:
    """Members reached from ``node``: ``self.x``, ``cls.x``, ``super().x``, ``type(self).x``, ``SomeClass.x``."""
    out = set()
    for sub in ast.walk(node):
        if not isinstance(sub, ast.Attribute):
            continue
        v = sub.value
        if isinstance(v, ast.Name) and (v.id in ("self", "cls") or v.id in class_names):
            out.add(sub.attr)
        elif isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id in ("super", "type"):
            out.add(sub.attr)
    return out


UNCHECKED = ("the visible check of {name} needs the course's reference implementation (it runs your answer "
             "through it), which the student edition does not include: your answer is checked when your notebook "
             "is graded, and the result comes with your feedback")


def _stub(name: str) -> ast.FunctionDef:
    """A withheld judging method: no likely cause (diagnose, summary), or no verdict at all (compare)."""
    if name == "compare":
        body = ("    from ..grading.exercise import CheckFailure\n"
                f"    raise CheckFailure({UNCHECKED!r}.format(name=self.name), exercise=self.id, category='unsupported')\n")
    else:
        body = "    return None\n"
    return ast.parse(f"def {name}(self, *args, **kwargs):  # withheld from the student edition\n{body}").body[0]


def slice_checks(slug: str, *, shipped: set[str], extra_roots: set[str] = frozenset()) -> Sliced:
    """The student edition's ``ptinternals/checks/<slug>.py`` (source text), cut from the repository's.

    ``shipped``: the absolute names of the ``ptinternals`` modules the edition ships (an import of any
    other course module in the kept code is an error). ``extra_roots``: module-level names the recorded
    data refers to (dataclasses), kept whatever uses them.
    """
    module = importlib.import_module(f"ptinternals.checks.{slug}")
    path = module.__file__
    tree = ast.parse(open(path).read())
    chapter = module.CHAPTER
    exercise_classes: dict[str, type] = {}
    for ex in chapter.exercises:
        for klass in type(ex).__mro__:
            if klass.__module__ == module.__name__:
                exercise_classes[klass.__name__] = klass
    interface = _interface()
    top_classes = {s.name for s in tree.body if isinstance(s, ast.ClassDef)}
    result = Sliced("")
    why_needed: dict[str, str] = {}

    # 1. Exercise classes. For each exercise's class, resolve its judging members through its MRO, minus
    #    what it withholds, then what those reach; a member is kept where it is defined.
    class_nodes = {s.name: s for s in tree.body if isinstance(s, ast.ClassDef) and s.name in exercise_classes}
    members = {name: {m: member for member in node.body for m in _member_name(member)}
               for name, node in class_nodes.items()}
    all_members = {s.name: {m: member for member in s.body for m in _member_name(member)}
                   for s in tree.body if isinstance(s, ast.ClassDef)}

    def refs(member) -> set[str]:
        """Members ``member`` reaches; a borrowed method (``compare = Other.compare``) reaches what the
        borrowed body reaches, looked up on the borrowing class."""
        out = _attribute_refs(member, top_classes)
        value = getattr(member, "value", None)
        if isinstance(member, ast.Assign) and isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
            borrowed = all_members.get(value.value.id, {}).get(value.attr)
            if borrowed is not None and borrowed is not member:
                out |= refs(borrowed)
        return out

    kept: dict[str, set[str]] = {name: set() for name in class_nodes}
    stubs: dict[str, set[str]] = {name: set() for name in class_nodes}
    for ex in chapter.exercises:
        mro = [k.__name__ for k in type(ex).__mro__ if k.__name__ in class_nodes]
        withheld = set(getattr(type(ex), "withheld_from_students", ()))
        bad = withheld - WITHHOLDABLE
        if bad:
            raise EditionError(f"checks/{slug}.py: {type(ex).__name__}.withheld_from_students names {sorted(bad)}; "
                               f"only {sorted(WITHHOLDABLE)} can be withheld")
        stubs[mro[0]] |= withheld
        todo = [m for m in interface if m not in withheld]
        seen: set[str] = set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            owner = next((k for k in mro if name in members[k]), None)
            if owner is None:
                continue  # defined by Exercise itself (or not at all)
            kept[owner].add(name)
            todo += [r for r in refs(members[owner][name]) if r not in withheld]
    for cls_name in sorted(stubs):
        result.withheld += [f"{cls_name}.{m}" for m in sorted(stubs[cls_name])]
    new_body: list[ast.stmt] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name in class_nodes:
            body = []
            for member in stmt.body:
                names = _member_name(member)
                if not names and isinstance(member, ast.Expr) and isinstance(member.value, ast.Constant):
                    body.append(member)  # the class docstring
                elif names & stubs[stmt.name]:
                    continue  # replaced by a stub below
                elif names & kept[stmt.name]:
                    body.append(member)
                    result.kept += [f"{stmt.name}.{n}" for n in sorted(names)]
                else:
                    result.dropped += [f"{stmt.name}.{n}" for n in sorted(names)]
            body += [_stub(name) for name in sorted(stubs[stmt.name])]
            stmt = ast.ClassDef(stmt.name, stmt.bases, stmt.keywords, body or [ast.Pass()], stmt.decorator_list,
                                **({"type_params": []} if sys.version_info >= (3, 12) else {}))
        new_body.append(stmt)
    kept_members = class_nodes

    # 2. Module level: from the exercise classes, EXERCISES, CHAPTER and the data's dataclasses, what they use.
    binders: dict[str, list[int]] = {}
    for i, stmt in enumerate(new_body):
        for name in _binds(stmt):
            binders.setdefault(name, []).append(i)
    roots = set(kept_members) | {"EXERCISES", "CHAPTER"} | set(extra_roots)
    needed: set[str] = set()
    keep_stmt: set[int] = set()
    todo = [(r, "the chapter's exercises") for r in sorted(roots)]
    while todo:
        name, via = todo.pop()
        if name in needed or name not in binders:
            continue
        needed.add(name)
        why_needed[name] = via
        for i in binders[name]:
            keep_stmt.add(i)
            stmt = new_body[i]
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                continue
            for used in _globals_used(stmt):
                todo.append((used, name))
    out: list[ast.stmt] = []
    for i, stmt in enumerate(new_body):
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            out.append(stmt)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)) and i in keep_stmt:
            aliases = [a for a in stmt.names if (a.asname or a.name).split(".")[0] in needed]
            _check_import(stmt, aliases, module.__name__, shipped, why_needed, slug)
            stmt.names = aliases
            out.append(stmt)
        elif i in keep_stmt:
            out.append(stmt)
            if not (isinstance(stmt, ast.ClassDef) and stmt.name in kept_members):
                result.kept += sorted(_binds(stmt))
        elif not (isinstance(stmt, ast.Expr) and i == 0):
            result.dropped += sorted(_binds(stmt))
    for stmt in out:  # imports inside kept functions must resolve too (a lazy import of the reference)
        for node in ast.walk(stmt):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and node is not stmt:
                owner = getattr(stmt, "name", "module level")
                _check_import(node, node.names, module.__name__, shipped, dict(why_needed, **{"import": owner}), slug)
        _strip_annotations(stmt)
    header = (f'"""The {slug} chapter\'s checks, student edition: generated from ptinternals/checks/{slug}.py by\n'
              f"``ptgrade student-edition``. It judges results exactly as the repository does (the same ``compare``\n"
              f"and ``diagnose``), on the visible cases recorded as data in ``{slug}.visible.json``; the code that\n"
              f'draws cases, the hidden cases and the code that computes expected answers are not part of it."""\n')
    tail = ("\n\nfrom pathlib import Path as _Path  # noqa: E402\n\n"
            "from ..grading.visible import install as _install_visible  # noqa: E402\n\n"
            "_install_visible(CHAPTER, _Path(__file__).parent)\n")
    body = "\n\n".join(ast.unparse(s) for s in out)
    result.source = header + body + tail
    return result


def _check_import(stmt, aliases, module_name: str, shipped: set[str], why: dict, slug: str) -> None:
    """A kept import must resolve in the edition, exactly: the standard library, a package students install
    with the edition (``manifest.THIRD_PARTY``), or a name the edition's course package provides
    (``manifest.importable``: a shipped module or a re-export of one; a parent package is not enough)."""
    from . import manifest

    node = ast.ImportFrom(stmt.module, aliases, stmt.level) if isinstance(stmt, ast.ImportFrom) else ast.Import(aliases)
    for target in manifest.import_targets(node, module_name):
        module = target[0]
        first = (aliases[0].asname or aliases[0].name).split(".")[0]
        if module.split(".")[0] == "ptinternals":
            if not manifest.importable(target, shipped):
                names = ", ".join(a.asname or a.name for a in aliases)
                chain = " <- ".join(_chain(first, why))
                t = manifest.describe(target)
                raise EditionError(f"checks/{slug}.py: the judging code needs {names} from {module} ({t}), which the "
                                   f"student edition does not ship (needed by {chain}). Ship {module} as a teaching "
                                   f"helper (Chapter.student_files) if it implements nothing graded, or withhold the "
                                   f"method that needs it (Exercise.withheld_from_students).")
        elif not manifest.third_party_ok(module):
            raise EditionError(f"checks/{slug}.py: the judging code needs {module}, which students do not install "
                               f"with the edition (needed by {' <- '.join(_chain(first, why))})")


def _chain(name: str, why: dict) -> list[str]:
    out, seen = [name], set()
    while name in why and name not in seen:
        seen.add(name)
        name = why[name]
        out.append(name)
    return out
