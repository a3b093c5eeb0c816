"""Weight layout for gated epilogues: stacked [W_gate; W_up] -> interleaved gate/up pairs."""
from __future__ import annotations

from typing import Any

from . import _evtc


def _check(weight: Any, dim: Any, what: str) -> int:
    """The weight's checks both directions share: a 2-D torch tensor (else
    :class:`evtc.ArgumentTypeError`) and ``dim`` 0 or 1 (else :class:`evtc.UserError`); returns
    ``dim`` as 0 or 1."""
    import torch

    if not isinstance(weight, torch.Tensor):
        raise _evtc.ArgumentTypeError(f"{what} takes a torch.Tensor, got {type(weight).__name__}")
    if weight.dim() != 2:
        raise _evtc.UserError(f"{what} takes a 2-D weight, got shape {list(weight.shape)}")
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise _evtc.ArgumentTypeError(f"dim: expected 0 or 1, got {type(dim).__name__} {dim!r}")
    if dim not in (0, 1, -1, -2):
        raise _evtc.UserError(f"dim must be 0 or 1, got {dim}")
    return dim % 2


def interleave_pairs(gate: Any, up: Any, dim: int) -> Any:
    """Gate and up tensors of the same shape interleaved along ``dim`` (gate's element j at 2j,
    up's at 2j + 1), contiguous: the gated kernels' (gate, up) layout, for weights here and the
    FX pass's constant weights, biases and grouped weights. It is the PyTorch op library's
    ``evtc::interleave_pairs`` op (python/src/torch_ops.cpp), the function its merged operators
    build their operands with at run time, so the layout is written once; C++ code has
    ``evtc::interleave_gate_up`` (include/evtc/gated.hpp) for raw device memory."""
    import torch

    from .torch import _op  # noqa: F401  (loads the op library)

    return torch.ops.evtc.interleave_pairs(gate, up, dim)


def interleave_gate_up(stacked: Any, dim: int = 0) -> Any:
    """Returns the gated kernels' weight layout of a stacked gate/up weight (a new tensor).

    ``stacked`` holds the gate projection's features first and the up projection's after them
    along ``dim`` (2·I features): a PyTorch ``Linear`` weight of shape (2I, K) with ``dim=0``
    (used as ``x @ w.T``), or a (K, 2I) matrix with ``dim=1`` (used as ``x @ w``). The result
    has the same shape with gate feature j at index 2j and up feature j at 2j+1 along ``dim``,
    which is what ``gate(acc)`` / ``up(acc)`` and the gated activations (``swiglu(acc)``, ...)
    of an evtc expression read. Works on any torch tensor (CPU or CUDA); C++ code has
    ``evtc::interleave_gate_up`` (include/evtc/gated.hpp) for raw device memory.
    """
    import torch

    dim = _check(stacked, dim, "interleave_gate_up")
    features = stacked.shape[dim]
    if features % 2:
        raise _evtc.UserError(f"the stacked weight has {features} features along dim {dim}: "
                         "gate and up need the same number (an even total)")
    gate, up = stacked.split(features // 2, dim=dim)
    return interleave_pairs(gate, up, dim)


def deinterleave_gate_up(interleaved: Any, dim: int = 0) -> Any:
    """The inverse of :func:`interleave_gate_up`: interleaved pairs back to [W_gate; W_up]."""
    import torch

    dim = _check(interleaved, dim, "deinterleave_gate_up")
    if interleaved.shape[dim] % 2:
        raise _evtc.UserError(f"the interleaved weight has {interleaved.shape[dim]} features along dim {dim}: "
                              "(gate, up) pairs need an even number")
    pairs = interleaved.unflatten(dim, (-1, 2))
    return torch.cat((pairs.select(dim + 1, 0), pairs.select(dim + 1, 1)), dim=dim).contiguous()


def interleaved_in_place(gate: Any, up: Any, dim: int) -> bool:
    """Whether torch tensors ``gate`` and ``up`` are the even and odd entries along ``dim`` of
    one buffer whose last dimension is contiguous, so that a gated kernel reads that buffer
    itself (``evtc.torch.merge_projections`` makes a model's weights so). The stride rule is
    C++'s ``evtc::interleaved_strides``, which the PyTorch ops apply at run time; works on fake
    tensors too (their views share a storage as the real ones do)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    if gate.dtype != up.dtype or gate.device != up.device or tuple(gate.shape) != tuple(up.shape):
        return False
    if any(not isinstance(v, int) for v in (*gate.shape, *gate.stride(), *up.stride())):
        return False  # symbolic sizes or strides: no static answer
    if StorageWeakRef(gate.untyped_storage()) != StorageWeakRef(up.untyped_storage()):
        return False
    return _evtc.interleaved_strides(list(gate.shape), list(gate.stride()), int(gate.storage_offset()),
                                     list(up.stride()), int(up.storage_offset()), dim) is not None
