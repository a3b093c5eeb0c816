#!/usr/bin/env python3
"""Collects what bench/run_suite.py wrote into bench/results/raw (one JSON per workload from
`evtc run --bench --json`, compile.json, torch.json) into one results file
bench/results/<stamp>.json, a PNG bar chart of time relative to the plain cuBLAS GEMM, and
the table in bench/README.md.

Usage: report.py RAW_DIR RESULTS_DIR README"""
import datetime
import json
import math
import pathlib
import re
import subprocess
import sys

# Targets for fused / cuBLAS GEMM, from the shared WORKLOADS table.
TARGETS = {"W1-4096": 1.02, "W1-8192": 1.02, "W1-8192x8192x1024": 1.05,
           "W2-8192x8192x1024": 1.15, "W7-8192x8192x1024": 1.10}
GEOMEAN_TARGET = 1.15  # speedup over torch.compile max-autotune


def device_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True).stdout
        return out.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown GPU"


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def collect(raw):
    rows, compile_info, torch_info = [], {}, {}
    for f in sorted(raw.glob("*.json")):
        data = json.loads(f.read_text())
        if f.stem == "compile":
            compile_info = data
        elif f.stem == "torch":
            torch_info = data
        else:
            data["id"] = f.stem
            rows.append(data)
    by_id = {t["id"]: t for t in torch_info.get("workloads", [])}
    for r in rows:
        t = by_id.get(r["id"], {})
        r["torch"] = {key: t[key] for key in ("torch_mm_ms", "eager_ms", "compile_ms", "autotune_ms",
                                              "compile_first_call_s", "autotune_first_call_s", "error", "skipped")
                      if key in t}
        b = r.get("bench")
        if b and "autotune_ms" in t:
            r["speedup_over_autotune"] = t["autotune_ms"] / b["fused_ms"]
        if b and "compile_ms" in t:
            r["speedup_over_compile"] = t["compile_ms"] / b["fused_ms"]
        if r["id"] in TARGETS:
            r["target_over_cublas"] = TARGETS[r["id"]]
    return rows, compile_info, torch_info


def summary(rows):
    over_autotune = [r["speedup_over_autotune"] for r in rows if "speedup_over_autotune" in r]
    over_compile = [r["speedup_over_compile"] for r in rows if "speedup_over_compile" in r]
    return {"geomean_speedup_over_autotune": geomean(over_autotune),
            "autotune_workloads": [r["id"] for r in rows if "speedup_over_autotune" in r],
            "geomean_speedup_over_compile": geomean(over_compile),
            "geomean_target": GEOMEAN_TARGET}


def plot(rows, result, out, stamp):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not available: no plot", file=sys.stderr)
        return
    rows = [r for r in rows if "bench" in r]
    series = [("evtc fused (tuned)", lambda r: r["bench"]["fused_ms"]),
              ("cuBLAS + unfused epilogue", lambda r: r["bench"]["unfused_ms"]),
              ("PyTorch eager", lambda r: r["torch"].get("eager_ms")),
              ("torch.compile", lambda r: r["torch"].get("compile_ms")),
              ("torch.compile max-autotune", lambda r: r["torch"].get("autotune_ms"))]
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(rows)), 4.5))
    width = 0.8 / len(series)
    for i, (label, get) in enumerate(series):
        xs, ys = [], []
        for x, r in enumerate(rows):
            v = get(r)
            if v is not None:
                xs.append(x - 0.4 + width * (i + 0.5))
                ys.append(v / r["bench"]["cublas_ms"])
        ax.bar(xs, ys, width=width, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["id"] for r in rows], rotation=30, ha="right")
    ax.set_ylabel("time / plain cuBLAS GEMM (same run)")
    ax.set_ylim(0, min(4.0, ax.get_ylim()[1]))
    ax.set_title(f"evtc on {result['device']} ({stamp}); bars above 4 are cut")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / f"{stamp}.png", dpi=120)
    fig.savefig(out / "latest.png", dpi=120)


def fmt_ms(v):
    return f"{v:.4f}" if v is not None else "–"


def table(rows, result):
    s = result["summary"]
    lines = [f"Measured on {result['device']}, {result['date']} (median of 50 timed runs after 10 warm-up "
             "runs, CUDA events; cuBLAS, the unfused path and PyTorch in the same run). `fused` uses the "
             "configuration `evtc tune` chose for the shape.", "",
             "| workload | M×N×K | config | fused ms | cuBLAS GEMM ms | unfused ms | eager ms | compile ms "
             "| max-autotune ms | fused / cuBLAS | target | vs max-autotune |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = r.get("bench")
        if not b:
            continue
        t = r["torch"]
        target = f"≤ {r['target_over_cublas']:.2f}×" if "target_over_cublas" in r else "–"
        vs = f"{r['speedup_over_autotune']:.2f}×" if "speedup_over_autotune" in r else "–"
        lines.append(f"| {r['id']} | {r['m']}×{r['n']}×{r['k']} | `{r.get('config', '?')}` | {b['fused_ms']:.4f} | "
                     f"{b['cublas_ms']:.4f} | {b['unfused_ms']:.4f} | {fmt_ms(t.get('eager_ms'))} | "
                     f"{fmt_ms(t.get('compile_ms'))} | {fmt_ms(t.get('autotune_ms'))} | "
                     f"{b['fused_over_cublas']:.3f}× | {target} | {vs} |")
    lines.append("")
    if s["geomean_speedup_over_autotune"]:
        lines.append(f"- Geometric-mean speedup over `torch.compile(mode=\"max-autotune-no-cudagraphs\")`: "
                     f"{s['geomean_speedup_over_autotune']:.3f}× over {', '.join(s['autotune_workloads'])} "
                     f"(target ≥ {GEOMEAN_TARGET}×); over `torch.compile`: "
                     f"{s['geomean_speedup_over_compile']:.3f}× over every workload with a PyTorch reference.")
    c = result["compile"]
    if c:
        lines.append(f"- Cold compile of one kernel: {c.get('cold_compile_s', 0):.1f} s; finding it in the disk "
                     f"cache (`evtc compile`, new process): {1000 * c.get('warm_load_s', 0):.1f} ms; every "
                     f"tuning candidate of the suite compiled in {c.get('all_candidates_compile_s', 0):.0f} s; "
                     f"timing them took {c.get('tuning_timing_s', 0):.0f} s.")
    first = next((r for r in rows if "cache_hit_ms" in r), None)
    if first:
        lines.append(f"- Disk-cache hit in a new process ({first['id']}: Kernel construction, library lookup and "
                     f"load, first call to completion): {first['cache_hit_ms']:.1f} ms.")
    d = next((r["dispatch"] for r in rows if "dispatch" in r), None)
    if d:
        lines.append(f"- Host dispatch per call (median of 200): `Kernel::run` {d['run_us']:.2f} µs, of which the "
                     f"kernel library's `evtc_run` {d['library_us']:.2f} µs; a cuBLASLt matmul "
                     f"{d['cublas_us']:.2f} µs.")
    return "\n".join(lines)


def main(raw_dir, results_dir, readme):
    raw = pathlib.Path(raw_dir)
    rows, compile_info, torch_info = collect(raw)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M")
    result = {"device": device_name(), "date": stamp, "compile": compile_info,
              "torch": {k: v for k, v in torch_info.items() if k != "workloads"}, "workloads": rows}
    result["summary"] = summary(rows)
    out = pathlib.Path(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stamp}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "latest.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, result, out, stamp)
    text_table = table(rows, result)
    path = pathlib.Path(readme)
    text = path.read_text() if path.exists() else ""
    begin, end = "<!-- results:begin -->", "<!-- results:end -->"
    if begin in text:
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: begin + "\n" + text_table + "\n" + end,
                      text, flags=re.S)
    else:
        text += "\n" + begin + "\n" + text_table + "\n" + end + "\n"
    path.write_text(text)
    print(text_table)


if __name__ == "__main__":
    main(*sys.argv[1:4])
