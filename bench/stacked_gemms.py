"""Sibling projections of one input as one GEMM: the q, k and v projections of real attention
layers timed as the separate cuBLAS GEMMs that plain torch.compile runs (``F.linear`` each)
against ``torch.ops.evtc.stacked_linear`` over the same weights stacked in one buffer (what
evtc.torch.merge_projections and the FX pass's stack_siblings step make of them), on one GPU.

    python3 bench/stacked_gemms.py [--m 1,16,64,256,1024,8192] [--rounds 5] [--calls 20]
                                   [--rotate-mb 256] [--out bench/results] [--quick]

Method (bench/gemm_shapes.py's Timer): per shape, both variants warm up, then rounds alternate
them (their order rotating), each timing --calls calls with CUDA events around every call,
queued behind a GPU sleep so that the events time the GPU's work and not Python's launches. The
weights are copied until the copies exceed --rotate-mb and calls rotate through them, so every
call reads its weights from DRAM. The first stacked call is checked against float64. Reported:
the median per call over all rounds, and stacked / separate per shape, with the geometric mean
per M. Writes <out>/<stamp>-<gpu>-stacked-gemms.json and .png.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from result_files import pyplot, result_base, save_png  # noqa: E402
from timing_args import add_timing_arguments, checked_timing_arguments, geomean  # noqa: E402

# (model, hidden K, q features, k/v features each, biased): the q/k/v projections of public models.
LAYERS = [
    ("LLaMA-3 8B", 4096, 4096, 1024, False),
    ("LLaMA-2 7B", 4096, 4096, 4096, False),
    ("Qwen2.5 7B", 3584, 3584, 512, True),
    ("Mistral-Nemo 12B", 5120, 4096, 1024, False),
    ("Gemma-2 2B", 2304, 2048, 1024, False),
    ("TinyLlama-size (bench/models.py hf_llama)", 2048, 2048, 2048, False),
    ("Qwen2-size (bench/models.py hf_qwen)", 2048, 2048, 256, True),
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_timing_arguments(p, "1,16,64,256,1024,8192", "3 rounds x 10 calls, M 16, 64 and 1024")
    args = p.parse_args()
    m_values = checked_timing_arguments(p, args, quick_m=[16, 64, 1024])

    import torch
    import torch.nn.functional as F

    import evtc.torch  # noqa: F401  (the op library)
    from evtc.torch._op import rows_of_one_buffer
    from gemm_shapes import Rotation, Timer, relative_error, rotating, weight_copies

    if not torch.cuda.is_available():
        print("stacked_gemms.py needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name()
    timer = Timer(backlog=True)
    rows, failed = [], 0
    shapes = [(layer, m) for layer in LAYERS for m in m_values]
    for i, ((model, k, nq, nkv, biased), m) in enumerate(shapes, 1):
        widths = (nq, nkv, nkv)
        n = sum(widths)
        copies = weight_copies(n * k * 2, args.rotate_mb << 20)
        g = torch.Generator(device="cuda").manual_seed(i)
        sets = []
        for _ in range(copies):
            w = torch.randn(n, k, generator=g, device="cuda").mul_(k ** -0.5).to(torch.bfloat16)
            b = torch.randn(n, generator=g, device="cuda").to(torch.bfloat16) if biased else None
            starts = [0, nq, nq + nkv]
            ws = [w[s:s + c] for s, c in zip(starts, widths)]
            bs = [b[s:s + c] for s, c in zip(starts, widths)] if biased else [None] * 3
            assert rows_of_one_buffer(ws)
            sets.append((ws, bs))
        a = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
        rotation = Rotation(sets)
        separate = rotating(lambda s: [F.linear(a, w, b) for w, b in zip(*s)], rotation)
        stacked = rotating(lambda s: torch.ops.evtc.stacked_linear(a, s[0], [b for b in s[1] if b is not None]),
                           rotation)

        ws, bs = sets[0]
        want = torch.cat([a.double() @ w.double().T + (b.double() if b is not None else 0) for w, b in zip(ws, bs)], 1)
        err, why = relative_error(torch.ops.evtc.stacked_linear(a, ws, [b for b in bs if b is not None]), want)
        ok = why is None
        failed += not ok
        timer.warm_up({"separate": separate, "stacked": stacked}, 100.0)
        medians, per_round, errors = timer.interleaved({"separate": separate, "stacked": stacked}, args.rounds,
                                                       args.calls)
        row = dict(model=model, m=m, k=k, widths=list(widths), biased=biased, weight_copies=copies, rel_err=err,
                   status="ok" if ok else "wrong", separate_ms=medians.get("separate"),
                   stacked_ms=medians.get("stacked"), errors=errors,
                   ratio_rounds=[r["stacked"] / r["separate"] for r in per_round if "stacked" in r and "separate" in r])
        row["ratio"] = row["stacked_ms"] / row["separate_ms"] if row["stacked_ms"] and row["separate_ms"] else None
        rows.append(row)
        print(f"[{i}/{len(shapes)}] {model} M={m} K={k} N={nq}+{nkv}+{nkv}: separate {row['separate_ms']:.4f} ms, "
              f"stacked {row['stacked_ms']:.4f} ms, {row['ratio']:.3f}x, rel-L2 {err:.1e}", flush=True)

    summary = {str(m): geomean([r["ratio"] for r in rows if r["m"] == m and r["ratio"]]) for m in m_values}
    summary["all"] = geomean([r["ratio"] for r in rows if r["ratio"]])
    base = result_base(args.out, device, "stacked-gemms")
    with open(base + ".json", "w") as f:
        json.dump({"gpu": device, "torch": torch.__version__, "command": " ".join(sys.argv),
                   "rounds": args.rounds, "calls": args.calls, "rotate_mb": args.rotate_mb,
                   "method": "median ms per call over the rounds, separate and stacked interleaved, queued behind "
                             "a GPU sleep, weights rotated over copies", "rows": rows,
                   "geomean_stacked_over_separate": summary}, f, indent=2)
    print(f"wrote {base}.json")
    print(f"\n{device}: stacked / separate (median ms per call)\n")
    print("| model | M | K | N (q+k+v) | separate ms | stacked ms | stacked / separate |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['m']} | {r['k']} | {'+'.join(map(str, r['widths']))} | {r['separate_ms']:.4f} | "
              f"{r['stacked_ms']:.4f} | {r['ratio']:.3f} |")
    print("\ngeo-mean per M: " + ", ".join(f"M={m}: {v:.3f}" for m, v in summary.items() if m != "all") +
          f"; all: {summary['all']:.3f}")
    plt = pyplot()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        for model, *_ in LAYERS:
            pts = [(r["m"], r["ratio"]) for r in rows if r["model"] == model and r["ratio"]]
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=model)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel("stacked / separate time")
        ax.set_title(f"q/k/v as one GEMM against three ({device})")
        ax.legend(fontsize=7)
        save_png(fig, base)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
