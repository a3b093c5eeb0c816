"""evtc: fused GEMM epilogues for Hopper GPUs.

    import evtc
    kernel = evtc.compile("out D: bf16 = silu(acc + bias[n])")
    d = kernel(a, w.t(), bias=bias)          # torch CUDA tensors: D = silu(a @ w.t() + bias)

``evtc.compile`` parses an epilogue expression (docs/expressions.md), runs the pass pipeline
and returns a :class:`Kernel`; the CUTLASS kernel itself is compiled with nvcc on first use
(or ahead of time with ``Kernel.compile``) and cached on disk. ``evtc.grouped`` builds a
grouped (mixture-of-experts) GEMM with a fused epilogue. ``evtc.explain`` shows the IR
after every pass. Kernel libraries (``evtc.build_kernel_library``, ``evtc.add_kernel_library``)
hold kernels compiled ahead of time, for machines without nvcc. The PyTorch integration (custom op, FX pass, ``torch.compile`` backend)
lives in ``evtc.torch``.
"""
from __future__ import annotations

import os as _os

# The JIT compiles generated kernels against evtc's device headers; an installed package
# carries them beside the extension.
_headers = _os.path.join(_os.path.dirname(__file__), "include")
if _os.path.isfile(_os.path.join(_headers, "evtc", "device", "ops.cuh")):
    _os.environ.setdefault("EVTC_INCLUDE_DIR", _headers)

from . import _evtc  # noqa: E402
from ._evtc import (  # noqa: E402
    Error,
    EvtcRuntimeError,
    InternalError,
    ParseError,
    UserError,
)
from ._explain import Explanation, explain  # noqa: E402
from ._gated import deinterleave_gate_up, interleave_gate_up  # noqa: E402
from ._grouped import GroupedKernel, grouped  # noqa: E402
from ._kernel import Kernel, Operand, compile  # noqa: E402
from ._library import (  # noqa: E402
    add_kernel_library,
    build_kernel_library,
    compiler_available,
    compiler_runs,
    kernel_libraries,
    preset_kernel_list,
    read_kernel_library,
    record_kernels,
)

__version__ = "0.1.0"


def parse(expr: str, dtype: str = "bf16") -> str:
    """Parses an epilogue expression and returns its canonical IR text (before any pass).

    Raises :class:`ParseError` (with ``line`` and ``column``) for a malformed expression.
    """
    return _evtc.parse(expr, dtype)


def pass_names() -> list[str]:
    """The passes of the pipeline, in the order they run."""
    return list(_evtc.pass_names())


__all__ = [
    "add_kernel_library",
    "build_kernel_library",
    "compiler_available",
    "compiler_runs",
    "kernel_libraries",
    "preset_kernel_list",
    "read_kernel_library",
    "record_kernels",
    "Error",
    "EvtcRuntimeError",
    "Explanation",
    "GroupedKernel",
    "InternalError",
    "Kernel",
    "Operand",
    "ParseError",
    "UserError",
    "compile",
    "deinterleave_gate_up",
    "explain",
    "grouped",
    "interleave_gate_up",
    "parse",
    "pass_names",
]
