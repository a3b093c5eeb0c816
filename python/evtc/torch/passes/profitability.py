"""profitability: fuse a chain only where it pays.

The unfused alternative is cuBLAS for the GEMM and Inductor's kernel for the epilogue: the
GEMM writes its M×N result and the epilogue kernel reads it back. Fusion saves that round trip
(and the epilogue kernel), and costs whatever evtc's kernel is slower than cuBLAS at the
shape. evtc's cost model (C++, evtc/cost_model.hpp: the GEMM times from the tile grid and the
GPU's rates, measured) makes the call; this module says what the unfused path would do.

A chain whose values are only views or the GEMM's own result (nothing for an epilogue kernel
to do) saves nothing, so it stays with cuBLAS unless evtc's kernel is expected to be faster.
"""
from __future__ import annotations

from torch import fx

from ... import _evtc

from .._chain import RESHAPES, Chain, Refused, concrete
from .._fusion import intermediate_bytes, problem_size


def unfused_work(chain: Chain, outs: list[fx.Node]) -> tuple[float, int]:
    """(bytes, kernels) the unfused path spends on the GEMM's intermediate result: written by
    cuBLAS and read back by one epilogue kernel; nothing when the chain computes nothing."""
    root = chain.exprs.get(chain.gemm)
    computes = any(n not in chain.merged_from and n is not chain.gemm and n.target not in RESHAPES
                   for n in chain.nodes)
    if not computes and not chain.merged_from:
        return 0.0, 0
    inter = float(intermediate_bytes(chain))
    written_anyway = any(chain.exprs[o] == root for o in outs)
    kernels = 1 + (len(chain.merged_from) - 1 if chain.merged_from else 0)
    return (inter if written_anyway else 2 * inter), kernels


def decide(chain: Chain, kernel, outs: list[fx.Node], settings) -> dict:
    """The estimate's numbers, or Refused when the fusion does not pay."""
    if not settings.profitability:
        return {}
    saved, kernels = unfused_work(chain, outs)
    m, n, k = problem_size(chain)
    work = _evtc.UnfusedWork()
    work.saved_bytes, work.kernels = saved, kernels
    if chain.grouped:
        b = chain.b if chain.merged is None else chain.merged.b_gate
        e = kernel._native.estimate(m, n, k, concrete(b.meta["val"].shape[0]), work)
    else:
        e = kernel._native.estimate(m, n, k, work)
    numbers = {"m": m, "n": n, "k": k, "fused_us": e.fused_us, "cublas_us": e.cublas_us,
               "epilogue_us": e.epilogue_us, "saved_bytes": e.saved_bytes, "config": e.config, "basis": e.basis}
    if not e.profitable:
        raise Refused(f"not profitable at {m}x{n}x{k}: {e.describe()}")
    return numbers

