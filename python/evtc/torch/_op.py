"""evtc's PyTorch operators: one fused GEMM + epilogue per call.

    outputs = torch.ops.evtc.gemm_epilogue(spec, a, b, operands)
    outputs = torch.ops.evtc.gemm_epilogue_merged(spec, a, sources, operands)
    y = torch.ops.evtc.grouped_gemm_epilogue(spec, x, w, offs, operands)
    y = torch.ops.evtc.grouped_gemm_epilogue_merged(spec, x, sources, offs, operands)
    y = torch.ops.evtc.stacked_linear(a, weights, biases)   # sibling projections (q, k, v) as one GEMM

The ops are implemented in C++ (python/src/torch_ops.cpp, the library evtc/_evtc_torch.so)
and registered with PyTorch's dispatcher there, so a call from Inductor's generated code runs
no Python: the spec (see ``_spec``) is resolved to its kernel and operand plan once per process.
This module loads the library and registers the ops' fake implementations (output shapes and
dtypes from the kernel's signature), so they trace under torch.compile and torch.export, with
dynamic shapes. The real implementations allocate only their outputs, so they are captured by
CUDA graphs.
"""
from __future__ import annotations

import functools
import json
import os
import threading

import torch

from .. import _evtc, _grouped, _kernel
from . import _spec


def _load_library(here: str = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) -> None:
    """Loads the op library from the package folder ``here``, after checking that it is there
    and was built against this torch."""
    path = os.path.join(here, "_evtc_torch.so")
    if not os.path.isfile(path):
        raise ImportError(
            "evtc was built without its PyTorch op library (torch was not importable when evtc was built): "
            "install torch first, then reinstall evtc with `pip install --no-build-isolation .` in the same "
            "environment")
    with open(os.path.join(here, "_evtc_torch.version")) as f:
        built_for = f.read().strip()
    if built_for != torch.__version__:
        raise ImportError(f"evtc's PyTorch op library was built against torch {built_for}, but this is torch "
                          f"{torch.__version__}: reinstall evtc (`pip install --no-build-isolation .`) with this torch")
    torch.ops.load_library(path)


_load_library()

# The dispatcher's overloads, looked up once (Inductor's generated code calls these).
GEMM_EPILOGUE = torch.ops.evtc.gemm_epilogue.default
GEMM_EPILOGUE_MERGED = torch.ops.evtc.gemm_epilogue_merged.default
GROUPED_GEMM_EPILOGUE = torch.ops.evtc.grouped_gemm_epilogue.default
GROUPED_GEMM_EPILOGUE_MERGED = torch.ops.evtc.grouped_gemm_epilogue_merged.default
FUSED_OPS = (GEMM_EPILOGUE, GEMM_EPILOGUE_MERGED, GROUPED_GEMM_EPILOGUE, GROUPED_GEMM_EPILOGUE_MERGED)


@functools.lru_cache(maxsize=None)
def spec_kernel(spec: str) -> tuple[_kernel.Kernel | _grouped.GroupedKernel, dict]:
    """The Python-side Kernel (or GroupedKernel) of a spec: what the FX pass asks about a
    chain (legality, configuration, cost) and compiles ahead; built once per process (parsing
    and passes, no nvcc). The op library builds its own from the same spec; compiled kernels
    are shared through the kernel cache."""
    s = json.loads(spec)
    if s.get("grouped"):
        o = _evtc.KernelOptions()
        for key, value in s["options"].items():
            setattr(o, key, value)
        return _grouped.GroupedKernel(s["expr"], o), s
    return _kernel.compile(s["expr"], **s["options"]), s


def _torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, _kernel._TORCH_DTYPES[name])


def _outputs_in_order(kernel: _kernel.Kernel, s: dict) -> list[_kernel.Operand]:
    by_name = {o.name: o for o in kernel.outputs}
    return [by_name[name] for name in s["outputs"]]


def _fake_dense(spec: str, a: torch.Tensor, n) -> list[torch.Tensor]:
    kernel, s = spec_kernel(spec)
    m = a.shape[0]
    return [a.new_empty(o.size(m, n), dtype=_torch_dtype(o.dtype)) for o in _outputs_in_order(kernel, s)]


def _fake_grouped(spec: str, x: torch.Tensor, n) -> torch.Tensor:
    kernel, _ = spec_kernel(spec)
    return x.new_empty(kernel.output_size(x.shape[0], n), dtype=_torch_dtype(kernel.output.dtype))


@torch.library.register_fake("evtc::gemm_epilogue")
def _gemm_epilogue_fake(spec, a, b, operands):
    return _fake_dense(spec, a, b.shape[1])


def _merged_n(spec: str, sources):
    # The op library reads the spec's recipes (one reader, also for fake tensors).
    return torch.ops.evtc._merged_n(spec, sources)


@torch.library.register_fake("evtc::gemm_epilogue_merged")
def _gemm_epilogue_merged_fake(spec, a, sources, operands):
    return _fake_dense(spec, a, _merged_n(spec, sources))


@torch.library.register_fake("evtc::grouped_gemm_epilogue")
def _grouped_gemm_epilogue_fake(spec, x, w, offs, operands):
    return _fake_grouped(spec, x, w.shape[2])


@torch.library.register_fake("evtc::grouped_gemm_epilogue_merged")
def _grouped_gemm_epilogue_merged_fake(spec, x, sources, offs, operands):
    return _fake_grouped(spec, x, _merged_n(spec, sources))


STACKED_LINEAR = torch.ops.evtc.stacked_linear.default


@torch.library.register_fake("evtc::stacked_linear")
def _stacked_linear_fake(a, weights, biases):
    n = sum(w.shape[0] for w in weights)
    return a.new_empty((a.shape[0], n))


def rows_of_one_buffer(parts: list[torch.Tensor]) -> bool:
    """Whether ``parts`` lie one after the other along dimension 0 of one buffer (same dtype,
    strides and trailing sizes), so that ``stacked_linear`` reads them in place: the op
    library's rule, on real or fake tensors (a missing part, None, is none of them)."""
    parts = list(parts)
    return all(p is not None for p in parts) and bool(torch.ops.evtc._rows_of_one_buffer(parts))


def gemm_epilogue(spec: str, a: torch.Tensor, b: torch.Tensor, operands: list[torch.Tensor]) -> list[torch.Tensor]:
    """Runs ``torch.ops.evtc.gemm_epilogue`` (see the module's documentation)."""
    return GEMM_EPILOGUE(spec, a, b, operands)


def grouped_gemm_epilogue(spec: str, x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
                          operands: list[torch.Tensor]) -> torch.Tensor:
    """Runs ``torch.ops.evtc.grouped_gemm_epilogue`` (see the module's documentation)."""
    return GROUPED_GEMM_EPILOGUE(spec, x, w, offs, operands)


def path_counts(spec: str) -> dict[str, int]:
    """How many calls of a spec's op ran fused and how many ran unfused (cuBLASLt + the
    generated epilogue), in this process."""
    fused, fallback = torch.ops.evtc._path_counts(spec)
    return {"fused": fused, "fallback": fallback}


def merged_weights_bytes() -> int:
    """Device memory held by the interleaved (gate, up) weight copies of merged GEMMs."""
    return torch.ops.evtc._merged_cache_bytes()


def clear_merged_weights() -> None:
    """Frees the interleaved weight copies of merged GEMMs (rebuilt at their next call)."""
    torch.ops.evtc._clear_merged_cache()


_compile_only_lock = threading.Lock()


class compile_only:
    """Within this context, fused ops return uninitialised outputs instead of running, and
    their kernels start compiling in the background (as the context exits, for the sizes the
    ops were called with).

    For warming up many graphs at once: run each compiled model once inside the context
    (tracing every graph and queuing every kernel), then :func:`wait_for_compiles`; later calls
    run the compiled kernels. Results computed inside the context are meaningless. The mode is
    process-wide (autograd runs backward graphs on its own threads).
    """

    def __enter__(self):
        with _compile_only_lock:
            torch.ops.evtc._compile_only(1)
        return self

    def __exit__(self, *exc):
        with _compile_only_lock:
            torch.ops.evtc._compile_only(-1)
        _start_pending_compiles()
        return False


def _start_pending_compiles() -> None:
    """Starts the compiles that ops noted in compile-only mode (one per kernel and size)."""
    for entry in torch.ops.evtc._take_pending_compiles():
        m, n, k, spec = entry.split(",", 3)
        kernel = spec_kernel(spec)[0]
        _spec.created_specs.add(spec)
        if isinstance(kernel, _grouped.GroupedKernel):
            kernel.compile_async()
        else:
            kernel.compile_async(int(m), int(n), int(k))


def wait_for_compiles() -> dict[str, list[str]]:
    """Waits for every kernel compile started so far (by the FX pass, and for the calls made
    in :class:`compile_only`). Returns the compile errors by kernel expression (empty when all
    compiled); kernels that failed run unfused, never wrong."""
    _start_pending_compiles()
    failed: dict[str, list[str]] = {}
    for spec in list(_spec.created_specs):
        kernel = spec_kernel(spec)[0]
        if errors := kernel._wait_for_compiles():
            failed[kernel.expr] = errors
    return failed
