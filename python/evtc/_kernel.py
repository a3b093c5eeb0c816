"""evtc.compile and Kernel: one compiled epilogue, called on DLPack arrays."""
from __future__ import annotations

import concurrent.futures
import threading
from dataclasses import dataclass
from typing import Any, Optional, Union

from . import _evtc

# dtype names evtc uses -> torch dtype attribute names (the native dtype table's).
_TORCH_DTYPES = dict(_evtc.torch_dtype_names())


@dataclass(frozen=True)
class Operand:
    """One input or output of a kernel.

    ``shape`` is ``"full"`` (M×N), ``"half"`` (M×N/2, a gated output), ``"row"`` (length N), ``"col"`` (length M) or ``"scalar"``;
    ``kind`` is the IR node kind (``aux``, ``row_vec``, ``col_vec``, ``scalar``,
    ``scalar_value`` for by-value parameters, ``source`` for C; ``store``/``reduction`` for
    outputs).
    """

    name: str
    dtype: str
    shape: str
    layout: str
    output: bool
    kind: str

    def size(self, m: int, n: int) -> tuple[int, ...]:
        return {"full": (m, n), "half": (m, n // 2), "row": (n,), "col": (m,), "scalar": ()}[self.shape]


_compile_pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
_compile_pool_lock = threading.Lock()


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    """Threads that wait for background compiles. The native layer bounds how many CUTLASS
    kernels compile at once (EVTC_COMPILE_JOBS, default the CPU count) and lets the plain
    epilogues of the unfused path (about a second each) through at once, so these threads only
    wait: enough of them that a plain epilogue's compile never queues behind fused kernels."""
    global _compile_pool
    with _compile_pool_lock:
        if _compile_pool is None:
            _compile_pool = concurrent.futures.ThreadPoolExecutor(64, thread_name_prefix="evtc-nvcc")
        return _compile_pool


def dtype_name(value: Any, what: str) -> str:
    """evtc's name of a dtype given as a name (``"bf16"``, ``"bfloat16"``, ``"e4m3"``, ...), a
    ``torch.dtype`` or a NumPy dtype: the native layer parses the name (one list of names and
    aliases, evtc's and PyTorch's spellings). Raises :class:`evtc.ArgumentTypeError` naming
    ``what`` for anything else."""
    if isinstance(value, str):
        return value
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        return str(value).removeprefix("torch.")  # torch.bfloat16 -> "bfloat16"
    if type(value).__module__.startswith("numpy") and hasattr(value, "name"):
        return str(value.name)
    raise _evtc.ArgumentTypeError(f"{what}: expected a dtype ({', '.join(_evtc.dtype_names())}, or a torch.dtype), "
                                  f"got {type(value).__name__} {value!r}")


def require_type(value: Any, types: Union[type, tuple[type, ...]], what: str, expected: str) -> None:
    """Raises :class:`evtc.ArgumentTypeError` naming ``what`` unless ``value`` is one of
    ``types`` (``bool`` only where ``bool`` is named: it is an ``int`` too)."""
    types = types if isinstance(types, tuple) else (types,)
    ok = isinstance(value, types) and (bool in types or not isinstance(value, bool))
    if not ok:
        raise _evtc.ArgumentTypeError(f"{what}: expected {expected}, got {type(value).__name__} {_short(value)}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def require_option_types(expr: Any, *, strings: dict[str, Any], flags: dict[str, Any], config: Any,
                         arch: Any) -> None:
    """The types of the options evtc.compile and evtc.grouped take: the expression a str,
    ``strings`` str, ``flags`` bool, ``config`` and ``arch`` a str or None (their values are
    checked by the native layer)."""
    require_type(expr, str, "expr", "the expression's text (a str)")
    for name, value in strings.items():
        require_type(value, str, name, "a str")
    for name, value in flags.items():
        require_type(value, bool, name, "True or False")
    require_type(config, (str, type(None)), "config", "a configuration name (a str) or None")
    require_type(arch, (str, type(None)), "arch", "an architecture name such as \"sm90\" (a str) or None")


def require_out(out: Any) -> None:
    """``out=`` is None or a dict of output arrays by name."""
    if out is not None and not isinstance(out, dict):
        raise _evtc.ArgumentTypeError(f"out: expected a dict of output arrays by name (out={{'D': array}}), "
                                      f"got {type(out).__name__}")


def require_cuda_array(value: Any, what: str) -> None:
    """Raises naming ``what`` unless ``value`` is an array in CUDA memory: an
    :class:`evtc.ArgumentTypeError` for something that is no array (None, a str, a number),
    an :class:`evtc.UserError` for an array elsewhere (a NumPy array in host memory)."""
    if not hasattr(value, "__dlpack__"):
        raise _evtc.ArgumentTypeError(f"{what}: expected a CUDA array (a torch tensor, or any array with __dlpack__), "
                                      f"got {type(value).__name__} {_short(value)}")
    device = getattr(value, "__dlpack_device__", None)
    if device is not None:
        why = _evtc.device_refusal(int(device()[0]), what)
        if why:
            raise _evtc.UserError(why)


def _is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


class _Compiled:
    """What every evtc kernel object says about itself (``_native`` is the native kernel,
    ``signature`` its operands and outputs)."""

    _native: Any
    signature: list[Operand]

    @property
    def ir(self) -> str:
        """The canonical IR after the pass pipeline."""
        return self._native.ir

    @property
    def hash(self) -> str:
        """The graph hash (the graph part of the kernel cache key)."""
        return self._native.hash

    @property
    def inputs(self) -> list[Operand]:
        return [s for s in self.signature if not s.output]

    # Background compiles by name (the subclass's __init__ calls _init_compiles).
    _futures: dict[Any, concurrent.futures.Future]
    _futures_lock: threading.Lock

    def _init_compiles(self) -> None:
        self._futures = {}
        self._futures_lock = threading.Lock()

    def _start_once(self, key, compile_fn, *args) -> concurrent.futures.Future:
        """The future of the compile named `key`, submitted on its first request."""
        with self._futures_lock:
            fut = self._futures.get(key)
            if fut is None:
                fut = self._futures[key] = _pool().submit(compile_fn, *args)
            return fut

    def _wait_for_compiles(self) -> list[str]:
        """Waits for the background compiles; returns their errors. A kernel that failed to
        compile still runs its calls unfused, with the reason logged (a grouped kernel built
        with wait_for_compile on raises the error again from its run)."""
        with self._futures_lock:
            futures = list(self._futures.values())
        errors = []
        for f in futures:
            try:
                f.result()
            except _evtc.Error as e:
                errors.append(str(e))
        return errors


class Kernel(_Compiled):
    """A fused GEMM + epilogue. Call it as ``kernel(a, b, **operands)``.

    ``a`` is M×K and ``b`` is K×N (any DLPack CUDA arrays; pass ``w.t()`` for an nn.Linear
    weight ``w``). Keyword arguments bind the epilogue's operands by name: arrays for vectors,
    matrices and pointer scalars, Python numbers for by-value scalars, ``C=`` for the source
    matrix. Outputs are allocated when the inputs are torch tensors (else pass them in
    ``out={name: array}``); the call returns the single output, or a dict of them by name when
    there are several. Torch inputs run on torch's current stream; other arrays on
    ``stream=`` (a ``cudaStream_t`` as an int, default the legacy default stream).
    """

    def __init__(self, expr: str, options: _evtc.KernelOptions):
        self.expr = expr
        self._native = _evtc.Kernel(expr, options)
        self._options = options
        self._init_compiles()  # by (m, n, k), and "fallback"
        self.last_path: Optional[str] = None
        self.signature = [Operand(**d) for d in self._native.signature]

    # --- what the kernel is ------------------------------------------------------------------
    @property
    def outputs(self) -> list[Operand]:
        return [s for s in self.signature if s.output]

    @property
    def library_path(self) -> str:
        return self._native.library_path

    def config_for(self, m: int, n: int, k: int) -> str:
        """The kernel configuration a problem of this size runs with."""
        return self._native.config_for(m, n, k)

    def config_source(self, m: int, n: int, k: int) -> str:
        """Where :meth:`config_for`'s configuration comes from: ``"given"``, ``"tuned for MxNxK"``,
        ``"nearest tuned shape, MxNxK"``, ``"table h100-bf16.json at MxNxK"`` (the shipped table of
        this GPU) or ``"heuristic default"``."""
        return self._native.config_source(m, n, k)

    def visit_order_for(self, m: int, n: int, k: int) -> str:
        """The tile visiting order a problem of this size runs with (``"heuristic"`` is CUTLASS's
        own choice): ``visit_order`` where given, else the one measured with
        :meth:`config_for`'s configuration at the tuned or table shape."""
        return self._native.visit_order_for(m, n, k)

    def fallback_reason(self, m: int, n: int, k: int) -> str:
        """Why a problem of this size would run unfused; empty when it would be fused."""
        return self._native.fallback_reason(m, n, k)

    def in_library(self, m: int, n: int, k: int) -> bool:
        """Whether a kernel library (:func:`evtc.add_kernel_library`) holds the fused kernel
        problems of this size run with (so it needs no compile)."""
        return self._native.in_library(m, n, k)

    # --- compiling ---------------------------------------------------------------------------
    def compile(self, m: int = 0, n: int = 0, k: int = 0) -> str:
        """Compiles the fused kernel for problems of this size (or finds it in the disk cache).

        Needs nvcc and the CUTLASS headers, not a GPU. Returns the library path."""
        self.compile_async(m, n, k).result()
        return self._native.library_path

    def compile_async(self, m: int = 0, n: int = 0, k: int = 0) -> concurrent.futures.Future:
        """Starts compiling in a background thread (nvcc runs without the GIL); calls of this
        kernel wait for it (with ``wait_for_compile=False`` they run unfused until it is done).
        Several kernels compile in parallel."""
        return self._start_once((m, n, k), self._native.compile, m, n, k)

    def compile_fallback_async(self) -> concurrent.futures.Future:
        """Starts compiling the unfused path's plain epilogue in the background (about a
        second; not queued behind fused kernels)."""
        return self._start_once("fallback", self._native.compile_fallback)

    # --- running -----------------------------------------------------------------------------
    def __call__(self, a: Any, b: Any, *, out: Optional[dict[str, Any]] = None,
                 stream: Optional[int] = None, scale_a: Any = None, scale_b: Any = None,
                 **operands: Any) -> Union[Any, dict[str, Any]]:
        """Runs ``D = epilogue(a @ b, ...)``. A kernel built with ``fp8_blockwise=True`` also takes
        ``scale_a`` (f32, M × ceil(K/128), M adjacent: PyTorch's 1×128 layout) and ``scale_b`` (f32,
        ceil(K/128) × ceil(N/128), contiguous row-major; for ``torch._scaled_mm``'s 128×128
        ``scale_b``, pass ``scale_b.contiguous()``). Scales in other strides run the unfused path
        (with the reason logged)."""
        require_out(out)
        if not _is_torch_tensor(a):
            require_cuda_array(a, "operand A")
            require_cuda_array(b, "operand B")
        if self._options.wait_for_compile:
            self._wait_for_compiles()
        block_scales = {name: t for name, t in (("@scale_a", scale_a), ("@scale_b", scale_b)) if t is not None}
        torch_inputs = _is_torch_tensor(a)
        if torch_inputs:
            return self._call_torch(a, b, out or {}, stream, operands, block_scales)
        outputs = dict(out or {})
        for o in self.outputs:
            if o.name not in outputs:
                raise _evtc.UserError(f"output '{o.name}' ({o.dtype}[{o.shape}]) was not given: pass "
                                      f"out={{'{o.name}': array}} (outputs are allocated only for torch tensors)")
        tensors, scalars = _split_operands(operands)
        tensors.update(outputs)
        tensors.update(block_scales)
        self.last_path = self._native.run(a, b, tensors, {}, scalars, int(stream or 0))
        return _result(self.outputs, outputs)

    def _call_torch(self, a, b, out, stream, operands, block_scales):
        import torch

        _require_cuda([("A", a), ("B", b), *operands.items(), *out.items(),
                       *((name[1:], t) for name, t in block_scales.items())])
        m, n = int(a.shape[0]), int(b.shape[-1])
        outputs = dict(out)
        for o in self.outputs:
            if o.name not in outputs:
                outputs[o.name] = torch.empty(o.size(m, n), dtype=getattr(torch, _TORCH_DTYPES[o.dtype]),
                                              device=a.device)
        tensors, scalars = _split_operands(operands)
        tensors.update(outputs)
        tensors.update(block_scales)
        dtypes: dict[str, str] = {}
        arrays = {}
        for name, t in [("A", a), ("B", b), *tensors.items()]:
            arrays[name] = _torch_dlpack(t, name.lstrip("@"), dtypes)
        if stream is None:
            stream = torch.cuda.current_stream(a.device).cuda_stream
        with torch.cuda.device(a.device):
            a_arr, b_arr = arrays.pop("A"), arrays.pop("B")
            self.last_path = self._native.run(a_arr, b_arr, arrays, dtypes, scalars, int(stream))
        return _result(self.outputs, outputs)

    def __repr__(self) -> str:
        outs = ", ".join(f"{o.name}: {o.dtype}" for o in self.outputs)
        return f"<evtc.Kernel {self.hash} -> {outs}>"


def _require_cuda(named_tensors) -> None:
    """Raises UserError naming the first torch tensor not on a CUDA device: checked before
    anything asks torch for a CUDA stream, which without a GPU fails naming no operand."""
    import torch

    for name, t in named_tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "cuda":
            raise _evtc.UserError(f"operand {name} is not on a CUDA device (it is on {t.device}): "
                                  f"evtc's kernels run on the GPU; move it with .cuda()")


def _split_operands(operands: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    tensors, scalars = {}, {}
    for name, v in operands.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            scalars[name] = float(v)
        else:
            tensors[name] = v
    return tensors, scalars


def _torch_dlpack(t, name: str, dtypes: dict[str, str]):
    """A DLPack capsule of a torch tensor (no copy, no stream synchronisation: the kernel runs
    on the stream torch would use); fp8 tensors carry their own DLPack types. ``dtypes`` is
    for arrays that stand for another type (a uint8 array of fp8 bytes from a library whose
    DLPack has no fp8): torch tensors need no entry."""
    import torch
    from torch.utils.dlpack import to_dlpack

    if not isinstance(t, torch.Tensor):
        raise _evtc.ArgumentTypeError(f"'{name}' is a {type(t).__name__}; expected a torch tensor like A")
    return to_dlpack(t)


def _result(outputs: list[Operand], values: dict[str, Any]):
    if len(outputs) == 1:
        return values[outputs[0].name]
    return {o.name: values[o.name] for o in outputs}


DType = Union[str, Any]  # a dtype name, or a torch / NumPy dtype


def compile(expr: str, *, a_dtype: DType = "bf16", b_dtype: DType = "bf16", a_layout: str = "row",
            b_layout: str = "col", cast_mode: str = "eager", precise_math: bool = False,
            disable_fusion: bool = False, config: Optional[str] = None,
            operand_dtype: DType = "bf16", output_dtype: DType = "bf16", wait_for_compile: bool = True,
            arch: Optional[str] = None, fp8_blockwise: bool = False,
            visit_order: Optional[str] = None) -> Kernel:
    """Parses ``expr``, runs the pass pipeline and returns a :class:`Kernel`.

    Dtypes are names (``"bf16"``, ``"f8e4m3"``, ...) or torch dtypes (``torch.bfloat16``).
    ``a_dtype``/``b_dtype`` and ``a_layout``/``b_layout`` (``"row"`` or ``"col"``) describe the
    GEMM's operands the fused kernel is built for (other layouts run unfused); ``cast_mode``
    is ``"eager"`` (round where PyTorch eager would), ``"fast"`` (only at outputs) or ``"compile"``
    (as a compiler fusing the ops would: the GEMM's result and the outputs); ``config`` fixes a kernel
    configuration (e.g. ``"coop_128x256x64_c2x1_persistent"``); ``operand_dtype`` and
    ``output_dtype`` are the dtypes of operands and [m,n] outputs the expression does not
    declare. With ``wait_for_compile=False`` a call whose fused kernel is not compiled yet runs
    unfused (cuBLASLt + the plain epilogue) while it compiles in the background, and later calls
    switch to it once it is ready (``EVTC_WAIT_FOR_COMPILE=1`` makes every kernel wait). ``arch``
    (``"sm80"``, ``"sm90"``, ...) is the GPU architecture to build for, by default the current
    device's (``EVTC_ARCH`` overrides it): fused kernels exist for sm90, sm80/86/89 (CUTLASS 2.x
    kernels, also sm120's 16-bit GEMMs), and compile-checked ones for sm100 and sm120 (fp8;
    docs/backend.md "Target architecture"); elsewhere every call runs cuBLASLt + the plain
    epilogue built for that architecture. ``fp8_blockwise=True``
    (fp8 A and B) builds the block-scaled GEMM of DeepSeek-V3's format: each call passes
    ``scale_a`` and ``scale_b`` (see :meth:`Kernel.__call__`), which the main loop applies per
    128-wide K block, so the epilogue sees the scaled product. ``visit_order`` fixes the order in
    which the kernel's tile scheduler visits output tiles (``"heuristic"``, ``"along_m"`` or
    ``"along_n"``, with ``"_s2"``, ``"_s4"`` or ``"_s8"`` for strips of that many tiles: e.g.
    ``"along_n_s8"``); by default each problem takes the order measured with its configuration
    (the shipped table's or a tuned one, see :meth:`Kernel.visit_order_for`). It is a run-time
    argument of the compiled kernel: changing it compiles nothing. Errors
    in the expression raise :class:`evtc.ParseError`; bad option values :class:`evtc.UserError`
    (a ``ValueError``), options of the wrong type :class:`evtc.ArgumentTypeError` (a ``TypeError``).
    """
    require_option_types(expr, strings={"a_layout": a_layout, "b_layout": b_layout, "cast_mode": cast_mode},
                         flags={"precise_math": precise_math, "disable_fusion": disable_fusion,
                                "wait_for_compile": wait_for_compile, "fp8_blockwise": fp8_blockwise},
                         config=config, arch=arch)
    require_type(visit_order, (str, type(None)), "visit_order", "a visiting order name such as \"along_n_s8\" (a str) or None")
    o = _evtc.KernelOptions()
    o.a_dtype, o.b_dtype = dtype_name(a_dtype, "a_dtype"), dtype_name(b_dtype, "b_dtype")
    o.a_layout, o.b_layout = a_layout, b_layout
    o.cast_mode, o.precise_math, o.disable_fusion, o.config = cast_mode, precise_math, disable_fusion, config
    o.operand_dtype = dtype_name(operand_dtype, "operand_dtype")
    o.output_dtype = dtype_name(output_dtype, "output_dtype")
    o.wait_for_compile = wait_for_compile
    o.arch = arch
    o.fp8_blockwise = fp8_blockwise
    o.visit_order = visit_order
    return Kernel(expr, o)
