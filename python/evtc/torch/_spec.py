"""The spec strings of evtc's PyTorch ops: what the FX pass writes into the graph and the op
library (python/src/torch_ops.cpp) resolves, once per process, to a kernel and an operand plan.

A spec is a JSON object: ``expr`` (the epilogue expression), ``options`` (the kernel options,
spelled as evtc.compile's keywords), ``operands`` ([name, class] of each operand tensor, in
order), and ``outputs`` (the output names to return, in order) or ``grouped: true``; a merged
op's spec adds ``merged``: how its B and any (gate, up) row operands are made from its source
tensors.
"""
from __future__ import annotations

import json

# How an operand tensor broadcasts against the M×N epilogue (evtc's place_operand classes).
ROW, COL, SCALAR, AUX, AUX_COL = "row", "col", "scalar", "aux", "aux_col"
# place_operand's class names -> the spec's.
PLACEMENT_CLASSES = {"row_vec": ROW, "col_vec": COL, "scalar": SCALAR, "aux_row_major": AUX,
                     "aux_col_major": AUX_COL}

# Every spec the FX pass has created in this process (wait_for_compiles waits for their kernels).
created_specs: set[str] = set()


def make_spec(expr: str, options: dict, operands: list[tuple[str, str]], outputs: list[str],
              merged: dict | None = None) -> str:
    """The op's spec string. ``operands`` is [(name, class)], class one of row, col, scalar,
    aux, aux_col; ``outputs`` the output names to return, in order; ``merged`` a merged op's
    recipes (see below)."""
    s = {"expr": expr, "options": options, "operands": [list(o) for o in operands], "outputs": outputs}
    if merged:
        s["merged"] = merged
    return json.dumps(s, sort_keys=True)


def make_grouped_spec(expr: str, options: dict, operands: list[tuple[str, str]], merged: dict | None = None) -> str:
    """The grouped op's spec string (``operands`` as for :func:`make_spec`: row or scalar)."""
    s = {"expr": expr, "options": options, "operands": [list(o) for o in operands], "grouped": True}
    if merged:
        s["merged"] = merged
    return json.dumps(s, sort_keys=True)


# A merged op's recipes: {"b": [gate, up], "rows": {name: [gate, up]}}, each recipe
# {"source": index into the op's source tensors, "views": [[op, int args...], ...]} with op one of
# permute (dims), t, transpose (d0, d1), slice (dim, start, end, step), view (sizes). The op
# library reads them (`apply` in python/src/torch_ops.cpp), also for the fake implementations
# (torch.ops.evtc._merged_n).
