"""The student edition's parts, without building it: judging code cut from the checks, visible cases as
data, the notebook analysis (which cells run live, which are recorded) and the clean scan itself."""
import ast
import json

import nbformat
import pytest
import torch

from ptinternals.edition import manifest
from ptinternals.edition.checks import CASE_MAKING, EditionError, slice_checks
from ptinternals.edition.notebooks import analyse
from ptinternals.edition.scan import ScanReport, bodies_of, normalise, scan
from ptinternals.grading.exercise import Case, graded_chapters
from ptinternals.grading.visible import decode_value, encode_value, export_chapter

CHAPTERS = manifest.course_chapters()
# On the end-to-end test's worker (make test: -n 2 --dist loadgroup): its build then reuses the visible cases and
# expected answers these tests compute (Exercise.cases_and_expected is computed once per process).
pytestmark = pytest.mark.xdist_group("student-edition")


def _shipped() -> set[str]:
    files = manifest._expand(manifest.CLIENT_FILES)
    for ch in CHAPTERS:
        files += manifest.chapter_files(ch)
    shipped = {manifest.module_name(f) for f in files if f.endswith(".py")}
    helpers, _ = manifest.judging_helpers(shipped)
    shipped |= {manifest.module_name(f) for f in helpers}
    figures, _ = manifest.figures_that_ship(CHAPTERS, shipped)
    return shipped | {manifest.module_name(f) for f in figures}


SHIPPED = _shipped()


def test_every_chapter_is_covered():
    assert [ch.slug for ch in CHAPTERS] == [ch.slug for ch in graded_chapters()]


def test_committed_recordings_are_current():
    """The edition's notebooks show these outputs for the demonstrations that need the reference: they must
    be recorded from the notebooks and course code as they are (refresh: scripts/record_demonstrations.py)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "record_demonstrations.py"
    spec = importlib.util.spec_from_file_location("record_demonstrations", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.stale() == [], "run: PYTHONPATH=$PWD/src .venv/bin/python scripts/record_demonstrations.py CHAPTER"


def test_shared_judging_helpers_ship_and_chapter_checks_do_not():
    helpers, left_out = manifest.judging_helpers({"ptinternals"})
    assert not {h for h in [*helpers, *left_out] if h[len("checks/"):-3] in {ch.slug for ch in CHAPTERS}}
    assert all(h.startswith("checks/") and h.endswith(".py") for h in helpers)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda ch: ch.slug)
def test_checks_keep_judging_code_and_drop_case_making(chapter):
    sliced = slice_checks(chapter.slug, shipped=SHIPPED, extra_roots={"RankCase", "PerfTarget"})
    tree = ast.parse(sliced.source)
    methods = {f"{c.name}.{m.name}" for c in tree.body if isinstance(c, ast.ClassDef)
               for m in c.body if isinstance(m, ast.FunctionDef)}
    assert not {m for m in methods if m.split(".")[1] in CASE_MAKING}, "case-drawing or expected-answer code kept"
    for ex in chapter.exercises:  # every exercise keeps a compare (its own, inherited, or the default)
        assert type(ex).__name__ in {c.name for c in tree.body if isinstance(c, ast.ClassDef)}
    for withheld in sliced.withheld:
        assert withheld in methods  # replaced by a stub, never silently inherited
    imports = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {i for i in imports if i.split(".")[0] in ("hypothesis", "nbgrader")}
    compile(sliced.source, f"checks/{chapter.slug}.py", "exec")


def test_a_borrowed_judging_method_keeps_what_it_reads_on_the_borrower():
    """``Im2Col.compare = SlidingWindows.compare`` reads ``self.banned_calls``: Im2Col's own must stay."""
    sliced = slice_checks("strides", shipped=SHIPPED)
    im2col = next(c for c in ast.parse(sliced.source).body if isinstance(c, ast.ClassDef) and c.name == "Im2Col")
    assert "banned_calls" in {t.id for node in im2col.body if isinstance(node, ast.Assign)
                              for t in node.targets if isinstance(t, ast.Name)}


def test_a_judging_method_that_needs_the_reference_stops_the_build(monkeypatch):
    from ptinternals.checks import allocator

    monkeypatch.setattr(allocator.FixFragmentation, "withheld_from_students", ())
    with pytest.raises(EditionError, match=r"ptinternals\.allocator\..*FixFragmentation.*withhold"):
        slice_checks("allocator", shipped=SHIPPED)


def test_an_edition_module_imports_only_what_ships():
    """Exactly what ships: a parent package that ships something is not enough, nor is ``ptinternals`` itself."""
    shipped = {"ptinternals", "ptinternals.course", "ptinternals.gpt.scaffold", "ptinternals.gpt.config",
               "ptinternals.grading", "ptinternals.grading.compare"}
    ok = [("ptinternals", "course"), ("ptinternals.gpt.scaffold", "anything"), ("ptinternals.gpt", "scaffold"),
          ("ptinternals.gpt.scaffold", None), ("ptinternals.grading", "check"), ("ptinternals", "__version__")]
    refused = [("ptinternals.gpt.train", "train_step"), ("ptinternals.gpt", "train_step"), ("ptinternals.gpt", "GPT"),
               ("ptinternals", "gpt"), ("ptinternals.gpt.train", None), ("ptinternals.grading.trusted", "grade"),
               ("ptinternals.checks.gpt", "TrainStep")]
    assert [t for t in ok if not manifest.importable(t, shipped)] == []
    assert [t for t in refused if manifest.importable(t, shipped)] == []
    assert manifest.importable(("ptinternals.gpt", "GPTConfig"), shipped)  # re-exported from config, which ships
    assert [m for m in ("torch.fx", "networkx", "json", "IPython.display") if not manifest.third_party_ok(m)] == []
    assert [m for m in ("hypothesis", "nbgrader", "pytest", "pandas", "cosmic_ray") if manifest.third_party_ok(m)] == []


def test_every_module_that_ships_imports_only_what_ships():
    """Anywhere in it, a function's imports included (grading.policy once read isolation's ABSENTABLE)."""
    files = [f for f in manifest._expand(manifest.CLIENT_FILES) if f.endswith(".py")]
    for ch in CHAPTERS:
        files += manifest.chapter_files(ch)
    files += [f"{m.replace('.', '/')[len('ptinternals/'):]}.py" for m in SHIPPED
              if m.startswith(("ptinternals.viz.", "ptinternals.checks.")) and not m.startswith("ptinternals.checks.probes")]
    files = [f for f in files if f.endswith(".py")]
    unmet = {f: [manifest.describe(t) for t in manifest.imports_of(f) if not manifest.importable(t, SHIPPED)] for f in files}
    assert {f: n for f, n in unmet.items() if n} == {}
    third = {f: [m for m in manifest.other_imports_of(f) if not manifest.third_party_ok(m)] for f in files}
    assert {f: n for f, n in third.items() if n} == {}


def test_the_judging_code_may_not_import_what_students_lack(monkeypatch):
    from ptinternals.checks import gpt
    from ptinternals.edition.checks import _check_import

    stmt = ast.parse("from hypothesis import strategies as st").body[0]
    with pytest.raises(EditionError, match="needs hypothesis, which students do not install"):
        _check_import(stmt, stmt.names, "ptinternals.checks.strides", SHIPPED, {}, "strides")
    monkeypatch.setattr(gpt.TrainStep, "withheld_from_students", ())  # its diagnose reruns the reference train_step
    with pytest.raises(EditionError, match=r"ptinternals\.gpt\.train\.train_step"):
        slice_checks("gpt", shipped=SHIPPED | {"ptinternals"})  # 'ptinternals' itself shipping lets nothing through


def test_only_judging_methods_can_be_withheld(monkeypatch):
    from ptinternals.checks import strides

    monkeypatch.setattr(strides.SliceView, "withheld_from_students", ("hidden_cases",))
    with pytest.raises(EditionError, match="can be withheld"):
        slice_checks("strides", shipped=SHIPPED)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
                and a.storage_offset() == b.storage_offset() and a.requires_grad == b.requires_grad
                and torch.equal(a.detach(), b.detach()) if a.dtype.is_floating_point is False or not a.isnan().any()
                else torch.equal(a.detach().nan_to_num(), b.detach().nan_to_num()))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(b) is type(a) and list(a.keys()) == list(b.keys()) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, Case):
        return type(a) is type(b) and _same(a.args, b.args) and _same(a.kwargs, b.kwargs) and a.label == b.label \
            and a.call_text("f") == b.call_text("f")
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    return a == b and type(a) is type(b)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda ch: ch.slug)
def test_visible_cases_and_expected_answers_round_trip_as_data(chapter):
    data, arrays = export_chapter(chapter)
    text = json.dumps(data)  # plain JSON: values, never code
    assert "__dataclass__" not in text or all(q.split(":")[0].startswith("ptinternals.")
                                              for q in _dataclasses(data))
    for ex in chapter.exercises:
        cases, expected = ex.cases_and_expected(hidden=False)
        recorded = data["exercises"][ex.id]
        assert _same(list(cases), decode_value(recorded["cases"], arrays)), ex.id
        assert _same(list(expected), decode_value(recorded["expected"], arrays)), ex.id


def test_containers_keep_their_type():
    from collections import Counter, OrderedDict

    value = [Counter({"aten::mm": 2}), OrderedDict(b=1, a=2), {3, 1}, frozenset({"x"}), {"k": (1, [2.5])}]
    arrays: dict = {}
    back = decode_value(json.loads(json.dumps(encode_value(value, arrays))), arrays)
    assert back == value and [type(v) for v in back] == [type(v) for v in value]
    assert list(back[1]) == ["b", "a"] and back[0]["aten::add"] == 0


def _dataclasses(tree):
    if isinstance(tree, dict):
        if "__dataclass__" in tree:
            yield tree["__dataclass__"]
        for v in tree.values():
            yield from _dataclasses(v)
    elif isinstance(tree, list):
        for v in tree:
            yield from _dataclasses(v)


def test_only_course_dataclasses_are_rebuilt():
    with pytest.raises(ValueError, match="not a ptinternals dataclass"):
        decode_value({"__dataclass__": "subprocess:Popen", "fields": {}}, {})
    with pytest.raises(TypeError, match="only ptinternals dataclasses"):
        import dataclasses

        encode_value(dataclasses.make_dataclass("Foreign", ["x"])(1), {})


# ---- which notebook cells are recorded ------------------------------------------------------------------
def _nb(*cells):
    nb = nbformat.v4.new_notebook()
    for i, (source, meta) in enumerate(cells):
        cell = nbformat.v4.new_code_cell(source, metadata=meta)
        cell["id"] = f"c{i}"
        nb.cells.append(cell)
    return nb


SETUP = {"nbgrader": {"grade_id": "setup", "locked": True}}
ANSWER = {"nbgrader": {"grade_id": "f_code", "solution": True}}
SHIPS = {"ptinternals.viz.ok", "ptinternals.grading"}


def _available(module, name):
    return module in SHIPS


def test_withheld_names_flow_through_the_notebook():
    nb = _nb(("import torch\nfrom ptinternals.grading import check\nfrom ptinternals.viz.ref import draw", SETUP),
             ("x = torch.ones(3)\nprint(x)", {}),  # live
             ("draw(x)", {}),  # reads a stand-in: recorded
             ("import math\nfrom ptinternals.chapter import Model\nm = Model()\ny = 2", {}),  # the reference: recorded
             ("def show():\n    return m.run()\n", {}),  # reads m inside a function: recorded
             ("m = torch.zeros(2)\nprint(m, y)", {}),  # reads y (withheld): recorded, m withheld again
             ("y = 3\nprint(y, math.pi)", {}),  # rebinds y; math was imported by %%recorded: live
             ("def f(a):\n    return a + 1", ANSWER))
    plan = analyse(nb, "demo", _available)
    assert sorted(plan.recorded) == ["c2", "c3", "c4", "c5"]
    assert plan.standins == {"ptinternals.viz.ref": {"draw"}}
    assert plan.live == 4  # setup, c1, c6 and the answer cell


def test_an_answer_cell_that_needs_the_reference_stops_the_build():
    nb = _nb(("from ptinternals.chapter import helper", {}), ("def f(a):\n    return helper(a)", ANSWER))
    with pytest.raises(ValueError, match="answer cell f_code needs \\['helper'\\]"):
        analyse(nb, "demo", _available)


# ---- the scan ---------------------------------------------------------------------------------------------
SOLUTION = '''
def contiguous_strides(shape):
    """Row-major strides."""
    strides = []
    running = 1
    for size in reversed(shape):
        strides.append(running)
        running *= max(size, 1)
    return tuple(reversed(strides))
'''
RENAMED_AND_REFORMATTED = '''
def helper(dims):  # another name, other variable names, other layout and comments
    out = [];   acc = 1
    for d in reversed(dims):
        out.append(acc)
        acc *= max(d,
                   1)
    return tuple(reversed(out))
'''
PASTED_INSIDE = '''
def bigger(x):
    print("hello")
    res = []
    r = 1
    for s in reversed(x):
        res.append(r)
        r *= max(s, 1)
    return tuple(reversed(res))
'''
DIFFERENT = '''
def other(shape):
    strides = []
    running = 1
    for size in shape:
        strides.append(running)
        running += size
    return strides
'''


def _scan(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    report = ScanReport()
    bodies, fragments = bodies_of(SOLUTION, "solution", report)
    return scan(tmp_path, bodies, fragments, report)


def test_scan_finds_a_solution_body_however_renamed_and_formatted(tmp_path):
    assert normalise(ast.parse(SOLUTION).body[0].body) == normalise(ast.parse(RENAMED_AND_REFORMATTED).body[0].body)
    report = _scan(tmp_path, {"a.py": RENAMED_AND_REFORMATTED, "b.py": PASTED_INSIDE, "c.py": DIFFERENT})
    assert sorted(f.where.split(",")[0] for f in report.findings) == ["a.py", "b.py"]


def test_scan_looks_inside_notebooks_markdown_json_and_wheels(tmp_path):
    import zipfile

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%%recorded x y\n" + RENAMED_AND_REFORMATTED),
                nbformat.v4.new_markdown_cell("```python\n" + PASTED_INSIDE + "```")]
    report = _scan(tmp_path, {"n.ipynb": nbformat.writes(nb), "r.json": json.dumps({"text": PASTED_INSIDE}),
                              "ok.md": "no code here", "ok.py": DIFFERENT})
    with zipfile.ZipFile(tmp_path / "p.whl", "w") as z:
        z.writestr("pkg/m.py", RENAMED_AND_REFORMATTED)
    report = _scan(tmp_path, {})
    where = sorted({f.where.split(" ")[0].split(",")[0].split("!")[0] for f in report.findings})
    assert where == ["n.ipynb", "p.whl", "r.json"]


def test_a_definition_the_notebook_prints_is_public(tmp_path):
    """profiling prints the training loop with hidden syncs (inspect.getsource): its body is not a leak."""
    from ptinternals.edition.scan import public_texts, solution_corpus

    (tmp_path / "src" / "ptinternals" / "demo").mkdir(parents=True)
    (tmp_path / "src" / "ptinternals" / "demo" / "loops.py").write_text(SOLUTION.replace("contiguous_strides", "slow_loop"))
    for folder in ("notebooks", "solutions"):
        (tmp_path / folder / "demo").mkdir(parents=True)
        nbformat.write(_nb(("import inspect\nprint(inspect.getsource(slow_loop))", {})),
                       tmp_path / folder / "demo" / "demo.ipynb")
    withheld = [tmp_path / "src" / "ptinternals" / "demo" / "loops.py"]
    bodies, _ = solution_corpus(tmp_path, ["demo"], withheld, ScanReport(), public_texts(tmp_path, ["demo"], []))
    assert bodies == []
    bodies, _ = solution_corpus(tmp_path, ["demo"], withheld, ScanReport(), [])
    assert bodies
