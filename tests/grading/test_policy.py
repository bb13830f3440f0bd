"""The static policy: legitimate solutions pass it, every way of hiding a banned call is named with its line."""
import textwrap

import pytest

from ptinternals.grading.exercise import Exercise, graded_chapters, load_chapter
from ptinternals.grading.policy import Policy, check_policy, effective_policy
from ptinternals.grading.testing import answer_sources

STRIDES = load_chapter("strides")
WINDOWS = STRIDES.exercise("strides.sliding_windows")
GOOD = "def sliding_windows(x, size, step):\n    return x.as_strided(x.shape, x.stride())\n"


def cells(**sources):
    return [{"id": gid, "source": textwrap.dedent(src)} for gid, src in sources.items()]


def violations(ex=WINDOWS, chapter=STRIDES, **sources):
    return [str(v) for v in check_policy(ex, cells(**sources), chapter.policy_allow)]


def test_every_solution_passes_its_policies():
    checked = 0
    for ch in graded_chapters():
        solution = [{"id": g, "source": s} for g, s in answer_sources(ch.assignment).items() if g != "setup"]
        for ex in ch.exercises:
            if effective_policy(ex) is not None:
                checked += 1
                assert check_policy(ex, solution, ch.policy_allow) == [], ex.id
    assert checked >= 30


@pytest.mark.parametrize("code, named", [
    ("def sliding_windows(x, size, step):\n    return x.unfold(-1, size, step)\n", ".unfold"),
    ("from torch.nn.functional import unfold\ndef sliding_windows(x, size, step):\n    return x\n", "import unfold"),
    ("import numpy.lib.stride_tricks as st\ndef sliding_windows(x, size, step):\n    return st.sliding_window_view(x, size)\n",
     ".sliding_window_view"),
    ("def sliding_windows(x, size, step):\n    return getattr(x, 'unf' + 'old')(-1, size, step)\n", "computed attribute name"),
    ("def sliding_windows(x, size, step):\n    return getattr(x, 'unfold')(-1, size, step)\n", "the string 'unfold'"),
    ("def sliding_windows(x, size, step):\n    return eval('x.unfold(-1, size, step)')\n", "eval"),
    ("import torch\ndef sliding_windows(x, size, step):\n    with torch._C.DisableTorchFunction():\n        return x\n",
     "._C (a private attribute)"),
    ("from torch._C import DisableTorchFunction\ndef sliding_windows(x, size, step):\n    return x\n", "private"),
    ("import importlib\ndef sliding_windows(x, size, step):\n    return x\n", "import of importlib"),
    ("def sliding_windows(x, size, step):\n    return __import__('torch').Tensor.unfold(x, -1, size, step)\n", "__import__"),
    ("import torch\ndef sliding_windows(x, size, step):\n    return vars(torch.Tensor)['unfold'](x, -1, size, step)\n", "vars"),
    ("import torch\ndef sliding_windows(x, size, step):\n    return torch.Tensor.__dict__['unfold'](x, -1, size, step)\n",
     ".__dict__"),
    ("import gc\ndef sliding_windows(x, size, step):\n    return x\n", "import of gc"),
    ("import sys\ndef sliding_windows(x, size, step):\n    return sys.modules['torch']\n", "import of sys"),
    ("def sliding_windows(x, size, step):\n    return '{0.unfold}'.format(x)\n", ".format with a field lookup"),
    ("from torch.nn.functional import *\ndef sliding_windows(x, size, step):\n    return x\n", "star import"),
    ("import os\ndef sliding_windows(x, size, step):\n    os.system('python -c pass')\n    return x\n", ".system"),
    ("def sliding_windows(x, size, step):\n    try:\n        1 / 0\n    except Exception as e:\n"
     "        return e.__traceback__.tb_frame.f_back.f_locals\n", ".__traceback__"),
    ("import torch\ntorch.Tensor.as_strided = torch.Tensor.unfold\n" + GOOD, "monkeypatching"),
    ("import torch\nL = [torch.Tensor]\nL[0].as_strided = lambda *a: None\n" + GOOD, "monkeypatching"),
])
def test_hiding_and_banned_constructs_are_named(code, named):
    found = violations(sliding_windows_code=code)
    assert any(named in v for v in found), found
    assert all("answer cell sliding_windows_code, line" in v for v in found)


def test_a_banned_call_in_a_helper_of_another_cell_is_found():
    helper = "def make(x, size, step):\n    return x.unfold(-1, size, step)\n"
    found = violations(other_code=helper, sliding_windows_code="def sliding_windows(x, size, step):\n"
                                                                 "    return make(x, size, step)\n")
    assert any(".unfold (answer cell other_code, line 2)" in v for v in found)


def test_a_value_put_into_a_shared_name_from_another_cell_is_followed():
    shared = "class Box:\n    pass\nbox = Box()\n"
    planter = "def plant():\n    box.fn = lambda x, size, step: x.unfold(-1, size, step)\nplant()\n"
    user = "def sliding_windows(x, size, step):\n    return box.fn(x, size, step)\n"
    found = violations(shared_code=shared, planter_code=planter, sliding_windows_code=user)
    assert any(".unfold (answer cell planter_code" in v for v in found), found


def test_unrelated_cells_may_use_a_name_another_exercise_bans():
    other = "import torch\ndef other(x):\n    return x.unfold(0, 2, 1)\n"
    assert violations(other_code=other, sliding_windows_code=GOOD) == []


@pytest.mark.parametrize("code", [
    "class W:\n    def __init__(self):\n        self._cache = {}\n    def get(self):\n        return self._cache\n" + GOOD,
    "class A:\n    def _f(self):\n        return 1\nclass B(A):\n    def _f(self):\n        return super()._f()\n" + GOOD,
    "def sliding_windows(x, size, step):\n    n = getattr(x, 'ndim', 1)\n    print('{} {:.3f}'.format(n, 1.0))\n"
    "    return x.as_strided(x.shape, x.stride())\n",
    "def sliding_windows(x, size, step):\n    return x.as_strided(x.shape, x.stride())  # unfold is not called\n",
])
def test_plain_code_is_accepted(code):
    assert violations(sliding_windows_code=code) == []


def test_a_forbid_module_that_cannot_be_absent_is_banned_statically():
    amp = load_chapter("amp")
    decode = amp.exercise("amp.decode")
    code = "import struct\ndef decode(bits, fmt):\n    return struct.unpack('>e', bits.to_bytes(2, 'big'))[0]\n"
    found = violations(decode, amp, decode_code=code)
    assert any("import struct" in v for v in found), found
    code = "def decode(bits, fmt):\n    return memoryview(bits.to_bytes(2, 'little')).cast('e')[0]\n"
    found = violations(decode, amp, decode_code=code)
    assert any(v.startswith("memoryview") for v in found) and any(".cast" in v for v in found), found


def test_the_chapter_allow_list_is_narrow():
    dispatch = load_chapter("dispatch")
    flops = dispatch.exercise("dispatch.flop_counter")
    ok = "import torch\nclass T(torch.Tensor):\n    __torch_function__ = torch._C._disabled_torch_function_impl\n"
    bad = "import torch\ndef f():\n    return torch._C.DisableTorchFunction()\n"
    assert violations(flops, dispatch, int8_tensor_code=ok) == []
    assert any("._C" in v for v in violations(flops, dispatch, int8_tensor_code=bad))


def test_a_cell_that_does_not_parse_does_not_switch_the_policy_off():
    found = violations(broken_code="def (:\n", sliding_windows_code="def sliding_windows(x, size, step):\n"
                                                                      "    return x.unfold(-1, size, step)\n")
    assert any(".unfold" in v for v in found), found


def test_the_instructor_docs_list_exactly_the_exercises_with_a_policy():
    import re

    from ptinternals.grading.testing import ROOT

    text = (ROOT / "book" / "instructors.md").read_text()
    documented = set()
    slugs = {ch.slug for ch in graded_chapters()}
    for chapter, cell in re.findall(r"^\s*\| (\w+) \| (.+?) \|$", text, re.M):
        if chapter not in slugs:
            continue
        names = re.sub(r"\([^)]*\)", "", cell)
        documented |= {f"{chapter}.{n.strip()}" for n in names.split(",") if n.strip()}
    with_policy = {ex.id for ch in graded_chapters() for ex in ch.exercises if effective_policy(ex) is not None}
    assert documented == with_policy, (sorted(documented - with_policy), sorted(with_policy - documented))


def test_an_exercise_whose_entry_lives_in_another_cell_is_checked_there():
    amp = load_chapter("amp")
    speed = amp.exercise("amp.amp_speed")  # graded on amp_train, defined in amp_train's cell
    code = "import torch\ndef amp_train(*args, **kwargs):\n    with torch.autocast('cpu'):\n        return 0\n"
    assert any(".autocast" in v for v in violations(speed, amp, amp_train_code=code))


# ---- closed imports (Policy.imports, grading/policy_imports.py): any chapter may declare them --------------
class _Closed(Exercise):
    """A stand-in exercise: ``solve`` in ``solve_code``, which must not reach torch.func or subclass nn.Module."""

    id, entry = "strides.solve", "solve"

    def __init__(self, **policy):
        self.policy = Policy(**{"imports": ("math", "torch"), "why": "write it yourself",
                                "setup_imports": "import torch\n", **policy})


def closed(ex=None, **sources):
    ex = ex or _Closed(deny_modules=("torch.func",), deny_subclasses_of=("torch.nn.Module",),
                       allow_objects=("torch.nn.Linear",), deny_modules_anywhere=("torch.overrides",))
    return [str(v) for v in check_policy(ex, cells(**sources))]


def test_closed_fields_need_imports():
    with pytest.raises(ValueError, match="deny_modules"):
        Policy(deny_modules=("torch.func",))


@pytest.mark.parametrize("code, named", [
    ("import os\ndef solve(x):\n    return x\n", "may import only math, torch"),
    ("from torch.func import vmap as v\ndef solve(x):\n    return v\n", "(from torch.func)"),
    ("def solve(x):\n    return torch.func.grad\n", "`torch.func.grad` (from torch.func) is not allowed here"),  # the setup imports torch
    ("from torch.nn import Module as Base\nclass Solve(Base):\n    pass\nsolve = Solve\n", "not allowed here"),
    ("import torch\nclass Solve(torch.nn.ReLU):\n    pass\nsolve = Solve\n", "a Module subclass"),
    ("import torch\nns = torch.nn\ndef solve(x):\n    return ns\n", "the module `torch.nn` used as a value"),
    ("import torch\ndef solve(x):\n    return torch._C\n", "`_C` is private"),
    ("import torch\ndef solve(x):\n    return torch.nn.functional.torch.func\n", "through another module's attribute"),
    ("import torch\ntorch.relu = abs\ndef solve(x):\n    return x\n", "monkeypatching"),
    ("def solve(x):\n    return getattr(x, 'a' + 'b')\n", "computed attribute name"),
    ("def solve(x):\n    return eval('x')\n", "`eval`"),
    ("%time 1\nfrom torch.func import grad\ndef solve(x):\n    return grad\n", "torch.func"),  # a magic hides nothing
])
def test_closed_imports_resolve_what_an_answer_reaches(code, named):
    found = closed(solve_code=code)
    assert any(named in v and "answer cell solve_code, line" in v for v in found), found


def test_closed_imports_allow_listed_objects_and_plain_code():
    ok = "import math\nimport torch\nclass Solve(torch.nn.Linear):\n    pass\ndef solve(x):\n" \
         "    y = getattr(x, 'shape')\n    return torch.relu(x) * math.pi, y\n"
    assert closed(solve_code=ok) == []


def test_closed_imports_judge_every_cell_and_the_cells_an_answer_uses():
    assert any("torch.overrides" in v for v in closed(other_code="import torch\nm = torch.overrides.TorchFunctionMode\n",
                                                      solve_code="def solve(x):\n    return x\n"))
    helper = "import torch\nBase = torch.nn.Module\n"
    assert any("other_code" in v for v in closed(other_code=helper, solve_code="class S(Base):\n    pass\nsolve = S\n"))
    assert closed(other_code=helper, solve_code="def solve(x):\n    return x\n") == []  # unrelated: allowed
    assert any("binds `solve`" in v for v in closed(other_code="solve = 1\n", solve_code="def solve(x):\n    return x\n"))


def test_closed_imports_keep_the_name_rules():
    ex = _Closed(banned=("unfold",), no_modules=("torch",))
    found = closed(ex, solve_code="def solve(x):\n    return x.unfold(0, 1, 1)\n")
    assert any(".unfold" in v for v in found) and closed(ex, solve_code="def solve(x):\n    return x\n") == []
    assert any("written without torch" in v for v in closed(ex, solve_code="import torch\ndef solve(x):\n    return x\n"))
