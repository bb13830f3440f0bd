"""ptgrade's command line: help everywhere, clear errors and meaningful exit codes for bad input."""
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from ptinternals.grading.classroom import shard
from ptinternals.grading.cli import build_parser, main
from ptinternals.grading.exercise import load_chapter

from .conftest import submission

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ["doctor", "release", "collect", "autograde", "feedback", "export", "summary", "validate"]


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"] if command else ["--help"])
    assert info.value.code == 0
    assert "usage: ptgrade" in capsys.readouterr().out


def test_unknown_assignment_is_a_usage_error(course, capsys):
    assert main(["autograde", "ch99_nothing"]) == 2
    assert "unknown assignment 'ch99_nothing'" in capsys.readouterr().err


def test_missing_submission_is_named(course, capsys):
    assert main(["autograde", "strides", "--student", "nobody"]) == 2
    assert "no submission of strides for: nobody" in capsys.readouterr().err


def test_bad_collect_folder(course, capsys):
    assert main(["collect", "strides", "--from", str(course / "nope")]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_outside_a_course(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("PTGRADE_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["summary", "strides"]) == 2
    assert "not inside the course repository" in capsys.readouterr().err


def test_collect_keeps_earlier_submissions(course, tmp_path):
    src = tmp_path / "downloads"
    (src / "ada").mkdir(parents=True)
    nbformat.write(submission(), src / "ada" / "strides.ipynb")
    (src / "bad name!").mkdir()
    assert main(["collect", "strides", "--from", str(src)]) == 1  # the odd folder is reported
    assert main(["collect", "strides", "--from", str(src)]) == 1
    assert (course / "autograder" / "submitted" / "ada" / "strides" / "strides.ipynb").exists()
    assert list((course / "autograder" / "submitted" / "_superseded" / "ada").iterdir())


def test_validate_makes_deleted_test_cells_visible(tmp_path, capsys):
    path = tmp_path / "strides.ipynb"
    nbformat.write(submission(delete=("view_strides_tests", "storage_index_code"), student_version=True), path)
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{load_chapter('strides').exercise('strides.view_strides').name} (view_strides_tests) has been deleted" in out
    assert f"answer cell of {load_chapter('strides').exercise('strides.storage_index').name}" in out
    nbformat.write(submission(student_version=True), path)
    assert main(["validate", str(path)]) == 0


def test_validate_flags_edited_locked_cells(tmp_path, capsys):
    nb = submission(student_version=True)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "is_contiguous_tests":
            cell.source = "pass"
    path = tmp_path / "strides.ipynb"
    nbformat.write(nb, path)
    assert main(["validate", str(path)]) == 1
    assert "locked cell is_contiguous_tests was edited" in capsys.readouterr().out


def test_doctor_reports(capsys):
    assert main(["doctor"]) in (0, 3)
    out = capsys.readouterr().out
    for word in ("torch", "triton", "nbgrader", "grading device", "isolation"):
        assert word in out


def test_shard():
    students = [f"s{i}" for i in range(7)]
    parts = [shard(students, f"{i}/3") for i in range(3)]
    assert sorted(sum(parts, [])) == sorted(students) and all(parts)
    for bad in ("3/3", "a/b", "1/0", "-1/2"):
        with pytest.raises(ValueError, match="--shard"):
            shard(students, bad)


def test_scheduler_templates_are_valid():
    sbatch = ROOT / "autograder" / "slurm" / "grade-array.sbatch"
    assert subprocess.run(["bash", "-n", str(sbatch)]).returncode == 0
    job = yaml.safe_load((ROOT / "autograder" / "k8s" / "grade-job.yaml").read_text())
    assert job["kind"] == "Job" and job["spec"]["completionMode"] == "Indexed"
    args = job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    # the command line the templates run parses with ptgrade's real parser
    for text in (args, sbatch.read_text()):
        assert "ptgrade autograde" in text and "--shard" in text
    parsed = build_parser().parse_args(["autograde", "strides", "--shard", "0/4", "--db", "postgresql://x/y",
                                        "--workers", "2", "--gpus", "0", "--quiet"])
    assert parsed.shard == "0/4" and parsed.gpus == "0"


def test_console_script_installed():
    exe = Path(sys.executable).parent / "ptgrade"
    assert exe.exists()
    assert subprocess.run([exe, "--help"], capture_output=True).returncode == 0


def test_validate_shows_a_policy_violation_before_submitting(tmp_path, capsys):
    nb = submission({"sliding_windows_code": "def sliding_windows(x, size, step):\n    return x.unfold(-1, size, step)\n"})
    path = tmp_path / "strides.ipynb"
    nbformat.write(nb, path)
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert "would score 0: .unfold (answer cell sliding_windows_code, line 2)" in out


def test_feedback_and_autograde_options_are_checked(course, capsys):
    with pytest.raises(SystemExit):
        main(["autograde", "strides", "--submission-time-limit", "0"])
    assert "--submission-time-limit must be > 0" in capsys.readouterr().err
