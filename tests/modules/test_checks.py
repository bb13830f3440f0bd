"""The chapter's checkers: what they draw, what they judge against, and the static check of how answers are written.

The shared tests (tests/test_exercise_banks.py, tests/test_notebooks.py) show that the solutions pass, the stubs
say "not implemented yet" and every known bug is rejected; here: the boundary trees are really in every
hidden batch, expected answers are torch's (and where torch 2.13 is wrong, judged on their own terms), and no
answer can pass by using torch's implementation of what it asks for.
"""
from __future__ import annotations

import pytest
import torch

from ptinternals.checks import modules as M
from ptinternals.checks.probes import modules as P
from ptinternals.grading.testing import answer_sources, notebook_with
from ptinternals.modules import validate_spec

EX = {ex.local_id: ex for ex in M.EXERCISES}
TREE_EXERCISES = ["traverse", "convert", "state_dict", "call", "functional_call"]


def test_boundary_trees_are_valid_and_in_every_hidden_batch():
    specs = M.boundary_specs()
    for _, spec in specs:
        validate_spec(spec)
    dims = {spec["dim"] for _, spec in specs}
    assert {0, 1} <= dims
    for name in TREE_EXERCISES:
        hidden = [c.args[0] for c in EX[name].hidden_cases()]
        for label, spec in specs:
            assert spec in hidden, f"{name}: the boundary tree {label!r} is missing from the hidden cases"


def test_hidden_cases_are_the_same_on_every_draw():
    for name in ("register", "traverse", "hook_order"):
        first, second = EX[name].hidden_cases(), EX[name].hidden_cases()
        assert [c.label for c in first] == [c.label for c in second]


def test_torch_key_error_on_partly_given_tied_groups_is_kept_out():
    """torch 2.13 raises KeyError when 2 of 3 names of one tied tensor are given: no such case is drawn."""
    cases, expected = EX["functional_call"].cases_and_expected()
    assert all(e.get("type") != "KeyError" for e in expected)
    spec = dict(M.boundary_specs())["a block shared under two names and by two parents, an int64 counter, an empty module"]
    assert M.torch_trips_on(spec, ["block.proj", "again.proj"], tie_weights=True)
    got = P.functional_call_run(torch.func.functional_call, spec, ["block.proj", "again.proj"], True, False)
    assert got["outcome"] == "raised" and got["type"] == "KeyError"  # if this fails, torch fixed it: draw them again


def test_restoring_is_judged_as_an_invariant_where_torch_fails_it():
    """pytorch/pytorch#164759: torch leaves the passed tensor in a module registered twice; the checker expects
    every original back (and says so), instead of agreeing with torch."""
    case = next(c for c in EX["functional_call"].visible_cases() if "#164759" in c.label)
    torch_run = P.functional_call_run(torch.func.functional_call, *case.args, **case.kwargs)
    print("torch 2.13 leaves these slots changed:", torch_run["restored"])
    assert EX["functional_call"].expected(case)["restored"] == []


def test_expected_answers_are_torch_behaviour():
    """Spot checks that the expected side really ran torch.nn.Module (not this package's reference)."""
    ex = EX["state_dict"]
    case = ex.visible_cases()[1]  # strict=False, a dropped key and a stray one
    load = ex.expected(case)["load"]
    tree = M.build_tree(case.args[0], torch.nn.Module)[0]
    result = tree.load_state_dict(P.checkpoint_from(*case.args[1:]), strict=False)
    assert load[:3] == ["ok", result.missing_keys, result.unexpected_keys]
    order = EX["hook_order"].expected(EX["hook_order"].visible_cases()[0])
    assert order[:2] == [("pre", ""), ("pre", "stem")]


# ---- how answers may be written ----------------------------------------------------------------------------
SETUP = answer_sources("modules")["setup"]


def problem(exercise: str, code: str, others: dict | None = None):
    sources = {"setup": SETUP, EX[exercise].answer_cell: code, **(others or {})}
    return EX[exercise].source_problem(sources, own_cell=EX[exercise].answer_cell)


def test_feedback_knows_the_setup_cells_imports():
    """Instant feedback sees only the answer's own cell: it assumes the setup cell's imports, as written."""
    from ptinternals.checks.modules import ALLOWED_IMPORTS, SETUP_IMPORTS
    from ptinternals.grading.policy_imports import analyse

    def graded(source):
        return {k: v for k, v in analyse(source, (), ALLOWED_IMPORTS).aliases.items() if not v.startswith(("ptinternals.grading",
                                                                                             "ptinternals.quiz",
                                                                                             "ptinternals.viz"))}

    assert graded(SETUP) == graded(SETUP_IMPORTS)
    message = EX["register"].source_problem({"<cell>": "class Registration(nn.Module):\n    pass\n"})
    assert message and "torch.nn.Module" in message and "answer cell <cell>" in message


def test_every_solution_cell_passes_the_policy():
    sources = answer_sources("modules")
    for ex in M.EXERCISES:
        assert ex.source_problem(sources, own_cell=ex.answer_cell) is None, ex.id


CHEATS = [
    ("register", "import torch\nclass Registration(torch.nn.Module):\n    pass\n", "torch.nn.Module"),
    ("register", "from torch.nn import Module as Base\nclass Registration(Base):\n    pass\n", "torch.nn.Module"),
    ("register", "import torch.nn as tnn\nclass Registration(tnn.Linear):\n    pass\n", "Linear"),
    ("register", "class Registration(BrokenNet):\n    pass\n", "Module subclass"),
    ("register", "import torch\nclass Registration:\n    def __setattr__(self, n, v):\n"
                 "        torch.nn.Module.__setattr__(self, n, v)\n", "__setattr__"),
    ("register", "import torch\nRegistration = getattr(torch.nn, 'Mod' + 'ule')\n", "computed attribute name"),
    ("register", "import torch\nns = torch.nn\nclass Registration(ns.Module):\n    pass\n", "used as a value"),
    ("register", "class Registration(eval('torch.nn.Module')):\n    pass\n", "`eval`"),
    ("register", "Registration = __import__('torch').nn.Module\n", "`__import__`"),
    ("register", "import importlib\nRegistration = importlib.import_module('torch.nn').Module\n", "may import only"),
    ("register", "import sys\nRegistration = sys.modules['torch.nn'].Module\n", "may import only"),
    ("register", "import typing\nRegistration = typing.sys.modules['torch.nn'].Module\n", "through another module"),
    ("register", "class Registration:\n    f = (lambda: 0).__globals__\n", "__globals__"),
    ("register", "import torch\nclass Registration:\n    x = torch._C\n", "private"),
    ("register", "import torch\ntorch.Tensor.tolist = lambda self: []\nclass Registration:\n    pass\n",
     "monkeypatching"),
    ("register", "import typing\nRegistration = typing.get_type_hints\n", "get_type_hints"),
    ("register", "from typing import get_type_hints\nclass Registration:\n    pass\n", "get_type_hints"),
    ("traverse", "import torch\nclass Traversal:\n    named_modules = torch.nn.Module.named_modules\n", "torch.nn.Module"),
    ("convert", "import torch\nclass Conversion:\n    def to(self, *a):\n        return torch.nn.Module.to(self, *a)\n",
     "torch.nn.Module"),
    ("state_dict", "from torch.nn.modules.module import Module\nclass StateDict:\n    load_state_dict = "
                   "Module.load_state_dict\n", "torch.nn.Module"),
    ("call", "from torch.utils.hooks import BackwardHook\nclass Calling:\n    pass\n", "torch.utils.hooks"),
    ("call", "import torch\nclass Calling:\n    def __call__(self, *a):\n        with torch.overrides.TorchFunctionMode():"
             "\n            return self.forward(*a)\n", "torch.overrides"),
    ("hook_order", "import torch\ndef hook_order(tree, r):\n    return []\n", "written without torch"),
    ("functional_call", "from torch.func import functional_call\n", "torch.func"),
    ("functional_call", "import torch\ndef functional_call(m, p, args=(), kwargs=None, **kw):\n"
                        "    return torch.nn.utils.stateless.functional_call(m, p, args)\n", "stateless"),
    ("functional_call", "def functional_call(m, p, args=(), kwargs=None, **kw):\n"
                        "    m.load_state_dict(p, strict=False, assign=True)\n    return m(*args)\n", "load_state_dict"),
    ("load_checkpoint", "from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present\n"
                        "def load_checkpoint(model, ckpt):\n    pass\n", "consume_prefix"),
]


@pytest.mark.parametrize("exercise, code, words", CHEATS, ids=[f"{c[0]}-{i}" for i, c in enumerate(CHEATS)])
def test_a_cheat_is_refused_with_its_line(exercise, code, words):
    message = problem(exercise, code)
    assert message is not None and words in message, message
    assert "line " in message


def test_the_graded_name_is_defined_only_in_its_own_cell():
    elsewhere = {"fix_model_code": "import torch\nclass Registration(torch.nn.Module):\n    pass\n"}
    message = problem("register", "class Registration:\n    pass\n", elsewhere)
    assert "binds `Registration`" in message


def test_cells_an_answer_uses_are_checked_under_its_policy():
    helper = {"fix_model_code": "import torch\nBase = torch.nn.Module\n"}
    message = problem("register", "class Registration(Base):\n    pass\n", helper)
    assert "torch.nn.Module" in message and "fix_model_code" in message
    assert problem("fix_model", "import torch\nclass FixedNet(torch.nn.Module):\n    pass\n") is None


@pytest.mark.parametrize("code", [
    "from typing import Any\nimport torch.nn.functional as F\nclass Registration:\n    x = F.relu\n",
    "from torch.utils.hooks import RemovableHandle\nimport torch\nclass Registration(torch.autograd.Function):\n"
    "    pass\n",
    "class Registration:\n    def __setattr__(self, n, v):\n        object.__setattr__(self, n, v)\n"
    "    def __init__(self):\n        super().__init__()\n        self.m = getattr(self, '_metadata', None)\n",
    "import torch\nclass Registration:\n    flag = torch.__future__.get_overwrite_module_params_on_conversion()\n",
    "class Registration:\n    def f(self, check):\n        return check\n",  # a local named like the setup's check()
    "this is ( not python",  # fails on its own in the sandbox; nothing to judge here
])
def test_ordinary_code_is_allowed(code):
    assert problem("register", code) is None


def test_instant_feedback_checks_the_defining_cell():
    from ptinternals.grading import CheckFailure
    from ptinternals.grading.testing import rejects

    failure = rejects("modules.register", "import torch\nclass Registration(torch.nn.Module):\n    pass\n")
    assert isinstance(failure, CheckFailure) and failure.category == "forbidden"
    assert "torch.nn.Module" in str(failure)


@pytest.mark.slow
def test_trusted_grade_refuses_torch_implementations(tmp_path):
    """Through the sandbox: answers that subclass nn.Module or call torch.func.functional_call score 0 (they
    would pass every behavioural case), and the other exercises keep their points."""
    from ptinternals.grading.exercise import load_chapter
    from ptinternals.grading.sandbox import SandboxConfig
    from ptinternals.grading.trusted import grade_notebook

    cheats = {"traverse_code": "import torch\nclass Traversal(torch.nn.Module):\n    pass\n",
              "functional_call_code": "from torch.func import functional_call\n"}
    nb = notebook_with("modules", cheats)
    report = grade_notebook(nb, load_chapter("modules"), tmp_path, SandboxConfig())
    by_id = {e.id: e for e in report.exercises}
    for ex_id in ("modules.traverse", "modules.functional_call"):
        assert by_id[ex_id].score == 0 and by_id[ex_id].category == "forbidden", by_id[ex_id].message
    for ex in M.EXERCISES:
        if ex.id not in ("modules.traverse", "modules.functional_call"):
            assert by_id[ex.id].passed, by_id[ex.id].message
