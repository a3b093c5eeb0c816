#!/usr/bin/env python3
"""W4: the swiglu7 gated GEMM (N -> N/2), evtc fused against cuBLAS and PyTorch, one process.

    python3 bench/gated_w4.py EVTC_BINARY [--shape 7697,27304,5120] [--configs a,b]
                              [--no-max-autotune] [--extra NAME=LIBRARY] [--out bench/results]

h = x @ w.T with w (N, K) holding interleaved gate/up rows (evtc.interleave_gate_up's
layout); g = min(h[:, 0::2], 7), u = clamp(h[:, 1::2], -7, 7), out = g*sigmoid(1.702 g)*(u+1),
an (M, N/2) result. evtc's kernel (`out y: bf16 = swiglu7(acc)`) is compiled with `evtc
compile` for each kernel configuration, called through its C ABI on PyTorch's stream, checked
against an fp64 reference (NaN-poisoned output first) and timed with triton.testing.do_bench
(median). Baselines in the same process: the plain cuBLAS GEMM (torch.mm, the full (M, N)
output), eager PyTorch, torch.compile and torch.compile(mode="max-autotune-no-cudagraphs").
Writes <out>/<stamp>-<gpu>-w4.json and a PNG bar chart of time relative to the plain GEMM.
"""
import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import torch
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_scaled_mm import FusedKernel, compile_library  # noqa: E402  (the C-ABI caller)
from result_files import result_base  # noqa: E402

EXPR = "out y: bf16 = swiglu7(acc)"
DEFAULT_CONFIGS = "default,pingpong_128x128x64_c2x1_persistent,coop_256x128x64_c2x1_persistent"


def compile_kernel(evtc, config):
    return compile_library(evtc, EXPR, *(["--config", config] if config != "default" else []))


def swiglu7(h):
    g = h[:, 0::2].clamp(max=7.0)
    u = h[:, 1::2].clamp(-7.0, 7.0)
    return g * torch.sigmoid(1.702 * g) * (u + 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("evtc", help="path of the evtc binary")
    ap.add_argument("--shape", default="7697,27304,5120", help="M,N,K (N even)")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS)
    ap.add_argument("--no-max-autotune", action="store_true")
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=PATH",
                    help="also time an already compiled kernel library (e.g. built against other "
                         "device headers with EVTC_INCLUDE_DIR), named NAME")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    opts = ap.parse_args()
    m, n, k = (int(x) for x in opts.shape.split(","))
    configs = opts.configs.split(",")
    with ThreadPoolExecutor(max_workers=len(configs)) as pool:
        paths = dict(zip(configs, pool.map(lambda c: compile_kernel(opts.evtc, c), configs)))
    for extra in opts.extra:
        name, _, path = extra.partition("=")
        paths[name] = path
    torch.manual_seed(0)
    dev = torch.cuda.get_device_name()
    x = (torch.randn(m, k, device="cuda") * k ** -0.25).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") * k ** -0.25 * 3).to(torch.bfloat16)
    want = swiglu7(x.double() @ w.double().t())

    times, errors = {}, {}
    plain = lambda: torch.mm(x, w.t())  # noqa: E731
    eager = lambda: swiglu7(torch.mm(x, w.t()))  # noqa: E731
    baselines = {"cuBLAS mm (full N output)": plain, "eager": eager,
                 "torch.compile": torch.compile(eager)}
    if not opts.no_max_autotune:
        baselines["max-autotune-no-cudagraphs"] = torch.compile(eager, mode="max-autotune-no-cudagraphs")
    for name, fn in baselines.items():
        got = fn()  # compiles / autotunes outside the timing
        if name != "cuBLAS mm (full N output)":
            errors[name] = ((got.double() - want).norm() / want.norm()).item()
        times[name] = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
        print(f"  {name:32s} {times[name]:8.4f} ms", flush=True)
    for cfg, path in paths.items():
        kern = FusedKernel(path)
        y = torch.full((m, n // 2), float("nan"), dtype=torch.bfloat16, device="cuda")
        launch = kern.bind(x, w, None, {"y": y})
        launch()
        torch.cuda.synchronize()
        err = ((y.double() - want).norm() / want.norm()).item()
        name = f"evtc {cfg}"
        errors[name] = err
        if not err < 1e-2 or torch.isnan(y).any():
            sys.exit(f"{name}: relative error {err:.3g} (or unwritten elements): wrong result")
        times[name] = triton.testing.do_bench(launch, warmup=25, rep=200, return_mode="median")
        print(f"  {name:32s} {times[name]:8.4f} ms  (rel. error {err:.2e})", flush=True)

    best = min((t, c) for c, t in times.items() if c.startswith("evtc "))
    base = times["cuBLAS mm (full N output)"]
    flops = 2.0 * m * n * k
    result = {
        "device": dev, "torch": torch.__version__, "shape": [m, n, k], "expression": EXPR,
        "method": "triton.testing.do_bench median (warmup 25 ms, rep 200 ms), same process",
        "ms": times, "rel_error": errors,
        "tflops": {c: flops / (t * 1e-3) / 1e12 for c, t in times.items()},
        "best_evtc": best[1],
        "ratios_to_cublas_mm": {c: t / base for c, t in times.items()},
        "speedup_of_best_evtc": {c: t / best[0] for c, t in times.items() if not c.startswith("evtc ")},
        "target_ms": 3.05,
    }
    for c, r in result["speedup_of_best_evtc"].items():
        print(f"  best evtc ({best[1]}) speedup over {c}: {r:.3f}x")
    stem = result_base(opts.out, dev, "w4")
    path = stem + ".json"
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        names = list(times)
        fig, ax = plt.subplots(figsize=(9, 4))
        ax.barh(names, [times[c] / base for c in names],
                color=["tab:green" if c.startswith("evtc") else "tab:gray" for c in names])
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xlabel("time relative to the plain cuBLAS GEMM (lower is better)")
        ax.set_title(f"W4 swiglu7 {m}x{n}x{k} on {dev}")
        fig.tight_layout()
        fig.savefig(stem + ".png", dpi=120)
    except ImportError:
        print("matplotlib missing: no plot")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
