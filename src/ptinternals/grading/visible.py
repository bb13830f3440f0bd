"""Visible cases as data: what the student edition's checks run on instead of the code that draws cases.

In the repository an :class:`~.exercise.Exercise` draws its cases and computes each expected answer
(from real torch where torch has it, otherwise from the reference). The student edition has neither
the reference nor the hidden cases, so at build time :func:`export_chapter` records each exercise's
*visible* cases and their expected answers as **values**: a JSON tree plus named arrays (``.npz``,
loaded with ``allow_pickle=False``), never pickle and never code. The edition's checks module calls
:func:`install`, which puts them where ``check()`` looks for cases (``Exercise.cases_and_expected``),
so a visible check in the edition judges exactly as it does in the repository, with the same
``compare`` and ``diagnose``.

Values are encoded as the grading sandbox encodes them (``_runtime.encode``: tensors keep their
strides, storage offset, dtype and ``requires_grad``), plus tuples, lists, sets, dicts, ``Counter`` and
``OrderedDict``, and dataclass instances (``Case`` and its
subclasses, ``Raises``, a chapter's small records), rebuilt only from ``ptinternals`` dataclasses.
"""
from __future__ import annotations

import collections
import dataclasses
import importlib
import io
import json
from pathlib import Path

from . import _runtime

FORMAT = 1
# Mappings recorded with their type (a Counter compares like a dict but answers missing keys with 0).
_MAPPINGS = {cls.__name__: cls for cls in (dict, collections.Counter, collections.OrderedDict)}


def encode_value(obj, arrays: dict):
    """``obj`` as a JSON-able tree; tensors and arrays go into ``arrays``. Dataclasses by field."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        if not cls.__module__.startswith("ptinternals."):
            raise TypeError(f"cannot record a {cls.__module__}.{cls.__qualname__}: only ptinternals dataclasses")
        fields = {f.name: encode_value(getattr(obj, f.name), arrays) for f in dataclasses.fields(obj) if f.init}
        return {"__dataclass__": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}
    if type(obj) is tuple:
        return {"__tuple__": [encode_value(x, arrays) for x in obj]}
    if type(obj) is list:
        return [encode_value(x, arrays) for x in obj]
    if type(obj) in _MAPPINGS.values():
        items = [[encode_value(k, arrays), encode_value(v, arrays)] for k, v in obj.items()]
        return {"__dict__": items} if type(obj) is dict else {"__dict__": items, "type": type(obj).__name__}
    if type(obj) in (set, frozenset):
        return {"__set__": [encode_value(x, arrays) for x in sorted(obj, key=repr)], "type": type(obj).__name__}
    tree = _runtime.encode(obj, arrays)
    if isinstance(tree, dict) and "__unsupported__" in tree:
        raise TypeError(f"cannot record {type(obj).__module__}.{type(obj).__qualname__} as data: {tree['text']}")
    return tree


def decode_value(tree, arrays: dict):
    """Inverse of :func:`encode_value`. Tensors come back as torch tensors with their exact layout."""
    if isinstance(tree, list):
        return [decode_value(x, arrays) for x in tree]
    if not isinstance(tree, dict):
        return tree
    if "__dataclass__" in tree:
        module, _, qualname = tree["__dataclass__"].partition(":")
        if not module.startswith("ptinternals."):
            raise ValueError(f"refusing to rebuild {tree['__dataclass__']}: not a ptinternals dataclass")
        cls = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise ValueError(f"refusing to rebuild {tree['__dataclass__']}: not a dataclass")
        return cls(**{k: decode_value(v, arrays) for k, v in tree["fields"].items()})
    if "__tuple__" in tree:
        return tuple(decode_value(x, arrays) for x in tree["__tuple__"])
    if "__dict__" in tree:
        cls = _MAPPINGS[tree.get("type", "dict")]
        return cls({decode_value(k, arrays): decode_value(v, arrays) for k, v in tree["__dict__"]})
    if "__set__" in tree:
        return {"set": set, "frozenset": frozenset}[tree["type"]](decode_value(x, arrays) for x in tree["__set__"])
    return _runtime.decode(tree, arrays, to_torch=True)


def export_chapter(chapter) -> tuple[dict, dict]:
    """``({"format", "chapter", "exercises": {id: {"cases", "expected"}}}, arrays)`` for ``chapter``'s
    visible cases: the data the student edition checks with (computed here, from the repository)."""
    arrays: dict = {}
    out = {"format": FORMAT, "chapter": chapter.slug, "exercises": {}}
    for ex in chapter.exercises:
        cases, expected = ex.cases_and_expected(hidden=False)
        try:
            out["exercises"][ex.id] = {"cases": encode_value(list(cases), arrays),
                                       "expected": encode_value(list(expected), arrays)}
        except TypeError as e:
            raise TypeError(f"{ex.id}: {e}") from None
    return out, arrays


def data_paths(folder: Path, slug: str) -> tuple[Path, Path]:
    return folder / f"{slug}.visible.json", folder / f"{slug}.visible.npz"


def write_chapter(chapter, folder: Path) -> list[Path]:
    """Write ``<slug>.visible.json`` and ``<slug>.visible.npz`` into ``folder``."""
    import numpy as np

    data, arrays = export_chapter(chapter)
    js, npz = data_paths(Path(folder), chapter.slug)
    js.write_text(json.dumps(data, indent=None, separators=(",", ":")) + "\n")
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    npz.write_bytes(buf.getvalue())
    return [js, npz]


def install(chapter, folder: Path) -> None:
    """Give each exercise of ``chapter`` its recorded visible cases; its hidden cases do not exist here."""
    import numpy as np

    js, npz = data_paths(Path(folder), chapter.slug)
    data = json.loads(js.read_text())
    if data.get("format") != FORMAT or data.get("chapter") != chapter.slug:
        raise ValueError(f"{js}: not the visible cases of {chapter.slug} (format {data.get('format')})")
    with np.load(npz, allow_pickle=False) as z:
        arrays = {name: z[name] for name in z.files}
    for ex in chapter.exercises:
        recorded = data["exercises"][ex.id]
        cases, expected = decode_value(recorded["cases"], arrays), decode_value(recorded["expected"], arrays)
        ex.__dict__.setdefault("_cases_memo", {})["visible"] = (cases, expected)  # where cases_and_expected looks
        ex.hidden_cases = _no_hidden_cases(ex)


def _no_hidden_cases(ex):
    def hidden_cases():
        raise RuntimeError(f"{ex.id}: the hidden cases are not part of the student edition; the grader runs "
                           f"them when your notebook is graded")

    return hidden_cases


__all__ = ["decode_value", "encode_value", "export_chapter", "install", "write_chapter"]
