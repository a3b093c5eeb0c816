#!/usr/bin/env python3
"""NVIDIA's analytic matmul heuristics (PyPI `nvidia-matmul-heuristics`) against evtc's measured
selection, offline: for every shape of a configuration sweep (bench/gemm_shapes.py --sweep, which
timed every tuning candidate of each shape in one run), ask the library's CUTLASS 3 target for
its ranked kernel configurations and look up what the sweep measured for them.

    pip install --no-deps nvidia-matmul-heuristics
    python3 bench/matmul_heuristics.py SWEEP.json [SWEEP.json ...] [--gpu h100|h200] [--count 8]
                                       [--library PATH/libnvMatmulHeuristics.so.0] [--out bench/results]

No GPU is needed: the library's model is analytic, and the times are the sweep's. A shape measured
in several files is taken from the later one (give full sweeps, not --refine ones: a refine run
times only a few candidates). The library names a CTA tile, a cluster, a split-K factor, a swizzle
and a raster order; evtc's configurations are named by tile, cluster, schedule (cooperative or
ping-pong) and tile scheduler. A library configuration is matched to the swept evtc candidates of
the same tile, cluster and split-K, of either schedule; the order is not part of the match (the
sweep timed CUTLASS's order).

Reported, per shape and as geometric means over the shapes where it applies:
  - coverage: how often the library's first choice is a configuration evtc builds and the sweep
    timed;
  - first choice: its measured time over the sweep's best (the faster and the slower schedule of
    its tile);
  - shortlist: the best measured time among its `--count` choices over the sweep's best (what a
    tuner that compiles only those would reach).
Writes <out>/<stamp>-<gpu>-matmul-heuristics.json.
"""
from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import math
import os
import pathlib
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from result_files import result_base  # noqa: E402

# nvmmhNvidiaGpu_t values of the GPUs evtc ships tables for.
PREDEFINED_GPU = {"h100": 9000, "h200": 9003}
TARGET_CUTLASS3 = 4
# Row-major A (M × K) times the transpose of an nn.Linear weight (N × K row-major): B transposed
# while loading, row-major layouts.
LAYOUT_NT_ROW_MAJOR = 1
STATUS_SUCCESS = 1  # nvmmhStatus_t (0 is an error)
PRECISION = b"TST"  # bf16 A and B, fp32 compute, bf16 C and D
CONFIG_NAME = re.compile(r"^(coop|pingpong)_(\d+)x(\d+)x(\d+)_c(\d+)x(\d+)_(persistent|streamk|splitk\d+)$")


class Problem(ctypes.Structure):
    _fields_ = [("M", ctypes.c_uint32), ("N", ctypes.c_uint32), ("K", ctypes.c_uint32),
                ("batchSize", ctypes.c_uint32), ("matmulLayout", ctypes.c_uint8)]


class KernelConfiguration(ctypes.Structure):
    _fields_ = [("cta", ctypes.c_uint16 * 3), ("warp", ctypes.c_uint16 * 3), ("instr", ctypes.c_uint16 * 3),
                ("splitK", ctypes.c_uint16), ("loadStages", ctypes.c_uint8), ("gridSwizzle", ctypes.c_uint8),
                ("ctaOrder", ctypes.c_uint8), ("cluster", ctypes.c_uint8 * 2)]


def find_library(given: str | None) -> str:
    if given:
        return given
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = pathlib.Path(root) / "nvMatmulHeuristics" / "lib" / "libnvMatmulHeuristics.so.0"
        if path.exists():
            return str(path)
    sys.exit("libnvMatmulHeuristics.so.0 not found: `pip install --no-deps nvidia-matmul-heuristics`, or give --library")


class Heuristics:
    """The library's C API through ctypes: one handle and one hardware descriptor."""

    def __init__(self, path: str, gpu: str):
        self.lib = ctypes.CDLL(path)
        self.lib.nvMatmulHeuristicsGetGemmConfig.restype = ctypes.c_uint
        self.lib.nvMatmulHeuristicsGetGemmConfig.argtypes = [
            ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint, ctypes.c_int, ctypes.POINTER(Problem),
            ctypes.POINTER(KernelConfiguration), ctypes.c_uint, ctypes.c_void_p]
        self.handle = ctypes.c_void_p()
        self.check(self.lib.nvMatmulHeuristicsCreate(ctypes.byref(self.handle)), "nvMatmulHeuristicsCreate")
        self.hardware = ctypes.c_void_p()
        self.check(self.lib.nvMatmulHeuristicsHardwareDescriptorCreate(ctypes.byref(self.hardware)),
                   "nvMatmulHeuristicsHardwareDescriptorCreate")
        self.check(self.lib.nvMatmulHeuristicsHardwareDescriptorSetPredefinedGpu(self.hardware, PREDEFINED_GPU[gpu]),
                   f"the predefined {gpu}")
        buf = ctypes.create_string_buffer(64)
        self.lib.nvMatmulHeuristicsGetVersionString(buf, 64)
        self.version = buf.value.decode()

    def check(self, status: int, what: str) -> None:
        if status != STATUS_SUCCESS:
            self.lib.nvMatmulHeuristicsGetStatusString.restype = ctypes.c_char_p
            sys.exit(f"{what}: {self.lib.nvMatmulHeuristicsGetStatusString(status).decode()}")

    def configs(self, m: int, n: int, k: int, count: int) -> list[dict]:
        problem = Problem(m, n, k, 1, LAYOUT_NT_ROW_MAJOR)
        out = (KernelConfiguration * count)()
        found = self.lib.nvMatmulHeuristicsGetGemmConfig(self.handle, PRECISION, 0, TARGET_CUTLASS3,
                                                        ctypes.byref(problem), out, count, self.hardware)
        return [{"tile": [int(c.cta[0]), int(c.cta[1]), int(c.cta[2])], "cluster": [int(c.cluster[0]), int(c.cluster[1])],
                 "split_k": int(c.splitK), "stages": int(c.loadStages), "swizzle": int(c.gridSwizzle),
                 "cta_order": int(c.ctaOrder)} for c in out[:found]]


def key_of_name(name: str):
    m = CONFIG_NAME.match(name)
    if not m:
        return None
    sched, tm, tn, tk, cm, cn, scheduler = m.groups()
    split = int(scheduler[6:]) if scheduler.startswith("splitk") else 1
    if scheduler == "streamk":
        return None  # stream-K has no counterpart in the library's split-K factor
    return (int(tm), int(tn), int(tk), int(cm), int(cn), split)


def key_of_config(c: dict):
    return (*c["tile"], *c["cluster"], max(1, c["split_k"]))


def measured(candidates: dict[str, float], key) -> list[float]:
    """The sweep's times of evtc's candidates with this tile, cluster and split-K (either schedule)."""
    return sorted(ms for name, ms in candidates.items() if key_of_name(name) == key)


def geomean(values: list[float]):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweeps", nargs="+", help="bench/gemm_shapes.py --sweep results files")
    ap.add_argument("--gpu", choices=sorted(PREDEFINED_GPU), default="h100")
    ap.add_argument("--count", type=int, default=8, help="configurations asked for per shape (default 8)")
    ap.add_argument("--library", help="path of libnvMatmulHeuristics.so.0 (default: the installed package's)")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent / "results"))
    args = ap.parse_args()
    if args.count < 1:
        ap.error("--count must be at least 1")
    shapes: dict[tuple[int, int, int], dict] = {}
    for path in args.sweeps:
        with open(path) as f:
            data = json.load(f)
        if data.get("mode") != "sweep":
            sys.exit(f"{path} is not a sweep results file")
        for r in data["shapes"]:
            if r.get("candidates"):
                shapes[(r["m"], r["n"], r["k"])] = r
    heuristics = Heuristics(find_library(args.library), args.gpu)
    rows = []
    for (m, n, k), r in sorted(shapes.items()):
        best = min(r["candidates"].values())
        configs = heuristics.configs(m, n, k, args.count)
        times = [measured(r["candidates"], key_of_config(c)) for c in configs]
        row = {"m": m, "n": n, "k": k, "best": r.get("best"), "best_ms": best, "cublas_ms": r.get("cublas_ms"),
               "heuristics": configs, "measured_ms": times}
        if configs and times[0]:
            row["first_fast"], row["first_slow"] = times[0][0] / best, times[0][-1] / best
        shortlisted = [t[0] for t in times if t]
        if shortlisted:
            row["shortlist"] = min(shortlisted) / best
        rows.append(row)
        first = configs[0] if configs else None
        print(f"{m}x{n}x{k}: sweep best {r.get('best')} {best:.4f} ms; library first "
              + (f"{first['tile']} c{first['cluster']} splitk{first['split_k']} swizzle {first['swizzle']} "
                 f"order {first['cta_order']}" if first else "none")
              + (f" -> {row['first_fast']:.3f}x/{row['first_slow']:.3f}x" if "first_fast" in row else " (not timed)")
              + (f"; best of its {len(configs)}: {row['shortlist']:.3f}x" if "shortlist" in row else ""), flush=True)
    covered = [r for r in rows if "first_fast" in r]
    summary = {
        "shapes": len(rows),
        "first_choice_timed": len(covered),
        "first_choice_fast_schedule_geomean": geomean([r["first_fast"] for r in covered]),
        "first_choice_slow_schedule_geomean": geomean([r["first_slow"] for r in covered]),
        "shortlist_timed": sum("shortlist" in r for r in rows),
        "shortlist_geomean": geomean([r["shortlist"] for r in rows if "shortlist" in r]),
    }
    print(json.dumps(summary, indent=2))
    path = result_base(args.out, None, "matmul-heuristics", slug=args.gpu) + ".json"
    with open(path, "w") as f:
        json.dump({"library_version": heuristics.version, "gpu": args.gpu, "precision": PRECISION.decode(),
                   "target": "CUTLASS3", "sweeps": args.sweeps, "count": args.count, "summary": summary,
                   "rows": rows}, f, indent=2)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
