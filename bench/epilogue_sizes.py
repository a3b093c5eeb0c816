#!/usr/bin/env python3
"""One epilogue's fused kernel by configuration and problem size, against torch.mm of the same
operands (cuBLAS) in the same process, beside the cost model's estimate of each.

    python3 bench/epilogue_sizes.py [--exprs dswiglu,swiglu_forward,plain,dgelu,dgelu_bias_grad] [--expr NAME=EXPR_OR_FILE]
                                    [--configs default,pingpong_128x128x64_c2x1_persistent,...]
                                    [--sizes 4096x11008x4096,8192x11008x4096,...] [--rounds 3] [--out bench/results]

Every kernel is compiled first, all at once (EVTC_COMPILE_JOBS at a time). Then, size by size,
the GPU runs 100 ms of GEMMs (its clocks ramp up after idle), and each fused kernel and torch.mm
take turns (bench/models.py's interleaved rounds: the order rotates from round to round). The
fused kernel writes into outputs allocated once. ``default`` is the configuration evtc picks
without tuning (the row records which). The cost model's numbers are those the FX pass weighs:
``model_fused_us`` for evtc's kernel, ``model_cublas_us`` for cuBLAS's GEMM.

Writes <stamp>-<gpu>-epilogue-sizes.json and .png under --out, and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The epilogues of a LLaMA MLP's training step, as the FX pass writes them, with the layout of
# B their GEMM has there: SwiGLU's derivative after the down projection's data gradient (dY·W,
# B row-major), and the forward's gate GEMM reading u and writing g and silu(g)·u (x·Wᵀ, B
# column-major).
BUILTIN = {
    "plain": ("out D: bf16 = acc", "col"),
    "dswiglu": ("input g[m,n]: bf16\ninput u[m,n]: bf16\ndh = bf16(acc)\ns = sigmoid(g)\n"
                "out du: bf16 = dh * (g * s)\nout D: bf16 = dh * u * s * (1.0 + g * (1.0 - s))", "row"),
    "swiglu_forward": ("input u[m,n]: bf16\ng = bf16(acc)\nout y0: bf16 = g\nout D: bf16 = bf16(bf16(silu(g)) * u)",
                       "col"),
}
# GPT-2's MLP in training: tanh-GELU's derivative after the data gradient through the second
# layer (its Conv1D weight read transposed: B column-major), without and with the first layer's
# bias gradient as that result's column sums.
_DGELU = ("input x[m,n]: bf16\nd = bf16(acc)\nt = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))\n"
          "g = bf16(d * (0.5 * (1.0 + t) + 0.5 * x * ((1.0 - t * t) * 0.7978845608028654 * (1.0 + 0.134145 * x * x))))\n"
          "out D: bf16 = g\n")
BUILTIN["dgelu"] = (_DGELU, "col")
BUILTIN["dgelu_bias_grad"] = (_DGELU + "out db: bf16 = col_sum(g)\n", "col")
SIZES = "4096x11008x4096,4096x14336x4096,8192x11008x4096,8192x14336x4096"
WARM_S = 0.1


def size(text: str) -> tuple[int, int, int]:
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"a size is MxNxK with three positive integers, got {text!r}")
    return tuple(int(p) for p in parts)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--exprs", default="dswiglu,swiglu_forward",
                   help=f"built-in epilogues, comma-separated: {', '.join(BUILTIN)}")
    p.add_argument("--expr", action="append", default=[], metavar="NAME=EXPR_OR_FILE",
                   help="another epilogue (an expression, or a file holding one); B column-major unless "
                        "NAME ends in :row (repeatable)")
    p.add_argument("--configs", default="default,pingpong_128x128x64_c2x1_persistent,"
                                        "pingpong_128x160x64_c2x1_persistent,coop_128x256x64_c2x1_persistent",
                   help="configurations, comma-separated; default: what evtc picks without tuning")
    p.add_argument("--sizes", default=SIZES, help="problem sizes MxNxK, comma-separated")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (20 timed calls each)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    try:
        args.sizes = [size(s) for s in args.sizes.split(",") if s]
    except argparse.ArgumentTypeError as e:
        p.error(f"--sizes: {e}")
    args.configs = [c for c in args.configs.split(",") if c]
    epilogues = {}
    for name in (n for n in args.exprs.split(",") if n):
        if name not in BUILTIN:
            p.error(f"--exprs: unknown {name!r}; choose from {', '.join(BUILTIN)}")
        epilogues[name] = BUILTIN[name]
    for item in args.expr:
        name, sep, text = item.partition("=")
        if not sep or not name or not text:
            p.error(f"--expr takes NAME=EXPR_OR_FILE, got {item!r}")
        layout = "row" if name.endswith(":row") else "col"
        if os.path.isfile(text):
            with open(text) as f:
                text = f.read()
        epilogues[name.removesuffix(":row")] = (text, layout)
    if not epilogues or not args.configs or not args.sizes:
        p.error("nothing to time: give at least one epilogue, configuration and size")
    args.epilogues = epilogues
    return args


def kernels(args) -> list[dict]:
    """One entry per epilogue and configuration, its evtc Kernel built (parsed and lowered; no
    nvcc): a bad expression or configuration name fails here, before any GPU work."""
    import evtc

    out = []
    for name, (expr, layout) in args.epilogues.items():
        for config in args.configs:
            kernel = evtc.compile(expr, b_layout=layout, config=None if config == "default" else config)
            out.append({"expr": name, "b_layout": layout, "config": config, "kernel": kernel})
    return out


def model(kernel, m: int, n: int, k: int) -> dict:
    """The cost model's times for evtc's kernel and cuBLAS's GEMM at this size."""
    from evtc import _evtc

    e = kernel._native.estimate(m, n, k, _evtc.UnfusedWork())
    return {"model_fused_us": e.fused_us, "model_cublas_us": e.cublas_us, "model_basis": e.basis}


def measure(entries: list[dict], sizes, rounds: int) -> list[dict]:
    import torch

    from evtc._kernel import _TORCH_DTYPES
    from models import time_interleaved

    total = len(entries) * len(sizes)
    futures, started = [], set()
    for e in entries:
        for (m, n, k) in sizes:  # one compile per configuration an entry runs with
            key = (id(e["kernel"]), e["kernel"].config_for(m, n, k))
            if key not in started:
                started.add(key)
                futures.append(e["kernel"].compile_async(m, n, k))
    print(f"compiling {len(futures)} kernel(s) for {len(entries)} epilogue/configuration pair(s) at "
          f"{len(sizes)} size(s)", flush=True)
    for f in futures:
        f.result()
    rows, done = [], 0
    gen = torch.Generator("cuda").manual_seed(0)
    dtype = {name: getattr(torch, t) for name, t in _TORCH_DTYPES.items()}
    for (m, n, k) in sizes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        b_row = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen)
        b_col = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen).t()
        start = time.perf_counter()
        while time.perf_counter() - start < WARM_S:
            torch.mm(a, b_col)
            torch.cuda.synchronize()
        for e in entries:
            kernel, b = e["kernel"], (b_row if e["b_layout"] == "row" else b_col)
            operands = {o.name: 0.5 if o.kind == "scalar_value" else
                        torch.randn(o.size(m, n), device="cuda", dtype=dtype[o.dtype], generator=gen)
                        for o in kernel.inputs}
            outs = {o.name: torch.empty(o.size(m, n), device="cuda", dtype=dtype[o.dtype]) for o in kernel.outputs}
            steps = {"fused": lambda: kernel(a, b, out=outs, **operands), "mm": lambda: torch.mm(a, b)}
            times, per_round = time_interleaved(steps, 3, 20 * rounds, rounds)
            # "fused" or "fallback" (cuBLASLt + the plain epilogue): a row that did not run fused says so.
            row = {"expr": e["expr"], "config": e["config"], "runs": kernel.config_for(m, n, k), "path": kernel.last_path,
                   "b_layout": e["b_layout"], "m": m, "n": n, "k": k, "fused_ms": times["fused"],
                   "mm_ms": times["mm"], "fused_over_mm": times["fused"] / times["mm"], "rounds": per_round,
                   **model(kernel, m, n, k)}
            rows.append(row)
            done += 1
            print(f"[{done}/{total}] {line(row)}", flush=True)
    return rows


def line(r: dict) -> str:
    error = r["model_fused_us"] / (r["fused_ms"] * 1e3) - 1
    path = "" if r.get("path") in (None, "fused") else f" [ran the {r['path']} path]"
    return (f"{r['expr']} {r['m']}x{r['n']}x{r['k']} {r['config']} ({r['runs']}){path}: fused {r['fused_ms']:.4f} ms, "
            f"torch.mm {r['mm_ms']:.4f} ms, {r['fused_over_mm']:.3f}x; model {r['model_fused_us']:.1f} us "
            f"({error:+.1%} of the measured)")


def table(rows: list[dict]) -> str:
    head = "| epilogue | M×N×K | configuration | runs | fused ms | torch.mm ms | fused ÷ mm | model ÷ measured |"
    out = [head, "|" + "---|" * 8]
    for r in rows:
        out.append(f"| {r['expr']} | {r['m']}×{r['n']}×{r['k']} | {r['config']} | {r['runs']} | {r['fused_ms']:.4f} "
                   f"| {r['mm_ms']:.4f} | {r['fused_over_mm']:.3f} | {r['model_fused_us'] / (r['fused_ms'] * 1e3):.3f} |")
    return "\n".join(out)


def plot(rows: list[dict], base: str) -> None:
    from result_files import pyplot, save_png

    plt = pyplot()
    if plt is None:
        return
    exprs = list(dict.fromkeys(r["expr"] for r in rows))
    fig, axes = plt.subplots(len(exprs), 1, figsize=(10, 3.2 * len(exprs)), squeeze=False)
    for ax, expr in zip(axes[:, 0], exprs):
        mine = [r for r in rows if r["expr"] == expr]
        sizes = list(dict.fromkeys((r["m"], r["n"], r["k"]) for r in mine))
        configs = list(dict.fromkeys(r["config"] for r in mine))
        width = 0.8 / len(configs)
        for i, c in enumerate(configs):
            xs, ys, model_ys = [], [], []
            for j, s in enumerate(sizes):
                r = next((r for r in mine if r["config"] == c and (r["m"], r["n"], r["k"]) == s), None)
                if r:
                    xs.append(j + i * width)
                    ys.append(r["fused_over_mm"])
                    model_ys.append(r["model_fused_us"] / (r["mm_ms"] * 1e3))
            ax.bar(xs, ys, width, label=c)
            ax.plot(xs, model_ys, "k_", markersize=12)
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sizes))], ["×".join(map(str, s)) for s in sizes])
        ax.set_ylabel("fused ÷ torch.mm")
        ax.set_title(f"{expr} (bars: measured; dashes: the cost model's fused time ÷ measured torch.mm)")
        ax.legend(fontsize=7)
    save_png(fig, base)


def main() -> int:
    args = parse_args()
    entries = kernels(args)
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench/epilogue_sizes.py needs a CUDA GPU")
    from result_files import result_base

    rows = measure(entries, args.sizes, args.rounds)
    device = torch.cuda.get_device_name()
    base = result_base(args.out, device, "epilogue-sizes")
    summary = {"device": device, "torch": torch.__version__, "rounds": args.rounds,
               "method": f"{WARM_S * 1e3:.0f} ms of torch.mm first, then the fused kernel and torch.mm in "
                         f"interleaved rounds of 20 calls each, median per call",
               "epilogues": {name: {"expr": expr, "b_layout": layout} for name, (expr, layout) in args.epilogues.items()},
               "median_model_over_measured": statistics.median(r["model_fused_us"] / (r["fused_ms"] * 1e3) for r in rows)}
    with open(base + ".json", "w") as f:
        json.dump({"summary": summary, "rows": rows}, f, indent=1)
    print(f"wrote {base}.json")
    print(table(rows))
    plot(rows, base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
