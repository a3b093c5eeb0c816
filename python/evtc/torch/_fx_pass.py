"""The FX pass: GEMMs and their pointwise consumer chains -> evtc's fused ops.

Works on ATen-level FX graphs with tensor metadata (node.meta["val"]): Inductor's post-grad
graphs (forward, backward, inference), or make_fx / torch.export graphs. The passes it runs,
in order, are listed in ``passes/__init__.py``. A chain that cannot (or should not) be fused
leaves the graph unchanged; the reason is recorded in the FusionReport (and logged at debug
level: EVTC_LOG=debug, or TORCH_LOGS="+evtc").
"""
from __future__ import annotations

import logging
from typing import Any

from torch import fx

from .._log import sync_native_level
from . import passes
from ._fusion import Fusion
from .passes import FusionReport, Settings

log = logging.getLogger("evtc.torch")

# Reports of every graph the pass has rewritten, in order (tests and the debug log read them).
reports: list[FusionReport] = []

__all__ = ["Fusion", "FusionReport", "fuse_gemm_epilogues", "reports"]


def fuse_gemm_epilogues(graph: fx.Graph, **settings: Any) -> FusionReport:
    """Rewrites the GEMM + epilogue chains of ``graph`` into evtc's fused ops.

    The keywords are the pass's settings (``evtc.torch.passes.Settings``, which holds their
    defaults); a name that is not one raises TypeError. ``cast_mode`` is evtc's ("compile", the
    default: round as Inductor's kernels would, the GEMM's result and the outputs; "eager": round
    where eager rounds; "fast": round only at outputs).
    With ``compile``, each new kernel starts compiling in the background right away.
    ``merge_gated`` merges GEMMs that meet in a gated activation (under CUDA graphs only with
    frozen weights: see passes/merge_gated.py). With ``profitability``, a chain is fused only
    where the cost model expects it to be faster than cuBLAS + Inductor's kernels. With
    ``bare_gemms`` (and ``profitability``), a GEMM with nothing to fuse runs in evtc's kernel where
    the selection table measured it faster than cuBLAS's at or near its (static) shape. Without
    ``wait_for_compile`` a fused op whose kernel is still compiling runs unfused (cuBLASLt + the
    plain epilogue) and switches to the fused kernel when it is ready; with it, the op's first
    call waits for the compile. A grouped (MoE) op's unfused path runs one cuBLASLt GEMM + the
    plain epilogue per non-empty group (after reading the offsets back to the host). With
    ``stack_siblings``, GEMMs left alone that read one input through weights stacked in one buffer
    (q/k/v after ``evtc.torch.merge_projections``) run as one GEMM (passes/stack_siblings.py).
    ``precise_math`` builds the fused kernels with full-precision tanh, exp, erf and division, as
    Inductor's kernels compute them (the fast forms otherwise: include/evtc/device/math.cuh).
    """
    sync_native_level()  # a level set through Python's logging (TORCH_LOGS) reaches compile messages
    report = passes.run(graph, Settings.of(**settings))
    reports.append(report)
    log.debug("%s", report.summary())
    return report
