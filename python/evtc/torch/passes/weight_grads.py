"""weight_grads: weight gradients written in the layout their parameters want, on joint graphs.

A Linear weight that is a strided view, such as the gate and up projections that
``evtc.torch.merge_projections`` makes the even and odd rows of one buffer, gets its gradient
from autograd's ``mm`` backward in the transposed (column-major) layout: that formula picks
row-major only for a weight whose transpose is exactly column-major. Autograd's gradient
accumulation wants a contiguous gradient for such a parameter, and makes one with a
transposing copy per weight and step (on an H100 at LLaMA-7B MLP sizes, about 0.4 ms per
weight).

This pass runs on the joint forward/backward graph, before it is split: a parameter gradient
that is ``permute(mm(a, b), [1, 0])`` of a 2-D parameter that is not dense becomes
``mm(bᵀ, aᵀ)``, the same values written row-major by the GEMM itself. Gradients of dense
parameters keep the layout autograd chose, which already matches them.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import fx
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.utils import _pytree as pytree

from .._chain import val

aten = torch.ops.aten


def _transposed_mm(node) -> bool:
    """Whether ``node`` is ``permute(mm(a, b), [1, 0])`` (or ``t``)."""
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return False
    if not (node.target is aten.t.default or (node.target is aten.permute.default and list(node.args[1]) == [1, 0])):
        return False
    source = node.args[0]
    return isinstance(source, fx.Node) and source.op == "call_function" and source.target is aten.mm.default


def _wants_rows(param: fx.Node, grad: fx.Node) -> bool:
    """A 2-D parameter that is not dense (so its gradient should be contiguous), whose traced
    gradient is not."""
    p, g = val(param), val(grad)
    if p is None or g is None or p.dim() != 2 or g.dim() != 2:
        return False
    if any(not isinstance(v, int) for v in (*p.shape, *p.stride(), *g.stride())):
        return False
    return not torch._prims_common.is_non_overlapping_and_dense_or_false(p) and not g.is_contiguous()


def rewrite(graph: fx.Graph) -> int:
    """Rewrites the joint graph in place; returns the number of gradients rewritten."""
    primals = [n for n in graph.nodes if n.op == "placeholder" and n.name.startswith("primals")]
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    leaves, spec = pytree.tree_flatten(output.args)
    if not primals or len(leaves) < len(primals):
        return 0
    first = len(leaves) - len(primals)  # the gradients of the primals, in their order, come last
    done = 0
    for i, (param, grad) in enumerate(zip(primals, leaves[first:])):
        if not _transposed_mm(grad) or not _wants_rows(param, grad):
            continue
        a, b = grad.args[0].args[:2]
        with graph.inserting_before(output):
            bt = graph.call_function(aten.permute.default, (b, [1, 0]))
            at = graph.call_function(aten.permute.default, (a, [1, 0]))
            rows = graph.call_function(aten.mm.default, (bt, at))
        bt.meta["val"], at.meta["val"] = val(b).permute(1, 0), val(a).permute(1, 0)
        rows.meta["val"] = torch.mm(bt.meta["val"], at.meta["val"])
        leaves[first + i] = rows
        done += 1
    if done:
        output.args = pytree.tree_unflatten(leaves, spec)
        graph.eliminate_dead_code()
    return done


class WeightGradLayoutPass(CustomGraphPass):
    """:func:`rewrite` as Inductor's ``joint_custom_post_pass``."""

    def __call__(self, graph: fx.Graph) -> None:
        rewrite(graph)

    def uuid(self) -> bytes:
        return hashlib.sha256(Path(__file__).read_bytes()).digest()
