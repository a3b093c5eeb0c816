#!/usr/bin/env python3
"""The library's layers, from the bottom: support (logging, environment switches), ir, target, then frontend, passes and reference, then
backends, jit, runtime, and testing (the harnesses, which the product library does not need).
The evtc command's sources (tools/, beside SRC_DIR) include
public headers and testing/ only. A source file of one layer includes private headers ("<layer>/...") of its own layer or of
layers below it only: an include that points up is reported with its file and line, and the
check fails. Public headers (evtc/...) are the API every layer may use.

    check_includes.py [SRC_DIR]
"""
import pathlib
import re
import sys

LAYERS = [("support",), ("ir",), ("target",), ("frontend", "passes", "reference"), ("backends",), ("jit",),
          ("runtime",), ("testing",)]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/')


def violations(src: pathlib.Path) -> list[str]:
    found = []
    for path in sorted(src.rglob("*")):
        if path.suffix not in (".cpp", ".hpp", ".h", ".cuh") or not path.is_file():
            continue
        layer = path.relative_to(src).parts[0]
        if layer not in RANK:
            found.append(f"{path}: in no layer (add its folder to LAYERS in {__file__})")
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            m = INCLUDE.match(line)
            if m and m.group(1) in RANK and RANK[m.group(1)] > RANK[layer]:
                found.append(f"{path}:{number}: {layer}/ includes {m.group(1)}/, a layer above it")
    return found


# The evtc command (tools/) sits on top: it uses the public headers (evtc/...) and the testing
# library it links (testing/...), not the product library's private layers.
TOOLS_MAY_INCLUDE = {"testing"}


def tool_violations(tools: pathlib.Path) -> list[str]:
    found = []
    for path in sorted(tools.rglob("*")):
        if path.suffix not in (".cpp", ".hpp", ".h") or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            m = INCLUDE.match(line)
            if m and m.group(1) in RANK and m.group(1) not in TOOLS_MAY_INCLUDE:
                found.append(f"{path}:{number}: the evtc command includes {m.group(1)}/, a private layer of the "
                             "library (use its public headers, evtc/...)")
    return found


def main() -> int:
    src = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2] / "src")
    found = violations(src)
    if (src.parent / "tools").is_dir():
        found += tool_violations(src.parent / "tools")
    for v in found:
        print(v)
    print(f"{len(found)} include(s) pointing up" if found else "layers hold: no include points up")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
