#!/usr/bin/env bash
# Installs PyTorch into the virtual environment scripts/setup.sh made (build-venv; PyPI, once),
# for the Python package's CPU tests: the FX pass tests trace graphs over fake CUDA tensors, no
# GPU needed. Does nothing when torch already imports there, or with EVTC_TEST_TORCH=0.
# `make test` runs it beside CTest (it mostly waits on the network); run_cpu_tests.sh runs it
# again, which then finds torch installed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/build-venv"
TORCH_VERSION="2.11.0"
if [ "${EVTC_TEST_TORCH:-1}" != "0" ] && ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  echo "[python] installing torch $TORCH_VERSION into build-venv (PyPI; for the FX pass tests)"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "torch==$TORCH_VERSION"
fi
