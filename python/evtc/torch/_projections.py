"""merge_projections: a model's gate and up projections as views of one interleaved buffer, and
its sibling projections of one input (q, k and v) as consecutive rows of one buffer.

Gated kernels read B with gate feature j at row 2j and up feature j at row 2j + 1. Where a
model keeps the two projections as separate tensors, evtc's merged GEMM otherwise reads an
interleaved copy (rebuilt after every in-place update, and refused under CUDA graphs, whose
replays could not rebuild it). ``merge_projections`` moves each pair's values into one buffer
once and makes the two parameters its even and odd rows: the same Parameter objects, names,
shapes and values, so ``state_dict``, ``load_state_dict``, optimizers (which update the views,
and so the buffer, in place) and eager code keep working, and the merged GEMM reads the buffer
itself.

Sibling projections that read the same input but are not combined by an epilogue (attention's
q, k and v) are stacked instead: their weights become consecutive row blocks of one buffer (each
still contiguous), so the FX pass runs them as one GEMM (``torch.ops.evtc.stacked_linear``) that
reads the buffer in place.
"""
from __future__ import annotations

import logging
from typing import Optional, Sequence

import torch
from torch import nn

from .. import _evtc
from .._gated import interleave_pairs, interleaved_in_place

log = logging.getLogger("evtc")

DEFAULT_PAIRS = (("gate_proj", "up_proj"), ("w1", "w3"), ("gate", "up"))
"""Attribute names of (gate, up) pairs that ``merge_projections`` looks for by default: the
``transformers`` LLaMA/Mistral/Qwen/Gemma MLPs, Meta's LLaMA and Mixtral's (``w1``/``w3``), and
``gate``/``up``."""

DEFAULT_STACKS = (("q_proj", "k_proj", "v_proj"), ("wq", "wk", "wv"), ("query", "key", "value"))
"""Attribute names of sibling projections (nn.Linear) that ``merge_projections`` stacks by
default: the ``transformers`` LLaMA/Mistral/Mixtral/Qwen/Gemma attention's, Meta's LLaMA's and
BERT's q, k and v."""


def _weights(module: nn.Module, name: str, parameters: bool):
    """(weight, bias or None) of attribute ``name``: an ``nn.Linear``'s, or, with
    ``parameters``, a Parameter itself (features along its second-to-last dimension, as in a
    Linear weight); None otherwise."""
    child = getattr(module, name, None)
    if isinstance(child, nn.Linear):
        return child.weight, child.bias
    if parameters and isinstance(child, nn.Parameter):
        return child, None
    return None


def _is_sharded(t: torch.Tensor) -> bool:
    """A DTensor (FSDP2's and tensor parallelism's parameters)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a build without torch.distributed
        return False
    return isinstance(t, DTensor)


def _mismatch(gate, up) -> Optional[str]:
    """Why two (weight, bias) pairs cannot be merged, or None."""
    (gw, gb), (uw, ub) = gate, up
    if gw.dim() < 2:
        return f"the weights have {gw.dim()} dimension(s); projections have at least 2"
    if tuple(gw.shape) != tuple(uw.shape):
        return f"the weights have shapes {list(gw.shape)} and {list(uw.shape)}"
    if gw.dtype != uw.dtype:
        return f"the weights are {gw.dtype} and {uw.dtype}"
    if gw.device != uw.device:
        return f"the weights are on {gw.device} and {uw.device}"
    if gw.layout != torch.strided or uw.layout != torch.strided:
        return "a weight is not a dense (strided) tensor"
    if (gb is None) != (ub is None):
        return "one projection has a bias and the other has none"
    if gb is not None and (tuple(gb.shape) != tuple(ub.shape) or gb.dtype != ub.dtype or gb.device != ub.device):
        return f"the biases differ: {list(gb.shape)} {gb.dtype} and {list(ub.shape)} {ub.dtype}"
    return None


def _stack_mismatch(parts) -> Optional[str]:
    """Why sibling (weight, bias) pairs cannot be stacked, or None: 2-D weights of one K, dtype
    and device, each with a bias or none with one (their row counts may differ: grouped-query
    attention's k and v are narrower than q)."""
    (w0, b0) = parts[0]
    for w, b in parts:
        if w.dim() != 2:
            return f"a weight has {w.dim()} dimension(s); stacked projections are 2-D"
        if w.shape[1] != w0.shape[1]:
            return f"the weights have {w0.shape[1]} and {w.shape[1]} input features"
        if w.dtype != w0.dtype or w.device != w0.device:
            return f"the weights are {w0.dtype} on {w0.device} and {w.dtype} on {w.device}"
        if w.layout != torch.strided:
            return "a weight is not a dense (strided) tensor"
        if (b is None) != (b0 is None):
            return "some projections have a bias and others none"
        if b is not None and (b.dim() != 1 or b.dtype != b0.dtype or b.device != b0.device):
            return f"the biases differ: {list(b0.shape)} {b0.dtype} and {list(b.shape)} {b.dtype}"
    return None


def _storage_owners(model: nn.Module) -> dict:
    """Every parameter and buffer of ``model`` (by name, duplicates included) per storage."""
    from torch.multiprocessing.reductions import StorageWeakRef

    owners: dict = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        if t.layout == torch.strided and not _is_sharded(t):
            owners.setdefault(StorageWeakRef(t.untyped_storage()), []).append((name, t))
    return owners


def _shared(parts, owners: dict) -> Optional[str]:
    """Why the (weight, bias) pairs cannot move to a buffer of their own without losing
    something: a tensor of them that shares its storage with another parameter or buffer (tied
    weights, which moving one of them would untie), or two of them being one tensor. None where
    nothing is shared, and for projections merged already (their tensors share one buffer, with
    each other only)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    weights = [w for w, _ in parts]
    if len({id(w) for w in weights}) != len(weights):
        return "two of the weights are the same tensor"
    ours = [t for pair in parts for t in pair if t is not None]
    for t in ours:
        for name, other in owners.get(StorageWeakRef(t.untyped_storage()), []):
            if not any(other is o for o in ours):
                return (f"a weight shares its storage with {name} (tied weights): moving it to a new buffer "
                        "would untie them")
    return None


def _interleave_in_place(gate: torch.Tensor, up: torch.Tensor, dim: int) -> None:
    """Moves ``gate`` and ``up`` (tensors or Parameters, kept as objects) into one new buffer
    along ``dim``: gate's entry j at 2j and up's at 2j + 1."""
    with torch.no_grad():
        buffer = interleave_pairs(gate.detach(), up.detach(), dim)
        d = dim % buffer.dim()
        halves = buffer.unflatten(d, (-1, 2))
        gate.data, up.data = halves.select(d + 1, 0), halves.select(d + 1, 1)
    if not interleaved_in_place(gate, up, dim):  # the views are what the ops recognise
        raise _evtc.InternalError("merge_projections made views that the merged GEMM does not read in place")


def _stack_in_place(tensors: list[torch.Tensor]) -> None:
    """Moves ``tensors`` (tensors or Parameters, kept as objects) into one new buffer, one after
    the other along dimension 0, each a contiguous view of it."""
    with torch.no_grad():
        buffer = torch.cat([t.detach() for t in tensors], 0)
        start = 0
        for t in tensors:
            rows = t.shape[0]
            t.data = buffer[start:start + rows]
            start += rows
    from ._op import rows_of_one_buffer

    if not rows_of_one_buffer(tensors):  # the views are what the op reads in place
        raise _evtc.InternalError("merge_projections made views that the stacked GEMM does not read in place")


def _stack(module: nn.Module, names, where: str, owners: dict, explicit: bool) -> bool:
    """Stacks the sibling projections ``names`` of ``module``; False (logged) where they cannot be."""
    from ._op import rows_of_one_buffer

    parts = [_weights(module, name, False) for name in names]
    why = _stack_mismatch(parts) or _shared(parts, owners)
    if why is None and any(_is_sharded(w) for w, _ in parts):
        why = "the weights are DTensors (FSDP2 or tensor parallelism), which cannot be views of one buffer"
    if why is not None:
        if explicit:
            raise _evtc.UserError(f"merge_projections: {where}: {why}")
        log.debug("merge_projections: %s not stacked: %s", where, why)
        return False
    weights, biases = [w for w, _ in parts], [b for _, b in parts if b is not None]
    if not rows_of_one_buffer(weights):
        _stack_in_place(weights)
    if biases and not rows_of_one_buffer(biases):
        _stack_in_place(biases)
    return True


def merge_projections(model: nn.Module, pairs: Optional[Sequence[Sequence[str]]] = None,
                      stacks: Optional[Sequence[Sequence[str]]] = None) -> list[str]:
    """Makes each (gate, up) projection pair of ``model`` two views of one interleaved buffer,
    so that evtc's merged gated GEMM reads the weights themselves: no per-call copy, and the
    merge runs under CUDA graphs and in training, where weights change in place. Stacks each
    group of sibling projections of one input (q, k, v) into consecutive rows of one buffer,
    which the FX pass then runs as one GEMM (``torch.ops.evtc.stacked_linear``).

    ``pairs`` lists (gate, up) attribute names to look for on every submodule. By default
    (:data:`DEFAULT_PAIRS`) each is an ``nn.Linear`` pair (weight, and bias if both have one),
    and found pairs whose shapes, dtypes or devices differ are skipped (logged). Named pairs
    may also be Parameters whose features run along their second-to-last dimension, such as
    stacked expert weights ``(E, I, K)``: those merge grouped GEMMs in inference, but their
    gradients in training come out strided and cost a copy per step (the joint-graph pass that
    writes 2-D weight gradients row-major does not cover grouped GEMMs). Named pairs must
    match: a pair that is found but cannot be merged, or names found nowhere, raise
    :class:`evtc.UserError`.

    ``stacks`` lists groups of sibling ``nn.Linear`` attribute names (by default
    :data:`DEFAULT_STACKS`, q/k/v); weights of one input size, dtype and device, all with a bias
    or none, are stacked (their output sizes may differ, as grouped-query attention's do). Each
    weight stays a contiguous tensor. Giving only ``pairs`` or only ``stacks`` looks for those
    alone; named groups must match as named pairs must.

    The Parameter objects stay (optimizers made before keep working), with the same names,
    shapes and values; DistributedDataParallel keeps the views. Call it after moving the model to
    its device and dtype: ``.to()`` and ``copy.deepcopy`` give each parameter its own storage
    again, after which evtc merges by copying (correct, but without the benefits above). FSDP2
    (``fully_shard``) refuses non-contiguous parameters, and its sharded DTensor parameters
    cannot be views of one buffer: a model sharded so raises :class:`evtc.UserError` here.
    Returns the merged pairs and stacks, as ``"path: gate + up"`` and ``"path: q_proj + k_proj +
    v_proj"``; those merged already are listed again, unchanged.
    """
    explicit = pairs is not None or stacks is not None
    wanted = [tuple(p) for p in (pairs if pairs is not None else () if explicit else DEFAULT_PAIRS)]
    for p in wanted:
        if len(p) != 2 or not all(isinstance(n, str) and n for n in p):
            raise _evtc.ArgumentTypeError(f"pairs: each entry is two attribute names (gate, up), got {p!r}")
    groups = list(stacks if stacks is not None else () if explicit else DEFAULT_STACKS)
    for g in groups:
        if isinstance(g, str) or len(g) < 2 or not all(isinstance(n, str) and n for n in g):
            raise _evtc.ArgumentTypeError(f"stacks: each entry is two or more attribute names (q, k, v), got {g!r}")
    groups = [tuple(g) for g in groups]
    merged, found = [], set()
    owners = _storage_owners(model)
    for path, module in model.named_modules():
        for gate_name, up_name in wanted:
            gate, up = _weights(module, gate_name, explicit), _weights(module, up_name, explicit)
            if gate is None or up is None:
                continue
            found.add((gate_name, up_name))
            where = f"{path or type(model).__name__}: {gate_name} + {up_name}"
            why = _mismatch(gate, up) or _shared((gate, up), owners)
            if why is not None:
                if explicit:
                    raise _evtc.UserError(f"merge_projections: {where}: {why}")
                log.debug("merge_projections: %s not merged: %s", where, why)
                continue
            (gw, gb), (uw, ub) = gate, up
            if _is_sharded(gw) or _is_sharded(uw):
                raise _evtc.UserError(
                    f"merge_projections: {where}: the weights are DTensors (FSDP2 or tensor parallelism), which "
                    "keep each parameter contiguous in its own shards and cannot be views of one buffer; leave "
                    "them as they are (the merged GEMM then reads an interleaved copy)")
            if not interleaved_in_place(gw, uw, -2):
                _interleave_in_place(gw, uw, -2)
            if gb is not None and not interleaved_in_place(gb, ub, -1):
                _interleave_in_place(gb, ub, -1)
            merged.append(where)
        for names in groups:
            if not all(isinstance(getattr(module, n, None), nn.Linear) for n in names):
                continue
            found.add(names)
            where = f"{path or type(model).__name__}: {' + '.join(names)}"
            if _stack(module, names, where, owners, stacks is not None):
                merged.append(where)
    if explicit and (missing := [p for p in [*wanted, *groups] if p not in found]):
        raise _evtc.UserError("merge_projections: no submodule has all of " + ", ".join(repr(p) for p in missing))
    log.info("merge_projections: %d pair(s) and stack(s) merged", len(merged))
    return merged
