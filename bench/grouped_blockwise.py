#!/usr/bin/env python3
"""Block-scaled fp8 grouped GEMMs (MoE experts in DeepSeek-V3's format) with evtc against PyTorch.

    python3 bench/grouped_blockwise.py [--shapes W6,MoE] [--out bench/results]
                                       [--configs coop_128x128x128_c1x1_persistent,...]

Tokens x (sum of M_g × K, e4m3) have one f32 scale per row and 128 of K, each expert's weights
(N×K, e4m3) one per 128×128 block, quantized from random data as such models quantize them.
The epilogue is the W6 MoE layer's: a per-expert bias and GPT-OSS's SwiGLU over interleaved
(gate, up) weight rows, writing sum(M_g) × N/2. For each shape it times, on the same tensors:
  evtc   grouped, fp8_blockwise, gated epilogue, in each configuration of --configs (the first
         is evtc's default); the default once more with scale_a given M-adjacent (copied into
         the kernel's layout within the call); and `D = acc` (no epilogue)
  evtc   grouped bf16 (the W6 kernel) on the dequantized operands
  torch  torch._scaled_mm block-scaled, one call per expert, + the epilogue in eager PyTorch
         (where this torch build has block-scaled _scaled_mm)
  torch  torch._grouped_mm bf16 on the dequantized operands, alone and + the eager epilogue
Every output is checked against a float64 reference first. Timing: triton.testing.do_bench
(median, L2 flushed between calls), the variants in turn for --rounds rounds; the median of the
rounds. Writes <out>/<stamp>-<gpu>-grouped-blockwise.json and .png and prints the table.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

import evtc
from fp8_blockwise import dequantize, quantize_blocks, quantize_rows, time_in_turn
from result_files import write_do_bench_results
from variant_plot import plot_variants

GATED = "input bias[n]: bf16\nout y: bf16 = gptoss_swiglu(acc + bias[n])"
PLAIN = "out D: bf16 = acc"
DEFAULT_CONFIGS = ["coop_128x128x128_c1x1_persistent", "pingpong_64x128x128_c1x1_persistent",
                   "coop_256x128x128_c1x1_persistent"]
# name: (rows per group, N, K). W6 is issue's grouped row; MoE is bench/models.py's MoE layer
# (eight ragged groups of about 2048 tokens).
SHAPES = {
    "W6": ([1024] * 8, 4096, 2048),
    "MoE": ([2112, 1890, 2304, 1731, 2048, 2240, 1969, 2090], 2816, 2048),
}


def gated_eager(pre):
    gate, up = pre[:, 0::2].clamp(max=7.0), pre[:, 1::2].clamp(-7.0, 7.0)
    return gate * torch.sigmoid(1.702 * gate) * (up + 1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    opts = p.parse_args()
    configs = opts.configs.split(",")
    dev = torch.cuda.get_device_name()
    print(f"device: {dev}, torch {torch.__version__}", flush=True)

    gated = {c: evtc.grouped(GATED, dtype="f8e4m3", fp8_blockwise=True, config=c) for c in configs}
    plain = evtc.grouped(PLAIN, dtype="f8e4m3", fp8_blockwise=True, config=configs[0])
    bf16 = evtc.grouped(GATED)
    t0 = time.time()
    futures = {c: k.compile_async() for c, k in gated.items()}
    others = [k.compile_async() for k in (plain, bf16)]
    for c, f in futures.items():
        try:
            f.result()
        except evtc.Error as e:  # a configuration that does not compile is reported and left out
            print(f"configuration {c} did not compile, left out: {str(e)[:300]}", flush=True)
            del gated[c]
    for f in others:
        f.result()
    print(f"compiled {len(futures) + len(others)} kernels in {time.time() - t0:.1f} s", flush=True)

    results = []
    for shape in opts.shapes.split(","):
        rows, n, k = SHAPES[shape]
        groups, total = len(rows), sum(rows)
        torch.manual_seed(total + n + k)
        x = torch.randn(total, k, device="cuda") * torch.exp2(torch.randint(-3, 4, (total, 1), device="cuda").float())
        w = torch.randn(groups, n, k, device="cuda") * 0.05
        xq, sa = quantize_rows(x)  # sa: M adjacent
        quantized = [quantize_blocks(w[e]) for e in range(groups)]
        wq = torch.stack([q for q, _ in quantized])  # G × N × K
        sb = torch.stack([s for _, s in quantized])  # G × Kb × Nb (each Kb × Nb row-major)
        # In place for the kernel: scale_b is the transpose of G × Nb × Kb blocks; scale_a row-major.
        scale_b = sb.transpose(1, 2).contiguous().transpose(1, 2)
        scale_a = sa.contiguous()
        bias = torch.randn(groups, n, device="cuda").to(torch.bfloat16)
        ends = torch.tensor(rows, device="cuda").cumsum(0)
        offsets = ends.to(torch.int32)
        starts = [0] + ends.tolist()[:-1]
        group_of_row = torch.repeat_interleave(torch.arange(groups, device="cuda"), torch.tensor(rows, device="cuda"))

        x64 = dequantize(xq, sa, True)
        acc = torch.empty(total, n, device="cuda", dtype=torch.float64)
        w_bf16 = torch.empty(groups, n, k, device="cuda", dtype=torch.bfloat16)
        for e in range(groups):
            w64 = dequantize(wq[e], sb[e], False)
            w_bf16[e] = w64.to(torch.bfloat16)
            acc[starts[e]:starts[e] + rows[e]] = x64[starts[e]:starts[e] + rows[e]] @ w64.t()
            del w64
        want = {"gated": gated_eager(acc + bias.double()[group_of_row]), "plain": acc}
        x_bf16 = x64.to(torch.bfloat16)
        del x64

        variants = {}  # name -> (epilogue, fn)
        for c, kern in gated.items():
            variants[f"evtc {c}"] = ("gated", lambda kern=kern: kern(xq, wq.transpose(1, 2), offsets, scale_a=scale_a,
                                                                     scale_b=scale_b, bias=bias))
        variants[f"evtc {configs[0]}, scale_a M-adjacent"] = (
            "gated", lambda: gated[configs[0]](xq, wq.transpose(1, 2), offsets, scale_a=sa, scale_b=scale_b, bias=bias))
        variants["evtc D = acc"] = ("plain", lambda: plain(xq, wq.transpose(1, 2), offsets, scale_a=scale_a,
                                                           scale_b=scale_b))
        variants["evtc bf16 (dequantized)"] = ("gated", lambda: bf16(x_bf16, w_bf16.transpose(1, 2), offsets,
                                                                     bias=bias))
        note = ""
        try:  # one block-scaled _scaled_mm per expert, each group's scales made M-adjacent beforehand
            parts = [(xq[s:s + r], wq[e].t(), sa[s:s + r].t().contiguous().t(), sb[e].t().contiguous().t())
                     for e, (s, r) in enumerate(zip(starts, rows))]
            y_loop = torch.empty(total, n, device="cuda", dtype=torch.bfloat16)

            def scaled_loop():
                for (a, b, sa_g, sb_g), s, r in zip(parts, starts, rows):
                    torch._scaled_mm(a, b, scale_a=sa_g, scale_b=sb_g, out_dtype=torch.bfloat16, out=y_loop[s:s + r])
                return gated_eager(y_loop + bias[group_of_row])

            scaled_loop()
            torch.cuda.synchronize()
            variants["torch _scaled_mm per expert + eager epilogue"] = ("gated", scaled_loop)
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            note = f"torch._scaled_mm has no block-scaled path here: {str(e)[:300]}"
            print(f"{shape}: {note}", flush=True)
        w_kn = w_bf16.transpose(1, 2)
        variants["torch _grouped_mm bf16 + eager epilogue"] = (
            "gated", lambda: gated_eager(torch._grouped_mm(x_bf16, w_kn, offs=offsets) + bias[group_of_row]))
        variants["torch _grouped_mm bf16 alone"] = ("plain", lambda: torch._grouped_mm(x_bf16, w_kn, offs=offsets))

        checks = {}
        for name, (epi, fn) in variants.items():
            got = fn().double()
            err = float((got - want[epi]).norm() / want[epi].norm())
            checks[name] = err
            # bf16 operands (the dequantized variants) round the scaled values: a looser bound.
            if err > (2.0**-5 if "bf16" in name else 2.0**-7):
                print(f"{shape} {name}: rel L2 error {err:.2e} against float64: FAILED", flush=True)
                sys.exit(1)
        times = time_in_turn(variants, opts.rounds)
        flops = 2.0 * total * n * k
        row = {"shape": shape, "groups": groups, "rows": rows, "n": n, "k": k, "note": note, "variants": {}}
        for name, ts in times.items():
            ms = statistics.median(ts)
            row["variants"][name] = {"ms": ms, "rounds_ms": ts, "tflops": flops / ms / 1e9,
                                     "rel_l2_vs_f64": checks[name], "epilogue": variants[name][0]}
        best_evtc = min(v["ms"] for name, v in row["variants"].items()
                        if name.startswith("evtc") and v["epilogue"] == "gated" and "bf16" not in name)
        torch_gated = {name: v["ms"] for name, v in row["variants"].items()
                       if name.startswith("torch") and v["epilogue"] == "gated"}
        best_torch = min(torch_gated.items(), key=lambda kv: kv[1])
        row["ratio_best_evtc_vs_best_torch"] = best_evtc / best_torch[1]
        row["best_torch"] = best_torch[0]
        results.append(row)
        print(f"\n{shape}: G={groups} total M={total} N={n} K={k}", flush=True)
        for name, v in row["variants"].items():
            print(f"  {name:55s} {v['ms']:8.4f} ms  {v['tflops']:7.1f} TFLOP/s  (rel L2 {v['rel_l2_vs_f64']:.1e})")
        print(f"  best evtc / best PyTorch ({best_torch[0]}): {row['ratio_best_evtc_vs_best_torch']:.3f}")
        del acc, want, w_bf16, x_bf16
        torch.cuda.empty_cache()

    base = write_do_bench_results(opts.out, dev, "grouped-blockwise", opts.rounds, results, torch.__version__)
    plot(results, base + ".png", dev)
    print(f"\nwrote {base}.json and .png")


def plot(rows, path, dev):
    panels = [(f"{r['shape']}: G={r['groups']}, M={sum(r['rows'])}, N={r['n']}, K={r['k']}", r["variants"])
              for r in rows]
    plot_variants(panels, path, f"Block-scaled fp8 grouped GEMM + bias + GPT-OSS SwiGLU, {dev}", lambda v: v["ms"],
                  "ms (lower is better)", lambda v: f"{v:.3f}", width=8, fontsize=7)


if __name__ == "__main__":
    main()
