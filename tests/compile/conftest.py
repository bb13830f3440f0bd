"""The compile chapter's tests compile with Inductor into a cache folder of this worktree's own (under
/tmp, keyed by the checkout's path), so repeated runs reuse compiled kernels and never share a cache
with another checkout. Dynamo's in-process caches are reset around every test module."""
import hashlib
import os
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_KEY = hashlib.sha1(str(ROOT).encode()).hexdigest()[:10]
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(tempfile.gettempdir()) / f"ptinternals-inductor-{_KEY}"))


@pytest.fixture(autouse=True, scope="module")
def _fresh_dynamo():
    import torch

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
