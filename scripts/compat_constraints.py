#!/usr/bin/env python3
"""Derive constraints-gpu.txt (the GPU machine's toolchain) from constraints.txt.

constraints.txt pins the environment CI and laptops build (torch 2.13 CPU wheel, triton 3.7). The GPU
machine runs torch 2.11 + triton 3.6; `make compat` builds a second venv with those versions and the
course's other pins, so a version difference shows up in CI instead of on scarce GPU time. This script
rewrites ONLY the packages in GPU_MACHINE and copies every other pin unchanged, so the two files cannot
drift (tests/test_compat_constraints.py fails when they do).

    python3 scripts/compat_constraints.py           # (re)write constraints-gpu.txt
    python3 scripts/compat_constraints.py --check   # exit 1 when constraints-gpu.txt is stale

Standard library only: it runs before any venv exists.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "constraints.txt"
TARGET = ROOT / "constraints-gpu.txt"

# The versions on the GPU machine's image (autograder/gpu_check.sh's doctor step prints them there).
# numpy stays as constraints.txt pins it: triton 3.6's interpreter needs numpy < 2.4 (a test checks).
GPU_MACHINE = {"torch": "2.11.0", "triton": "3.6.0"}

HEADER = """\
# GENERATED from constraints.txt by scripts/compat_constraints.py: do not edit (make compat rewrites it).
# The GPU machine's toolchain: every pin of constraints.txt, except {changes}.
# PyPI's torch {torch} is a CUDA build (it pulls the nvidia-* runtime wheels, pinned by torch itself);
# it runs on a CPU machine, which is what `make compat` builds (.venv-compat) to run the CPU suite.
"""


def canonical(name: str) -> str:
    """PEP 503 name: ``Jinja2`` and ``jinja2``, ``typing_extensions`` and ``typing-extensions`` match."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pins(text: str) -> dict[str, str]:
    """``{canonical name: version}`` for every ``name==version`` line (comments ignored)."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep:
            raise ValueError(f"constraints line {line!r} is not name==version")
        pins[canonical(name.strip())] = version.strip()
    return pins


def derive(source_text: str, overrides: dict[str, str] = GPU_MACHINE) -> str:
    """constraints.txt's pins with ``overrides`` rewritten; every other pin copied as written."""
    pins = parse_pins(source_text)
    missing = [name for name in overrides if canonical(name) not in pins]
    if missing:
        raise ValueError(f"constraints.txt pins no {', '.join(missing)}: nothing to rewrite")
    wanted = {canonical(name): version for name, version in overrides.items()}
    changes = ", ".join(f"{name} {pins[canonical(name)]} -> {version}" for name, version in overrides.items())
    out = [HEADER.format(changes=changes, torch=overrides.get("torch", "?")).rstrip("\n")]
    for line in source_text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # constraints.txt's own comments describe the CPU environment
        name = stripped.partition("==")[0].strip()
        key = canonical(name)
        out.append(f"{name}=={wanted[key]}" if key in wanted else stripped)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if constraints-gpu.txt is not up to date")
    args = parser.parse_args(argv)
    want = derive(SOURCE.read_text())
    if args.check:
        if not TARGET.exists() or TARGET.read_text() != want:
            print(f"{TARGET.name} is stale: run python3 scripts/compat_constraints.py", file=sys.stderr)
            return 1
        return 0
    if not TARGET.exists() or TARGET.read_text() != want:
        TARGET.write_text(want)
        print(f"wrote {TARGET.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
