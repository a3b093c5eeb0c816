#!/usr/bin/env python3
"""Runs the workloads of bench/workloads.txt with `evtc run --bench` and reports them
(bench/report.py). Usage: run_suite.py PATH_TO_EVTC [ONLY_ID ...]"""
import concurrent.futures
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import report

ROOT = pathlib.Path(__file__).resolve().parent.parent


def workloads():
    for line in (ROOT / "bench" / "workloads.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        wid, expr, sizes, flags = [part.strip() for part in line.split("|")]
        m, n, k = sizes.split()
        yield wid, expr, (m, n, k), flags.split()


def main():
    evtc = sys.argv[1]
    only = set(sys.argv[2:])
    env = dict(os.environ)
    # A fresh cache, so the first compile is really cold.
    env["EVTC_CACHE_DIR"] = tempfile.mkdtemp(prefix="evtc-bench-cache-")
    raw = ROOT / "bench" / "results" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for f in raw.glob("*.json"):
        f.unlink()
    # `run_suite.py EVTC ID...` runs only those workloads (results go to raw/ and the report).
    todo = [w for w in workloads() if not only or w[0] in only]

    # Cold compile of one kernel alone (a fair single-kernel figure), then the rest at once.
    first = todo[0]
    start = time.perf_counter()
    subprocess.run([evtc, "compile", first[1]], check=True, env=env, capture_output=True)
    cold = time.perf_counter() - start
    print(f"cold compile of one kernel: {cold:.1f} s", flush=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        list(pool.map(lambda w: subprocess.run([evtc, "compile", w[1]], env=env, capture_output=True),
                      todo[1:]))
    # A disk-cache hit in a new process: `evtc compile` of a cached kernel, timed inside.
    hit = subprocess.run([evtc, "compile", first[1]], check=True, env=env, capture_output=True, text=True)
    warm = float(hit.stdout.rsplit("(", 1)[1].split(" s)")[0])
    (raw / "compile.json").write_text(f'{{"cold_compile_s": {cold:.2f}, "warm_load_s": {warm:.3f}}}\n')

    for wid, expr, (m, n, k), flags in todo:
        print(f"== {wid}", flush=True)
        out = subprocess.run([evtc, "run", expr, "-m", m, "-n", n, "-k", k, "--bench", *flags,
                              "--json", str(raw / f"{wid}.json")], env=env, capture_output=True, text=True)
        print(out.stdout + out.stderr, flush=True)
    report.main(raw, ROOT / "bench" / "results", ROOT / "bench" / "README.md")


if __name__ == "__main__":
    main()
