"""evtc: fused GEMM epilogues for NVIDIA GPUs (Hopper, Ampere-class, and compile-checked Blackwell kernels).

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

import importlib.util as _importlib_util
import os as _os

# The native library finds its device headers beside itself (evtc/include), and the CUTLASS
# headers from EVTC_CUTLASS_DIR / CUTLASS_DIR, else those the package was built with
# (evtc/cutlass/include), else those of the nvidia-cutlass package when it is installed (the
# fallback this module passes it; the order is the library's, src/jit/toolchain.cpp).
from . import _evtc  # noqa: E402
from ._evtc import (  # noqa: E402
    ArgumentTypeError,
    Error,
    EvtcRuntimeError,
    InternalError,
    ParseError,
    UserError,
)
from ._log import log_level, set_log_level  # noqa: E402


def _use_cutlass_package() -> None:
    try:
        spec = _importlib_util.find_spec("cutlass_library")
    except (ImportError, ValueError):
        return
    folders = (spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        include = _os.path.join(folder, "source", "include")
        if _os.path.isfile(_os.path.join(include, "cutlass", "cutlass.h")):
            _evtc.set_cutlass_fallback_dir(include)
            return


_use_cutlass_package()
from ._explain import Explanation, explain  # noqa: E402
from ._gated import deinterleave_gate_up, interleave_gate_up  # noqa: E402
from ._grouped import GroupedKernel, grouped  # noqa: E402
from ._kernel import Kernel, Operand, compile, dtype_name  # noqa: E402
from ._library import (  # noqa: E402
    add_kernel_library,
    build_kernel_library,
    compiler_available,
    compiler_runs,
    kernel_libraries,
    kernel_library_gpu,
    kernel_library_gpus,
    toolchain,
    preset_kernel_list,
    read_kernel_library,
    record_kernels,
)

__version__ = _evtc.version()  # CMakeLists.txt's project(VERSION), as the library and the CLI report it


def compile_events() -> list[dict]:
    """The kernels this process compiled with nvcc (``what == "compiled"``) or waited for while
    another process compiled them into the shared cache (``"waited"``), in the order they
    finished: dicts with ``key`` (the cache entry), ``label``, ``what`` and ``seconds``."""
    return list(_evtc.compile_events())


def parse(expr: str, dtype: str = "bf16") -> str:
    """Parses an epilogue expression and returns its canonical IR text (before any pass).

    Raises :class:`ParseError` (with ``line`` and ``column``) for a malformed expression.
    """
    return _evtc.parse(expr, dtype_name(dtype, "dtype"))


def pass_names() -> list[str]:
    """The passes of the pipeline, in the order they run."""
    return list(_evtc.pass_names())


__all__ = [
    "ArgumentTypeError",
    "compile_events",
    "log_level",
    "set_log_level",
    "add_kernel_library",
    "build_kernel_library",
    "compiler_available",
    "compiler_runs",
    "toolchain",
    "kernel_libraries",
    "kernel_library_gpu",
    "kernel_library_gpus",
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
