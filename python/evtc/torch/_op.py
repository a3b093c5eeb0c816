"""The custom ops evtc::gemm_epilogue and evtc::grouped_gemm_epilogue: one fused GEMM +
epilogue as a PyTorch operator.

    outputs = torch.ops.evtc.gemm_epilogue(spec, a, b, operands)
    y = torch.ops.evtc.grouped_gemm_epilogue(spec, x, w, offs, operands)

``spec`` is a JSON string (see :func:`make_spec`): the epilogue expression, the kernel
options, the names and broadcast classes of ``operands`` (in order) and the names of the
outputs to return (in order). ``a`` is M×K, ``b`` K×N; each output is M×N (or a vector for
reductions). The op has a fake (meta) implementation, so it traces under torch.compile and
torch.export, with dynamic shapes, and its real implementation allocates only its outputs,
so it can be captured in CUDA graphs.

The grouped op takes ``torch._grouped_mm``'s operands (x: sum of M_g × K, w: G × K × N, offs:
int32 end offsets) and returns the epilogue's one output (sum of M_g × N, or × N/2 when
gated); its operands are [N] row vectors and scalars.
"""
from __future__ import annotations

import functools
import json
import threading
import torch

from .. import _evtc, _grouped, _kernel

# Broadcast classes of an operand of the M×N epilogue (how the op reads the tensor it gets).
ROW, COL, SCALAR, AUX, AUX_COL = "row", "col", "scalar", "aux", "aux_col"

# Depth of compile_only contexts. Process-wide, not per thread: autograd runs backward graphs
# on its own threads.
_compile_only_depth = 0
_compile_only_lock = threading.Lock()


def make_spec(expr: str, options: dict, operands: list[tuple[str, str]], outputs: list[str]) -> str:
    """The op's spec string. ``operands`` is [(name, class)], class one of row, col, scalar,
    aux, aux_col; ``outputs`` the output names to return, in order."""
    return json.dumps({"expr": expr, "options": options, "operands": [list(o) for o in operands],
                       "outputs": outputs}, sort_keys=True)


def make_grouped_spec(expr: str, options: dict, operands: list[tuple[str, str]]) -> str:
    """The grouped op's spec string (``operands`` as for :func:`make_spec`: row or scalar)."""
    return json.dumps({"expr": expr, "options": options, "operands": [list(o) for o in operands],
                       "grouped": True}, sort_keys=True)


@functools.lru_cache(maxsize=None)
def spec_kernel(spec: str) -> tuple[_kernel.Kernel | _grouped.GroupedKernel, dict]:
    """The Kernel (or GroupedKernel) of a spec (built once per process: parsing and passes,
    no nvcc)."""
    s = json.loads(spec)
    if s.get("grouped"):
        o = _evtc.KernelOptions()
        for key, value in s["options"].items():
            setattr(o, key, value)
        return _grouped.GroupedKernel(s["expr"], o), s
    return _kernel.compile(s["expr"], **s["options"]), s


def _operand_view(t: torch.Tensor, cls: str, m: int, n: int) -> torch.Tensor:
    """The tensor the kernel reads for an operand of broadcast class ``cls``: a vector, a 0-d
    scalar or an M×N matrix, as a view of ``t`` where its strides allow, else a copy."""
    if cls == SCALAR:
        return t[(0,) * t.dim()] if t.dim() else t
    if cls == ROW:
        while t.dim() > 1:
            t = t[0]
        return t if t.stride(0) == 1 else t.contiguous()
    if cls == COL:
        t = t[..., 0].reshape(m)
        return t if t.stride(0) == 1 else t.contiguous()
    t = t.reshape(m, n)
    if cls == AUX:
        return t if t.stride() == (n, 1) else t.contiguous()
    return t if t.stride() == (1, m) else t.t().contiguous().t()


def _torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, _kernel._TORCH_DTYPES[name])


@torch.library.custom_op("evtc::gemm_epilogue", mutates_args=())
def gemm_epilogue(spec: str, a: torch.Tensor, b: torch.Tensor,
                  operands: list[torch.Tensor]) -> list[torch.Tensor]:
    kernel, s = spec_kernel(spec)
    m, n = a.shape[0], b.shape[1]
    if _compile_only_depth:
        kernel.compile_async(m, n, a.shape[1])
        return [torch.empty(o.size(m, n), dtype=_torch_dtype(o.dtype), device=a.device)
                for o in _outputs_in_order(kernel, s)]
    named = {name: _operand_view(t, cls, m, n) for (name, cls), t in zip(s["operands"], operands)}
    result = kernel(a, b, **named)
    if not isinstance(result, dict):
        return [result]
    return [result[name] for name in s["outputs"]]


@gemm_epilogue.register_fake
def _gemm_epilogue_fake(spec: str, a: torch.Tensor, b: torch.Tensor,
                        operands: list[torch.Tensor]) -> list[torch.Tensor]:
    kernel, s = spec_kernel(spec)
    m, n = a.shape[0], b.shape[1]
    return [a.new_empty(o.size(m, n), dtype=_torch_dtype(o.dtype)) for o in _outputs_in_order(kernel, s)]


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when its data starts 16-byte aligned, else an aligned copy."""
    return t if t.data_ptr() % 16 == 0 else t.clone(memory_format=torch.contiguous_format)


def _grouped_inputs(kernel: _grouped.GroupedKernel, x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor):
    """x, w and offs in the layout the grouped kernel reads (copies only where they differ)."""
    dense = torch.contiguous_format
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        x = x.clone(memory_format=dense)
    if kernel._k_major:  # each group's K×N with K contiguous: a transposed stack of N×K matrices
        if w.stride(1) != 1 or w.stride(2) % 8 or w.stride(0) % 8 or w.data_ptr() % 16:
            w = w.transpose(1, 2).clone(memory_format=dense).transpose(1, 2)
    elif w.stride(2) != 1 or w.stride(1) % 8 or w.stride(0) % 8 or w.data_ptr() % 16:
        w = w.clone(memory_format=dense)
    if offs.dtype != torch.int32 or offs.stride(0) != 1:
        offs = offs.to(torch.int32).contiguous()
    return x, w, offs


@torch.library.custom_op("evtc::grouped_gemm_epilogue", mutates_args=())
def grouped_gemm_epilogue(spec: str, x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
                          operands: list[torch.Tensor]) -> torch.Tensor:
    kernel, s = spec_kernel(spec)
    rows, n = x.shape[0], w.shape[2]
    if _compile_only_depth:
        kernel.compile_async()
        return torch.empty(kernel.output_size(rows, n), dtype=_torch_dtype(kernel.output.dtype), device=x.device)
    x, w, offs = _grouped_inputs(kernel, x, w, offs)
    named = {name: _aligned(_operand_view(t, cls, rows, n)) for (name, cls), t in zip(s["operands"], operands)}
    return kernel(x, w, offs, **named)


@grouped_gemm_epilogue.register_fake
def _grouped_gemm_epilogue_fake(spec: str, x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
                                operands: list[torch.Tensor]) -> torch.Tensor:
    kernel, _ = spec_kernel(spec)
    return x.new_empty(kernel.output_size(x.shape[0], w.shape[2]), dtype=_torch_dtype(kernel.output.dtype))


def _outputs_in_order(kernel: _kernel.Kernel, s: dict) -> list[_kernel.Operand]:
    by_name = {o.name: o for o in kernel.outputs}
    return [by_name[name] for name in s["outputs"]]


class compile_only:
    """Within this context, fused ops start their kernel's nvcc compile in the background and
    return uninitialised outputs instead of running.

    For warming up many graphs at once: run each compiled model once inside the context
    (tracing every graph and queuing every kernel), then :func:`wait_for_compiles`; later calls
    run the compiled kernels. Results computed inside the context are meaningless.
    """

    def __enter__(self):
        global _compile_only_depth
        with _compile_only_lock:
            _compile_only_depth += 1
        return self

    def __exit__(self, *exc):
        global _compile_only_depth
        with _compile_only_lock:
            _compile_only_depth -= 1
        return False


def wait_for_compiles() -> dict[str, list[str]]:
    """Waits for every kernel compile started so far. Returns the compile errors by kernel
    expression (empty when all compiled); kernels that failed run unfused, never wrong."""
    failed = {}
    for spec in _known_specs():
        kernel = spec_kernel(spec)[0]
        if errors := kernel._wait_for_compiles():
            failed[kernel.expr] = errors
    return failed


def _known_specs() -> list[str]:
    # lru_cache keeps no public key list; the pass records every spec it creates.
    from . import _fx_pass

    return list(_fx_pass.created_specs)
