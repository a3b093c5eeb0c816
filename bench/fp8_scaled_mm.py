#!/usr/bin/env python3
"""W3: evtc's fused fp8 GEMMs against torch._scaled_mm, timed in one process.

    python3 bench/fp8_scaled_mm.py EVTC_BINARY [--sizes 4096,8192] [--out bench/results]

For each size (M = N = K) it compiles, with `evtc compile`, the fused kernels of
  W3       D = (a @ b) * sa[m] * sb[n]                    (bf16, row-wise scales)
  W3-gelu  D = gelu((a @ b) * sa[m] * sb[n] + bias[n])     (bf16)
in the default (two-level accumulation) and fast-accumulation main loops, loads each
kernel library and calls it through evtc's C ABI (include/evtc/device/abi.h) on PyTorch's
stream, on the same tensors as
  torch._scaled_mm(a, b, scale_a (M,1), scale_b (1,N), out_dtype=bf16)   [+ gelu(. + bias)]
Every kernel's output is checked against an fp64 reference of the dequantised product
before it is timed (triton.testing.do_bench, median). Writes <out>/<stamp>-<gpu>-fp8.json and
prints a table of ratios.
"""
import argparse
import ctypes
import json
import os
import re
import subprocess
import sys

import torch
import triton.testing

from result_files import result_base

EXPRESSIONS = {
    "W3": "input sa[m]: f32\ninput sb[n]: f32\nout D: bf16 = acc * sa[m] * sb[n]",
    "W3-gelu": ("input sa[m]: f32\ninput sb[n]: f32\ninput bias[n]: bf16\n"
                "out D: bf16 = gelu(acc * sa[m] * sb[n] + bias[n])"),
}


class GemmArgs(ctypes.Structure):
    _fields_ = [("m", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
                ("a", ctypes.c_void_p), ("b", ctypes.c_void_p), ("c", ctypes.c_void_p),
                ("d", ctypes.c_void_p), ("lda", ctypes.c_int64), ("ldb", ctypes.c_int64),
                ("ldc", ctypes.c_int64), ("ldd", ctypes.c_int64),
                ("ptrs", ctypes.POINTER(ctypes.c_void_p)),
                ("scalars", ctypes.POINTER(ctypes.c_double)), ("sm_count", ctypes.c_int),
                ("raster", ctypes.c_int), ("swizzle", ctypes.c_int),
                ("scale_a", ctypes.c_void_p), ("scale_b", ctypes.c_void_p),
                ("ld_scale_a", ctypes.c_int64), ("scale_a_m_stride", ctypes.c_int64),
                ("scale_b_k_stride", ctypes.c_int64), ("scale_b_n_stride", ctypes.c_int64)]


def compile_library(evtc, expr, *flags):
    """Compiles `expr` with the evtc CLI (B column-major, N×K, plus `flags`); returns the kernel
    library's path."""
    cmd = [evtc, "compile", expr, "--layout-b", "c", *flags]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    found = re.search(r"fused kernel: (\S+)", out)
    if not found:
        sys.exit(f"evtc compile printed no kernel path:\n{out}")
    return found.group(1)


def compile_kernel(evtc, expr, config, fast_accum):
    """An fp8 e4m3 kernel (with CUTLASS's fast accumulation if asked)."""
    return compile_library(evtc, expr, "--dtype", "f8e4m3", *(["--fast-accum"] if fast_accum else []),
                           *(["--config", config] if config else []))


class FusedKernel:
    """A compiled evtc kernel library, called through its C ABI."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.evtc_kernel_signature.restype = ctypes.c_char_p
        self.lib.evtc_workspace_size.restype = ctypes.c_size_t
        self.lib.evtc_workspace_size.argtypes = [ctypes.POINTER(GemmArgs)]
        self.lib.evtc_run.argtypes = [ctypes.POINTER(GemmArgs), ctypes.c_void_p, ctypes.c_void_p,
                                      ctypes.c_char_p, ctypes.c_size_t]
        self.signature = json.loads(self.lib.evtc_kernel_signature())

    def bind(self, a, b_nk, d, tensors, raster=0, swizzle=0):
        """Arguments for D = epilogue(a @ b_nk.T): a is M×K, b_nk N×K (B column-major); d may
        be None for a kernel without a main output (its outputs are all in `tensors`). raster
        (0 heuristic, 1 along M, 2 along N) and swizzle set the tile scheduler's visiting order."""
        m, k = a.shape
        n = b_nk.shape[0]
        names = [s["name"] for s in self.signature["pointers"]]
        ptrs = (ctypes.c_void_p * max(1, len(names)))(*[tensors[x].data_ptr() for x in names])
        scalars = (ctypes.c_double * 1)()
        args = GemmArgs(m, n, k, a.data_ptr(), b_nk.data_ptr(), None,
                        d.data_ptr() if d is not None else None, k, k, n, n,
                        ptrs, scalars, 0, raster, swizzle)
        workspace = torch.empty(self.lib.evtc_workspace_size(ctypes.byref(args)) + 1,
                                dtype=torch.uint8, device="cuda")
        why = ctypes.create_string_buffer(256)

        def launch():
            rc = self.lib.evtc_run(ctypes.byref(args), ctypes.c_void_p(workspace.data_ptr()),
                                   ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), why,
                                   256)
            if rc != 0:
                raise RuntimeError(f"evtc_run failed ({rc}): {why.value.decode()}")
        launch.tables = (ptrs, scalars)  # args points into them: alive as long as the launch
        return launch


def rel_error(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("evtc", help="path of the evtc binary")
    ap.add_argument("--sizes", default="4096,8192")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--default-config", default="",
                    help="kernel config of the two-level-accumulation kernels (default: evtc's "
                         "per-shape default)")
    ap.add_argument("--fastacc-config", default="",
                    help="kernel config of the fast-accumulation kernels (default: evtc's)")
    opts = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.cuda.get_device_name()
    configs = {"default": opts.default_config or None, "fastacc": opts.fastacc_config}
    # Compile every kernel first, in parallel (one nvcc each).
    jobs = {}
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=len(EXPRESSIONS) * len(configs)) as pool:
        for w, expr in EXPRESSIONS.items():
            for c, cfg in configs.items():
                jobs[(w, c)] = pool.submit(compile_kernel, opts.evtc, expr, cfg, c == "fastacc")
    kernels = {key: FusedKernel(f.result()) for key, f in jobs.items()}

    rows = []
    for size in [int(s) for s in opts.sizes.split(",")]:
        m = n = k = size
        a = (torch.randn(m, k, device="cuda") * k ** -0.25).to(torch.float8_e4m3fn)
        w = (torch.randn(n, k, device="cuda") * k ** -0.25).to(torch.float8_e4m3fn)
        sa = torch.rand(m, 1, device="cuda") + 0.5
        sb = torch.rand(1, n, device="cuda") + 0.5
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        prod = (a.double() @ w.double().t()) * sa.double() * sb.double()
        refs = {"W3": prod,
                "W3-gelu": torch.nn.functional.gelu(prod + bias.double())}
        tensors = {"sa": sa.view(m), "sb": sb.view(n), "bias": bias}
        bt = w.t()  # (K, N), column-major: what _scaled_mm takes

        def scaled_mm():
            return torch._scaled_mm(a, bt, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)

        def scaled_mm_fast():
            return torch._scaled_mm(a, bt, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                    use_fast_accum=True)

        def scaled_mm_gelu():
            return torch.nn.functional.gelu(scaled_mm() + bias)

        compiled_gelu = torch.compile(scaled_mm_gelu)
        baselines = {"scaled_mm": scaled_mm, "scaled_mm_fastacc": scaled_mm_fast,
                     "scaled_mm+gelu eager": scaled_mm_gelu,
                     "scaled_mm+gelu compile": compiled_gelu}
        times = {}
        for name, fn in baselines.items():
            times[name] = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
        errors = {"scaled_mm": rel_error(scaled_mm(), refs["W3"])}
        for (wl, c), kern in kernels.items():
            d = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            launch = kern.bind(a, w, d, tensors)
            launch()
            torch.cuda.synchronize()
            err = rel_error(d, refs[wl])
            errors[f"evtc {wl} {c}"] = err
            if not (err < 2e-2):
                sys.exit(f"evtc {wl} ({c}) at {size}: relative error {err:.3g}: wrong result")
            times[f"evtc {wl} {c}"] = triton.testing.do_bench(launch, warmup=25, rep=200,
                                                              return_mode="median")
        flops = 2.0 * m * n * k
        row = {"size": size, "ms": times, "rel_error": errors,
               "tflops": {x: flops / (t * 1e-3) / 1e12 for x, t in times.items()},
               "ratios": {
                   "W3 default / scaled_mm": times["evtc W3 default"] / times["scaled_mm"],
                   "W3 fastacc / scaled_mm_fastacc":
                       times["evtc W3 fastacc"] / times["scaled_mm_fastacc"],
                   "W3 fastacc / scaled_mm": times["evtc W3 fastacc"] / times["scaled_mm"],
                   "W3-gelu default / scaled_mm": times["evtc W3-gelu default"] / times["scaled_mm"],
                   "W3-gelu fastacc / scaled_mm": times["evtc W3-gelu fastacc"] / times["scaled_mm"],
                   "W3-gelu default / compile": times["evtc W3-gelu default"]
                   / times["scaled_mm+gelu compile"],
               }}
        rows.append(row)
        print(f"--- {size}^3 on {dev}")
        for x, t in times.items():
            print(f"  {x:28s} {t:8.4f} ms  {row['tflops'][x]:7.0f} TFLOP/s")
        for x, r in row["ratios"].items():
            print(f"  {x:40s} {r:.3f}x")
    path = result_base(opts.out, dev, "fp8") + ".json"
    with open(path, "w") as f:
        json.dump({"device": dev, "torch": torch.__version__, "method":
                   "triton.testing.do_bench median (warmup 25 ms, rep 200 ms), same process",
                   "rows": rows}, f, indent=2)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
