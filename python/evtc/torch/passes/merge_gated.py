"""merge_gated: one gated GEMM for two projections that meet in a gated activation.

Forms (ATen graphs, as Inductor's post-grad graphs and make_fx write them):

- two GEMMs with the same A (the same node, or the same view of one) and B operands of one
  shape, ``mm``/``addmm`` or ``_grouped_mm`` with the same offsets, whose results are combined
  by their consumers: ``silu(x @ w1.T) * (x @ w3.T)`` (LLaMA, Mistral, Qwen), GeGLU, GPT-OSS's
  and swiglu7's clamped forms, with or without biases;
- one GEMM whose result is split into halves along N (``chunk(2, -1)``, ``split(N/2, -1)``,
  ``h[..., :N/2]`` / ``h[..., N/2:]``) that are combined the same way (a fused gate_up
  projection).

The merged GEMM computes h over B with gate and up columns interleaved (gate j at 2j, up j at
2j+1), so gate(h) and up(h) of evtc's gated expressions are the two projections, and its
epilogue is the consumers' chain: it writes only the M × N/2 result. Where a training graph
saves the gate or up pre-activation for backward the GEMMs stay apart (see _check_escapes).

Where the interleaved B comes from:
- constants (Inductor's freezing): it is built once here, as a new constant of the graph;
- otherwise the op ``evtc::gemm_epilogue_merged`` takes the weights themselves. Where they are
  the even and odd features of one buffer (``evtc.torch.merge_projections``), it reads that
  buffer in place. Else it keeps an interleaved copy, rebuilt when their version counters
  change (an optimizer step, ``load_state_dict``, ``w.add_()``); replays of a CUDA graph run
  no host code and would not notice, so under CUDA graphs the merge needs weights merged in
  place or constant (freezing).
"""
from __future__ import annotations

import itertools
import operator
from typing import Optional

import torch
from torch import fx

from ..._gated import interleave_pairs, interleaved_in_place
from .._chain import (EVTC_DTYPES, GEMM_OPERAND_DTYPES, Chain, MergedB, Refused, cast_to, concrete, names_of,
                      same_shape, val)
from .._fusion import escaping, grow
from .._gemm import GROUPED_MM, layout
from . import fuse_chains

aten = torch.ops.aten
MM, ADDMM = aten.mm.default, aten.addmm.default
VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)
SPLITS = (aten.split.Tensor, aten.split_with_sizes.default)
INT64_MAX = 2**63 - 1


def run(graph: fx.Graph, settings, report) -> None:
    if not settings.merge_gated:
        return
    for roots in list(_pairs(graph)) + list(_halves(graph)):
        if any(getattr(g, "_erased", False) for g in roots.gemms):
            continue  # a GEMM of this candidate was merged already
        try:
            chain = _start(graph, roots, settings)
            grow(graph, chain)
            _check_meets(chain, roots)
            _check_escapes(chain, roots)
            _check_cuda_graphs(chain, roots)
            report.fused.append(fuse_chains.fuse(graph, chain, settings))
            _erase_dead_views(graph, [roots.b_gate, roots.b_up, *(roots.bias or ()), *roots.made])
        except Refused as why:
            report.refused.append((roots.gemms[0].name, f"merging {' + '.join(g.name for g in roots.gemms)}: {why}"))
            _undo(graph, roots)


class Roots:
    """A merge candidate: A, the B operands of the gate and up halves (K × N/2 each, made as
    views when the halves come from one GEMM), optional (gate, up) bias vectors, and the nodes
    whose values are the gate and up halves of h."""

    def __init__(self, a, gemms, gate, up, b_gate, b_up, bias=None, grouped=False, offsets=None, made=()):
        self.a, self.gemms, self.gate, self.up = a, gemms, gate, up
        self.b_gate, self.b_up, self.bias = b_gate, b_up, bias
        self.grouped, self.offsets = grouped, offsets
        self.made = list(made)  # view nodes created for this candidate (erased if it is refused)
        self.buffers: list[str] = []  # constants registered for it (deleted if it is refused)
        self.members: list[fx.Node] = []  # split/getitem/view nodes between the GEMM and the halves


# --- finding candidates ----------------------------------------------------------------------

def _a_key(a: fx.Node):
    """Two GEMMs share A when they read the same node or the same view of one node."""
    if a.op == "call_function" and a.target in VIEWS:
        return ("view", a.args[0], tuple(str(s) for s in a.args[1]))
    return a


def _plain(gemm: fx.Node) -> bool:
    """A mm, an addmm with alpha = beta = 1, or a _grouped_mm(x, w, offs) without bias."""
    if gemm.target is MM:
        return True
    if gemm.target is ADDMM:
        return gemm.kwargs.get("alpha", 1) == 1 and gemm.kwargs.get("beta", 1) == 1
    if gemm.target is GROUPED_MM:
        args = list(gemm.args) + [None] * 5
        return (len(gemm.args) >= 3 or "offs" in gemm.kwargs) and args[3] is None and "bias" not in gemm.kwargs
    return False


def _gemm_parts(gemm: fx.Node):
    """(A, B, bias or None, offsets or None) of a plain GEMM."""
    if gemm.target is ADDMM:
        return gemm.args[1], gemm.args[2], gemm.args[0], None
    if gemm.target is GROUPED_MM:
        offs = gemm.args[2] if len(gemm.args) > 2 else gemm.kwargs.get("offs")
        return gemm.args[0], gemm.args[1], None, offs
    return gemm.args[0], gemm.args[1], None, None


def _pairs(graph: fx.Graph):
    by_a: dict = {}
    for n in graph.nodes:
        if n.op == "call_function" and n.target in (MM, ADDMM, GROUPED_MM) and _plain(n):
            a, b, bias, offs = _gemm_parts(n)
            tb = val(b)
            if tb is None or val(n) is None:
                continue
            key = (_a_key(a), n.target is GROUPED_MM, offs, tuple(str(s) for s in tb.shape), tb.dtype,
                   bias is not None)
            by_a.setdefault(key, []).append(n)
    for key, gemms in by_a.items():
        if len(gemms) < 2:
            continue
        for g, u in itertools.combinations(gemms, 2):
            if not _meet(g, u):
                continue
            a, bg, biasg, offs = _gemm_parts(g)
            _, bu, biasu, _ = _gemm_parts(u)
            bias = (biasg, biasu) if biasg is not None else None
            yield Roots(a, [g, u], g, u, bg, bu, bias, grouped=g.target is GROUPED_MM, offsets=offs)


def _descendants(node: fx.Node, limit: int = 64) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    todo = [node]
    while todo and len(seen) < limit:
        for u in todo.pop().users:
            if u not in seen:
                seen.add(u)
                todo.append(u)
    return seen


def _meet(g: fx.Node, u: fx.Node) -> bool:
    """Whether the two GEMMs' results are combined by a later node (within a few hops)."""
    return bool(_descendants(g) & _descendants(u))


def _halves(graph: fx.Graph):
    """GEMMs whose only use is being split into two halves along N."""
    for n in list(graph.nodes):
        if n.op != "call_function" or n.target not in (MM, ADDMM, GROUPED_MM) or not _plain(n):
            continue
        h, members = n, []
        while len(h.users) == 1 and next(iter(h.users)).target in VIEWS:
            h = next(iter(h.users))
            members.append(h)
        halves = _split_halves(h)
        if halves is None:
            continue
        members += halves[2]
        a, b, bias, offs = _gemm_parts(n)
        tb = val(b)
        width = concrete(tb.shape[-1])
        if width % 2:
            continue
        half = width // 2
        made: list[fx.Node] = []
        bg = _slice(b, -1, 0, half, made)
        bu = _slice(b, -1, half, width, made)
        bias_pair = (_slice(bias, -1, 0, half, made), _slice(bias, -1, half, width, made)) if bias is not None else None
        r = Roots(a, [n], halves[0], halves[1], bg, bu, bias_pair, grouped=n.target is GROUPED_MM, offsets=offs,
                  made=made)
        r.members = members
        yield r


def _split_halves(h: fx.Node):
    """(first half, second half, nodes in between) when every use of ``h`` takes one of its two
    halves along the last dimension, else None."""
    t = val(h)
    if t is None:
        return None
    width = t.shape[-1]
    if not isinstance(width, int) or width % 2:
        return None
    half = width // 2
    users = list(h.users)
    if len(users) == 1 and users[0].target in SPLITS:
        s = users[0]
        dim = s.args[2] if len(s.args) > 2 else s.kwargs.get("dim", 0)
        sizes = s.args[1]
        if dim % t.dim() != t.dim() - 1:
            return None
        if s.target is aten.split.Tensor and sizes != half:
            return None
        if s.target is aten.split_with_sizes.default and list(sizes) != [half, half]:
            return None
        items = {u.args[1]: u for u in s.users if u.target is operator.getitem}
        if set(items) != {0, 1} or len(s.users) != 2:
            return None
        return items[0], items[1], [s, items[0], items[1]]
    if len(users) == 2 and all(u.target is aten.slice.Tensor for u in users):
        parts = {}
        for u in users:
            dim = u.args[1] if len(u.args) > 1 else 0
            start = u.args[2] if len(u.args) > 2 else None
            end = u.args[3] if len(u.args) > 3 else None
            step = u.args[4] if len(u.args) > 4 else 1
            if dim % t.dim() != t.dim() - 1 or step != 1:
                return None
            start = 0 if start is None else start
            end = width if end is None or end >= width else end
            parts[(start, end)] = u
        if set(parts) != {(0, half), (half, width)}:
            return None
        return parts[(0, half)], parts[(half, width)], [parts[(0, half)], parts[(half, width)]]
    return None


def _slice(node: fx.Node, dim: int, start: int, end: int, made: list[fx.Node]) -> fx.Node:
    with node.graph.inserting_after(node):
        s = node.graph.call_function(aten.slice.Tensor, (node, dim % val(node).dim(), start, end))
    s.meta["val"] = val(node).narrow(dim, start, end - start)
    made.append(s)
    return s


def _erase_dead_views(graph: fx.Graph, nodes) -> None:
    """Views of weights the merged op no longer reads (it takes the weights themselves)."""
    todo = [n for n in nodes if isinstance(n, fx.Node)]
    while todo:
        n = todo.pop()
        if getattr(n, "_erased", False) or n.users or n.op != "call_function" or n.target not in _VIEW_OPS:
            continue
        source = n.args[0]
        graph.erase_node(n)
        if isinstance(source, fx.Node):
            todo.append(source)


def _undo(graph: fx.Graph, roots: Roots) -> None:
    for n in reversed(roots.made):
        if n.graph is graph and not n.users:
            graph.erase_node(n)
    for name in roots.buffers:
        if graph.owning_module is not None and hasattr(graph.owning_module, name):
            delattr(graph.owning_module, name)


# --- building the merged chain ---------------------------------------------------------------

def _start(graph: fx.Graph, roots: Roots, settings) -> Chain:
    """The chain of the merged GEMM before its consumers are taken in: h (acc, plus the merged
    bias, rounded as eager rounds each GEMM's output), and the gate and up halves of it."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    first = min(roots.gemms, key=order.__getitem__)
    out = val(roots.gemms[0])
    ta, tg = val(roots.a), val(roots.b_gate)
    if ta.dtype not in GEMM_OPERAND_DTYPES or tg.dtype != ta.dtype:
        raise Refused(f"{ta.dtype} x {tg.dtype} GEMMs: gated kernels take {names_of(GEMM_OPERAND_DTYPES)} operands")
    if ta.device.type != "cuda":
        raise Refused(f"the GEMMs run on {ta.device}")
    for b in (roots.b_gate, roots.b_up):
        if not _is_weight(b):
            raise Refused(f"B operand {b.name} is computed in the graph, not a weight: interleaving it would "
                          "copy it at every call")
    constant = _constant_b(graph, roots)
    if roots.grouped:
        options = {"a_dtype": EVTC_DTYPES[ta.dtype], "b_dtype": EVTC_DTYPES[tg.dtype], "a_layout": "row",
                   "b_layout": "col"}
    else:
        options = {"a_dtype": EVTC_DTYPES[ta.dtype], "b_dtype": EVTC_DTYPES[tg.dtype],
                   "a_layout": layout(ta, "A"), "b_layout": "col"}
    gate_shape = val(roots.gate).shape
    full = tuple(gate_shape[:-1]) + (2 * gate_shape[-1],)
    chain = Chain(gemm=first, a=roots.a, b=roots.b_gate, options=options, full_shape=full, grouped=roots.grouped,
                  offsets=roots.offsets, gemm_dtype=out.dtype)
    bias_dtype = None  # the merged bias "xb", when the GEMMs have biases
    if constant is not None:
        chain.b, bias = constant
        if bias is not None:
            chain.operands[bias] = ("xb", "row")
            bias_dtype = val(bias).dtype
    else:
        merged = chain.merged = MergedB(roots.b_gate, roots.b_up)
        merged.b = (_recipe(roots.b_gate, merged.sources), _recipe(roots.b_up, merged.sources))
        if roots.bias is not None:
            bg, bu = roots.bias
            tbg = val(bg)
            if tbg is None or tbg.dim() != 1 or val(bu) is None or not same_shape(val(bu).shape, tbg.shape):
                raise Refused("the biases are not two vectors of N/2 values")
            merged.rows["xb"] = [_recipe(bg, merged.sources), _recipe(bu, merged.sources)]
            bias_dtype = tbg.dtype
    h = "acc"
    if bias_dtype is not None:
        chain.declarations.append(f"input xb[n]: {EVTC_DTYPES[bias_dtype]}")
        h = "acc + xb"
    chain.merged_from = list(roots.gemms)
    chain.lines.append(f"h = {cast_to(out.dtype, h)}")
    chain.nodes += list(roots.gemms) + roots.members
    for gemm in roots.gemms:  # their values are halves of h: named for cleanup, never read
        chain.exprs[gemm] = "h"
    chain.define(roots.gate, "gate(h)")
    chain.define(roots.up, "up(h)")
    chain.half.update({roots.gate, roots.up})
    for node in roots.members:
        chain.exprs.setdefault(node, "h")
    return chain


def _in_place(roots: Roots) -> bool:
    """Whether the op will read the weights (and biases) themselves, with no copy: the gate and
    up halves are the even and odd features of one buffer (see evtc.torch.merge_projections),
    as the traced values show. The op applies the same rule to the tensors of every call."""
    bg, bu = val(roots.b_gate), val(roots.b_up)
    if bg is None or bu is None or not interleaved_in_place(bg.transpose(-2, -1), bu.transpose(-2, -1), -2):
        return False
    if roots.bias is None:
        return True
    vg, vu = (val(b) for b in roots.bias)
    return vg is not None and vu is not None and interleaved_in_place(vg, vu, -1)


def _check_meets(chain: Chain, roots: Roots) -> None:
    """The merge pays only when the halves are combined inside the chain: some chain value
    depends on both (else they are two separate projections, e.g. a key and a value)."""
    gate_side, up_side = {roots.gate}, {roots.up}
    for n in chain.nodes:
        ins = set(n.all_input_nodes)
        if ins & gate_side:
            gate_side.add(n)
        if ins & up_side:
            up_side.add(n)
    if not (gate_side & up_side):
        raise Refused("the two halves are not combined by an epilogue op")


def _check_escapes(chain: Chain, roots: Roots) -> None:
    """A half used outside the chain on its own (the pre-activations a training graph saves for
    backward) keeps the GEMMs apart. The merged kernel can write them as more M × N/2 outputs,
    but on an H100 that measured slower than the two GEMMs and Inductor's kernel: with it,
    bench/models.py's transformers LLaMA training step ran 0.93x plain compile (control
    0.98x), and the LLaMA MLP's 0.92x with every chain fused. So it is not made."""
    for o in escaping(chain):
        if chain.exprs[o] in (chain.exprs[roots.gate], chain.exprs[roots.up]):
            raise Refused(f"{o.name}, the {'gate' if chain.exprs[o] == chain.exprs[roots.gate] else 'up'} "
                          "projection's own output, is used outside the gated expression (e.g. saved for "
                          "backward): a merged kernel writing it too measured slower than the separate GEMMs")


def _check_cuda_graphs(chain: Chain, roots: Roots) -> None:
    """Under CUDA graphs the op must read the weights themselves: replays run no host code, so
    an interleaved copy could not follow in-place weight updates."""
    if chain.merged is not None and torch._inductor.config.triton.cudagraphs and not _in_place(roots):
        raise Refused("under CUDA graphs an interleaved copy of the weights could not follow in-place weight "
                      "updates between replays: merging needs the weights interleaved in place "
                      "(evtc.torch.merge_projections(model)) or frozen (torch._inductor.config.freezing = True)")


def _view_chain(node: fx.Node) -> tuple[fx.Node, list[fx.Node]]:
    """The node ``node`` is a view of, through view ops, and those views (outermost first)."""
    views = []
    while node.op == "call_function" and node.target in _VIEW_OPS:
        views.append(node)
        node = node.args[0]
    return node, views


def _is_weight(node: fx.Node) -> bool:
    """Whether ``node`` is a view of a graph input or constant (not computed in the graph)."""
    return _view_chain(node)[0].op in ("placeholder", "get_attr")


def _static_ints(values, what: str) -> list[int]:
    if not all(isinstance(v, int) for v in values):
        raise Refused(f"{what} has symbolic sizes")
    return [int(v) for v in values]


def _recipe(node: fx.Node, sources: list[fx.Node]) -> dict:
    """How the op makes ``node`` from a graph input: the source's index (added to
    ``sources``) and the view steps (see _spec). The op receives the graph input itself, whose
    version counter in-place updates move (views the compiled code makes at run time have
    their own), so its cached copy knows when to rebuild."""
    source, views = _view_chain(node)
    if source.op not in ("placeholder", "get_attr"):
        raise Refused(f"{node.name} is computed in the graph, not a view of a weight")
    steps = []
    for n in views:
        args = list(n.args[1:])
        if n.target is aten.permute.default:
            steps.append(["permute", *_static_ints(args[0], n.name)])
        elif n.target is aten.t.default:
            steps.append(["t"])
        elif n.target is aten.transpose.int:
            steps.append(["transpose", *_static_ints(args[:2], n.name)])
        elif n.target is aten.slice.Tensor:
            dim, start, end, step = (args + [0, None, None, 1][len(args):])[:4]
            start = 0 if start is None else start
            end = INT64_MAX if end is None else end
            steps.append(["slice", *_static_ints([dim, start, end, step], n.name)])
        elif n.target in VIEWS:
            steps.append(["view", *_static_ints(args[0], n.name)])
    if source not in sources:
        sources.append(source)
    return {"source": sources.index(source), "views": list(reversed(steps))}


# --- constant weights (freezing) ----------------------------------------------------------------

_VIEW_OPS = {aten.permute.default, aten.t.default, aten.transpose.int, aten.slice.Tensor, aten.view.default,
             aten.reshape.default, aten._unsafe_view.default, aten.alias.default, aten.detach.default}


def _constant_value(gm, node) -> Optional[torch.Tensor]:
    """The real tensor of a node computed from graph constants by views only, else None."""
    if not isinstance(node, fx.Node):
        return None
    if node.op == "get_attr":
        t = gm
        for part in node.target.split("."):
            t = getattr(t, part, None)
        return t if isinstance(t, torch.Tensor) and not isinstance(t, torch._subclasses.FakeTensor) else None
    if node.op == "call_function" and node.target in _VIEW_OPS:
        base = _constant_value(gm, node.args[0])
        if base is None:
            return None
        return node.target(base, *node.args[1:], **node.kwargs)
    return None


_constant_count = itertools.count()


def _constant_b(graph: fx.Graph, roots: Roots):
    """With constant weights: (the interleaved B node (K × N view of an N × K constant), the
    interleaved bias node or None), made now; None when a weight is not a constant."""
    gm = graph.owning_module
    if gm is None:
        return None
    bg, bu = _constant_value(gm, roots.b_gate), _constant_value(gm, roots.b_up)
    if bg is None or bu is None:
        return None
    biases = None
    if roots.bias is not None:
        biases = [_constant_value(gm, b) for b in roots.bias]
        if any(b is None for b in biases):
            return None
    from torch._guards import detect_fake_mode

    fake_mode = detect_fake_mode([val(roots.a)])

    def constant(t: torch.Tensor, name: str) -> fx.Node:
        gm.register_buffer(name, t)
        roots.buffers.append(name)
        first = next(iter(graph.nodes))
        with graph.inserting_before(first):
            node = graph.get_attr(name)
        # static_shapes: a constant's sizes are fixed (fresh symbols would have no source to
        # guard on)
        node.meta["val"] = fake_mode.from_tensor(t, static_shapes=True) if fake_mode is not None else t
        return node

    i = next(_constant_count)
    with torch.no_grad():
        if roots.grouped:  # G × K × N/2 each -> G × N × K rows interleaved, viewed as G × K × N
            w = interleave_pairs(bg.transpose(1, 2), bu.transpose(1, 2), 1)
            node = constant(w, f"_evtc_merged_w{i}")
            with graph.inserting_after(node):
                b = graph.call_function(aten.transpose.int, (node, 1, 2))
            b.meta["val"] = val(node).transpose(1, 2)
        else:  # K × N/2 each -> N × K rows interleaved, viewed as K × N
            w = interleave_pairs(bg.t(), bu.t(), 0)
            node = constant(w, f"_evtc_merged_w{i}")
            with graph.inserting_after(node):
                b = graph.call_function(aten.permute.default, (node, [1, 0]))
            b.meta["val"] = val(node).permute(1, 0)
        roots.made += [b, node]
        bias_node = None
        if biases is not None:
            merged_bias = interleave_pairs(biases[0], biases[1], -1)
            bias_node = constant(merged_bias, f"_evtc_merged_b{i}")
            roots.made.append(bias_node)
    return b, bias_node
