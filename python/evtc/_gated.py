"""Weight layout for gated epilogues: stacked [W_gate; W_up] -> interleaved gate/up pairs."""
from __future__ import annotations

from typing import Any


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

    if not isinstance(stacked, torch.Tensor):
        raise TypeError(f"interleave_gate_up takes a torch.Tensor, got {type(stacked).__name__}")
    if stacked.dim() != 2:
        raise ValueError(f"interleave_gate_up takes a 2-D weight, got shape {list(stacked.shape)}")
    if dim not in (0, 1, -1, -2):
        raise ValueError(f"dim must be 0 or 1, got {dim}")
    dim %= 2
    features = stacked.shape[dim]
    if features % 2:
        raise ValueError(f"the stacked weight has {features} features along dim {dim}: "
                         "gate and up need the same number (an even total)")
    gate, up = stacked.split(features // 2, dim=dim)
    return torch.stack((gate, up), dim=dim + 1).flatten(dim, dim + 1).contiguous()


def deinterleave_gate_up(interleaved: Any, dim: int = 0) -> Any:
    """The inverse of :func:`interleave_gate_up`: interleaved pairs back to [W_gate; W_up]."""
    import torch

    if not isinstance(interleaved, torch.Tensor) or interleaved.dim() != 2:
        raise TypeError("deinterleave_gate_up takes a 2-D torch.Tensor")
    dim %= 2
    pairs = interleaved.unflatten(dim, (-1, 2))
    return torch.cat((pairs.select(dim + 1, 0), pairs.select(dim + 1, 1)), dim=dim).contiguous()
