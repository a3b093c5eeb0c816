#!/usr/bin/env python3
"""PyTorch baselines of the benchmark workloads: eager, torch.compile and
torch.compile(mode="max-autotune-no-cudagraphs"), timed like evtc (CUDA events around each
call after warm-up, median), plus the plain GEMM alone on the same operands (torch.mm; for
the fp8 workloads torch._scaled_mm with the same row-wise scales, W3's reference).

max-autotune runs only for the workloads whose torch reference WORKLOADS.md lists a
max-autotune number for (it benchmarks many GEMM configurations per op and takes tens of
seconds each); the others record it as not measured.

Usage: torch_baselines.py OUT_JSON ID:M:N:K [ID:M:N:K ...]"""
import json
import sys
import time

import torch

# Workload family (the id's prefix before the first '-') -> (torch function, operand builder).
# Operands are random normal bf16 (C of the BCE loss is 0/1), A (M,K) and B (K,N) row-major
# like evtc's default layouts.


def w1(a, b, bias):
    return torch.nn.functional.silu(a @ b + bias)


def w2(a, b, gate):
    return (a @ b) * gate


def w7(a, b, bias, c):
    f = a @ b + bias
    return torch.sum((c - 1) * f + torch.log(torch.clamp(torch.sigmoid(f), 1e-3, 0.999)))


def w3(a, b, sa, sb):
    return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)


def w3gelu(a, b, sa, sb, bias):
    return torch.nn.functional.gelu(w3(a, b, sa, sb) + bias)


def plain(a, b):
    return a @ b


def biasgrad(a, b):
    d = a @ b
    return d, d.float().sum(0)


def operands(family, m, n, k):
    dev, bf16 = "cuda", torch.bfloat16
    if family in ("W3", "W3gelu"):
        # fp8 e4m3 A (M,K) row-major, B (K,N) column-major (a weight's (N,K).t()), f32
        # row-wise scales (M,1) and (1,N), as torch._scaled_mm takes them.
        fp8 = torch.float8_e4m3fn
        a8 = torch.randn(m, k, device=dev).to(fp8)
        b8 = torch.randn(n, k, device=dev).to(fp8).t()
        sa = torch.rand(m, 1, device=dev) + 0.5
        sb = torch.rand(1, n, device=dev) + 0.5
        if family == "W3":
            return (a8, b8, sa, sb)
        return (a8, b8, sa, sb, torch.randn(n, device=dev, dtype=bf16))
    a = torch.randn(m, k, device=dev, dtype=bf16)
    b = torch.randn(k, n, device=dev, dtype=bf16)
    if family == "W1":
        return (a, b, torch.randn(n, device=dev, dtype=bf16))
    if family == "W2":
        return (a, b, torch.randn(m, n, device=dev, dtype=bf16))
    if family == "W7":
        return (a, b, torch.randn(n, device=dev, dtype=bf16),
                torch.randint(0, 2, (m, n), device=dev).to(bf16))
    return (a, b)


FAMILIES = {"W1": w1, "W2": w2, "W3": w3, "W3gelu": w3gelu, "W7": w7, "plain": plain,
            "biasgrad": biasgrad}
# (family, M, N, K) with a max-autotune number in WORKLOADS.md.
AUTOTUNE = {("W1", 4096, 4096, 4096), ("W1", 8192, 8192, 1024), ("W2", 8192, 8192, 1024),
            ("W3gelu", 4096, 4096, 4096)}


def median_ms(fn, args, warmup=10, iterations=50):
    for _ in range(warmup):
        fn(*args)
    torch.cuda.synchronize()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(iterations)]
    for start, end in pairs:
        start.record()
        fn(*args)
        end.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in pairs)
    return times[iterations // 2]


def measure(fn, args):
    """Median ms and the seconds the first call took (compilation, for compiled modes)."""
    start = time.perf_counter()
    fn(*args)
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    return median_ms(fn, args), first


def run_one(wid, m, n, k):
    family = wid.split("-")[0]
    if family not in FAMILIES:
        return {"id": wid, "skipped": f"no PyTorch reference for workload family {family}"}
    fn = FAMILIES[family]
    args = operands(family, m, n, k)
    out = {"id": wid, "m": m, "n": n, "k": k}
    if family in ("W3", "W3gelu"):
        out["scaled_mm_ms"] = median_ms(w3, args[:4])
    else:
        out["torch_mm_ms"] = median_ms(torch.mm, args[:2])
    out["eager_ms"], _ = measure(fn, args)
    torch._dynamo.reset()
    out["compile_ms"], out["compile_first_call_s"] = measure(torch.compile(fn), args)
    if (family, m, n, k) in AUTOTUNE:
        torch._dynamo.reset()
        out["autotune_ms"], out["autotune_first_call_s"] = measure(
            torch.compile(fn, mode="max-autotune-no-cudagraphs"), args)
    return out


def main():
    out_path = sys.argv[1]
    results = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "workloads": []}
    for item in sys.argv[2:]:
        wid, m, n, k = item.split(":")
        start = time.perf_counter()
        try:
            r = run_one(wid, int(m), int(n), int(k))
        except Exception as e:  # one workload's failure must not lose the others
            r = {"id": wid, "error": f"{type(e).__name__}: {e}"}
        r["wall_s"] = time.perf_counter() - start
        print(f"torch {wid}: " + ", ".join(f"{key} {value:.4f}" for key, value in r.items()
                                          if isinstance(value, float)), flush=True)
        results["workloads"].append(r)
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
