#!/usr/bin/env python3
"""The sm_80 backend's visitor-tree cost: evtc's CUTLASS 2.x fused kernels against a plain CUTLASS
2.x GEMM of the same configuration, cuBLAS and the unfused path.

    python3 bench/sm80_evt.py [--shapes 8192x8192x1024] [--config ms_128x256x64_s3] [--out bench/results]

Runs on any GPU that runs sm_80 code (the kernels are built with EVTC_ARCH=sm80: sm_80 machine code
and compute_80 PTX, which the driver compiles for a newer GPU). On Hopper this measures the
visitor tree's cost on the mma.sync main loop, not Ampere's speed: Hopper's wgmma kernels (the
sm_90a backend, also timed) are what runs there by default. For each shape it times, on the same
tensors (bf16 A row-major, B column-major):
  plain CUTLASS 2.x   bench/sm80/plain_gemm.cu in --config's tile and stages, D = A·B, and
                      D = A·B + C (C = W2's gate: the same memory traffic as W2) (nvcc, here)
  evtc sm80           W1 silu(acc + bias[n]), W2 acc * gate[m,n] and D = acc, in --config
  evtc sm90a          W1 and W2 with the default Hopper kernel (on an sm_90 GPU only)
  torch               cuBLAS alone (a @ b), and + the epilogue in eager PyTorch (the unfused path)
Every output is checked against float64 first. Timing: triton.testing.do_bench (median, L2
flushed), the variants in turn for --rounds rounds; the median of the rounds. Writes
<out>/<stamp>-<gpu>-sm80-evt.json and .png and prints the ratios the docs quote
(evtc ÷ plain CUTLASS 2.x, target ≤ 1.10 for W1 and W2; W2 ÷ the plain GEMM + C beside it).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import re
import statistics
import subprocess
import sys
import tempfile

import torch

os.environ.setdefault("EVTC_WAIT_FOR_COMPILE", "1")  # every timed call runs the fused kernel
import evtc  # noqa: E402
from fp8_blockwise import time_in_turn  # noqa: E402
from result_files import write_do_bench_results  # noqa: E402
from variant_plot import plot_variants  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
W1 = "input bias[n]: bf16\nout D: bf16 = silu(acc + bias[n])"
W2 = "input gate[m,n]: bf16\nout D: bf16 = acc * gate[m,n]"
PLAIN = "out D: bf16 = acc"


def build_plain(kernel_source: str) -> ctypes.CDLL:
    """The plain GEMM in the tile, warp tile and stages of evtc's kernel (read from its source)."""
    def value(pattern):
        m = re.search(pattern, kernel_source)
        if not m:
            sys.exit(f"no {pattern!r} in evtc's sm_80 kernel source")
        return [int(v) for v in m.groups()]
    tm, tn, tk = value(r"using ThreadblockShape = cutlass::gemm::GemmShape<(\d+), (\d+), (\d+)>;")
    wm, wn, _ = value(r"using WarpShape = cutlass::gemm::GemmShape<(\d+), (\d+), (\d+)>;")
    (stages,) = value(r"constexpr int kStages = (\d+);")
    cutlass = os.environ.get("EVTC_CUTLASS_DIR") or os.path.join(os.path.dirname(evtc.__file__), "cutlass")
    out = os.path.join(tempfile.mkdtemp(prefix="evtc-plain-"), "plain_gemm.so")
    cmd = ["nvcc", "-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr", "-Xcompiler=-fPIC", "-shared",
           "-gencode=arch=compute_80,code=[sm_80,compute_80]", f"-I{cutlass}/include",
           f"-DTILE_M={tm}", f"-DTILE_N={tn}", f"-DTILE_K={tk}", f"-DWARP_M={wm}", f"-DWARP_N={wn}",
           f"-DSTAGES={stages}", os.path.join(HERE, "sm80", "plain_gemm.cu"), "-o", out]
    subprocess.run(cmd, check=True)
    lib = ctypes.CDLL(out)
    lib.plain_gemm.restype = ctypes.c_int
    lib.plain_gemm.argtypes = [ctypes.c_int] * 3 + [ctypes.c_void_p] * 3 + [ctypes.c_float] + [ctypes.c_void_p] * 2
    return lib


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="8192x8192x1024,4096x4096x4096")
    p.add_argument("--config", default="ms_128x256x64_s3")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    opts = p.parse_args()
    dev = torch.cuda.get_device_name()
    cc = torch.cuda.get_device_capability()
    print(f"device: {dev} (sm_{cc[0]}{cc[1]}), torch {torch.__version__}", flush=True)

    sm80 = {name: evtc.compile(expr, arch="sm80", config=opts.config) for name, expr in
            (("W1", W1), ("W2", W2), ("D = acc", PLAIN))}
    hopper = {name: evtc.compile(expr) for name, expr in (("W1", W1), ("W2", W2))} if cc == (9, 0) else {}
    for k in [*sm80.values(), *hopper.values()]:
        k.compile_async(0, 0, 0).result()
    # The generated source sits beside the compiled library in evtc's cache.
    with open(os.path.join(os.path.dirname(sm80["W1"].library_path), "kernel.cu")) as f:
        plain_lib = build_plain(f.read())

    shapes = []
    for shape in opts.shapes.split(","):
        m, n, k = (int(v) for v in shape.split("x"))
        torch.manual_seed(m + n + k)
        a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        w = torch.randn(n, k, device="cuda").to(torch.bfloat16)
        b = w.t()
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        gate = torch.randn(m, n, device="cuda").to(torch.bfloat16)
        acc = a.double() @ b.double()
        want = {"W1": torch.nn.functional.silu(acc + bias.double()), "W2": acc * gate.double(), "plain": acc,
                "plus C": acc + gate.double()}
        d_plain = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

        def plain_cutlass(c=None):
            rc = plain_lib.plain_gemm(m, n, k, a.data_ptr(), w.data_ptr(), None if c is None else c.data_ptr(),
                                      0.0 if c is None else 1.0, d_plain.data_ptr(),
                                      torch.cuda.current_stream().cuda_stream)
            if rc:
                raise RuntimeError(f"plain CUTLASS GEMM failed ({rc})")
            return d_plain

        variants = {f"plain CUTLASS 2.x {opts.config}": ("plain", plain_cutlass),
                    f"plain CUTLASS 2.x + C {opts.config}": ("plus C", lambda: plain_cutlass(gate))}
        variants[f"evtc sm80 W1 {opts.config}"] = ("W1", lambda: sm80["W1"](a, b, bias=bias))
        variants[f"evtc sm80 W2 {opts.config}"] = ("W2", lambda: sm80["W2"](a, b, gate=gate))
        variants[f"evtc sm80 D = acc {opts.config}"] = ("plain", lambda: sm80["D = acc"](a, b))
        if hopper:
            variants["evtc sm90a W1 (default)"] = ("W1", lambda: hopper["W1"](a, b, bias=bias))
            variants["evtc sm90a W2 (default)"] = ("W2", lambda: hopper["W2"](a, b, gate=gate))
        variants["torch cuBLAS alone"] = ("plain", lambda: a @ b)
        variants["torch W1 unfused (cuBLAS + eager)"] = ("W1", lambda: torch.nn.functional.silu(a @ b + bias))
        variants["torch W2 unfused (cuBLAS + eager)"] = ("W2", lambda: (a @ b) * gate)

        checks = {}
        for name, (epi, fn) in variants.items():
            got = fn().double()
            err = float((got - want[epi]).norm() / want[epi].norm())
            checks[name] = err
            if not err < 2e-2:
                sys.exit(f"{shape} {name}: relative error {err:.3g} against float64")
        for name, kern in [*sm80.items(), *hopper.items()]:
            if why := kern.fallback_reason(m, n, k):
                sys.exit(f"{shape}: evtc {name} does not fuse: {why}")

        times = time_in_turn(variants, opts.rounds)
        result = {"shape": [m, n, k], "variants": {}}
        for name, ts in times.items():
            med = statistics.median(ts)
            result["variants"][name] = {"ms": med, "rounds_ms": ts, "tflops": 2 * m * n * k / med / 1e9,
                                        "rel_l2_vs_fp64": checks[name]}
        v = result["variants"]
        base = v[f"plain CUTLASS 2.x {opts.config}"]["ms"]
        result["evt_cost"] = {w: v[f"evtc sm80 {w} {opts.config}"]["ms"] / base for w in ("W1", "W2", "D = acc")}
        # W2 reads an [m,n] operand: against the plain GEMM that reads one too (D = A·B + C), the
        # same memory traffic, the ratio is the visitor tree's own cost.
        result["evt_cost"]["W2 vs plain + C"] = (v[f"evtc sm80 W2 {opts.config}"]["ms"] /
                                                 v[f"plain CUTLASS 2.x + C {opts.config}"]["ms"])
        result["vs_cublas"] = {w: v[f"evtc sm80 {w} {opts.config}"]["ms"] / v["torch cuBLAS alone"]["ms"]
                               for w in ("W1", "W2", "D = acc")}
        shapes.append(result)
        print(f"\n{shape} ({dev}):")
        for name, r in v.items():
            print(f"  {name:45s} {r['ms']:.4f} ms  {r['tflops']:6.1f} TFLOP/s  rel err {r['rel_l2_vs_fp64']:.2e}")
        print("  evtc sm80 ÷ plain CUTLASS 2.x: " + ", ".join(f"{w} {x:.3f}" for w, x in result["evt_cost"].items()))
        print("  evtc sm80 ÷ cuBLAS:            " + ", ".join(f"{w} {x:.3f}" for w, x in result["vs_cublas"].items()))

    base = write_do_bench_results(opts.out, dev, "sm80-evt", opts.rounds, shapes, torch.__version__)
    print(f"\nwrote {base}.json")
    try:
        plot_variants([(f"{r['shape'][0]}×{r['shape'][1]}×{r['shape'][2]}", r["variants"]) for r in shapes],
                      base + ".png", f"sm_80 backend (CUTLASS 2.x EVT) on {dev}", lambda r: r["ms"], "ms",
                      lambda x: f"{x:.3f} ms")
        print(f"wrote {base}.png")
    except ImportError as e:
        print(f"no plot: {e}")


if __name__ == "__main__":
    main()
