#!/usr/bin/env bash
# Builds and installs the evtc Python package with the build tools already installed
# (scikit-build-core, nanobind: no network needed) into build-python/site, then runs the Python
# tests with it: on a Hopper GPU machine with torch, the GPU tests run too.
#   bash tests/python/run_gpu_tests.sh [pytest arguments]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
site="${EVTC_PYTHON_SITE:-$root/build-python/site}"
echo "[python] building and installing evtc into $site"
python3 -m pip install --no-build-isolation --no-deps --upgrade -q --target "$site" "$root"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
cd "$root/tests/python"
python3 -m pytest "$@"
