#!/usr/bin/env python3
"""Host (CPU) cost per call of one fused GEMM + epilogue, from each way of calling it.

    python3 bench/host_cost.py [--evtc PATH_TO_EVTC] [--out bench/results] [--profile]

The chain is ``silu(a @ w.t() + v)`` (bf16) at M=1000, N=1016, K=2048, whose GPU time
(~15 µs) is below every path's host cost, so a tight loop of calls measures the host side:
wall time of N back-to-back calls / N, after warm-up. Rows:
  inductor      torch.compile (default mode): cuBLAS GEMM + one Triton pointwise kernel
  evtc_backend  torch.compile(backend=evtc.torch.backend), default options: what a user gets
                (at this small shape the profitability model may leave the chain to Inductor)
  evtc_backend_fused
                the same with {"evtc.profitability": False}: the fused op called from
                Inductor's generated code, whatever the model says
  op            torch.ops.evtc.gemm_epilogue(spec, a, b, [v]) called directly
  kernel        evtc.compile(expr)(a, w.t(), bias=v): the Python Kernel object
  kernel_run    the C++ Kernel::run alone (`evtc run --bench`, when --evtc is given)
plus each path's GPU time per call in CUDA-graph replay. With --profile, a cProfile of the
evtc_backend loop is printed (where the host time goes). Writes
<stamp>-<gpu>-host-cost.json under --out.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pathlib
import pstats
import subprocess
import sys
import time

import torch
import torch._inductor.config
import torch.nn.functional as F

import evtc
import evtc.torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from result_files import result_base  # noqa: E402

M, N, K = 1000, 1016, 2048
EXPR = "out D: bf16 = silu(acc + bias[n])"


def per_call_us(fn, calls: int = 2000, rounds: int = 5) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def replay_us(fn, calls: int = 200) -> float:
    """GPU time per call: ``calls`` calls captured in one CUDA graph, replayed."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (5 * calls)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--evtc", help="the evtc command (for Kernel::run's own cost)")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results"))
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()

    # Inductor's on-disk FX graph cache would hand back a graph compiled by an earlier run
    # without running evtc's pass again (no FusionReport, so fused_graphs would read 0).
    torch._inductor.config.fx_graph_cache = False
    torch.manual_seed(0)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(N, device="cuda", dtype=torch.bfloat16)

    def chain(a, w, v):
        return F.silu(a @ w.t() + v)

    plain = torch.compile(chain)
    default = torch.compile(chain, backend=evtc.torch.backend)
    ref = chain(a, w, v)
    plain(a, w, v)
    default(a, w, v)
    default_fusions = [f for r in evtc.torch.reports for f in r.fused]
    evtc.torch.reports.clear()
    # The fused op's own call path: the profitability model off, so the chain is fused at this
    # shape (Dynamo keeps one compiled entry per backend and options).
    fused = torch.compile(chain, backend=evtc.torch.backend, options={"evtc.profitability": False})
    out = fused(a, w, v)
    evtc.torch.wait_for_compiles()
    out = fused(a, w, v)
    fusions = [f for r in evtc.torch.reports for f in r.fused]
    spec = fusions[-1].spec if fusions else evtc.torch.make_spec(
        "input x0[n]: bf16\nout D: bf16 = silu(acc + x0)\n",
        {"a_dtype": "bf16", "b_dtype": "bf16", "a_layout": "row", "b_layout": "col", "cast_mode": "eager"},
        [("x0", "row")], ["D"])
    kernel = evtc.compile(EXPR)
    kernel.compile(M, N, K)
    wt = w.t()
    op = torch.ops.evtc.gemm_epilogue.default
    direct_operands = [v]

    rows = {
        "inductor": lambda: plain(a, w, v),
        "evtc_backend": lambda: default(a, w, v),
        "evtc_backend_fused": lambda: fused(a, w, v),
        "op": lambda: op(spec, a, wt, direct_operands),
        "kernel": lambda: kernel(a, wt, bias=v),
    }
    result = {"shape": [M, N, K], "default_fused_graphs": len(default_fusions), "fused_graphs": len(fusions),
              "max_abs_error_vs_eager": float((out.float() - ref.float()).abs().max())}
    for name, fn in rows.items():
        result[f"{name}_host_us"] = per_call_us(fn)
        try:
            result[f"{name}_gpu_us"] = replay_us(fn)
        except Exception as e:  # noqa: BLE001 - a path that cannot be captured is reported, not fatal
            result[f"{name}_gpu_us_error"] = str(e).splitlines()[0]
    if args.evtc:
        with_json = pathlib.Path("/tmp/evtc-host-cost-run.json")
        subprocess.run([args.evtc, "run", EXPR, "-m", str(M), "-n", str(N), "-k", str(K), "--bench", "--json",
                        str(with_json)], check=True, capture_output=True)
        result["kernel_run_us"] = json.loads(with_json.read_text())["dispatch"]["run_us"]
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            fused(a, w, v)
        prof.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
        print(text.getvalue())
        result["profile_top"] = text.getvalue()
    base = result_base(args.out, torch.cuda.get_device_name(), "host-cost")
    pathlib.Path(base + ".json").write_text(json.dumps(result, indent=1))
    for key, value in result.items():
        if key != "profile_top":
            print(f"{key:28} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
