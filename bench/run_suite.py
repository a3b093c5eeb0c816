#!/usr/bin/env python3
"""Runs the workloads of bench/workloads.txt and reports them (bench/report.py).

Usage: run_suite.py PATH_TO_EVTC [ONLY_ID ...]

Steps, in one fresh kernel cache:
 1. the cold compile of one kernel alone (the first workload's heuristic default);
 2. every tuning candidate of every workload compiled at once, one nvcc per core, while the
    PyTorch baselines (bench/torch_baselines.py) run beside them (they use the GPU, the
    compiles only the CPU);
 3. `evtc tune` per epilogue for all its shapes (timing only: the candidates are compiled);
 4. `evtc run --bench` per workload with the tuned choices: fused vs the cuBLAS GEMM vs the
    unfused path, plus the cache-hit latency and host dispatch cost of the first workload;
 5. bench/report.py: JSON, PNG and the table in bench/README.md.
EVTC_TUNE_MAX_CANDIDATES (default 4 here) bounds each shape's candidates; EVTC_BENCH_TORCH=0
skips the PyTorch baselines."""
import collections
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


def step(text):
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def start_torch_baselines(todo, raw, env):
    if os.environ.get("EVTC_BENCH_TORCH", "1") == "0":
        return None
    items = [f"{wid}:{m}:{n}:{k}" for wid, _, (m, n, k), _ in todo]
    log = open(raw / "torch.log", "w")
    return subprocess.Popen([sys.executable, str(ROOT / "bench" / "torch_baselines.py"),
                             str(raw / "torch.json"), *items], env=env, stdout=log,
                            stderr=subprocess.STDOUT)


def compile_candidates(evtc, groups, env):
    """Every candidate of every epilogue, at once."""
    jobs = []
    for (expr, flags), shapes in groups.items():
        listed = subprocess.run([evtc, "tune", expr, *flags, "--list-candidates",
                                 "--shape", ",".join(shapes)],
                                env=env, capture_output=True, text=True, check=True)
        jobs += [(expr, flags, name) for name in listed.stdout.split()]
        jobs.append((expr, flags, None))  # the fallback epilogue, for the unfused timings
    step(f"compiling {len(jobs)} kernels, {os.cpu_count()} at a time")
    done = 0

    def build(job):
        expr, flags, config = job
        cmd = [evtc, "compile", expr, *flags]
        cmd += ["--config", config] if config else ["--fallback"]
        return subprocess.run(cmd, env=env, capture_output=True, text=True)

    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        for out in pool.map(build, jobs):
            done += 1
            if out.returncode != 0:
                print(out.stderr[-2000:], flush=True)
            print(f"compiling {done}/{len(jobs)}", flush=True)


def main():
    evtc = sys.argv[1]
    only = set(sys.argv[2:])
    env = dict(os.environ)
    # A fresh cache, so the first compile is really cold and nothing is tuned yet.
    env["EVTC_CACHE_DIR"] = tempfile.mkdtemp(prefix="evtc-bench-cache-")
    env.setdefault("EVTC_TUNE_MAX_CANDIDATES", "4")
    env["EVTC_TUNE"] = "ahead"
    raw = ROOT / "bench" / "results" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for f in list(raw.glob("*.json")) + list(raw.glob("*.log")):
        f.unlink()
    todo = [w for w in workloads() if not only or w[0] in only]
    groups = collections.OrderedDict()
    for wid, expr, (m, n, k), flags in todo:
        groups.setdefault((expr, tuple(flags)), []).append(f"{m}x{n}x{k}")

    first = todo[0]
    step(f"cold compile of one kernel ({first[0]}, heuristic default configuration)")
    start = time.perf_counter()
    subprocess.run([evtc, "compile", first[1]], check=True, env=env, capture_output=True)
    cold = time.perf_counter() - start
    step(f"cold compile of one kernel: {cold:.1f} s")
    hit = subprocess.run([evtc, "compile", first[1]], check=True, env=env, capture_output=True, text=True)
    warm = float(hit.stdout.rsplit("(", 1)[1].split(" s)")[0])

    torch_proc = start_torch_baselines(todo, raw, env)
    start = time.perf_counter()
    compile_candidates(evtc, groups, env)
    compile_all = time.perf_counter() - start
    if torch_proc:
        step("waiting for the PyTorch baselines")
        torch_proc.wait()
        print((raw / "torch.log").read_text(), flush=True)

    start = time.perf_counter()
    for (expr, flags), shapes in groups.items():
        step(f"tuning {expr!r} for {', '.join(shapes)}")
        out = subprocess.run([evtc, "tune", expr, *flags, "--shape", ",".join(shapes)],
                             env=env, capture_output=True, text=True)
        print(out.stdout + out.stderr[-3000:], flush=True)
    tune_s = time.perf_counter() - start

    for wid, expr, (m, n, k), flags in todo:
        step(wid)
        out = subprocess.run([evtc, "run", expr, "-m", m, "-n", n, "-k", k, "--bench", *flags,
                              "--json", str(raw / f"{wid}.json")], env=env, capture_output=True, text=True)
        print(out.stdout + out.stderr, flush=True)
    (raw / "compile.json").write_text(
        f'{{"cold_compile_s": {cold:.2f}, "warm_load_s": {warm:.4f}, '
        f'"all_candidates_compile_s": {compile_all:.1f}, "tuning_timing_s": {tune_s:.1f}}}\n')
    report.main(raw, ROOT / "bench" / "results", ROOT / "bench" / "README.md")


if __name__ == "__main__":
    main()
