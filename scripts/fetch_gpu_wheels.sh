#!/usr/bin/env bash
# Download the wheels the GPU machine lacks (autograder/gpu_wheels.txt) into .whl/ for Python 3.12,
# manylinux x86-64, without dependencies (the list is complete). Run here, then carry .whl with the run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
grep -q '^/.whl/' .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
mkdir -p .whl
py=${PYTHON:-.venv/bin/python}
"$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  -r <(grep -v '^#' autograder/gpu_wheels.txt) 2>&1 | grep -v "^WARNING: Location" || true
echo "$(ls .whl/*.whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl/"
