#!/usr/bin/env bash
# The Python package's CPU tests, as `make test` runs them: installs PyTorch into the virtual
# environment scripts/setup.sh made (install_torch.sh; EVTC_TEST_TORCH=0 skips it), then the package with
# `pip install .` (which builds the PyTorch op library against that torch), then runs pytest.
# Tests that need a GPU skip themselves.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/build-venv"
# torch first: the package builds its PyTorch op library when torch is importable.
bash "$root/tests/python/install_torch.sh"
echo "[python] pip install . (into build-venv)"
# The C++ build's compiler (CMake's default, c++), so that this build's objects are ccache hits
# of that build's (ccache keys on the compiler's name; scikit-build-core would take Python's, g++).
export CXX="${CXX:-c++}"
"$venv/bin/python" -m pip install --no-build-isolation --no-deps --upgrade -q "$root"
cd "$root/tests/python"
"$venv/bin/python" -m pytest -q -rs
