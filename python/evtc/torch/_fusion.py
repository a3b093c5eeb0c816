"""Growing a chain over a graph and replacing it with one fused op: the machinery the FX
passes (passes/) share."""
from __future__ import annotations

import logging
import math
import operator
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import fx

from .. import _evtc
from . import _op, _spec
from ._chain import (EVTC_DTYPES, RESHAPES, WIDE_SUM, Chain, Refused, absorb, absorbable, concrete, prims,
                     residual_sum_terms, same_dim, same_shape, val)
from ._gemm import GEMMS, GROUPED_MM

log = logging.getLogger("evtc.torch")


@dataclass
class Fusion:
    gemm: str  # the GEMM node's name (the first one, for a merged pair)
    expr: str
    outputs: list[str]  # the replaced nodes (used outside the chain)
    hash: str  # the epilogue graph's hash after the passes
    spec: str  # the op's spec string
    merged: list[str] = field(default_factory=list)  # the GEMMs a merged op replaces
    estimate: dict = field(default_factory=dict)  # the cost model's numbers (passes/profitability.py)


def grow_trimmed(graph: fx.Graph, make_chain, exclude: frozenset = frozenset(),
                 residual_sums: str = "rounded") -> Chain:
    """The chain ``make_chain()`` starts, grown, then trimmed: a node at the end of the chain is
    left to Inductor where its fused kernel would move fewer bytes than the fused GEMM writing
    the node's value. That is the case for a widening cast (its consumers can read the narrower
    value and cast as they load it) and for a node read only by reductions (Inductor computes it
    inside the reduction): RMSNorm's f32 cast and square after a residual add would otherwise
    make the GEMM write two f32 tensors that the norm's reduction reads back. Nodes in ``exclude``
    stay outside. ``residual_sums`` is Settings.residual_sums (where the cast mode rounds as
    Inductor does; else "rounded"): with "recomputed", a residual sum that kernels other than
    GEMMs read (``stored_residual_sum``) stays outside too, and the chain computes outside
    residual sums again from their terms; with "f32", such a sum that a reader takes in f32 is
    written in f32 (``wide_residual_sums``), and the chain reads outside sums so written."""
    exclude = set(exclude)
    recompute = residual_sums == "recomputed"
    while True:
        chain = make_chain()
        chain.recompute_sums = recompute
        chain.read_wide_sums = residual_sums == "f32"
        grow(graph, chain, exclude)
        drop = _leaf_to_drop(chain) or (stored_residual_sum(chain) if recompute else None)
        if drop is None:
            if residual_sums == "f32":
                chain.wide_sums = wide_residual_sums(chain)
            return chain
        exclude.add(drop)


def _kernel_readers(chain: Chain, v: fx.Node) -> list[fx.Node]:
    """The ops outside the chain that read ``v`` in a kernel of their own: not GEMMs (which read
    it from memory either way) and not views (which read nothing; their readers are followed)."""
    members = set(chain.nodes)
    found = []
    for u in v.users:
        if u in members or u.op != "call_function" or u.target in GEMMS:
            continue
        found += _kernel_readers(chain, u) if u.target in RESHAPES else [u]
    return found


def _residual_adds(chain: Chain):
    """The chain's residual adds: a chain value plus an outside tensor of its shape."""
    for n in chain.nodes[chain.roots:]:
        terms = residual_sum_terms(n)
        if terms is not None and sum(t in chain.exprs for t in terms) == 1:
            yield n


def stored_residual_sum(chain: Chain):
    """A residual add of the chain whose sum is read outside the chain by an op other than a
    GEMM: Inductor would compute that sum inside the op's kernel and never store it, where the
    fused kernel stores it rounded. None if there is none. A sum read only by GEMMs or the
    graph's output is stored by either, and stays."""
    for n in _residual_adds(chain):
        readers = _kernel_readers(chain, n)
        if readers:
            log.debug("evtc: %s stays outside the chain of %s: its sum is read by %s, which computes it again "
                      "unrounded (residual_sums recomputed)", n.name, chain.gemm.name,
                      ", ".join(u.name for u in readers))
            return n
    return None


def widens(n: fx.Node) -> bool:
    """A cast of a 16-bit tensor to f32 (how a norm's decomposition starts) that something reads."""
    t = val(n)
    return n.op == "call_function" and _is_cast(n) and t is not None and t.dtype == torch.float32 and bool(n.users)


def wide_residual_sums(chain: Chain) -> set[fx.Node]:
    """The chain's residual adds whose sum some op outside it casts to f32 (a norm), or adds
    in a later GEMM's epilogue (another residual add): Inductor computes those from the two terms
    in f32 and never rounds the sum, so the fused op writes it unrounded in f32 for them. Views
    of such a sum in the chain come with it: they are the same output of the fused op."""
    values = set()
    for n in _residual_adds(chain):
        readers = _kernel_readers(chain, n)
        if any(widens(u) or residual_sum_terms(u) is not None for u in readers):
            values.add(chain.exprs[n])
    return {n for n in chain.nodes if chain.exprs.get(n) in values}


def value_bytes(n: fx.Node) -> int:
    """Bytes of a node's value (0 without metadata); symbolic sizes count as traced."""
    t = val(n)
    return math.prod(concrete(s) for s in t.shape) * t.element_size() if t is not None else 0


def _is_cast(n: fx.Node) -> bool:
    from ._chain import prims

    if n.target is prims.convert_element_type.default:
        return True
    return n.target is torch.ops.aten._to_copy.default and set(n.kwargs) <= {"dtype"}


def _leaf_to_drop(chain: Chain):
    members = set(chain.nodes)
    for n in reversed(chain.nodes[chain.roots:]):
        if any(u in members for u in n.users):
            continue  # not at the end of the chain
        if val(n) is not None and val(n).dtype == torch.bool:
            return n  # a comparison read only outside: evtc's outputs are floating point
        ins = [i for i in n.all_input_nodes if i in members]
        if _is_cast(n) and all(value_bytes(i) <= value_bytes(n) for i in ins):
            return n
        reductions = all(u.op == "call_function" and val(u) is not None and value_bytes(u) * 2 <= value_bytes(n)
                         for u in n.users)
        if reductions:
            newly_escaping = sum(value_bytes(i) for i in ins if not any(u not in members for u in i.users))
            # On a tie too: the inputs may be dropped next (a widening cast before a square).
            if 2 * value_bytes(n) >= newly_escaping + sum(value_bytes(i) for i in ins):
                return n
    return None


def grow(graph: fx.Graph, chain: Chain, exclude: set[fx.Node] = frozenset()) -> None:
    """Takes in, in graph order, every node that reads only chain values and outside tensors
    that do not depend on the chain (which would make a cycle), except those in ``exclude``."""
    chain.roots = len(chain.nodes)
    in_chain = set(chain.nodes)
    depends_on_chain: set[fx.Node] = set()
    started = False
    for n in graph.nodes:
        if n in in_chain:
            started = True
            continue
        if not started:
            continue
        inputs = n.all_input_nodes
        reads_chain = any(i in in_chain for i in inputs)
        reads_dependent = any(i in depends_on_chain for i in inputs)
        if not reads_chain and not reads_dependent:
            continue
        if reads_chain and not reads_dependent and n not in exclude and absorbable(chain, n) is None:
            try:
                absorb(chain, n)
                in_chain.add(n)
                continue
            except Refused as why:
                log.debug("evtc: %s stays outside the chain of %s: %s", n.name, chain.gemm.name, why)
        depends_on_chain.add(n)
    # A grouped GEMM alone stays with torch._grouped_mm, itself a CUTLASS kernel like evtc's. A dense
    # GEMM with nothing to fuse goes on: the cost model may still find evtc's kernel faster than
    # cuBLAS's at its shape (passes/profitability.py, "GEMMs with nothing to fuse").
    if chain.merged is None and chain.gemm.target is GROUPED_MM and len(chain.nodes) == 1:
        raise Refused(nothing_to_fuse(chain))


def nothing_to_fuse(chain: Chain) -> str:
    return f"nothing to fuse: the {chain.gemm.target.__name__.split('.')[0]} result feeds no epilogue op"


def problem_size(chain: Chain) -> tuple[int, int, int]:
    """(M, N, K) with symbolic sizes (dynamic shapes) replaced by the example values they were
    traced with."""
    ta, tb = val(chain.a), val(chain.b if chain.merged is None else chain.merged.b_gate)
    if chain.grouped:  # x: sum of M_g × K, w: G × K × N
        m, n, k = ta.shape[0], tb.shape[2], tb.shape[1]
    else:
        m, n, k = ta.shape[0], tb.shape[1], ta.shape[1]
    if chain.merged is not None:
        n = 2 * n
    return concrete(m), concrete(n), concrete(k)


def is_static(chain: Chain) -> bool:
    ta = val(chain.a)
    return all(isinstance(s, int) for s in ta.shape)


def escaping(chain: Chain) -> list[fx.Node]:
    """Chain nodes used outside the chain (the graph's output included), in chain order."""
    members = set(chain.nodes)
    return [n for n in chain.nodes if any(u not in members for u in n.users)]


def expression(chain: Chain, escaping_nodes: list[fx.Node]) -> tuple[str, list[str], dict[str, int]]:
    """The epilogue text, its output names and the output index of each value name. Nodes
    that differ only by a reshape share one value, hence one output."""
    values: list[fx.Node] = []
    for n in escaping_nodes:
        if chain.exprs[n] not in [chain.exprs[v] for v in values]:
            values.append(n)
    # Matrices y0, y1, ... with the last one D (the GEMM's own store); column sums r0, r1, ...
    matrices = [v for v in values if v not in chain.reductions]
    sums = [v for v in values if v in chain.reductions]
    names = [f"r{sums.index(v)}" if v in chain.reductions else
             "D" if v is matrices[-1] else f"y{matrices.index(v)}" for v in values]
    lines = list(chain.declarations) + list(chain.lines)
    for n in values:
        if val(n).dtype not in EVTC_DTYPES:
            raise Refused(f"{n.name} ({val(n).dtype}) is read outside the epilogue, and evtc's outputs are floating point")
    for name, n in zip(names, values):
        dtype = "f32" if n in chain.wide_sums else EVTC_DTYPES[val(n).dtype]
        lines.append(f"out {name}: {dtype} = {chain.exprs[n]}")
    return "\n".join(lines) + "\n", names, {chain.exprs[v]: i for i, v in enumerate(values)}


def output_shape(chain: Chain, node: fx.Node) -> tuple:
    """The shape the fused op gives a chain value: (M, N), (M, N/2) for a gated value, (N,) for a
    column sum."""
    m = val(chain.a).shape[0]
    n = 2 * val(chain.merged.b_gate).shape[-1] if chain.merged is not None else val(chain.b).shape[-1]
    if node in chain.reductions:
        return (n,)
    return (m, n // 2) if node in chain.half else (m, n)


def check_output_shapes(chain: Chain, escaping_nodes: list[fx.Node]) -> None:
    """Chain values are M×N (or M×N/2) matrices; a value of another shape (the 3-D view of a
    linear's output) becomes a view of the op's output."""
    for o in escaping_nodes:
        if not same_shape(val(o).shape, output_shape(chain, o)):
            view_shape(chain, o)  # raises Refused when there is no way to write the view


def view_shape(chain: Chain, o: fx.Node) -> list:
    """The shape argument of a view from the fused op's M×N output to chain value ``o``'s
    shape. With symbolic sizes (dynamic shapes), the leading sizes are those of a reshape the
    chain already has (its shape argument holds the graph's own size nodes)."""
    shape = list(val(o).shape)
    if all(isinstance(s, int) for s in shape):
        return shape
    from ._chain import RESHAPES

    for n in chain.nodes:
        if n.target in RESHAPES and len(n.args) > 1 and isinstance(n.args[1], (list, tuple)):
            t = val(n)
            if len(t.shape) == len(shape) and all(same_dim(a, b) for a, b in zip(t.shape[:-1], shape[:-1])):
                return list(n.args[1][:-1]) + [shape[-1]]
    raise Refused(f"{o.name} is a reshape of the result with symbolic sizes {shape} that no reshape of the "
                  "chain gives")


def use_output(graph: fx.Graph, chain: Chain, o: fx.Node, item: fx.Node, cursor: fx.Node) -> fx.Node:
    """Replaces the uses of chain value ``o`` by the fused op's output ``item`` (viewed to
    ``o``'s shape when that differs); returns the last node inserted."""
    if not same_shape(val(o).shape, item.meta["val"].shape):
        with graph.inserting_after(cursor):
            view = graph.call_function(torch.ops.aten.view.default, (item, view_shape(chain, o)))
        view.meta["val"] = item.meta["val"].view(val(o).shape)
        cursor = item = view
    o.replace_all_uses_with(item)
    return cursor


def use_wide_output(graph: fx.Graph, chain: Chain, o: fx.Node, item: fx.Node, cursor: fx.Node) -> fx.Node:
    """use_output for a residual sum the fused op writes in f32 (``chain.wide_sums``): its
    readers that cast it to f32 read the f32 sum instead (through the same views), the others a
    copy rounded to its dtype, which records the f32 sum for a later chain that adds it
    (``WIDE_SUM``). Returns the last node inserted."""
    dtype = val(o).dtype
    wide = item
    if not same_shape(val(o).shape, item.meta["val"].shape):
        with graph.inserting_after(cursor):
            wide = graph.call_function(torch.ops.aten.view.default, (item, view_shape(chain, o)))
        wide.meta["val"] = item.meta["val"].view(val(o).shape)
        cursor = wide
    with graph.inserting_after(cursor):
        rounded = graph.call_function(prims.convert_element_type.default, (wide, dtype))
    rounded.meta["val"] = wide.meta["val"].to(dtype)
    rounded.meta[WIDE_SUM] = wide
    cursor = rounded
    o.replace_all_uses_with(rounded)
    for u in list(rounded.users):
        if widens(u):
            u.replace_all_uses_with(wide)
            graph.erase_node(u)
        elif u.op == "call_function" and u.target in RESHAPES and any(widens(w) for w in u.users):
            with graph.inserting_after(cursor):
                view = graph.call_function(u.target, (wide, *u.args[1:]), dict(u.kwargs))
            view.meta["val"] = fake_call(u.target, [wide, *u.args[1:]]) if not u.kwargs else \
                wide.meta["val"].view(val(u).shape)
            cursor = view
            for w in [w for w in u.users if widens(w)]:
                w.replace_all_uses_with(view)
                graph.erase_node(w)
            if not u.users:
                graph.erase_node(u)
    if not rounded.users:
        graph.erase_node(rounded)
        cursor = wide
    return cursor


def erase_unused(graph: fx.Graph, chain: Chain) -> None:
    for node in reversed(chain.nodes):
        if not node.users:
            graph.erase_node(node)


def _position(graph: fx.Graph):
    index = {n: i for i, n in enumerate(graph.nodes)}
    return lambda n: index[n]


def _flat(items: list) -> list:
    """An op's arguments with their lists spread out."""
    return [x for i in items for x in (i if isinstance(i, list) else [i])]


def fake_outputs(op, inputs: list, spec: str):
    """The fused op's result on the chain's fake tensors (its node's meta["val"])."""
    return fake_call(op, [spec, *inputs])


def fake_call(op, inputs: list):
    """``op(*inputs)`` on the fake tensors of the input nodes (lists of nodes as lists), in their
    fake mode: the meta["val"] of a node inserted with those inputs."""
    from torch._guards import detect_fake_mode

    def value(x):
        return val(x) if isinstance(x, fx.Node) else x

    args = [[value(x) for x in i] if isinstance(i, list) else value(i) for i in inputs]
    mode = detect_fake_mode([t for t in _flat(args) if isinstance(t, torch.Tensor)])
    if mode is None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        return op(*args)


def replace(graph: fx.Graph, chain: Chain, spec: str, op, inputs: list, kernel_hash: str, expr: str,
            index_of: Optional[dict[str, int]], escaping_nodes: list[fx.Node], estimate: dict) -> Fusion:
    """Inserts ``op(spec, *inputs)`` after its latest input, points every escaping chain value
    at its output (``index_of``: value name -> output index, or None for a single-output op)
    and erases the chain."""
    last_input = max((i for i in _flat(inputs) if isinstance(i, fx.Node)), key=_position(graph))
    with graph.inserting_after(last_input):
        fused = graph.call_function(op, (spec, *inputs))
    fused.meta["val"] = fake_outputs(op, inputs, spec)
    cursor = fused
    items: dict[int, fx.Node] = {}
    for o in escaping_nodes:
        if index_of is None:
            cursor = use_output(graph, chain, o, fused, cursor)
            continue
        i = index_of[chain.exprs[o]]
        if i not in items:
            with graph.inserting_after(cursor):
                items[i] = cursor = graph.call_function(operator.getitem, (fused, i))
            cursor.meta["val"] = fused.meta["val"][i]
        cursor = (use_wide_output if o in chain.wide_sums else use_output)(graph, chain, o, items[i], cursor)
    erase_unused(graph, chain)
    for rounded in chain.wide_reads:  # rounded copies of f32 sums the chain read in their place
        if not rounded.users:
            graph.erase_node(rounded)
    _spec.created_specs.add(spec)
    merged = [g.name for g in chain.merged_from]
    return Fusion(chain.gemm.name, expr, [o.name for o in escaping_nodes], kernel_hash, spec, merged, estimate)


def stable_topological_sort(graph: fx.Graph) -> None:
    """Reorders nodes so that every node follows its inputs, keeping the existing order
    wherever it is already valid (a fused op is placed after its latest input, which can be
    after some users of the values it now produces)."""
    order: list[fx.Node] = []
    placed: set[fx.Node] = set()
    for root in list(graph.nodes):
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if node in placed:
                continue
            if expanded:
                placed.add(node)
                order.append(node)
                continue
            stack.append((node, True))
            for i in reversed(node.all_input_nodes):
                if i not in placed:
                    stack.append((i, False))
    prev: Optional[fx.Node] = None
    for node in order:
        if prev is not None and prev.next is not node:
            prev.append(node)
        prev = node


def intermediate_bytes(chain: Chain) -> int:
    """Bytes of the GEMM's own output (M×N in the dtype torch's GEMM writes): what an unfused
    epilogue kernel reads back, and what fusion saves writing unless a chain value equal to it
    is an output anyway."""
    m, n, _ = problem_size(chain)
    return m * n * (chain.gemm_dtype or torch.bfloat16).itemsize


def kernel_options(chain: Chain, settings) -> dict:
    """The spec's kernel options: the chain's dtypes and layouts, and the pass's settings."""
    return dict(chain.options, cast_mode=settings.cast_mode, precise_math=settings.precise_math,
                wait_for_compile=settings.wait_for_compile)


def spec_kernel_or_refuse(spec: str):
    try:
        return _op.spec_kernel(spec)[0]
    except _evtc.UserError as why:  # an epilogue evtc cannot build a kernel for
        raise Refused(str(why)) from why
