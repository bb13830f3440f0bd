"""Exercises: what a graded task is, and how its result is judged.

An :class:`Exercise` knows four things, and nothing about where the student's code runs:

1. ``entry``: the name the student defines (a function or a class);
2. its cases: ``visible_cases()`` (small, named, for instant feedback in the notebook) and
   ``hidden_cases()`` (many, drawn with hypothesis, for the grade);
3. ``expected(case)``: the right answer, from real torch wherever torch has it;
4. ``compare`` and ``diagnose``: whether a result is right, and if not, the likely cause.

The same exercise object is used in the student's kernel (``check``: instant feedback, untrusted)
and by the trusted grader (``ptinternals.grading.trusted``), which runs the student's code in a
sandbox and calls :func:`evaluate` on the data that comes back.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import _runtime
from ._runtime import Raised, TensorInfo, Unsupported
from .compare import close_tensors, describe, same_value


@dataclass
class Case:
    """One call of the student's entry point: ``entry(*args, **kwargs)``. ``label`` names it for humans."""

    args: tuple
    kwargs: dict = field(default_factory=dict)
    label: str = ""
    hidden: bool = False

    def call_text(self, entry: str) -> str:
        parts = [describe(a, 80) for a in self.args] + [f"{k}={describe(v, 80)}" for k, v in self.kwargs.items()]
        return f"{entry}({', '.join(parts)})"


@dataclass(frozen=True)
class Raises:
    """The expected outcome is an exception of one of ``types`` (names, e.g. ``("ValueError",)``)."""

    types: tuple[str, ...]
    why: str = ""

    def __repr__(self) -> str:
        return f"an exception ({' or '.join(self.types)}){': ' + self.why if self.why else ''}"


# What an answer cell holds in the student's notebook (nbgrader's ClearSolutions stub, used by the notebook
# build and the nbgrader configuration alike).
ANSWER_STUB = "# YOUR CODE HERE\nraise NotImplementedError()"


class CheckFailure(AssertionError):
    """A check failed. ``category`` is one of: wrong, error, not-implemented, forbidden, missing,
    timeout, crashed, unsupported (the instructor's summary groups failures by it)."""

    def __init__(self, message: str, *, exercise: str = "", category: str = "wrong"):
        super().__init__(message)
        self.exercise, self.category = exercise, category


class NotImplementedYet(CheckFailure):
    def __init__(self, message: str, *, exercise: str = ""):
        super().__init__(message, exercise=exercise, category="not-implemented")


# The packages a "forbid" makes absent while graded (the sandbox mounts over them), and the names they are
# installed under (folders and files); a forbidden module not listed here is banned statically (grading.policy).
ABSENTABLE = {
    "torch": ("torch", "functorch", "torchgen", "torch.libs"),
    "numpy": ("numpy", "numpy.libs"),
}


class Exercise:
    """Subclass per exercise. Class attributes describe it; methods produce cases and judge results."""

    id: str = ""  # "<slug>.<name>", e.g. "strides.view_strides"
    title: str = ""  # "view: strides for a new shape, or None"
    entry: str = ""  # the name the student defines
    points: float = 1.0
    forbid: tuple[str, ...] = ()  # modules the solution must not use (e.g. ("torch",)): absent while graded
    policy: Any = None  # how its source may be written (checked statically): a grading.policy.Policy
    timeout_s: float = 20.0  # for all cases of this exercise, in the sandbox
    probe: str | None = None  # "module:function" run sandbox-side instead of a plain call
    gpu: bool = False  # True: graded on a GPU when one is present (the device is in the result)
    # The boundary classes the hidden cases must cover, by name: ``{"a size-0 dim": lambda case, expected:
    # 0 in case.args[0]}``. tests/test_exercise_banks.py asserts each one holds for at least one hidden case
    # (CONTRIBUTING.md, "Tests of the tests", lists the classes each kind of exercise must have).
    boundary_classes: dict[str, Callable[[Case, Any], bool]] = {}
    # The student edition (``ptgrade student-edition``) ships this exercise's visible cases and expected
    # answers as data (``grading.visible``) and its ``compare``/``diagnose``/``summary`` as code, with
    # the helpers they use. Name here the ones it must leave out because they, or a helper they call,
    # re-implement something graded (a diagnosis that simulates the right algorithm to recognise wrong
    # ones): the edition's check then gives no "likely cause" for this exercise. ``compare`` cannot be.
    withheld_from_students: tuple[str, ...] = ()

    # ---- to be provided by each exercise ---------------------------------------------------------
    def visible_cases(self) -> list[Case]:
        raise NotImplementedError

    def hidden_cases(self) -> list[Case]:
        return []

    def expected(self, case: Case) -> Any:
        raise NotImplementedError

    def compare(self, case: Case, got: Any, expected: Any) -> str | None:
        """``None`` if ``got`` is right, else what differs. Default: exact data / close tensors."""
        import torch

        if isinstance(expected, torch.Tensor):
            return close_tensors(got, expected)
        return same_value(got, expected)

    def diagnose(self, case: Case, got: Any, expected: Any) -> str | None:
        """The likely cause of a known wrong answer (checked against the bank of buggy versions)."""
        return None

    def summary(self, cases: list[Case], results: list[Any]) -> str | None:
        """Extra lines for a *passing* result (e.g. achieved GB/s and the ratio to torch)."""
        return None

    def source_problem(self, sources: dict[str, str], own_cell: str | None = None) -> str | None:
        """What is not allowed in how the answer is *written*, judged on source text in the trusted process
        (a static policy: measurements made in the sandbox can be forged), or None. ``sources``: ``{cell id:
        source}``, the notebook's setup and answer cells when grading (``own_cell`` is then this exercise's
        answer cell), or only the cell that defined the entry for instant feedback (``own_cell`` None).

        The trusted grader calls it before any of the submission's code runs (an exercise it fails is not
        run); ``check`` calls it for instant feedback. It judges the exercise's ``policy``, a
        :class:`~.policy.Policy` (plus ``forbid`` modules that cannot be made absent); no policy, no rule."""
        from .policy import policy_problem

        return policy_problem(self, sources, own_cell)

    # ---- derived ----------------------------------------------------------------------------------
    number: str = ""  # "1.4": set by its Chapter from the book's order (ptinternals.course)

    @property
    def local_id(self) -> str:
        """The id without its chapter: "view_strides". It names the notebook's cells (``grade_id``)."""
        return self.id.split(".", 1)[1]

    @property
    def grade_id(self) -> str:
        """The nbgrader test cell that records this exercise's score: ``<local_id>_tests``."""
        return f"{self.local_id}_tests"

    @property
    def answer_cell(self) -> str:
        """The answer cell named after this exercise (``<local_id>_code``)."""
        return f"{self.local_id}_code"

    @property
    def name(self) -> str:
        return f"Exercise {self.number} ({self.entry})" if self.number else f"Exercise {self.id} ({self.entry})"

    def all_cases(self, hidden: bool = True) -> list[Case]:
        return self.cases_and_expected(hidden)[0]

    def cases_and_expected(self, hidden: bool = True) -> tuple[list[Case], list[Any]]:
        """The cases (visible, then hidden ones when ``hidden``) and their expected answers.

        Drawn and computed once per process and exercise: the cases are deterministic (a derandomized
        hypothesis), some expected answers are whole training runs, and the code under test only ever
        sees copies of a case's arguments (they cross the sandbox's encoding), so reuse is safe. Every
        caller (the notebook's ``check``, the trusted grader, the tests) goes through here.
        """
        memo = self.__dict__.setdefault("_cases_memo", {})
        if "visible" not in memo:
            cases = list(self.visible_cases())
            memo["visible"] = (cases, [self.expected(c) for c in cases])
        if hidden and "hidden" not in memo:
            cases = [dataclasses.replace(c, hidden=True) for c in self.hidden_cases()]
            memo["hidden"] = (cases, [self.expected(c) for c in cases])
        parts = [memo["visible"]] + ([memo["hidden"]] if hidden else [])
        return [c for cs, _ in parts for c in cs], [e for _, es in parts for e in es]


@dataclass
class Chapter:
    """A chapter's graded notebook: its exercises, the locked cells graded code may rely on, its quiz.

    ``slug`` names everything of the chapter (``ptinternals.course``): the nbgrader assignment and its
    notebook are ``<slug>``, exercise ids ``<slug>.<name>``. Exercise numbers ("1.4") are derived here
    from the book's order and the exercise's position, never written down.
    """

    slug: str
    exercises: list[Exercise]
    setup_cells: tuple[str, ...] = ("setup",)  # grade_ids of locked cells run before the answers
    quiz_grade_id: str | None = "quiz"
    sandbox_files: tuple[str, ...] = ()  # scaffolding modules graded code may import, e.g. "autograd/scaffold.py"
    policy_allow: tuple[str, ...] = ()  # private names (e.g. "_make_wrapper_subclass") a policy lets answers use
    # Reference-package files the student edition ships besides ``sandbox_files``: teaching helpers the
    # notebook demonstrates with that implement nothing graded (e.g. "allocator/config.py"). Anything
    # else of ``ptinternals/<slug>/`` stays out of the edition; notebook cells that need it are recorded.
    student_files: tuple[str, ...] = ()

    def __post_init__(self):
        from .. import course

        if self.slug not in course.SLUGS:
            raise ValueError(f"Chapter slug {self.slug!r} is not in ptinternals.course.CHAPTERS")
        self.number = course.number(self.slug)
        seen = set()
        for i, ex in enumerate(self.exercises, 1):
            if not ex.id.startswith(self.slug + ".") or ex.local_id in seen:
                raise ValueError(f"exercise id {ex.id!r} must be '{self.slug}.<name>' and unique in the chapter")
            seen.add(ex.local_id)
            ex.number = f"{self.number}.{i}"

    @property
    def assignment(self) -> str:
        """The nbgrader assignment id, which is also the notebook's name: the slug."""
        return self.slug

    def exercise(self, exercise_id: str) -> Exercise:
        for ex in self.exercises:
            if ex.id == exercise_id:
                return ex
        raise KeyError(f"{self.assignment} has no exercise {exercise_id!r}; known: {[e.id for e in self.exercises]}")


def load_chapter(name: str) -> Chapter:
    """The :class:`Chapter` of a slug ("strides") or an exercise id ("strides.view_strides"): its checks
    module ``ptinternals.checks.<slug>``. An old numbered name raises with the new one."""
    from ..course import slug_of

    return importlib.import_module(f"ptinternals.checks.{slug_of(name)}").CHAPTER


def graded_chapters() -> list[Chapter]:
    """Every chapter with graded exercises, in book order."""
    from ..course import SLUGS

    return [load_chapter(s) for s in SLUGS if importlib.util.find_spec(f"ptinternals.checks.{s}") is not None]


def get_exercise(exercise_id: str) -> Exercise:
    return load_chapter(exercise_id).exercise(exercise_id)


# ================================================================================================
# Judging results (shared by the notebook check and the trusted grader)
# ================================================================================================
@dataclass
class Outcome:
    exercise: str
    passed: bool
    n_cases: int
    n_failed: int = 0
    message: str = ""
    category: str = ""
    seconds: float = 0.0
    device: str = "cpu"

    def failure(self) -> CheckFailure:
        cls = NotImplementedYet if self.category == "not-implemented" else CheckFailure
        if cls is NotImplementedYet:
            return NotImplementedYet(self.message, exercise=self.exercise)
        return CheckFailure(self.message, exercise=self.exercise, category=self.category)


def _raised_matches(got: Raised, expected: Raises) -> bool:
    return got.type in expected.types or (got.type == "RuntimeError" and "RuntimeError" in expected.types)


def _judge_one(ex: Exercise, case: Case, got: Any, expected: Any) -> tuple[str, str] | None:
    """(category, description) of what is wrong with ``got``, or None when it is right."""
    if isinstance(got, Raised):
        if got.type == "NotImplementedError":
            return "not-implemented", ""
        if got.type == "ForbiddenModuleError":
            return "forbidden", got.message
        if got.type in ("ModuleNotFoundError", "ImportError") and any(
                re.search(rf"\b{m}\b", got.message) for m in ex.forbid):
            return "forbidden", f"your code imported a module this exercise is graded without: {got.message}"
        if isinstance(expected, Raises):
            return None if _raised_matches(got, expected) else (
                "wrong", f"expected {expected!r}\n     got {got.type}: {got.message}")
        return "error", f"your code raised {got.type}: {got.message}"
    if isinstance(expected, Raises):
        return "wrong", f"expected {expected!r}\n     got {describe(got)} (no exception)"
    if isinstance(got, Unsupported):
        return "unsupported", f"returned {got!r}; return plain ints, tuples, lists, floats or tensors"
    problem = ex.compare(case, got, expected)
    return None if problem is None else ("wrong", problem)


def evaluate(ex: Exercise, cases: list[Case], results: list[Any], expected: list[Any], *, device: str = "cpu",
             status: str = "ok", seconds: float = 0.0) -> Outcome:
    """Judge ``results`` (decoded from the student's run) against ``expected`` for every case."""
    n = len(cases)
    if status == "missing":
        return Outcome(ex.id, False, n, n, (f"{ex.name}: no `{ex.entry}` is defined. Write it in the answer cell "
                                            f"of {ex.name} (keep the name `{ex.entry}`) and run that cell."),
                       "missing", seconds, device)
    if status == "timeout":
        return Outcome(ex.id, False, n, n, (f"{ex.name}: ran past its time limit of {ex.timeout_s:g} s. Look for an "
                                            f"infinite loop, or work that grows much faster than the input."),
                       "timeout", seconds, device)
    if status == "memory":
        return Outcome(ex.id, False, n, n, (f"{ex.name}: ran out of memory (MemoryError) under the grader's memory "
                                            f"limit. Look for data that grows without bound."), "memory", seconds, device)
    failures = []
    for i, (case, got, exp) in enumerate(zip(cases, results, expected)):
        try:
            verdict = _judge_one(ex, case, got, exp)
        except Exception as e:  # noqa: BLE001 (a result the checker cannot read fails its case, never the grader)
            verdict = ("unsupported", f"the grader could not compare your result ({type(e).__name__}: {str(e)[:200]}): "
                                      f"got {describe(got)}")
        if verdict is not None:
            failures.append((i, case, got, exp, verdict))
    if len(results) < n and status == "ok":
        failures.append((len(results), cases[len(results)], None, expected[len(results)],
                         ("crashed", "the run stopped before reaching this case")))
    if status not in ("ok", "missing", "timeout") and not failures:
        failures.append((0, cases[0], None, expected[0], (status, f"the grader could not run your code ({status})")))
    if not failures:
        message = f"{ex.name}: all {n} cases passed"
        try:
            extra = ex.summary(cases, results)
        except Exception:  # a summary is a courtesy: it must never fail a passing exercise
            extra = None
        return Outcome(ex.id, True, n, 0, message + (f"\n{extra}" if extra else ""), "", seconds, device)

    if any(f[4][0] == "not-implemented" for f in failures) and all(f[4][0] == "not-implemented" for f in failures):
        return Outcome(ex.id, False, n, len(failures),
                       (f"{ex.name} is not implemented yet: replace `raise NotImplementedError()` in its answer "
                        f"cell with your code, run that cell, then run this check again."),
                       "not-implemented", seconds, device)
    # Report the simplest failing case (visible before hidden, then the shortest call): a cheap shrink.
    i, case, got, exp, (category, problem) = min(
        failures, key=lambda f: (f[1].hidden, len(f[1].call_text(ex.entry)), f[0]))
    kind = "hidden" if case.hidden else "visible"
    lines = [f"{ex.name} failed {len(failures)} of {n} cases. The simplest failing one ({kind}):"]
    if case.label:
        lines.append(f"  case:  {case.label}")
    lines.append(f"  call:  {case.call_text(ex.entry)}")
    lines += ["  " + line for line in problem.splitlines()]
    hint = None
    if category in ("wrong", "error"):
        try:
            hint = ex.diagnose(case, got, exp)
        except Exception:  # a diagnosis must never hide the failure itself
            hint = None
    elif category == "forbidden":
        hint = f"{ex.name} asks you to write the algorithm with plain Python; do not call {', '.join(ex.forbid)}."
    if hint:
        lines.append(f"  likely cause: {hint}")
    return Outcome(ex.id, False, n, len(failures), "\n".join(lines), category, seconds, device)


# ================================================================================================
# Instant feedback in the student's kernel (untrusted: the grade is recomputed in the sandbox)
# ================================================================================================
def run_in_process(ex: Exercise, entry: Callable, cases: list[Case], device: str = "cpu") -> tuple[list, str]:
    """Call ``entry`` on each case here, passing every value through the same encoding as the sandbox."""
    probe = _runtime._load_probe(ex.probe)
    globals_ = getattr(entry, "__globals__", None) or getattr(getattr(entry, "__init__", None), "__globals__", None)
    saved = {}
    if globals_ is not None:  # "forbid": the exercise's function sees stubs instead of those modules
        for name in ex.forbid:
            if name in globals_:
                saved[name] = globals_[name]
                globals_[name] = _runtime._Forbidden(name, ex.name)
    results = []
    try:
        for case in cases:
            arrays: dict = {}
            # Through JSON, as the sandbox reads its job.json: strings and large ints arrive as new objects,
            # so `fmt is "fp16"` fails here as it fails when graded (it used to pass here, on the case's own str).
            args = _runtime.decode(json.loads(json.dumps(_runtime.encode(case.args, arrays))), arrays, device=device)
            kwargs = _runtime.decode(json.loads(json.dumps(_runtime.encode(case.kwargs, arrays))), arrays,
                                     device=device)
            storages = _runtime.arg_storages(args, kwargs)
            got = _runtime.call_case(entry, args, kwargs, probe)
            out_arrays: dict = {}
            tree = _runtime.encode(got, out_arrays, {"arg_storages": storages})
            results.append(_runtime.decode(tree, out_arrays, to_torch=False))
    finally:
        if globals_ is not None:
            globals_.update(saved)
    return results, "ok"


def _defining_sources(entry) -> dict[str, str]:
    """``{file: source}`` of the cell(s) that defined ``entry`` (IPython registers each cell's source in
    linecache under the file name its code objects carry), for the static policy's instant feedback."""
    import linecache

    functions = [entry] if not isinstance(entry, type) else \
        [getattr(v, "__func__", v) for k in type.mro(entry) if k is not object for v in vars(k).values()]
    def is_cell(filename: str) -> bool:
        return filename.startswith("<") or "ipykernel" in filename

    own = [entry] if not isinstance(entry, type) else [getattr(v, "__func__", v) for v in vars(entry).values()]
    in_a_file = any(getattr(getattr(fn, "__code__", None), "co_filename", "<>")[:1] != "<" and
                    not is_cell(fn.__code__.co_filename) for fn in own if hasattr(fn, "__code__"))
    out = {}
    for fn in functions:
        code = getattr(fn, "__code__", None)
        if code is not None and code.co_filename not in out and is_cell(code.co_filename):
            lines = linecache.getlines(code.co_filename)
            if lines:
                out[code.co_filename] = "".join(lines)
    if not out and not in_a_file:  # a class with no method of its own (`class X(Base): pass`): the last cell
        # that defines the name (never for code that lives in a module file, such as the reference's twins)
        import re

        name = getattr(entry, "__name__", "")
        pattern = re.compile(rf"^(class|def)\s+{re.escape(name)}\b|^{re.escape(name)}\s*=", re.M)
        for filename, entry_lines in reversed(list(linecache.cache.items())):
            text = "".join(entry_lines[2]) if len(entry_lines) > 2 else ""
            if is_cell(str(filename)) and name and pattern.search(text):
                return {filename: text}
    return out


def check(exercise_id: str, entry: Callable, *, hidden: bool = False, device: str | None = None) -> None:
    """Check ``entry`` against an exercise's visible cases (and hidden ones with ``hidden=True``).

    Prints one line when every case passes; raises :class:`CheckFailure` (an ``AssertionError``)
    with a teaching message otherwise. Returns ``None``, as nbgrader reads a returned value as
    partial credit.
    """
    from ..device import pick_device

    ex = get_exercise(exercise_id)
    device = device or (pick_device() if ex.gpu else "cpu")
    if not callable(entry):
        raise CheckFailure(f"{ex.name}: expected the function/class `{ex.entry}`, got {describe(entry)}",
                           exercise=ex.id, category="missing")
    cases, expected = ex.cases_and_expected(hidden)  # expected: before the student's code touches the inputs
    t0 = time.perf_counter()
    results, status = run_in_process(ex, entry, cases, device)
    outcome = evaluate(ex, cases, results, expected, device=device, status=status, seconds=time.perf_counter() - t0)
    if not outcome.passed:  # wrong values first: the message that teaches (the source rules would say 0 too)
        raise outcome.failure()
    problem = ex.source_problem(_defining_sources(entry))
    if problem:  # right values, written in a way the grader refuses: it would score 0
        raise CheckFailure(problem, exercise=ex.id, category="forbidden")
    scope = "visible and hidden" if hidden else "visible"
    extra = outcome.message.split("\n", 1)[1] if "\n" in outcome.message else ""
    print(f"\u2713 {ex.name}: all {len(cases)} {scope} cases passed (ran on {device})" + (f"\n{extra}" if extra else ""))


__all__ = ["Case", "Chapter", "CheckFailure", "Exercise", "NotImplementedYet", "Outcome", "Raises", "TensorInfo",
           "check", "evaluate", "get_exercise", "graded_chapters", "load_chapter"]
