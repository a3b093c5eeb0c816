#!/usr/bin/env python3
"""How good is the configuration evtc picks without tuning? Times every tuning candidate of
transformer GEMM shapes (`evtc tune --max-candidates 0`, all compiled at once) and the cuBLAS
GEMM of the same shape (torch.mm) in one run, then reports, per shape, the heuristic default's
time against the best candidate's (target: within 3 %) and against cuBLAS.

    python3 bench/default_configs.py PATH_TO_EVTC [--out bench/results] [--only silu|gated]

Epilogues: ``silu(acc + bias[n])`` on M ∈ {128, 1024, 8192} × (N, K) of LLaMA-style layers, and
the gated ``swiglu(acc)`` (N → N/2) on merged gate/up shapes (N = 2 × FFN). Kernels go to a
fresh cache folder (EVTC_CACHE_DIR, or a temporary one) so tuned choices persist nowhere else.
Writes <stamp>-<gpu>-default-configs.json and .png under --out; prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from result_files import result_base  # noqa: E402

M_VALUES = (128, 1024, 8192)
SETS = {
    "silu": ("out D: bf16 = silu(acc + bias[n])",
             [(2048, 2048), (5632, 2048), (2048, 5632), (4096, 4096), (11008, 4096), (4096, 11008),
              (14336, 4096), (32000, 4096)]),
    "gated": ("out D: bf16 = swiglu(acc)", [(11264, 2048), (22016, 4096), (28672, 4096)]),
}
TARGET = 1.03  # default / best tuned candidate


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def default_config(evtc: str, expr: str, shape: str, env: dict) -> str:
    # The heuristic default is always the first tuning candidate.
    out = subprocess.run([evtc, "tune", expr, "-s", shape, "--max-candidates", "1", "--list-candidates"],
                         env=env, capture_output=True, text=True, check=True).stdout
    return out.split()[0]


def cublas_ms(m: int, n: int, k: int) -> float:
    """torch.mm timed as `evtc tune` times its candidates: back-to-back launches, one pair of
    CUDA events around each, median of 50 after warm-up (no cache flush between)."""
    import torch

    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    wt = w.t()
    # Warm up for 100 ms of GEMMs (clocks ramp up after idle) then as the tuner does.
    torch.cuda.synchronize()
    start = time.perf_counter()
    while time.perf_counter() - start < 0.1:
        for _ in range(5):
            torch.mm(a, wt)
        torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(50)]
    for start, end in events:
        start.record()
        torch.mm(a, wt)
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def run_set(evtc: str, name: str, raw: pathlib.Path, env: dict) -> list[dict]:
    expr, nks = SETS[name]
    shapes = [(m, n, k) for m in M_VALUES for n, k in nks]
    spec = ",".join(f"{m}x{n}x{k}" for m, n, k in shapes)
    log(f"{name}: tuning {len(shapes)} shapes over all candidates")
    start = time.time()
    tune_json = raw / f"{name}-tune.json"
    with open(raw / f"{name}-tune.log", "w") as f:
        subprocess.run([evtc, "tune", expr, "-s", spec, "--max-candidates", "0", "--json", str(tune_json)],
                       env=env, stdout=f, stderr=subprocess.STDOUT, check=True)
    log(f"{name}: tuned in {time.time() - start:.0f} s")
    rows = []
    for r in json.loads(tune_json.read_text()):
        m, n, k = r["m"], r["n"], r["k"]
        times = {c["config"]: c["median_ms"] for c in r["candidates"] if "median_ms" in c}
        default = default_config(evtc, expr, f"{m}x{n}x{k}", env)
        row = {"set": name, "m": m, "n": n, "k": k, "best": r["best"], "best_ms": r["best_ms"],
               "default": default, "default_ms": times.get(default), "candidates": times,
               "cublas_ms": cublas_ms(m, n, k)}
        if row["default_ms"]:
            row["default_over_best"] = row["default_ms"] / row["best_ms"]
            row["default_over_cublas"] = row["default_ms"] / row["cublas_ms"]
        row["best_over_cublas"] = row["best_ms"] / row["cublas_ms"]
        rows.append(row)
    return rows


def plot(rows: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['set'][0]} {r['m']}x{r['n']}x{r['k']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.45), 4.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r.get("default_over_cublas", 0) for r in rows], 0.4, label="heuristic default")
    ax.bar([x + 0.2 for x in xs], [r["best_over_cublas"] for r in rows], 0.4, label="best tuned candidate")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_ylabel("time / cuBLAS (torch.mm)")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=90, fontsize=7)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("evtc")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results"))
    ap.add_argument("--only", choices=sorted(SETS), action="append")
    args = ap.parse_args()
    import torch

    env = dict(os.environ, EVTC_LOG="warning", EVTC_TUNE="off")
    env.setdefault("EVTC_CACHE_DIR", tempfile.mkdtemp(prefix="evtc-default-configs-"))
    out = pathlib.Path(args.out)
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.only or list(SETS):
        rows += run_set(args.evtc, name, raw, env)
    base = result_base(args.out, torch.cuda.get_device_name(), "default-configs")
    ratios = [r["default_over_best"] for r in rows if "default_over_best" in r]
    summary = {"gpu": torch.cuda.get_device_name(), "target_default_over_best": TARGET,
               "within_target": sum(r <= TARGET for r in ratios), "shapes": len(rows),
               "worst_default_over_best": max(ratios) if ratios else None,
               "geomean_default_over_cublas": statistics.geometric_mean(
                   [r["default_over_cublas"] for r in rows if "default_over_cublas" in r]) if ratios else None}
    pathlib.Path(base + ".json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    plot(rows, pathlib.Path(base + ".png"))
    print(f"{'set':6} {'shape':>18} {'default':>38} {'def/best':>8} {'def/cuBLAS':>10} {'best/cuBLAS':>11}  best")
    for r in rows:
        print(f"{r['set']:6} {r['m']:>6}x{r['n']}x{r['k']:<6} {r['default']:>38} "
              f"{r.get('default_over_best', float('nan')):8.3f} {r.get('default_over_cublas', float('nan')):10.3f} "
              f"{r['best_over_cublas']:11.3f}  {r['best']}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
