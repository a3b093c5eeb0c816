"""evtc for PyTorch: a custom op, an FX fusion pass and a torch.compile backend.

    import evtc.torch
    model = torch.compile(model, backend=evtc.torch.backend)

The backend is Inductor with :class:`PostGradPass`, which finds ``mm``/``addmm``/``_scaled_mm``
nodes and their pointwise consumers (arithmetic, activations, clamps, casts, reshapes, broadcast
operands, the ``h[:, 0::2]``/``h[:, 1::2]`` slices of gated activations) and replaces each chain
with one ``torch.ops.evtc.gemm_epilogue`` call running a fused CUTLASS kernel; ``_grouped_mm``
chains become one ``torch.ops.evtc.grouped_gemm_epilogue``. Chains it cannot fuse stay as they are; ``EVTC_DEBUG=1`` prints what was fused
and why the rest was not.
"""
from __future__ import annotations

from ._backend import PostGradPass, backend
from ._fx_pass import Fusion, FusionReport, fuse_gemm_epilogues, reports
from ._op import (compile_only, gemm_epilogue, grouped_gemm_epilogue, make_grouped_spec, make_spec,
                  wait_for_compiles)

__all__ = [
    "Fusion",
    "FusionReport",
    "PostGradPass",
    "backend",
    "compile_only",
    "fuse_gemm_epilogues",
    "gemm_epilogue",
    "grouped_gemm_epilogue",
    "make_grouped_spec",
    "make_spec",
    "reports",
    "wait_for_compiles",
]
