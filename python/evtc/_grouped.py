"""evtc.grouped and GroupedKernel: a grouped (MoE) GEMM with a fused epilogue, called like
``torch._grouped_mm``."""
from __future__ import annotations

import concurrent.futures
from typing import Any, Optional

from . import _evtc
from ._kernel import (_TORCH_DTYPES, Operand, _Compiled, _is_torch_tensor, _require_cuda, _split_operands,
                      _torch_dlpack, dtype_name, require_cuda_array, require_option_types, require_out)


class GroupedKernel(_Compiled):
    """One grouped GEMM + epilogue over every group (expert) at once. Call it as
    ``kernel(x, w, offsets, **operands)``:

    - ``x``: the tokens, sum of M_g × K, row-major (rows sorted by group);
    - ``w``: G × K × N, as ``torch._grouped_mm`` takes its second operand. A kernel built with
      ``weights="nk"`` (the default) reads stacked ``nn.Linear`` weights ``W`` (G × N × K,
      K-major): pass ``W.transpose(1, 2)``; one built with ``weights="kn"`` reads a
      G × K × N array with N contiguous;
    - ``offsets``: G int32 END offsets on the device (group g is rows
      ``[offsets[g-1], offsets[g])``); empty groups are fine;
    - keyword operands: row vectors ``[n]`` as G × N (one row per group) or N (shared), pointer
      scalars as G values or one, by-value scalars as numbers;
    - ``scale_a``, ``scale_b`` (a kernel built with ``fp8_blockwise=True`` only; f32): x's scales,
      rows of x × ceil(K/128) (one per token row and 128 of K), and the weights' scales,
      G × ceil(K/128) × ceil(N/128) like ``w`` (one per 128×128 block). Read in place when
      ``scale_a`` is row-major and ``scale_b`` is the ``transpose(1, 2)`` of a contiguous
      G × ceil(N/128) × ceil(K/128) tensor (the scales of stacked ``nn.Linear`` weights); other
      strides are copied into that layout on the device first, within the call.

    Returns the one output, rows of x × N (or × N/2 for a gated epilogue), allocated for torch
    inputs (else pass ``out={name: array}``). No host synchronisation: the per-group tables are
    built on the device from ``offsets``, so the call can be captured in a CUDA graph.
    """

    def __init__(self, expr: str, options: _evtc.KernelOptions):
        self.expr = expr
        self._native = _evtc.GroupedKernel(expr, options)
        self._k_major = options.b_layout in ("col", "col_major")
        self._wait = options.wait_for_compile
        self._init_compiles()  # "fused" and "fallback"
        # "fused" or "fallback" after a call: fallback (cuBLASLt + the plain epilogue, group by
        # group) only while the fused kernel compiles with wait_for_compile off, or after that
        # compile failed
        self.last_path: Optional[str] = None
        self.signature = [Operand(**d) for d in self._native.signature]

    @property
    def config(self) -> str:
        return self._native.config

    @property
    def gated(self) -> bool:
        """Whether the output has one column per (gate, up) pair (N/2 columns)."""
        return self._native.gated

    @property
    def output(self) -> Operand:
        name = self._native.output_name
        return next(o for o in self.signature if o.name == name)

    @property
    def source(self) -> str:
        """The generated CUDA source."""
        return self._native.source

    def shape_reason(self, n: int, k: int) -> str:
        """Why problems with N output columns and K this kernel cannot run; empty when it can."""
        return self._native.shape_reason(n, k)

    def output_size(self, rows: int, n: int) -> tuple[int, int]:
        return (rows, n // 2 if self.gated else n)

    def in_library(self) -> bool:
        """Whether a kernel library (:func:`evtc.add_kernel_library`) holds this kernel."""
        return self._native.in_library()

    def compile(self) -> str:
        """Compiles the kernel now (or finds it in the disk cache); needs nvcc and the CUTLASS
        headers, not a GPU. Returns the library path."""
        return self.compile_async().result()

    def compile_async(self) -> concurrent.futures.Future:
        """Starts compiling in a background thread; calls wait for it."""
        return self._start_once("fused", self._native.compile)

    def compile_fallback_async(self) -> concurrent.futures.Future:
        """Starts compiling the unfused path's plain epilogue (about a second) in a background
        thread: what calls run while the fused kernel compiles, with wait_for_compile off."""
        return self._start_once("fallback", self._native.compile_fallback)

    def __call__(self, x: Any, w: Any, offsets: Any, *, out: Optional[dict[str, Any]] = None,
                 stream: Optional[int] = None, scale_a: Any = None, scale_b: Any = None,
                 **operands: Any) -> Any:
        # A failed background compile raises again (with nvcc's message) from the run; with
        # wait_for_compile off the call runs unfused instead, until the fused kernel is ready.
        require_out(out)
        if not _is_torch_tensor(x):
            for what, array in (("x", x), ("w", w), ("offsets", offsets)):
                require_cuda_array(array, what)
        if self._wait:
            self._wait_for_compiles()
        name = self._native.output_name
        outputs = dict(out or {})
        tensors, scalars = _split_operands(operands)
        if scale_b is not None and len(getattr(scale_b, "shape", ())) != 3:
            raise _evtc.UserError(f"scale_b has shape {list(getattr(scale_b, 'shape', []))}: expected "
                                  "G × ceil(K/128) × ceil(N/128), oriented like w")
        scales = {n: t for n, t in (("scale_a", scale_a), ("scale_b", scale_b)) if t is not None}
        # "@" names cannot be operands: the native layer binds them as the block scales.
        tensors.update({"@" + n: t for n, t in scales.items()})
        if not _is_torch_tensor(x):
            if name not in outputs:
                raise _evtc.UserError(f"output '{name}' was not given: pass out={{'{name}': array}} "
                                      "(outputs are allocated only for torch tensors)")
            tensors.update(outputs)
            self.last_path = self._native.run(x, w, offsets, tensors, {}, scalars, self._k_major, int(stream or 0))
            return outputs[name]

        import torch

        if w.dim() != 3:
            raise _evtc.UserError(f"w has shape {list(w.shape)}: expected G × K × N (3 dimensions)")
        _require_cuda([("x", x), ("w", w), ("offsets", offsets), *operands.items(), *outputs.items(),
                       *scales.items()])
        if name not in outputs:
            outputs[name] = torch.empty(self.output_size(int(x.shape[0]), int(w.shape[2])),
                                        dtype=getattr(torch, _TORCH_DTYPES[self.output.dtype]),
                                        device=x.device)
        tensors.update(outputs)
        dtypes: dict[str, str] = {}
        arrays = {n: _torch_dlpack(t, n, dtypes) for n, t in [("x", x), ("w", w), ("offsets", offsets),
                                                              *tensors.items()]}
        if stream is None:
            stream = torch.cuda.current_stream(x.device).cuda_stream
        with torch.cuda.device(x.device):
            xa, wa, oa = arrays.pop("x"), arrays.pop("w"), arrays.pop("offsets")
            self.last_path = self._native.run(xa, wa, oa, arrays, dtypes, scalars, self._k_major, int(stream))
        return outputs[name]

    def __repr__(self) -> str:
        o = self.output
        return f"<evtc.GroupedKernel {self.hash} -> {o.name}: {o.dtype}{'[m,n/2]' if self.gated else ''}>"


def grouped(expr: str, *, dtype: Any = "bf16", weights: str = "nk", cast_mode: str = "eager",
            precise_math: bool = False, config: Optional[str] = None, operand_dtype: Any = None,
            output_dtype: Any = "bf16", wait_for_compile: bool = True, arch: Optional[str] = None,
            fp8_blockwise: bool = False) -> GroupedKernel:
    """Parses ``expr`` and returns a :class:`GroupedKernel` (docs/grouped.md).

    ``dtype`` is x's and w's (``"bf16"``, ``"f16"``, or fp8 ``"f8e4m3"``/``"f8e5m2"``, which
    need ``weights="nk"``); ``weights`` ``"nk"`` (each group's weights N×K, K-major: stacked
    ``nn.Linear`` weights) or ``"kn"`` (K×N, N-major); ``fp8_blockwise=True`` (fp8 only) builds a
    block-scaled kernel that takes ``scale_a`` and ``scale_b`` with each call (see
    :class:`GroupedKernel`); ``operand_dtype`` is undeclared operands' (default bf16, or f32
    for fp8);
    ``config`` fixes a kernel configuration. With ``wait_for_compile=False`` a call whose fused
    kernel is not compiled yet runs unfused (one cuBLASLt GEMM + the plain epilogue per
    non-empty group, after reading ``offsets`` back to the host) while the kernel compiles in
    the background; ``kernel.last_path`` says which ran. On an ``arch`` other than sm90 (by
    default the current device's; ``EVTC_ARCH`` overrides it) every call runs that unfused path.
    The other options are
    :func:`evtc.compile`'s.
    Epilogues a grouped kernel cannot run (``[m]``/``[m,n]`` operands, C, reductions, a
    second output) raise :class:`evtc.UserError` naming the operand.
    """
    require_option_types(expr, strings={"weights": weights, "cast_mode": cast_mode},
                         flags={"precise_math": precise_math, "wait_for_compile": wait_for_compile,
                                "fp8_blockwise": fp8_blockwise},
                         config=config, arch=arch)
    if weights not in ("nk", "kn"):
        raise _evtc.UserError(f"weights: '{weights}' is not a weight layout (expected 'nk' or 'kn')")
    o = _evtc.KernelOptions()
    o.a_dtype = o.b_dtype = dtype_name(dtype, "dtype")
    o.a_layout, o.b_layout = "row", "col" if weights == "nk" else "row"
    o.cast_mode, o.precise_math, o.config = cast_mode, precise_math, config
    if operand_dtype is None:
        operand_dtype = "f32" if o.a_dtype.startswith("f8") else "bf16"
    o.operand_dtype = dtype_name(operand_dtype, "operand_dtype")
    o.fp8_blockwise = fp8_blockwise
    o.output_dtype = dtype_name(output_dtype, "output_dtype")
    o.wait_for_compile = wait_for_compile
    o.arch = arch
    return GroupedKernel(expr, o)
