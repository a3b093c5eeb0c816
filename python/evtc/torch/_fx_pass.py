"""The FX pass: GEMM + pointwise consumer chains -> one evtc::gemm_epilogue op (or, from a
``_grouped_mm``, one evtc::grouped_gemm_epilogue op).

Works on ATen-level FX graphs with tensor metadata (node.meta["val"]): Inductor's post-grad
graphs (forward, backward, inference), or make_fx / torch.export graphs. A chain that cannot
be fused leaves the graph unchanged; the reason is recorded in the FusionReport (and printed
with EVTC_DEBUG=1).
"""
from __future__ import annotations

import logging
import operator
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import fx

from .. import _evtc
from . import _op
from ._chain import EVTC_DTYPES, Chain, Refused, absorb, absorbable, val
from ._gemm import GEMMS, GROUPED_MM, UNSUPPORTED_GEMMS, start_chain

log = logging.getLogger("evtc.torch")

# Every spec the pass has created in this process (for wait_for_compiles).
created_specs: set[str] = set()


@dataclass
class Fusion:
    gemm: str  # the GEMM node's name
    expr: str
    outputs: list[str]  # the replaced nodes (used outside the chain)
    hash: str  # the epilogue graph's hash after the passes
    spec: str  # the op's spec string


@dataclass
class FusionReport:
    fused: list[Fusion] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (GEMM node, reason)

    def summary(self) -> str:
        reasons = Counter(r for _, r in self.refused)
        text = f"evtc: fused {len(self.fused)} of {len(self.fused) + len(self.refused)} GEMMs"
        for reason, count in reasons.most_common():
            text += f"\n  refused x{count}: {reason}"
        for f in self.fused:
            text += f"\n  fused {f.gemm} -> {', '.join(f.outputs)} (graph {f.hash})"
        return text


# Reports of every graph the pass has rewritten, in order (tests and EVTC_DEBUG read them).
reports: list[FusionReport] = []


def _debug() -> bool:
    v = os.environ.get("EVTC_DEBUG", "")
    return bool(v) and v != "0"


def fuse_gemm_epilogues(graph: fx.Graph, *, cast_mode: str = "eager", compile: bool = True) -> FusionReport:
    """Rewrites every fusable GEMM + epilogue chain of ``graph`` into one evtc::gemm_epilogue.

    ``cast_mode`` is evtc's ("eager": round where eager rounds; "fast": round only at outputs).
    With ``compile``, each new kernel starts compiling in the background right away.
    """
    report = FusionReport()
    for node in list(graph.nodes):
        if node.op != "call_function" or (node.target not in GEMMS and node.target not in UNSUPPORTED_GEMMS):
            continue
        try:
            chain = start_chain(node)
            _grow(graph, chain)
            report.fused.append(_replace(graph, chain, cast_mode, compile))
        except Refused as why:
            report.refused.append((node.name, str(why)))
    if report.fused:
        _stable_topological_sort(graph)
        graph.lint()
    reports.append(report)
    if _debug():
        print(report.summary(), file=sys.stderr)
    log.debug("%s", report.summary())
    return report


def _grow(graph: fx.Graph, chain: Chain) -> None:
    """Takes in, in graph order, every node that reads only chain values and outside tensors
    that do not depend on the chain (which would make a cycle)."""
    in_chain = {chain.gemm}
    depends_on_chain: set[fx.Node] = set()
    started = False
    for n in graph.nodes:
        if n is chain.gemm:
            started = True
            continue
        if not started:
            continue
        inputs = n.all_input_nodes
        reads_chain = any(i in in_chain for i in inputs)
        reads_dependent = any(i in depends_on_chain for i in inputs)
        if not reads_chain and not reads_dependent:
            continue
        if reads_chain and not reads_dependent and absorbable(chain, n) is None:
            try:
                absorb(chain, n)
                in_chain.add(n)
                continue
            except Refused as why:
                log.debug("evtc: %s stays outside the chain of %s: %s", n.name, chain.gemm.name, why)
        depends_on_chain.add(n)
    if chain.gemm.target in (torch.ops.aten.mm.default, GROUPED_MM) and len(chain.nodes) == 1:
        raise Refused(f"nothing to fuse: the {chain.gemm.target.__name__.split('.')[0]} result feeds no epilogue op")


def _problem_size(chain: Chain, hints: bool = False) -> tuple[int, int, int]:
    """(M, N, K), with 0 for sizes that are symbolic (dynamic shapes); with ``hints``, a
    symbolic size is replaced by the example value it was traced with, where known."""
    ta, tb = val(chain.a), val(chain.b)

    def size(x) -> int:
        if isinstance(x, int):
            return x
        hint = getattr(getattr(x, "node", None), "hint", None) if hints else None
        return hint if isinstance(hint, int) else 0

    if chain.grouped:  # x: sum of M_g × K, w: G × K × N
        return size(ta.shape[0]), size(tb.shape[2]), size(tb.shape[1])
    return size(ta.shape[0]), size(tb.shape[1]), size(ta.shape[1])


def _output_shape(chain: Chain, node: fx.Node) -> tuple:
    """The shape the fused op gives a chain value: (M, N), or (M, N/2) for a gated value."""
    m = val(chain.a).shape[0]
    n = val(chain.b).shape[-1]
    return (m, n // 2) if node in chain.half else (m, n)


def _escaping(chain: Chain) -> list[fx.Node]:
    """Chain nodes used outside the chain (the graph's output included), in chain order."""
    members = set(chain.nodes)
    return [n for n in chain.nodes if any(u not in members for u in n.users)]


def _expression(chain: Chain, escaping: list[fx.Node]) -> tuple[str, list[str], dict[str, int]]:
    """The epilogue text, its output names and the output index of each value name. Nodes
    that differ only by a reshape share one value, hence one output."""
    values: list[fx.Node] = []
    for n in escaping:
        if chain.exprs[n] not in [chain.exprs[v] for v in values]:
            values.append(n)
    names = [f"y{i}" for i in range(len(values))]
    names[-1] = "D"
    lines = list(chain.declarations) + list(chain.lines)
    for name, n in zip(names, values):
        lines.append(f"out {name}: {EVTC_DTYPES[val(n).dtype]} = {chain.exprs[n]}")
    return "\n".join(lines) + "\n", names, {chain.exprs[v]: i for i, v in enumerate(values)}


def _replace(graph: fx.Graph, chain: Chain, cast_mode: str, compile: bool) -> Fusion:
    if chain.grouped:
        return _replace_grouped(graph, chain, cast_mode, compile)
    escaping = _escaping(chain)
    expr, names, index_of = _expression(chain, escaping)
    options = dict(chain.options, cast_mode=cast_mode)
    operand_nodes = list(chain.operands)
    spec = _op.make_spec(expr, options, [chain.operands[o] for o in operand_nodes], names)
    kernel, _ = _op.spec_kernel(spec)
    m, n, k = _problem_size(chain)
    if m and n and k:
        if reason := kernel.fallback_reason(m, n, k):
            raise Refused(reason)
    _check_output_shapes(chain, escaping)
    created_specs.add(spec)
    if compile:
        # The configuration follows the problem's size: compile for the traced example size.
        kernel.compile_async(*_problem_size(chain, hints=True))

    last_input = max([chain.a, chain.b, *operand_nodes], key=_position(graph))
    with graph.inserting_after(last_input):
        fused = graph.call_function(torch.ops.evtc.gemm_epilogue.default,
                                    (spec, chain.a, chain.b, operand_nodes))
    fused.meta["val"] = _fake_outputs(torch.ops.evtc.gemm_epilogue.default, spec,
                                      [chain.a, chain.b], operand_nodes)
    cursor = fused
    items: dict[int, fx.Node] = {}
    for o in escaping:
        i = index_of[chain.exprs[o]]
        if i not in items:
            with graph.inserting_after(cursor):
                items[i] = cursor = graph.call_function(operator.getitem, (fused, i))
            cursor.meta["val"] = fused.meta["val"][i]
        cursor = _use_output(graph, o, items[i], cursor)
    _erase_unused(graph, chain)
    return Fusion(chain.gemm.name, expr, [o.name for o in escaping], kernel.hash, spec)


def _check_output_shapes(chain: Chain, escaping: list[fx.Node]) -> None:
    for o in escaping:
        shape = val(o).shape
        if tuple(shape) != tuple(_output_shape(chain, o)) and not all(isinstance(s, int) for s in shape):
            raise Refused("a reshaped output with symbolic sizes")


def _use_output(graph: fx.Graph, o: fx.Node, item: fx.Node, cursor: fx.Node) -> fx.Node:
    """Replaces the uses of chain value ``o`` by the fused op's output ``item`` (viewed to
    ``o``'s shape when that differs); returns the last node inserted."""
    if tuple(val(o).shape) != tuple(item.meta["val"].shape):
        with graph.inserting_after(cursor):
            view = graph.call_function(torch.ops.aten.view.default, (item, list(val(o).shape)))
        view.meta["val"] = item.meta["val"].view(val(o).shape)
        cursor = item = view
    o.replace_all_uses_with(item)
    return cursor


def _erase_unused(graph: fx.Graph, chain: Chain) -> None:
    for node in reversed(chain.nodes):
        if not node.users:
            graph.erase_node(node)


def _replace_grouped(graph: fx.Graph, chain: Chain, cast_mode: str, compile: bool) -> Fusion:
    """_grouped_mm + epilogue -> evtc::grouped_gemm_epilogue: one output, [N] row vectors and
    scalars as operands (what GroupedKernel runs)."""
    escaping = _escaping(chain)
    if len({chain.exprs[o] for o in escaping}) != 1:
        raise Refused(f"a grouped GEMM writes one output, but {len(escaping)} values of the chain "
                      f"({', '.join(o.name for o in escaping)}) are used outside it")
    expr, _, _ = _expression(chain, escaping)
    options = dict(chain.options, cast_mode=cast_mode)
    operand_nodes = list(chain.operands)
    spec = _op.make_grouped_spec(expr, options, [chain.operands[o] for o in operand_nodes])
    try:
        kernel, _ = _op.spec_kernel(spec)
    except _evtc.UserError as why:
        raise Refused(str(why)) from why
    _check_output_shapes(chain, escaping)
    created_specs.add(spec)
    if compile:
        kernel.compile_async()
    inputs = [chain.a, chain.b, chain.offsets]
    last_input = max([*inputs, *operand_nodes], key=_position(graph))
    with graph.inserting_after(last_input):
        fused = graph.call_function(torch.ops.evtc.grouped_gemm_epilogue.default, (spec, *inputs, operand_nodes))
    fused.meta["val"] = _fake_outputs(torch.ops.evtc.grouped_gemm_epilogue.default, spec, inputs, operand_nodes)
    cursor = fused
    for o in escaping:
        cursor = _use_output(graph, o, fused, cursor)
    _erase_unused(graph, chain)
    return Fusion(chain.gemm.name, expr, [o.name for o in escaping], kernel.hash, spec)


def _position(graph: fx.Graph):
    index = {n: i for i, n in enumerate(graph.nodes)}
    return lambda n: index[n]


def _fake_outputs(op, spec: str, inputs: list[fx.Node], operand_nodes: list[fx.Node]):
    """The fused op's result on the chain's fake tensors (its node's meta["val"])."""
    from torch._guards import detect_fake_mode

    args = [val(i) for i in inputs]
    operands = [val(o) for o in operand_nodes]
    mode = detect_fake_mode(args + operands)
    if mode is None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        return op(spec, *args, operands)


def _stable_topological_sort(graph: fx.Graph) -> None:
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
