"""What an answer's code may not do, checked on its source in the trusted process.

A :class:`SourcePolicy` is checked on the code an answer *reaches*: the entry point's function and every
function, class, import or assignment of its cell (or module) that it refers to, transitively. Some rules
cannot be checked by running the answer in the sandbox, because the answer runs in the same process as the
measurement and could switch it off (a TorchDispatchMode can be popped, a counter patched): the source is
the floor such tricks cannot move.

Until the grading core has a trusted hook for answer cells, the cell's text is reported by the sandbox
(``probes.profiling.entry_source``) and checked here, in the trusted process; the rules themselves are
pure functions of the source and move to that hook unchanged. Used by the profiling chapter.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass


@dataclass(frozen=True)
class SourcePolicy:
    """Checked on the code an answer *reaches*: the entry point's function and every function, class,
    import or assignment of its cell (or module) that it refers to, transitively.

    ``names``: identifiers, attributes or module names that code may not use. ``in_loops``: method or
    function calls that may not appear inside a ``for``/``while`` body. ``mask_index_in_loops``: no
    ``x[cond]`` with a comparison (or a name assigned from one in the loop) as the index, inside a loop.
    ``tensor_tests_in_loops``: no ``if``/``while``/``assert`` inside a loop whose condition calls torch.

    The source comes from the sandbox (``probes.profiling.entry_source``) until grading gains a trusted
    hook for answer cells; then ``problems`` is called with the cell the trusted grader holds.
    """

    names: tuple[str, ...] = ()
    in_loops: tuple[str, ...] = ()
    mask_index_in_loops: bool = False
    tensor_tests_in_loops: bool = False
    why: str = ""

    def problems(self, source: dict) -> list[str]:
        text = source.get("text", "") if isinstance(source, dict) else ""
        if not text:
            return ["the grader could not read the source of your answer: define it with `def` in its answer cell"]
        try:
            tree = ast.parse(text)
        except SyntaxError as e:
            return [f"the source of your answer does not parse: {e}"]
        out = []
        for node in reachable(tree, source.get("name", ""), source.get("line", 0)):
            out += self._names(node) + self._loops(node)
        return sorted(set(out), key=lambda s: (int(s.split(":")[0].split()[-1]) if s.startswith("line ") else 0, s))

    def _names(self, node) -> list[str]:
        out = []
        for sub in ast.walk(node):
            used = []
            if isinstance(sub, ast.Name):
                used = [sub.id]
            elif isinstance(sub, ast.Attribute):
                used = [sub.attr]
            elif isinstance(sub, ast.Import):
                used = [part for a in sub.names for part in a.name.split(".")]
            elif isinstance(sub, ast.ImportFrom):
                used = (sub.module or "").split(".") + [a.name for a in sub.names]
            for name in used:
                if name in self.names:
                    out.append(f"line {sub.lineno}: uses `{name}` ({self.why})")
        return out

    def _loops(self, node) -> list[str]:
        if not (self.in_loops or self.mask_index_in_loops or self.tensor_tests_in_loops):
            return []
        out = []
        for loop in (n for n in ast.walk(node) if isinstance(n, (ast.For, ast.While, ast.AsyncFor))):
            body = [s for s in loop.body + loop.orelse]
            masks = {t.id for s in body for a in ast.walk(s) if isinstance(a, ast.Assign) and _is_condition(a.value)
                     for t in a.targets if isinstance(t, ast.Name)}
            for stmt in body:
                for sub in ast.walk(stmt):
                    if isinstance(sub, ast.Call):
                        f = sub.func
                        called = f.attr if isinstance(f, ast.Attribute) else (f.id if isinstance(f, ast.Name) else "")
                        if called in self.in_loops:
                            out.append(f"line {sub.lineno}: `{called}(...)` inside the loop of line {loop.lineno} "
                                       f"({self.why})")
                    if self.mask_index_in_loops and isinstance(sub, ast.Subscript):
                        index = sub.slice.elts if isinstance(sub.slice, ast.Tuple) else [sub.slice]
                        if any(_is_condition(i) or (isinstance(i, ast.Name) and i.id in masks) for i in index):
                            out.append(f"line {sub.lineno}: indexing with a boolean mask inside the loop of line "
                                       f"{loop.lineno} (it becomes nonzero(): the host reads the count)")
                    if self.tensor_tests_in_loops and isinstance(sub, (ast.If, ast.While, ast.Assert, ast.IfExp)):
                        if _calls_torch(sub.test):
                            out.append(f"line {sub.lineno}: a tensor decides a condition inside the loop of line "
                                       f"{loop.lineno} (bool() of a device tensor reads it on the host)")
        return out


def _is_condition(node) -> bool:
    return isinstance(node, (ast.Compare, ast.BoolOp)) or (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not))


def _calls_torch(node) -> bool:
    """Whether an expression calls torch (``torch.isnan(x)``) or a tensor-looking method (``x.isnan()``)."""
    methods = {"any", "all", "isnan", "isfinite", "isinf", "item", "sum", "max", "min", "mean", "eq", "ne", "ge",
               "gt", "le", "lt", "equal", "allclose"}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            root = sub.func
            while isinstance(root, ast.Attribute):
                root = root.value
            if (isinstance(root, ast.Name) and root.id in ("torch", "F")) or sub.func.attr in methods:
                return True
    return False


def reachable(tree: ast.Module, name: str, line: int) -> list[ast.AST]:
    """The entry's function node and the top-level definitions it refers to, transitively (in a cell:
    its helpers and the imports they use)."""
    entry = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.name == name and (n.lineno == line or any(d.lineno == line for d in n.decorator_list))), None)
    entry = entry or next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                           and n.name == name), None)
    if entry is None:
        return [tree]  # not found: check the whole source
    bound: dict[str, list[ast.AST]] = {}
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.setdefault(stmt.name, []).append(stmt)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            for a in stmt.names:
                bound.setdefault((a.asname or a.name).split(".")[0], []).append(stmt)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        bound.setdefault(n.id, []).append(stmt)
    seen: dict[int, ast.AST] = {id(entry): entry}
    todo = [entry]
    while todo:
        node = todo.pop()
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                for target in bound.get(sub.id, ()):
                    if id(target) not in seen:
                        seen[id(target)] = target
                        todo.append(target)
    return list(seen.values())


def policy_message(policy: SourcePolicy, source) -> str | None:
    problems = policy.problems(source)
    if not problems:
        return None
    return "your answer's code does what this exercise rules out:\n  " + "\n  ".join(problems[:5])
