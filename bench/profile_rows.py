#!/usr/bin/env python3
"""Kernels of the benchmark rows that miss their targets, launched once each for Nsight Compute:
evtc's fused kernel, the plain ``D = acc`` kernel of the same configuration, and the library
GEMM of the same shape through torch (cuBLAS's ``mm``; cuBLASLt's row-wise ``_scaled_mm`` for
the fp8 rows; ``_grouped_mm`` for the grouped row), in that order per row.

    ncu --profile-from-start off --clock-control none --set basic --section MemoryWorkloadAnalysis \\
        --section Occupancy --section LaunchStats -o prof python3 bench/profile_rows.py [--rows W1-8192,W7]

Only the launches between cudaProfilerStart and cudaProfilerStop are profiled (the kernels are
compiled and warmed up before). The script prints each profiled launch's row and role in order,
which is the order of the report's kernels.

    python3 bench/profile_rows.py --timeline [--calls 50] [--rows ...] [--configs NAME,...] [--json FILE]

--timeline runs without Nsight Compute: per row, evtc's fused call and the library call each run
--calls times back to back under torch.profiler, and what the GPU did is read from its device
events (kernels, memsets, copies): per call, the device time of each kind of operation, the span
from the call's first operation's start to its last one's end, and the gap from one call's end
to the next call's start (the GPU idle between calls), with a GPU sleep queued first so that the
host stays ahead. Nothing else runs on the stream meanwhile.

--configs NAME[,NAME...] runs each dense row with each named configuration instead of evtc's
default one (the plain kernel with the same one): for example the split of a decode shape's time
between a K-in-parts GEMM and the kernel that adds its parts.
"""
from __future__ import annotations

import argparse
import json
from statistics import median_high as median

import torch

import evtc

ROWS = {
    # id: (expression, M, N, K, operands); fp8 rows take e4m3 A and B with row-wise scales sa, sb
    "W1-8192": ("out D: bf16 = silu(acc + bias[n])", 8192, 8192, 8192, ("bias",)),
    "W1-4096": ("out D: bf16 = silu(acc + bias[n])", 4096, 4096, 4096, ("bias",)),
    "W7": ("f = acc + bias[n]; out loss = sum((C - 1) * f + log(clamp(sigmoid(f), 1e-3, 0.999)))",
           8192, 8192, 1024, ("bias", "C")),
    "biasgrad": ("out D: bf16 = acc; out db = col_sum(acc)", 8192, 8192, 1024, ()),
    "W3": ("input sa[m]: f32\ninput sb[n]: f32\nout D: bf16 = acc * sa[m] * sb[n]", 4096, 4096, 4096,
           ("sa", "sb")),
    "W3gelu": ("input sa[m]: f32\ninput sb[n]: f32\ninput bias[n]: bf16\n"
               "out D: bf16 = gelu(acc * sa[m] * sb[n] + bias[n])", 4096, 4096, 4096, ("sa", "sb", "bias")),
    # Plain GEMMs between the selection tables' M values (docs/backend.md, "Shapes outside the
    # table"), where no configuration evtc has reaches cuBLAS: what cuBLAS's kernel is there.
    "midM-100": ("out D: bf16 = acc", 100, 3072, 8192, ()),
    "midM-200": ("out D: bf16 = acc", 200, 7168, 5120, ()),
    "midM-300": ("out D: bf16 = acc", 300, 35840, 5120, ()),
    "midM-88": ("out D: bf16 = acc", 88, 11008, 4096, ()),
    # The --off-grid shapes furthest above cuBLAS after rule 13 (bench/README.md, "H200, between
    # 64 and 128 rows: rule 13").
    "midM-160": ("out D: bf16 = acc", 160, 3072, 2048, ()),
    "midM-384": ("out D: bf16 = acc", 384, 16384, 3072, ()),
    "prefill-3500x7680x5120": ("out D: bf16 = acc", 3500, 7680, 5120, ()),
    # Decode-sized grid shapes where evtc's default stays above cuBLAS on the H200 after its
    # table's refinement (bench/README.md, "H200, M ≤ 64, the whole candidate space").
    "decode-16x10240x8192": ("out D: bf16 = acc", 16, 10240, 8192, ()),
    "decode-64x10240x8192": ("out D: bf16 = acc", 64, 10240, 8192, ()),
    "decode-64x4608x3584": ("out D: bf16 = acc", 64, 4608, 3584, ()),
    "decode-16x1024x4096": ("out D: bf16 = acc", 16, 1024, 4096, ()),
    "decode-64x1024x4096": ("out D: bf16 = acc", 64, 1024, 4096, ()),
    # Decode shapes outside the table still above 1.04x after rules 8-11 (docs/backend.md, "Shapes
    # outside the table"): the M = 64 entries' 64x48 and 64x64 tiles at N = 4544-5120, and 2 parts
    # of the transposed 64x32 tile at N = 1536, K = 8960.
    "decode-48x4544x4544": ("out D: bf16 = acc", 48, 4544, 4544, ()),
    "decode-48x5120x4096": ("out D: bf16 = acc", 48, 5120, 4096, ()),
    "decode-48x1536x8960": ("out D: bf16 = acc", 48, 1536, 8960, ()),
    # The o and down projections' residual add, read as an [m,n] operand (r) or as the
    # collective's source C, against the plain GEMM of the same configuration.
    "residual-8192x4096x4096": ("input r[m,n]: bf16\nout D: bf16 = acc + r", 8192, 4096, 4096, ("r",)),
    "residual-8192x4096x11008": ("input r[m,n]: bf16\nout D: bf16 = acc + r", 8192, 4096, 11008, ("r",)),
    "residual_c-8192x4096x4096": ("out D: bf16 = acc + C", 8192, 4096, 4096, ("C",)),
}
# Grouped rows (W6): (expression, groups, rows per group, N, K); the reference is torch._grouped_mm.
GROUPED_ROWS = {
    "W6": ("out y: bf16 = gptoss_swiglu(acc + bias[n])", 8, 1024, 4096, 2048),
}


def operands(names, m, n, gen):
    out = {}
    for name in names:
        if name in ("sa", "sb"):
            out[name] = torch.rand((m if name == "sa" else n,), generator=gen, device="cuda") + 0.5
            continue
        shape = (n,) if name == "bias" else (m, n)
        out[name] = torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)
    return out


def dense_row(row, gen, config=None):
    """(fused, plain, reference) launchers and the configuration of a dense row (evtc's default
    configuration, or `config`)."""
    expr, m, n, k, names = ROWS[row]
    fp8 = "sa" in names
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    a = (torch.randn(m, k, generator=gen, device="cuda") * k ** -0.25).to(dtype)
    w = (torch.randn(n, k, generator=gen, device="cuda") * k ** -0.25).to(dtype)
    ops = operands(names, m, n, gen)
    kw = {"a_dtype": "f8e4m3", "b_dtype": "f8e4m3"} if fp8 else {}
    fused = evtc.compile(expr, config=config, **kw) if config else evtc.compile(expr, **kw)
    config = fused.config_for(m, n, k)
    plain = evtc.compile("out D: bf16 = acc", config=config, **kw)
    for kern in (fused, plain):
        kern.compile_async(m, n, k)
    if fp8:
        sa, sb = ops["sa"].view(m, 1), ops["sb"].view(1, n)
        reference = ("cuBLASLt (torch._scaled_mm, row-wise)",
                     lambda: torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16))
    else:
        reference = ("cuBLAS (torch.mm)", lambda: torch.mm(a, w.t()))
    return (lambda: fused(a, w.t(), **ops)), (lambda: plain(a, w.t())), reference, config, (fused, plain)


def grouped_row(row, gen):
    expr, g, rows, n, k = GROUPED_ROWS[row]
    x = torch.randn(g * rows, k, generator=gen, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(g, n, k, generator=gen, device="cuda", dtype=torch.bfloat16) * k ** -0.5
    bias = torch.randn(g, n, generator=gen, device="cuda", dtype=torch.bfloat16)
    offs = torch.arange(1, g + 1, device="cuda", dtype=torch.int32) * rows
    fused = evtc.grouped(expr)
    plain = evtc.grouped("out D: bf16 = acc", config=fused.config)
    for kern in (fused, plain):
        kern.compile()
    wt = w.transpose(1, 2)
    reference = ("CUTLASS ptr-array (torch._grouped_mm)", lambda: torch._grouped_mm(x, wt, offs=offs))
    return (lambda: fused(x, wt, offs, bias=bias)), (lambda: plain(x, wt, offs)), reference, fused.config, (fused, plain)


def device_timeline(call, calls: int) -> dict:
    """`call` run `calls` times back to back under torch.profiler: per call (medians), the device
    time by operation name, the span of the call's operations and the idle gap before the next
    call. A call's operations are told apart by the order they were issued in: each call issues
    the same number."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        # A GPU sleep queued first keeps the host ahead of the GPU, so that the gaps are the GPU's
        # own, not the host's launch cost (about 5 ms at Hopper's clocks; the calls queue meanwhile).
        torch.cuda._sleep(10_000_000)
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA and "spin_kernel" not in e.name
                     and "sleep" not in e.name),
                    key=lambda e: e.time_range.start)
    if not events or len(events) % calls:
        return {"error": f"{len(events)} device operations over {calls} calls"}
    per = len(events) // calls
    groups = [events[i * per:(i + 1) * per] for i in range(calls)]

    names = [e.name[:100] for e in groups[0]]
    return {
        "operations_per_call": names,
        "device_us": {name: round(median([g[i].time_range.elapsed_us() for g in groups]), 2)
                      for i, name in enumerate(names)},
        "span_us": round(median([g[-1].time_range.end - g[0].time_range.start for g in groups]), 2),
        "gap_us": round(median([b[0].time_range.start - a[-1].time_range.end
                                for a, b in zip(groups, groups[1:])]), 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default=",".join([*ROWS, *GROUPED_ROWS]))
    p.add_argument("--timeline", action="store_true",
                   help="torch.profiler's device timeline of back-to-back calls instead of Nsight Compute launches")
    p.add_argument("--calls", type=int, default=50, help="calls per variant with --timeline (at least 2)")
    p.add_argument("--json", help="with --timeline: also write the results to this file")
    p.add_argument("--configs", help="run each dense row with each of these configurations (comma-separated) "
                                     "instead of evtc's default")
    args = p.parse_args()
    if args.calls < 2:
        p.error(f"--calls: {args.calls}; the gap between calls needs at least 2")
    unknown = [r for r in args.rows.split(",") if r not in ROWS and r not in GROUPED_ROWS]
    if unknown:
        p.error(f"--rows: unknown row(s) {', '.join(unknown)}; known: {', '.join([*ROWS, *GROUPED_ROWS])}")
    configs = [c for c in (args.configs or "").split(",") if c]
    if configs and any(r in GROUPED_ROWS for r in args.rows.split(",")):
        p.error("--configs: dense rows only; the grouped row's configuration is its kernel's own")
    gen = torch.Generator("cuda").manual_seed(0)
    launches = []
    prepared = []
    for row in args.rows.split(","):
        if row in GROUPED_ROWS:
            prepared.append((row, *grouped_row(row, gen)))
        else:
            for config in configs or [None]:
                prepared.append((row, *dense_row(row, gen, config)))
    for row, fused, plain, (_, reference), config, kernels in prepared:
        for _ in range(3):  # compiled, loaded and warm
            fused()
            plain()
            reference()
        assert all(kern.last_path == "fused" for kern in kernels), (row, [kern.last_path for kern in kernels])
    if args.timeline:
        results = []
        for row, fused, plain, (ref_name, reference), config, kernels in prepared:
            for role, call in (("evtc " + config, fused), (ref_name, reference)):
                t = device_timeline(call, args.calls)
                results.append({"row": row, "role": role, **t})
                print(f"{row} {role}: span {t.get('span_us')} us, gap {t.get('gap_us')} us, "
                      f"device {t.get('device_us', t.get('error'))}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "calls": args.calls,
                           "rows": results}, f, indent=2)
        return
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for row, fused, plain, (ref_name, reference), config, kernels in prepared:
        fused()
        launches.append({"row": row, "role": "fused", "config": config})
        plain()
        launches.append({"row": row, "role": "plain D = acc", "config": config})
        reference()
        launches.append({"row": row, "role": ref_name, "config": ""})
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("LAUNCHES " + json.dumps(launches))


if __name__ == "__main__":
    main()
