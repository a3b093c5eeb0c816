#!/usr/bin/env python3
"""Block-scaled fp8 GEMMs (DeepSeek-V3's format) with evtc against PyTorch, in one process.

    python3 bench/fp8_blockwise.py [--shapes 4096x4096x4096,8192x7168x2048] [--out bench/results]
                                   [--configs coop_128x128x128_c1x1_persistent,...]

A (M×K, e4m3) has one f32 scale per row and 128 of K, B (given as the N×K weight, e4m3) one
per 128×128 block; the operands are quantized from random data as such models quantize them.
For each shape it times, on the same tensors:
  evtc      D = acc                  (bf16; `evtc.compile(..., fp8_blockwise=True)`), in each
                                     configuration of --configs (the first is evtc's default)
  evtc      D = gelu(acc + bias[n])  (bf16), in each configuration of --configs, and
            D = silu(acc + bias[n]) in the first (GELU's cost against SiLU's)
  torch     torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=bf16): cuBLASLt's blockwise GEMM,
            where this torch build has it; + gelu(. + bias) in eager, and the same function
            under torch.compile (Inductor, default mode)
  bf16      torch.mm of the dequantized operands in bf16 (what the fp8 format saves)
Every output is checked against a float64 reference of the scaled product before it is timed.
Timing: triton.testing.do_bench (median, L2 flushed between calls), the variants taken in turn
for --rounds rounds; the median of the rounds. Writes <out>/<stamp>-<gpu>-fp8-blockwise.json
and .png and prints the table.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import triton.testing

import evtc
from result_files import write_do_bench_results
from variant_plot import plot_variants

BLOCK = 128
E4M3_MAX = 448.0
DEFAULT_CONFIGS = ["coop_128x128x128_c1x1_persistent", "coop_128x128x128_c2x1_persistent",
                   "pingpong_64x128x128_c1x1_persistent"]


def quantize_rows(x):
    m, k = x.shape
    kb = -(-k // BLOCK)
    padded = torch.nn.functional.pad(x, (0, kb * BLOCK - k)).view(m, kb, BLOCK)
    scale = padded.abs().amax(dim=2).clamp(min=1e-4) / E4M3_MAX
    q = (padded / scale[:, :, None]).to(torch.float8_e4m3fn).view(m, kb * BLOCK)[:, :k].contiguous()
    return q, scale.t().contiguous().t()  # M × kb, M adjacent


def quantize_blocks(w):
    n, k = w.shape
    nb, kb = -(-n // BLOCK), -(-k // BLOCK)
    padded = torch.nn.functional.pad(w, (0, kb * BLOCK - k, 0, nb * BLOCK - n)).view(nb, BLOCK, kb, BLOCK)
    scale = padded.abs().amax(dim=(1, 3)).clamp(min=1e-4) / E4M3_MAX
    q = (padded / scale[:, None, :, None]).to(torch.float8_e4m3fn).view(nb * BLOCK, kb * BLOCK)[:n, :k]
    return q.contiguous(), scale.t().contiguous()  # kb × nb row-major


def dequantize(q, scale, per_row):
    rows, k = q.shape
    ks = torch.arange(k, device=q.device) // BLOCK
    if per_row:
        return q.double() * scale.double()[:, ks]
    rs = torch.arange(rows, device=q.device) // BLOCK
    return q.double() * scale.double()[ks][:, rs].t()


def time_in_turn(variants, rounds):
    """{name: [ms per round]}: each variant's (epilogue, fn) timed with triton's do_bench (median,
    L2 flushed), the variants in turn, `rounds` times."""
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (_, fn) in variants.items():
            times[name].append(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    return times


def rel_l2(got, want):
    return float((got.double() - want).norm() / want.norm())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="4096x4096x4096,8192x7168x2048")
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    opts = p.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in opts.shapes.split(",")]
    configs = opts.configs.split(",")
    dev = torch.cuda.get_device_name()
    print(f"device: {dev}, torch {torch.__version__}", flush=True)

    def build(expr, config):
        return evtc.compile(expr, a_dtype="f8e4m3", b_dtype="f8e4m3", fp8_blockwise=True, config=config)

    plain = {c: build("out D: bf16 = acc", c) for c in configs}
    gelu = {c: build("input bias[n]: bf16\nout D: bf16 = gelu(acc + bias[n])", c) for c in configs}
    silu = build("input bias[n]: bf16\nout D: bf16 = silu(acc + bias[n])", configs[0])
    t0 = time.time()
    futures = [k.compile_async(0, 0, 0) for k in [*plain.values(), *gelu.values(), silu]]
    for f in futures:
        f.result()
    print(f"compiled {len(futures)} kernels in {time.time() - t0:.1f} s", flush=True)

    rows = []
    for (m, n, k) in shapes:
        torch.manual_seed(m + n + k)
        x = torch.randn(m, k, device="cuda") * torch.exp2(torch.randint(-3, 4, (m, 1), device="cuda").float())
        w = torch.randn(n, k, device="cuda") * 0.05
        a, sa = quantize_rows(x)
        wq, sb = quantize_blocks(w)
        b = wq.t()
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        acc = dequantize(a, sa, True) @ dequantize(wq, sb, False).t()
        want = {"plain": acc, "gelu": torch.nn.functional.gelu(acc + bias.double()),
                "silu": torch.nn.functional.silu(acc + bias.double())}
        a_bf16 = dequantize(a, sa, True).to(torch.bfloat16)
        b_bf16 = dequantize(wq, sb, False).to(torch.bfloat16).t()
        sb_torch = sb.t().contiguous().t()  # torch's layout: K blocks adjacent

        variants = {}  # name -> (epilogue, fn)
        for c, kern in plain.items():
            variants[f"evtc {c}"] = ("plain", lambda kern=kern: kern(a, b, scale_a=sa, scale_b=sb))
        for c, kern in gelu.items():
            variants[f"evtc gelu {c}"] = ("gelu", lambda kern=kern: kern(a, b, scale_a=sa, scale_b=sb, bias=bias))
        variants[f"evtc silu {configs[0]}"] = ("silu", lambda: silu(a, b, scale_a=sa, scale_b=sb, bias=bias))
        torch_note = ""
        try:
            torch._scaled_mm(a, b, scale_a=sa, scale_b=sb_torch, out_dtype=torch.bfloat16)
            torch.cuda.synchronize()

            def scaled(a=a, b=b):
                return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb_torch, out_dtype=torch.bfloat16)

            def scaled_gelu():
                return torch.nn.functional.gelu(scaled() + bias)

            compiled_gelu = torch.compile(lambda a, b, sa, sb, bias: torch.nn.functional.gelu(
                torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16) + bias))
            variants["torch _scaled_mm"] = ("plain", scaled)
            variants["torch _scaled_mm + gelu (eager)"] = ("gelu", scaled_gelu)
            try:
                compiled_gelu(a, b, sa, sb_torch, bias)
                variants["torch.compile _scaled_mm + gelu"] = ("gelu", lambda: compiled_gelu(a, b, sa, sb_torch, bias))
            except Exception as e:  # noqa: BLE001 - reported, not fatal
                torch_note += f"torch.compile failed: {str(e)[:200]}; "
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            torch_note = f"torch._scaled_mm has no blockwise path here: {str(e)[:300]}"
        variants["bf16 torch.mm (dequantized)"] = ("plain", lambda: torch.mm(a_bf16, b_bf16))
        if torch_note:
            print(f"{m}x{n}x{k}: {torch_note}", flush=True)

        checks = {}
        for name, (epi, fn) in variants.items():
            err = rel_l2(fn(), want[epi])
            checks[name] = err
            if err > 2.0**-6:
                print(f"{m}x{n}x{k} {name}: rel L2 error {err:.2e} against float64: FAILED", flush=True)
                sys.exit(1)
        times = time_in_turn(variants, opts.rounds)
        flops = 2.0 * m * n * k
        shape_row = {"m": m, "n": n, "k": k, "note": torch_note, "variants": {}}
        for name, ts in times.items():
            ms = statistics.median(ts)
            shape_row["variants"][name] = {"ms": ms, "rounds_ms": ts, "tflops": flops / ms / 1e9,
                                           "rel_l2_vs_f64": checks[name], "epilogue": variants[name][0]}
        rows.append(shape_row)
        print(f"\n{m}x{n}x{k}", flush=True)
        for name, v in shape_row["variants"].items():
            print(f"  {name:42s} {v['ms']:8.4f} ms  {v['tflops']:7.1f} TFLOP/s  (rel L2 {v['rel_l2_vs_f64']:.1e})")

    base = write_do_bench_results(opts.out, dev, "fp8-blockwise", opts.rounds, rows, torch.__version__)
    plot(rows, base + ".png", dev)
    print(f"\nwrote {base}.json and .png")


def plot(rows, path, dev):
    plot_variants([(f"{r['m']}×{r['n']}×{r['k']}", r["variants"]) for r in rows], path,
                  f"Block-scaled fp8 GEMMs (1×128 / 128×128 scales), {dev}", lambda v: v["tflops"],
                  "TFLOP/s (2·M·N·K / time)", lambda v: f"{v:.0f}")


if __name__ == "__main__":
    main()
