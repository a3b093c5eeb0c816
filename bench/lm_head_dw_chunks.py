"""The numerics behind the LM head's memory/time trade-off: the weight gradient of a
cross-entropy loss, accumulated over chunks of tokens, against float64.

    python3 bench/lm_head_dw_chunks.py [--tokens 4096] [--vocab 8192] [--hidden 512]
                                       [--chunks 1,2,4,8,16,32] [--out bench/results]

A fused linear cross-entropy that writes no [tokens, vocab] tensor and runs three GEMMs (as
plain compile does) must finish each chunk of tokens' gradient before the next chunk's logits
exist, so dW = sum over chunks of G_cᵀ·h_c is accumulated across chunks. Plain compile rounds
dW to bf16 once; an accumulator kept in bf16 (the weight's dtype, as hand-written fused kernels
keep it) rounds it once per chunk, and an f32 accumulator costs 4 bytes per weight. This
script measures, on the CPU, the relative L2 error against float64 of:

- plain: bf16 logits, f32 softmax, bf16 grad_logits G, one GEMM accumulated in f32, dW in bf16;
- bf16 accumulator: the same G, dW += G_cᵀ·h_c per chunk in f32 arithmetic, stored in bf16;
- f32 accumulator: the same, stored in f32, rounded to bf16 once at the end.

Writes <stamp>-cpu-lm-head-dw-chunks.json (and a PNG where matplotlib is installed).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from result_files import result_base, save_png  # noqa: E402


def chunk_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--chunks: '{text}' is not a comma-separated list of integers")
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"--chunks: '{text}' must list chunk counts of at least 1")
    return values


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--chunks", type=chunk_list, default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    a = p.parse_args()
    for c in a.chunks:
        if a.tokens % c:
            p.error(f"--chunks: {c} does not divide --tokens {a.tokens}")

    torch.manual_seed(a.seed)
    M, V, H = a.tokens, a.vocab, a.hidden
    h = torch.randn(M, H, dtype=torch.float64).to(torch.bfloat16)
    # Logits with a standard deviation of about 2, as an LM head's are.
    w = (torch.randn(V, H, dtype=torch.float64) * 2.0 / H ** 0.5).to(torch.bfloat16)
    labels = torch.randint(0, V, (M,))
    one_hot = torch.zeros(M, V, dtype=torch.float64)
    one_hot[torch.arange(M), labels] = 1
    grad64 = (torch.softmax(h.double() @ w.double().t(), -1) - one_hot) / M  # mean reduction
    dw64 = grad64.t() @ h.double()
    logits = (h.float() @ w.float().t()).to(torch.bfloat16)
    grad = ((torch.softmax(logits.float(), -1) - one_hot.float()) / M).to(torch.bfloat16)

    def error(dw: torch.Tensor) -> float:
        return ((dw.double() - dw64).norm() / dw64.norm()).item()

    rows = []
    for chunks in a.chunks:
        step = M // chunks
        acc16 = torch.zeros(V, H, dtype=torch.bfloat16)
        acc32 = torch.zeros(V, H, dtype=torch.float32)
        for c in range(chunks):
            part = grad[c * step:(c + 1) * step].float().t() @ h[c * step:(c + 1) * step].float()
            acc16 = (acc16.float() + part).to(torch.bfloat16)  # a GEMM with beta = 1 into bf16
            acc32 += part
        rows.append({"chunks": chunks, "bf16_accumulator": error(acc16),
                     "f32_accumulator": error(acc32.to(torch.bfloat16))})
        print(f"{chunks:3d} chunks: bf16 accumulator {rows[-1]['bf16_accumulator']:.3e}, "
              f"f32 accumulator {rows[-1]['f32_accumulator']:.3e}", flush=True)
    plain = next((r["bf16_accumulator"] for r in rows if r["chunks"] == 1), None)
    for r in rows:
        if plain:
            r["bf16_over_plain"] = r["bf16_accumulator"] / plain
    base = result_base(a.out, "cpu", "lm-head-dw-chunks")
    with open(base + ".json", "w") as f:
        json.dump({"tokens": M, "vocab": V, "hidden": H, "seed": a.seed, "device": "cpu", "torch": torch.__version__,
                   "method": "relative L2 error of dW against float64; one chunk is plain compile's single rounding",
                   "rows": rows}, f, indent=1)
    print(f"wrote {base}.json")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG")
        return 0
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [r["chunks"] for r in rows]
    ax.plot(xs, [r["bf16_accumulator"] for r in rows], "o-", label="bf16 accumulator")
    ax.plot(xs, [r["f32_accumulator"] for r in rows], "s--", label="f32 accumulator")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("token chunks")
    ax.set_ylabel("dW relative L2 error vs float64")
    ax.set_title(f"LM-head dW over token chunks ({M}x{V}x{H})")
    ax.legend()
    save_png(fig, base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
