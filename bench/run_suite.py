#!/usr/bin/env python3
"""Runs the workloads of bench/workloads.txt and reports them (bench/report.py).

Usage: run_suite.py PATH_TO_EVTC [ONLY_ID ...]

Steps, in fresh kernel caches:
 1. the PyTorch baselines (bench/torch_baselines.py) start in the background: eager,
    torch.compile and max-autotune use the GPU, evtc's compiles below only the CPUs;
 2. the cold compile of one kernel alone (the first workload's heuristic default), then
    finding it again from a new process (the disk-cache hit);
 3. a new epilogue tuned over all its candidates (`evtc tune`, EVTC_TUNE_MAX_CANDIDATES=0):
    the first workload's, in a fresh cache, from nothing to the tuned choice;
 4. every tuning candidate of every workload compiled at once, one nvcc per core;
 5. `evtc tune` per epilogue for all its shapes (timing only: the candidates are compiled);
 6. `evtc run --bench` per workload with the tuned choices: fused vs the cuBLAS GEMM vs the
    unfused path, plus the cache-hit latency and host dispatch cost of the first workload.
    Meanwhile the plain epilogue `D = acc` is compiled with each W1-W3 workload's tuned
    configuration; it then runs the same way, and the difference is the EVT's cost;
 7. bench/report.py: JSON, PNG and the table in bench/README.md.
EVTC_TUNE_MAX_CANDIDATES (default 4 here) bounds each shape's candidates in steps 4-5;
EVTC_BENCH_TORCH=0 skips the PyTorch baselines, EVTC_BENCH_TUNE_ALL=0 step 3."""
import collections
import concurrent.futures
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import report

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Families whose EVT overhead (fused minus the plain epilogue, same configuration) is measured.
OVERHEAD_FAMILIES = {"W1", "W2", "W3", "W3gelu"}
PLAIN = "out D: bf16 = acc"


def workloads():
    for line in (ROOT / "bench" / "workloads.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        wid, expr, sizes, flags = [part.strip() for part in line.split("|")]
        m, n, k = sizes.split()
        yield wid, expr, (m, n, k), flags.split()


def family(wid):
    return wid.split("-")[0]


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


def compile_all(evtc, jobs, env):
    """(expr, flags, config or None for the unfused epilogue) jobs, one nvcc per core."""
    step(f"compiling {len(jobs)} kernels, {os.cpu_count()} at a time")

    def build(job):
        expr, flags, config = job
        cmd = [evtc, "compile", expr, *flags]
        cmd += ["--config", config] if config else ["--fallback"]
        return subprocess.run(cmd, env=env, capture_output=True, text=True)

    done = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        for out in pool.map(build, jobs):
            done += 1
            if out.returncode != 0:
                print(out.stderr[-2000:], flush=True)
    step(f"compiled {done} kernels")


def candidate_jobs(evtc, groups, env):
    jobs = []
    for (expr, flags), shapes in groups.items():
        listed = subprocess.run([evtc, "tune", expr, *flags, "--list-candidates",
                                 "--shape", ",".join(shapes)],
                                env=env, capture_output=True, text=True, check=True)
        jobs += [(expr, list(flags), name) for name in listed.stdout.split()]
        jobs.append((expr, list(flags), None))  # the fallback epilogue, for the unfused timings
    return jobs


def tune_all_candidates(evtc, first, cache, raw, env):
    """A new epilogue from nothing to its tuned choice, every candidate compiled and timed."""
    wid, expr, (m, n, k), flags = first
    tune_env = dict(env, EVTC_CACHE_DIR=cache, EVTC_TUNE_MAX_CANDIDATES="0")
    shape = f"{m}x{n}x{k}"
    listed = subprocess.run([evtc, "tune", expr, *flags, "--list-candidates", "--shape", shape],
                            env=tune_env, capture_output=True, text=True, check=True).stdout.split()
    step(f"new epilogue tuned over all {len(listed)} candidates ({wid})")
    start = time.perf_counter()
    out = subprocess.run([evtc, "tune", expr, *flags, "--shape", shape, "--json", str(raw / "tune_all.out")],
                         env=tune_env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    print(out.stdout[-3000:] + out.stderr[-2000:], flush=True)
    result = {"workload": wid, "shape": shape, "candidates": len(listed), "seconds": round(seconds, 1),
              "ok": out.returncode == 0}
    try:
        tuned = json.loads((raw / "tune_all.out").read_text())[0]
        result["best"] = tuned["best"]
        result["best_ms"] = tuned.get("best_ms")
        result["failed"] = sum(1 for c in tuned.get("candidates", []) if "error" in c)
    except (OSError, ValueError, IndexError, KeyError):
        pass
    step(f"new epilogue tuned in {seconds:.1f} s")
    return result


def run_bench(evtc, expr, sizes, flags, out_json, env, extra=()):
    m, n, k = sizes
    out = subprocess.run([evtc, "run", expr, "-m", m, "-n", n, "-k", k, "--bench", *flags, *extra,
                          "--json", str(out_json)], env=env, capture_output=True, text=True)
    print(out.stdout + out.stderr[-3000:], flush=True)


def main():
    evtc = sys.argv[1]
    only = set(sys.argv[2:])
    env = dict(os.environ)
    env.setdefault("EVTC_TUNE_MAX_CANDIDATES", "4")
    env["EVTC_TUNE"] = "ahead"
    env["EVTC_LOG"] = "warning"
    raw = ROOT / "bench" / "results" / "raw"
    shutil.rmtree(raw, ignore_errors=True)
    (raw / "plain").mkdir(parents=True)
    todo = [w for w in workloads() if not only or w[0] in only]
    groups = collections.OrderedDict()
    for wid, expr, (m, n, k), flags in todo:
        groups.setdefault((expr, tuple(flags)), []).append(f"{m}x{n}x{k}")
    suite_start = time.perf_counter()

    torch_proc = start_torch_baselines(todo, raw, env)

    # Fresh caches, so that the first compile is really cold and nothing is tuned yet.
    cold_env = dict(env, EVTC_CACHE_DIR=tempfile.mkdtemp(prefix="evtc-bench-cold-"))
    env["EVTC_CACHE_DIR"] = tempfile.mkdtemp(prefix="evtc-bench-cache-")
    first = todo[0]
    step(f"cold compile of one kernel ({first[0]}, heuristic default configuration)")
    start = time.perf_counter()
    subprocess.run([evtc, "compile", first[1], *first[3]], check=True, env=cold_env, capture_output=True)
    cold = time.perf_counter() - start
    step(f"cold compile of one kernel: {cold:.1f} s")
    start = time.perf_counter()
    hit = subprocess.run([evtc, "compile", first[1], *first[3]], check=True, env=cold_env,
                         capture_output=True, text=True)
    warm_process = time.perf_counter() - start
    warm = float(hit.stdout.rsplit("(", 1)[1].split(" s)")[0])
    compile_info = {"cold_compile_s": round(cold, 2), "warm_load_s": warm,
                    "warm_process_s": round(warm_process, 4), "cores": os.cpu_count()}

    if os.environ.get("EVTC_BENCH_TUNE_ALL", "1") != "0":
        # In the suite's cache: its kernels and choice serve the first workload below.
        compile_info["tune_all"] = tune_all_candidates(evtc, first, env["EVTC_CACHE_DIR"], raw, env)

    start = time.perf_counter()
    compile_all(evtc, candidate_jobs(evtc, groups, env), env)
    compile_info["all_candidates_compile_s"] = round(time.perf_counter() - start, 1)
    if torch_proc:
        step("waiting for the PyTorch baselines")
        torch_proc.wait()
        print((raw / "torch.log").read_text(), flush=True)

    start = time.perf_counter()
    chosen = {}
    for (expr, flags), shapes in groups.items():
        step(f"tuning {expr!r} for {', '.join(shapes)}")
        tune_json = raw / "plain" / "tune.out"
        out = subprocess.run([evtc, "tune", expr, *flags, "--shape", ",".join(shapes), "--json", str(tune_json)],
                             env=env, capture_output=True, text=True)
        print(out.stdout + out.stderr[-3000:], flush=True)
        try:
            for r in json.loads(tune_json.read_text()):
                chosen[(expr, flags, f"{r['m']}x{r['n']}x{r['k']}")] = r["best"]
        except (OSError, ValueError, KeyError):
            pass
    compile_info["tuning_timing_s"] = round(time.perf_counter() - start, 1)

    # The plain epilogue with each W1-W3 workload's tuned configuration compiles on the CPUs
    # while the fused kernels are timed.
    plain_jobs = {}
    for wid, expr, (m, n, k), flags in todo:
        config = chosen.get((expr, tuple(flags), f"{m}x{n}x{k}"))
        if family(wid) in OVERHEAD_FAMILIES and config:
            plain_jobs[wid] = (PLAIN, flags, config)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(plain_jobs)))
    plain_compiles = pool.submit(compile_all, evtc, sorted(set((e, tuple(f), c) for e, f, c in plain_jobs.values())),
                                 env) if plain_jobs else None

    for wid, expr, sizes, flags in todo:
        step(wid)
        run_bench(evtc, expr, sizes, flags, raw / f"{wid}.json", env)
    if plain_compiles:
        plain_compiles.result()
    for wid, expr, sizes, flags in todo:
        if wid not in plain_jobs:
            continue
        _, _, config = plain_jobs[wid]
        step(f"{wid}: plain epilogue, {config}")
        run_bench(evtc, PLAIN, sizes, flags, raw / "plain" / f"{wid}.json", env, ("--config", config))
    pool.shutdown()
    compile_info["suite_s"] = round(time.perf_counter() - suite_start, 1)
    (raw / "compile.json").write_text(json.dumps(compile_info, indent=2) + "\n")
    report.main(raw, ROOT / "bench" / "results", ROOT / "bench" / "README.md")


if __name__ == "__main__":
    main()
