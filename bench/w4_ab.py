#!/usr/bin/env python3
"""W4 (7697×27304×5120 swiglu7) with two compiled kernel libraries, timed alternately in one
process (six rounds, triton do_bench medians, cuBLAS mm in each round): for comparing two
builds of one kernel (e.g. device headers given with EVTC_INCLUDE_DIR) on a shape whose
run-to-run spread is larger than the difference.

    python3 bench/w4_ab.py NAME_A=LIBRARY_A NAME_B=LIBRARY_B [--json OUT]
"""
import argparse
import json
import os
import statistics
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_scaled_mm import FusedKernel  # noqa: E402  (the C-ABI caller)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kernels", nargs=2, metavar="NAME=LIBRARY")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--json")
    opts = ap.parse_args()
    m, n, k = 7697, 27304, 5120
    x = (torch.randn(m, k, device="cuda") * k ** -0.25).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") * k ** -0.25 * 3).to(torch.bfloat16)
    launches = {}
    for spec in opts.kernels:
        name, _, path = spec.partition("=")
        y = torch.full((m, n // 2), float("nan"), dtype=torch.bfloat16, device="cuda")
        launches[name] = FusedKernel(path).bind(x, w, None, {"y": y})
        launches[name]()
        torch.cuda.synchronize()
        if torch.isnan(y).any():
            sys.exit(f"{name}: unwritten output elements")
    launches["cuBLAS mm"] = lambda: torch.mm(x, w.t())
    times = {name: [] for name in launches}
    for _ in range(opts.rounds):
        for name, fn in launches.items():
            times[name].append(triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median"))
    result = {"device": torch.cuda.get_device_name(), "shape": [m, n, k], "ms": times,
              "median_ms": {name: statistics.median(ts) for name, ts in times.items()}}
    for name, ts in times.items():
        print(f"{name:14s} median {statistics.median(ts):.4f} ms  runs {' '.join(f'{t:.3f}' for t in ts)}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
