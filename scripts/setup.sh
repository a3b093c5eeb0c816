#!/usr/bin/env bash
# One-time (and idempotent) set-up for a Debian 12 machine with the CUDA toolkit:
#  - Debian packages evtc builds against (only installed when missing),
#  - the CUTLASS C++ headers from PyPI (nvidia-cutlass, headers only, no Python deps)
#    into the git-ignored folder .deps/cutlass.
# Re-running it is fast: every step checks whether its result is already there.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CUTLASS_VERSION="4.2.0.0"

need_pkgs=()
for p in cmake g++ make ninja-build ccache libfmt-dev libcli11-dev nlohmann-json3-dev libxxhash-dev libgtest-dev python3-pip python3-venv unzip; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_pkgs+=("$p")
done
if ((${#need_pkgs[@]})); then
  echo "[setup] installing Debian packages: ${need_pkgs[*]}"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

dest="$root/.deps/cutlass"
stamp="$dest/.version"
if [ -n "${CUTLASS_DIR:-}" ]; then
  echo "[setup] using CUTLASS headers from CUTLASS_DIR=$CUTLASS_DIR"
elif [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$CUTLASS_VERSION" ]; then
  :
else
  echo "[setup] fetching CUTLASS $CUTLASS_VERSION headers (PyPI wheel nvidia-cutlass, --no-deps)"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --only-binary=:all: "nvidia-cutlass==$CUTLASS_VERSION" -d "$tmp"
  whl="$(ls "$tmp"/nvidia_cutlass-*.whl)"
  (cd "$tmp" && unzip -q "$whl" 'cutlass_library/source/include/*' 'cutlass_library/source/tools/util/include/*')
  rm -rf "$dest"
  mkdir -p "$dest"
  mv "$tmp/cutlass_library/source/include" "$dest/include"
  mv "$tmp/cutlass_library/source/tools/util/include" "$dest/util-include"
  echo "$CUTLASS_VERSION" > "$stamp"
fi

# The Python package's build tools and test runner (PyPI: scikit-build-core, nanobind, pytest, numpy;
# torch only for the tests: tests/python/install_torch.sh) in a virtual environment, build-venv (git-ignored).
venv="$root/build-venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
if ! "$venv/bin/python" -c "import scikit_build_core, nanobind, pytest, numpy" 2>/dev/null; then
  echo "[setup] installing scikit-build-core, nanobind, pytest and numpy into build-venv (PyPI)"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check scikit-build-core nanobind pytest numpy
fi
