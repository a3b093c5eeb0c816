#!/usr/bin/env python3
"""Kernels of the benchmark rows that miss their targets, launched once each for Nsight Compute:
evtc's fused kernel, the plain ``D = acc`` kernel of the same configuration, and cuBLAS's GEMM
(through torch) of the same shape, in that order per row.

    ncu --profile-from-start off --clock-control none --set basic --section MemoryWorkloadAnalysis \\
        --section Occupancy --section LaunchStats -o prof python3 bench/profile_rows.py [--rows W1-8192,W7]

Only the launches between cudaProfilerStart and cudaProfilerStop are profiled (the kernels are
compiled and warmed up before). The script prints each profiled launch's row and role in order,
which is the order of the report's kernels.
"""
from __future__ import annotations

import argparse
import json

import torch

import evtc

ROWS = {
    # id: (expression, M, N, K, operands)
    "W1-8192": ("out D: bf16 = silu(acc + bias[n])", 8192, 8192, 8192, ("bias",)),
    "W1-4096": ("out D: bf16 = silu(acc + bias[n])", 4096, 4096, 4096, ("bias",)),
    "W7": ("f = acc + bias[n]; out loss = sum((C - 1) * f + log(clamp(sigmoid(f), 1e-3, 0.999)))",
           8192, 8192, 1024, ("bias", "C")),
    "biasgrad": ("out D: bf16 = acc; out db = col_sum(acc)", 8192, 8192, 1024, ()),
}


def operands(names, m, n, gen):
    out = {}
    for name in names:
        shape = (n,) if name == "bias" else (m, n)
        out[name] = torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default=",".join(ROWS))
    args = p.parse_args()
    gen = torch.Generator("cuda").manual_seed(0)
    launches = []
    prepared = []
    for row in args.rows.split(","):
        expr, m, n, k, names = ROWS[row]
        a = torch.randn(m, k, generator=gen, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, generator=gen, device="cuda", dtype=torch.bfloat16)
        ops = operands(names, m, n, gen)
        fused = evtc.compile(expr)
        config = fused.config_for(m, n, k)
        plain = evtc.compile("out D: bf16 = acc", config=config)
        for kern in (fused, plain):
            kern.compile_async(m, n, k)
        prepared.append((row, a, w, ops, fused, plain, config))
    for row, a, w, ops, fused, plain, config in prepared:
        for _ in range(3):  # compiled, loaded and warm
            fused(a, w.t(), **ops)
            plain(a, w.t())
            torch.mm(a, w.t())
        assert fused.last_path == "fused" and plain.last_path == "fused", (row, fused.last_path, plain.last_path)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for row, a, w, ops, fused, plain, config in prepared:
        fused(a, w.t(), **ops)
        launches.append({"row": row, "role": "fused", "config": config})
        plain(a, w.t())
        launches.append({"row": row, "role": "plain D = acc", "config": config})
        torch.mm(a, w.t())
        launches.append({"row": row, "role": "cuBLAS (torch.mm)", "config": ""})
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("LAUNCHES " + json.dumps(launches))


if __name__ == "__main__":
    main()
