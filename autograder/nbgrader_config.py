"""nbgrader configuration for this course (used by `ptgrade` and by nbgrader's own commands).

Layout: solutions/ is nbgrader's source folder, notebooks/ its release folder; submissions,
autograded copies, feedback and the gradebook live under autograder/ (git-ignored). Set
PTGRADE_DB_URL to use PostgreSQL (e.g. postgresql://grader@dbhost/course) for parallel graders.

The grading itself goes through ptinternals.grading.nbgrader_plugin: nbgrader's Execute step is
replaced by a trusted, sandboxed re-check, and hidden tests are stripped from feedback.
"""
from pathlib import Path

from ptinternals.grading.nbgrader_plugin import configure

c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)
configure(c, root=Path(__file__).resolve().parents[1])
