#!/usr/bin/env python3
"""Differential test of the PyTorch path on random functions: torch.compile(backend="evtc")
against float64 eager, on the GPU.

    python3 bench/fuzz_torch.py [--seed S] [--count N] [--out bench/results] [--limit SECONDS]

The functions come from tests/python/random_torch.py (a GEMM and a random pointwise chain, one or
two outputs, sizes that are not tile multiples). All are compiled with profitability off (every
fusable chain fuses): first each compiled function is called once inside
evtc.torch.compile_only(), so every kernel compiles at once (EVTC_COMPILE_JOBS at a time); then,
after evtc.torch.wait_for_compiles(), each runs on fresh random inputs, with NaN left in
the caching allocator's free blocks of the outputs' sizes first (an element the kernel leaves unwritten shows).
A function passes when it was fused (one fused op, which ran its fused kernel), and each output's
relative L2 error against the float64 reference (the same bf16 inputs; casts round and go on in
float64) is within max(4 × eager's error, 1e-2 for bf16 / 1e-3 for float32 outputs), with no NaN
the reference does not have. Each failure prints the function's source. Writes
<stamp>-<gpu>-fuzz-torch.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

# A hit in Inductor's FX-graph or AOT-autograd cache skips evtc's pass (no FusionReport to read).
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "python"))
import evtc  # noqa: E402
import evtc.torch  # noqa: E402
from random_torch import generate, make_inputs  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from result_files import result_base  # noqa: E402


def cast(t, dtype):
    return t.to(dtype)


def cast_rounding_in_float64(t, dtype):
    return t.to(dtype).to(torch.float64)


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def poison_outputs(m: int, n: int) -> None:
    """Leaves NaN in the caching allocator's free blocks of an m×n output's sizes, which the
    compiled function's outputs then reuse (an element the kernel leaves unwritten shows)."""
    for dtype in (torch.bfloat16, torch.float32):
        t = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
        del t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--limit", type=float, default=0.0, help="stop starting new work after this many seconds")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("fuzz_torch: needs a CUDA GPU", file=sys.stderr)
        return 2
    # Every function is a compile of one wrapper's code (told apart by a guard on the function it
    # calls): room for all of them in Dynamo's per-code cache.
    for limit in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                  "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 4 * args.count))
    t0 = time.perf_counter()
    namespace = {"torch": torch, "F": F}
    gen = torch.Generator(device="cuda")
    cases = []
    for i in range(args.count):
        f = generate(args.seed, i)
        fn = f.function(namespace)
        compiled = torch.compile(lambda *a, _fn=fn: _fn(*a, cast), backend="evtc", dynamic=False,
                                 options={"evtc.profitability": False})
        cases.append((f, fn, compiled))
    # 1. trace every function and start every kernel compile
    before = len(evtc.torch.reports)
    traced = []
    with evtc.torch.compile_only():
        for f, fn, compiled in cases:
            if args.limit and time.perf_counter() - t0 > args.limit / 2:
                break
            gen.manual_seed(args.seed * 7919 + len(traced))
            try:
                compiled(*make_inputs(f, torch, "cuda", gen))
                traced.append((f, fn, compiled, evtc.torch.reports[before:]))
            except Exception as e:  # noqa: BLE001 - reported per function
                traced.append((f, fn, compiled, e))
            before = len(evtc.torch.reports)
    trace_s = time.perf_counter() - t0
    print(f"traced {len(traced)} functions in {trace_s:.1f} s; compiling", flush=True)
    compile_errors = evtc.torch.wait_for_compiles()
    compile_s = time.perf_counter() - t0 - trace_s
    print(f"kernels compiled in {compile_s:.1f} s ({len(compile_errors)} failed)", flush=True)
    # 2. run each against float64
    rows, failures = [], 0
    for f, fn, compiled, reports in traced:
        row = {"name": f.name, "m": f.m, "n": f.n, "k": f.k, "outputs": f.outputs, "source": f.source}
        if isinstance(reports, Exception):
            row["error"] = f"{type(reports).__name__}: {reports}"
        else:
            fused = [fu for r in reports for fu in r.fused]
            row["fused"] = len(fused)
            gen.manual_seed(args.seed * 104729 + len(rows))
            inputs = make_inputs(f, torch, "cuda", gen)
            counts_before = [evtc.torch.path_counts(fu.spec)["fused"] for fu in fused]
            poison_outputs(f.m, f.n)
            out = compiled(*inputs)
            torch.cuda.synchronize()
            row["ran_fused"] = bool(fused) and all(evtc.torch.path_counts(fu.spec)["fused"] > c for fu, c in zip(fused, counts_before))
            eager = fn(*inputs, cast)
            ref = fn(*[t.double() for t in inputs], cast_rounding_in_float64)
            outs, eagers, refs = [(o if isinstance(o, tuple) else (o,)) for o in (out, eager, ref)]
            row["checks"] = []
            ok = row["fused"] == 1 and row["ran_fused"]
            for o, e, r in zip(outs, eagers, refs):
                err, eager_err = rel_l2(o, r), rel_l2(e, r)
                floor = 1e-2 if o.dtype == torch.bfloat16 else 1e-3
                bound = max(4 * eager_err, floor)
                nan_added = bool((torch.isnan(o) & ~torch.isnan(r)).any())
                passed = err <= bound and not nan_added
                ok = ok and passed
                row["checks"].append({"dtype": str(o.dtype), "rel_l2": err, "eager_rel_l2": eager_err,
                                      "bound": bound, "nan_added": nan_added, "pass": passed})
            row["pass"] = ok
        if not row.get("pass"):
            failures += 1
            print(f"FAIL {f.name} ({f.m}x{f.n}x{f.k}): {row.get('error') or row}\n{f.source}", flush=True)
        rows.append(row)
    total_s = time.perf_counter() - t0
    passed = sum(1 for r in rows if r.get("pass"))
    print(f"{passed} of {len(rows)} random functions passed (fused, ran fused, within tolerance); "
          f"{failures} failed; {total_s:.1f} s", flush=True)
    path = result_base(args.out, torch.cuda.get_device_name(), "fuzz-torch") + ".json"
    with open(path, "w") as fh:
        json.dump({"seed": args.seed, "count": len(rows), "passed": passed, "failed": failures,
                   "trace_s": trace_s, "compile_s": compile_s, "total_s": total_s,
                   "compile_errors": compile_errors, "torch": torch.__version__,
                   "gpu": torch.cuda.get_device_name(), "functions": rows}, fh, indent=1)
    print(f"wrote {path}")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
