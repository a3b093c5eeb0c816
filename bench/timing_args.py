"""The command-line options of the benchmarks that time variants over a list of token counts
(bench/stacked_gemms.py, bench/residual_forms.py) with bench/gemm_shapes.py's Timer: one
spelling and one check of --m, --rounds, --calls, --rotate-mb, --out and --quick."""
from __future__ import annotations

import argparse
import math
import os
from typing import Optional


def add_timing_arguments(p: argparse.ArgumentParser, m_default: str, quick_help: str) -> None:
    p.add_argument("--m", default=m_default, help="token counts (M), comma-separated")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--rotate-mb", type=int, default=256)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    p.add_argument("--quick", action="store_true", help=quick_help)


def checked_timing_arguments(p: argparse.ArgumentParser, args: argparse.Namespace,
                             quick_m: Optional[list[int]] = None) -> list[int]:
    """The M values of --m; --quick sets 3 rounds x 10 calls (and `quick_m`, where given).
    Bad values end the program through p.error, naming the option."""
    try:
        m_values = [int(v) for v in args.m.split(",")]
    except ValueError:
        p.error(f"--m: {args.m!r} is not a comma-separated list of integers")
    if any(m <= 0 for m in m_values):
        p.error("--m: every M must be positive")
    if args.quick:
        args.rounds, args.calls = 3, 10
        m_values = quick_m or m_values
    if min(args.rounds, args.calls, args.rotate_mb) <= 0:
        p.error("--rounds, --calls and --rotate-mb must be positive")
    return m_values


def geomean(values) -> float:
    """The geometric mean of the values that are set (NaN when none is)."""
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")
