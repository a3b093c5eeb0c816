#!/usr/bin/env python3
"""What a fused kernel's cold compile costs, phase by phase: evtc's compile (device and host parts
in parallel, then a link) against one whole-file nvcc run of the same source.

    python3 bench/compile_phases.py [--evtc build/evtc] [--out bench/results] [--kernels w1,w4]

Needs nvcc and CUTLASS (EVTC_CUTLASS_DIR), no GPU. For each kernel (an examples/*.evt file), one
compile at a time, nothing else running:
1. `evtc compile` into a fresh cache: the wall time a user waits (the parts in parallel + link);
2. the same source compiled whole by one nvcc run (no EVTC_PART: the kernel and the host code in
   one translation unit), with `nvcc --time`;
3. the device part alone and the host part alone, with `nvcc --time` (the phases of each).
Writes <stamp>-<host>-compile-phases.json and a .png of the phases.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from result_files import result_base, save_png  # noqa: E402


def expression(name: str) -> str:
    path = os.path.join(ROOT, "examples", {"w1": "w1_bias_silu.evt", "w4": "w4_swiglu7.evt",
                                            "w7": "w7_bce_loss.evt"}.get(name, name))
    with open(path) as f:
        return "\n".join(line for line in f.read().splitlines() if not line.lstrip().startswith("#"))


def timed(argv: list[str], env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, env=env)
    return time.perf_counter() - t0, r


def phases(csv_path: str) -> dict[str, float]:
    """nvcc --time's CSV: seconds per phase (a phase that runs twice is summed)."""
    out: dict[str, float] = {}
    with open(csv_path) as f:
        rows = list(csv.reader(f))
    for row in rows[1:]:
        if len(row) < 7:
            continue
        name = row[1].strip()
        out[name] = out.get(name, 0.0) + float(row[6]) / 1000.0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--evtc", default=os.path.join(ROOT, "build", "evtc"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--kernels", default="w1,w4")
    ap.add_argument("--json-only", action="store_true")
    args = ap.parse_args()
    if not os.path.exists(args.evtc):
        print(f"compile_phases: no evtc command at {args.evtc} (build it, or pass --evtc)", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="evtc-compile-phases-")
    nvcc_version = subprocess.run([shutil.which("nvcc") or "nvcc", "--version"], capture_output=True,
                                  text=True).stdout.strip().splitlines()[-1:]
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
              "cores": os.cpu_count(), "nvcc": nvcc_version, "kernels": []}
    for name in args.kernels.split(","):
        expr = expression(name)
        env = dict(os.environ, EVTC_CACHE_DIR=os.path.join(work, name + "-cache"))
        wall_parts, r = timed([args.evtc, "compile", expr], env)
        if r.returncode != 0:
            print(r.stdout + r.stderr, file=sys.stderr)
            return 1
        entry = os.path.join(env["EVTC_CACHE_DIR"], "kernels", os.listdir(os.path.join(env["EVTC_CACHE_DIR"], "kernels"))[0])
        with open(os.path.join(entry, "command.txt")) as f:
            device_cmd, host_cmd, link_cmd = (shlex.split(line) for line in f.read().splitlines()[:3])
        src_dir = os.path.join(work, name)
        os.makedirs(src_dir)
        source = os.path.join(src_dir, "kernel.cu")
        shutil.copy(os.path.join(entry, "kernel.cu"), source)

        def retarget(cmd: list[str], out: str) -> list[str]:
            cmd = list(cmd)
            cmd[cmd.index("-o") + 1] = os.path.join(src_dir, out)
            return [source if a.endswith("kernel.cu") else a for a in cmd]

        # The whole-file command: the device part's flags without the part, as a shared library.
        whole = [a for a in device_cmd if a not in ("-cubin", "-DEVTC_PART=1")]
        whole.insert(1, "-shared")
        whole += [a for a in link_cmd if a.startswith("-L") or a == "-lcuda"]
        row = {"kernel": name, "expression": expr, "evtc_compile_s": round(wall_parts, 2)}
        for label, cmd, out in (("whole", whole, "whole.so"), ("device_part", device_cmd, "kernel.cubin"),
                                ("host_part", host_cmd, "host.o")):
            csv_path = os.path.join(src_dir, label + ".csv")
            wall, r = timed(retarget(cmd, out) + ["--time", csv_path])
            if r.returncode != 0:
                print(f"{name} {label}: nvcc failed\n{r.stdout}{r.stderr}", file=sys.stderr)
                return 1
            row[label + "_s"] = round(wall, 2)
            row[label + "_phases_s"] = {k: round(v, 2) for k, v in phases(csv_path).items()}
        row["speedup"] = round(row["whole_s"] / row["evtc_compile_s"], 3)
        result["kernels"].append(row)
        print(f"{name}: evtc compile {row['evtc_compile_s']:.1f} s (device part {row['device_part_s']:.1f} s, "
              f"host part {row['host_part_s']:.1f} s, in parallel) | whole file {row['whole_s']:.1f} s | "
              f"cicc {row['device_part_phases_s'].get('cicc', 0):.1f} s", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    host = os.environ.get("EVTC_BENCH_HOST", platform.node().split(".")[0] or "host")
    base = result_base(args.out, None, "compile-phases", slug=host)
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {base}.json")
    if not args.json_only:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib not installed: no PNG", file=sys.stderr)
            return 0
        fig, ax = plt.subplots(figsize=(8, 1.2 + 1.1 * len(result["kernels"])))
        colors: dict[str, str] = {}
        ticks, names, y = [], [], 0.0
        for row in result["kernels"]:
            for label in ("whole", "device_part", "host_part"):
                left = 0.0
                for phase, secs in row[label + "_phases_s"].items():
                    new_phase = phase not in colors
                    c = colors.setdefault(phase, f"C{len(colors) % 10}")
                    ax.barh(y, secs, left=left, color=c, label=phase if new_phase else None)
                    left += secs
                ax.text(left + 0.3, y, f"{row[label + '_s']:.1f} s", va="center", fontsize=8)
                ticks.append(y)
                names.append(f"{row['kernel']} {label.replace('_', ' ')}")
                y += 1
            ax.barh(y, row["evtc_compile_s"], color="black")
            ax.text(row["evtc_compile_s"] + 0.3, y, f"{row['evtc_compile_s']:.1f} s (parts in parallel + link)",
                    va="center", fontsize=8)
            ticks.append(y)
            names.append(f"{row['kernel']} evtc compile")
            y += 1.5
        ax.set_yticks(ticks, names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("seconds (one compile at a time)")
        ax.legend(fontsize=7, loc="lower right")
        save_png(fig, base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
