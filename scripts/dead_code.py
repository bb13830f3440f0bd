"""Dead code: what vulture finds unused across the course, minus what is used by name.

vulture reads the package, the notebook sources (``solutions/*.py``: demonstrations call the reference),
the tests, benchmarks and scripts together. Two kinds of use it cannot see are allowed here:

- names given as strings: an exercise's probe ``"ptinternals.checks.probes.amp:speed_probe"``, a
  ``getattr`` by name; a name quoted anywhere in the sources counts as used;
- protocol methods a framework calls (nbgrader's ``preprocess``, pytest's hooks, torch.library's ``_``
  registrations) and API parity with torch (``GradScaler.get_growth_factor``), listed in ``CALLED_BY_NAME``.

Usage: python scripts/dead_code.py   (exit 1 and a list when something is unused; `make lint` runs it)
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["src", "bench", "scripts", "tests", "autograder/nbgrader_config.py", *sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "solutions").glob("*.py"))]
CALLED_BY_NAME = {
    "_",  # @torch.library.register_fake / register_kernel functions
    "__getattr__",  # lazy module attributes
    "preprocess", "preprocess_cell",  # nbgrader preprocessors
    "log_message",  # http.server handlers
    "extra_repr",  # nn.Module printing
    "pytest_collection_modifyitems",
    "get_growth_factor", "get_backoff_factor", "get_growth_interval",  # torch.amp.GradScaler's API
    "backend_mask",  # c10::DispatchKeySet's API, mirrored
    "retains_grad",  # torch.Tensor's API, mirrored by the autograd chapter's Variable
    "round_to_format",  # the amp formats' public API (used in the book's prose)
    "mutate",  # cosmic-ray Operator.mutate (grading/mutation.py's extra operator)
    "load_ipython_extension",  # IPython's %load_ext (ptinternals.recorded, in the student edition)
    "visit_AnnAssign", "visit_JoinedStr",  # ast.NodeTransformer visitors (the student edition's scan)
}
LINE = re.compile(r"^(?P<where>[^:]+:\d+): unused (?P<kind>function|method|class|import|property) '(?P<name>[^']+)'")


def main() -> int:
    proc = subprocess.run([sys.executable, "-m", "vulture", *PATHS, "--min-confidence", "60"], cwd=ROOT,
                          capture_output=True, text=True)
    if proc.returncode not in (0, 3):  # 3: vulture found dead code
        print(proc.stdout + proc.stderr)
        return 2
    texts = {str(p.relative_to(ROOT)): p.read_text(errors="replace") for path in PATHS
             for p in ([ROOT / path] if (ROOT / path).is_file() else (ROOT / path).rglob("*.py"))}
    corpus = "\n".join(texts.values())
    dead = []
    for line in proc.stdout.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        name, where = m.group("name"), m.group("where").split(":")[0]
        elsewhere = any(re.search(rf"\b{re.escape(name)}\b", text) for f, text in texts.items() if f != where)
        fixture = re.search(rf"@pytest\.fixture[^\n]*\n(?:@[^\n]*\n)*def {re.escape(name)}\(", texts.get(where, ""))
        if (name in CALLED_BY_NAME or name.startswith("test_") or elsewhere or fixture
                or re.search(rf"[\"':]{re.escape(name)}[\"'\s,)]", corpus)):
            continue
        dead.append(line)
    if dead:
        print("unused code (remove it, or say in scripts/dead_code.py why it is called by name):")
        print("\n".join("  " + d for d in dead))
        return 1
    print("no dead code")
    return 0


if __name__ == "__main__":
    sys.exit(main())
