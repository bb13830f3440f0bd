# The course's commands. The first two are the README's: each creates .venv and installs what it needs.
#   make book   build the static book into _build/html (offline-ready)
#   make test   run the whole test suite (what CI runs)
PY := .venv/bin/python
export PTINTERNALS_REPO := $(CURDIR)

.PHONY: book test lint venv compat compat-venv lab notebooks check-notebooks student-edition bench mutation gpu-check gpu-check-dry clean

book: venv
	PTINTERNALS_STATIC_BOOK=1 .venv/bin/jupyter-book build . --warningiserror --nitpick --keep-going --quiet
	@echo "book built: open _build/html/index.html"

test: venv
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup --durations=25

# Lint: ruff over every Python source (notebook sources with notebook rules), then the dead-code check.
lint: venv
	$(PY) -m ruff check src tests bench scripts autograder solutions/*.py
	$(PY) scripts/dead_code.py

venv:
	@scripts/bootstrap.sh

# The GPU machine's toolchain (torch 2.11 + triton 3.6, PyPI's CUDA build) on the CPU: a second venv
# pinned by constraints-gpu.txt (derived from constraints.txt), and the CPU suite in it. The book tests
# (tests/book) run once, in `make test`. CI runs this after `make test`.
COMPAT_VENV := .venv-compat
constraints-gpu.txt: constraints.txt scripts/compat_constraints.py
	python3 scripts/compat_constraints.py

compat-venv: constraints-gpu.txt
	@t0=$$(date +%s); PTI_VENV=$(CURDIR)/$(COMPAT_VENV) PTI_CONSTRAINTS=$(CURDIR)/constraints-gpu.txt \
	  PTI_EXTRAS=triton,grade,dev scripts/bootstrap.sh && echo "$(COMPAT_VENV) ready ($$(($$(date +%s) - t0)) s)"

compat: compat-venv
	$(COMPAT_VENV)/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup --durations=15 --ignore=tests/book

# For students: JupyterLab on the chapter notebooks (quiz answers are saved beside each notebook).
LAB_DIR ?= notebooks
lab: venv
	cd $(LAB_DIR) && $(CURDIR)/.venv/bin/jupyter lab $(LAB_ARGS)

# For authors: regenerate solutions/*/ notebooks, student notebooks and quiz banks from their sources.
notebooks: venv
	$(PY) scripts/build_notebooks.py

check-notebooks: venv
	$(PY) scripts/build_notebooks.py --check

# For instructors: the student edition (notebooks, student package and wheel; no solutions). See book/instructors.md.
EDITION_DIR ?= _build/student-edition
student-edition: venv
	.venv/bin/ptgrade student-edition --out $(EDITION_DIR)

bench: venv
	$(PY) bench/run.py

# Mutation testing of the exercises' checkers (cosmic-ray): one chapter, or every chapter when CHAPTER is
# unset; writes bench/results/mutation-<date>-<slug>.{json,md}. Minutes per chapter, 2 worker processes.
CHAPTER ?=
mutation: venv
	$(PY) bench/mutation.py $(CHAPTER) --jobs 2

gpu-check:
	autograder/gpu_check.sh

gpu-check-dry: venv
	autograder/gpu_check.sh --dry-run

clean:
	rm -rf _build
