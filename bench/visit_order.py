#!/usr/bin/env python3
"""Tile shapes and the persistent tile scheduler's visiting order: for large transformer GEMMs,
each workload's candidate configurations (WORKLOADS; --configs keeps some) timed with every
raster order (CUTLASS's heuristic, along M, along N) and swizzle width (1, 2, 4, 8; --orders
keeps some), against the cuBLAS GEMM of the same shape (torch.mm), in one process.

    python3 bench/visit_order.py PATH_TO_EVTC [--out bench/results] [--only NAME,...] [--rounds R]

The order is a run-time argument of a compiled kernel (evtc_gemm_args.raster / .swizzle): no
recompile per choice. Timing: a sustained GEMM load heats the chip and its clocks drift by several
per cent within seconds, so the variants of one workload (cuBLAS included) are timed round-robin:
each round times every variant for 10 back-to-back calls between two CUDA events, starting at a
different variant each round; a variant's time is the median over the rounds. Each result is
checked against a float64 reference on its first launch (poisoned output). Writes
<stamp>-<gpu>-visit-order.json and .png.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_scaled_mm import FusedKernel, compile_library  # noqa: E402  (the C-ABI caller)
from gated_w4 import swiglu7  # noqa: E402
from result_files import result_base  # noqa: E402

# name: (expression, M, N, K, gated, configs); B is N×K (K-major), as nn.Linear stores it.
GATED = ["pingpong_128x128x64_c2x1_persistent", "coop_128x256x64_c2x1_persistent",
         "coop_256x192x64_c2x1_persistent", "coop_256x192x64_c1x2_persistent",
         "pingpong_128x192x64_c2x1_persistent", "pingpong_128x192x64_c1x2_persistent"]
PLAIN = ["pingpong_128x128x64_c2x1_persistent", "coop_128x256x64_c2x1_persistent",
         "coop_256x192x64_c2x1_persistent", "pingpong_128x192x64_c2x1_persistent"]
SILU = "input bias[n]: bf16\nout D: bf16 = silu(acc + bias[n])"
WORKLOADS = {
    "gated-8192x11264x2048": ("out y: bf16 = swiglu(acc)", 8192, 11264, 2048, True, GATED),
    "gated-8192x22016x4096": ("out y: bf16 = swiglu(acc)", 8192, 22016, 4096, True,
                              GATED + ["coop_256x128x64_c2x1_persistent", "coop_128x256x64_c1x2_persistent"]),
    "gated-8192x28672x4096": ("out y: bf16 = swiglu(acc)", 8192, 28672, 4096, True, GATED),
    "gated-2048x22016x4096": ("out y: bf16 = swiglu(acc)", 2048, 22016, 4096, True, GATED),
    "W4-swiglu7": ("out y: bf16 = swiglu7(acc)", 7697, 27304, 5120, True,
                   ["coop_128x256x64_c2x1_persistent", "coop_256x192x64_c2x1_persistent",
                    "pingpong_128x192x64_c2x1_persistent"]),
    "silu-8192x11008x4096": (SILU, 8192, 11008, 4096, False, PLAIN),
    "silu-8192x5632x2048": (SILU, 8192, 5632, 2048, False, PLAIN),
    "plain-8192x22016x4096": ("out D: bf16 = acc", 8192, 22016, 4096, False,
                              ["coop_128x256x64_c2x1_persistent", "coop_256x192x64_c2x1_persistent"]),
    "plain-8192x11008x4096": ("out D: bf16 = acc", 8192, 11008, 4096, False,
                              ["coop_128x256x64_c2x1_persistent"]),
    "plain-8192x4096x11008": ("out D: bf16 = acc", 8192, 4096, 11008, False,
                              ["coop_128x256x64_c2x1_persistent"]),
    "W1-8192^3": (SILU, 8192, 8192, 8192, False, PLAIN),
}
ORDERS = [(0, 1)] + [(r, s) for r in (1, 2) for s in (1, 2, 4, 8)]
RASTER = {0: "heuristic", 1: "along M", 2: "along N"}


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def swiglu(h):
    g, u = h[:, 0::2], h[:, 1::2]
    return g * torch.sigmoid(g) * u


def sustained(variants: dict, rounds: int, seconds: float, calls: int = 20) -> dict:
    """Median ms per call of each variant in its own steady state: each round runs every variant
    alone for `seconds` (the clocks settle to what that kernel's own power draw allows), then
    times `calls` back-to-back calls."""
    names = list(variants)
    samples = {n: [] for n in names}
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = variants[name]
            start = time.perf_counter()
            while time.perf_counter() - start < seconds:
                for _ in range(10):
                    fn()
                torch.cuda.synchronize()
            e0.record()
            for _ in range(calls):
                fn()
            e1.record()
            torch.cuda.synchronize()
            samples[name].append(e0.elapsed_time(e1) / calls)
    return {n: statistics.median(v) for n, v in samples.items()}


def round_robin(variants: dict, rounds: int, calls: int = 10) -> dict:
    """Median ms per call of each variant, timed in rotating order (see the module's docstring)."""
    names = list(variants)
    for fn in variants.values():
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    while time.perf_counter() - start < 0.3:  # clocks up before the first round
        variants[names[0]]()
        torch.cuda.synchronize()
    samples = {n: [] for n in names}
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in names]
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name, (e0, e1) in zip(order, events):
            fn = variants[name]
            e0.record()
            for _ in range(calls):
                fn()
            e1.record()
        torch.cuda.synchronize()
        for name, (e0, e1) in zip(order, events):
            samples[name].append(e0.elapsed_time(e1) / calls)
    return {n: statistics.median(v) for n, v in samples.items()}


def run_workload(name, expr, m, n, k, gated, paths, rounds, sustain=0.0, orders=ORDERS) -> dict:
    gen = torch.Generator("cuda").manual_seed(7)
    x = (torch.randn(m, k, device="cuda", generator=gen) * k ** -0.25).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=gen) * k ** -0.25).to(torch.bfloat16)
    bias = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16)
    h = x.double() @ w.double().t()
    if gated:
        want = (swiglu7 if "swiglu7" in expr else swiglu)(h)
    elif "silu" in expr:
        want = torch.nn.functional.silu(h + bias.double())
    else:
        want = h
    del h
    out = torch.empty(m, n // 2 if gated else n, device="cuda", dtype=torch.bfloat16)
    cublas_out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    variants = {"cuBLAS": lambda: torch.mm(x, w.t(), out=cublas_out)}
    for config, path in paths.items():
        kern = FusedKernel(path)
        for raster, swizzle in orders:
            tensors = {"y": out, "D": out, "bias": bias}
            launch = kern.bind(x, w, None if gated else out, tensors, raster, swizzle)
            out.fill_(float("nan"))
            launch()
            torch.cuda.synchronize()
            err = ((out.double() - want).norm() / want.norm()).item()
            if not err < 1e-2:
                sys.exit(f"{name} {config} raster {raster} swizzle {swizzle}: relative error {err:.3g}")
            variants[f"{config}|{raster},{swizzle}"] = launch
    del want
    times = sustained(variants, rounds, sustain) if sustain > 0 else round_robin(variants, rounds)
    base = times["cuBLAS"]
    row = {"workload": name, "expression": expr, "shape": [m, n, k], "cublas_ms": base,
           "tflops_cublas": 2.0 * m * n * k / (base * 1e-3) / 1e12, "kernels": {}}
    for config in paths:
        t = {o.split("|")[1]: v for o, v in times.items() if o.startswith(config + "|")}
        row["kernels"][config] = t
        best = min(t, key=t.get)
        log(f"{name} {config}: default {t.get('0,1', float('nan')) / base:.3f}x cuBLAS ({base:.4f} ms), best {best} "
            f"{t[best] / base:.3f}x  ({', '.join(f'{o}:{v / base:.3f}' for o, v in t.items())})")
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("evtc", help="path of the evtc binary")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--only", default="", help="comma-separated workload names")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--sustain", type=float, default=0.0, metavar="SECONDS",
                    help="time each variant in its own steady state after running it alone this long "
                         "(default: round-robin bursts of 10 calls)")
    ap.add_argument("--orders", default="", help="e.g. '0,1;1,8' (default: all)")
    ap.add_argument("--configs", default="", help="comma-separated configuration names to keep (default: all)")
    opts = ap.parse_args()
    names = [w for w in WORKLOADS if not opts.only or w in opts.only.split(",")]
    keep = set(opts.configs.split(",")) if opts.configs else None
    for w in names:
        WORKLOADS[w] = (*WORKLOADS[w][:5], [c for c in WORKLOADS[w][5] if keep is None or c in keep])
    jobs = [(w, c) for w in names for c in WORKLOADS[w][5]]
    log(f"compiling {len(jobs)} kernels")
    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        paths = dict(zip(jobs, pool.map(lambda j: compile_library(opts.evtc, WORKLOADS[j[0]][0], "--config", j[1]), jobs)))
    log("compiled")
    orders = [tuple(int(x) for x in o.split(",")) for o in opts.orders.split(";")] if opts.orders else ORDERS
    rows = []
    for w in names:
        expr, m, n, k, gated, configs = WORKLOADS[w]
        rows.append(run_workload(w, expr, m, n, k, gated, {c: paths[(w, c)] for c in configs}, opts.rounds,
                                 opts.sustain, orders))
    gpu = torch.cuda.get_device_name()
    stem = result_base(opts.out, gpu, "visit-order")
    path = stem + ".json"
    with open(path, "w") as f:
        method = (f"sustained: {opts.rounds} rounds; in each, every variant runs alone for {opts.sustain} s, "
                  "then 20 calls are timed; median" if opts.sustain > 0 else
                  f"round-robin, {opts.rounds} rounds of 10 back-to-back calls per variant, median")
        json.dump({"device": gpu, "torch": torch.__version__, "orders": orders,
                   "method": method + "; cuBLAS = torch.mm into a preallocated output", "rows": rows}, f, indent=2)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        labels = [f"{r},{s}" for r, s in orders]
        fig, ax = plt.subplots(figsize=(10, 4.5))
        for row in rows:
            base = row["cublas_ms"]
            for config, times in row["kernels"].items():
                ax.plot(labels, [times[o] / base for o in labels], marker="o",
                        label=f"{row['workload']} {config.split('_persistent')[0]}")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xlabel("raster (0 heuristic, 1 along M, 2 along N), swizzle")
        ax.set_ylabel("time / cuBLAS GEMM (lower is better)")
        ax.set_title(f"Tile visiting order, {gpu}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(stem + ".png", dpi=120)
    except ImportError:
        log("matplotlib missing: no plot")
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
