"""stack_siblings: sibling projections of one input (attention's q, k and v) as one GEMM.

Runs after the fusing passes, on the GEMMs they left alone: ``mm``/``addmm`` nodes that read the
same A (the same node, or the same view of one), whose B operands are transposed 2-D weights
``[n_i, K]`` lying one after the other in one buffer (``evtc.torch.merge_projections`` stacks
a model's q/k/v so), become one ``evtc::stacked_linear`` over that buffer, read in place, and
each GEMM's result becomes a column slice of its ``[M, sum n_i]`` result. One GEMM instead of
several reads A once, fills the GPU with one tile grid instead of several part-filled ones,
and launches once; at decode sizes, where each projection is a short kernel, that is most of
their time (bench/README.md, "Whole models").

Siblings whose weights are separate tensors are left alone (stacking them would copy the
weights on every call); the debug log says so and names ``merge_projections``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import fx

from .. import _op
from .._chain import val
from .._fusion import fake_call
from .merge_gated import ADDMM, MM, _a_key, _gemm_parts, _plain

log = logging.getLogger("evtc.torch")
aten = torch.ops.aten
TRANSPOSES = (aten.permute.default, aten.t.default, aten.transpose.int)


@dataclass
class Stacked:
    """GEMMs run as one: their names (in the weights' order) and the merged problem's size."""

    gemms: list[str]
    m: object
    n: int
    k: object

    def describe(self) -> str:
        return f"{' + '.join(self.gemms)} as one GEMM of {self.m}x{self.n}x{self.k} (weights stacked in one buffer)"


def _weight(b: fx.Node):
    """The [n, K] weight node whose transpose is the GEMM's B, or None."""
    if not isinstance(b, fx.Node) or b.op != "call_function" or b.target not in TRANSPOSES:
        return None
    if b.target is aten.permute.default and list(b.args[1]) not in ([1, 0], [-1, -2], [1, -2], [-1, 0]):
        return None
    if b.target is aten.transpose.int and sorted(d % 2 for d in b.args[1:3]) != [0, 1]:
        return None
    w = b.args[0]
    t = val(w) if isinstance(w, fx.Node) else None
    return w if t is not None and t.dim() == 2 else None


def _candidates(graph: fx.Graph):
    """Groups of plain mm/addmm nodes with one A, bias or none, and one output dtype, whose B
    is a transposed 2-D weight: {key: [(gemm, weight, bias)]}, in graph order."""
    groups: dict = {}
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in (MM, ADDMM) or not _plain(node):
            continue
        a, b, bias, _ = _gemm_parts(node)
        w, out, ta = _weight(b), val(node), val(a)
        if w is None or out is None or ta is None or ta.dim() != 2:
            continue
        if bias is not None and (val(bias) is None or val(bias).dim() != 1):
            continue  # addmm's bias broadcast from [m, n] or a scalar: not a projection's
        key = (_a_key(a), bias is not None, out.dtype, str(ta.shape[1]))
        groups.setdefault(key, []).append((node, w, bias))
    return [g for g in groups.values() if len(g) > 1]


def _runs(members):
    """Maximal runs of members whose weights (and biases) lie one after the other in one buffer,
    in that order."""
    ordered = sorted(members, key=lambda m: (val(m[1]).untyped_storage()._cdata, val(m[1]).storage_offset()))
    runs, run = [], []
    for m in ordered:
        trial = run + [m]
        if run and not _stacked(trial):
            if len(run) > 1:
                runs.append(run)
            trial = [m]
        run = trial
    if len(run) > 1:
        runs.append(run)
    return runs


def _stacked(run) -> bool:
    weights = [val(w) for _, w, _ in run]
    if not _op.rows_of_one_buffer(weights):
        return False
    biases = [val(b) for _, _, b in run if b is not None]
    return not biases or _op.rows_of_one_buffer(biases)


def _replace(graph: fx.Graph, run) -> Stacked:
    """Inserts the stacked op before the run's first GEMM and points each GEMM's users at its
    column slice."""
    position = {n: i for i, n in enumerate(graph.nodes)}
    first = min((g for g, _, _ in run), key=position.__getitem__)
    a = _gemm_parts(first)[0]
    weights = [w for _, w, _ in run]
    biases = [b for _, _, b in run if b is not None]
    with graph.inserting_before(first):
        op = graph.call_function(_op.STACKED_LINEAR, (a, weights, biases))
    op.meta["val"] = fake_call(_op.STACKED_LINEAR, [a, weights, biases])
    start = 0
    cursor = op
    for gemm, w, _ in run:
        rows = val(w).shape[0]
        with graph.inserting_after(cursor):
            part = graph.call_function(aten.slice.Tensor, (op, 1, start, start + rows))
        part.meta["val"] = op.meta["val"][:, start:start + rows]
        gemm.replace_all_uses_with(part)
        cursor, start = part, start + rows
    for gemm, _, _ in run:
        b = _gemm_parts(gemm)[1]
        graph.erase_node(gemm)
        if isinstance(b, fx.Node) and not b.users:
            graph.erase_node(b)
    return Stacked([g.name for g, _, _ in run], val(a).shape[0], start, val(a).shape[1])


def run(graph: fx.Graph, settings, report) -> None:
    if not settings.stack_siblings:
        return
    for members in _candidates(graph):
        runs = _runs(members)
        taken = {g for r in runs for g, _, _ in r}
        left = [g.name for g, _, _ in members if g not in taken]
        if left:
            log.debug("stack_siblings: %s read the same input, but their weights are not row blocks of one buffer "
                      "(evtc.torch.merge_projections stacks q/k/v so); left as separate GEMMs", " + ".join(left))
        for r in runs:
            report.stacked.append(_replace(graph, r))
