#!/usr/bin/env python3
"""evtc's default kernel against the library GEMM a user would call instead, over the linear
layers of real models (bf16 and fp8, one GPU); and, with --sweep, the measurement behind the
shipped configuration-selection table.

    python3 bench/gemm_shapes.py [--sets plain,silu,swiglu,fp8] [--m 16,64,...] [--shapes MxNxK,...]
                                 [--off-grid] [--max-shapes N] [--quick] [--rounds 5] [--calls 20]
                                 [--passes 1] [--warmup-ms 100] [--rotate-mb 256] [--no-backlog] [--seed 0]
                                 [--out bench/results] [--dry-run]
    python3 bench/gemm_shapes.py --table bench/results/STAMP-h100-gemm-shapes.json   # only print the table
    python3 bench/gemm_shapes.py --sweep --evtc PATH_TO_EVTC_CLI --table-out FILE.json
                                 [--m ...] [--shapes ...] [--max-shapes N] [--rounds 3] [--calls 10] [--dry-run]

Compare mode (the default). Each set is one epilogue compiled with `evtc.compile(expr)` (no
configuration given: the configuration a user gets) and the library call it replaces:

    plain   out D: bf16 = acc                     vs torch.mm(a, w.t())
    silu    out D: bf16 = silu(acc + bias[n])     vs torch.mm(a, w.t())  (the plain GEMM of the same N)
    swiglu  out D: bf16 = swiglu(acc)  (M x N/2)  vs torch.mm(a, w.t())  (merged gate/up layers only)
    residual  out D: bf16 = acc + r[m,n]          vs torch.mm(a, w.t())  (the plain GEMM of the same N)
    residual_c  out D: bf16 = acc + C             the same sum, its operand read as the collective's C
    fp8     out D: bf16 = acc * sa[m] * sb[n]     vs torch._scaled_mm(a, w.t(), scale_a=sa.view(-1, 1),
                                                     scale_b=sb.view(1, -1), out_dtype=torch.bfloat16)

A is M x K row-major, w the N x K nn.Linear weight (row-major) and B = w.t() (--layout rc, the
default). --layout rr passes B as a K x N row-major matrix (a backward pass's data gradient,
dY @ W) and --layout cr also A column-major (its weight gradient, dY.t() @ X); the library call
gets the same operands. Shapes: M in
{16, 32, 64, 128, 256, 1024, 4096, 8192, 16384} x the (N, K) of real linear layers (LAYERS);
--m restricts M, --shapes replaces the grid, --off-grid times a fixed list of shapes outside it
(other M, N and K) to check that results carry over, --max-shapes keeps that many shapes per set
(evenly spread), --quick is 3 rounds x 10 calls and at most 12 shapes per set.

Method. Every evtc kernel of the run compiles first, in parallel (Kernel.compile_async). Per
shape: the first evtc call writes into an output filled with NaN and is checked against the
reference computed in float64 on the GPU (relative L2 error at most 2e-2; a NaN or a larger
error fails the row, and the run exits non-zero after finishing the others); then about 100 ms
of calls of both warm the clocks, and R rounds (--rounds, default 5) alternate evtc and the
reference (their order rotating), each timing N calls (--calls, default 20) of each with a pair
of CUDA events around every call. Reported: the median per call over all rounds. The weight
matrix is copied until the copies exceed 256 MB (--rotate-mb; at most 64 copies) and calls
rotate through the copies, evtc's and the reference's alike, so that every call reads its
weights from DRAM, not from the 50 MB L2. Each batch of timed calls is queued behind a GPU
sleep so that the host stays ahead of the GPU and the events time the kernels, not Python's
launch cost (--no-backlog times with the host in the loop). --alternate times the variants call
by call in turn within one batch per round instead (evtc, reference, evtc, ...), so that both
run at the same clock and power state: under the power limit a batch of one kernel's calls
can otherwise run at another clock than the next batch's. --passes N times the whole shape list N
times over, so that one shape's passes lie minutes apart, and reports each shape's median over
the passes (its pass ratios kept): the summary then also counts the shapes above 1.04 in every
pass and gives the largest spread of one shape's passes. At M >= 1024 one run's count of shapes
above 1.04 moved by several shapes between runs of the same table (bench/README.md).

Writes <out>/<stamp>-<gpu>-gemm-shapes.json (after every row) and .png (evtc time over the
reference's per shape, grouped by M; skipped without matplotlib), then prints a Markdown table
and the summary: geometric mean of evtc / reference over all shapes, M <= 64 and M >= 128, the
largest ratio, and how many shapes are above 1.04, per set. Choices tuned earlier on this
machine (`evtc tune`) are used by the default kernel; EVTC_TUNE=off measures the untuned default.

Sweep mode (--sweep; the plain set, --set fp8 for fp8 A/B, whose table is the fp8 one, or --set
residual, whose table ("kind": "residual") serves epilogues with one [m,n] operand). For each
shape, `PATH_TO_EVTC_CLI tune 'out D: bf16 = acc' -s MxNxK --max-candidates 0 --list-candidates
--layout-b c` (fp8: the set's expression with `--dtype f8e4m3`) lists the candidate
configurations; every distinct candidate compiles once (`evtc.compile(expr, config=name)`, in
parallel); then each shape times the library call (torch.mm; torch._scaled_mm for fp8) and each
of its candidates as above, and evtc's default kernel as a user's call runs it (its configuration
and visiting order there; the result's default_ms, default_over_best and default_over_cublas)
(default 3 rounds x 10 calls; each
candidate's first call checked against the float64 reference; a candidate that fails to
compile, to run fused or to match is skipped with its error). Writes the whole sweep to
<out>/<stamp>-<gpu>-gemm-sweep.json and the selection table to --table-out:

    {"format": 1, "gpu": ..., "gpu_class": "h100" | "h200", "dtype": "bf16" | "f8e4m3", "epilogue": ...,
     "measured": UTC ISO date, "command": ..., "entries": [{"m", "n", "k", "config", "ms", "cublas_ms",
     "runner_up", "runner_up_ms"[, "unswapped_config", "unswapped_ms"]}, ...]}   (entries sorted by m, n, k;
     a transposed (swap-AB, "_swap") winner also names the fastest untransposed candidate, which
     epilogues without a transposed kernel take)

--refine OLD_SWEEP.json [...] (after the candidate space grew): times only the candidates the
earlier sweeps did not try, plus their --refine-top (3) fastest there, again in the same run
(--retime REGEX: candidates whose name matches count as not tried, after their kernels changed;
--table-base TABLE.json: the table written is TABLE.json with the timed shapes' entries replaced,
a transposed winner keeping the old untransposed fallback unless this sweep timed a faster one);
--table-from OLD.json NEW.json then merges (later files replace a shape's result).
--skip REGEX drops the listed candidates whose name matches before anything compiles (for
example the 128-row untransposed tiles at M <= 64, which half-fill their rows: a sweep of those M
then compiles what can win there, not the whole space).

--seed-from SWEEP.json [...] (a GPU class without a table of its own, with as many
multiprocessors as one that has one: the H200 after the H100): times only each shape's
--seed-top (4) fastest candidates there, plus the fastest untransposed one where a transposed
candidate is among them; the table is this GPU's, from these timings alone. With
--seed-neighbours N, a shape the sweeps did not measure (--off-grid) takes the candidates so
picked of the N measured shapes nearest in N and K at the measured M values below and above its
M: what a nearest-shape rule could choose there, timed at the shape itself.

Visiting orders (--orders-top N, default 2): after the candidates, each shape's N fastest are
timed again with every tile visiting order (CUTLASS's heuristic; along M and along N in strips of
1, 2, 4 and 8 tiles), interleaved with the library call in one more timing: the order is a run-time
argument of a compiled kernel, so nothing compiles again. The winner is the fastest configuration
with its fastest order, where that order beats CUTLASS's by at least 1 % (else CUTLASS's; noise
must not pick one), and its table entry names the order ("order", omitted for CUTLASS's); the
entry's times come from that timing. --orders-from TABLE.json times the orders of an existing
table's configuration and runner-up only (no listing, no other compiles) and writes the table
with the timed shapes' entries replaced; a transposed winner keeps the old entry's untransposed
fallback where none was timed.

--orders-agree SWEEP.json [...] --table-base TABLE.json --table-out FILE: one such sweep's least
of 18 timings runs low by chance (the GPU's power limit spreads a kernel's medians by several per
cent), so a pick it alone favours may be noise. Given two or more --orders-from sweeps of the
table, run apart (another GPU of the class, another day), this writes the table with an entry
changed only where one (configuration, order) pair beats the entry's own in every sweep by the
tuner's margin: the pair of the least geometric-mean ratio to torch.mm over the sweeps (ratios
compared within a run only), its times from the last sweep. It prints each change with its
ratios, and why each entry some sweep timed stays as it is.

--configs NAME[,NAME...] times the named configurations at every shape instead of the listed
candidates: for example a selection rule's old and new picks, at shapes where only one of them
is a candidate. Such a sweep needs neither --evtc nor --table-out (without --table-out it writes
only its results file), and may time any set and --layout: e.g. the residual set, whose [m,n]
operand the tables' D = acc does not have.

--dry-run prints the shapes (and, sweeping, the candidate-listing command) and exits without
importing torch or evtc.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import pathlib
import re
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Optional

from result_files import gpu_slug, result_base

M_GRID = (16, 32, 64, 128, 256, 1024, 4096, 8192, 16384)

# (model, layer, N, K): N x K is the nn.Linear weight; "merged" layers are the projections
# inference engines run as one GEMM.
LAYERS = (
    ("LLaMA-3 8B", "qkv merged", 6144, 4096),
    ("LLaMA-3 8B", "o", 4096, 4096),
    ("LLaMA-3 8B", "gate/up merged", 28672, 4096),
    ("LLaMA-3 8B", "down", 4096, 14336),
    ("LLaMA-3 70B", "qkv merged", 10240, 8192),
    ("LLaMA-3 70B", "down", 8192, 28672),
    ("Qwen2.5 7B", "qkv merged", 4608, 3584),
    ("Qwen2.5 7B", "gate/up merged", 37888, 3584),
    ("Qwen2.5 7B", "down", 3584, 18944),
    ("Gemma-2 9B", "qkv merged", 8192, 3584),
    ("Gemma-2 9B", "o", 3584, 4096),
    ("GPT-2 XL", "qkv merged", 4800, 1600),
    ("GPT-2 XL", "mlp up", 6400, 1600),
    ("BERT-large", "ffn down", 1024, 4096),
    ("DeepSeek-V3 dense", "gate/up merged", 36864, 7168),
    ("DeepSeek-V3 dense", "down", 7168, 18432),
    ("LLaMA-2 7B", "gate/up merged", 22016, 4096),
    ("LLaMA-2 7B", "down", 4096, 11008),
)

# (model, layer, M, N, K): neither M nor (N, K) is in the grid above.
OFF_GRID = (
    ("Phi-3 mini", "qkv merged", 48, 9216, 3072),
    ("Phi-3 mini", "down", 100, 3072, 8192),
    ("Phi-3 mini", "gate/up merged", 384, 16384, 3072),
    ("LLaMA-3.2 3B", "qkv merged", 80, 5120, 3072),
    ("Falcon 7B", "qkv merged", 24, 4672, 4544),
    ("Falcon 7B", "mlp up", 768, 18176, 4544),
    ("Qwen2.5 14B", "qkv merged", 200, 7168, 5120),
    ("Qwen2.5 14B", "gate/up merged", 640, 27648, 5120),
    ("Qwen2.5 14B", "down", 1500, 5120, 13824),
    ("Gemma-2 2B", "gate/up merged", 2000, 18432, 2304),
    ("Mistral-Nemo 12B", "down", 3000, 5120, 14336),
    ("Gemma-2 2B", "down", 5000, 2304, 9216),
    ("Mistral-Nemo 12B", "qkv merged", 6000, 6144, 5120),
    ("Mistral-Nemo 12B", "gate/up merged", 12000, 28672, 5120),
    # Added after the rule for shapes between the table's was drawn from the ones above, to
    # check it on shapes it was not drawn from.
    ("Mistral-Nemo 12B", "o", 12, 5120, 4096),
    ("Phi-3 mini", "o", 40, 3072, 3072),
    ("LLaMA-3.2 1B", "gate/up merged", 56, 16384, 2048),
    ("LLaMA-3.2 3B", "gate/up merged", 96, 16384, 3072),
    ("LLaMA-3.2 1B", "qkv merged", 160, 3072, 2048),
    ("Phi-3 medium", "gate/up merged", 300, 35840, 5120),
    ("Phi-3 medium", "down", 512, 5120, 17920),
    ("Gemma-2 2B", "qkv merged", 1200, 4096, 2304),
    ("Falcon 7B", "mlp down", 2500, 4544, 18176),
    ("Qwen2.5 32B", "qkv merged", 2560, 7168, 5120),
    ("Phi-3 medium", "qkv merged", 3500, 7680, 5120),
    ("Qwen2.5 14B", "o", 7000, 5120, 5120),
    ("Phi-3 mini", "gate/up merged", 10000, 16384, 3072),
    ("LLaMA-3.2 3B", "down", 20000, 3072, 8192),
)

PLAIN_EXPR = "out D: bf16 = acc"
ERROR_BOUND = 2e-2  # relative L2 error of a bf16 output against the float64 reference
ABOVE = 1.04  # the summary counts shapes where evtc takes longer than this times the reference
# The sets a selection table is measured with (D = the accumulator, scaled row- and column-wise
# for fp8; plus an [m,n] operand for the residual table, SetSpec.table_kind).
SWEEP_SETS = ("plain", "fp8", "residual")
# The library call's key among a sweep's timed variants.
REFERENCE = "reference"
# The sweep's name for evtc's default kernel, timed at each shape beside the candidates (with the
# configuration and visiting order it picks there): what a user's call runs.
DEFAULT_VARIANT = "(default)"
CONFIG_NAME = re.compile(r"^(coop|pingpong|ms)_\S+$")
# Operand layouts (--layout): A's and B's, "r" row-major or "c" column-major. rc is nn.Linear's
# forward (B = w.t()), rr a backward pass's data gradient (dY @ W: B is the K x N weight itself,
# row-major), cr its weight gradient (dY.t() @ X: A column-major). The selection tables are
# measured with rc.
LAYOUTS = {"rc": ("row", "col"), "rr": ("row", "row"), "cr": ("col", "row")}
TORCH_DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32",
                "f8e4m3": "float8_e4m3fn", "f8e5m2": "float8_e5m2"}


@dataclass(frozen=True)
class SetSpec:
    name: str
    expr: str
    reference: str
    fp8: bool = False
    gated: bool = False  # output M x N/2; only merged gate/up layers
    # The "kind" of the table this set measures, where not D = acc (fp8: its scales): the
    # epilogue class the library matches it to (selection::table_choice).
    table_kind: Optional[str] = None

    def compile_options(self, layout: str = "rc") -> dict:
        # Undeclared operands default to bf16 in the Python API; the scales are f32.
        a_layout, b_layout = LAYOUTS[layout]
        options = {"a_layout": a_layout, "b_layout": b_layout}
        if self.fp8:
            options.update({"a_dtype": "f8e4m3", "b_dtype": "f8e4m3", "operand_dtype": "f32"})
        return options

    @property
    def dtype(self) -> str:
        """A and B's dtype: the selection table's key."""
        return "f8e4m3" if self.fp8 else "bf16"

    def cli_arguments(self, layout: str = "rc") -> list[str]:
        """The expression, dtype and layout options of `evtc tune` for this set (the CLI's
        undeclared operands take the A/B dtype, so the fp8 set's f32 scales are declared)."""
        layouts = ["--layout-a", layout[0], "--layout-b", layout[1]]
        if not self.fp8:
            return [self.expr, *layouts]
        return ["input sa[m]: f32\ninput sb[n]: f32\n" + self.expr, "--dtype", "f8e4m3", *layouts]


SETS = {s.name: s for s in (
    SetSpec("plain", PLAIN_EXPR, "torch.mm(a, w.t())"),
    SetSpec("silu", "out D: bf16 = silu(acc + bias[n])", "torch.mm(a, w.t()) (the plain GEMM, same N)"),
    SetSpec("swiglu", "out D: bf16 = swiglu(acc)", "torch.mm(a, w.t()) (the plain GEMM, same N)", gated=True),
    SetSpec("residual", "input r[m,n]: bf16\nout D: bf16 = acc + r",
            "torch.mm(a, w.t()) (the plain GEMM, same N)", table_kind="residual"),
    SetSpec("residual_c", "out D: bf16 = acc + C", "torch.mm(a, w.t()) (the plain GEMM, same N)"),
    SetSpec("fp8", "out D: bf16 = acc * sa[m] * sb[n]",
            "torch._scaled_mm(a, w.t(), scale_a=sa.view(-1, 1), scale_b=sb.view(1, -1), out_dtype=torch.bfloat16)",
            fp8=True),
)}


@dataclass(frozen=True)
class Shape:
    model: str
    layer: str
    m: int
    n: int
    k: int

    @property
    def label(self) -> str:
        return f"{self.model} {self.layer}".strip()

    @property
    def mnk(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def command_line() -> str:
    """This run's command, with paths inside the working directory made relative to it: the
    command is recorded in selection tables, which the library embeds, and an installed library
    must not name the tree it was built from (the install check)."""
    here = os.getcwd()

    def relative(arg: str) -> str:
        return os.path.relpath(arg, here) if os.path.isabs(arg) and arg.startswith(here + os.sep) else arg
    return "python3 bench/gemm_shapes.py " + shlex.join(relative(a) for a in sys.argv[1:])


# --- shapes -----------------------------------------------------------------------------------

def is_gate_up(layer: str) -> bool:
    return layer.startswith("gate/up")


def grid_shapes(spec: SetSpec, m_values) -> list[Shape]:
    layers = [l for l in LAYERS if is_gate_up(l[1]) or not spec.gated]
    return [Shape(model, layer, m, n, k) for m in m_values for model, layer, n, k in layers]


def off_grid_shapes(spec: SetSpec) -> list[Shape]:
    return [Shape(*s) for s in OFF_GRID if is_gate_up(s[1]) or not spec.gated]


def custom_shapes(spec: SetSpec, mnks: list[tuple[int, int, int]]) -> list[Shape]:
    if spec.gated and (odd := [f"{m}x{n}x{k}" for m, n, k in mnks if n % 2]):
        print(f"warning: {spec.name}: skipping {', '.join(odd)} (a gated output needs an even N)", file=sys.stderr)
    return [Shape("custom", "", m, n, k) for m, n, k in mnks if not (spec.gated and n % 2)]


def spread(shapes: list[Shape], most: Optional[int]) -> list[Shape]:
    """At most `most` shapes, evenly spaced over the list (so over M and over the layers)."""
    if most is None or len(shapes) <= most:
        return shapes
    if most <= 1:
        return shapes[:max(most, 0)]
    return [shapes[round(i * (len(shapes) - 1) / (most - 1))] for i in range(most)]


def unique(shapes: list[Shape]) -> list[Shape]:
    seen, kept = set(), []
    for s in shapes:
        if (s.m, s.n, s.k) not in seen:
            seen.add((s.m, s.n, s.k))
            kept.append(s)
    return kept


def plan_shapes(args, spec: SetSpec) -> list[Shape]:
    if args.shapes:
        shapes = custom_shapes(spec, args.shapes)
    elif args.off_grid:
        shapes = off_grid_shapes(spec)
    else:
        shapes = grid_shapes(spec, args.m or M_GRID)
    return spread(unique(shapes), args.max_shapes)


def weight_copies(weight_bytes: int, rotate_bytes: int, most: int = 64) -> int:
    """How many copies of a weight matrix together exceed `rotate_bytes`, between 1 and `most`."""
    return max(1, min(most, rotate_bytes // max(weight_bytes, 1) + 1))


def weight_bytes(spec: SetSpec, shape: Shape) -> int:
    return shape.n * shape.k * (1 if spec.fp8 else 2)


def tflops(shape: Shape, ms: Optional[float]) -> Optional[float]:
    return 2 * shape.m * shape.n * shape.k / (ms * 1e9) if ms else None


# --- problems and references (torch) ----------------------------------------------------------

class Rotation:
    """The weight copies, handed out in turn. One rotation serves every variant of a shape, so
    a variant's first call follows another's last on a copy not read for a whole cycle."""

    def __init__(self, weights: list):
        self.weights = weights
        self.i = 0

    def next(self):
        w = self.weights[self.i % len(self.weights)]
        self.i += 1
        return w


@dataclass
class Problem:
    a: object  # M x K, in the run's layout
    weights: list  # B of each copy (K x N): w.t() of an N x K weight (layout rc), or a K x N one
    operands: dict = field(default_factory=dict)

    @property
    def b(self):
        return self.weights[0]


def make_problem(spec: SetSpec, shape: Shape, rotate_bytes: int, seed: int, layout: str = "rc") -> Problem:
    import torch

    torch.manual_seed(seed)
    m, n, k = shape.m, shape.n, shape.k
    dev = "cuda"
    a_col_major, b_col_major = LAYOUTS[layout][0] == "col", LAYOUTS[layout][1] == "col"
    if spec.fp8:
        a = (torch.randn(m, k, device=dev) * 0.5).to(torch.float8_e4m3fn)
        w = (torch.randn(n, k, device=dev) * 0.5).to(torch.float8_e4m3fn)
        operands = {"sa": torch.randn(m, device=dev).abs() + 0.5, "sb": torch.randn(n, device=dev).abs() + 0.5}
    else:
        # Entries of a @ b of about unit size, whatever K.
        a = torch.randn(k, m, device=dev, dtype=torch.bfloat16).t() if a_col_major else \
            torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = (torch.randn(*((n, k) if b_col_major else (k, n)), device=dev) * k ** -0.5).to(torch.bfloat16)
        operands = {}
        if spec.name == "silu":
            operands["bias"] = torch.randn(n, device=dev, dtype=torch.bfloat16)
        if spec.name == "residual":
            operands["r"] = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        if spec.name == "residual_c":
            operands["C"] = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
    copies = weight_copies(weight_bytes(spec, shape), rotate_bytes)
    weights = [w] + [w.clone() for _ in range(copies - 1)]
    return Problem(a, [x.t() if b_col_major else x for x in weights], operands)


def epilogue64(spec: SetSpec, acc, operands: dict, rows: slice):
    import torch

    if spec.name == "silu":
        x = acc + operands["bias"].double()
        return x * torch.sigmoid(x)
    if spec.name == "swiglu":
        # evtc's gated layout: column 2j is gate feature j, column 2j+1 up feature j.
        g, u = acc[:, 0::2], acc[:, 1::2]
        return g * torch.sigmoid(g) * u
    if spec.name == "residual":
        return acc + operands["r"][rows].double()
    if spec.name == "residual_c":
        return acc + operands["C"][rows].double()
    if spec.fp8:
        return acc * operands["sa"][rows].double()[:, None] * operands["sb"].double()[None, :]
    return acc


def row_chunk(cols: int, budget_bytes: int = 1 << 28) -> int:
    """Rows per chunk so that a float64 chunk of `cols` columns stays within the budget."""
    return max(1, budget_bytes // (8 * max(cols, 1)))


def reference_output(spec: SetSpec, problem: Problem):
    """The epilogue of A @ B computed in float64 on the GPU, row chunk by row chunk, kept as
    float32 (its rounding, about 6e-8 relative, is far below the bound checked against)."""
    import torch

    a, b64 = problem.a, problem.b.double()
    m, n = a.shape[0], b64.shape[1]
    ref = torch.empty(m, n // 2 if spec.gated else n, dtype=torch.float32, device=a.device)
    step = row_chunk(n)
    for r0 in range(0, m, step):
        rows = slice(r0, min(m, r0 + step))
        ref[rows] = epilogue64(spec, a[rows].double() @ b64, problem.operands, rows)
    return ref


def relative_error(y, ref) -> tuple[float, Optional[str]]:
    """Relative L2 error of `y` against `ref` (in float64) and why it fails, if it does."""
    import torch

    if not bool(torch.isfinite(y).all()):
        return math.nan, "NaN or infinity in the output"
    num = den = 0.0
    step = row_chunk(y.shape[1])
    for r0 in range(0, y.shape[0], step):
        yy, rr = y[r0:r0 + step].double(), ref[r0:r0 + step].double()
        num += float((yy - rr).square().sum())
        den += float(rr.square().sum())
    err = math.sqrt(num / den)
    return err, None if err <= ERROR_BOUND else f"rel-L2 error {err:.2e} above {ERROR_BOUND}"


def nan_outputs(kernel, m: int, n: int) -> dict:
    """Every output of the kernel, preallocated and filled with NaN, so a part the kernel does
    not write shows in the check."""
    import torch

    return {o.name: torch.full(o.size(m, n), math.nan, dtype=getattr(torch, TORCH_DTYPES[o.dtype]), device="cuda")
            for o in kernel.outputs}


def refill_nan(outputs: dict) -> None:
    for t in outputs.values():
        t.fill_(math.nan)


def main_output(result, name: str):
    # A kernel returns its one output, or a dict of outputs by name when there are several.
    return result[name] if isinstance(result, dict) else result


def evtc_caller(kernel, problem: Problem, outputs: dict) -> Callable:
    a, operands = problem.a, problem.operands

    def call(b):
        return kernel(a, b, out=outputs, **operands)
    return call


def reference_caller(spec: SetSpec, problem: Problem) -> Callable:
    import torch

    a = problem.a
    if spec.fp8:
        sa, sb = problem.operands["sa"].view(-1, 1), problem.operands["sb"].view(1, -1)
        return lambda b: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    return lambda b: torch.mm(a, b)


def rotating(call: Callable, rotation: Rotation) -> Callable:
    return lambda: call(rotation.next())


# --- timing -----------------------------------------------------------------------------------

class Timer:
    """CUDA-event timings of calls, one pair of events around each call.

    With a backlog, each batch of calls is queued behind a GPU sleep long enough for the host
    to enqueue the whole batch before the GPU reaches it: the events then time the kernels
    back to back, not the launch cost of Python code. A batch whose sleep ran out before the
    host finished is timed again with a longer sleep."""

    def __init__(self, backlog: bool, alternate: bool = False):
        import torch

        self.torch = torch
        self.alternate = alternate
        self.backlog = backlog and hasattr(torch.cuda, "_sleep")
        if backlog and not self.backlog:
            print("warning: torch.cuda._sleep is missing: timing without a backlog", file=sys.stderr)
        self.host_ms_per_call = 0.1
        self.starved = 0
        self.cycles_per_ms = self._sleep_rate() if self.backlog else 0.0

    def _sleep_rate(self) -> float:
        torch = self.torch
        torch.cuda._sleep(1000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 20_000_000
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        torch.cuda.synchronize()
        return cycles / start.elapsed_time(end)

    def times(self, call: Callable, count: int) -> list[float]:
        """`count` calls' times in ms, in one batch."""
        return self.alternating({"call": call}, count)["call"]

    def _turns(self, calls: dict[str, Callable], count: int) -> tuple[dict[str, list[float]], bool]:
        """One batch: `count` turns, each calling every one of `calls` once in order, with a pair
        of events around each call; the times by call, and whether the host fell behind."""
        torch = self.torch
        pairs = {name: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                        for _ in range(count)] for name in calls}
        ready = None
        if self.backlog:
            torch.cuda._sleep(int(self.cycles_per_ms * self.host_ms_per_call * count * len(calls)) + 1)
            ready = torch.cuda.Event()
            ready.record()
        for i in range(count):
            for name, call in calls.items():
                start, end = pairs[name][i]
                start.record()
                call()
                end.record()
        # The sleep over before the last call was queued: the GPU may have waited for the host.
        starved = ready is not None and ready.query()
        torch.cuda.synchronize()
        return {name: [start.elapsed_time(end) for start, end in p] for name, p in pairs.items()}, starved

    def alternating(self, calls: dict[str, Callable], count: int) -> dict[str, list[float]]:
        """`count` calls of each of `calls` in turn, in one batch, their times in ms by call. A
        batch the host could not keep ahead of is timed again (at most twice) with a longer
        backlog; `starved` counts batches kept all the same."""
        for _ in range(3):
            result, starved = self._turns(calls, count)
            if not starved:
                return result
            self.host_ms_per_call = min(2 * self.host_ms_per_call, 2.0)
        self.starved += 1
        return result

    def warm_up(self, variants: dict[str, Callable], ms: float) -> None:
        """Calls every variant in turn for about `ms` milliseconds (at least 4 times each), so
        that the clocks have ramped up and every lazy initialisation is done."""
        start, turns = time.perf_counter(), 0
        while True:
            for call in variants.values():
                call()
            turns += 1
            if turns % 4 == 0:  # the host runs ahead in between; the clock is read once the GPU is done
                self.torch.cuda.synchronize()
                if (time.perf_counter() - start) * 1e3 >= ms:
                    return

    def interleaved(self, variants: dict[str, Callable], rounds: int, count: int):
        """Median ms per call of each variant over all rounds, each round's medians, and the
        errors of variants that raised (dropped from later rounds). Each round times `count`
        calls of every variant back to back; the order of the variants rotates each round.
        Alternating (--alternate), a round is one batch that calls the variants in turn, so that
        every variant runs at the clock and power state of the others; a round in which a call
        raises is timed again variant by variant, which finds the one that fails."""
        names, samples, per_round, errors = list(variants), {v: [] for v in variants}, [], {}
        for r in range(rounds):
            medians = {}
            order = [v for v in names[r % len(names):] + names[:r % len(names)] if v not in errors]
            if self.alternate and len(order) > 1:
                try:
                    times = self.alternating({v: variants[v] for v in order}, count)
                except Exception:  # the variant that raises is found below, one at a time
                    times = None
                if times is not None:
                    for v, t in times.items():
                        samples[v] += t
                        medians[v] = statistics.median(t)
                    per_round.append(medians)
                    continue
            for v in order:
                try:
                    t = self.times(variants[v], count)
                except Exception as e:  # recorded; the other variants go on
                    errors[v] = f"{type(e).__name__}: {str(e)[:500]}"
                    continue
                samples[v] += t
                medians[v] = statistics.median(t)
            per_round.append(medians)
        medians = {v: statistics.median(s) for v, s in samples.items() if s and v not in errors}
        return medians, per_round, errors


# --- compiling --------------------------------------------------------------------------------

def wait_with_progress(jobs: list[tuple[str, concurrent.futures.Future]], what: str) -> dict[str, str]:
    """Waits for every compile, printing each as it ends and a heartbeat every 30 s; returns
    the errors by job label."""
    pending = {future: label for label, future in jobs}
    errors, done, start = {}, 0, time.perf_counter()
    log(f"{what}: compiling {len(jobs)} kernel(s) in parallel")
    while pending:
        finished, _ = concurrent.futures.wait(pending, timeout=30, return_when=concurrent.futures.FIRST_COMPLETED)
        if not finished:
            log(f"{what}: {done}/{len(jobs)} compiled after {time.perf_counter() - start:.0f} s")
        for future in finished:
            label = pending.pop(future)
            done += 1
            if (e := future.exception()) is not None:
                errors[label] = f"{type(e).__name__}: {e}"
                log(f"{what}: {done}/{len(jobs)} FAILED {label}: {str(e)[:300]}")
            else:
                log(f"{what}: {done}/{len(jobs)} {label} ({time.perf_counter() - start:.0f} s)")
    return errors


def default_compile_jobs(set_name: str, kernel, shapes: list[Shape]) -> list[tuple[str, concurrent.futures.Future]]:
    """One compile per distinct configuration the shapes run with (a fused kernel depends on
    its configuration, not on the problem size), and the unfused path's epilogue where a shape
    cannot be fused."""
    jobs, seen, unfused = [], set(), False
    for s in shapes:
        if kernel.fallback_reason(s.m, s.n, s.k):
            unfused = True
            continue
        config = kernel.config_for(s.m, s.n, s.k)
        if config not in seen:
            seen.add(config)
            jobs.append((f"{set_name} {config}", kernel.compile_async(s.m, s.n, s.k)))
    if unfused:
        jobs.append((f"{set_name} unfused epilogue", kernel.compile_fallback_async()))
    return jobs


# --- compare mode -----------------------------------------------------------------------------

def new_row(spec: SetSpec, shape: Shape) -> dict:
    return {"set": spec.name, "label": shape.label, "model": shape.model, "layer": shape.layer,
            "m": shape.m, "n": shape.n, "k": shape.k, "failed": False}


def describe_kernel(kernel, shape: Shape, row: dict) -> None:
    row["config"] = kernel.config_for(shape.m, shape.n, shape.k)
    if hasattr(kernel, "config_source"):
        row["config_source"] = kernel.config_source(shape.m, shape.n, shape.k)
    if hasattr(kernel, "visit_order_for"):
        row["visit_order"] = kernel.visit_order_for(shape.m, shape.n, shape.k)
    if reason := kernel.fallback_reason(shape.m, shape.n, shape.k):
        row["fallback_reason"] = reason
    predicted_ms(kernel, shape, row)


def predicted_ms(kernel, shape: Shape, row: dict) -> None:
    """The cost model's price of the fused kernel (and of cuBLAS's GEMM), to set beside the
    measured times: the model decides which fusions are made."""
    import evtc

    native = getattr(kernel, "_native", None)
    if native is None or not hasattr(native, "estimate"):
        return
    e = native.estimate(shape.m, shape.n, shape.k, evtc._evtc.UnfusedWork())
    row["predicted_ms"], row["predicted_cublas_ms"] = e.fused_us / 1e3, e.cublas_us / 1e3
    row["predicted_basis"] = e.basis
    # The FX pass's decision for this GEMM alone (passes/profitability.py): evtc's kernel replaces
    # cuBLAS's where the estimate rests on a measurement that holds here and clears the margin.
    row["predicted_measured"] = e.measured
    row["replaces_cublas"] = row["predicted_measured"] and e.profitable


def check_first_call(spec: SetSpec, kernel, problem: Problem, outputs: dict, row: dict) -> None:
    y = main_output(evtc_caller(kernel, problem, outputs)(problem.b), kernel.outputs[0].name)
    row["first_path"] = kernel.last_path
    row["rel_err"], failure = relative_error(y, reference_output(spec, problem))
    if failure:
        row["failed"], row["failure"] = True, failure


def time_row(spec: SetSpec, kernel, shape: Shape, problem: Problem, outputs: dict, row: dict, args,
             timer: Timer) -> None:
    rotation = Rotation(problem.weights)
    variants = {"evtc": rotating(evtc_caller(kernel, problem, outputs), rotation),
                "ref": rotating(reference_caller(spec, problem), rotation)}
    starved = timer.starved
    timer.warm_up(variants, args.warmup_ms)
    medians, per_round, errors = timer.interleaved(variants, args.rounds, args.calls)
    row["last_path"] = kernel.last_path
    row["starved_batches"] = timer.starved - starved
    if errors:
        row["failed"], row["failure"] = True, "; ".join(f"{v}: {e}" for v, e in errors.items())
        return
    row["evtc_ms"], row["ref_ms"] = medians["evtc"], medians["ref"]
    row["ratio"] = row["evtc_ms"] / row["ref_ms"]
    row["ratio_rounds"] = [r["evtc"] / r["ref"] for r in per_round]
    row["evtc_tflops"], row["ref_tflops"] = tflops(shape, row["evtc_ms"]), tflops(shape, row["ref_ms"])
    if row.get("predicted_ms"):
        row["predicted_over_measured"] = row["predicted_ms"] / row["evtc_ms"]


def measure_row(spec: SetSpec, kernel, shape: Shape, args, timer: Timer) -> dict:
    import torch

    row = new_row(spec, shape)
    problem = outputs = None
    try:
        describe_kernel(kernel, shape, row)
        problem = make_problem(spec, shape, args.rotate_mb << 20, args.seed, args.layout)
        row["weight_copies"] = len(problem.weights)
        outputs = nan_outputs(kernel, shape.m, shape.n)
        check_first_call(spec, kernel, problem, outputs, row)
        time_row(spec, kernel, shape, problem, outputs, row, args, timer)
    except Exception as e:  # the row records it; the other shapes go on
        row["failed"], row["failure"] = True, f"{type(e).__name__}: {str(e)[:2000]}"
    del problem, outputs
    torch.cuda.empty_cache()
    return row


def row_line(row: dict) -> str:
    head = f"{row['set']} {row['label']} {row['m']}x{row['n']}x{row['k']}:"
    if row.get("ratio") is None:
        return f"{head} FAILED: {row.get('failure')}"
    text = (f"{head} evtc {row['evtc_ms']:.4f} ms, ref {row['ref_ms']:.4f} ms, {row['ratio']:.3f}x, "
            f"{row['config']} ({row.get('last_path')}), rel-L2 {fmt(row.get('rel_err'), '.1e')}")
    return text + (f" FAILED: {row['failure']}" if row.get("failed") else "")


def merge_passes(rows: list[dict]) -> dict:
    """One shape's rows from several passes over the shape list (--passes) as one: the first
    pass's row, with the median over the passes of evtc's time, the reference's and their ratio
    (each pass's ratio kept in `pass_ratios`). The row fails if any pass failed."""
    if len(rows) == 1:
        return rows[0]
    merged = dict(rows[0])
    merged["passes"] = len(rows)
    merged["pass_ratios"] = [r.get("ratio") for r in rows]
    failures = [f"pass {i}: {r.get('failure') or 'not timed'}" for i, r in enumerate(rows, 1)
                if r.get("failed") or r.get("ratio") is None]
    if failures:
        merged["failed"], merged["failure"] = True, "; ".join(failures)
        return merged
    for key in ("evtc_ms", "ref_ms", "ratio"):
        merged[key] = statistics.median(r[key] for r in rows)
    merged["ratio_rounds"] = [x for r in rows for x in r.get("ratio_rounds", [])]
    merged["rel_err"] = max(r["rel_err"] for r in rows if r.get("rel_err") is not None) \
        if any(r.get("rel_err") is not None for r in rows) else None
    merged["starved_batches"] = sum(r.get("starved_batches", 0) for r in rows)
    shape = Shape(merged["model"], merged["layer"], merged["m"], merged["n"], merged["k"])
    merged["evtc_tflops"], merged["ref_tflops"] = tflops(shape, merged["evtc_ms"]), tflops(shape, merged["ref_ms"])
    if merged.get("predicted_ms"):
        merged["predicted_over_measured"] = merged["predicted_ms"] / merged["evtc_ms"]
    return merged


def run_compare(args, plan: dict[str, list[Shape]]) -> int:
    import torch
    import evtc

    if not os.environ.get("EVTC_LOG"):
        evtc.set_log_level("warning")  # this script prints its own progress
    kernels, set_errors, jobs = {}, {}, []
    for name, shapes in plan.items():
        try:
            kernels[name] = evtc.compile(SETS[name].expr, **SETS[name].compile_options(args.layout))
            jobs += default_compile_jobs(name, kernels[name], shapes)
        except Exception as e:  # every row of the set fails with it; the other sets go on
            set_errors[name] = f"{type(e).__name__}: {str(e)[:2000]}"
            log(f"{name}: {set_errors[name]}")
    compile_errors = wait_with_progress(jobs, "default kernels")
    if args.compile_only:
        for job, error in sorted(compile_errors.items()):
            print(f"{job}: {error}", file=sys.stderr)
        print(f"compiled {len(jobs) - len(compile_errors)} of {len(jobs)} kernel(s) into evtc's cache"
              + (f"; {len(set_errors)} set(s) failed" if set_errors else ""), flush=True)
        return 1 if compile_errors or set_errors else 0
    data = run_metadata(torch, evtc, args, "compare")
    data.update({"sets": {name: {"expr": SETS[name].expr, "reference": SETS[name].reference} for name in plan},
                 "error_bound": ERROR_BOUND, "compile_errors": compile_errors, "rows": []})
    base = result_base(args.out, data["gpu"], "gemm-shapes")
    timer = Timer(not args.no_backlog, args.alternate)
    order = [(name, shape) for name, shapes in plan.items() for shape in shapes]
    total, done = len(order) * args.passes, 0
    by_shape: dict[tuple[str, Shape], list[dict]] = {}
    # --passes N: the whole list N times over, so that one shape's passes lie minutes apart.
    for p in range(1, args.passes + 1):
        for name, shape in order:
            if name in set_errors:
                row = {**new_row(SETS[name], shape), "failed": True, "failure": set_errors[name]}
            else:
                row = measure_row(SETS[name], kernels[name], shape, args, timer)
            by_shape.setdefault((name, shape), []).append(row)
            data["rows"] = [merge_passes(by_shape[key]) for key in order if key in by_shape]
            write_json(data, base + ".json")  # after every row: a run stopped early keeps its rows
            done += 1
            log(f"{done}/{total} {f'pass {p}/{args.passes} ' if args.passes > 1 else ''}{row_line(row)}")
    data["summary"] = summarize(data["rows"])
    data["starved_batches"] = timer.starved
    write_json(data, base + ".json")
    write_plot(data, base + ".png")
    print(markdown_table(data))
    print()
    print("\n".join(summary_lines(data["summary"])))
    print(f"wrote {base}.json", flush=True)
    return 1 if any(r.get("failed") for r in data["rows"]) else 0


# --- sweep mode -------------------------------------------------------------------------------

def candidate_command(evtc_cli: str, shape: Shape, spec: SetSpec, layout: str = "rc") -> list[str]:
    # A and B in the layouts the timed calls pass them in (rc: B = w.t(), column-major).
    return [evtc_cli, "tune", *spec.cli_arguments(layout), "-s", shape.mnk, "--max-candidates", "0",
            "--list-candidates"]


def parse_candidates(text: str) -> list[str]:
    """Configuration names in the listing's output, in order, once each."""
    names = []
    for token in text.split():
        if CONFIG_NAME.match(token) and token not in names:
            names.append(token)
    return names


def list_candidates(evtc_cli: str, shape: Shape, spec: SetSpec, layout: str) -> list[str]:
    cmd = candidate_command(evtc_cli, shape, spec, layout)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, EVTC_LOG="warning"))
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited with {proc.returncode}: {(proc.stderr or proc.stdout)[-800:]}")
    names = parse_candidates(proc.stdout)
    if not names:
        raise RuntimeError(f"{shlex.join(cmd)} listed no configuration: {proc.stdout[-800:]}")
    return names


def all_candidates(evtc_cli: str, shapes: list[Shape], spec: SetSpec,
                   layout: str) -> tuple[dict[Shape, list[str]], dict[Shape, str]]:
    """Every shape's candidates (the listings run in parallel: they compile nothing) and the
    errors of shapes whose listing failed."""
    found, errors = {}, {}
    with concurrent.futures.ThreadPoolExecutor(min(16, os.cpu_count() or 4)) as pool:
        futures = {pool.submit(list_candidates, evtc_cli, s, spec, layout): s for s in shapes}
        for future in concurrent.futures.as_completed(futures):
            shape = futures[future]
            try:
                found[shape] = future.result()
            except Exception as e:
                errors[shape] = str(e)
                log(f"candidates of {shape.mnk}: {e}")
    log(f"listed candidates of {len(found)}/{len(shapes)} shapes")
    return found, errors


def read_sweeps(paths: list[str]) -> list[dict]:
    """Sweep results files, each checked to be one."""
    sweeps = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        if data.get("mode") != "sweep":
            sys.exit(f"{path} is not a sweep results file (mode {data.get('mode')!r})")
        sweeps.append(data)
    return sweeps


def shape_results(sweeps: list[dict]) -> dict[tuple[int, int, int], dict]:
    """Each shape's result by (m, n, k); of sweeps that measured a shape twice, the later one."""
    return {(r["m"], r["n"], r["k"]): r for data in sweeps for r in data["shapes"]}


def skip_candidates(candidates: dict[Shape, list[str]], skip: re.Pattern) -> dict[Shape, list[str]]:
    """--skip: the listed candidates whose name `skip` does not match."""
    out = {shape: [n for n in names if not skip.search(n)] for shape, names in candidates.items()}
    log(f"--skip {skip.pattern}: {sum(map(len, out.values()))} of {sum(map(len, candidates.values()))} "
        f"listed candidates kept")
    return out


def refine_candidates(candidates: dict[Shape, list[str]], paths: list[str], top: int,
                      retime: Optional[re.Pattern] = None) -> dict[Shape, list[str]]:
    """After the candidate space grew: of each shape's candidates, those the earlier sweeps at
    `paths` did not try, and the `top` fastest the latest of them to time the shape measured
    (timed again, in the same run, so the new ones are compared with the old winners on equal
    terms). Candidates whose name `retime` matches count as not tried (their kernels changed
    since)."""
    sweeps = read_sweeps(paths)
    before = shape_results(sweeps)
    # What any of the sweeps tried (a refining sweep records only what it timed again).
    tried_anywhere: dict[tuple[int, int, int], set[str]] = {}
    for data in sweeps:
        for r in data["shapes"]:
            tried_anywhere.setdefault((r["m"], r["n"], r["k"]), set()).update(r.get("candidates", {}),
                                                                              r.get("errors", {}))
    out = {}
    for shape, names in candidates.items():
        r = before.get((shape.m, shape.n, shape.k))
        if r is None:
            out[shape] = names
            continue
        tried = tried_anywhere[(shape.m, shape.n, shape.k)]
        if retime is not None:
            tried = {name for name in tried if not retime.search(name)}
        fastest = [name for name, _ in rank(r.get("candidates", {}))[:top]]
        out[shape] = [n for n in names if n not in tried] + [n for n in fastest if n in names]
    log(f"refining {', '.join(paths)}: {sum(map(len, out.values()))} of "
        f"{sum(map(len, candidates.values()))} candidates")
    return out


def neighbour_results(before: dict[tuple[int, int, int], dict], shape: Shape, count: int) -> list[dict]:
    """The measured shapes around an unmeasured one: of the measured M values nearest below and
    above its M (one where it lies outside them), the `count` shapes of each nearest in N and K
    (log scale), nearest first."""
    measured = sorted({m for (m, _, _), r in before.items() if r.get("candidates")})
    below = [m for m in measured if m <= shape.m][-1:]
    above = [m for m in measured if m >= shape.m][:1]
    out = []
    for m in dict.fromkeys(below + above):
        same_m = [r for (rm, _, _), r in before.items() if rm == m and r.get("candidates")]
        same_m.sort(key=lambda r: abs(math.log2(r["n"] / shape.n)) + abs(math.log2(r["k"] / shape.k)))
        out += same_m[:count]
    return out


def seeded_candidates(candidates: dict[Shape, list[str]], paths: list[str], top: int,
                      neighbours: int = 0) -> dict[Shape, list[str]]:
    """For a GPU of another class with the same multiprocessors (an H200 after an H100): of each
    shape's candidates, only the `top` fastest that the sweeps at `paths` measured (a shape's
    result from the latest sweep that timed it), and, where a transposed one is among them, the
    fastest untransposed one too (the fallback of gated epilogues). Candidates the listing no
    longer offers are dropped. A shape the sweeps did not measure keeps all of its candidates,
    or with `neighbours` > 0 takes those of its neighbours (neighbour_results) this way: what a
    nearest-shape rule could pick there, timed at the shape itself."""
    before = shape_results(read_sweeps(paths))
    out = {}
    for shape, names in candidates.items():
        r = before.get((shape.m, shape.n, shape.k))
        if r is not None and r.get("candidates"):
            sources = [r]
        elif neighbours > 0:
            sources = neighbour_results(before, shape, neighbours)
        else:
            out[shape] = names
            continue
        offered = set(names)
        chosen = []
        for source in sources:
            ranked = [name for name, _ in rank(source["candidates"]) if name in offered]
            picked = ranked[:top]
            if any("_swap" in name for name in picked):
                picked += [name for name in ranked if "_swap" not in name and name not in picked][:1]
            chosen += [name for name in picked if name not in chosen]
        out[shape] = chosen
    log(f"seeded from {', '.join(paths)}: {sum(map(len, out.values()))} of "
        f"{sum(map(len, candidates.values()))} candidates, {len({n for v in out.values() for n in v})} kernels")
    return out


def compile_candidates(evtc, candidates: dict[Shape, list[str]], spec: SetSpec,
                       layout: str) -> tuple[dict, dict[str, str]]:
    """One kernel per distinct candidate, compiled once, all in parallel; the kernels and the
    errors (of building or compiling) by configuration name."""
    kernels, errors, jobs = {}, {}, []
    for shape, names in candidates.items():
        for name in names:
            if name in kernels or name in errors:
                continue
            try:
                kernels[name] = evtc.compile(spec.expr, config=name, **spec.compile_options(layout))
                jobs.append((name, kernels[name].compile_async(shape.m, shape.n, shape.k)))
            except Exception as e:
                errors[name] = f"{type(e).__name__}: {e}"
    errors.update(wait_with_progress(jobs, "candidates"))
    return kernels, errors


def try_candidate(kernel, problem: Problem, outputs: dict, ref) -> Optional[str]:
    """Why the candidate cannot be timed (its first call raised, ran unfused, or does not match
    the reference), or None."""
    refill_nan(outputs)
    try:
        y = main_output(evtc_caller(kernel, problem, outputs)(problem.b), kernel.outputs[0].name)
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:500]}"
    if kernel.last_path != "fused":
        return f"ran {kernel.last_path}"
    _, failure = relative_error(y, ref)
    return failure


def rank(times: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(times.items(), key=lambda item: item[1])


def sweep_result(shape: Shape, default_config: str, medians: dict[str, float], errors: dict[str, str],
                 default_order: Optional[str] = None) -> dict:
    cublas = medians.pop(REFERENCE, None)
    default_ms = medians.pop(DEFAULT_VARIANT, None)
    ranked = rank(medians)
    r = {"m": shape.m, "n": shape.n, "k": shape.k, "label": shape.label, "cublas_ms": cublas,
         "default_config": default_config, "candidates": dict(ranked), "errors": errors}
    if default_order is not None:
        r["default_order"] = default_order
    if ranked:
        r["best"], r["best_ms"] = ranked[0]
    if len(ranked) > 1:
        r["runner_up"], r["runner_up_ms"] = ranked[1]
    # The default kernel as a user's call runs it (its own visiting order); where it could not be
    # timed (its error under DEFAULT_VARIANT), its configuration's time among the candidates,
    # with CUTLASS's order, stands in.
    if default_ms is None and default_config in medians:
        default_ms = medians[default_config]
    if default_ms is not None and ranked:
        r["default_ms"] = default_ms
        r["default_over_best"] = default_ms / r["best_ms"]
        if cublas:
            r["default_over_cublas"] = default_ms / cublas
    if cublas and ranked:
        r["best_over_cublas"] = r["best_ms"] / cublas
    return r




def time_orders(evtc, spec: SetSpec, shape: Shape, names: list[str], problem: Problem, outputs: dict, ref, args,
                timer: Timer) -> dict:
    """Each of `names` (compiled configurations) with every tile visiting order, interleaved with
    the library call in one timing (the order is a run-time argument: the kernels compile nothing more).
    Returns {"cublas_ms", "times": {config: {order: ms}}, "errors": {...}}."""
    rotation = Rotation(problem.weights)
    variants = {REFERENCE: rotating(reference_caller(spec, problem), rotation)}
    errors = {}
    for name in names:
        for order in evtc._evtc.visit_orders():  # the orders the tuner tries
            kernel = evtc.compile(spec.expr, config=name, visit_order=order, **spec.compile_options(args.layout))
            if why := try_candidate(kernel, problem, outputs, ref):
                errors[f"{name}@{order}"] = why
            else:
                variants[f"{name}@{order}"] = rotating(evtc_caller(kernel, problem, outputs), rotation)
    timer.warm_up(variants, args.warmup_ms)
    medians, _, timing_errors = timer.interleaved(variants, args.rounds, args.calls)
    errors.update(timing_errors)
    times: dict[str, dict[str, float]] = {}
    for variant, ms in medians.items():
        if "@" in variant:
            name, order = variant.split("@")
            times.setdefault(name, {})[order] = ms
    return {"cublas_ms": medians.get(REFERENCE), "times": times, "errors": errors}


def best_order(times: dict[str, float]) -> tuple[str, float]:
    """The order to keep and its time: the fastest, where it beats CUTLASS's heuristic order by
    the tuner's margin (VISIT_ORDER_MARGIN); else the heuristic order (noise must not pick one)."""
    from evtc import _evtc

    base = times.get("heuristic")
    order, ms = min(times.items(), key=lambda item: item[1])
    if base is None:
        return order, ms
    return (order, ms) if ms < base * (1 - _evtc.VISIT_ORDER_MARGIN) else ("heuristic", base)


def apply_orders(result: dict, orders: dict) -> None:
    """The sweep result of a shape after its visiting orders were timed: the winner is the fastest
    configuration with its kept order, all times (the library call's too) from the orders' timing."""
    result["orders"] = orders["times"]
    result["order_errors"] = orders["errors"]
    kept = {name: best_order(t) for name, t in orders["times"].items() if t}
    if not kept:
        return
    ranked = sorted(kept.items(), key=lambda item: item[1][1])
    (name, (order, ms)) = ranked[0]
    result.update({"best": name, "best_order": order, "best_ms": ms, "cublas_ms": orders["cublas_ms"]})
    if len(ranked) > 1:
        result["runner_up"], result["runner_up_ms"] = ranked[1][0], ranked[1][1][1]
    if orders["cublas_ms"]:
        result["best_over_cublas"] = ms / orders["cublas_ms"]


def sweep_shape(spec: SetSpec, shape: Shape, names: list[str], kernels: dict, compile_errors: dict, default_kernel,
                args, timer: Timer) -> dict:
    import torch

    problem = make_problem(spec, shape, args.rotate_mb << 20, args.seed, args.layout)
    ref = reference_output(spec, problem)
    outputs = nan_outputs(default_kernel, shape.m, shape.n)
    rotation = Rotation(problem.weights)
    variants = {REFERENCE: rotating(reference_caller(spec, problem), rotation)}
    errors = {name: compile_errors[name] for name in names if name in compile_errors}
    for name in names:
        if name in errors:
            continue
        if why := try_candidate(kernels[name], problem, outputs, ref):
            errors[name] = why
        else:
            variants[name] = rotating(evtc_caller(kernels[name], problem, outputs), rotation)
    if why := try_candidate(default_kernel, problem, outputs, ref):
        errors[DEFAULT_VARIANT] = why
    else:
        variants[DEFAULT_VARIANT] = rotating(evtc_caller(default_kernel, problem, outputs), rotation)
    timer.warm_up(variants, args.warmup_ms)
    medians, _, timing_errors = timer.interleaved(variants, args.rounds, args.calls)
    errors.update(timing_errors)
    result = sweep_result(shape, default_kernel.config_for(shape.m, shape.n, shape.k), medians, errors,
                          default_kernel.visit_order_for(shape.m, shape.n, shape.k))
    if args.orders_top > 0 and result["candidates"]:
        import evtc

        top = [name for name, _ in rank(result["candidates"])[:args.orders_top]]
        del variants
        apply_orders(result, time_orders(evtc, spec, shape, top, problem, outputs, ref, args, timer))
    del ref
    result["weight_copies"] = len(problem.weights)
    del problem, outputs
    torch.cuda.empty_cache()
    return result


def sweep_line(r: dict) -> str:
    head = f"{r['m']}x{r['n']}x{r['k']} ({r['label']}):"
    if "best" not in r:
        return f"{head} no candidate could be timed ({len(r['errors'])} failed)"
    order = f" ({r['best_order']})" if "best_order" in r else ""
    text = f"{head} best {r['best']}{order} {r['best_ms']:.4f} ms, library {fmt(r.get('cublas_ms'), '.4f')} ms"
    if "runner_up" in r:
        text += f", runner-up {r['runner_up']} +{100 * (r['runner_up_ms'] / r['best_ms'] - 1):.1f}%"
    if "default_over_cublas" in r:
        text += f", default {r['default_config']} {r['default_over_cublas']:.3f}x library"
    return text + f", {len(r['candidates'])} timed, {len(r['errors'])} failed"


def table_document(results: list[dict], gpu: str, command: str, measured: str, sm_count: Optional[int],
                   spec: SetSpec) -> dict:
    """The selection table: each shape's fastest configuration, with the runner-up for its margin."""
    entries = []
    for r in sorted(results, key=lambda r: (r["m"], r["n"], r["k"])):
        if "best" not in r:
            continue
        entry = {"m": r["m"], "n": r["n"], "k": r["k"], "config": r["best"], "ms": r["best_ms"],
                 "cublas_ms": r.get("cublas_ms"), "runner_up": r.get("runner_up"),
                 "runner_up_ms": r.get("runner_up_ms")}
        if r.get("best_order", "heuristic") != "heuristic":
            entry["order"] = r["best_order"]
        # A transposed (swap-AB) winner: also the fastest untransposed configuration, which
        # epilogues without a transposed kernel (gated ones) take instead.
        if "_swap" in r["best"]:
            plain = [(name, ms) for name, ms in r["candidates"].items() if "_swap" not in name]
            if plain:
                entry["unswapped_config"], entry["unswapped_ms"] = min(plain, key=lambda c: c[1])
        entries.append(entry)
    doc = {"format": 1, "gpu": gpu, "gpu_class": gpu_slug(gpu)}
    if sm_count:
        doc["sm_count"] = sm_count  # a GPU class without a table borrows one of as many multiprocessors
    doc.update({"dtype": spec.dtype, "epilogue": spec.expr, "measured": measured, "command": command})
    if spec.table_kind:
        doc["kind"] = spec.table_kind
    doc["entries"] = entries
    return doc


def write_table(path: str, doc: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)


def run_sweep(args, spec: SetSpec, shapes: list[Shape]) -> int:
    import torch
    import evtc

    if not os.environ.get("EVTC_LOG"):
        evtc.set_log_level("warning")
    old_table = None
    if args.orders_from:
        # The visiting orders of an existing table's configurations: no candidate listing, and
        # only the table's winner and runner-up compile and run.
        with open(args.orders_from) as f:
            old_table = json.load(f)
        entries = {(e["m"], e["n"], e["k"]): e for e in old_table["entries"]}
        candidates = {s: [c for c in (entries[(s.m, s.n, s.k)]["config"], entries[(s.m, s.n, s.k)].get("runner_up")) if c]
                      for s in shapes if (s.m, s.n, s.k) in entries}
        list_errors = {s: f"not in {args.orders_from}" for s in shapes if s not in candidates}
    elif args.configs:
        # Named configurations at every shape, listed by nobody: e.g. a rule's old and new picks.
        candidates, list_errors = {s: list(args.configs) for s in shapes}, {}
    else:
        candidates, list_errors = all_candidates(args.evtc, shapes, spec, args.layout)
        if args.skip is not None:
            candidates = skip_candidates(candidates, args.skip)
        if args.table_base:
            with open(args.table_base) as f:
                old_table = json.load(f)
    if args.refine:
        candidates = refine_candidates(candidates, args.refine, args.refine_top, args.retime)
    if args.seed_from:
        candidates = seeded_candidates(candidates, args.seed_from, args.seed_top, args.seed_neighbours)
    kernels, compile_errors = compile_candidates(evtc, candidates, spec, args.layout)
    data = run_metadata(torch, evtc, args, "sweep")
    data.update({"set": spec.name, "epilogue": spec.expr, "error_bound": ERROR_BOUND, "compile_errors": compile_errors,
                 "listing_errors": {s.mnk: e for s, e in list_errors.items()}, "shapes": []})
    base = result_base(args.out, data["gpu"], "gemm-sweep")
    default_kernel = evtc.compile(spec.expr, **spec.compile_options(args.layout))
    timer = Timer(not args.no_backlog, args.alternate)
    timed = [s for s in shapes if s in candidates]
    for i, shape in enumerate(timed, 1):
        try:
            result = sweep_shape(spec, shape, candidates[shape], kernels, compile_errors, default_kernel, args, timer)
        except Exception as e:  # recorded; the other shapes go on
            result = {"m": shape.m, "n": shape.n, "k": shape.k, "label": shape.label, "candidates": {},
                      "errors": {"shape": f"{type(e).__name__}: {str(e)[:2000]}"}}
            torch.cuda.empty_cache()
        data["shapes"].append(result)
        write_json(data, base + ".json")
        log(f"{i}/{len(timed)} {sweep_line(result)}")
    data["starved_batches"] = timer.starved
    write_json(data, base + ".json")
    if not args.table_out:
        print(f"wrote {base}.json", flush=True)
        return 0 if all("best" in r for r in data["shapes"]) else 1
    doc = table_document(data["shapes"], data["gpu"], data["command"], data["date"], data.get("sm_count"), spec)
    missing = len(timed) - len(doc["entries"]) + (len(shapes) - len(timed) if old_table is None else 0)
    if old_table is not None:
        merge_tables(doc, old_table, "orders" if args.orders_from else "refined")
    write_table(args.table_out, doc)
    print(f"wrote {base}.json and {args.table_out} ({len(doc['entries'])} entries"
          + (f"; {missing} shape(s) without a timed candidate" if missing else "") + ")", flush=True)
    return 1 if missing else 0


def keep_unswapped(entry: dict, before: dict) -> None:
    """A transposed winner timed with --orders-from (only the old winner and runner-up ran, often
    both transposed) or with --refine (a subset of the candidates) keeps the untransposed
    configuration the old entry measured, which gated epilogues take: the old entry's own, or its
    winner where that was untransposed, unless this sweep timed a faster one."""
    if "_swap" not in entry["config"]:
        return
    if "unswapped_config" in before:
        old = (before["unswapped_config"], before["unswapped_ms"])
    elif "_swap" not in before["config"]:
        old = (before["config"], before["ms"])
    else:
        return
    if "unswapped_config" not in entry or entry["unswapped_ms"] > old[1]:
        entry["unswapped_config"], entry["unswapped_ms"] = old


def merge_tables(doc: dict, old_table: dict, what: str) -> None:
    """--orders-from and --table-base: the shapes timed here replace theirs in the old table
    (keeping what only the old entry measured, keep_unswapped); the others stay. `what` names
    this sweep in the table's `measured`."""
    before = {(e["m"], e["n"], e["k"]): e for e in old_table["entries"]}
    new = {(e["m"], e["n"], e["k"]): e for e in doc["entries"]}
    for key, entry in new.items():
        if key in before:
            keep_unswapped(entry, before[key])
    doc["entries"] = sorted(list(new.values()) + [e for key, e in before.items() if key not in new],
                            key=lambda e: (e["m"], e["n"], e["k"]))
    doc["command"] = old_table.get("command", "") + " && " + doc["command"]
    doc["measured"] = f"{old_table.get('measured', '')}; {what} {doc['measured']}"


def table_from_sweeps(paths: list[str], table_out: str) -> int:
    """The selection table of sweep results files; all must come from one kind of GPU."""
    sweeps = read_sweeps(paths)
    shapes = shape_results(sweeps)
    gpus = {data["gpu"] for data in sweeps}
    sms = {data.get("sm_count") or (132 if gpu_slug(data["gpu"]) in ("h100", "h200") else None) for data in sweeps}
    commands = [data["command"] for data in sweeps]
    dates = [data["date"] for data in sweeps]
    sets = {data.get("set", "plain") for data in sweeps}  # sweeps before the fp8 set timed the plain one
    if len(gpus) != 1:
        sys.exit(f"the sweeps come from different GPUs: {', '.join(sorted(gpus))}")
    if len(sets) != 1:
        sys.exit(f"the sweeps time different sets: {', '.join(sorted(sets))}")
    doc = table_document(list(shapes.values()), gpus.pop(), " && ".join(commands), max(dates),
                         sms.pop() if len(sms) == 1 else None, SETS[sets.pop()])
    write_table(table_out, doc)
    print(f"wrote {table_out} ({len(doc['entries'])} entries from {len(paths)} sweep file(s))")
    return 0


def retime_entries(table: dict, runs: list[dict]) -> int:
    """Replaces each entry's `ms` and `cublas_ms` with a compare run's medians (a later run's
    first) where that run timed the entry's configuration with its visiting order at the entry's
    shape (the plain set, the row not failed). Returns how many entries changed.

    A sweep's winner time is the least of many noisy timings (every candidate, then every
    visiting order of the fastest): under the GPU's power limit the same kernel's medians spread
    by several per cent between rounds, so the least of them runs low, while torch.mm's is one
    timing. A compare run times the winner alone against torch.mm in interleaved rounds: the
    times the cost model is anchored to should be those."""
    timed = {}
    for data in runs:
        for r in data["rows"]:
            if r.get("set") == "plain" and not r.get("failed") and r.get("evtc_ms") and r.get("ref_ms"):
                timed[(r["m"], r["n"], r["k"])] = r
    changed = 0
    for e in table["entries"]:
        r = timed.get((e["m"], e["n"], e["k"]))
        if r is None or r.get("config") != e["config"] or r.get("visit_order", "heuristic") != e.get("order", "heuristic"):
            continue
        e["ms"], e["cublas_ms"] = r["evtc_ms"], r["ref_ms"]
        changed += 1
    return changed


def agreed_orders(table: dict, sweeps: list[dict], margin: float) -> tuple[list[tuple], list[tuple]]:
    """--orders-agree: the table entries whose configuration and visiting order another
    (configuration, order) pair beats in every given visiting-order sweep of its shape.

    Each sweep times the entry's configuration and runner-up with every order against torch.mm
    in one run; ratios to torch.mm are compared within a run only. Among the pairs every sweep
    timed, the one of the least geometric-mean ratio is taken where it is faster than the
    entry's own pair by `margin` in each sweep: under the GPU's power limit one sweep's least
    of 18 timings runs low by chance, and a pick that only one run favours is that noise. The
    new entry's times are the last sweep's (a compare run can replace them: --table-times-from).
    Returns the changes, each (shape, old pair, new pair, per-sweep ratios old and new, the
    shape's sweep result for table_document), and the entries some sweep timed but that stay,
    each (shape, why)."""
    def ratios(shape: dict) -> dict:
        if not shape.get("orders") or not shape.get("cublas_ms"):
            return {}
        return {(c, o): ms / shape["cublas_ms"] for c, times in shape["orders"].items() for o, ms in times.items()}

    runs = [{(s["m"], s["n"], s["k"]): (s, ratios(s)) for s in data["shapes"]} for data in sweeps]
    changes, kept = [], []
    for e in table["entries"]:
        key = (e["m"], e["n"], e["k"])
        timed = [run[key] for run in runs if key in run and run[key][1]]
        if not timed:
            continue
        if len(timed) != len(runs):
            kept.append((key, f"its orders were timed by {len(timed)} of the {len(runs)} sweeps"))
            continue
        old = (e["config"], e.get("order", "heuristic"))
        pairs = set.intersection(*(set(r) for _, r in timed))
        if old not in pairs:
            kept.append((key, f"not every sweep timed its own pair, {old[0]} ({old[1]})"))
            continue
        mean = {p: math.exp(sum(math.log(r[p]) for _, r in timed) / len(timed)) for p in pairs}
        best = min(sorted(pairs), key=lambda p: mean[p])
        if best == old:
            kept.append((key, "its own pair has the least geometric-mean ratio"))
            continue
        short = [i for i, (_, r) in enumerate(timed, 1) if r[best] > r[old] * (1 - margin)]
        if short:
            kept.append((key, f"{best[0]} ({best[1]}) is not {100 * margin:g} % faster than it in sweep(s) "
                              + ", ".join(f"{i} ({timed[i - 1][1][best]:.3f} against {timed[i - 1][1][old]:.3f})"
                                          for i in short)))
            continue
        last = timed[-1][0]["orders"]
        runner = min((p for p in sorted(pairs) if p[0] != best[0]), key=lambda p: mean[p], default=None)
        # The shape's result as a sweep writes it, for table_document and merge_tables (which keep
        # a transposed pick's untransposed fallback as --orders-from does).
        result = {"m": e["m"], "n": e["n"], "k": e["k"], "best": best[0], "best_order": best[1],
                  "best_ms": last[best[0]][best[1]], "cublas_ms": timed[-1][0]["cublas_ms"],
                  "runner_up": runner[0] if runner else None,
                  "runner_up_ms": last[runner[0]][runner[1]] if runner else None,
                  "candidates": {c: min(times.values()) for c, times in last.items()}}
        changes.append((key, old, best, [r[old] for _, r in timed], [r[best] for _, r in timed], result))
    return changes, kept


def table_set(table: dict) -> str:
    """The set whose epilogue a table was measured with."""
    return next((name for name, spec in SETS.items() if spec.expr == table.get("epilogue")), "plain")


def check_gpu_class(path: str, data: dict, table: dict) -> None:
    """Exits unless the results file `path` was measured on the GPU class of `table`."""
    if gpu_slug(data["gpu"]) != table["gpu_class"]:
        sys.exit(f"{path} was measured on {data['gpu']}, the table is for {table['gpu_class']}")


def orders_agree(paths: list[str], table_base: str, table_out: str) -> int:
    """--orders-agree: the base table with the entries every given orders sweep agrees to change."""
    with open(table_base) as f:
        table = json.load(f)
    sweeps = read_sweeps(paths)
    table_sweep_set = table_set(table)
    for path, data in zip(paths, sweeps):
        check_gpu_class(path, data, table)
        if data.get("set", "plain") != table_sweep_set:
            sys.exit(f"{path} timed the {data.get('set', 'plain')} set, the table is for the {table_sweep_set} set")
        if not any(s.get("orders") for s in data["shapes"]):
            sys.exit(f"{path} has no visiting-order timings (a sweep with --orders-from or --orders-top writes them)")
    from evtc import _evtc

    changes, kept = agreed_orders(table, sweeps, _evtc.VISIT_ORDER_MARGIN)  # the margin a kept order must beat
    for key, old, new, old_r, new_r, _ in changes:
        print(f"{key[0]}x{key[1]}x{key[2]}: {old[0]} ({old[1]}) -> {new[0]} ({new[1]}); ratios to torch.mm "
              + ", ".join(f"{a:.3f} -> {b:.3f}" for a, b in zip(old_r, new_r)))
    for key, why in kept:
        print(f"{key[0]}x{key[1]}x{key[2]}: kept: {why}")
    doc = table_document([change[-1] for change in changes], table["gpu"], command_line(),
                         ", ".join(data["date"] for data in sweeps) + " agree", table.get("sm_count"),
                         SETS[table_sweep_set])
    merge_tables(doc, table, f"{len(changes)} entries changed where the orders sweeps of")
    write_table(table_out, doc)
    print(f"wrote {table_out}: {len(changes)} of {len(doc['entries'])} entries changed, "
          f"where all {len(paths)} sweeps agree")
    return 0


def table_times_from(paths: list[str], table_base: str, table_out: str) -> int:
    """--table-times-from: the base table with its entries' times from compare runs of its GPU."""
    with open(table_base) as f:
        table = json.load(f)
    runs = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        if data.get("mode") == "sweep" or "rows" not in data:
            sys.exit(f"{path} is not a compare results file")
        check_gpu_class(path, data, table)
        runs.append(data)
    changed = retime_entries(table, runs)
    table["measured"] = f"{table.get('measured', '')}; times of {changed} entries from compare runs " + \
        ", ".join(data["date"] for data in runs)
    table["command"] = table.get("command", "") + " && " + command_line()
    write_table(table_out, table)
    print(f"wrote {table_out}: {changed} of {len(table['entries'])} entries retimed from {len(paths)} compare run(s)")
    return 0


# --- results ----------------------------------------------------------------------------------

def run_metadata(torch, evtc, args, mode: str) -> dict:
    now = datetime.now(timezone.utc)
    env = {k: os.environ[k] for k in ("EVTC_TUNE", "EVTC_CACHE_DIR", "EVTC_KERNEL_LIBRARY", "EVTC_ARCH",
                                      "EVTC_COMPILE_JOBS") if k in os.environ}
    return {"mode": mode, "gpu": torch.cuda.get_device_name(),
            "sm_count": torch.cuda.get_device_properties(0).multi_processor_count, "torch": torch.__version__,
            "cuda": torch.version.cuda, "evtc": getattr(evtc, "__version__", None),
            "date": now.isoformat(timespec="seconds"), "command": command_line(), "env": env,
            "rounds": args.rounds, "calls": args.calls, "warmup_ms": args.warmup_ms,
            "rotate_mb": args.rotate_mb, "backlog": not args.no_backlog, "alternate": args.alternate,
            "seed": args.seed, "layout": args.layout, "passes": getattr(args, "passes", 1)}


def write_json(data: dict, path: str) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=2)
    os.replace(path + ".tmp", path)


def fmt(value, spec: str) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def geomean(values: list[float]) -> Optional[float]:
    return statistics.geometric_mean(values) if values else None


def within(x: Optional[float], tolerance: float = 0.05) -> bool:
    return x is not None and abs(x - 1) <= tolerance


def model_checks(r: dict) -> tuple[Optional[float], Optional[float]]:
    """The cost model against a row's measurement, beside predicted_over_measured (evtc's time):
    its evtc / cuBLAS ratio over the measured ratio (what its decisions compare), and its cuBLAS
    time over the measured one (the table's time of cuBLAS, from an earlier run: how far the two
    runs' clocks lie apart)."""
    if not (r.get("predicted_ms") and r.get("predicted_cublas_ms") and r.get("evtc_ms") and r.get("ref_ms")):
        return None, None
    return ((r["predicted_ms"] / r["predicted_cublas_ms"]) / (r["evtc_ms"] / r["ref_ms"]),
            r["predicted_cublas_ms"] / r["ref_ms"])


def ratio_stats(rows: list[dict]) -> dict:
    """Geometric means of evtc / reference (rows that failed excluded: their times mean
    nothing), the largest ratio and its shape, and the shapes above ABOVE."""
    ok = [r for r in rows if r.get("ratio") is not None and not r.get("failed")]
    worst = max(ok, key=lambda r: r["ratio"], default=None)
    return {"shapes": len(rows), "timed": len(ok), "failed": sum(1 for r in rows if r.get("failed")),
            "geomean_ratio": geomean([r["ratio"] for r in ok]),
            "geomean_ratio_m_le_64": geomean([r["ratio"] for r in ok if r["m"] <= 64]),
            "geomean_ratio_m_ge_128": geomean([r["ratio"] for r in ok if r["m"] >= 128]),
            "max_ratio": worst["ratio"] if worst else None,
            "max_ratio_shape": f"{worst['m']}x{worst['n']}x{worst['k']} ({worst['label']})" if worst else None,
            f"above_{ABOVE}": sum(1 for r in ok if r["ratio"] > ABOVE),
            # --passes: the shapes above ABOVE in every pass, and the largest spread of one
            # shape's pass ratios (its slowest pass over its fastest).
            f"above_{ABOVE}_every_pass": sum(1 for r in ok if len(r.get("pass_ratios") or []) > 1
                                              and min(r["pass_ratios"]) > ABOVE),
            "largest_pass_spread": max((max(r["pass_ratios"]) / min(r["pass_ratios"]) for r in ok
                                        if len(r.get("pass_ratios") or []) > 1), default=None),
            "model_error_geomean": geomean([max(r["predicted_over_measured"], 1 / r["predicted_over_measured"])
                                            for r in ok if r.get("predicted_over_measured")]),
            "model_within_5pct": sum(1 for r in ok if within(r.get("predicted_over_measured"))),
            "model_checked": sum(1 for r in ok if r.get("predicted_over_measured")),
            "model_ratio_within_5pct": sum(1 for r in ok if within(model_checks(r)[0])),
            "model_cublas_within_5pct": sum(1 for r in ok if within(model_checks(r)[1])),
            "by_source": {src: sum(1 for r in ok if (r.get("config_source") or "").split(" ")[0] == src)
                          for src in ("table", "heuristic", "tuned", "given", "nearest")},
            # GEMMs alone under the FX pass: those it moves to evtc's kernel, their measured ratio,
            # and the geo-mean a user gets (evtc where moved, the reference's 1.0 elsewhere).
            "replaced": sum(1 for r in ok if r.get("replaces_cublas")),
            "replaced_geomean_ratio": geomean([r["ratio"] for r in ok if r.get("replaces_cublas")]),
            "replaced_max_ratio": max((r["ratio"] for r in ok if r.get("replaces_cublas")), default=None),
            "pass_geomean_ratio": geomean([r["ratio"] if r.get("replaces_cublas") else 1.0 for r in ok])}


def summarize(rows: list[dict]) -> dict:
    sets = list(dict.fromkeys(r["set"] for r in rows))
    return {"all": ratio_stats(rows), **{s: ratio_stats([r for r in rows if r["set"] == s]) for s in sets}}


def summary_lines(summary: dict) -> list[str]:
    lines = ["Summary (evtc time / reference time; below 1 evtc is faster):", ""]
    for name, s in summary.items():
        lines.append(f"- {name}: geo-mean {fmt(s['geomean_ratio'], '.3f')} over {s['timed']} of {s['shapes']} shapes "
                     f"(M <= 64: {fmt(s['geomean_ratio_m_le_64'], '.3f')}, M >= 128: "
                     f"{fmt(s['geomean_ratio_m_ge_128'], '.3f')}); max {fmt(s['max_ratio'], '.3f')} at "
                     f"{s['max_ratio_shape'] or '–'}; {s[f'above_{ABOVE}']} above {ABOVE}; {s['failed']} failed")
        if s.get("model_checked"):
            lines.append(f"  - cost model, within 5 % of the measurement at: evtc's time {s['model_within_5pct']} of "
                         f"{s['model_checked']} shapes; evtc / cuBLAS {s['model_ratio_within_5pct']}; cuBLAS's time (the "
                         f"table's, from an earlier run) {s['model_cublas_within_5pct']}")
        if s.get("largest_pass_spread"):
            lines.append(f"  - over the passes (ratios are their medians): {s[f'above_{ABOVE}_every_pass']} shapes above "
                         f"{ABOVE} in every pass; one shape's passes differ by up to "
                         f"{100 * (s['largest_pass_spread'] - 1):.1f} %")
        if s.get("replaced"):
            lines.append(f"  - alone under the FX pass: {s['replaced']} shapes move to evtc's kernel, geo-mean "
                         f"{fmt(s['replaced_geomean_ratio'], '.3f')} there (max {fmt(s['replaced_max_ratio'], '.3f')}); "
                         f"{fmt(s['pass_geomean_ratio'], '.3f')} over all shapes")
    return lines


def markdown_table(data: dict) -> str:
    passes = data.get("passes", 1)
    lines = [f"{data['gpu']}, torch {data['torch']}, evtc {data.get('evtc')}, {data['date']}: median ms per call over "
             f"{data['rounds']} rounds x {data['calls']} calls, evtc and the reference interleaved, weights rotated "
             f"over copies of more than {data['rotate_mb']} MB in all; evtc's default configuration"
             + (f"; each time the median of {passes} passes over the shape list." if passes > 1 else "."), "",
             "| set | layer | M | N | K | evtc ms | ref ms | evtc / ref | evtc TFLOP/s | ref TFLOP/s | config | path "
             "| rel-L2 | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        failure = (r.get("failure") or "").replace("|", "\\|").replace("\n", " ")[:80]
        status = f"FAIL: {failure}" if r.get("failed") else "ok"
        lines.append(f"| {r['set']} | {r['label']} | {r['m']} | {r['n']} | {r['k']} | {fmt(r.get('evtc_ms'), '.4f')} "
                     f"| {fmt(r.get('ref_ms'), '.4f')} | {fmt(r.get('ratio'), '.3f')} | "
                     f"{fmt(r.get('evtc_tflops'), '.1f')} | {fmt(r.get('ref_tflops'), '.1f')} | `{r.get('config')}` "
                     f"| {r.get('last_path') or '–'} | {fmt(r.get('rel_err'), '.1e')} | {status} |")
    return "\n".join(lines)


def plot_set(ax, rows: list[dict], labels: list[str], title: str) -> None:
    """One bar per shape, grouped by M, coloured by layer (the same colour in every set)."""
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("tab20")
    x, ticks = 0, []
    for m in sorted({r["m"] for r in rows}):
        group = [r for r in rows if r["m"] == m]
        xs = list(range(x, x + len(group)))
        ax.bar(xs, [r["ratio"] for r in group], color=[colors(labels.index(r["label"]) % 20) for r in group],
               edgecolor=["red" if r.get("failed") else "none" for r in group])
        ticks.append((x + (len(group) - 1) / 2, f"M={m}"))
        x += len(group) + 1
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(ABOVE, color="gray", linewidth=0.6, linestyle="--")
    ax.set_xticks([t for t, _ in ticks], [s for _, s in ticks], fontsize=7)
    ax.set_ylim(bottom=max(0.0, min(r["ratio"] for r in rows) - 0.1))
    ax.set_ylabel("evtc / reference time")
    ax.set_title(title, fontsize=9)


def write_plot(data: dict, path: str) -> None:
    try:
        import matplotlib
    except ImportError:
        print("warning: matplotlib is missing: no PNG", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in data["rows"] if r.get("ratio") is not None]
    sets = list(dict.fromkeys(r["set"] for r in rows))
    if not sets:
        return
    labels = list(dict.fromkeys(r["label"] for r in rows))
    widest = max(sum(1 for r in rows if r["set"] == s) for s in sets)
    fig, axes = plt.subplots(len(sets), 1, figsize=(max(8.0, 0.12 * widest + 6), 3.8 * len(sets)), squeeze=False)
    for ax, s in zip(axes[:, 0], sets):
        plot_set(ax, [r for r in rows if r["set"] == s], labels,
                 f"{s}: {data['sets'][s]['expr']} vs {data['sets'][s]['reference']}")
    colors = plt.get_cmap("tab20")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors(i % 20)) for i in range(len(labels))]
    axes[0, 0].legend(handles, labels, fontsize=6, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(f"{data['gpu']}, torch {data['torch']}, evtc {data.get('evtc')}, {data['date']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- command line -----------------------------------------------------------------------------

def parse_sets(text: str) -> list[str]:
    names = [s for s in text.split(",") if s]
    if unknown := sorted(set(names) - set(SETS)):
        raise argparse.ArgumentTypeError(f"unknown set(s) {', '.join(unknown)}; choose from {','.join(SETS)}")
    if not names:
        raise argparse.ArgumentTypeError("no set given")
    return list(dict.fromkeys(names))


def parse_ints(text: str) -> list[int]:
    try:
        values = [int(s) for s in text.split(",") if s]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse_regex(text: str) -> re.Pattern:
    try:
        return re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"not a regular expression: {text!r} ({e})") from None


def parse_configs(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if not CONFIG_NAME.fullmatch(n)]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"not a configuration name: {', '.join(bad) or repr(text)} (names look like "
            "pingpong_64x80x128_c1x1_persistent_swap; `evtc tune ... --list-candidates` lists them)")
    return list(dict.fromkeys(names))


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for item in (s.strip() for s in text.split(",") if s.strip()):
        match = re.fullmatch(r"(\d+)x(\d+)x(\d+)", item)
        if not match or min(int(g) for g in match.groups()) < 1:
            raise argparse.ArgumentTypeError(f"expected MxNxK with positive sizes, got {item!r}")
        shapes.append(tuple(int(g) for g in match.groups()))
    if not shapes:
        raise argparse.ArgumentTypeError("no shape given")
    return shapes


def parse_args(argv: Optional[list[str]] = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", "--sets", dest="sets", type=parse_sets, default=None, metavar="SET[,SET...]",
                   help=f"epilogue sets to compare: {', '.join(SETS)} (default plain)")
    p.add_argument("--m", type=parse_ints, default=None, metavar="M[,M...]", help="restrict the grid's M values")
    p.add_argument("--shapes", type=parse_shapes, default=None, metavar="MxNxK[,...]", help="replace the grid")
    p.add_argument("--off-grid", action="store_true", help="time shapes outside the grid instead")
    p.add_argument("--max-shapes", type=int, default=None, help="at most this many shapes per set, evenly spread")
    p.add_argument("--quick", action="store_true", help="3 rounds x 10 calls, at most 12 shapes per set")
    p.add_argument("--rounds", type=int, default=None, help="rounds of timed calls (default 5; sweep and --quick 3)")
    p.add_argument("--passes", type=int, default=1, metavar="N",
                   help="compare mode: time the whole shape list N times over and report each shape's median")
    p.add_argument("--calls", type=int, default=None,
                   help="timed calls per variant and round (default 20; sweep and --quick 10)")
    p.add_argument("--warmup-ms", type=float, default=100.0, help="warm-up per shape, in ms of calls (default 100)")
    p.add_argument("--rotate-mb", type=int, default=256,
                   help="weight copies rotated through until they exceed this many MB (at most 64; default 256)")
    p.add_argument("--no-backlog", action="store_true",
                   help="time without queueing calls behind a GPU sleep (host launch cost included)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layout", choices=tuple(LAYOUTS), default="rc",
                   help="A's and B's layouts, r(ow-major) or c(olumn-major): rc nn.Linear's forward (default), "
                        "rr a backward data gradient (B the K x N weight), cr a weight gradient (A column-major)")
    p.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent / "results"))
    p.add_argument("--alternate", action="store_true",
                   help="time the variants call by call in turn within each round's batch, rather than each "
                        "variant's calls in a batch of its own: all then run at the same clock and power state")
    p.add_argument("--dry-run", action="store_true", help="print the shapes and exit (imports neither torch nor evtc)")
    p.add_argument("--compile-only", action="store_true",
                   help="compile the kernels the comparison runs (into evtc's kernel cache) and exit without "
                        "timing: e.g. in the background while another run times")
    p.add_argument("--table", metavar="FILE.json",
                   help="print the Markdown table and summary of a results file and exit")
    p.add_argument("--table-from", nargs="+", metavar="SWEEP.json",
                   help="write --table-out from sweep results files (a later file's shape replaces an "
                        "earlier one's) and exit: for a sweep run in parts (--m, --shapes)")
    p.add_argument("--table-times-from", nargs="+", metavar="COMPARE.json",
                   help="write --table-out: --table-base with each entry's times replaced by these compare "
                        "runs' medians of the same configuration and order at its shape, and exit")
    p.add_argument("--orders-agree", nargs="+", metavar="SWEEP.json",
                   help="write --table-out: --table-base with an entry's configuration and visiting order "
                        "replaced where every one of these visiting-order sweeps (--orders-from) timed another "
                        "pair faster by the tuner's margin, and exit")
    sweep = p.add_argument_group("sweep mode")
    sweep.add_argument("--sweep", action="store_true", help="time every tuning candidate of each shape (plain, bf16)")
    sweep.add_argument("--evtc", metavar="PATH", help="the evtc command-line tool (lists the candidates)")
    sweep.add_argument("--table-out", metavar="FILE",
                       help="where the selection table is written (a --configs sweep writes one only if given)")
    sweep.add_argument("--refine", nargs="+", metavar="SWEEP.json",
                       help="time only the candidates these earlier sweeps did not try, and their fastest there")
    sweep.add_argument("--retime", type=parse_regex, default=None, metavar="REGEX",
                       help="with --refine: candidates whose name matches are timed again as if new "
                            "(their kernels changed since the earlier sweeps)")
    sweep.add_argument("--skip", type=parse_regex, default=None, metavar="REGEX",
                       help="listed candidates whose name matches are neither compiled nor timed")
    sweep.add_argument("--table-base", metavar="TABLE.json",
                       help="with --refine: write TABLE.json with the shapes timed here replaced "
                            "(an untransposed fallback it measured faster is kept)")
    sweep.add_argument("--refine-top", type=int, default=3, metavar="N",
                       help="with --refine: how many of the earlier fastest candidates to time again (default 3)")
    sweep.add_argument("--seed-from", nargs="+", metavar="SWEEP.json",
                       help="time only each shape's --seed-top fastest candidates of these sweeps (made on "
                            "another GPU class with as many multiprocessors), plus the fastest untransposed one")
    sweep.add_argument("--seed-top", type=int, default=4, metavar="N",
                       help="with --seed-from: how many of the earlier fastest candidates to time (default 4)")
    sweep.add_argument("--seed-neighbours", type=int, default=0, metavar="N",
                       help="with --seed-from: a shape the sweeps did not measure takes the candidates of the N "
                            "measured shapes nearest in N and K at each of the measured M values around its M "
                            "(default 0: all of its own)")
    sweep.add_argument("--configs", type=parse_configs, default=None, metavar="NAME[,NAME...]",
                       help="instead of listing candidates: time these configurations at every shape, besides "
                            "evtc's default (e.g. a selection rule's old and new picks)")
    sweep.add_argument("--orders-top", type=int, default=2, metavar="N",
                       help="time the N fastest candidates of each shape again with every tile visiting order "
                            "(default 2; 0: CUTLASS's order only)")
    sweep.add_argument("--orders-from", metavar="TABLE.json",
                       help="instead of listing candidates: time the visiting orders of this table's configuration "
                            "and runner-up at its shapes (restricted by --m/--shapes); --table-out gets the table "
                            "with those entries replaced")
    args = p.parse_args(argv)
    check_args(p, args)
    return args


def check_args(p: argparse.ArgumentParser, args) -> None:
    if args.shapes and (args.off_grid or args.m):
        p.error("--shapes replaces the grid: give it without --off-grid or --m")
    if args.off_grid and args.m:
        p.error("--m restricts the grid; --off-grid has its own M values")
    if args.compile_only and (args.sweep or args.table_from or args.table_times_from or args.orders_agree or args.table):
        p.error("--compile-only belongs to the comparison (the sweep compiles its own candidates)")
    if args.layout != "rc" and any(SETS[name].fp8 for name in args.sets or []):
        p.error("--layout: the fp8 set's reference, torch._scaled_mm, takes A row-major and B column-major only (rc)")
    if args.passes < 1:
        p.error("--passes must be at least 1")
    if args.passes > 1 and (args.sweep or args.compile_only or args.table_from or args.table_times_from
                            or args.orders_agree or args.table):
        p.error("--passes belongs to the comparison (a sweep's rounds already interleave its candidates)")
    if args.sweep:
        if not args.configs and (not args.evtc or not args.table_out):
            p.error("--sweep needs --evtc PATH and --table-out FILE (or --configs NAME,...)")
        if args.sets and len(args.sets) != 1:
            p.error("--sweep measures one set")
        if args.sets and args.sets[0] not in SWEEP_SETS and (args.table_out or not args.configs):
            p.error(f"a selection table is measured with the {', '.join(SWEEP_SETS)} set; another set sweeps "
                    "--configs only, without --table-out")
        if args.table_out and args.layout != "rc":
            p.error("--table-out: the selection tables are measured with A row-major and B column-major (--layout rc)")
        if args.orders_from and args.refine:
            p.error("--orders-from times a table's configurations; --refine lists candidates: give one")
        if args.orders_top < 0:
            p.error("--orders-top must be 0 or more")
        if args.table_base and not args.refine:
            p.error("--table-base belongs to --refine (--orders-from merges into its own table)")
        if args.table_times_from:
            p.error("--table-times-from reads compare runs: give it without --sweep")
        if args.orders_agree:
            p.error("--orders-agree reads earlier sweeps' results: give it without --sweep")
        if args.configs and (args.orders_from or args.refine or args.seed_from):
            p.error("--configs names the configurations itself: give it without --refine, --seed-from and "
                    "--orders-from")
        if args.skip is not None and (args.configs or args.orders_from):
            p.error("--skip filters the listed candidates: give it without --configs and --orders-from")
        if args.retime and not args.refine:
            p.error("--retime belongs to --refine (it says which earlier timings to repeat)")
        if args.seed_from and (args.refine or args.orders_from):
            p.error("--seed-from picks the candidates itself: give it without --refine and --orders-from")
        if args.seed_top < 1:
            p.error("--seed-top must be 1 or more")
        if args.seed_neighbours < 0:
            p.error("--seed-neighbours must be 0 or more")
        if args.seed_neighbours and not args.seed_from:
            p.error("--seed-neighbours belongs to --seed-from (it says whose candidates an unmeasured shape takes)")
    elif args.orders_from or args.seed_from or args.configs or args.skip is not None:
        given = ("--orders-from" if args.orders_from else "--seed-from" if args.seed_from
                 else "--configs" if args.configs else "--skip")
        p.error(f"{given} belongs to --sweep")
    elif args.table_from:
        if not args.table_out:
            p.error("--table-from needs --table-out FILE")
    elif args.table_times_from or args.orders_agree:
        given = "--table-times-from" if args.table_times_from else "--orders-agree"
        if args.table_times_from and args.orders_agree:
            p.error("--table-times-from and --orders-agree each write a table: give one")
        if not args.table_base or not args.table_out:
            p.error(f"{given} needs --table-base TABLE.json and --table-out FILE")
    elif args.evtc or args.table_out:
        p.error("--evtc and --table-out belong to --sweep")
    args.sets = args.sets or ["plain"]
    short = args.quick or args.sweep
    args.rounds = args.rounds if args.rounds is not None else 3 if short else 5
    args.calls = args.calls if args.calls is not None else 10 if short else 20
    if args.quick and args.max_shapes is None:
        args.max_shapes = 12
    for name in ("rounds", "calls", "rotate_mb"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_shapes is not None and args.max_shapes < 1:
        p.error("--max-shapes must be at least 1")


def print_plan(args, plan: dict[str, list[Shape]]) -> None:
    print(f"{'sweep' if args.sweep else 'compare'}: {args.rounds} rounds x {args.calls} calls per variant, "
          f"{args.warmup_ms:g} ms warm-up per shape, weights rotated over > {args.rotate_mb} MB")
    for name, shapes in plan.items():
        spec = SETS[name]
        print(f"\nset {name}: {spec.expr}  vs  {spec.reference}  ({len(shapes)} shapes)")
        for s in shapes:
            copies = weight_copies(weight_bytes(spec, s), args.rotate_mb << 20)
            print(f"  {s.mnk:>20}  {s.label:<34} weight copies {copies}")
    if args.sweep:
        first = next(iter(plan.values()))[:1]
        if first and not args.configs:
            spec = SETS[args.sets[0]]
            print(f"\ncandidates per shape, e.g.: {shlex.join(candidate_command(args.evtc, first[0], spec, args.layout))}")
        print(f"table: {args.table_out or '(none: --configs without --table-out)'}")
    print(f"\n{sum(len(s) for s in plan.values())} shapes in all")


def print_results_file(path: str) -> None:
    with open(path) as f:
        data = json.load(f)
    print(markdown_table(data))
    print()
    # Summarized again from the rows: files written before a statistic existed get it too.
    print("\n".join(summary_lines(summarize(data["rows"]))))


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if args.table:
        print_results_file(args.table)
        return 0
    if args.table_from:
        return table_from_sweeps(args.table_from, args.table_out)
    if args.table_times_from:
        return table_times_from(args.table_times_from, args.table_base, args.table_out)
    if args.orders_agree:
        return orders_agree(args.orders_agree, args.table_base, args.table_out)
    plan = {name: plan_shapes(args, SETS[name]) for name in args.sets}
    if args.dry_run:
        print_plan(args, plan)
        return 0
    if not any(plan.values()):
        sys.exit("no shape to time")
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench/gemm_shapes.py needs a CUDA GPU")
    os.makedirs(args.out, exist_ok=True)
    if args.sweep:
        name = args.sets[0]
        return run_sweep(args, SETS[name], plan[name])
    return run_compare(args, plan)


if __name__ == "__main__":
    sys.exit(main())
