"""A GEMM with a residual add, `D = A·Bᵀ + R` (the o and down projections of a transformer layer),
in the forms a user has on one GPU: evtc's fused kernel against cuBLAS's GEMM alone, cuBLASLt's
own fused form (`torch.addmm(r, a, w.t())`: beta = 1 reading R in the GEMM's epilogue) and the
two kernels eager PyTorch runs (`torch.mm` then an add).

    python3 bench/residual_forms.py [--m 64,4096,8192] [--rounds 5] [--calls 20] [--rotate-mb 256]
                                    [--out bench/results] [--quick]

Method (bench/gemm_shapes.py's Timer): per shape, the four variants warm up, then rounds alternate
them (their order rotating), each timing --calls calls with CUDA events around every call, queued
behind a GPU sleep. Weights rotate over copies of more than --rotate-mb so every call reads them
from DRAM. evtc's kernel is the one `evtc.compile` gives with no configuration (the selection
table's, for a residual from 1024 rows on); its first call writes into an output filled with NaN
and is checked against float64 (gemm_shapes.py's relative L2 bound, 2e-2), as is cuBLASLt's. Reported: the
median per call over all rounds, each variant over `torch.mm`, and evtc over `addmm`. Writes
<out>/<stamp>-<gpu>-residual-forms.json and .png.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from result_files import pyplot, result_base, save_png  # noqa: E402
from timing_args import add_timing_arguments, checked_timing_arguments, geomean  # noqa: E402

# (model, layer, N, K): projections whose output a residual add follows.
LAYERS = [
    ("LLaMA-2 7B", "o", 4096, 4096),
    ("LLaMA-2 7B", "down", 4096, 11008),
    ("TinyLlama 1.1B", "o", 2048, 2048),
    ("TinyLlama 1.1B", "down", 2048, 5632),
    ("GPT-2 XL", "mlp down", 1600, 6400),
]
EXPR = "input r[m,n]: bf16\nout D: bf16 = acc + r"
VARIANTS = ("mm", "addmm", "mm_add", "evtc")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_timing_arguments(p, "64,4096,8192", "3 rounds x 10 calls")
    args = p.parse_args()
    m_values = checked_timing_arguments(p, args)

    import torch

    import evtc
    from gemm_shapes import Rotation, Timer, relative_error, rotating, wait_with_progress, weight_copies

    if not torch.cuda.is_available():
        print("residual_forms.py needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name()
    kernel = evtc.compile(EXPR)
    shapes = [(layer, m) for layer in LAYERS for m in m_values]
    # One compile per configuration the shapes take, all at once, in parallel.
    jobs = {}
    for (_, _, n, k), m in shapes:
        jobs.setdefault(kernel.config_for(m, n, k), (m, n, k))
    compile_errors = wait_with_progress([(c, kernel.compile_async(*mnk)) for c, mnk in jobs.items()], "residual")
    timer = Timer(backlog=True)
    rows, failed = [], 0
    for i, ((model, layer, n, k), m) in enumerate(shapes, 1):
        copies = weight_copies(n * k * 2, args.rotate_mb << 20)
        g = torch.Generator(device="cuda").manual_seed(i)
        weights = [torch.randn(n, k, generator=g, device="cuda").mul_(k ** -0.5).to(torch.bfloat16)
                   for _ in range(copies)]
        a = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
        r = torch.randn(m, n, generator=g, device="cuda").to(torch.bfloat16)
        want = a.double() @ weights[0].double().T + r.double()
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        kernel(a, weights[0].t(), r=r, out={"D": out})
        checks = {"evtc": relative_error(out, want), "addmm": relative_error(torch.addmm(r, a, weights[0].t()), want)}
        errors = {name: err for name, (err, _) in checks.items()}
        path = kernel.last_path
        ok = path == "fused" and all(why is None for _, why in checks.values())
        if not ok:
            print(f"[{i}/{len(shapes)}] {model} {layer} {m}x{n}x{k}: FAILED (path {path}, rel-L2 {errors}; "
                  f"{compile_errors.get(kernel.config_for(m, n, k), 'compiled')})", flush=True)
        failed += not ok
        rotation = Rotation(weights)  # one for all four: each call reads a copy the last call did not
        variants = {
            "mm": rotating(lambda w: torch.mm(a, w.t()), rotation),
            "addmm": rotating(lambda w: torch.addmm(r, a, w.t()), rotation),
            "mm_add": rotating(lambda w: torch.mm(a, w.t()).add_(r), rotation),
            "evtc": rotating(lambda w: kernel(a, w.t(), r=r), rotation),
        }
        timer.warm_up(variants, 100.0)
        medians, _, timing_errors = timer.interleaved(variants, args.rounds, args.calls)
        row = dict(model=model, layer=layer, m=m, n=n, k=k, weight_copies=copies,
                   config=kernel.config_for(m, n, k), config_source=kernel.config_source(m, n, k), path=path,
                   rel_err=errors, status="ok" if ok else "wrong", errors=timing_errors,
                   **{f"{v}_ms": medians.get(v) for v in VARIANTS})
        mm = row["mm_ms"]
        for v in ("addmm", "mm_add", "evtc"):
            row[f"{v}_over_mm"] = row[f"{v}_ms"] / mm if row[f"{v}_ms"] and mm else None
        row["evtc_over_addmm"] = row["evtc_ms"] / row["addmm_ms"] if row["evtc_ms"] and row["addmm_ms"] else None
        rows.append(row)
        print(f"[{i}/{len(shapes)}] {model} {layer} {m}x{n}x{k}: mm {mm * 1e3:.1f} us; over it addmm "
              f"{row['addmm_over_mm']:.3f}, mm+add {row['mm_add_over_mm']:.3f}, evtc {row['evtc_over_mm']:.3f} "
              f"({row['config']}); rel-L2 evtc {errors['evtc']:.1e}", flush=True)

    summary = {f"{v}_over_mm": geomean([r[f"{v}_over_mm"] for r in rows]) for v in ("addmm", "mm_add", "evtc")}
    summary["evtc_over_addmm"] = geomean([r["evtc_over_addmm"] for r in rows])
    for m in m_values:
        summary[f"evtc_over_addmm_m{m}"] = geomean([r["evtc_over_addmm"] for r in rows if r["m"] == m])
    base = result_base(args.out, device, "residual-forms")
    with open(base + ".json", "w") as f:
        json.dump({"gpu": device, "torch": torch.__version__, "evtc": evtc.__version__, "command": " ".join(sys.argv),
                   "expression": EXPR, "compile_errors": compile_errors, "rounds": args.rounds, "calls": args.calls,
                   "rotate_mb": args.rotate_mb,
                   "method": "median ms per call over the rounds, the four variants interleaved, queued behind a GPU "
                             "sleep, weights rotated over copies", "rows": rows, "geomean": summary}, f, indent=2)
    print(f"wrote {base}.json")
    print(f"\n{device}: median µs per call, and over torch.mm\n")
    print("| layer | M×N×K | mm µs | addmm | mm + add | evtc | evtc / addmm | evtc config |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} {r['layer']} | {r['m']}×{r['n']}×{r['k']} | {r['mm_ms'] * 1e3:.1f} | "
              f"{r['addmm_over_mm']:.3f} | {r['mm_add_over_mm']:.3f} | {r['evtc_over_mm']:.3f} | "
              f"{r['evtc_over_addmm']:.3f} | `{r['config']}` |")
    print("\ngeo-mean: " + ", ".join(f"{k} {v:.3f}" for k, v in summary.items()))
    plt = pyplot()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(10, 4.5))
        labels = [f"{r['model']} {r['layer']}\n{r['m']}×{r['n']}×{r['k']}" for r in rows]
        width = 0.27
        for j, (v, name) in enumerate((("addmm", "cuBLASLt addmm (beta = 1)"), ("mm_add", "mm, then add"),
                                       ("evtc", "evtc, fused"))):
            ax.bar([x + (j - 1) * width for x in range(len(rows))], [r[f"{v}_over_mm"] or 0 for r in rows],
                   width, label=name)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(range(len(rows)), labels, fontsize=6, rotation=45, ha="right")
        ax.set_ylabel("time / torch.mm (the GEMM alone)")
        ax.set_ylim(0.8, None)
        ax.set_title(f"A GEMM with a residual add ({device})")
        ax.legend(fontsize=7)
        save_png(fig, base)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
