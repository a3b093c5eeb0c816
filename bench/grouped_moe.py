#!/usr/bin/env python3
"""Grouped (MoE) GEMMs with fused epilogues against torch._grouped_mm and torch.bmm.

evtc's grouped kernels are compiled with `evtc grouped --compile-only` and called through
their C ABI (include/evtc/device/grouped_abi.h) on torch tensors, on torch's current stream;
torch._grouped_mm (GEMM alone, and GEMM + bias + the same epilogue in eager PyTorch) and
torch.bmm (equal groups only) are timed in the same process. Each time is the median of
CUDA-event timings after warm-up. Every evtc result is first checked against an fp32
PyTorch computation of the same epilogue (rel-L2 ≤ 1e-2).

The gated epilogue (gptoss_swiglu, the W6 MoE layer's activation) reads the weights' rows as
interleaved (gate, up) pairs and writes sum(M_g) × N/2; its eager PyTorch form slices the
even and odd columns of the product.

Writes DIR/grouped_moe.json (after every row) and DIR/grouped_moe.png.

Usage: python3 bench/grouped_moe.py PATH/TO/evtc --out DIR [--epilogues bias,gptoss_swiglu]
       [--shapes W6,MoE] [--configs ,coop_128x256x64_c2x1_persistent]
"""
import argparse
import ctypes
import json
import os
import re
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F


class GroupedArgs(ctypes.Structure):
    _fields_ = [("groups", ctypes.c_int64), ("total_m", ctypes.c_int64), ("n", ctypes.c_int64),
                ("k", ctypes.c_int64), ("x", ctypes.c_void_p), ("w", ctypes.c_void_p),
                ("offsets", ctypes.c_void_p), ("y", ctypes.c_void_p), ("ldx", ctypes.c_int64),
                ("ldw", ctypes.c_int64), ("w_group_stride", ctypes.c_int64), ("ldy", ctypes.c_int64),
                ("ptrs", ctypes.POINTER(ctypes.c_void_p)), ("scalars", ctypes.POINTER(ctypes.c_double)),
                ("group_strides", ctypes.POINTER(ctypes.c_int64)), ("sm_count", ctypes.c_int),
                ("scale_a", ctypes.c_void_p), ("scale_a_strides", ctypes.c_int64 * 2),
                ("scale_b", ctypes.c_void_p), ("scale_b_strides", ctypes.c_int64 * 3)]


def compile_kernel(evtc, expr, config):
    cmd = [evtc, "grouped", expr, "--compile-only"] + (["--config", config] if config else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    path, name = re.search(r"grouped kernel: (\S+) \((\S+),", out).groups()
    return path, name


class EvtcGrouped:
    """One compiled grouped kernel, bound to one problem's tensors (bias: G×N, per group; y:
    sum(M_g) × N, or × N/2 for a gated kernel, whose output is its second pointer slot)."""

    def __init__(self, path, x, w, offsets, bias, y, gated=False):
        self.lib = ctypes.CDLL(path)
        for f in ("evtc_grouped_workspace_size",):
            getattr(self.lib, f).restype = ctypes.c_size_t
        self.keep = (x, w, offsets, bias, y)
        g, n, k = w.shape
        if gated:  # pointer slots: inputs, then the gated output
            self.ptrs = (ctypes.c_void_p * 2)(bias.data_ptr(), y.data_ptr())
            self.strides = (ctypes.c_int64 * 2)(bias.stride(0), 0)
        else:
            self.ptrs = (ctypes.c_void_p * 1)(bias.data_ptr())
            self.strides = (ctypes.c_int64 * 1)(bias.stride(0))
        self.scalars = (ctypes.c_double * 1)(0.0)
        self.args = GroupedArgs(g, x.shape[0], n, k, x.data_ptr(), w.data_ptr(), offsets.data_ptr(),
                                y.data_ptr(), x.stride(0), w.stride(1), w.stride(0), y.stride(0),
                                self.ptrs, self.scalars, self.strides, 0)
        why = ctypes.create_string_buffer(256)
        if self.lib.evtc_grouped_can_implement(ctypes.byref(self.args), why, 256) != 0:
            raise RuntimeError(why.value.decode())
        size = self.lib.evtc_grouped_workspace_size(ctypes.byref(self.args))
        self.workspace = torch.empty(size, dtype=torch.uint8, device="cuda")

    def __call__(self):
        why = ctypes.create_string_buffer(256)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        rc = self.lib.evtc_grouped_run(ctypes.byref(self.args), ctypes.c_void_p(self.workspace.data_ptr()),
                                       stream, why, 256)
        if rc != 0:
            raise RuntimeError(why.value.decode())


def median_ms(fn, warmup=20, iters=100):
    """Median of CUDA-event timings of single calls. The events bracket the host's launch cost
    too (ctypes and CUTLASS's argument set-up for evtc, dispatch for PyTorch) when it exceeds
    the GPU's queue, so small problems read a little slow for every contender."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def gptoss_swiglu(h, alpha=1.702, limit=7.0):
    """GPT-OSS SwiGLU over interleaved (gate, up) columns: N -> N/2."""
    g = h[:, 0::2].clamp(max=limit)
    u = h[:, 1::2].clamp(-limit, limit)
    return g * torch.sigmoid(alpha * g) * (u + 1)


EPILOGUES = {
    # name: (evtc expression, the same in PyTorch over h = x_g @ w_g.T + bias_g, gated)
    "bias": ("out D: bf16 = acc + bias[n]", lambda h: h, False),
    "bias_silu": ("out D: bf16 = silu(acc + bias[n])", F.silu, False),
    "gptoss_swiglu": ("out y: bf16 = gptoss_swiglu(acc + bias[n])", gptoss_swiglu, True),
}


def problem(rows, n, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(rows)
    s = k ** -0.25
    x = (torch.randn(total, k, device="cuda", generator=g) * s).bfloat16()
    w = (torch.randn(len(rows), n, k, device="cuda", generator=g) * s).bfloat16()
    bias = torch.randn(len(rows), n, device="cuda", generator=g).bfloat16()
    offs = torch.tensor(rows, device="cuda", dtype=torch.int64).cumsum(0).to(torch.int32)
    return x, w, bias, offs


def reference(x, w, bias, offs, fn):
    out, start = [], 0
    for gi, end in enumerate(offs.tolist()):
        h = x[start:end].float() @ w[gi].float().T + bias[gi].float()
        out.append(fn(h))
        start = end
    return torch.cat(out)


def plot(results: dict, path: str) -> None:
    """One bar group per (shape, epilogue): each evtc configuration and torch._grouped_mm alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    if not rows:
        return
    names = sorted({c for r in rows for c in r["evtc"]})
    bars = names + ["torch._grouped_mm"]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(rows) * len(bars) / 4 + 2), 4.5))
    width = 0.8 / len(bars)
    for j, name in enumerate(bars):
        ys = [(r["evtc"].get(name, {}).get("ms") if name in names else r["baselines_ms"]["torch._grouped_mm"]) or 0
              for r in rows]
        ax.bar([i + j * width for i in range(len(rows))], ys, width, label=name)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))],
                  [f"{r['shape']}\n[{r['epilogue']}]" for r in rows], fontsize=7)
    ax.set_ylabel("ms (lower is better)")
    ax.set_title(f"{results['device']}, grouped GEMM + epilogue, torch {results['torch']}")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("evtc")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--configs", default=",pingpong_128x128x64_c1x2_persistent,coop_128x256x64_c2x1_persistent")
    ap.add_argument("--epilogues", default=",".join(EPILOGUES), help="comma-separated, of " + ",".join(EPILOGUES))
    ap.add_argument("--shapes", default="", help="run only the shapes whose name starts with one of these (comma-separated)")
    opts = ap.parse_args()
    epilogues = {e: EPILOGUES[e] for e in opts.epilogues.split(",")}
    os.makedirs(opts.out, exist_ok=True)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    ragged = [int(v) for v in torch.randint(0, 257, (64,), generator=gen)]
    ragged[3] = ragged[40] = 0
    # bench/models.py's moe layer: top-2 of 8 experts over 8192 tokens, its gate and up
    # projections merged (N = 2 x 1408, K = 2048); a random router's groups of about 2048 rows.
    routed = torch.bincount(torch.randint(0, 8, (16384,), generator=gen), minlength=8).tolist()
    shapes = {
        "W6 8x1024x4096x2048": ([1024] * 8, 4096, 2048),
        "G64 ragged (0..256 rows) x4096x2048": (ragged, 4096, 2048),
        "MoE layer 8 ragged (~2048 rows) x2816x2048": (routed, 2816, 2048),
    }
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": []}
    configs = opts.configs.split(",")
    if opts.shapes:
        shapes = {name: v for name, v in shapes.items() if any(name.startswith(p) for p in opts.shapes.split(","))}
    # Every kernel compiles at once (one nvcc per core), before any timing.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        pending = {(epi, cfg): pool.submit(compile_kernel, opts.evtc, expr, cfg)
                   for epi, (expr, _, _) in epilogues.items() for cfg in configs}
        kernels = {key: f.result() for key, f in pending.items()}
    print(f"compiled {len(kernels)} kernels", flush=True)
    for shape_name, (rows, n, k) in shapes.items():
        x, w, bias, offs = problem(rows, n, k, 0)
        total = sum(rows)
        flops = 2.0 * total * n * k
        base = {}
        base["torch._grouped_mm"] = median_ms(lambda: torch._grouped_mm(x, w.transpose(1, 2), offs=offs))
        if len(set(rows)) == 1:
            xb = x.view(len(rows), rows[0], k)
            base["torch.bmm"] = median_ms(lambda: torch.bmm(xb, w.transpose(1, 2)))
        for epi, (expr, fn, gated) in epilogues.items():
            def eager():
                h = torch._grouped_mm(x, w.transpose(1, 2), offs=offs)
                idx = torch.repeat_interleave(torch.arange(len(rows), device="cuda"), offs.diff(prepend=offs.new_zeros(1)),
                                              output_size=total)
                return fn(h + bias[idx])
            row = {"shape": shape_name, "epilogue": epi, "groups": len(rows), "total_m": total, "n": n, "k": k,
                   "output_cols": n // 2 if gated else n, "baselines_ms": dict(base), "evtc": {}}
            row["baselines_ms"]["torch._grouped_mm + eager epilogue"] = median_ms(eager)
            want = reference(x, w, bias, offs, fn)
            for cfg in configs:
                path, cfg_name = kernels[(epi, cfg)]
                y = torch.full(tuple(want.shape), float("nan"), dtype=torch.bfloat16, device="cuda")
                kern = EvtcGrouped(path, x, w, offs, bias, y, gated)
                kern()
                torch.cuda.synchronize()
                err = ((y.float() - want).norm() / want.norm()).item()
                ok = err <= 1e-2 and not torch.isnan(y).any().item()
                ms = median_ms(kern)
                row["evtc"][cfg_name] = {"ms": ms, "tflops": flops / ms / 1e9, "rel_l2": err, "check": ok}
            best = min(row["evtc"].items(), key=lambda kv: kv[1]["ms"])
            row["evtc_best"] = best[0]
            results["rows"].append(row)
            line = " | ".join(f"{name} {v:.4f} ms" for name, v in row["baselines_ms"].items())
            print(f"{shape_name} [{epi}]: evtc {best[1]['ms']:.4f} ms ({best[0]}, {best[1]['tflops']:.0f} TFLOP/s, "
                  f"rel_l2 {best[1]['rel_l2']:.2e}, {'PASS' if best[1]['check'] else 'FAIL'}) | {line}", flush=True)
            for name, v in row["evtc"].items():
                print(f"    {name}: {v['ms']:.4f} ms rel_l2 {v['rel_l2']:.2e} {'PASS' if v['check'] else 'FAIL'}")
            with open(os.path.join(opts.out, "grouped_moe.json"), "w") as f:
                json.dump(results, f, indent=1)
    try:
        plot(results, os.path.join(opts.out, "grouped_moe.png"))
    except ImportError as e:
        print(f"no plot: {e}")


if __name__ == "__main__":
    main()
