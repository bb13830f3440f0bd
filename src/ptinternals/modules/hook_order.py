"""Predicting the order of module hook calls, forward and backward, without running anything.

The reference solution of the chapter's prediction exercise, and a compact statement of what
``_call_impl`` (torch/nn/modules/module.py) and ``BackwardHook`` (torch/utils/hooks.py) imply for a
chain of modules. A *chain tree* is plain data::

    {"name": "net", "param": "trainable" | "frozen" | None, "children": [tree, ...]}
    {"same_as": "block"}            # a child that is the module already named "block" (called again)

Each module, called on ``x``, multiplies ``x`` by its own parameter (if any), then calls its children
one after another, each on the previous one's output. Module names are dotted paths from the root
(``""`` for the root; a shared module keeps the path where it was first defined).

Forward, per call: ``("pre", path)``, the children's events, ``("fwd", path)``.

Backward (of ``output.sum()``, only if the root's output requires grad): calls are visited in the
reverse of their forward order. A call whose *output* does not require grad has no backward hooks
at all (no gradient reaches it). Otherwise ``("bwd-pre", path)`` fires when the gradient of its
output arrives; ``("bwd", path)`` fires when the gradient of its *input* is ready, i.e. after all its
children's backward events; but if its input does not require grad there is no input gradient to
wait for, and ``("bwd", path)`` fires right after its ``("bwd-pre", path)``. An output requires grad
when the input did or some trainable parameter was used on the way.
"""
from __future__ import annotations

__all__ = ["predict_hook_order", "chain_tree_to_spec", "validate_chain_tree"]


def validate_chain_tree(tree) -> None:
    """Raise ValueError/TypeError naming the first bad node (``tree['children'][1]...``)."""
    defined: set = set()

    def check(node, where: str, path: str | None, ancestors: frozenset) -> None:
        if not isinstance(node, dict):
            raise TypeError(f"{where} must be a dict, got {type(node).__name__}")
        if "same_as" in node:
            target = node["same_as"]
            if set(node) != {"same_as"} or target not in defined or target in ancestors:
                raise ValueError(f"{where}['same_as'] must name a module defined earlier that is not an ancestor, "
                                 f"got {node!r:.80}")
            return
        name = node.get("name")
        if not isinstance(name, str) or "." in name or (path is not None and name == ""):
            raise ValueError(f"{where}['name'] must be a non-empty str without '.', got {name!r}")
        if node.get("param") not in ("trainable", "frozen", None):
            raise ValueError(f"{where}['param'] must be 'trainable', 'frozen' or None, got {node.get('param')!r}")
        children = node.get("children", [])
        if not isinstance(children, list):
            raise TypeError(f"{where}['children'] must be a list, got {type(children).__name__}")
        own = "" if path is None else path
        defined.add(own)
        seen = set()
        for k, child in enumerate(children):
            if isinstance(child, dict) and "same_as" not in child:
                if child.get("name") in seen:
                    raise ValueError(f"{where}['children'][{k}]['name'] repeats {child.get('name')!r}")
                seen.add(child.get("name"))
                child_path = (own + "." if own else "") + str(child.get("name"))
            else:
                child_path = None
            check(child, f"{where}['children'][{k}]", child_path if child_path is not None else own,
                  ancestors | {own})

    check(tree, "tree", None, frozenset())


def _index(tree) -> dict:
    """``{path: node}`` for every defined module (the root is ``""``)."""
    table: dict = {}

    def walk(node, path):
        table[path] = node
        for child in node.get("children", []):
            if "same_as" not in child:
                walk(child, (path + "." if path else "") + child["name"])

    walk(tree, "")
    return table


def predict_hook_order(tree: dict, input_requires_grad: bool) -> list[tuple[str, str]]:
    """The hook events of ``root(x)`` then ``root(x).sum().backward()``, as ``(kind, path)`` pairs."""
    if not isinstance(input_requires_grad, bool):
        raise TypeError(f"input_requires_grad must be a bool, got {input_requires_grad!r}")
    validate_chain_tree(tree)
    table = _index(tree)
    aliases = {}  # a same_as child resolves to the first path of that module

    forward: list = []
    calls: list = []  # (path, input requires grad, output requires grad, [child calls]) in call order

    def call(path: str, in_req: bool):
        node = table[path]
        forward.append(("pre", path))
        req = in_req or node.get("param") == "trainable"
        children = []
        for child in node.get("children", []):
            child_path = child["same_as"] if "same_as" in child else (path + "." if path else "") + child["name"]
            child_path = aliases.get(child_path, child_path)
            sub = call(child_path, req)
            children.append(sub)
            req = sub[2]
        forward.append(("fwd", path))
        record = (path, in_req, req, children)
        calls.append(record)
        return record

    root = call("", input_requires_grad)
    backward: list = []

    def back(record):
        path, in_req, out_req, children = record
        if not out_req:
            return  # no gradient reaches this call: neither hook fires
        backward.append(("bwd-pre", path))
        if not in_req:
            backward.append(("bwd", path))
        for child in reversed(children):
            back(child)
        if in_req:
            backward.append(("bwd", path))

    back(root)
    return forward + backward


def chain_tree_to_spec(tree: dict, dim: int = 2) -> dict:
    """The same model as a ``build_tree`` spec (one ``(dim,)`` parameter per module that has one)."""
    validate_chain_tree(tree)
    table = _index(tree)
    paths = list(table)
    params, nodes = [], []
    for path in paths:
        node = table[path]
        entry = {"cls": "Chain", "params": [], "buffers": [], "children": []}
        if node.get("param") is not None:
            entry["params"].append(["p", len(params)])
            params.append({"shape": [dim], "requires_grad": node["param"] == "trainable"})
        for child in node.get("children", []):
            if "same_as" in child:
                name = f"again{len(entry['children'])}"
                target = child["same_as"]
            else:
                name = child["name"]
                target = (path + "." if path else "") + child["name"]
            entry["children"].append([name, paths.index(target)])
        nodes.append(entry)
    return {"dim": dim, "params": params, "buffers": [], "nodes": nodes}
