#!/usr/bin/env python3
"""fp8 two-level accumulation: speed and accuracy of the promotion interval, against cuBLASLt.

    python3 bench/fp8_promotion.py [--size 4096] [--accuracy-k 4096,16384] [--out bench/results]

evtc's default fp8 main loop adds the tensor cores' partial sums into fp32 registers every 128 of
K (CUTLASS's default, 4 WGMMAs), each promotion overlapping the next K tile's WGMMAs; a
configuration suffix `_pk<K>` (KernelConfig::fp8_promotion_k) makes that every K in CUTLASS's own
loop. This times W3 (`acc * sa[m] * sb[n]`, bf16, e4m3 A and B, row-wise scales) at SIZE³ with the
default, `_pk128` (the same sums in CUTLASS's loop), `_pk256`, `_pk512` and fast accumulation
(`_fastacc`, never promoted),
against `torch._scaled_mm` (default and `use_fast_accum=True`), and measures each one's error
with an f32 output against float64 at M = N = 1024 for each K of --accuracy-k: the relative L2
error and the largest error over the output's rms. Timing: triton.testing.do_bench medians, the
variants in turn, median of --rounds rounds. Writes <out>/<stamp>-<gpu>-fp8-promotion.json and .png.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import triton.testing

import evtc
from result_files import result_base

W3 = "input sa[m]: f32\ninput sb[n]: f32\nout D: {} = acc * sa[m] * sb[n]"
BASE = "coop_128x128x128_c1x1_persistent"
# The default runs evtc's overlapped promotion (evtc/device/sm90_fp8_mainloop.cuh); `_pk128`
# promotes at the same interval in CUTLASS's own loop, which waits for the tensor cores first.
VARIANTS = {"evtc default (128)": BASE, "evtc _pk128 (CUTLASS's loop)": BASE + "_pk128",
            "evtc _pk256": BASE + "_pk256", "evtc _pk512": BASE + "_pk512", "evtc _fastacc": BASE + "_fastacc"}


def operands(m, n, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = (torch.randn(m, k, generator=g, device="cuda") * k ** -0.25).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, generator=g, device="cuda") * k ** -0.25).to(torch.float8_e4m3fn)
    sa = torch.rand(m, 1, generator=g, device="cuda") + 0.5
    sb = torch.rand(1, n, generator=g, device="cuda") + 0.5
    want = (a.double() @ w.double().t()) * sa.double() * sb.double()
    return a, w, sa, sb, want


def errors(got, want):
    d = got.double() - want
    return {"rel_l2": float(d.norm() / want.norm()), "max_over_rms": float(d.abs().max() / want.pow(2).mean().sqrt())}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--accuracy-k", default="4096,16384")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    opts = p.parse_args()
    dev = torch.cuda.get_device_name()
    kw = {"a_dtype": "f8e4m3", "b_dtype": "f8e4m3"}
    timed = {name: evtc.compile(W3.format("bf16"), config=c, **kw) for name, c in VARIANTS.items()}
    exact = {name: evtc.compile(W3.format("f32"), config=c, **kw) for name, c in VARIANTS.items()}
    for f in [k.compile_async(0, 0, 0) for k in [*timed.values(), *exact.values()]]:
        f.result()

    accuracy = {}
    for k in [int(x) for x in opts.accuracy_k.split(",")]:
        a, w, sa, sb, want = operands(1024, 1024, k, k)
        row = {name: errors(kern(a, w.t(), sa=sa.view(-1), sb=sb.view(-1)), want) for name, kern in exact.items()}
        for name, fast in (("torch _scaled_mm", False), ("torch _scaled_mm fast", True)):
            got = torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float32, use_fast_accum=fast)
            row[name] = errors(got, want)
        accuracy[k] = row

    s = opts.size
    a, w, sa, sb, want = operands(s, s, s, 1)
    fns = {name: (lambda kern=kern: kern(a, w.t(), sa=sa.view(-1), sb=sb.view(-1))) for name, kern in timed.items()}
    fns["torch _scaled_mm"] = lambda: torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    fns["torch _scaled_mm fast"] = lambda: torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                                            use_fast_accum=True)
    for name, fn in fns.items():  # bf16 outputs: within bf16 rounding of the float64 product
        err = errors(fn(), want)["rel_l2"]
        assert err < 2.0**-6, f"{name}: rel L2 {err:.2e}"
    times = {name: [] for name in fns}
    for _ in range(opts.rounds):
        for name, fn in fns.items():
            times[name].append(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    ms = {name: statistics.median(t) for name, t in times.items()}
    ref = ms["torch _scaled_mm"]
    print(f"device: {dev}; W3 at {s}^3 (ms, / _scaled_mm default) and errors of f32 outputs against float64")
    for name in fns:
        errs = "  ".join(f"K={k}: rel L2 {accuracy[k][name]['rel_l2']:.2e}, max/rms {accuracy[k][name]['max_over_rms']:.2e}"
                         for k in accuracy)
        print(f"  {name:24s} {ms[name]:.4f} ms  {ms[name] / ref:.3f}x   {errs}")
    base = result_base(opts.out, dev, "fp8-promotion")
    with open(base + ".json", "w") as f:
        json.dump({"device": dev, "torch": torch.__version__, "size": s, "ms": ms, "rounds_ms": times,
                   "accuracy_f32_vs_f64": {str(k): v for k, v in accuracy.items()},
                   "method": f"do_bench median, variants in turn, median of {opts.rounds} rounds"}, f, indent=2)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    names = list(fns)
    ax1.barh(names, [ms[n] / ref for n in names], color=["tab:green" if n.startswith("evtc") else "tab:blue" for n in names])
    ax1.axvline(1.0, color="k", lw=0.8)
    ax1.invert_yaxis()
    ax1.set_xlabel(f"time / torch._scaled_mm (W3, {s}³)")
    kmax = max(accuracy)
    ax2.barh(names, [accuracy[kmax][n]["rel_l2"] for n in names], color="tab:gray")
    ax2.invert_yaxis()
    ax2.set_xscale("log")
    ax2.set_xlabel(f"rel L2 error of an f32 output, K = {kmax}")
    fig.suptitle(f"fp8 two-level accumulation: promotion interval, {dev}")
    fig.tight_layout()
    fig.savefig(base + ".png", dpi=110)
    print(f"wrote {base}.json and .png")


if __name__ == "__main__":
    main()
