"""A language model's LM head and its cross-entropy loss without the [M, V] logits.

    loss = evtc.torch.linear_cross_entropy(h, weight, target)        # = F.cross_entropy((h @ weight.T).float(), target)

``torch.compile(backend="evtc")`` rewrites ``F.cross_entropy(F.linear(h, W).float(), target)``
in model code into this (see :func:`fuse_linear_cross_entropy`).

Two ways to run it, chosen per call (``save_logits``; by default by the logits' size):

* **Recomputing** (the default where the 16-bit logits would take more than
  :data:`SAVED_LOGITS_BYTES`; ``save_logits=False``): memory first.

  - Forward: one GEMM ``h @ Wᵀ`` whose epilogue writes each row's logsumexp and nothing else
    (``row_logsumexp(acc)``: per-tile partials folded in a fixed order). The target's logit is
    a dot product of ``h`` with the target's row of ``W`` (M × K work, in fp32; a second row
    reduction in the epilogue, ``row_sum(where(n == t[m], acc, 0))``, measured slower). Each
    row's loss is ``lse - target_logit``; rows whose target is ``ignore_index`` count for
    nothing. Saved for backward: ``h``, ``W``, the targets and the logsumexps (M floats).
  - Backward: one chunk of the vocabulary at a time (:func:`vocab_chunk_columns`), the same
    GEMM again, its epilogue writing ``exp(acc - lse[m]) * g[m] + where(n == t[m], gt[m], 0)``
    (the softmax times each row's gradient of its logsumexp, and the gradient of the target
    logit in the target's column; with the loss's gradients ``(exp(acc - lse) - one_hot) * g``)
    in the logits' dtype; two GEMMs give the chunk's rows of ``dW`` and its part of ``dh``
    (accumulated in fp32). No [M, V] tensor exists at any point. The price is a fourth GEMM
    (the recomputed logits) against the three of an unfused LM head.

* **Saving the logits** (``save_logits=True``, and the default up to
  :data:`SAVED_LOGITS_BYTES`): speed first, three GEMMs.

  - Forward: one GEMM whose epilogue writes the 16-bit logits and each row's logsumexp
    (``out logits = acc; out lse = row_logsumexp(acc)``), so no pass reads the logits again
    to reduce them; the target logit is gathered from them. Saved: the 16-bit logits (what an
    unfused LM head saves) and the logsumexps.
  - Backward: ``(exp(logits - lse[m]) - (n == target[m])) * g[m]`` elementwise in torch ops
    (one fused kernel under torch.compile), then the dgrad and wgrad GEMMs.

Where evtc cannot fuse a GEMM (a GPU without fused kernels, say) the same ops run cuBLASLt and
the unfused epilogue: slower, and the forward then holds fp32 logits while it runs.
"""
from __future__ import annotations

import logging
import operator
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import fx
from torch._subclasses.fake_tensor import is_fake

from . import _op, _spec
from ._chain import EVTC_DTYPES, GEMM_OPERAND_DTYPES, names_of

_REDUCTIONS = ("mean", "sum", "none")
log = logging.getLogger("evtc.torch")


def _options(dtype: torch.dtype) -> dict:
    name = EVTC_DTYPES[dtype]
    return {"a_dtype": name, "b_dtype": name, "a_layout": "row", "b_layout": "col", "operand_dtype": name,
            "output_dtype": name}


def _specs(dtype: torch.dtype) -> tuple[str, str]:
    """The recomputing forward and backward specs. Forward: each row's logsumexp. Backward: the
    gradient of the logits, the softmax times each row's gradient of its logsumexp plus, in the
    target's column (``t[m]`` relative to the chunk, -1 where outside it), the gradient of the
    target logit."""
    name, options = EVTC_DTYPES[dtype], _options(dtype)
    forward = _spec.make_spec("out lse: f32 = row_logsumexp(acc)", options, [], ["lse"])
    backward = _spec.make_spec(
        f"input lse[m]: f32\ninput g[m]: f32\ninput gt[m]: f32\ninput t[m]: i32\n"
        f"out grad: {name} = exp(acc - lse) * g + where(n == t, gt, 0)", options,
        [("lse", _spec.COL), ("g", _spec.COL), ("gt", _spec.COL), ("t", _spec.COL)], ["grad"])
    return forward, backward


def _saving_spec(dtype: torch.dtype) -> str:
    """The saving forward's spec: the 16-bit logits and each row's logsumexp, from one GEMM."""
    return _spec.make_spec(f"out logits: {EVTC_DTYPES[dtype]} = acc\nout lse: f32 = row_logsumexp(acc)",
                           _options(dtype), [], ["logits", "lse"])


def _check_reduction(reduction: str, fn: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{fn}: reduction must be one of {', '.join(_REDUCTIONS)}, got {reduction!r}")


def _check(h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, fn: str = "linear_cross_entropy",
           target_name: str = "target") -> None:
    """Raises naming the operand of ``fn`` that is wrong (the indices are ``target_name``)."""
    for name, t in (("h", h), ("weight", weight), (target_name, target)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if h.dim() != 2:
        raise ValueError(f"{fn}: h must be [tokens, hidden], got shape {tuple(h.shape)}")
    if weight.dim() != 2 or weight.shape[1] != h.shape[1]:
        raise ValueError(f"{fn}: weight must be [vocab, hidden] with hidden = h's {h.shape[1]}, got shape "
                         f"{tuple(weight.shape)}")
    if target.shape != (h.shape[0],):
        raise ValueError(f"{fn}: {target_name} must be [tokens] = [{h.shape[0]}], got shape {tuple(target.shape)}")
    if target.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{fn}: {target_name} must hold class indices (int64 or int32), got {target.dtype}")
    if h.dtype not in GEMM_OPERAND_DTYPES or weight.dtype != h.dtype:
        allowed = " or ".join(str(t).removeprefix("torch.") for t in GEMM_OPERAND_DTYPES)
        raise TypeError(f"{fn}: h and weight must both be {allowed}, got {h.dtype} and {weight.dtype}")
    if not (h.is_cuda and weight.is_cuda and target.is_cuda) or len({h.device, weight.device, target.device}) != 1:
        raise ValueError(f"{fn}: h, weight and {target_name} must be on one CUDA device, got {h.device}, "
                         f"{weight.device} and {target.device}")


def _valid_targets(target: torch.Tensor, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which rows count, and targets safe to index with (0 where ignored)."""
    valid = target != ignore_index
    return valid, torch.where(valid, target, 0)


def _column_targets(target: torch.Tensor, valid: torch.Tensor, start: int, columns: int) -> torch.Tensor:
    """[M, 1] int32: each row's target column within [start, start + columns), else -1."""
    here = valid & (target >= start) & (target < start + columns)
    return torch.where(here, target - start, -1).to(torch.int32).view(-1, 1)


@torch.library.custom_op("evtc::linear_cross_entropy_forward", mutates_args=())
def _forward(h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int,
             vocab_chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's logsumexp of h @ weightᵀ, and its target's logit (0 where ignored)."""
    forward, _ = _specs(h.dtype)
    (lse,) = _op.gemm_epilogue(forward, h.contiguous(), weight.t(), [])
    valid, safe = _valid_targets(target, ignore_index)
    # The target logit as a gathered dot product (M × K work) rather than a second row
    # reduction in the GEMM's epilogue, row_sum(where(n == t[m], acc, 0)): on an H100 at 8192 x
    # 128256 x 4096 that epilogue took the GEMM from 13.00 to 13.65 ms (gather included).
    # torch checks the indices here: a target outside [0, vocab) raises, as cross_entropy does.
    picked = weight.index_select(0, safe)
    return lse, _row_dots_f32(h, picked) * valid


def _row_dots_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Each row's dot product of two [M, K] 16-bit tensors, accumulated in fp32: the same sums
    as (a.float() * b.float()).sum(-1) without the fp32 copies of a and b (at 8192 tokens and
    hidden 4096, 384 MiB more peak memory than the logsumexp GEMM needs)."""
    if a.is_cuda:
        return torch.bmm(a.unsqueeze(1), b.unsqueeze(2), out_dtype=torch.float32).view(-1)
    return torch.linalg.vecdot(a.float(), b.float())


@_forward.register_fake
def _(h, weight, target, ignore_index, vocab_chunk):
    return h.new_empty(h.shape[0], dtype=torch.float32), h.new_empty(h.shape[0], dtype=torch.float32)


# The backward's [tokens, chunk] gradient in 16 bits stays within this many bytes, unless that
# would make a chunk narrower than MIN_CHUNK columns (narrower GEMMs run below full speed).
CHUNK_BYTES = 128 << 20
MIN_CHUNK = 4096


def vocab_chunk_columns(tokens: int, vocab: int) -> int:
    """The vocabulary columns of one backward chunk: as many as fit CHUNK_BYTES in 16 bits,
    at least MIN_CHUNK, a multiple of 128, at most the vocabulary."""
    return min(vocab, max(MIN_CHUNK, CHUNK_BYTES // (2 * max(tokens, 1)) // 128 * 128))


def _add_mm_f32(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b, a and b 16-bit, the product accumulated in fp32 into the fp32 acc."""
    torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)


@torch.library.custom_op("evtc::linear_cross_entropy_backward", mutates_args=())
def _backward(h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int,
              lse: torch.Tensor, grad_lse: torch.Tensor, grad_target_logit: torch.Tensor,
              vocab_chunk: int, needs_grad_h: bool, needs_grad_weight: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """dh and dweight from the gradients of the logsumexps and of the target logits, one chunk
    of the vocabulary at a time: the [tokens, chunk] gradient is the largest tensor. A gradient
    not needed is not computed (an empty tensor in its place)."""
    _, backward = _specs(h.dtype)
    vocab = weight.shape[0]
    valid = target != ignore_index
    h = h.contiguous()
    # [M, 1] columns: broadcast along N, as the spec's col operands are placed.
    columns = [lse.float().contiguous().view(-1, 1), grad_lse.float().contiguous().view(-1, 1),
               (grad_target_logit.float() * valid).contiguous().view(-1, 1)]
    grad_h = torch.zeros(h.shape if needs_grad_h else (0,), dtype=torch.float32, device=h.device)
    grad_weight = torch.empty_like(weight) if needs_grad_weight else weight.new_empty(0)
    step = vocab_chunk or vocab_chunk_columns(h.shape[0], vocab)
    for start in range(0, vocab, step):
        w = weight[start:start + step]
        # d lse / d logits = softmax; d target_logit / d logits = the target's one-hot.
        (grad,) = _op.gemm_epilogue(backward, h, w.t(), columns + [_column_targets(target, valid, start, w.shape[0])])
        if needs_grad_h:
            _add_mm_f32(grad_h, grad, w)
        if needs_grad_weight:
            torch.mm(grad.t(), h, out=grad_weight[start:start + step])
    return grad_h.to(h.dtype), grad_weight


@_backward.register_fake
def _(h, weight, target, ignore_index, lse, grad_lse, grad_target_logit, vocab_chunk, needs_grad_h,
      needs_grad_weight):
    return (torch.empty_like(h) if needs_grad_h else h.new_empty(0),
            torch.empty_like(weight) if needs_grad_weight else weight.new_empty(0))


def _setup_context(ctx, inputs, output):
    h, weight, target, ignore_index, vocab_chunk = inputs
    lse, _ = output
    ctx.save_for_backward(h, weight, target, lse)
    ctx.ignore_index = ignore_index
    ctx.vocab_chunk = vocab_chunk


def _autograd_backward(ctx, grad_lse, grad_target_logit):
    h, weight, target, lse = ctx.saved_tensors
    if grad_lse is None:
        grad_lse = torch.zeros_like(lse)
    if grad_target_logit is None:
        grad_target_logit = torch.zeros_like(lse)
    needs_h, needs_weight = ctx.needs_input_grad[:2]
    grad_h, grad_weight = _backward(h, weight, target, ctx.ignore_index, lse, grad_lse, grad_target_logit,
                                    ctx.vocab_chunk, needs_h, needs_weight)
    return grad_h if needs_h else None, grad_weight if needs_weight else None, None, None, None


_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


# --- saving the logits -----------------------------------------------------------------------

# By default the logits are saved (three GEMMs) when their 16-bit [tokens, vocab] tensor takes at
# most this many bytes, and recomputed in the backward pass (four GEMMs, no such tensor) above it.
SAVED_LOGITS_BYTES = 1 << 30


def saves_logits(tokens: int, vocab: int, dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether :func:`linear_cross_entropy` saves the logits by default at this size."""
    return tokens * vocab * dtype.itemsize <= SAVED_LOGITS_BYTES


@torch.library.custom_op("evtc::linear_cross_entropy_saving_forward", mutates_args=())
def _saving_forward(h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int,
                    returns_logits: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's logsumexp of h @ weightᵀ, its target's logit (0 where ignored), and the
    16-bit logits themselves (for backward; differentiable where ``returns_logits``)."""
    logits, lse = _op.gemm_epilogue(_saving_spec(h.dtype), h.contiguous(), weight.t(), [])
    valid, safe = _valid_targets(target, ignore_index)
    # gather checks the indices on the device, as cross_entropy does.
    target_logit = logits.gather(1, safe.view(-1, 1)).view(-1).float() * valid
    return lse, target_logit, logits


@_saving_forward.register_fake
def _(h, weight, target, ignore_index, returns_logits):
    m = h.shape[0]
    return (h.new_empty(m, dtype=torch.float32), h.new_empty(m, dtype=torch.float32),
            h.new_empty(m, weight.shape[0]))


# Outside torch.compile the logits' gradient is built a block of rows at a time, its fp32
# temporaries within about this many bytes each.
EAGER_BLOCK_BYTES = 64 << 20


def _logits_grad(logits: torch.Tensor, lse: torch.Tensor, safe: torch.Tensor, grad_lse: torch.Tensor,
                 grad_target: torch.Tensor, grad_logits: Optional[torch.Tensor] = None) -> torch.Tensor:
    """exp(logits - lse[m]) * grad_lse[m] + (n == safe[m]) * grad_target[m] (+ grad_logits) in the
    logits' dtype: the gradient of the logits from those of each row's logsumexp and target
    logit (and of the logits themselves, where they are an output too).
    Pointwise only, so that Inductor makes it one kernel when it traces this; run eagerly, a
    block of rows at a time (EAGER_BLOCK_BYTES)."""
    def rows(x, l, t, gl, gt, gx):
        n = torch.arange(x.shape[1], device=x.device)
        hit = n.view(1, -1) == t.view(-1, 1)
        g = torch.exp(x.float() - l.view(-1, 1)) * gl.view(-1, 1) + torch.where(hit, gt.view(-1, 1), 0.0)
        return (g if gx is None else g + gx.float()).to(x.dtype)

    if torch.compiler.is_compiling() or is_fake(logits):
        return rows(logits, lse, safe, grad_lse, grad_target, grad_logits)
    out = torch.empty_like(logits)
    step = max(1, EAGER_BLOCK_BYTES // (4 * max(logits.shape[1], 1)))
    for i in range(0, logits.shape[0], step):
        j = slice(i, i + step)
        out[j] = rows(logits[j], lse[j], safe[j], grad_lse[j], grad_target[j],
                      None if grad_logits is None else grad_logits[j])
    return out


def _saving_setup_context(ctx, inputs, output):
    h, weight, target, ignore_index, returns_logits = inputs
    lse, _, logits = output
    ctx.save_for_backward(h, weight, target, lse, logits)
    if not returns_logits:
        ctx.mark_non_differentiable(logits)
    ctx.ignore_index = ignore_index
    ctx.returns_logits = returns_logits


def _saving_backward(ctx, grad_lse, grad_target_logit, grad_logits):
    h, weight, target, lse, logits = ctx.saved_tensors
    valid, safe = _valid_targets(target, ctx.ignore_index)
    grad_lse = torch.zeros_like(lse) if grad_lse is None else grad_lse.float()
    grad_target = torch.zeros_like(lse) if grad_target_logit is None else grad_target_logit.float() * valid
    # Where the logits are not returned, autograd hands their output no gradient, or zeros.
    grad = _logits_grad(logits, lse, safe, grad_lse, grad_target,
                        grad_logits if ctx.returns_logits else None)
    needs_h, needs_weight = ctx.needs_input_grad[:2]
    return grad @ weight if needs_h else None, grad.t() @ h if needs_weight else None, None, None, None


_saving_forward.register_autograd(_saving_backward, setup_context=_saving_setup_context)


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, *,
                         ignore_index: int = -100, reduction: str = "mean",
                         vocab_chunk: Optional[int] = None, save_logits: Optional[bool] = None) -> torch.Tensor:
    """``F.cross_entropy((h @ weight.T).float(), target, ignore_index=..., reduction=...)``
    with the softmax in the LM head's GEMM: ``h`` is [tokens, hidden] (bf16 or f16),
    ``weight`` [vocab, hidden] in the same dtype, ``target`` [tokens] class indices.
    ``reduction`` is "mean" (over rows whose target is not ``ignore_index``; NaN when there are
    none, as PyTorch gives), "sum" or "none" (a float32 loss per row, 0 where ignored).

    ``save_logits=False`` writes no logits at all: the backward pass recomputes them, working
    through the vocabulary ``vocab_chunk`` columns at a time (default:
    :func:`vocab_chunk_columns`), so its largest tensor is [tokens, vocab_chunk] in h's dtype.
    ``save_logits=True`` saves the 16-bit logits for backward instead (an unfused LM head's
    memory, one GEMM fewer). By default (None) they are saved when they take at most
    :data:`SAVED_LOGITS_BYTES` (:func:`saves_logits`)."""
    _check_reduction(reduction, "linear_cross_entropy")
    if vocab_chunk is not None and (not isinstance(vocab_chunk, int) or vocab_chunk <= 0 or vocab_chunk % 8):
        raise ValueError(f"linear_cross_entropy: vocab_chunk must be a positive multiple of 8 (rows of the "
                         f"gradient chunk stay 16-byte aligned), got {vocab_chunk!r}")
    if save_logits not in (None, True, False):
        raise ValueError(f"linear_cross_entropy: save_logits must be True, False or None (by size), got {save_logits!r}")
    _check(h, weight, target)
    if save_logits is None:
        save_logits = saves_logits(h.shape[0], weight.shape[0], h.dtype)
    if save_logits:
        lse, target_logit, _ = _saving_forward(h, weight, target, int(ignore_index), False)
    else:
        lse, target_logit = _forward(h, weight, target, int(ignore_index), int(vocab_chunk or 0))
    return _loss(lse, target_logit, target, ignore_index, reduction)


def _loss(lse: torch.Tensor, target_logit: torch.Tensor, target: torch.Tensor, ignore_index: int,
          reduction: str) -> torch.Tensor:
    valid = target != ignore_index
    rows = (lse - target_logit) * valid
    if reduction == "none":
        return rows
    if reduction == "sum":
        return rows.sum()
    return rows.sum() / valid.sum()


def linear_cross_entropy_and_logits(h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, *,
                                    ignore_index: int = -100,
                                    reduction: str = "mean") -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`linear_cross_entropy` saving the logits, and the 16-bit logits ``h @ weight.T``
    [tokens, vocab] too (both differentiable): for models that return their logits beside the
    loss (transformers' causal LMs). The logits come from the loss's own GEMM."""
    _check_reduction(reduction, "linear_cross_entropy_and_logits")
    _check(h, weight, target, "linear_cross_entropy_and_logits")
    lse, target_logit, logits = _saving_forward(h, weight, target, int(ignore_index), True)
    return _loss(lse, target_logit, target, ignore_index, reduction), logits


def token_logprobs(h: torch.Tensor, weight: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``torch.log_softmax((h @ weight.T).float(), -1).gather(-1, tokens[:, None])[:, 0]``
    without the logits: each row's log-probability of its token (sampling, RL scoring), from
    the same forward as :func:`linear_cross_entropy` (one GEMM writing each row's logsumexp,
    and the token's logit as a dot product). ``h`` [tokens, hidden] and ``weight``
    [vocab, hidden] in bf16 or f16, ``tokens`` [tokens] in [0, vocab); returns float32.
    Differentiable, like the loss."""
    _check(h, weight, tokens, "token_logprobs", "tokens")
    # -1 is never a token: no row is ignored.
    lse, token_logit = _forward(h, weight, tokens, -1, 0)
    return token_logit - lse


# --- the torch.compile rewrite ------------------------------------------------------------------

_LINEARS = {torch._C._nn.linear, F.linear}
_CROSS_ENTROPY_PARAMETERS = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction",
                             "label_smoothing")


def _example(node: Any) -> Optional[torch.Tensor]:
    v = node.meta.get("example_value") if isinstance(node, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _is_float_cast(node: fx.Node) -> bool:
    """x.float(), or x.to(torch.float32) with nothing else."""
    if node.op != "call_method":
        return False
    if node.target == "float":
        return len(node.args) == 1 and not node.kwargs
    if node.target == "to":
        rest = list(node.args[1:]) + list(node.kwargs.values())
        return rest == [torch.float32]
    return False


def _is_flatten(node: fx.Node) -> bool:
    """A view/reshape that keeps the last dimension (merges the leading ones)."""
    if not ((node.op == "call_method" and node.target in ("view", "reshape")) or
            (node.op == "call_function" and node.target is torch.reshape)):
        return False
    src, out = _example(node.args[0]), _example(node)
    return src is not None and out is not None and out.dim() == 2 and src.shape[-1] == out.shape[-1]


def _arguments(call: fx.Node) -> dict[str, Any]:
    """A cross_entropy call's arguments by name (positional ones included)."""
    kwargs = dict(call.kwargs)
    for name, value in zip(_CROSS_ENTROPY_PARAMETERS, call.args):
        kwargs.setdefault(name, value)
    return kwargs


def _refusal(kwargs: dict[str, Any], logits: fx.Node) -> Optional[str]:
    """Why the cross_entropy of these arguments cannot run as linear_cross_entropy (None: it can)."""
    if kwargs.get("weight") is not None:
        return "class weights"
    if kwargs.get("size_average") is not None or kwargs.get("reduce") is not None:
        return "the deprecated size_average/reduce arguments"
    if kwargs.get("label_smoothing", 0.0) != 0.0:
        return "label smoothing"
    if kwargs.get("reduction", "mean") not in _REDUCTIONS:
        return f"reduction={kwargs.get('reduction')!r}"
    if not isinstance(kwargs.get("ignore_index", -100), int):
        return "an ignore_index that is not a Python int"
    t, x = _example(kwargs["target"]), _example(kwargs["input"])
    if t is None or x is None:
        return "shapes unknown"
    if x.dim() != 2:
        return f"{x.dim()}-d input (classes along dim 1 of a [tokens, vocab] input only)"
    if why := _head_refusal(logits):
        return why
    if t.dtype not in (torch.int64, torch.int32) or t.dim() != 1:
        return "targets that are not one class index per row"
    return None


def _head_refusal(linear: fx.Node) -> Optional[str]:
    """Why an LM head ``F.linear(h, W)`` cannot be evtc's GEMM (None: it can): a bias, a dtype
    that evtc's kernels do not take, another device than CUDA."""
    if len(linear.args) < 2 or (len(linear.args) > 2 and linear.args[2] is not None) or linear.kwargs.get("bias") is not None:
        return "the LM head has a bias"
    h, w = _example(linear.args[0]), _example(linear.args[1])
    if h is None or w is None:
        return "shapes unknown"
    if w.dim() != 2:
        return f"a {w.dim()}-d weight"
    if h.dtype not in GEMM_OPERAND_DTYPES or w.dtype != h.dtype:
        return f"{h.dtype} x {w.dtype} LM head ({names_of(GEMM_OPERAND_DTYPES)} only)"
    if not h.is_cuda:
        return "not on a CUDA device"
    return None


# The values of torch.compile's option "evtc.linear_cross_entropy", and the save_logits each gives.
OPTION_VALUES = {True: None, "save_logits": True, "recompute": False}


def fuse_linear_cross_entropy(gm: fx.GraphModule, save_logits: Optional[bool] = None) -> int:
    """Rewrites ``F.cross_entropy(F.linear(h, W).float().view(-1, V), target)`` (the cast and the
    flatten optional) in a Dynamo graph into :func:`linear_cross_entropy` (with this
    ``save_logits``), where the logits are used by nothing else. Returns how many it rewrote;
    ``EVTC_LOG=debug`` says why others were left alone."""
    rewritten = 0
    for call in list(gm.graph.nodes):
        if call.op != "call_function" or call.target is not F.cross_entropy:
            continue
        kwargs = _arguments(call)
        x = kwargs.get("input")
        chain = []
        while isinstance(x, fx.Node) and (_is_float_cast(x) or _is_flatten(x)):
            chain.append(x)
            x = x.args[0]
        if not (isinstance(x, fx.Node) and x.op == "call_function" and x.target in _LINEARS):
            continue
        if any(len(n.users) != 1 for n in chain):
            log.debug("cross_entropy over an LM head left unfused: its float or flattened logits are used "
                      "elsewhere too")
            continue
        # The logits also feed something else (a causal LM returns them beside its loss): the
        # saving way gives them from the loss's own GEMM.
        others = [u for u in x.users if u is not (chain[-1] if chain else call)]
        why = None
        if others and save_logits is False:
            why = "its logits are used elsewhere too, and the recomputing way (option 'recompute') writes none"
        elif others:
            order = {n: i for i, n in enumerate(gm.graph.nodes)}
            if any(order[u] < order[call] for u in others):
                why = "its logits are used elsewhere too, before the loss"
        why = why or _refusal(kwargs, x)
        if why:
            log.debug(f"cross_entropy over an LM head left unfused: {why}")
            continue
        target = kwargs["target"]
        ignore_index = kwargs.get("ignore_index", -100)
        reduction = kwargs.get("reduction", "mean")
        h, w = x.args[0], x.args[1]
        with gm.graph.inserting_before(call):
            hidden = _example(h).shape[-1]
            flat = gm.graph.call_method("reshape", (h, -1, hidden))
            flat_target = gm.graph.call_method("reshape", (target, -1))
            if others:
                pair = gm.graph.call_function(linear_cross_entropy_and_logits, (flat, w, flat_target),
                                              {"ignore_index": ignore_index, "reduction": reduction})
                fused = gm.graph.call_function(operator.getitem, (pair, 0))
                flat_logits = gm.graph.call_function(operator.getitem, (pair, 1))
                # Back to the linear's shape: h's leading dimensions, then the vocabulary.
                lead = gm.graph.call_function(operator.getitem, (gm.graph.call_method("size", (h,)), slice(None, -1)))
                shape = gm.graph.call_function(operator.add, (lead, (-1,)))
                logits = gm.graph.call_method("view", (flat_logits, shape))
                logits.meta.update(x.meta)
            else:
                fused = gm.graph.call_function(linear_cross_entropy, (flat, w, flat_target),
                                               {"ignore_index": ignore_index, "reduction": reduction,
                                                "save_logits": save_logits})
        fused.meta.update(call.meta)
        call.replace_all_uses_with(fused)
        if others:
            x.replace_all_uses_with(logits)
        for n in [call, *chain, x]:
            gm.graph.erase_node(n)
        rewritten += 1
        tokens, vocab = _example(kwargs["input"]).shape
        saved = saves_logits(tokens, vocab, _example(h).dtype) if save_logits is None else save_logits
        log.debug(f"LM head + cross_entropy fused: linear_cross_entropy (reduction={reduction}, "
                  f"ignore_index={ignore_index}); "
                  + ("the 16-bit logits from the loss's GEMM, returned and saved for backward" if others else
                     f"the 16-bit logits saved for backward ({tokens}x{vocab}), no fp32 copy" if saved else
                     "no [tokens, vocab] logits (recomputed in backward)"))
    if rewritten:
        gm.graph.lint()
        gm.recompile()
    return rewritten


# --- log-probabilities of chosen tokens ---------------------------------------------------------

_LOG_SOFTMAX_FUNCTIONS = {torch.log_softmax, F.log_softmax}


def _last_dim(dim: Any, ndim: int) -> bool:
    return isinstance(dim, int) and dim in (-1, ndim - 1)


def _calls(node: fx.Node, method: str, functions: set) -> bool:
    """``node`` is ``x.method(...)`` or one of ``functions`` called on x."""
    return (node.op == "call_method" and node.target == method) or \
        (node.op == "call_function" and node.target in functions)


def _log_softmax_over_last(node: fx.Node) -> Optional[bool]:
    """For a log_softmax node: whether it upcasts to float32 (``dtype=torch.float32``); None where
    ``node`` is not a log_softmax over the last dimension with nothing else."""
    if not _calls(node, "log_softmax", _LOG_SOFTMAX_FUNCTIONS):
        return None
    kwargs = dict(node.kwargs)
    names = ("dim", "_stacklevel", "dtype") if node.target is F.log_softmax else ("dim", "dtype")
    for name, value in zip(names, node.args[1:]):
        kwargs.setdefault(name, value)
    kwargs.pop("_stacklevel", None)
    x = _example(node.args[0])
    if x is None or set(kwargs) - {"dim", "dtype"} or not _last_dim(kwargs.get("dim"), x.dim()):
        return None
    dtype = kwargs.get("dtype")
    if dtype not in (None, torch.float32):
        return None
    return dtype is torch.float32


def _gather_over_last(node: fx.Node) -> Optional[fx.Node]:
    """For ``x.gather(-1, index)`` / ``torch.gather(x, -1, index)`` with one index per row (index
    of shape x.shape[:-1] + (1,)): the index node; else None."""
    if not _calls(node, "gather", {torch.gather}):
        return None
    kwargs = dict(node.kwargs)
    for name, value in zip(("dim", "index"), node.args[1:]):
        kwargs.setdefault(name, value)
    if set(kwargs) - {"dim", "index"} or kwargs.get("sparse_grad", False):
        return None
    x, index = _example(node.args[0]), kwargs.get("index")
    idx = _example(index)
    if x is None or idx is None or not _last_dim(kwargs.get("dim"), x.dim()):
        return None
    if tuple(idx.shape) != tuple(x.shape[:-1]) + (1,):
        return None
    return index


def _leading_getitem(node: fx.Node) -> bool:
    """``x[...]`` indexing the leading dimensions only (slices and integers, not the last one):
    the same indexing of the linear's input gives these rows' logits."""
    if node.op != "call_function" or node.target is not operator.getitem:
        return False
    x, index = _example(node.args[0]), node.args[1]
    if x is None:
        return False
    items = index if isinstance(index, tuple) else (index,)
    if any(i is Ellipsis or i is None or not isinstance(i, (slice, int)) for i in items):
        return False
    if any(isinstance(i, slice) and any(isinstance(v, fx.Node) for v in (i.start, i.stop, i.step)) for i in items):
        return False
    if len(items) < x.dim():
        return True
    return len(items) == x.dim() and items[-1] == slice(None)


def fuse_token_logprobs(gm: fx.GraphModule) -> int:
    """Rewrites ``log_softmax(F.linear(h, W)[rows].float(), -1).gather(-1, index)`` (the
    row indexing and the cast optional, in either order; ``dtype=torch.float32`` as the cast)
    in a Dynamo graph into :func:`token_logprobs` on ``h[rows]`` (one GEMM writing each row's
    logsumexp, the chosen token's logit a dot product): no [tokens, vocab] tensor. It applies
    where no gradient is needed (inference: sampling, scoring) and the logits and their
    log-probabilities are used by nothing else. Returns how many it rewrote; ``EVTC_LOG=debug``
    says why others were left alone."""
    rewritten = 0
    for gather in list(gm.graph.nodes):
        index = _gather_over_last(gather)
        if index is None:
            continue
        lsm = gather.args[0]
        upcast = _log_softmax_over_last(lsm) if isinstance(lsm, fx.Node) else None
        if upcast is None:
            continue
        chain, x = [], lsm.args[0]
        while isinstance(x, fx.Node) and (_is_float_cast(x) or _leading_getitem(x)):
            chain.append(x)
            x = x.args[0]
        if not (isinstance(x, fx.Node) and x.op == "call_function" and x.target in _LINEARS):
            continue
        why = None
        if any(len(n.users) != 1 for n in [x, *chain, lsm]):
            why = "the logits or their log-probabilities are used elsewhere too"
        elif (out := _example(gather)) is not None and out.requires_grad:
            why = "the log-probabilities need gradients (training keeps the unfused ops and their logits)"
        else:
            why = _token_refusal(x, index)
        if why:
            log.debug(f"log-probabilities of chosen tokens over an LM head left unfused: {why}")
            continue
        h, w = x.args[0], x.args[1]
        rows = [n for n in reversed(chain) if _leading_getitem(n)]
        with gm.graph.inserting_before(gather):
            for g in rows:  # the same rows of h: logits[rows] = linear(h[rows])
                h = gm.graph.call_function(operator.getitem, (h, g.args[1]))
            hidden = _example(x.args[0]).shape[-1]
            flat = gm.graph.call_method("reshape", (h, -1, hidden))
            tokens = gm.graph.call_method("reshape", (index, -1))
            picked = gm.graph.call_function(token_logprobs, (flat, w, tokens))
            shape = gm.graph.call_method("size", (index,))
            result = gm.graph.call_method("view", (picked, shape))
            dtype = _example(gather).dtype
            if dtype != torch.float32:
                result = gm.graph.call_method("to", (result, dtype))
        result.meta.update(gather.meta)
        gather.replace_all_uses_with(result)
        for n in [gather, lsm, *chain, x]:
            gm.graph.erase_node(n)
        rewritten += 1
        log.debug(f"LM head + log_softmax + gather fused: token_logprobs ({tuple(_example(index).shape[:-1])} "
                  f"rows, vocab {_example(w).shape[0]}): no [tokens, vocab] logits")
    if rewritten:
        gm.graph.lint()
        gm.recompile()
    return rewritten


def _token_refusal(linear: fx.Node, index: fx.Node) -> Optional[str]:
    """Why the LM head and its chosen tokens cannot run as token_logprobs (None: they can)."""
    if why := _head_refusal(linear):
        return why
    t = _example(index)
    if t is None:
        return "shapes unknown"
    if t.dtype not in (torch.int64, torch.int32):
        return f"{t.dtype} token indices (int64 or int32 only)"
    return None
