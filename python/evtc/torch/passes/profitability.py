"""profitability: fuse a chain only where it pays.

The unfused alternative is cuBLAS for the GEMM and Inductor's kernels for the epilogue. cuBLAS
writes the GEMM's M×N result; the epilogue then either runs in a kernel of its own (it reads
the result back and writes the chain's values) or, where the chain's values are read by an
op Inductor compiles into a kernel of its own making (a pointwise op, a reduction such as a
norm's mean), inside that kernel, which reads the GEMM's result instead of the fused op's
output. Fusion saves the difference, and costs whatever evtc's kernel is slower than cuBLAS at
the shape. evtc's cost model (C++, evtc/cost_model.hpp: the GEMM times from the tile grid and
the GPU's rates, measured) makes the call; this module says what the unfused path would do.

GEMMs with nothing to fuse: a chain whose values are only views of the GEMM's own result
(``mm`` alone, or ``addmm``/``_scaled_mm`` whose bias and scales cuBLAS applies too) saves no
epilogue work, so it runs in evtc's kernel only where that kernel is faster than cuBLAS's GEMM.
The model's rates alone do not decide that (they put evtc's main loop a few percent behind
cuBLAS's everywhere): the estimate must rest on the selection table's measurement of both
where it holds here (``FusionEstimate.measured``, C++ ``selection::measured_here``), say so by
more than the model's margin, and the shape must be static (a measurement at the traced size
says nothing of other sizes). ``evtc.bare_gemms=False`` leaves every such GEMM to cuBLAS.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
from torch import fx

from ... import _evtc

from .._chain import RESHAPES, Chain, Refused, concrete
from .._spec import AUX, AUX_COL
from .._fusion import intermediate_bytes, is_static, nothing_to_fuse, problem_size, value_bytes
from .._gemm import GEMMS, UNSUPPORTED_GEMMS


def _is_view(n: fx.Node) -> bool:
    """A node Inductor computes nothing for: a view of its input, or an item of a split."""
    if n.op != "call_function":
        return False
    if n.target is operator.getitem or n.target in RESHAPES:
        return True
    return isinstance(n.target, torch._ops.OpOverload) and n.target.is_view


def _makes_its_own_kernel(n: fx.Node) -> bool:
    """Whether Inductor compiles ``n`` into a kernel that can compute its inputs' pointwise
    producers (a pointwise op, a reduction), rather than calling a library kernel that reads
    its inputs from memory (GEMMs, attention, convolutions, evtc's own ops, graph outputs)."""
    if n.op != "call_function" or n.target in GEMMS or n.target in UNSUPPORTED_GEMMS:
        return False
    if not isinstance(n.target, torch._ops.OpOverload) or n.target.namespace not in ("aten", "prims"):
        return False
    from torch._inductor import decomposition, lowering  # Inductor's own tables of what it lowers how

    known = n.target in lowering.lowerings or n.target in decomposition.select_decomp_table()
    return known and n.target not in lowering.needs_realized_inputs and n.target not in lowering.fallbacks


def _consumers(n: fx.Node, members: set[fx.Node]) -> list[fx.Node]:
    """The nodes outside the chain that read ``n``'s value, looking through views."""
    out: list[fx.Node] = []
    for u in n.users:
        if u in members:
            continue
        out += _consumers(u, members) if _is_view(u) else [u]
    return out


@dataclass
class UnfusedPath:
    saved_bytes: float = 0.0
    kernels: int = 0  # epilogue kernels
    gemms: int = 1  # GEMMs over N (a merged chain's sources, each its own launch and tile grid)
    folded_into: list[str] = field(default_factory=list)  # consumers that would compute the epilogue
    # Nothing to fuse: the chain computes no more than cuBLAS's GEMM (views of its result).
    bare: bool = False


def unfused_path(chain: Chain, outs: list[fx.Node]) -> UnfusedPath:
    """What the unfused path spends beyond cuBLAS writing the GEMM's result, that fusion saves.

    Unfused, the epilogue reads the GEMM's result back (``inter`` bytes) and the chain's [m,n]
    operands, and writes each chain value that must exist in memory: one read by a library
    kernel or the graph's output, or by more than one consumer; a value read only by one kernel
    Inductor makes is computed inside that kernel instead and never written. Fused, evtc's kernel
    writes every value (the cost model counts those writes), and a consumer that would have
    computed a value reads it. An epilogue kernel of its own is saved only where some value is not
    computed in a consumer."""
    members = set(chain.nodes)
    root = chain.exprs.get(chain.gemm)
    computes = any(n not in chain.merged_from and n is not chain.gemm and n.target not in RESHAPES
                   for n in chain.nodes)
    if not computes and not chain.merged_from:
        return UnfusedPath(bare=True)
    path = UnfusedPath(saved_bytes=float(intermediate_bytes(chain)))
    own_kernel = False
    seen = {root}  # cuBLAS writes the GEMM's own result either way
    for o in outs:
        if chain.exprs[o] in seen:
            continue  # one output for values that differ only by a view
        seen.add(chain.exprs[o])
        consumers = _consumers(o, members)
        folding = [c for c in consumers if _makes_its_own_kernel(c)]
        if folding:
            path.folded_into.append(folding[0].name)
            # Read by that one consumer only, the value is never written unfused, and fused the
            # consumer reads it; with other readers the consumer's kernel writes it either way.
            if len(consumers) == 1:
                path.saved_bytes -= value_bytes(o)
        else:
            own_kernel = True
            path.saved_bytes += value_bytes(o)
    if own_kernel:
        # Inductor's kernel of its own reads the chain's [m,n] operands as well (the fused
        # kernel reads them too: the cost model prices that on its side). Measured on the H200:
        # SwiGLU's derivative after the down projection's data gradient, g and u read, took
        # 0.102 ms in Inductor's kernel, which the model put at 65.9 us without those reads.
        path.saved_bytes += sum(value_bytes(o) for o, (_, cls) in chain.operands.items() if cls in (AUX, AUX_COL))
    path.kernels = int(own_kernel)
    path.gemms = len(chain.merged_from) if chain.merged_from else 1
    return path


def decide(chain: Chain, kernel, outs: list[fx.Node], settings) -> dict:
    """The estimate's numbers, or Refused when the fusion does not pay. With profitability off
    (``evtc.profitability=False``) every legal fusion is made, and the numbers are still reported
    (what the model expected of a fusion it would have refused); a lone ``mm`` is not a fusion and
    stays with cuBLAS."""
    path = unfused_path(chain, outs)
    if not settings.profitability:
        if path.bare and chain.gemm.target is torch.ops.aten.mm.default and len(chain.nodes) == 1:
            raise Refused(nothing_to_fuse(chain))
        try:
            return _estimate(chain, kernel, path, settings)
        except Exception:  # what the model cannot price is made all the same
            return {}
    if path.bare:
        return _replace_cublas(chain, kernel, path, settings)
    return _estimate(chain, kernel, path, settings)


def _replace_cublas(chain: Chain, kernel, path: UnfusedPath, settings) -> dict:
    """A chain with nothing to fuse, run in evtc's kernel where that is measured to be faster
    than cuBLAS's GEMM at or near its shape (the module's docstring), else Refused."""
    what = nothing_to_fuse(chain)
    if not settings.bare_gemms:
        raise Refused(f"{what} (evtc.bare_gemms is off)")
    if not is_static(chain):
        raise Refused(f"{what}, and at symbolic sizes no measurement says evtc's kernel is faster than cuBLAS's at "
                      "every size")
    numbers, e = _numbers(chain, kernel, path)
    m, n, k = numbers["m"], numbers["n"], numbers["k"]
    if not e.measured:
        raise Refused(f"{what}, and at {m}x{n}x{k} no measurement says evtc's kernel is faster than cuBLAS's "
                      f"({e.describe()}; a GEMM alone leaves cuBLAS only on the selection table's measurements)")
    if not e.profitable:
        raise Refused(f"{what}, and at {m}x{n}x{k} evtc's kernel is not faster than cuBLAS's by the model's margin: "
                      f"{e.describe()}")
    numbers["replaces_cublas"] = True
    return numbers


def _numbers(chain: Chain, kernel, path: UnfusedPath):
    m, n, k = problem_size(chain)
    work = _evtc.UnfusedWork()
    work.saved_bytes, work.kernels, work.gemms = path.saved_bytes, path.kernels, path.gemms
    if chain.grouped:
        b = chain.b if chain.merged is None else chain.merged.b_gate
        e = kernel._native.estimate(m, n, k, concrete(b.meta["val"].shape[0]), work)
    else:
        e = kernel._native.estimate(m, n, k, work)
    numbers = {"m": m, "n": n, "k": k, "fused_us": e.fused_us, "cublas_us": e.cublas_us,
               "epilogue_us": e.epilogue_us, "saved_bytes": e.saved_bytes, "config": e.config, "basis": e.basis}
    return numbers, e


def _estimate(chain: Chain, kernel, path: UnfusedPath, settings) -> dict:
    numbers, e = _numbers(chain, kernel, path)
    m, n, k = numbers["m"], numbers["n"], numbers["k"]
    folded = ""
    if path.folded_into:
        numbers["folded_into"] = path.folded_into
        folded = f"; unfused, Inductor computes the epilogue inside the kernel of {', '.join(path.folded_into)}"
    if settings.profitability and not e.profitable:
        raise Refused(f"not profitable at {m}x{n}x{k}: {e.describe()}{folded}")
    return numbers
