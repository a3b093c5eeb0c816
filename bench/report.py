#!/usr/bin/env python3
"""Collects the per-workload JSON that bench/run.sh wrote into one results file, a PNG bar
chart of time relative to the plain cuBLAS GEMM, and the table in bench/README.md."""
import datetime
import json
import pathlib
import re
import subprocess
import sys


def device_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True).stdout
        return out.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown GPU"


def main(raw_dir, results_dir, readme):
    raw = pathlib.Path(raw_dir)
    rows = []
    compile_info = {}
    for f in sorted(raw.glob("*.json")):
        data = json.loads(f.read_text())
        if f.stem == "compile":
            compile_info = data
            continue
        data["id"] = f.stem
        rows.append(data)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M")
    result = {"device": device_name(), "date": stamp, "compile": compile_info, "workloads": rows}
    out = pathlib.Path(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stamp}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "latest.json").write_text(json.dumps(result, indent=2) + "\n")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        ids = [r["id"] for r in rows if "bench" in r]
        fused = [r["bench"]["fused_over_cublas"] for r in rows if "bench" in r]
        unfused = [r["bench"]["unfused_ms"] / r["bench"]["cublas_ms"] for r in rows if "bench" in r]
        fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(ids)), 4))
        xs = range(len(ids))
        ax.bar([x - 0.2 for x in xs], fused, width=0.4, label="evtc fused")
        ax.bar([x + 0.2 for x in xs], unfused, width=0.4, label="unfused (cuBLASLt + epilogue)")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(list(xs))
        ax.set_xticklabels(ids, rotation=30, ha="right")
        ax.set_ylabel("time / plain cuBLAS GEMM")
        ax.set_title(f"evtc on {result['device']} ({stamp})")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"{stamp}.png", dpi=120)
        fig.savefig(out / "latest.png", dpi=120)
    except ImportError:
        print("matplotlib not available: no plot", file=sys.stderr)

    lines = [f"Measured on {result['device']}, {stamp} (median of 50 timed runs after 10 warm-up runs, "
             "CUDA events; cuBLAS and the unfused path in the same process).", "",
             "| workload | M×N×K | fused ms | cuBLAS GEMM ms | unfused ms | fused / cuBLAS | fused / unfused |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        b = r.get("bench")
        if not b:
            continue
        lines.append(f"| {r['id']} | {r['m']}×{r['n']}×{r['k']} | {b['fused_ms']:.4f} | {b['cublas_ms']:.4f} | "
                     f"{b['unfused_ms']:.4f} | {b['fused_over_cublas']:.3f}× | {b['fused_over_unfused']:.3f}× |")
    if compile_info:
        lines += ["", f"Cold compile of one kernel: {compile_info.get('cold_compile_s', 0):.1f} s; "
                  f"loading it from the disk cache in a new process: "
                  f"{1000 * compile_info.get('warm_load_s', 0):.0f} ms."]
    table = "\n".join(lines)
    path = pathlib.Path(readme)
    text = path.read_text() if path.exists() else ""
    begin, end = "<!-- results:begin -->", "<!-- results:end -->"
    if begin in text:
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), begin + "\n" + table + "\n" + end, text, flags=re.S)
    else:
        text += "\n" + begin + "\n" + table + "\n" + end + "\n"
    path.write_text(text)
    print(table)


if __name__ == "__main__":
    main(*sys.argv[1:4])
