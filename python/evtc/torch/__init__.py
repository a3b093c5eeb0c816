"""evtc for PyTorch: custom ops, an FX fusion pass and a torch.compile backend.

    import evtc.torch
    model = torch.compile(model, backend="evtc")                    # or backend=evtc.torch.backend
    model = torch.compile(model, backend="evtc", mode="reduce-overhead")

The backend is Inductor with :class:`PostGradPass`, which runs evtc's FX passes: GEMMs that
share their input and meet in a gated activation merge into one gated GEMM, and every
``mm``/``addmm``/``_scaled_mm``/``_grouped_mm`` with its pointwise consumers (arithmetic,
activations, clamps, casts, reshapes, broadcast operands, gated slices) becomes one fused op
running a CUTLASS kernel, where the cost model expects that to be faster than cuBLAS plus
Inductor's kernels. Chains it does not fuse stay as they are; ``EVTC_LOG=debug`` (or
``TORCH_LOGS="+evtc"``) logs what was fused, with the cost model's numbers, and why the rest was
not. ``merge_projections(model)`` makes gate/up linear pairs views of one interleaved buffer,
which the merged GEMM then reads in place (no copy, and merged under CUDA graphs too).
"""
from __future__ import annotations

from ._version_check import check_torch_version as _check_torch_version

_check_torch_version()

from ._cross_entropy import (fuse_linear_cross_entropy, fuse_token_logprobs, linear_cross_entropy,
                             linear_cross_entropy_and_logits, token_logprobs)
from ._backend import EVTC_OPTIONS, PostGradPass, backend, inductor_config
from .passes.weight_grads import WeightGradLayoutPass
from ._backend import _register as _register_backend
from ._fx_pass import Fusion, FusionReport, fuse_gemm_epilogues, reports
from ._projections import DEFAULT_PAIRS as MERGE_PAIRS
from ._projections import merge_projections
from ._op import (clear_merged_weights, compile_only, gemm_epilogue, grouped_gemm_epilogue, merged_weights_bytes,
                  path_counts, wait_for_compiles)
from ._spec import make_grouped_spec, make_spec

_register_backend()

__all__ = [
    "EVTC_OPTIONS",
    "MERGE_PAIRS",
    "Fusion",
    "FusionReport",
    "PostGradPass",
    "WeightGradLayoutPass",
    "backend",
    "clear_merged_weights",
    "compile_only",
    "fuse_gemm_epilogues",
    "fuse_linear_cross_entropy",
    "fuse_token_logprobs",
    "gemm_epilogue",
    "grouped_gemm_epilogue",
    "inductor_config",
    "linear_cross_entropy",
    "linear_cross_entropy_and_logits",
    "make_grouped_spec",
    "make_spec",
    "merge_projections",
    "merged_weights_bytes",
    "path_counts",
    "reports",
    "token_logprobs",
    "wait_for_compiles",
]
