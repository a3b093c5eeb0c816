#!/usr/bin/env python3
"""Collects what bench/run_suite.py wrote into bench/results/raw (one JSON per workload from
`evtc run --bench --json`, compile.json, torch.json) into one results file
bench/results/<stamp>-<gpu>.json, a PNG bar chart of time relative to the plain cuBLAS GEMM, and
the table in bench/README.md.

Usage: report.py RAW_DIR RESULTS_DIR README [DATE]"""
import datetime
import json
import math
import os
import pathlib
import re
import subprocess
import sys

# Targets from the shared WORKLOADS table: the most fused time may be over a reference's,
# the reference being the plain cuBLAS GEMM of the same run, or for the fp8 workloads
# torch._scaled_mm (row-wise scales) measured by bench/torch_baselines.py.
TARGETS = {"W1-4096": (1.02, "cublas"), "W1-8192": (1.02, "cublas"), "W1-8192x8192x1024": (1.05, "cublas"),
           "W2-8192x8192x1024": (1.15, "cublas"), "W3-4096": (1.0, "scaled_mm"),
           "W3gelu-4096": (1.05, "scaled_mm"), "W7-8192x8192x1024": (1.10, "cublas"),
           "biasgrad-8192x8192x1024": (1.10, "cublas")}
GEOMEAN_TARGET = 1.15  # speedup over torch.compile max-autotune
COMPILE_TARGETS = {"cold_compile_s": 20.0, "cache_hit_ms": 20.0, "tune_all_s": 60.0}
DISPATCH_TARGET_US = 5.0


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
        r["torch"] = {key: t[key] for key in ("torch_mm_ms", "scaled_mm_ms", "eager_ms", "compile_ms", "autotune_ms",
                                              "compile_first_call_s", "autotune_first_call_s", "error", "skipped")
                      if key in t}
        b = r.get("bench")
        if not b:
            continue
        for key, name in (("eager_ms", "eager"), ("compile_ms", "compile"), ("autotune_ms", "autotune")):
            if key in t:
                r[f"speedup_over_{name}"] = t[key] / b["fused_ms"]
        if "scaled_mm_ms" in t:
            r["fused_over_scaled_mm"] = b["fused_ms"] / t["scaled_mm_ms"]
        if r["id"] in TARGETS:
            bound, ref = TARGETS[r["id"]]
            ratio = b["fused_over_cublas"] if ref == "cublas" else r.get("fused_over_scaled_mm")
            r["target"] = {"bound": bound, "reference": ref, "ratio": ratio,
                           "met": ratio is not None and ratio <= bound}
        plain_file = raw / "plain" / f"{r['id']}.json"
        if plain_file.exists():
            p = json.loads(plain_file.read_text())
            if "bench" in p:
                plain_ms = p["bench"]["fused_ms"]
                r["evt_overhead"] = {"config": p.get("config"), "plain_ms": plain_ms,
                                     "plain_cublas_ms": p["bench"]["cublas_ms"],
                                     "overhead_ms": b["fused_ms"] - plain_ms,
                                     "overhead_rel": b["fused_ms"] / plain_ms - 1}
    return rows, compile_info, torch_info


def summary(rows, compile_info):
    out = {"geomean_target": GEOMEAN_TARGET}
    for name in ("autotune", "compile", "eager"):
        ws = [r for r in rows if f"speedup_over_{name}" in r]
        out[f"geomean_speedup_over_{name}"] = geomean([r[f"speedup_over_{name}"] for r in ws])
        out[f"{name}_workloads"] = [r["id"] for r in ws]
    out["targets_met"] = [r["id"] for r in rows if r.get("target", {}).get("met")]
    out["targets_missed"] = [r["id"] for r in rows if "target" in r and not r["target"]["met"]]
    first = next((r for r in rows if "cache_hit_ms" in r), None)
    d = next((r["dispatch"] for r in rows if "dispatch" in r), None)
    tune_all = compile_info.get("tune_all", {})
    out["latency"] = {"cold_compile_s": compile_info.get("cold_compile_s"),
                      "cache_hit_ms": first["cache_hit_ms"] if first else None,
                      "tune_all_s": tune_all.get("seconds"),
                      "dispatch_us": d["run_us"] if d else None}
    out["latency_targets"] = dict(COMPILE_TARGETS, dispatch_us=DISPATCH_TARGET_US)
    return out


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
              ("evtc plain epilogue, same config", lambda r: r.get("evt_overhead", {}).get("plain_ms")),
              ("cuBLAS + unfused epilogue", lambda r: r["bench"]["unfused_ms"]),
              ("torch._scaled_mm (fp8)", lambda r: r["torch"].get("scaled_mm_ms")),
              ("PyTorch eager", lambda r: r["torch"].get("eager_ms")),
              ("torch.compile", lambda r: r["torch"].get("compile_ms")),
              ("torch.compile max-autotune", lambda r: r["torch"].get("autotune_ms"))]
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(rows)), 4.5))
    series = [(label, get) for label, get in series if any(get(r) is not None for r in rows)]
    width = 0.8 / len(series)
    for i, (label, get) in enumerate(series):
        xs, ys = [], []
        for x, r in enumerate(rows):
            v = get(r)
            if v is not None:
                xs.append(x - 0.4 + width * (i + 0.5))
                ys.append(v / r["bench"]["cublas_ms"])
        if ys:  # a series with no values would still take a colour
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


def ratio(v):
    return f"{v:.3f}×" if v is not None else "–"


def table(rows, result):
    s = result["summary"]
    lines = [f"Measured on {result['device']}, {result['date']} (median of 50 timed runs after 10 warm-up "
             "runs, CUDA events; cuBLAS, the unfused path and PyTorch in the same run). `fused` uses the "
             "configuration `evtc tune` chose for the shape; `cuBLAS` is cuBLASLt computing the product alone "
             "in the output dtype (fp8 for W3: no scales); `plain` is the epilogue `D = acc` compiled with the "
             "fused kernel's configuration.", "",
             "| workload | M×N×K | config | fused ms | plain ms | cuBLAS ms | unfused ms | eager ms | compile ms "
             "| max-autotune ms | `_scaled_mm` ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = r.get("bench")
        if not b:
            continue
        t = r["torch"]
        lines.append(f"| {r['id']} | {r['m']}×{r['n']}×{r['k']} | `{r.get('config', '?')}` | {b['fused_ms']:.4f} | "
                     f"{fmt_ms(r.get('evt_overhead', {}).get('plain_ms'))} | "
                     f"{b['cublas_ms']:.4f} | {b['unfused_ms']:.4f} | {fmt_ms(t.get('eager_ms'))} | "
                     f"{fmt_ms(t.get('compile_ms'))} | {fmt_ms(t.get('autotune_ms'))} | "
                     f"{fmt_ms(t.get('scaled_mm_ms'))} |")
    lines += ["", "Ratios (fused time over the other's; below 1 the fused kernel is faster) and the targets:", "",
              "| workload | / cuBLAS | / unfused | / eager | / compile | / max-autotune | target | met | "
              "EVT overhead (fused − plain) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = r.get("bench")
        if not b:
            continue
        t = r["torch"]
        inv = lambda key: b["fused_ms"] / t[key] if key in t else None  # noqa: E731
        tg = r.get("target")
        target = (f"≤ {tg['bound']:.2f}× {'cuBLAS' if tg['reference'] == 'cublas' else '`_scaled_mm`'} "
                  f"(is {ratio(tg['ratio'])})" if tg else "–")
        met = ("yes" if tg["met"] else "no") if tg else "–"
        o = r.get("evt_overhead")
        overhead = f"{1000 * o['overhead_ms']:+.1f} µs ({100 * o['overhead_rel']:+.1f} %)" if o else "–"
        lines.append(f"| {r['id']} | {ratio(b['fused_over_cublas'])} | {ratio(b['fused_over_unfused'])} | "
                     f"{ratio(inv('eager_ms'))} | {ratio(inv('compile_ms'))} | {ratio(inv('autotune_ms'))} | "
                     f"{target} | {met} | {overhead} |")
    lines.append("")
    if s.get("geomean_speedup_over_autotune"):
        lines.append(f"- Geometric-mean speedup over `torch.compile(mode=\"max-autotune-no-cudagraphs\")`: "
                     f"{s['geomean_speedup_over_autotune']:.3f}× over {', '.join(s['autotune_workloads'])} "
                     f"(target ≥ {GEOMEAN_TARGET}×); over `torch.compile`: "
                     f"{s['geomean_speedup_over_compile']:.3f}× over {', '.join(s['compile_workloads'])}; "
                     f"over eager: {s['geomean_speedup_over_eager']:.3f}×.")
    c = result["compile"]
    if c:
        lines.append(f"- Cold compile of one kernel (`evtc compile`, nothing cached): {c.get('cold_compile_s', 0):.1f} s "
                     f"(target ≤ {COMPILE_TARGETS['cold_compile_s']:.0f} s); finding it in the disk cache from a new "
                     f"process: {1000 * c.get('warm_load_s', 0):.1f} ms inside `evtc compile` "
                     f"({1000 * c.get('warm_process_s', 0):.0f} ms for the whole process).")
        ta = c.get("tune_all")
        if ta:
            lines.append(f"- A new epilogue ({ta['workload']}) tuned from nothing over all {ta['candidates']} candidates "
                         f"(`evtc tune`, all compiled in parallel on {c.get('cores', os.cpu_count())} cores, then timed): "
                         f"{ta['seconds']:.1f} s (target ≤ {COMPILE_TARGETS['tune_all_s']:.0f} s); "
                         f"chose `{ta.get('best', '?')}`.")
        if "all_candidates_compile_s" in c:
            lines.append(f"- Every tuning candidate of the suite compiled in {c['all_candidates_compile_s']:.0f} s "
                         f"(at most {os.environ.get('EVTC_TUNE_MAX_CANDIDATES', '4')} per shape); timing them took "
                         f"{c.get('tuning_timing_s', 0):.0f} s" +
                         (f"; the whole suite {c['suite_s']:.0f} s." if "suite_s" in c else "."))
    first = next((r for r in rows if "cache_hit_ms" in r), None)
    if first:
        lines.append(f"- Disk-cache hit in a new process ({first['id']}: Kernel construction, library lookup and "
                     f"load, first call to completion): {first['cache_hit_ms']:.1f} ms "
                     f"(target ≤ {COMPILE_TARGETS['cache_hit_ms']:.0f} ms).")
    d = next((r["dispatch"] for r in rows if "dispatch" in r), None)
    if d:
        new_args = (f"; with new arguments every call (CUTLASS's set-up and TMA descriptors again) "
                    f"{d['library_new_args_us']:.2f} µs" if "library_new_args_us" in d else "")
        lines.append(f"- Host dispatch per call (median of 200, same arguments): `Kernel::run` {d['run_us']:.2f} µs "
                     f"(target ≤ {DISPATCH_TARGET_US:.0f} µs), of which the kernel library's `evtc_run` "
                     f"{d['library_us']:.2f} µs{new_args}; a cuBLASLt matmul {d['cublas_us']:.2f} µs.")
    return "\n".join(lines)


def main(raw_dir, results_dir, readme, date=None):
    raw = pathlib.Path(raw_dir)
    rows, compile_info, torch_info = collect(raw)
    # Re-run on another machine (from a copied raw folder), the GPU is the one PyTorch saw,
    # and DATE (YYYYmmdd-HHMM) the time of the measurements.
    date = date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M")
    device = torch_info.get("device") or device_name()
    chip = re.search(r"\b([A-Z]\d{2,3})\b", device)
    stamp = f"{date}-{chip.group(1).lower()}" if chip else date  # e.g. 20261122-1500-h100
    result = {"device": device, "date": date, "compile": compile_info,
              "torch": {k: v for k, v in torch_info.items() if k != "workloads"}, "workloads": rows}
    result["summary"] = summary(rows, compile_info)
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
    main(*sys.argv[1:5])
