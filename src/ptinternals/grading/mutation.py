"""Mutation testing of the exercises: does each checker reject small changes to its own solution?

A bank of known bugs (``tests/<slug>/buggy.py``) holds only the bugs its author thought of. Here the
mutants are made by a library: cosmic-ray's mutation operators (``cosmic_ray.plugins``, applied with
``cosmic_ray.mutating.mutate_code``), plus one course operator written to cosmic-ray's ``Operator``
interface for what cosmic-ray leaves alone (augmented assignments: ``running *= size``).

What is mutated is an exercise's **answer cell as the sandbox sees it** (the solution notebook's cell),
only inside its ``### BEGIN SOLUTION`` / ``### END SOLUTION`` region. Each mutant is judged like
``grading.testing.rejects`` judges a known bug: the chapter's cells with the mutated one in its place,
then the exercise's checker on its visible cases, then on its hidden ones, in-process (in a worker
process, so that a mutant that loops forever only costs its time limit).

A cell that answers several exercises (the bank's ``ANSWER_CELL``: ``amp.amp_speed`` grades the cell of
``amp.amp_train``) is mutated once, under the exercise it is named after, and each mutant is judged by
every exercise that shares the cell: it is killed when any of their checkers fails it, as a student's
mistake there costs each of those exercises (``cell_plan``).

A mutant is **killed** (the checker fails it, or its cell raises), **survived** (the checker passes it),
**equivalent** (survived, and ``tests/<slug>/equivalent_mutants.yaml`` says why no input can tell it
from the solution) or **timeout** (ran past its limit: the grader's own time limit would fail it, so it
counts as killed). Its identity is stable under edits elsewhere in the cell: (exercise, operator, the
stripped text of the line it changes, its occurrence among mutants of that operator on lines with that
text), never a line number.

Used by ``bench/mutation.py`` (``make mutation CHAPTER=<slug>``), which writes the report.
"""
from __future__ import annotations

import builtins
import contextlib
import difflib
import io
import multiprocessing
import os
import re
import signal
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Iterable, Iterator

ROOT = Path(__file__).resolve().parents[3]
REGION = re.compile(r"^\s*### (BEGIN|END) SOLUTION\s*$")
KILLED, SURVIVED, EQUIVALENT, TIMEOUT = "killed", "survived", "equivalent", "timeout"


# ================================================================================================
# Operators
# ================================================================================================
def _augmented_assignment_operator():
    """cosmic-ray's operators change ``a * b`` but not ``a *= b``; this one does, as cosmic-ray's own
    operators do (an ``Operator`` subclass over parso's tree): each augmented assignment becomes a plain
    one (``running = size``: the accumulation forgotten) and its counterpart (``+=`` <-> ``-=``,
    ``*=`` -> ``+=``, the others -> ``*=``)."""
    import parso
    from cosmic_ray.operators.operator import Example, Operator

    swap = {"+=": "-=", "-=": "+=", "*=": "+=", "/=": "*=", "//=": "*=", "%=": "*=", "**=": "*=",
            "<<=": ">>=", ">>=": "<<=", "&=": "|=", "|=": "&=", "^=": "|=", "@=": "*="}

    class ReplaceAugmentedAssignment(Operator):
        def mutation_positions(self, node):
            if isinstance(node, parso.python.tree.Operator) and node.value in swap:
                for _ in range(2):
                    yield (node.start_pos, node.end_pos)

        def mutate(self, node, index):
            node.value = ("=", swap[node.value])[index]
            return node

        @classmethod
        def examples(cls):
            return (Example("x *= y", "x = y"), Example("x *= y", "x += y", occurrence=1))

    return ReplaceAugmentedAssignment


def operators() -> dict[str, object]:
    """``{name: operator instance}``: every cosmic-ray core operator that needs no configuration (its
    ``VariableReplacer``/``VariableInserter`` need cause and effect variables, so they are left out),
    and the course's ``course/ReplaceAugmentedAssignment``."""
    import cosmic_ray.plugins

    out = {}
    for name in cosmic_ray.plugins.operator_names():
        cls = cosmic_ray.plugins.get_operator(name)
        if not cls.arguments():
            out[name] = cls()
    out["course/ReplaceAugmentedAssignment"] = _augmented_assignment_operator()()
    return out


# ================================================================================================
# Mutants of an answer cell
# ================================================================================================
@dataclass(frozen=True)
class Mutant:
    exercise: str
    cell: str  # the answer cell's grade_id ("view_strides_code")
    operator: str  # "core/NumberReplacer"
    line: str  # the stripped text of the line the mutation starts on, in the solution
    occurrence: int  # among this operator's mutants on lines with this text, in source order
    lineno: int  # 1-based, in the cell (for people: it shifts when the cell changes)
    mutated: str  # the changed line(s) of the mutant, stripped
    source: str = field(repr=False)  # the whole mutated cell

    @property
    def key(self) -> tuple[str, str, str, int]:
        return (self.exercise, self.operator, self.line, self.occurrence)


def solution_lines(source: str) -> set[int]:
    """1-based numbers of the lines strictly inside the cell's solution regions (the whole cell when it
    has none)."""
    lines = source.splitlines()
    inside, out, marked = False, set(), False
    for i, text in enumerate(lines, 1):
        m = REGION.match(text)
        if m:
            marked, inside = True, m.group(1) == "BEGIN"
        elif inside:
            out.add(i)
    return out if marked else set(range(1, len(lines) + 1))


def _changed(original: str, mutated: str) -> str:
    a, b = original.splitlines(), mutated.splitlines()
    new = [line.strip() for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, a, b).get_opcodes() if tag != "equal"
           for line in b[j1:j2]]
    return " / ".join(new)


def _in_error_message(node) -> bool:
    """True inside the arguments of a ``raise``'s exception (``raise ValueError(f"dim {d - lead}")``): message
    text, which no checker reads (exercises are judged on values and exception types)."""
    inside_call = False
    while node is not None:
        if node.type in ("trailer", "fstring"):
            inside_call = True
        elif node.type == "raise_stmt":
            return inside_call
        elif node.type in ("funcdef", "classdef", "file_input"):
            return False
        node = node.parent
    return False


def mutants_of(exercise_id: str, source: str, cell: str, ops: dict | None = None,
               keys: set | None = None) -> list[Mutant]:
    """Every mutant of ``source`` (an answer cell) inside its solution region, one per operator position,
    without duplicates (two operators making the same code count once) and without those that only change
    an error message's text. ``keys``: make only the mutants with these keys (each one costs a parse)."""
    from cosmic_ray.ast import ast_nodes, get_ast
    from cosmic_ray.mutating import mutate_code

    region, lines = solution_lines(source), source.splitlines()
    ops = ops or operators()
    nodes = list(ast_nodes(get_ast(source)))  # one parse finds every position (finding does not change the tree)
    seen, out = {source}, []
    for name, op in ops.items():
        per_line: Counter = Counter()
        positions = [(start, node) for node in nodes for start, _ in op.mutation_positions(node)]
        for occurrence, ((lineno, _), node) in enumerate(positions):  # cosmic-ray's occurrence: tree order
            text = lines[lineno - 1].strip()
            nth = per_line[text]
            per_line[text] += 1
            if lineno not in region or _in_error_message(node) or (
                    keys is not None and (exercise_id, name, text, nth) not in keys):
                continue
            mutated = mutate_code(source, op, occurrence)
            if mutated is None or mutated in seen:
                continue
            seen.add(mutated)
            out.append(Mutant(exercise_id, cell, name, text, nth, lineno, _changed(source, mutated), mutated))
    return out


def answer_cell(exercise_id: str) -> str:
    """The grade_id of the answer cell holding ``exercise_id``'s solution (the bank's ``ANSWER_CELL`` may
    name another one, as when two exercises share a cell)."""
    from .exercise import get_exercise

    slug = exercise_id.split(".", 1)[0]
    return getattr(bank(slug), "ANSWER_CELL", {}).get(exercise_id) or get_exercise(exercise_id).answer_cell


def cell_plan(slug: str, exercises: list[str] | None = None) -> dict[str, tuple[str, list[str]]]:
    """``{owner: (cell, judges)}``: the answer cells to mutate for ``exercises`` (all of the chapter's when
    None), each once, under its owner (the exercise the cell is named after, else the first that uses it),
    with ``judges``, the chapter's other exercises whose answer is that cell (in the chapter's order)."""
    from .exercise import load_chapter

    chapter = load_chapter(slug)
    all_ids = [ex.id for ex in chapter.exercises]
    sharers: dict[str, list[str]] = {}
    for i in all_ids:
        sharers.setdefault(answer_cell(i), []).append(i)
    plan: dict[str, tuple[str, list[str]]] = {}
    for i in exercises or all_ids:
        cell = answer_cell(i)
        owner = next((j for j in sharers[cell] if chapter.exercise(j).answer_cell == cell), sharers[cell][0])
        plan.setdefault(owner, (cell, [j for j in sharers[cell] if j != owner]))
    return plan


def exercise_mutants(exercise_id: str, keys: set | None = None) -> list[Mutant]:
    """The mutants of an exercise's solution cell (only those with ``keys``, when given)."""
    from .testing import answer_sources

    cell = answer_cell(exercise_id)
    return mutants_of(exercise_id, answer_sources(exercise_id.split(".", 1)[0])[cell], cell, keys=keys)


def bank(slug: str):
    """The chapter's test module ``tests/<slug>/buggy.py`` (its ``SLOW_HIDDEN`` and ``ANSWER_CELL``)."""
    import importlib
    import sys

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(f"tests.{slug}.buggy")


# ================================================================================================
# Equivalent mutants: tests/<slug>/equivalent_mutants.yaml
# ================================================================================================
def equivalents_path(slug: str) -> Path:
    return ROOT / "tests" / slug / "equivalent_mutants.yaml"


def load_equivalents(slug: str) -> dict[tuple[str, str, str, int], str]:
    """``{mutant key: reason}`` from the chapter's equivalents file (empty when there is none).

    The file maps exercise ids to lists of ``{operator, line, occurrence, mutant, reason}``; ``mutant``
    (the changed line) is for the reader and is checked against the mutant, so a stale entry shows.
    """
    import yaml

    path = equivalents_path(slug)
    if not path.exists():
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    out = {}
    for exercise_id, entries in data.items():
        for e in entries or ():
            missing = {"operator", "line", "reason"} - set(e)
            if missing or not str(e["reason"]).strip():
                raise ValueError(f"{path.name}: an entry of {exercise_id} lacks {sorted(missing) or ['a reason']}: {e}")
            out[(exercise_id, e["operator"], str(e["line"]).strip(), int(e.get("occurrence", 0)))] = e
    return out


def stale_equivalents(slug: str, mutants: Iterable[Mutant]) -> list[str]:
    """Entries of the equivalents file that name no mutant of today's solution (or another change)."""
    by_key = {m.key: m for m in mutants}
    stale = []
    for key, e in load_equivalents(slug).items():
        m = by_key.get(key)
        if m is None:
            stale.append(f"{key[0]}: no {key[1]} mutant #{key[3]} of line {key[2]!r}")
        elif "mutant" in e and str(e["mutant"]).strip() != m.mutated:
            stale.append(f"{key[0]}: {key[1]} #{key[3]} of {key[2]!r} now makes {m.mutated!r}, not {e['mutant']!r}")
    return stale


# ================================================================================================
# Judging one mutant (in a worker process)
# ================================================================================================
class MutantTimeout(BaseException):
    """Raised by the worker's alarm; a BaseException so the mutant's ``except Exception`` cannot catch it."""


@dataclass
class Verdict:
    status: str  # killed, survived or timeout (equivalent is decided by the parent, from the file)
    phase: str = ""  # what killed it: "cell" (the cell raised), "visible", "hidden"
    category: str = ""  # the CheckFailure's category (wrong, error, ...), or the cell's exception type
    seconds: float = 0.0
    message: str = ""  # the first line of the failure
    exercise: str = ""  # whose checker killed it (one of several when the cell is shared)


def _on_alarm(signum, frame):
    raise MutantTimeout()


def judge(exercise_id: str, cell: str, source: str, *, visible_only: bool = False, limit_s: float = 0.0,
          judges: Iterable[tuple[str, bool]] = ()) -> Verdict:
    """Run the exercise's checker on the chapter's cells with ``source`` in place of ``cell``; ``judges``:
    ``(exercise_id, visible_only)`` of the other exercises that grade the same cell, whose checkers run too
    (every visible run first, then the hidden ones)."""
    from .exercise import CheckFailure, check, get_exercise
    from .testing import namespace_with

    checkers = [(get_exercise(exercise_id), visible_only)] + [(get_exercise(j), v) for j, v in judges]
    t0 = time.perf_counter()
    if limit_s:
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                ns = namespace_with(exercise_id.split(".", 1)[0], {cell: source})
            except Exception as e:  # the mutated cell raises: the notebook (and the grade) fails there
                return Verdict(KILLED, "cell", type(e).__name__, time.perf_counter() - t0, str(e).split("\n")[0][:200])
            for phase in ("visible", "hidden"):
                for ex, only_visible in checkers:
                    if phase == "hidden" and only_visible:
                        continue
                    try:
                        check(ex.id, ns[ex.entry], hidden=phase == "hidden")
                    except CheckFailure as failure:
                        return Verdict(KILLED, phase, failure.category, time.perf_counter() - t0,
                                       str(failure).split("\n")[0][:200], ex.id)
        return Verdict(SURVIVED, seconds=time.perf_counter() - t0)
    except MutantTimeout:
        return Verdict(TIMEOUT, seconds=time.perf_counter() - t0, message=f"ran past {limit_s:g} s")
    finally:
        if limit_s:
            signal.setitimer(signal.ITIMER_REAL, 0)


def _worker(conn) -> None:
    """A worker process: judge what the parent sends until it sends None."""
    import torch

    if not torch.cuda.is_available():  # as tests/conftest.py: Triton's interpreter on a CPU machine
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from cosmic_ray.exceptions import CosmicRayTestingException

    # cosmic-ray's ExceptionReplacer writes `except CosmicRayTestingException:`: a handler that catches nothing.
    builtins.CosmicRayTestingException = CosmicRayTestingException
    while True:
        task = conn.recv()
        if task is None:
            return
        kind, args, kwargs = task
        try:
            if kind == "warm":  # the solution itself: computes and caches the cases, and times a clean run
                first = judge(*args, **kwargs)
                conn.send(judge(*args, **kwargs) if first.status == SURVIVED else first)
            else:
                conn.send(judge(*args, **kwargs))
        except BaseException as e:  # never leave the parent waiting
            conn.send(Verdict(KILLED, "worker", type(e).__name__, 0.0, str(e)[:200]))


# ================================================================================================
# A pool of worker processes with a hard time limit per mutant
# ================================================================================================
@dataclass
class Job:
    mutant: Mutant
    visible_only: bool = False
    judges: tuple = ()  # (exercise_id, visible_only) of the other exercises sharing the mutant's cell


class Pool:
    """``jobs`` worker processes (spawned: each imports torch once). Each mutant runs under a soft limit
    (an alarm in the worker) and a hard one (the parent kills the worker ``grace_s`` later and starts a
    new one): a mutant stuck in C code cannot hang the run."""

    def __init__(self, jobs: int = 2, grace_s: float = 10.0):
        self.ctx = multiprocessing.get_context("spawn")
        self.jobs, self.grace_s = max(1, jobs), grace_s
        self.workers: list[dict] = []

    def __enter__(self):
        self.workers = [self._start() for _ in range(self.jobs)]
        return self

    def __exit__(self, *exc):
        for w in self.workers:
            with contextlib.suppress(Exception):
                w["conn"].send(None)
        for w in self.workers:
            w["proc"].join(5)
            if w["proc"].is_alive():
                w["proc"].kill()

    def _start(self) -> dict:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, args=(child,), daemon=True)
        proc.start()
        child.close()
        return {"proc": proc, "conn": parent, "warm": {}, "job": None, "deadline": None}

    def _restart(self, w: dict) -> None:
        w["proc"].kill()
        w["proc"].join()
        w.update(self._start())

    def warm(self, w: dict, exercise_id: str, cell: str, source: str, visible_only: bool,
             judges: tuple = ()) -> Verdict:
        """Judge the unmutated solution in worker ``w`` (blocking): it must pass. Returns its verdict."""
        if exercise_id not in w["warm"]:
            w["conn"].send(("warm", (exercise_id, cell, source), {"visible_only": visible_only, "judges": judges}))
            w["warm"][exercise_id] = w["conn"].recv()
        return w["warm"][exercise_id]

    def run(self, jobs: list[Job], limits: dict[str, float], solutions: dict[str, str]) -> Iterator[tuple[Job, Verdict]]:
        """Judge every job, yielding ``(job, verdict)`` as they finish. ``limits``: the soft limit of each
        exercise's mutants; ``solutions``: each exercise's unmutated cell (to warm a fresh worker)."""
        pending = list(reversed(jobs))
        while pending or any(w["job"] for w in self.workers):
            for w in self.workers:
                if w["job"] is None and pending:
                    job = pending.pop()
                    m = job.mutant
                    self.warm(w, m.exercise, m.cell, solutions[m.exercise], job.visible_only, job.judges)
                    limit = limits[m.exercise]
                    w["conn"].send(("judge", (m.exercise, m.cell, m.source),
                                    {"visible_only": job.visible_only, "limit_s": limit, "judges": job.judges}))
                    w["job"], w["deadline"] = job, time.monotonic() + limit + self.grace_s
            busy = [w for w in self.workers if w["job"]]
            ready = wait([w["conn"] for w in busy], timeout=1.0)
            for w in busy:
                job = w["job"]
                if w["conn"] in ready:
                    try:
                        verdict = w["conn"].recv()
                    except EOFError:  # the worker died (a crash in C, out of memory): the mutant killed it
                        verdict = Verdict(KILLED, "worker", "crashed", 0.0, "the worker process died")
                        self._restart(w)
                elif time.monotonic() > w["deadline"]:
                    verdict = Verdict(TIMEOUT, seconds=limits[job.mutant.exercise] + self.grace_s,
                                      message="killed by the hard time limit")
                    self._restart(w)
                else:
                    continue
                w["job"] = None
                yield job, verdict


# ================================================================================================
# A chapter's run
# ================================================================================================
@dataclass
class ExerciseResult:
    exercise: str
    mutants: int = 0
    killed: int = 0
    survived: int = 0
    equivalent: int = 0
    timeouts: int = 0
    killed_by: dict = field(default_factory=dict)  # phase -> count ("visible", "hidden", "cell", "worker")
    shared_with: list = field(default_factory=list)  # the other exercises judging this cell's mutants
    killed_first_by: dict = field(default_factory=dict)  # sharing exercise -> mutants its checker failed first
    counted_under: str = ""  # another exercise owns this one's answer cell: its mutants are counted there
    visible_only: bool = False
    baseline_s: float = 0.0
    limit_s: float = 0.0
    seconds: float = 0.0
    error: str = ""  # the unmutated solution failed its own check: nothing was judged

    @property
    def score(self) -> float | None:
        """Killed (timeouts included) over non-equivalent mutants."""
        judged = self.mutants - self.equivalent
        return (self.killed + self.timeouts) / judged if judged else None


@dataclass
class Record:
    mutant: Mutant
    verdict: Verdict
    reason: str = ""  # for an equivalent mutant: why, from the equivalents file


def run_chapter(slug: str, *, exercises: list[str] | None = None, jobs: int = 2, timeout_factor: float = 10.0,
                min_timeout_s: float = 5.0, progress=None) -> dict:
    """Mutation-test the chapter's exercises (all, or ``exercises``); return the report as a dict.

    ``progress``: a callable ``(n_total) -> bar`` with ``update(1)``/``set_postfix_str``/``close`` (tqdm).
    """
    from .exercise import load_chapter
    from .testing import answer_sources

    chapter = load_chapter(slug)
    order = [ex.id for ex in chapter.exercises]
    plan = cell_plan(slug, exercises)
    ids = [i for i in order if i in set(exercises or order) | set(plan)]  # the report's rows
    sources = answer_sources(slug)
    ops = operators()
    by_exercise = {i: mutants_of(i, sources[cell], cell, ops) for i, (cell, _) in plan.items()}
    results = new_results(ids, plan, {i: len(ms) for i, ms in by_exercise.items()})
    t0 = time.perf_counter()
    records = judge_all(slug, plan, by_exercise, results, jobs=jobs, timeout_factor=timeout_factor,
                        min_timeout_s=min_timeout_s, progress=progress)
    all_mutants = [m for ms in by_exercise.values() for m in ms]
    return report(slug, ids, results, records, stale_equivalents(slug, all_mutants) if exercises is None else [],
                  jobs=jobs, seconds=time.perf_counter() - t0, operator_names=list(ops),
                  regions={i: region_hash(sources[cell]) for i, (cell, _) in plan.items()})


def new_results(ids, plan, counts: dict[str, int]) -> dict[str, ExerciseResult]:
    """An empty ``ExerciseResult`` per report row, with its mutant count and who shares its cell."""
    results = {i: ExerciseResult(i, counts.get(i, 0)) for i in ids}
    for owner, (_, others) in plan.items():
        results[owner].shared_with = list(others)
        for j in others:
            if j in results:
                results[j].counted_under = owner
    return results


def tally(r: ExerciseResult, m: Mutant, verdict: Verdict, equivalents: dict) -> Record:
    """Count one verdict in its exercise's row (a survivor listed in the equivalents file is equivalent)."""
    r.seconds += verdict.seconds
    reason = ""
    if verdict.status == SURVIVED and m.key in equivalents:
        verdict.status, reason = EQUIVALENT, str(equivalents[m.key]["reason"]).strip()
    if verdict.status == KILLED:
        r.killed += 1
        r.killed_by[verdict.phase] = r.killed_by.get(verdict.phase, 0) + 1
        if verdict.exercise and verdict.exercise != m.exercise:
            r.killed_first_by[verdict.exercise] = r.killed_first_by.get(verdict.exercise, 0) + 1
    elif verdict.status == SURVIVED:
        r.survived += 1
    elif verdict.status == EQUIVALENT:
        r.equivalent += 1
    else:
        r.timeouts += 1
    if m.key in equivalents and verdict.status == KILLED:
        reason = "listed as equivalent, but killed: remove it from the equivalents file"
    return Record(m, verdict, reason)


def judge_all(slug: str, plan, by_exercise: dict[str, list[Mutant]], results: dict[str, ExerciseResult], *,
              jobs: int, timeout_factor: float, min_timeout_s: float, progress=None) -> list[Record]:
    """Judge ``by_exercise``'s mutants in a pool of ``jobs`` workers, counting each verdict in ``results``: each
    cell's unmutated solution first (it must pass; its time sets the mutants' limit)."""
    from .testing import answer_sources

    slow = set(getattr(bank(slug), "SLOW_HIDDEN", ()))
    sources = answer_sources(slug)
    equivalents = load_equivalents(slug)
    judges = {i: tuple((j, j in slow) for j in others) for i, (_, others) in plan.items()}
    for i in results:
        results[i].visible_only = i in slow
    records: list[Record] = []
    bar = progress(sum(len(ms) for ms in by_exercise.values())) if progress else None
    with Pool(jobs) as pool:
        limits, solutions, todo = {}, {}, []
        for i, (cell, _) in plan.items():  # warm one worker per cell to learn its clean time (others on demand)
            if i not in by_exercise:  # an incremental run: nothing of this cell to judge again
                continue
            solutions[i] = sources[cell]
            base = pool.warm(pool.workers[0], i, cell, sources[cell], i in slow, judges[i])
            r = results[i]
            if base.status != SURVIVED:
                r.error = f"the solution fails its own check: {base.status} {base.phase} {base.message}"
                if bar:
                    bar.update(len(by_exercise[i]))
                continue
            r.baseline_s = base.seconds
            r.limit_s = limits[i] = max(min_timeout_s, timeout_factor * base.seconds)
            todo += [Job(m, i in slow, judges[i]) for m in by_exercise[i]]
        for job, verdict in pool.run(todo, limits, solutions):
            records.append(tally(results[job.mutant.exercise], job.mutant, verdict, equivalents))
            if bar:
                bar.update(1)
                bar.set_postfix_str(f"{job.mutant.exercise.split('.', 1)[1]}: "
                                    f"{sum(x.survived for x in results.values())} survived")
    if bar:
        bar.close()
    return records


def region_hash(source: str) -> str:
    """sha256 of the lines of an answer cell's solution regions: the text its mutants are edits of."""
    import hashlib

    lines = source.splitlines()
    return hashlib.sha256("\n".join(lines[i - 1] for i in sorted(solution_lines(source))).encode()).hexdigest()


def report(slug, ids, results, records, stale, *, jobs, seconds, operator_names, regions=None,
           incremental=None) -> dict:
    import importlib.metadata as md

    order = {i: k for k, i in enumerate(ids)}
    records.sort(key=lambda r: (order[r.mutant.exercise], r.mutant.lineno, r.mutant.operator, r.mutant.occurrence))
    per_ex = []
    for i in ids:
        r = results[i]
        d = asdict(r)
        d.update(score=r.score, baseline_s=round(r.baseline_s, 4), limit_s=round(r.limit_s, 1),
                 seconds=round(r.seconds, 2))
        per_ex.append(d)
    total = ExerciseResult("total", *(sum(getattr(results[i], f) for i in ids)
                                      for f in ("mutants", "killed", "survived", "equivalent", "timeouts")))
    return {
        "schema": 1,
        "chapter": slug,
        "date": time.strftime("%Y-%m-%d"),
        "library": f"cosmic-ray {md.version('cosmic-ray')}",
        "operators": len(operator_names),
        "jobs": jobs,
        "seconds": round(seconds, 1),
        "total": {**{k: v for k, v in asdict(total).items() if k in ("mutants", "killed", "survived", "equivalent",
                                                                     "timeouts")}, "score": total.score},
        "exercises": per_ex,
        "stale_equivalents": stale,
        **({"regions": regions} if regions else {}),  # owner exercise -> region_hash of its answer cell
        **({"incremental": incremental} if incremental else {}),
        "mutants": [_row(r) for r in records],
    }


def _row(r: Record) -> dict:
    """One mutant of the report: empty fields left out (a killed mutant has no message or reason)."""
    row = {"exercise": r.mutant.exercise, "operator": r.mutant.operator, "line": r.mutant.line,
           "occurrence": r.mutant.occurrence, "lineno": r.mutant.lineno, "mutant": r.mutant.mutated,
           "status": r.verdict.status, "phase": r.verdict.phase, "category": r.verdict.category,
           "seconds": round(r.verdict.seconds, 3), "message": "" if r.verdict.status == KILLED else r.verdict.message,
           "killed_by": r.verdict.exercise if r.verdict.exercise != r.mutant.exercise else "", "reason": r.reason}
    return {k: v for k, v in row.items() if v != ""}


def to_json(rep: dict) -> str:
    """The report as JSON: the summary indented, then one line per mutant (so diffs between runs read)."""
    import json

    head = json.dumps({k: v for k, v in rep.items() if k != "mutants"}, indent=1)
    rows = ",\n".join("  " + json.dumps(m) for m in rep["mutants"])
    return head[:-2] + ',\n "mutants": [\n' + rows + "\n ]\n}\n"


def markdown(rep: dict) -> str:
    """The report as a page: per-exercise numbers, then every survivor, equivalent and timeout."""
    pct = lambda s: "n/a" if s is None else f"{100 * s:.1f}%"
    lines = [f"# Mutation testing: {rep['chapter']} ({rep['date']})", "",
             f"{rep['library']}, {rep['operators']} operators, over each exercise's solution region; "
             f"{rep['jobs']} worker processes, {rep['seconds']:.0f} s in all. A timeout counts as killed; the "
             f"score is killed / (mutants - equivalent). Produced by "
             + (f"`python bench/mutation.py --survivors-from {rep['incremental']['from'].split(' (')[0]}`."
                if rep.get("incremental") else f"`make mutation CHAPTER={rep['chapter']}`."), "",
             "| exercise | mutants | killed (visible / hidden / cell) | survived | equivalent | timeouts | score |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    if rep.get("incremental"):
        inc = rep["incremental"]
        lines[2:2] = [f"**An incremental run**, not a full one: only the {inc['retested']} mutants that survived (or were "
                      f"recorded equivalent) in `{inc['from']}` were judged again, in {rep['seconds']:.0f} s; the other "
                      f"{inc['carried']} verdicts (killed or timed out) are carried over from it. The full run they come "
                      f"from: `{inc['full_run']['report']}` ({inc['full_run']['date']}, {inc['full_run']['seconds']:.0f} s). "
                      f"{inc['why']}", ""]
    for e in rep["exercises"]:
        by = e["killed_by"]
        note = " (visible cases only)" if e["visible_only"] else ""
        if e.get("shared_with"):
            first = ", ".join(f"{n} first by {j}" for j, n in e["killed_first_by"].items())
            note += f" (cell shared: also judged by {', '.join(e['shared_with'])}{'; ' + first if first else ''})"
        if e.get("counted_under"):
            note += f" (shares the answer cell of {e['counted_under']}: its mutants are counted there, judged by both)"
        lines.append(f"| {e['exercise']}{note} | {e['mutants']} | {e['killed']} ({by.get('visible', 0)} / "
                     f"{by.get('hidden', 0)} / {by.get('cell', 0) + by.get('worker', 0)}) | {e['survived']} | "
                     f"{e['equivalent']} | {e['timeouts']} | {pct(e['score'])} |"
                     + (f"\n\n**{e['exercise']}: {e['error']}**\n" if e["error"] else ""))
    t = rep["total"]
    lines.append(f"| **total** | {t['mutants']} | {t['killed']} | {t['survived']} | {t['equivalent']} | "
                 f"{t['timeouts']} | {pct(t['score'])} |")
    for status, title in ((SURVIVED, "Survivors"), (EQUIVALENT, "Equivalent (tests/{}/equivalent_mutants.yaml)"),
                          (TIMEOUT, "Timeouts")):
        rows = [m for m in rep["mutants"] if m["status"] == status]
        if not rows:
            continue
        lines += ["", f"## {title.format(rep['chapter'])}", ""]
        for m in rows:
            why = f": {m['reason']}" if m.get("reason") else ""
            lines.append(f"- `{m['exercise']}` line {m['lineno']} `{m['line']}` -> `{m.get('mutant', '')}` "
                         f"({m['operator']} #{m['occurrence']}){why}")
    odd = [m for m in rep["mutants"] if m.get("reason", "").startswith("listed as equivalent")]
    if rep["stale_equivalents"] or odd:
        lines += ["", "## Stale equivalents file entries", ""]
        lines += [f"- {s}" for s in rep["stale_equivalents"]]
        lines += [f"- `{m['exercise']}` `{m['line']}` -> `{m.get('mutant', '')}`: {m['reason']}" for m in odd]
    return "\n".join(lines) + "\n"
