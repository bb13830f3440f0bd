"""Showing quiz questions: ipywidgets in JupyterLab, a static self-check in the built book.

``show_quiz("strides", "q1", "q2")`` displays those questions.

* In a live kernel (JupyterLab), each question is an ipywidgets form that records every attempt
  beside the notebook (``<chapter>.answers.json``).
  A **practice** question's "Check" tells right or wrong at once (comparing salted hashes, so no
  plain key sits in the notebook) and reveals the explanation when right (it is encrypted with the
  right answer); practice counts no points.
  A **graded** question's "Save answer" only records it (the last answer counts): the student
  edition has no key to check it with, and the result comes with the feedback after grading. In
  the full repository, which holds the instructor's key, it also says right or wrong (self-study).
* When the book is built (``PTINTERNALS_STATIC_BOOK=1``, set by ``make book``), practice questions
  become a self-contained HTML + JavaScript quiz rendered by jupyterquiz, which works with no kernel
  and no network. That needs the plain-text answers, read from the instructor-side source
  ``solutions/quizzes/<chapter>.yaml``; they are base64-encoded in the page (a self-check, not a
  secret). Graded questions are shown without any answer: "answer it in the notebook".
"""
from __future__ import annotations

import base64
import html
import json
import os
import re
import uuid

from .answers import answers_path, progress, record_answer
from .bank import Question, load_answer_key, load_bank, source_path

STATIC_ENV = "PTINTERNALS_STATIC_BOOK"


def _inline_md(text: str) -> str:
    """`code` -> <code>, **bold** -> <b>; everything else escaped."""
    out = html.escape(text)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)


def show_quiz(chapter: str, *question_ids: str):
    """Display questions of ``chapter`` (all of them when no id is given)."""
    bank = load_bank(chapter)
    questions = [bank.question(q) for q in question_ids] if question_ids else bank.questions
    if os.environ.get(STATIC_ENV) == "1":
        return StaticQuiz(chapter, [q.id for q in questions])
    from IPython.display import display

    display(_widget_quiz(bank, questions))
    return None


# ---- JupyterLab: ipywidgets -------------------------------------------------------------------------
def _widget_quiz(bank, questions):
    import ipywidgets as w

    boxes = []
    for q in questions:
        boxes.append(_widget_question(bank, q, w))
    return w.VBox(boxes, layout=w.Layout(border="1px solid #ccc", padding="8px", margin="8px 0"))


def _widget_question(bank, q: Question, w):
    prompt = w.HTML(f"<b>{q.id}.</b> {_inline_md(q.text)}")
    if q.kind == "mc":
        field = w.RadioButtons(options=[(_plain(o), i) for i, o in enumerate(q.options)], value=None,
                               layout=w.Layout(width="auto"))
        read = lambda: field.value  # noqa: E731
    elif q.kind == "many":
        checks = [w.Checkbox(description=_plain(o), value=False, indent=False) for o in q.options]
        field = w.VBox(checks)
        read = lambda: [i for i, c in enumerate(checks) if c.value]  # noqa: E731
    else:
        field = w.Text(placeholder="your answer", layout=w.Layout(width="320px"))
        read = lambda: field.value  # noqa: E731
    button = w.Button(description="Save answer" if q.graded else "Check", button_style="primary")
    feedback = w.HTML("<i>Graded question: your answer is recorded (the last one counts) and scored when your "
                      "notebook is graded.</i>" if q.graded else "")

    def on_check(_):
        answer = read()
        if answer is None or answer == "" or answer == []:
            feedback.value = "<span style='color:#a60'>Choose or type an answer first.</span>"
            return
        try:
            canonical = record_answer(bank.chapter, q.id, q.kind, answer)
        except OSError as e:  # e.g. a read-only folder: practice feedback still works, grading cannot
            feedback.value = f"<span style='color:#a00'>Could not record your answer ({html.escape(str(e))}).</span>"
            if q.graded:
                return
            canonical = None
        if q.graded:
            feedback.value = (f"<span style='color:#046'>&#10003; Recorded: {html.escape(str(canonical))}.</span> "
                              f"<i>Graded question: you can change your answer until you submit (the last one "
                              f"counts); the result comes with your feedback.</i>{_self_study(bank.chapter, q, canonical)}")
        elif q.is_correct(bank.salt, answer):
            feedback.value = (f"<span style='color:#080'>&#10003; Correct.</span> "
                              f"{_inline_md(q.explanation(bank.salt, answer))} <i>(practice: no points)</i>")
        else:
            feedback.value = (f"<span style='color:#a00'>&#10007; Not quite.</span> {_inline_md(q.hint)} "
                              f"<i>(practice: try again)</i>")

    button.on_click(on_check)
    return w.VBox([prompt, field, w.HBox([button]), feedback], layout=w.Layout(margin="6px 0 10px 0"))


_KEYS: dict = {}


def _self_study(chapter: str, q: Question, canonical: str | None) -> str:
    """Right or wrong for a graded answer, where this copy of the course holds the instructor's key (the
    full repository: self-study); nothing in the student edition, which has none."""
    if chapter not in _KEYS:
        try:
            _KEYS[chapter] = load_answer_key(chapter)
        except (FileNotFoundError, ValueError):
            _KEYS[chapter] = None
    entry = (_KEYS[chapter] or {}).get(q.id)
    if entry is None or canonical is None:
        return ""
    verdict = "right" if canonical in entry.accepted else "not right"
    return (f"<br><span style='color:#555'>Self-study (the course's answer key is in this repository): "
            f"{verdict}. {_inline_md(entry.explanation) if verdict == 'right' else _inline_md(entry.hint)}</span>")


def _plain(text: str) -> str:
    return text.replace("`", "")


def quiz_progress(chapter: str) -> None:
    """Print the quiz answers recorded in this notebook's folder: practice results, graded answers saved."""
    print(progress(load_bank(chapter), answers_path(chapter)))


# ---- the static book: jupyterquiz ------------------------------------------------------------------------
class StaticQuiz:
    """A kernel-free self-check (jupyterquiz's HTML + JavaScript), built from the authoring source."""

    def __init__(self, chapter: str, question_ids: list[str]):
        self.chapter, self.question_ids = chapter, question_ids

    def _source(self) -> dict:
        import yaml

        source = yaml.safe_load(source_path(self.chapter, _repo_root()).read_text())
        return {q["id"]: q for q in source["questions"]}

    def _jupyterquiz_questions(self, question_ids: list[str]) -> list[dict]:
        by_id = self._source()
        out = []
        for qid in question_ids:
            q = by_id[qid]
            text = f"{qid}. {_plain(q['text'])}"
            if q["kind"] in ("mc", "many"):
                right = {q["answer"]} if q["kind"] == "mc" else set(q["answer"])
                out.append({"question": text, "type": "multiple_choice" if q["kind"] == "mc" else "many_choice",
                            "answers": [{"answer": _plain(o), "correct": i in right,
                                         "feedback": ("Correct. " + _plain(q["explanation"])) if i in right
                                         else ("Not quite. " + _plain(q.get("hint", "")))}
                                        for i, o in enumerate(q["options"])]})
            else:
                accepted = [str(q["answer"])] + [str(a) for a in q.get("accept", [])]
                variants = []
                for a in accepted:
                    for v in (a, a.replace(" ", ""), a.strip("()[]"), a.strip("()[]").replace(" ", "")):
                        if v not in variants:
                            variants.append(v)
                out.append({"question": text, "type": "string",
                            "answers": [{"answer": v, "correct": True, "match_case": False,
                                         "feedback": "Correct. " + _plain(q["explanation"])} for v in variants]
                            + [{"type": "default", "feedback": "Not quite. " + _plain(q.get("hint", ""))}]})
        return out

    def _repr_html_(self) -> str:
        """Runs of practice questions as jupyterquiz self-checks, graded ones as plain text, in order."""
        bank = load_bank(self.chapter)
        runs: list[tuple[bool, list[str]]] = []
        for qid in self.question_ids:
            graded = bank.question(qid).graded
            if runs and runs[-1][0] == graded:
                runs[-1][1].append(qid)
            else:
                runs.append((graded, [qid]))
        return "".join(self._graded_html(bank, ids) if graded else self._practice_html(ids) for graded, ids in runs)

    def _graded_html(self, bank, question_ids: list[str]) -> str:
        """Graded questions carry no answer into the page: the text and options, and where to answer."""
        parts = []
        for qid in question_ids:
            q = bank.question(qid)
            options = "".join(f"<li>{_inline_md(o)}</li>" for o in q.options)
            parts.append(f'<div class="graded-question"><p><b>{qid}.</b> {_inline_md(q.text)}</p>'
                         + (f"<ol start='0'>{options}</ol>" if options else "")
                         + "<p><i>Graded question: answer it in this chapter's notebook, where your answer is "
                           "recorded; the result comes with your feedback.</i></p></div>")
        return '<div class="graded-quiz" style="border:1px solid #ccc;padding:8px;margin:8px 0">' + "".join(parts) + "</div>"

    def _practice_html(self, question_ids: list[str]) -> str:
        from jupyterquiz.dynamic.loader import load_questions_script
        from jupyterquiz.dynamic.renderer import build_script, build_styles, render_div

        div_id = "q" + uuid.uuid5(uuid.NAMESPACE_URL, f"{self.chapter}/{'-'.join(question_ids)}").hex[:12]
        data_id = div_id + "data"
        encoded = base64.b64encode(json.dumps(self._jupyterquiz_questions(question_ids)).encode()).decode()
        prefix, static, url = load_questions_script("#" + data_id, div_id)
        script = build_script(prefix, static, url, div_id, True)
        # jupyterquiz loads MathJax from a CDN when the page has none: use the book's own copy instead,
        # found through the page's data-content_root (Sphinx writes it), so the book works offline.
        script = script.replace("'https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-svg.js'",
                                "(document.documentElement.dataset.content_root || '') + "
                                "'_static/vendor/mathjax/tex-chtml.js'")
        if "cdn.jsdelivr.net" in script:
            raise RuntimeError("jupyterquiz's script refers to a CDN the book does not serve; update StaticQuiz")
        colors = {"--jq-multiple-choice-bg": "#2e4a7d", "--jq-many-choice-bg": "#7d4a2e", "--jq-string-bg": "#2e6b4a",
                  "--jq-numeric-bg": "#2e6b4a", "--jq-mc-button-bg": "#fafafa", "--jq-mc-button-border": "#e0e0e0e0",
                  "--jq-mc-button-inset-shadow": "#555555", "--jq-numeric-input-bg": "#c0c0c0",
                  "--jq-numeric-input-label": "#101010", "--jq-numeric-input-shadow": "#999999",
                  "--jq-incorrect-color": "#c80202", "--jq-correct-color": "#009113", "--jq-text-color": "#fafafa",
                  "--jq-link-color": "#9abafa"}
        return (f'<span id="{data_id}" style="display:none">{encoded}</span>'
                + render_div(div_id, False, False, False, 1_000_000, 640, 10, "left") + "</div>"
                + build_styles(div_id, colors)
                + f'<script type="text/javascript">\n{script}\n</script>')


def _repo_root():
    from pathlib import Path

    env = os.environ.get("PTINTERNALS_REPO")
    if env:
        return Path(env)
    here = Path.cwd()
    for p in [here, *here.parents]:
        if (p / "_toc.yml").exists():
            return p
    raise FileNotFoundError("cannot find the course repository root (set PTINTERNALS_REPO)")
