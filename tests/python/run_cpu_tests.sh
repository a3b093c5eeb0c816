#!/usr/bin/env bash
# The Python package's CPU tests, as `make test` runs them: installs the package with
# `pip install .` into the virtual environment scripts/setup.sh made (build-venv), then runs
# pytest. Tests that need torch or a GPU skip themselves where those are missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/build-venv"
echo "[python] pip install . (into build-venv)"
"$venv/bin/python" -m pip install --no-build-isolation --no-deps --upgrade -q "$root"
cd "$root/tests/python"
"$venv/bin/python" -m pytest -q -rs
