"""The student's path in a real browser: JupyterLab started the way the README says (`make lab`),
the chapter notebook run top to bottom, a quiz question answered, feedback seen and the answer recorded."""
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest

from .conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.browser]
TOKEN = "ptinternals-test"


@pytest.fixture
def lab(tmp_path):
    folder = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks" / "strides", folder / "strides")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = (f"--no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port={port} --IdentityProvider.token={TOKEN} "
            f"--ServerApp.allow_root=True --expose-app-in-browser --LabApp.news_url=None "
            f"--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate")
    proc = subprocess.Popen(["make", "lab", f"LAB_DIR={folder}", f"LAB_ARGS={args}"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=2)
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"make lab exited: {proc.stdout.read()[-3000:]}")
            time.sleep(0.5)
    else:
        pytest.fail("JupyterLab did not start within 120 s")
    yield url, folder
    os.killpg(proc.pid, 15)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)


def test_student_runs_the_chapter_and_answers_a_quiz(lab, browser):
    url, folder = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{url}/lab/tree/strides/strides.ipynb?token={TOKEN}")
    page.wait_for_function("window.jupyterapp && document.querySelector('.jp-Notebook')", timeout=90_000)
    page.wait_for_function(  # the kernel is up
        "document.querySelector('.jp-Notebook') && window.jupyterapp.shell.currentWidget"
        " && window.jupyterapp.shell.currentWidget.sessionContext.session"
        " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel", timeout=90_000)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    # wait until every code cell has run and the kernel is idle; read the outputs from the notebook model
    # (JupyterLab 4 renders only the cells on screen, so the DOM does not hold them all)
    page.wait_for_function("""() => {
        const nb = window.jupyterapp.shell.currentWidget;
        const cells = nb.content.model.toJSON().cells.filter(c => c.cell_type === 'code');
        return nb.sessionContext.session.kernel.status === 'idle' && cells.every(c => c.execution_count !== null);
    }""", timeout=240_000, polling=1000)
    model = page.evaluate("window.jupyterapp.shell.currentWidget.content.model.toJSON()")
    errors = {}
    for cell in model["cells"]:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        for out in cell.get("outputs", []):
            if out["output_type"] == "error":
                errors[gid] = out["ename"] + ": " + out["evalue"]
    check_cells = [g for g in errors if g and g.endswith("_tests")]
    assert len(check_cells) == 8 and len(errors) == 8, errors  # each check fails, nothing else does
    assert all("is not implemented yet" in e for e in errors.values()), errors
    # answer the first multiple-choice quiz question (q2): scroll its cell into view, choose, check
    index = next(i for i, c in enumerate(model["cells"]) if '"q1", "q2", "q8"' in "".join(c["source"]))
    page.evaluate(f"window.jupyterapp.shell.currentWidget.content.scrollToItem({index}, 'start')")
    question = page.locator(".widget-vbox").filter(has_text="Which statement is true").last
    question.wait_for(timeout=30_000)
    question.scroll_into_view_if_needed()
    question.locator("input[type=radio]").nth(1).check()
    question.get_by_role("button", name="Check").click()
    page.wait_for_function("[...document.querySelectorAll('.widget-html-content')]"
                           ".some(e => e.innerText.includes('Correct'))", timeout=30_000)
    answers = json.loads((folder / "strides" / "strides.answers.json").read_text())
    assert answers["answers"]["q2"][0]["answer"] == "1"
    page.close()
