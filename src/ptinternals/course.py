"""The course's chapters, in book order: the one place a chapter's number comes from.

A chapter is one slug, and the same word names every part of it: its reference package
(``ptinternals/<slug>/``), its checks (``ptinternals/checks/<slug>.py``) and sandbox probes
(``ptinternals/checks/probes/<slug>.py``), its notebook source (``solutions/<slug>.py``) and nbgrader
assignment (``<slug>``), its quiz bank, its figures (``ptinternals/viz/<slug>.py``) and its tests
(``tests/<slug>/``). Exercise ids are ``<slug>.<name>``. No id, file or assignment carries a number:
inserting a chapter is one edit of :data:`CHAPTERS` (then ``make notebooks`` renumbers what the book
shows and rewrites the table of contents).

This module imports nothing: the grading sandbox and the student edition ship it.
"""
from __future__ import annotations

# (slug, title) in book order. The capstone stays last.
CHAPTERS: tuple[tuple[str, str], ...] = (
    ("strides", "Storage, strides and views"),
    ("autograd", "Autograd and custom Functions"),
    ("modules", "Modules: what `model(x)` really does"),
    ("dispatch", "The dispatcher, `__torch_dispatch__` and `torch.library`"),
    ("allocator", "The CUDA caching allocator"),
    ("profiling", "Profiling and the host-device boundary"),
    ("amp", "Mixed precision (AMP)"),
    ("distributed", "Data parallelism: DDP and FSDP"),
    ("kernels", "Triton kernels"),
    ("compile", "`torch.compile` from the inside"),
    ("gpt", "The capstone: a mini-GPT from your own parts"),
)

SLUGS: tuple[str, ...] = tuple(slug for slug, _ in CHAPTERS)

# Names used before chapters were addressed by slug (assignments, id prefixes, quiz banks): kept so that
# an old name gets an error that says what it is called now. See book/instructors.md, "Names".
RENAMED: dict[str, str] = {
    "ch01": "strides", "ch01_strides": "strides",
    "ch02": "autograd", "ch02_autograd": "autograd",
    "ch03": "dispatch", "ch03_dispatch": "dispatch",
    "ch04": "allocator", "ch04_allocator": "allocator",
    "ch05": "amp", "ch05_amp": "amp",
    "ch06": "distributed", "ch06_distributed": "distributed",
    "ch07": "kernels", "ch07_kernels": "kernels",
    "ch08": "gpt", "ch08_gpt": "gpt",
}


class UnknownChapter(KeyError):
    """A name that is not a chapter slug. The message says what it is called now, or lists the slugs."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0])


def slug_of(name: str) -> str:
    """The chapter slug of ``name``: a slug, an exercise id ``<slug>.<name>``, or a notebook file name."""
    if not isinstance(name, str):
        raise TypeError(f"a chapter name must be a str, got {type(name).__name__}")
    base = name.split(".", 1)[0]
    if base in SLUGS:
        return base
    old = RENAMED.get(base) or RENAMED.get(base.split("_", 1)[0])
    if old:
        raise UnknownChapter(f"{name!r} is an old name: chapter ids no longer carry numbers; it is now {old!r} "
                             f"(e.g. exercise ids '{old}.<name>', assignment '{old}')")
    raise UnknownChapter(f"unknown chapter {name!r}; the chapters are: {', '.join(SLUGS)}")


def number(slug: str) -> int:
    """The chapter's number in the book (1-based), derived from its position in :data:`CHAPTERS`."""
    return SLUGS.index(slug_of(slug)) + 1


def title(slug: str) -> str:
    return dict(CHAPTERS)[slug_of(slug)]


def chapter_link(slug: str, *, capital: bool = False, here: str | None = None) -> str:
    """ "chapter N" as a Markdown link to that chapter's notebook (plain text for the chapter ``here``)."""
    text = f"{'Chapter' if capital else 'chapter'} {number(slug)}"
    return text if slug == here else f"[{text}](../{slug}/{slug}.ipynb)"
