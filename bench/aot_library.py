#!/usr/bin/env python3
"""Kernel libraries: what a JIT compile costs, what a library build costs, and that kernels loaded
from a library run as fast as the JIT-built ones and need no compile.

    python3 bench/aot_library.py [--out bench/results] [--work DIR]

1. JIT: each workload's fused kernel compiled cold (all at once, EVTC_COMPILE_JOBS at a time, into
   a fresh disk cache), recorded with evtc.record_kernels.
2. Build: evtc.build_kernel_library from the record (the fused kernels come from the disk cache;
   the plain epilogues compile).
3. Deploy: a subprocess with no nvcc (CUDACXX=/nonexistent) and an empty disk cache, with the
   library: its first call of each kernel (library load included), nvcc runs (must be 0), and
   outputs equal to the JIT kernels' on the same inputs.
4. Speed: in this process, the JIT kernels and the same kernels loaded from the library (new
   Kernel objects after evtc.add_kernel_library) timed interleaved, with cuBLAS (torch.mm) as the
   reference: each as a CUDA graph of 20 back-to-back calls, median of 15 replays.
Writes <stamp>-<gpu>-aot.json and .png.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import datetime, timezone

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from result_files import result_base  # noqa: E402

# name: (expression, M, N, K, torch reference of h = x @ w.T); w is N×K (K-major).
WORKLOADS = {
    "W1 4096^3 silu(acc+bias)": ("out D: bf16 = silu(acc + bias[n])", 4096, 4096, 4096,
                                 lambda h, b: F.silu(h + b)),
    "W1 8192x8192x1024": ("out D: bf16 = silu(acc + bias[n])", 8192, 8192, 1024, lambda h, b: F.silu(h + b)),
    "gelu_tanh 8192x4096x1024": ("out D: bf16 = gelu_tanh(acc + bias[n])", 8192, 4096, 1024,
                                 lambda h, b: F.gelu(h + b, approximate="tanh")),
    "swiglu 8192x22016x4096": ("out y: bf16 = swiglu(acc)", 8192, 22016, 4096,
                               lambda h, b: F.silu(h[:, 0::2]) * h[:, 1::2]),
}
ROUNDS, CALLS = 15, 20


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def inputs(m: int, n: int, k: int):
    g = torch.Generator(device="cuda").manual_seed(m * 31 + n * 7 + k)
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=g) * k ** -0.5).bfloat16()
    b = torch.randn(n, device="cuda", generator=g).bfloat16()
    return x, w, b


def call(kernel, x, w, b, out):
    kwargs = {"bias": b} if "bias" in [o.name for o in kernel.inputs] else {}
    return kernel(x, w.t(), out=out, **kwargs)


def output_of(kernel, m: int, n: int) -> dict:
    (o,) = kernel.outputs
    return {o.name: torch.full(o.size(m, n), float("nan"), device="cuda", dtype=torch.bfloat16)}


DEPLOY = textwrap.dedent("""
    import json, sys, time, torch
    sys.path.insert(0, sys.argv[1])
    import evtc
    from aot_library import WORKLOADS, inputs, call, output_of
    result = {"libraries": evtc.kernel_libraries(), "first_call_ms": {}, "outputs": {}}
    for name, (expr, m, n, k, _) in WORKLOADS.items():
        x, w, b = inputs(m, n, k)
        kernel = evtc.compile(expr, b_layout="col")
        out = output_of(kernel, m, n)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call(kernel, x, w, b, out)
        torch.cuda.synchronize()
        result["first_call_ms"][name] = (time.perf_counter() - t0) * 1e3
        torch.save({key: v.cpu() for key, v in out.items()}, sys.argv[2] + "/" + str(abs(hash(name))) + ".pt")
        result["outputs"][name] = sys.argv[2] + "/" + str(abs(hash(name))) + ".pt"
    result["compiler_runs"] = evtc.compiler_runs()
    print(json.dumps(result))
""")


def timed(fns: dict) -> dict:
    """Median ms per call of each function: each captured once as a CUDA graph of CALLS
    back-to-back calls (no host cost in the timing), replayed between CUDA events in rounds, the
    functions in a rotating order."""
    graphs = {}
    stream = torch.cuda.Stream()
    for name, fn in fns.items():
        with torch.cuda.stream(stream):
            fn()  # warm-up outside the capture
        stream.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            for _ in range(CALLS):
                fn()
        graphs[name] = g
    times = {name: [] for name in fns}
    names = list(fns)
    for r in range(ROUNDS):
        for name in names[r % len(names):] + names[:r % len(names)]:
            graphs[name].replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[name].replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / CALLS)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    p.add_argument("--work", default=None, help="folder for the cache, record and library (default: a temporary one)")
    args = p.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="evtc-aot-")
    os.makedirs(work, exist_ok=True)
    os.environ["EVTC_CACHE_DIR"] = os.path.join(work, "cache")
    os.environ.pop("EVTC_KERNEL_LIBRARY", None)
    import evtc  # after EVTC_CACHE_DIR is set

    gpu = torch.cuda.get_device_name()
    data = {"gpu": gpu, "torch": torch.__version__, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "rounds": ROUNDS, "calls_per_round": CALLS, "workloads": {}}

    # 1. JIT, cold, all kernels at once.
    record = os.path.join(work, "kernels.json")
    evtc.record_kernels(record)
    kernels, data_in = {}, {}
    for name, (expr, m, n, k, _) in WORKLOADS.items():
        kernels[name] = evtc.compile(expr, b_layout="col")
        data_in[name] = inputs(m, n, k)
    t0 = time.perf_counter()
    futures = {name: kernels[name].compile_async(m, n, k) for name, (_, m, n, k, _) in WORKLOADS.items()}
    for f in futures.values():
        f.result()
    data["jit_compile_all_s"] = time.perf_counter() - t0
    data["jit_compiler_runs"] = evtc.compiler_runs()
    log(f"JIT: {len(kernels)} fused kernels compiled cold in {data['jit_compile_all_s']:.1f} s "
        f"({data['jit_compiler_runs']} nvcc runs)")
    jit_out = {}
    for name, (expr, m, n, k, ref) in WORKLOADS.items():
        x, w, b = data_in[name]
        out = output_of(kernels[name], m, n)
        call(kernels[name], x, w, b, out)
        (got,) = out.values()
        want = ref(x.double() @ w.double().t(), b.double())
        assert not got.isnan().any(), f"{name}: unwritten elements"
        torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
        jit_out[name] = got.cpu()
    evtc.record_kernels(None)

    # 2. The library.
    lib = os.path.join(work, "library")
    built = evtc.build_kernel_library(lib, record)
    assert not built["errors"], built["errors"]
    data["library_build"] = built
    data["library_bytes"] = sum(k["bytes"] for k in evtc.read_kernel_library(lib)["kernels"])
    log(f"library: {built['kernels']} kernels ({data['library_bytes'] / 2**20:.1f} MiB) built in "
        f"{built['seconds']:.1f} s, {built['compiled']} nvcc runs (the plain epilogues)")

    # 3. Deploy: no nvcc, empty cache.
    env = dict(os.environ, CUDACXX="/nonexistent", EVTC_CACHE_DIR=os.path.join(work, "empty-cache"),
               EVTC_KERNEL_LIBRARY=lib)
    outdir = os.path.join(work, "deploy")
    os.makedirs(outdir, exist_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", DEPLOY, os.path.dirname(os.path.abspath(__file__)), outdir],
                          env=env, capture_output=True, text=True, timeout=600)
    data["deploy_process_s"] = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"deploy run failed:\n{proc.stdout}\n{proc.stderr}")
    deployed = json.loads(proc.stdout.strip().splitlines()[-1])
    data["deploy_compiler_runs"] = deployed["compiler_runs"]
    log(f"deploy (no nvcc): {deployed['compiler_runs']} nvcc runs; first calls (ms): "
        + ", ".join(f"{v:.1f}" for v in deployed["first_call_ms"].values()))

    # 4. Speed: JIT kernels against the same kernels from the library, in this process.
    evtc.add_kernel_library(lib)
    for name, (expr, m, n, k, _) in WORKLOADS.items():
        x, w, b = data_in[name]
        from_lib = evtc.compile(expr, b_layout="col")
        jit_buf, lib_buf = output_of(kernels[name], m, n), output_of(from_lib, m, n)
        call(from_lib, x, w, b, lib_buf)
        assert lib.rstrip("/") in from_lib.library_path, from_lib.library_path
        assert kernels[name].library_path != from_lib.library_path
        (deployed_out,) = torch.load(deployed["outputs"][name]).values()
        same_as_deploy = torch.equal(deployed_out, jit_out[name])
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        t = timed({"jit": lambda: call(kernels[name], x, w, b, jit_buf),
                   "library": lambda: call(from_lib, x, w, b, lib_buf),
                   "cublas": lambda: torch.mm(x, w.t(), out=c)})
        row = {"m": m, "n": n, "k": k, "expr": expr, "jit_ms": t["jit"], "library_ms": t["library"],
               "cublas_ms": t["cublas"], "library_over_jit": t["library"] / t["jit"],
               "deploy_first_call_ms": deployed["first_call_ms"][name], "deploy_output_equal": same_as_deploy}
        data["workloads"][name] = row
        log(f"{name}: JIT {t['jit']:.4f} ms, library {t['library']:.4f} ms ({row['library_over_jit']:.3f}x), "
            f"cuBLAS {t['cublas']:.4f} ms; deploy first call {row['deploy_first_call_ms']:.1f} ms, "
            f"outputs equal: {same_as_deploy}")

    path = result_base(args.out, gpu, "aot")
    with open(path + ".json", "w") as f:
        json.dump(data, f, indent=2)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        names = list(data["workloads"])
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4))
        a1.bar(names, [data["workloads"][n]["library_over_jit"] for n in names])
        a1.axhline(1.0, color="k", lw=0.8)
        a1.set_ylabel("library kernel time / JIT kernel time")
        a1.set_ylim(0.95, 1.05)
        a1.tick_params(axis="x", rotation=20)
        a2.bar(["JIT compile (all, cold)", "library load + first call (all)"],
               [data["jit_compile_all_s"], sum(r["deploy_first_call_ms"] for r in data["workloads"].values()) / 1e3])
        a2.set_ylabel("seconds")
        fig.suptitle(f"evtc kernel library on {gpu}")
        fig.tight_layout()
        fig.savefig(path + ".png", dpi=120)
    except ImportError as e:
        print(f"no plot: {e}", file=sys.stderr)
    log(f"wrote {path}.json")


if __name__ == "__main__":
    main()
