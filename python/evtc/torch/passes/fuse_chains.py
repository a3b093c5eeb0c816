"""fuse_chains: each GEMM (mm, addmm, _scaled_mm, _grouped_mm) and the pointwise consumers that
follow it become one fused op, where legal and where the cost model says it pays. Chains that
cannot be fused leave the graph unchanged; the reason goes into the report."""
from __future__ import annotations

import logging

from torch import fx

from ... import _library
from .. import _op, _spec
from .._chain import Chain, Refused
from .._fusion import (Fusion, check_output_shapes, escaping, expression, grow_trimmed, is_static, kernel_options,
                       problem_size, replace, spec_kernel_or_refuse, value_bytes)
from .._gemm import GEMMS, UNSUPPORTED_GEMMS, start_chain
from . import profitability


log = logging.getLogger("evtc.torch")

# Where no nvcc exists, only kernels a kernel library holds can run fused.
NO_COMPILER = ("no nvcc here to compile its kernel, and no kernel library holds it (see "
               "evtc.add_kernel_library / EVTC_KERNEL_LIBRARY)")


def residual_sums(settings) -> str:
    """Settings.residual_sums as the chains apply it: with eager's roundings (cast_mode
    "eager") a residual sum is rounded where it is computed, so "f32" would store the rounded
    sum in twice the bytes: it is stored in its dtype."""
    if settings.residual_sums == "f32" and settings.cast_mode == "eager":
        return "rounded"
    return settings.residual_sums


def run(graph: fx.Graph, settings, report) -> None:
    sums = residual_sums(settings)
    for node in list(graph.nodes):
        if node.graph is not graph or node.op != "call_function":
            continue
        if node.target not in GEMMS and node.target not in UNSUPPORTED_GEMMS:
            continue
        try:
            chain = grow_trimmed(graph, lambda: start_chain(node), residual_sums=sums)
            try:
                report.fused.append(fuse(graph, chain, settings))
            except Refused as why:
                if not chain.reductions:
                    raise
                # The chain without its column sums (Inductor then sums the fused op's output),
                # where the kernel they need does not pay or cannot be built.
                log.debug("evtc: %s with the column sums %s refused (%s); trying it without them", node.name,
                          ", ".join(r.name for r in chain.reductions), why)
                chain = grow_trimmed(graph, lambda: start_chain(node), frozenset(chain.reductions), sums)
                report.fused.append(fuse(graph, chain, settings))
        except Refused as why:
            report.refused.append((node.name, str(why)))


def _log_epilogue(chain: Chain, expr: str, m, n, k) -> None:
    """What is decided on: the epilogue as evtc gets it (the report's line says what was decided),
    and the tensors from outside the chain that it computes again rather than reads
    (recomputed_operand: always where the tensors they come from are read anyway)."""
    log.debug("evtc: %s at %sx%sx%s with its epilogue:\n%s", chain.gemm.name, m, n, k,
              "\n".join("  " + line for line in expr.splitlines()))
    if chain.recomputed:
        members = set(chain.nodes)
        instead = [x for x in chain.recomputed if any(u in members for u in x.users)]
        log.debug("evtc: %s computes %s in its epilogue (%d op(s)) from tensors it reads, instead of reading "
                  "%s: %.1f MB not read", chain.gemm.name, ", ".join(x.name for x in instead), len(chain.recomputed),
                  "it" if len(instead) == 1 else "them", sum(value_bytes(x) for x in instead) / 1e6)


def fuse(graph: fx.Graph, chain: Chain, settings) -> Fusion:
    """Replaces a grown chain with its fused op (raises Refused, leaving the graph unchanged,
    when it cannot or should not be fused)."""
    outs = escaping(chain)
    if chain.grouped:
        return _fuse_grouped(graph, chain, settings, outs)
    expr, names, index_of = expression(chain, outs)
    operand_nodes = list(chain.operands)
    merged = chain.merged.spec() if chain.merged is not None else None
    spec = _spec.make_spec(expr, kernel_options(chain, settings), [chain.operands[o] for o in operand_nodes],
                           names, merged)
    kernel = spec_kernel_or_refuse(spec)
    m, n, k = problem_size(chain)
    if log.isEnabledFor(logging.DEBUG):
        _log_epilogue(chain, expr, m, n, k)
    if is_static(chain):
        if reason := kernel.fallback_reason(m, n, k):
            raise Refused(reason)
    elif reason := kernel.fallback_reason(0, 0, 0):  # what holds at every size (the architecture)
        raise Refused(reason)
    check_output_shapes(chain, outs)
    estimate = profitability.decide(chain, kernel, outs, settings)
    if not _library.compiler_available() and not kernel.in_library(m, n, k):
        raise Refused(NO_COMPILER)
    if settings.compile:
        # The configuration follows the problem's size: compile for the traced example size.
        kernel.compile_async(m, n, k)
        if not settings.wait_for_compile:  # the first calls run unfused
            kernel.compile_fallback_async()
    if chain.merged is None:
        op, inputs = _op.GEMM_EPILOGUE, [chain.a, chain.b, operand_nodes]
    else:
        op, inputs = _op.GEMM_EPILOGUE_MERGED, [chain.a, list(chain.merged.sources), operand_nodes]
    return replace(graph, chain, spec, op, inputs, kernel.hash, expr, index_of, outs, estimate)


def _fuse_grouped(graph: fx.Graph, chain: Chain, settings, outs) -> Fusion:
    """_grouped_mm + epilogue -> evtc::grouped_gemm_epilogue: one output, [N] row vectors and
    scalars as operands (what GroupedKernel runs)."""
    if len({chain.exprs[o] for o in outs}) != 1:
        raise Refused(f"a grouped GEMM writes one output, but {len(outs)} values of the chain "
                      f"({', '.join(o.name for o in outs)}) are used outside it")
    expr, _, _ = expression(chain, outs)
    operand_nodes = list(chain.operands)
    merged = chain.merged.spec() if chain.merged is not None else None
    spec = _spec.make_grouped_spec(expr, kernel_options(chain, settings),
                                   [chain.operands[o] for o in operand_nodes], merged)
    kernel = spec_kernel_or_refuse(spec)
    _, n, k = problem_size(chain)
    if is_static(chain) and (reason := kernel.shape_reason(n, k)):
        raise Refused(reason)
    check_output_shapes(chain, outs)
    estimate = profitability.decide(chain, kernel, outs, settings)
    if not _library.compiler_available() and not kernel.in_library():
        raise Refused(NO_COMPILER)
    if settings.compile:
        kernel.compile_async()
        if not settings.wait_for_compile:  # the first calls run unfused, group by group
            kernel.compile_fallback_async()
    if chain.merged is None:
        op, inputs = _op.GROUPED_GEMM_EPILOGUE, [chain.a, chain.b, chain.offsets, operand_nodes]
    else:
        op = _op.GROUPED_GEMM_EPILOGUE_MERGED
        inputs = [chain.a, list(chain.merged.sources), chain.offsets, operand_nodes]
    return replace(graph, chain, spec, op, inputs, kernel.hash, expr, None, outs, estimate)
