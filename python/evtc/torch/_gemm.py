"""The GEMM a chain starts from: mm, addmm, _scaled_mm and _grouped_mm, as the root of an
epilogue."""
from __future__ import annotations

from typing import Optional

import torch
from torch import fx

from .. import _evtc
from ._chain import (EVTC_DTYPES, FP8_DTYPES, GEMM_OPERAND_DTYPES, Chain, Refused, arg_expr, cast_to, concrete, const,
                     names_of, same_shape, val)

aten = torch.ops.aten

GROUPED_MM = aten._grouped_mm.default
GEMMS = (aten.mm.default, aten.addmm.default, aten._scaled_mm.default, GROUPED_MM)
# GEMMs evtc recognises but has no kernel for yet.
UNSUPPORTED_GEMMS = {
    aten.bmm.default: "batched GEMM (bmm) has no evtc kernel yet",
    aten.baddbmm.default: "batched GEMM (baddbmm) has no evtc kernel yet",
}


def layout(t: torch.Tensor, what: str) -> str:
    """'row' or 'col' for a 2-D operand whose rows or columns are contiguous (evtc's
    matrix_layout, the rule the runtime binds A and B with)."""
    r, c = (concrete(x) for x in t.shape)
    s0, s1 = (concrete(x) for x in t.stride())
    found = _evtc.matrix_layout(r, c, s0, s1)
    if found is None:
        raise Refused(f"{what} has strides ({s0}, {s1}): neither its rows nor its columns are contiguous")
    return found


def _operands(gemm: fx.Node, fp8: bool) -> tuple[fx.Node, fx.Node, torch.Tensor, torch.Tensor]:
    a, b = (gemm.args[1], gemm.args[2]) if gemm.target is aten.addmm.default else gemm.args[:2]
    ta, tb = val(a), val(b)
    if ta is None or tb is None or ta.dim() != 2 or tb.dim() != 2:
        raise Refused("A and B must be 2-D tensors with metadata")
    allowed = FP8_DTYPES if fp8 else GEMM_OPERAND_DTYPES
    if ta.dtype not in allowed or tb.dtype != ta.dtype:
        raise Refused(f"{ta.dtype} x {tb.dtype} GEMM: evtc kernels take {names_of(GEMM_OPERAND_DTYPES)} operands, or "
                      f"{names_of(FP8_DTYPES)} through _scaled_mm")
    if ta.device.type != "cuda":
        raise Refused(f"the GEMM runs on {ta.device}")
    return a, b, ta, tb


def start_chain(gemm: fx.Node) -> Chain:
    """The chain holding just the GEMM: its expression is the GEMM's result as eager rounds it."""
    if gemm.target in UNSUPPORTED_GEMMS:
        raise Refused(UNSUPPORTED_GEMMS[gemm.target])
    if gemm.target is GROUPED_MM:
        return _start_grouped(gemm)
    fp8 = gemm.target is aten._scaled_mm.default
    a, b, ta, tb = _operands(gemm, fp8)
    out = val(gemm)
    options = {"a_dtype": EVTC_DTYPES[ta.dtype], "b_dtype": EVTC_DTYPES[tb.dtype],
               "a_layout": layout(ta, "A"), "b_layout": layout(tb, "B")}
    if fp8 and (options["a_layout"], options["b_layout"]) != ("row", "col"):
        raise Refused("_scaled_mm needs row-major A and column-major B")
    chain = Chain(gemm=gemm, a=a, b=b, options=options, full_shape=tuple(out.shape), gemm_dtype=out.dtype)
    chain.nodes.append(gemm)
    chain.define(gemm, cast_to(out.dtype, _root_expr(chain, gemm)))
    return chain


def _root_expr(chain: Chain, gemm: fx.Node) -> str:
    if gemm.target is aten.mm.default:
        return "acc"
    if gemm.target is aten.addmm.default:
        beta = gemm.kwargs.get("beta", 1)
        alpha = gemm.kwargs.get("alpha", 1)
        acc = "acc" if alpha == 1 else f"{const(alpha)} * acc"
        bias = arg_expr(chain, gemm.args[0])
        return f"{acc} + {bias}" if beta == 1 else f"{acc} + {const(beta)} * {bias}"
    return _scaled_mm_expr(chain, gemm)


def _arg(gemm: fx.Node, index: int, name: str, default=None):
    if name in gemm.kwargs:
        return gemm.kwargs[name]
    return gemm.args[index] if len(gemm.args) > index else default


def _scaled_mm_expr(chain: Chain, gemm: fx.Node) -> str:
    scale_a, scale_b = _arg(gemm, 2, "scale_a"), _arg(gemm, 3, "scale_b")
    bias: Optional[fx.Node] = _arg(gemm, 4, "bias")
    if _arg(gemm, 5, "scale_result") is not None:
        raise Refused("_scaled_mm with scale_result")
    for s, what in ((scale_a, "scale_a"), (scale_b, "scale_b")):
        t = val(s)
        if t is None or t.dtype != torch.float32:
            raise Refused(f"_scaled_mm {what} must be an f32 tensor")
    if _block_scaled(chain, val(scale_a), val(scale_b)):
        # DeepSeek-V3's 1×128 / 128×128 block scales: the main loop applies them (the kernel's
        # fp8_blockwise option); the op passes them beside A and B.
        chain.options["fp8_blockwise"] = True
        chain.operands[scale_a] = ("@scale_a", "block_scale")
        chain.operands[scale_b] = ("@scale_b", "block_scale")
        return "acc" if bias is None else f"acc + {arg_expr(chain, bias)}"
    # Rowwise scales are (M, 1) and (1, N), tensorwise ones have one element: both broadcast
    # against the M×N result as the epilogue reads them.
    expr = f"acc * {arg_expr(chain, scale_a)} * {arg_expr(chain, scale_b)}"
    if bias is not None:
        expr = f"{expr} + {arg_expr(chain, bias)}"
    return expr


def _block_scaled(chain: Chain, sa: torch.Tensor, sb: torch.Tensor) -> bool:
    """Whether _scaled_mm's scales are the 1×128 (A: M × ceil(K/128)) and 128×128 (B:
    ceil(K/128) × ceil(N/128)) block scales rather than row-wise or tensor-wise ones (where the
    two coincide, K ≤ 128 and N ≤ 128 on one block, they mean the same product)."""
    if sa.dim() != 2 or sb.dim() != 2:
        return False
    ta, tb = val(chain.a), val(chain.b)
    sizes = [*ta.shape, tb.shape[1], *sa.shape, *sb.shape]
    if not all(isinstance(s, int) for s in sizes):
        # Compared by expression (same_shape), which adds no guard to the compiled graph.
        if not same_shape(sb.shape, (1, tb.shape[1])) and not same_shape(sb.shape, (1, 1)):
            raise Refused("block-scaled _scaled_mm with symbolic sizes")
        return False
    m, k = ta.shape
    n = tb.shape[1]
    block = _evtc.FP8_SCALE_BLOCK
    kb, nb = -(-k // block), -(-n // block)
    rowwise = tuple(sa.shape) == (m, 1) and tuple(sb.shape) == (1, n)
    return not rowwise and tuple(sa.shape) == (m, kb) and tuple(sb.shape) == (kb, nb)


def _start_grouped(gemm: fx.Node) -> Chain:
    """The chain of a ``_grouped_mm(x, w, offs)``: x is the tokens (sum of M_g × K), w the
    G × K × N weights, offs the groups' int32 end offsets (the MoE form GroupedKernel runs)."""
    x, w = gemm.args[:2]
    offs, bias, out_dtype = _arg(gemm, 2, "offs"), _arg(gemm, 3, "bias"), _arg(gemm, 4, "out_dtype")
    tx, tw, out = val(x), val(w), val(gemm)
    if tx is None or tw is None or out is None:
        raise Refused("_grouped_mm operands without tensor metadata")
    if tx.dim() != 2 or tw.dim() != 3:
        raise Refused(f"_grouped_mm of a {tx.dim()}-D and a {tw.dim()}-D operand: evtc fuses the 2-D tokens × "
                      "3-D weights form (one weight matrix per group)")
    if offs is None:
        raise Refused("_grouped_mm without offs")
    if bias is not None:
        raise Refused("_grouped_mm with bias")
    if tx.dtype not in GEMM_OPERAND_DTYPES or tw.dtype != tx.dtype:
        raise Refused(f"{tx.dtype} x {tw.dtype} _grouped_mm: evtc's grouped kernels take {names_of(GEMM_OPERAND_DTYPES)} "
                      "operands")
    if out.dtype not in EVTC_DTYPES:
        raise Refused(f"_grouped_mm with out_dtype {out_dtype}")
    if tx.device.type != "cuda":
        raise Refused(f"the GEMM runs on {tx.device}")
    # Each group's K×N matrix: K contiguous (stacked nn.Linear weights, transposed) is what a
    # K-major kernel reads; N contiguous what an N-major one reads. Others are copied by the op.
    b_layout = "col" if tw.stride(1) == 1 else "row"
    options = {"a_dtype": EVTC_DTYPES[tx.dtype], "b_dtype": EVTC_DTYPES[tw.dtype], "a_layout": "row",
               "b_layout": b_layout}
    chain = Chain(gemm=gemm, a=x, b=w, options=options, full_shape=tuple(out.shape), grouped=True, offsets=offs,
                  gemm_dtype=out.dtype)
    chain.nodes.append(gemm)
    chain.define(gemm, cast_to(out.dtype, "acc"))
    return chain
