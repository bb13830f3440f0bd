"""The built book: builds with no warnings, renders offline, answers quiz clicks, leaks no solution."""
import re
from pathlib import Path

import nbformat
import pytest
import yaml

from .conftest import ROOT

pytestmark = [pytest.mark.slow]


def toc_chapters() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [c["file"] for part in toc["parts"] for c in part["chapters"] if c["file"].startswith("notebooks/")]


REGION = re.compile(r"### BEGIN (?:SOLUTION|HIDDEN TESTS)(.*?)### END (?:SOLUTION|HIDDEN TESTS)", re.S)


def _public_text() -> str:
    """Everything outside solution and hidden-test regions, in every chapter, and the scaffolds handed to
    students (a notebook may print one, e.g. the model a bug hunt starts from): public by design.

    Markdown is added with its line breaks folded too, as the rendered page shows a wrapped line."""
    texts = []
    for path in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            texts.append(REGION.sub("", cell.source))
            if cell.cell_type == "markdown":
                texts.append(" ".join(cell.source.split()))
    texts += [p.read_text() for p in sorted((ROOT / "src" / "ptinternals").glob("*/scaffold.py"))]
    texts += [p.read_text() for p in _printed_modules()]
    texts += _quiz_questions()
    return "\n".join(texts)


def _quiz_questions() -> list[str]:
    """Every quiz question's text and options (a page shows a graded question as plain HTML): public.
    Keys, hints and explanations are not added, so solution code quoted there still counts as a leak."""
    texts = []
    for path in sorted((ROOT / "solutions" / "quizzes").glob("*.yaml")):
        bank = yaml.safe_load(path.read_text())
        for q in bank.get("questions", []) if isinstance(bank, dict) else bank:
            texts.append(str(q.get("text", "")))
            texts += [str(o) for o in q.get("options", []) or []]
    return texts


def _printed_modules() -> list[Path]:
    """The course modules defining what a notebook prints with ``inspect.getsource(name)`` (the code an
    exercise starts from, e.g. the training loop with hidden syncs): shown on purpose."""
    names = set()
    for source in sorted((ROOT / "solutions").glob("*.py")):
        names |= set(re.findall(r"getsource\((\w+)\)", source.read_text()))
    found = []
    for path in sorted((ROOT / "src" / "ptinternals").rglob("*.py")):
        text = path.read_text()
        if any(re.search(rf"^(?:def|class) {name}\b", text, re.M) for name in names):
            found.append(path)
    return found


def solution_lines(assignment: str) -> list[str]:
    """Distinctive lines of solution code and hidden tests: lines that occur only inside those regions
    (a line such as `ctx.save_for_backward(x)` that a demo in any chapter shows is public, not a leak)."""
    nb = nbformat.read(ROOT / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    public = _public_text()
    lines = []
    for cell in nb.cells:
        for block in REGION.findall(cell.source):
            for line in block.splitlines():
                text = line.strip()
                if len(text) >= 24 and not text.startswith("#") and text not in public:
                    lines.append(text)
    return lines


def page_text(html_path: Path) -> str:
    import html as html_lib

    return html_lib.unescape(re.sub(r"<[^>]+>", "", html_path.read_text()))


def test_every_toc_chapter_is_built(built_book):
    chapters = toc_chapters()
    assert chapters, "no chapter in _toc.yml"
    for chapter in chapters:
        assert (built_book / f"{chapter}.html").exists(), chapter


def test_no_solution_text_anywhere_in_the_book(built_book):
    pages = {p: page_text(p) for p in built_book.rglob("*.html")}
    sources = list((built_book / "_sources").rglob("*")) if (built_book / "_sources").exists() else []
    for path in sources:
        if path.is_file():
            pages[path] = path.read_text(errors="replace")
    for chapter in toc_chapters():
        assignment = Path(chapter).name
        lines = solution_lines(assignment)
        assert lines, f"{assignment}: found no solution lines to look for"
        for path, text in pages.items():
            assert "BEGIN SOLUTION" not in text and "BEGIN HIDDEN TESTS" not in text, path
            leaked = [line for line in lines if line in text]
            assert not leaked, f"{path} contains solution code of {assignment}: {leaked[:3]}"


def test_student_notebooks_fail_only_with_not_implemented(built_book):
    # The book's execution cache holds each student notebook as it ran, outputs included (the pages
    # themselves hide the check cells' outputs).
    from jupyter_cache import get_cache

    cache = get_cache(str(ROOT / "_build" / ".jupyter_cache"))
    executed = {Path(r.uri).resolve(): r.pk for r in cache.list_cache_records()}
    for chapter in toc_chapters():
        path = (ROOT / f"{chapter}.ipynb").resolve()
        assert path in executed, f"{chapter} was not executed by the book build"
        nb = cache.get_cache_bundle(executed[path]).nb
        checks = 0
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            errors = [o for o in cell.outputs if o.output_type == "error"]
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("grade") and meta.get("grade_id", "").endswith("_tests"):
                checks += 1
                assert errors and errors[0].ename == "NotImplementedYet", (chapter, meta["grade_id"], errors)
                assert "is not implemented yet" in errors[0].evalue
            else:
                assert not errors, (chapter, meta.get("grade_id"), [e.evalue[:300] for e in errors])
        assert checks >= 6, f"{chapter}: only {checks} check cells"


def test_pages_render_offline_with_figures(built_book, book_server, browser):
    for chapter in ["book/intro", *toc_chapters()]:
        page = browser.new_page()
        requests = []
        page.on("request", lambda r, seen=requests: seen.append(r.url))
        page.goto(f"{book_server}/{chapter}.html", wait_until="networkidle")
        assert "PyTorch Internals" in page.title()
        foreign = [u for u in requests if not u.startswith(book_server) and not u.startswith("data:")]
        assert not foreign, f"{chapter} fetched from the network: {foreign}"
        if chapter.startswith("notebooks/"):
            assert page.locator(".cell_output img").count() >= 1, f"{chapter} shows no figure"
            assert page.locator(".MCButton, .Input-text").count() >= 1, f"{chapter} shows no quiz"
        page.close()


def test_quiz_answers_a_click_without_a_kernel(built_book, book_server, browser):
    page = browser.new_page()
    page.goto(f"{book_server}/notebooks/strides/strides.html", wait_until="networkidle")
    quiz = page.locator(".Quiz").filter(has_text="Which statement is true").first
    wrong = quiz.locator(".MCButton").filter(has_text="is a copy with strides")
    wrong.click()
    assert "Not quite" in quiz.locator(".Feedback").inner_text()
    right = quiz.locator(".MCButton").filter(has_text="shares")
    right.click()
    assert "Correct" in quiz.locator(".Feedback").inner_text()
    page.close()


def test_exercises_show_as_tasks(built_book):
    text = page_text(built_book / "notebooks" / "strides" / "strides.html")
    assert text.count("raise NotImplementedError()") >= 8
    assert "check(\"strides.view_strides\", view_strides)" in text or "check(&quot;" in text or "strides.view_strides" in text
