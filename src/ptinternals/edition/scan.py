"""Is the student edition clean? Look for graded solution code in every file of it, whatever it is called.

A *solution body* is the body of a function (or method) defined in an answer cell of a chapter's
solution notebook (``solutions/<slug>/<slug>.ipynb``), or in a reference module the edition leaves
out (``ptinternals/<slug>/*.py``), unless it is public by design: code the repository's student
notebooks already give (the parts of an answer cell outside its solution) or that the grading sandbox
ships to student code (scaffolds, probes). Bodies are compared **after normalising names and formatting**:
the docstring dropped, every identifier (variables, arguments, functions and classes defined inside)
renamed by order of first appearance, string constants emptied, then the AST dumped. A body is found
when its normalised statements appear, consecutively, in any statement block of any Python text in
the edition: ``.py`` files, notebook code cells and outputs, Markdown code blocks, JSON strings that
parse as Python, and the same inside the wheel. Bodies of fewer than :data:`MIN_NODES` normalised AST
nodes (``return a + b``) are listed, not searched: they would match everywhere.

Also searched: every compound statement (loop, ``if``, ``with``, ``try``) of a solution body of at
least :data:`MIN_FRAGMENT_NODES` nodes, anywhere, so that a solution's core pasted into a longer
function is found too. Reference modules also hold generic helpers (a type check, a product, an MLP
builder) that judging code may legitimately share, so their bodies and blocks are searched from
:data:`MIN_REFERENCE_NODES` and :data:`MIN_REFERENCE_FRAGMENT_NODES` nodes.
"""
from __future__ import annotations

import ast
import hashlib
import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

MIN_NODES = 12
MIN_FRAGMENT_NODES = 40
MIN_REFERENCE_NODES = 25
MIN_REFERENCE_FRAGMENT_NODES = 60
_BLOCKS = ("body", "orelse", "finalbody")


@dataclass(frozen=True)
class Body:
    origin: str  # "solutions/strides: view_strides" or "ptinternals/strides/meta.py: view_strides"
    key: str  # the normalised dump of the statement list
    length: int  # statements
    first: str  # shape of the first statement (names and strings blanked): a cheap pre-filter


@dataclass
class Finding:
    origin: str
    where: str
    kind: str  # "body" or "fragment"


@dataclass
class ScanReport:
    files: int = 0
    texts: int = 0
    bodies: int = 0
    fragments: int = 0
    too_small: list[str] = field(default_factory=list)
    public: list[str] = field(default_factory=list)  # corpus items found in public code, hence not searched
    findings: list[Finding] = field(default_factory=list)


_RENAMED_FIELD = {"Name": "id", "arg": "arg", "FunctionDef": "name", "AsyncFunctionDef": "name", "ClassDef": "name",
                  "ExceptHandler": "name", "alias": "asname"}
_DROPPED = {"arg": ("annotation", "type_comment"), "FunctionDef": ("returns", "type_comment"),
            "AsyncFunctionDef": ("returns", "type_comment"), "Assign": ("type_comment",),
            "For": ("type_comment",), "AsyncFor": ("type_comment",), "With": ("type_comment",),
            "AsyncWith": ("type_comment",)}


class _Key:
    """The normalised text of statements, read off the syntax tree without copying it: identifiers
    (variables, arguments, functions and classes defined inside, ``as`` names, ``global`` names) renamed
    by order of first appearance, string constants and f-strings blanked, annotations dropped.
    ``blank=True`` writes every identifier as ``_``; ``shallow=True`` writes a nested statement list as
    its length only (a cheap pre-filter: equal normalised texts always have equal shallow blank ones)."""

    def __init__(self, blank: bool = False, shallow: bool = False):
        self.names: dict[str, str] = {}
        self.blank, self.shallow = blank, shallow

    def _n(self, name: str) -> str:
        return "_" if self.blank else self.names.setdefault(name, f"v{len(self.names)}")

    def dump(self, node, out: list) -> None:
        kind = type(node).__name__
        if kind == "JoinedStr" or (kind == "Constant" and isinstance(node.value, str)):
            out.append("C''")
            return
        if kind == "Constant":
            out.append(f"C{node.value!r}")
            return
        out.append(kind + "(")
        renamed, dropped = _RENAMED_FIELD.get(kind), _DROPPED.get(kind, ())
        if renamed == "name":  # a definition's name is renamed before what it contains
            out.append((self._n(node.name) if node.name else "None") + ",")
        for name, value in ast.iter_fields(node):
            if name in dropped or (name == "name" and renamed == "name"):
                continue
            if name == renamed:
                out.append((self._n(value) if value else "None") + ",")
            elif kind in ("Global", "Nonlocal") and name == "names":
                out.append("[" + ",".join(self._n(n) for n in value) + "],")
            elif kind == "AnnAssign" and name == "annotation":
                out.append("CNone,")
            elif isinstance(value, list):
                if self.shallow and value and isinstance(value[0], ast.stmt):
                    out.append(f"#{len(value)},")
                    continue
                out.append("[")
                for item in value:
                    if isinstance(item, ast.AST):
                        self.dump(item, out)
                    else:
                        out.append(repr(item))
                    out.append(",")
                out.append("],")
            elif isinstance(value, ast.AST):
                self.dump(value, out)
                out.append(",")
            else:
                out.append(f"{value!r},")
        out.append(")")


def _strip_docstring(stmts: list[ast.stmt]) -> list[ast.stmt]:
    if stmts and isinstance(stmts[0], ast.Expr) and isinstance(getattr(stmts[0], "value", None), ast.Constant) \
            and isinstance(stmts[0].value.value, str):
        return stmts[1:]
    return stmts


def _dump(stmts: list[ast.stmt], key: _Key) -> str:
    out: list[str] = []
    for s in stmts:
        key.dump(s, out)
        out.append(";")
    return "".join(out)


def normalise(stmts: list[ast.stmt]) -> str:
    return _dump(_strip_docstring(list(stmts)), _Key())


def size(stmts: list[ast.stmt]) -> int:
    """AST nodes of the statements, as normalised (an f-string counts as one string, annotations none)."""
    def count(node) -> int:
        if isinstance(node, ast.JoinedStr):
            return 1
        kind, n = type(node).__name__, 1
        for name, value in ast.iter_fields(node):
            if name in _DROPPED.get(kind, ()):
                continue
            if kind == "AnnAssign" and name == "annotation":
                n += 1  # written as a constant
                continue
            n += sum(count(item) for item in (value if isinstance(value, list) else [value]) if isinstance(item, ast.AST))
        return n

    return sum(count(s) for s in _strip_docstring(list(stmts)))


def shape(stmt: ast.stmt) -> str:
    return _dump([stmt], _Key(blank=True, shallow=True))


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def bodies_of(source: str, origin: str, report: ScanReport | None = None, *, min_nodes: int = MIN_NODES,
              min_fragment_nodes: int = MIN_FRAGMENT_NODES) -> tuple[list[Body], list[Body]]:
    """The searchable solution bodies and fragments of the functions defined in ``source``."""
    tree = ast.parse(source)
    bodies, fragments = [], []
    for fn in _functions(tree):
        stmts = _strip_docstring(fn.body)
        if not stmts:
            continue
        where = f"{origin}: {fn.name}"
        if size(stmts) < min_nodes:
            if report is not None:
                report.too_small.append(where)
            continue
        bodies.append(Body(where, normalise(stmts), len(stmts), shape(stmts[0])))
        for node in stmts:
            for sub in ast.walk(node):
                if isinstance(sub, (ast.For, ast.While, ast.If, ast.With, ast.Try)) and size([sub]) >= min_fragment_nodes:
                    fragments.append(Body(f"{where} (a {type(sub).__name__.lower()} block)", normalise([sub]), 1,
                                          shape(sub)))
    return bodies, fragments


def solution_corpus(root: Path, chapters, withheld_files: list[Path], report: ScanReport,
                    public: list[tuple[str, str]] = ()) -> tuple[list[Body], list[Body]]:
    """Bodies of every answer cell of every chapter's solution notebook, and of every withheld reference file,
    minus those found in ``public`` ((label, Python text) pairs: code students have by design)."""
    bodies, fragments = [], []
    for slug in chapters:
        nb = nbformat.read(root / "solutions" / slug / f"{slug}.ipynb", as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
                b, f = bodies_of(_python(cell.source), f"solutions/{slug} answer cell "
                                 f"{cell.metadata['nbgrader'].get('grade_id')}", report)
                bodies += b
                fragments += f
    for path in withheld_files:
        b, f = bodies_of(path.read_text(), str(path.relative_to(root)) if path.is_relative_to(root) else str(path),
                         min_nodes=MIN_REFERENCE_NODES, min_fragment_nodes=MIN_REFERENCE_FRAGMENT_NODES)
        bodies += b
        fragments += f
    found = {f.origin for f in scan_texts(public, bodies, fragments, ScanReport())}
    report.public = sorted(found)
    return [b for b in bodies if b.origin not in found], [f for f in fragments if f.origin not in found]


def public_texts(root: Path, chapters, sandbox_files: list[Path]) -> list[tuple[str, str]]:
    """Code students have by design: the repository's student notebooks (what answer cells give) and what
    the grading sandbox ships to student code (its runtime, the probes, each chapter's scaffolds)."""
    texts = []
    for slug in chapters:
        path = root / "notebooks" / slug / f"{slug}.ipynb"
        texts += list(_texts_of_file(str(path.relative_to(root)), path.read_bytes()))
        texts += _printed_definitions(root, slug, path)
    for path in sandbox_files:
        texts.append((str(path), path.read_text()))
    return texts


def _printed_definitions(root: Path, slug: str, notebook: Path) -> list[tuple[str, str]]:
    """The definitions a student notebook prints with ``inspect.getsource(name)`` (the code an exercise
    starts from, e.g. profiling's training loop with hidden syncs): shown on purpose, so public."""
    nb = nbformat.read(notebook, as_version=4)
    names = {n for c in nb.cells if c.cell_type == "code" for n in re.findall(r"getsource\((\w+)\)", c.source)}
    out = []
    for path in sorted((root / "src" / "ptinternals" / slug).rglob("*.py")) if names else ():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in names:
                out.append((f"{path.relative_to(root)}: {node.name} (printed by the notebook)", ast.unparse(node)))
    return out


def _python(source: str) -> str:
    return "\n".join(("# " + line) if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


# ---- where Python may hide in the edition -------------------------------------------------------------
_FENCE = re.compile(r"```(?:python|py|ipython3?)?\n(.*?)```", re.S)


def _texts_of_file(name: str, data: bytes):
    """(label, Python source) pairs found in one file of the edition."""
    if name.endswith(".py"):
        yield name, data.decode(errors="replace")
    elif name.endswith(".ipynb"):
        nb = nbformat.reads(data.decode(), as_version=4)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                yield f"{name} cell {i}", _python(cell.source)
                for out in cell.get("outputs", []):
                    text = out.get("text") or out.get("data", {}).get("text/plain") or ""
                    yield f"{name} cell {i} output", "".join(text) if isinstance(text, list) else text
            else:
                for block in _FENCE.findall(cell.source):
                    yield f"{name} cell {i} (markdown)", block
    elif name.endswith(".md"):
        for block in _FENCE.findall(data.decode(errors="replace")):
            yield f"{name} (code block)", block
    elif name.endswith(".json"):
        try:
            tree = json.loads(data)
        except ValueError:
            return
        for s in _strings(tree):
            if s.count("\n") >= 2:
                yield f"{name} (a string)", s
    elif name.endswith((".whl", ".zip")):
        import io

        with zipfile.ZipFile(io.BytesIO(data)) as z:
            for member in z.namelist():
                yield from ((f"{name}!{label}", text) for label, text in _texts_of_file(member, z.read(member)))


def _strings(tree):
    if isinstance(tree, str):
        yield tree
    elif isinstance(tree, list):
        for v in tree:
            yield from _strings(v)
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from _strings(v)


def _blocks(tree: ast.AST):
    for node in ast.walk(tree):
        for name in _BLOCKS:
            stmts = getattr(node, name, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                yield stmts
        for handler in getattr(node, "handlers", []) or []:
            yield handler.body


def scan(edition: Path, bodies: list[Body], fragments: list[Body], report: ScanReport) -> ScanReport:
    """Search every file under ``edition`` for ``bodies`` (consecutive statements) and ``fragments``."""
    report.bodies, report.fragments = len(bodies), len(fragments)

    def texts():
        for path in sorted(p for p in edition.rglob("*") if p.is_file() and ".git" not in p.parts):
            report.files += 1
            yield from _texts_of_file(str(path.relative_to(edition)), path.read_bytes())

    report.findings += scan_texts(texts(), bodies, fragments, report)
    return report


def scan_texts(texts, bodies: list[Body], fragments: list[Body], report: ScanReport) -> list[Finding]:
    """Search (label, Python text) pairs for ``bodies`` (consecutive statements) and ``fragments``."""
    findings = []
    by_first: dict[str, list[Body]] = {}
    for b in bodies:
        by_first.setdefault(b.first, []).append(b)
    frag_by_shape: dict[str, list[Body]] = {}
    for f in fragments:
        frag_by_shape.setdefault(f.first, []).append(f)
    seen: dict[str, list[tuple[str, int, str]]] = {}  # a text met again (the wheel repeats src/): its findings
    for label, text in texts:
        digest = hashlib.sha256(text.encode(errors="replace")).hexdigest()
        if digest in seen:
            report.texts += 1
            findings += [Finding(origin, f"{label}, line {line}", kind) for origin, line, kind in seen[digest]]
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            seen[digest] = []
            continue
        report.texts += 1
        found = seen[digest] = []
        for stmts in _blocks(tree):
            shapes = [shape(s) for s in stmts]
            for i, sh in enumerate(shapes):
                for b in by_first.get(sh, ()):
                    if i + b.length <= len(stmts) and normalise(stmts[i:i + b.length]) == b.key:
                        found.append((b.origin, stmts[i].lineno, "body"))
                for f in frag_by_shape.get(sh, ()):
                    if normalise([stmts[i]]) == f.key:
                        found.append((f.origin, stmts[i].lineno, "fragment"))
        findings += [Finding(origin, f"{label}, line {line}", kind) for origin, line, kind in found]
    return findings
