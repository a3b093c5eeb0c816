"""Translating an ATen GEMM and its pointwise consumers into an evtc epilogue expression.

A chain starts at a GEMM node (mm, addmm, _scaled_mm, _grouped_mm) and takes in, in graph
order, every node that reads a value of the chain and that evtc can compute in the epilogue:
arithmetic, activations, clamps, dtype conversions, reshapes that keep the last (N)
dimension, and the column slices ``h[:, 0::2]`` / ``h[:, 1::2]`` of a gated activation over
interleaved (gate, up) columns, which become ``gate(h)`` / ``up(h)`` with N/2 columns, and
sums of a chain value over every dimension but the last (a linear layer's bias gradient), which
become ``col_sum`` outputs. Tensors from outside the chain become operands, classified by how
they broadcast against the M×N result (row vector, column vector, scalar, full matrix), or
against the M×N/2 gated values. Every chain value that is used outside the chain becomes an
output of the fused op.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import fx

from .. import _evtc
from ._spec import AUX, AUX_COL, COL, PLACEMENT_CLASSES, ROW, SCALAR

aten = torch.ops.aten
prims = torch.ops.prims

# torch dtype -> evtc dtype name (the native dtype table's), floating types only: evtc's integer
# dtypes (i32, i64) are [m]/[n] index operands of written epilogues, which no traced chain makes.
EVTC_DTYPES = {getattr(torch, torch_name): name for name, torch_name in _evtc.torch_dtype_names().items()
               if getattr(torch, torch_name).is_floating_point}
# A and B of fused kernels, from the native table: the 16-bit ones and the fp8 ones (through
# _scaled_mm).
_TENSOR_CORE_INPUTS = [t for t, name in EVTC_DTYPES.items() if name in _evtc.tensor_core_input_dtypes()]
GEMM_OPERAND_DTYPES = tuple(t for t in _TENSOR_CORE_INPUTS if t.itemsize == 2)
FP8_DTYPES = tuple(t for t in _TENSOR_CORE_INPUTS if t.itemsize == 1)


def names_of(dtypes) -> str:
    """The evtc names of torch dtypes, for messages: "bf16 or f16", "f16, bf16 or f8e4m3"."""
    names = [EVTC_DTYPES[t] for t in dtypes]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


class Refused(Exception):
    """The chain cannot be fused; the message says why."""


def val(node: Any) -> Optional[torch.Tensor]:
    v = node.meta.get("val") if isinstance(node, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def const(x: Any) -> str:
    """An expression constant for a Python number (evtc constants are f32)."""
    if isinstance(x, bool):
        x = float(x)
    x = float(x)
    if math.isinf(x):
        x = math.copysign(3.4028234663852886e38, x)  # largest f32, as a clamp bound
    if math.isnan(x):
        raise Refused("a NaN constant")
    text = repr(x)
    return f"({text})" if x < 0 else text


@dataclass
class MergedB:
    """The B of a merged gated GEMM: its gate and up halves (K × N/2 each, ``b_gate``/``b_up``
    are their nodes) as views of graph inputs (``sources``), written as recipes the op applies
    (``b``: gate and up), and row operands made the same way (``rows``: name -> recipes)."""
    b_gate: fx.Node
    b_up: fx.Node
    sources: list[fx.Node] = field(default_factory=list)
    b: tuple = ()
    rows: dict = field(default_factory=dict)

    def spec(self) -> dict:
        return {"b": list(self.b), "rows": dict(self.rows)}


@dataclass
class Chain:
    gemm: fx.Node
    a: fx.Node
    b: fx.Node
    options: dict
    full_shape: tuple  # shape of the chain's M×N values (N last; leading dims flatten to M)
    nodes: list[fx.Node] = field(default_factory=list)  # absorbed, gemm first
    exprs: dict[fx.Node, str] = field(default_factory=dict)  # node -> expression name
    lines: list[str] = field(default_factory=list)  # statements defining the names
    operands: dict[fx.Node, tuple[str, str]] = field(default_factory=dict)  # node -> (name, class)
    declarations: list[str] = field(default_factory=list)
    half: set[fx.Node] = field(default_factory=set)  # chain values of gated (M×N/2) shape
    grouped: bool = False  # a _grouped_mm chain (operand classes it can read are fewer)
    in_half: bool = False  # while absorbing a node over gated values: operands broadcast against them
    offsets: Optional[fx.Node] = None  # _grouped_mm's group end offsets
    # A merged gated GEMM (passes/merge_gated.py): the two B operands (K × N/2 each) whose
    # columns the op interleaves, and the row operands given as (gate, up) vectors of N/2.
    merged: Optional["MergedB"] = None
    # What the GEMM's own output would have been (its dtype), for the cost model.
    gemm_dtype: Optional[torch.dtype] = None
    # The GEMMs a merged chain replaces (with a runtime-interleaved B, or a constant one).
    merged_from: list[fx.Node] = field(default_factory=list)
    # Outside activations the epilogue computes from their own input instead of reading them
    # (recomputed_operand): node -> value name.
    recomputed: dict[fx.Node, str] = field(default_factory=dict)
    values: int = 0  # value names defined so far (v0, v1, ...)
    roots: int = 0  # nodes the chain started with (before grow took in consumers)
    # Column sums of chain values (COLUMN_SUM): outputs only, complete after the kernel's last tile.
    reductions: set[fx.Node] = field(default_factory=set)
    # Settings.residual_sums "recomputed": an outside sum of two [m,n] tensors (a residual sum
    # that no kernel stored) is computed again from both terms rather than read.
    recompute_sums: bool = False
    # Settings.residual_sums "f32": residual adds of the chain whose sum the fused op writes
    # unrounded in f32 (wide_residual_sums), and whether the chain reads an outside sum that an
    # earlier fused op so wrote in f32 rather than its rounded copy (WIDE_SUM).
    wide_sums: set[fx.Node] = field(default_factory=set)
    read_wide_sums: bool = False
    wide_reads: list[fx.Node] = field(default_factory=list)  # the rounded copies read as their f32 sums

    @property
    def half_shape(self) -> tuple:
        return tuple(self.full_shape[:-1]) + (self.full_shape[-1] // 2,)

    def define(self, node: fx.Node, expr: str) -> None:
        self.exprs[node] = self.value(expr)

    def value(self, expr: str) -> str:
        """A new value name defined as ``expr``."""
        name = f"v{self.values}"
        self.values += 1
        self.lines.append(f"{name} = {expr}")
        return name

    def snapshot(self) -> tuple:
        """What an attempt to add to the chain may change, for restore()."""
        return dict(self.operands), list(self.declarations), list(self.lines), self.values, dict(self.recomputed)

    def restore(self, saved: tuple) -> None:
        self.operands, self.declarations, self.lines, self.values, self.recomputed = saved

    def has(self, n: fx.Node) -> bool:
        """Whether the epilogue already has ``n``'s value: a chain value, an operand it reads, or
        one it computes again."""
        return n in self.exprs or n in self.operands or n in self.recomputed


def cast_to(dtype: torch.dtype, expr: str) -> str:
    """The expression rounded as eager rounds a tensor of ``dtype`` (f32 needs no rounding)."""
    if dtype == torch.float32:
        return expr
    if dtype not in EVTC_DTYPES:
        raise Refused(f"dtype {dtype} is not one evtc computes in")
    return f"{EVTC_DTYPES[dtype]}({expr})"


# --- operands from outside the chain -----------------------------------------------------------

def same_dim(a: Any, b: Any) -> bool:
    """Sizes equal, symbolic ones by their expression: comparing SymInts with == would add a
    guard to the compiled graph (and the pass must not specialise what the graph keeps dynamic)."""
    return str(a) == str(b)


def same_shape(a, b) -> bool:
    return len(a) == len(b) and all(same_dim(x, y) for x, y in zip(a, b))


def concrete(x: Any) -> int:
    """An int for a size or stride: itself, or for a symbolic one (dynamic shapes) the value it
    was traced with. Placement depends on which sizes are 1 and which strides 0, which a
    symbolic size does not change (PyTorch specialises sizes 0 and 1)."""
    if isinstance(x, int):
        return x
    hint = getattr(getattr(x, "node", None), "hint", None)
    return int(hint) if isinstance(hint, int) else 2


def classify(t: torch.Tensor, full_shape: tuple) -> str:
    """How an outside tensor broadcasts against the chain's M×N values (evtc's place_operand:
    the rule the op library applies to the real tensor at run time)."""
    cls, _, why = _evtc.place_operand([concrete(s) for s in t.shape], [concrete(s) for s in t.stride()],
                                      [concrete(s) for s in full_shape])
    if cls == "not_fusable":
        raise Refused(why)
    return PLACEMENT_CLASSES[cls]


def operand(chain: Chain, node: fx.Node, half: bool = False) -> str:
    """The expression name of an outside tensor, declared on first use. ``half``: it combines
    with gated (M×N/2) values, so it must broadcast against those."""
    if node in chain.operands:
        name, cls = chain.operands[node]
        if half and cls not in (COL, SCALAR):
            raise Refused(f"operand {node.name} is combined with both the GEMM's N columns and the "
                          "gated N/2 ones")
        return name
    t = val(node)
    if t is None:
        raise Refused(f"operand {node.name} has no tensor metadata")
    if t.dtype not in EVTC_DTYPES:
        raise Refused(f"operand {node.name} has dtype {t.dtype}")
    if t.device.type != "cuda":
        raise Refused(f"operand {node.name} is on {t.device}, not a CUDA device")
    cls = classify(t, chain.half_shape if half else chain.full_shape)
    if half and cls not in (COL, SCALAR):
        raise Refused(f"operand {node.name} of shape {list(t.shape)} varies along the gated values' N/2 "
                      "columns: a gated activation's result combines only with scalars and [M] columns")
    if chain.grouped and cls not in (ROW, SCALAR):
        raise Refused(f"operand {node.name} of shape {list(t.shape)} is a {'column vector' if cls == COL else 'matrix'}"
                      ": a grouped GEMM's epilogue reads only [N] row vectors and scalars")
    name = f"x{len(chain.operands)}"
    dt = EVTC_DTYPES[t.dtype]
    decl = {ROW: f"input {name}[n]: {dt}", COL: f"input {name}[m]: {dt}", SCALAR: f"input {name}: {dt} ptr",
            AUX: f"input {name}[m,n]: {dt}", AUX_COL: f"input {name}[m,n]: {dt} col_major"}[cls]
    chain.declarations.append(decl)
    chain.operands[node] = (name, cls)
    return name


# Outside tensors the epilogue computes again instead of reading them: a backward graph's
# pointwise functions of a saved activation (AOT autograd's partitioner saves the gate projection's
# g and recomputes silu(g), its sigmoid and 1 + g·(1 - sigmoid(g)) for SwiGLU's derivative, the
# last two in f32). Computed in the epilogue from g, the fused op reads g once instead of those
# [m,n] tensors, and no kernel of its own has to write them.
RECOMPUTE_NODES = 24  # at most this many outside ops computed again for one operand


def recomputed_operand(chain: Chain, x: fx.Node, half: bool) -> Optional[str]:
    """For an outside [m,n] tensor made by pointwise ops from other outside tensors, of which at
    most one [m,n] tensor the chain does not read yet, no wider than ``x``: the epilogue's value
    computing it from them; None where that does not apply (it is then read as an operand).
    With ``chain.recompute_sums``, a residual sum (``residual_sum_terms``) is computed from its
    two terms, each read as it is (a term that is itself a sum no kernel stored is then stored
    for the fused op, as Inductor stores a value it does not recompute)."""
    if x in chain.recomputed:
        return chain.recomputed[x]
    if chain.grouped or half or x.op != "call_function" or x.target not in POINTWISE or x.target in COMPARISONS:
        return None
    if chain.recompute_sums and (terms := residual_sum_terms(x)) is not None:
        saved = chain.snapshot()
        try:
            a, b = (chain.exprs.get(term) or chain.recomputed.get(term) or operand(chain, term) for term in terms)
        except Refused:
            chain.restore(saved)
            return None
        chain.recomputed[x] = chain.value(cast_to(val(x).dtype, f"{a} + {b}"))
        return chain.recomputed[x]
    t = val(x)
    if t is None or t.dtype not in EVTC_DTYPES:
        return None
    try:
        if classify(t, chain.full_shape) not in (AUX, AUX_COL):
            return None  # vectors cost little to read
    except Refused:
        return None
    # The pointwise ops x is computed from, inputs before their users, and the tensors they read.
    ops: list[fx.Node] = []
    leaves: list[fx.Node] = []
    entered: set[fx.Node] = set()  # ops visited, counted before their inputs (bounds the depth)

    def visit(n: fx.Node) -> bool:  # False: more ops than RECOMPUTE_NODES
        if n in entered or n in leaves:
            return True
        if n is not x and (chain.has(n) or n.op != "call_function" or n.target not in POINTWISE or
                           n.target in COMPARISONS):
            leaves.append(n)
            return True
        entered.add(n)
        if len(entered) > RECOMPUTE_NODES or not all(visit(i) for i in n.all_input_nodes):
            return False
        ops.append(n)
        return True

    if not visit(x):
        return None
    new_matrices = []
    for leaf in leaves:
        lt = val(leaf)
        if chain.has(leaf) or lt is None:
            continue
        try:
            if classify(lt, chain.full_shape) in (AUX, AUX_COL):
                new_matrices.append(lt)
        except Refused:
            return None
    if len(new_matrices) > 1 or any(m.element_size() > t.element_size() for m in new_matrices):
        return None
    saved = chain.snapshot()
    try:
        # Each op rounded as eager rounds it, its inputs computed again before it.
        for n in ops:
            expr = POINTWISE[n.target](chain, n)
            chain.recomputed[n] = chain.value(expr if val(n).dtype == torch.bool else cast_to(val(n).dtype, expr))
    except Refused:
        chain.restore(saved)
        return None
    return chain.recomputed[x]


def residual_sum_terms(n: fx.Node) -> Optional[tuple[fx.Node, fx.Node]]:
    """The two terms of ``n`` where it is a residual sum: ``a + b`` (alpha 1) of two tensors of
    its own shape and 16-bit dtype, the sum a 16-bit tensor too; None otherwise."""
    if n.op != "call_function" or n.target is not aten.add.Tensor or n.kwargs.get("alpha", 1) != 1:
        return None
    a, b = n.args[:2]
    t = val(n)
    if t is None or t.dtype not in GEMM_OPERAND_DTYPES:
        return None
    for term in (a, b):
        tt = val(term)
        if tt is None or tt.dtype not in GEMM_OPERAND_DTYPES or not same_shape(tt.shape, t.shape):
            return None
    return a, b


# node.meta key of the rounded copy of a residual sum that a fused op wrote in f32 (Settings.
# residual_sums "f32"): the f32 node, which a later chain reads in its place.
WIDE_SUM = "evtc_wide_sum"


def arg_expr(chain: Chain, x: Any, half: bool = False) -> str:
    if isinstance(x, fx.Node):
        if chain.read_wide_sums and isinstance(wide := x.meta.get(WIDE_SUM), fx.Node):
            name = operand(chain, wide, half or chain.in_half)
            if x not in chain.wide_reads:
                chain.wide_reads.append(x)
            return name
        if x in chain.exprs:
            return chain.exprs[x]
        return recomputed_operand(chain, x, half or chain.in_half) or operand(chain, x, half or chain.in_half)
    if isinstance(x, (int, float, bool)):
        return const(x)
    raise Refused(f"argument {x!r} is neither a tensor nor a number")


# --- the pointwise ops evtc computes ----------------------------------------------------------

def _scaled(chain, y, alpha):
    return arg_expr(chain, y) if alpha == 1 else f"({const(alpha)} * {arg_expr(chain, y)})"


def _add(chain, n):
    x, y = n.args[:2]
    return f"{arg_expr(chain, x)} + {_scaled(chain, y, n.kwargs.get('alpha', 1))}"


def _sub(chain, n):
    x, y = n.args[:2]
    return f"{arg_expr(chain, x)} - {_scaled(chain, y, n.kwargs.get('alpha', 1))}"


def _rsub(chain, n):
    x, y = n.args[:2]
    return f"{_scaled(chain, y, 1)} - {_scaled(chain, x, n.kwargs.get('alpha', 1))}"


def _div(chain, n):
    if n.kwargs.get("rounding_mode") is not None:
        raise Refused(f"div with rounding_mode={n.kwargs['rounding_mode']}")
    return f"{arg_expr(chain, n.args[0])} / {arg_expr(chain, n.args[1])}"


def _binary(op):
    return lambda chain, n: f"{arg_expr(chain, n.args[0])} {op} {arg_expr(chain, n.args[1])}"


def _call(fn, arity=1):
    return lambda chain, n: f"{fn}({', '.join(arg_expr(chain, a) for a in n.args[:arity])})"


def _gelu(chain, n):
    approximate = n.kwargs.get("approximate", n.args[1] if len(n.args) > 1 else "none")
    fn = {"none": "gelu", "tanh": "gelu_tanh"}.get(approximate)
    if fn is None:
        raise Refused(f"gelu with approximate={approximate!r}")
    return f"{fn}({arg_expr(chain, n.args[0])})"


# The derivatives autograd writes for activations (a training graph's backward pass): each is one
# ATen kernel that computes in f32 and rounds once, as the epilogue does with the formula here.
# ``dy`` is the incoming gradient; ``x`` the activation's input, or ``y`` its output.
def _silu_backward(chain, n):
    dy, x = arg_expr(chain, n.args[0]), arg_expr(chain, n.args[1])
    return f"{dy} * (sigmoid({x}) * (1.0 + {x} * (1.0 - sigmoid({x}))))"


def _sigmoid_backward(chain, n):
    dy, y = arg_expr(chain, n.args[0]), arg_expr(chain, n.args[1])
    return f"{dy} * ((1.0 - {y}) * {y})"


def _tanh_backward(chain, n):
    dy, y = arg_expr(chain, n.args[0]), arg_expr(chain, n.args[1])
    return f"{dy} * (1.0 - {y} * {y})"


def _threshold_backward(chain, n):
    # relu's derivative is threshold_backward(dy, x, 0): dy where x > threshold, else 0.
    dy, x, t = arg_expr(chain, n.args[0]), arg_expr(chain, n.args[1]), arg_expr(chain, n.args[2])
    return f"where({x} <= {t}, 0.0, {dy})"


def _gelu_backward(chain, n):
    approximate = n.kwargs.get("approximate", n.args[2] if len(n.args) > 2 else "none")
    dy, x = arg_expr(chain, n.args[0]), arg_expr(chain, n.args[1])
    if approximate == "none":
        # d/dx x·Φ(x) = Φ(x) + x·φ(x)
        return (f"{dy} * (0.5 * (1.0 + erf({x} * {const(math.sqrt(0.5))})) + "
                f"{x} * (exp({x} * {x} * (-0.5)) * {const(1 / math.sqrt(2 * math.pi))}))")
    if approximate == "tanh":
        # t = tanh(√(2/π)·(x + 0.044715·x³)); d/dx ½x(1 + t) = ½(1 + t) + ½x(1 - t²)·√(2/π)(1 + 3·0.044715·x²)
        beta = const(math.sqrt(2 / math.pi))
        t = f"tanh({beta} * ({x} + 0.044715 * {x} * {x} * {x}))"
        return (f"{dy} * (0.5 * (1.0 + {t}) + 0.5 * {x} * ((1.0 - {t} * {t}) * {beta} * "
                f"(1.0 + {const(3 * 0.044715)} * {x} * {x})))")
    raise Refused(f"gelu_backward with approximate={approximate!r}")


def _pow(chain, n):
    x, e = n.args[:2]
    if e == 2:
        return f"square({arg_expr(chain, x)})"
    if e == 0.5:
        return f"sqrt({arg_expr(chain, x)})"
    return f"{arg_expr(chain, x)} ** {arg_expr(chain, e)}"


def _clamp(chain, n):
    x = arg_expr(chain, n.args[0])
    lo = n.kwargs.get("min", n.args[1] if len(n.args) > 1 else None)
    hi = n.kwargs.get("max", n.args[2] if len(n.args) > 2 else None)
    if lo is not None:
        x = f"max({x}, {arg_expr(chain, lo)})"
    if hi is not None:
        x = f"min({x}, {arg_expr(chain, hi)})"
    return x


def _where(chain, n):
    cond = n.args[0]
    if isinstance(cond, fx.Node) and cond in chain.exprs:
        return f"where({chain.exprs[cond]}, {arg_expr(chain, n.args[1])}, {arg_expr(chain, n.args[2])})"
    raise Refused("where with a boolean condition tensor from outside the epilogue (evtc operands are floating "
                  "point; a condition the epilogue computes, such as x > 0, fuses)")


def _compare(symbol):
    return lambda chain, n: f"({arg_expr(chain, n.args[0])} {symbol} {arg_expr(chain, n.args[1])})"


# Comparisons: their boolean result is 1 or 0 in the epilogue, for where() or a mask. It is
# never an output (evtc writes floating-point values), so a comparison joins a chain only
# where its users can too.
COMPARISONS: dict[Any, Callable[[Chain, fx.Node], str]] = {
    op: _compare(symbol)
    for name, symbol in _evtc.comparison_operators().items()  # eq: "==", ...: ATen's names are the IR's
    for op in (getattr(aten, name).Tensor, getattr(aten, name).Scalar)
}


def _identity(chain, n):
    return chain.exprs[n.args[0]] if n.args[0] in chain.exprs else arg_expr(chain, n.args[0])


POINTWISE: dict[Any, Callable[[Chain, fx.Node], str]] = {
    aten.add.Tensor: _add, aten.add.Scalar: _add,
    aten.sub.Tensor: _sub, aten.sub.Scalar: _sub,
    aten.rsub.Scalar: _rsub, aten.rsub.Tensor: _rsub,
    aten.mul.Tensor: _binary("*"), aten.mul.Scalar: _binary("*"),
    aten.div.Tensor: _div, aten.div.Scalar: _div,
    aten.neg.default: _call("neg"),
    aten.relu.default: _call("relu"),
    aten.sigmoid.default: _call("sigmoid"),
    aten.silu.default: _call("silu"),
    aten.tanh.default: _call("tanh"),
    aten.exp.default: _call("exp"),
    aten.log.default: _call("log"),
    aten.abs.default: _call("abs"),
    aten.sqrt.default: _call("sqrt"),
    aten.rsqrt.default: _call("rsqrt"),
    aten.reciprocal.default: _call("reciprocal"),
    aten.erf.default: _call("erf"),
    aten.gelu.default: _gelu,
    aten.silu_backward.default: _silu_backward,
    aten.sigmoid_backward.default: _sigmoid_backward,
    aten.tanh_backward.default: _tanh_backward,
    aten.threshold_backward.default: _threshold_backward,
    aten.gelu_backward.default: _gelu_backward,
    aten.pow.Tensor_Scalar: _pow,
    aten.clamp.default: _clamp, aten.clamp.Tensor: _clamp,
    aten.clamp_min.default: lambda c, n: f"max({arg_expr(c, n.args[0])}, {arg_expr(c, n.args[1])})",
    aten.clamp_max.default: lambda c, n: f"min({arg_expr(c, n.args[0])}, {arg_expr(c, n.args[1])})",
    aten.maximum.default: _call("max", 2), aten.minimum.default: _call("min", 2),
    aten.where.self: _where,
    **COMPARISONS,
    prims.convert_element_type.default: _identity,
    aten._to_copy.default: _identity,
}

# Reshapes of a chain value that keep its last dimension (N): the values are the same M×N
# matrix with the leading dimensions grouped differently.
RESHAPES = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)


SLICE = aten.slice.Tensor
INT64_MAX = 2**63 - 1


def _gated_part(chain: Chain, n: fx.Node) -> tuple[Optional[str], str]:
    """For a slice of a chain value: ("gate" | "up", "") when it takes every other column of
    the last dimension starting at 0 | 1, else (None, why not)."""
    src = n.args[0]
    dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
    start = n.args[2] if len(n.args) > 2 else n.kwargs.get("start", None)
    end = n.args[3] if len(n.args) > 3 else n.kwargs.get("end", None)
    step = n.args[4] if len(n.args) > 4 else n.kwargs.get("step", 1)
    t = val(src)
    if src not in chain.exprs or t is None:
        return None, f"slice {n.name} of a value outside the chain"
    if src in chain.half:
        return None, f"slice {n.name} of a gated (N/2) value"
    if not isinstance(dim, int) or dim % t.dim() != t.dim() - 1:
        return None, f"slice {n.name} along dimension {dim}, not the last (N)"
    width = t.shape[-1]
    if step != 2 or start not in (0, 1, None) or not isinstance(width, int):
        return None, (f"slice {n.name} [{start}:{end}:{step}] is not [0::2] or [1::2] (gate and up "
                      "columns of interleaved weights)")
    if width % 2:
        return None, f"slice {n.name} of {width} columns: (gate, up) pairs need an even N"
    if end is not None and end < width and end != INT64_MAX:
        return None, f"slice {n.name} ends at column {end} of {width}"
    return ("up" if start == 1 else "gate"), ""


# A chain value summed over every dimension but its last (N): autograd's gradient of a linear
# layer's bias, sum(dY, [0]) (keepdim for addmm's, over [0, 1] for a 3-D linear's). It becomes an
# output ``col_sum(value)``: evtc folds each tile's partial column sums in a fixed order after the
# GEMM, so the [m,n] value need not be read back by a reduction kernel of its own.
COLUMN_SUM = aten.sum.dim_IntList


def _column_sum_refusal(chain: Chain, n: fx.Node) -> Optional[str]:
    """Why the sum ``n`` cannot be a column sum of the chain, or None."""
    src = n.args[0]
    dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
    t = val(src)
    if src not in chain.exprs or t is None:
        return f"sum {n.name} of a value outside the chain"
    if chain.grouped:
        return f"sum {n.name}: a grouped GEMM's epilogue writes one [m,n] output and no reductions"
    if chain.merged is not None:
        return f"sum {n.name} over a merged GEMM's interleaved (gate, up) columns"
    if src in chain.half:
        return f"sum {n.name} of a gated (N/2) value"
    rank = t.dim()
    if not isinstance(dims, (list, tuple)) or not dims or not all(isinstance(d, int) for d in dims):
        return f"sum {n.name} over {dims!r}: only a sum over every dimension but the last (a column sum) fuses"
    if sorted(d % rank for d in dims) != list(range(rank - 1)):
        return (f"sum {n.name} over dimensions {list(dims)} of a {rank}-D value: only a sum over every dimension "
                "but the last (a column sum, such as a bias gradient) fuses")
    return None


def _chain_inputs(chain: Chain, n: fx.Node) -> list[fx.Node]:
    return [i for i in n.all_input_nodes if i in chain.exprs]


def absorbable(chain: Chain, n: fx.Node) -> Optional[str]:
    """Why ``n`` cannot join the chain, or None if it can (its chain inputs are in the chain)."""
    if n.op != "call_function":
        return f"{n.op} {n.name}"
    t = val(n)
    if n.target in COMPARISONS and t is not None and t.dtype == torch.bool:
        outside = [u.name for u in n.users if u.op != "call_function" or u.target not in POINTWISE]
        if outside:
            return (f"comparison {n.name} is read by {', '.join(outside)}, outside any epilogue (its boolean "
                    "result cannot be an output)")
    elif t is None or t.dtype not in EVTC_DTYPES:
        return f"{n.target} produces {getattr(t, 'dtype', 'no tensor')}"
    reduced = [i.name for i in n.all_input_nodes if i in chain.reductions]
    if reduced:
        return (f"{n.name} reads the column sum {', '.join(reduced)}, which the fused kernel completes only after "
                "its last tile")
    if n.target is SLICE:
        return _gated_part(chain, n)[1] or None
    if n.target is COLUMN_SUM:
        return _column_sum_refusal(chain, n)
    inputs = _chain_inputs(chain, n)
    half = [i in chain.half for i in inputs]
    if any(half) and not all(half):
        return f"{n.name} mixes gated (N/2) values with the GEMM's N columns"
    if n.target in RESHAPES:
        src = val(n.args[0])
        if n.args[0] not in chain.exprs or src is None or not same_dim(t.shape[-1], src.shape[-1]) or not t.is_contiguous():
            return f"reshape {n.name} changes the last dimension"
        return None
    if n.target not in POINTWISE:
        return f"{n.target} is not an epilogue op"
    if n.target is aten._to_copy.default and (set(n.kwargs) - {"dtype"}):
        return f"_to_copy with {sorted(set(n.kwargs) - {'dtype'})}"
    shape = chain.half_shape if any(half) else chain.full_shape
    if not same_shape(t.shape, shape) and not same_dim(math.prod(t.shape), math.prod(shape)):
        return f"{n.name} has shape {list(t.shape)}, not the {'gated values' if any(half) else 'GEMM result'}'s shape"
    return None


def absorb(chain: Chain, n: fx.Node) -> None:
    """Adds ``n`` to the chain (raises Refused, leaving the chain unchanged, if it cannot)."""
    t = val(n)
    saved = chain.snapshot()
    half = any(i in chain.half for i in _chain_inputs(chain, n))
    try:
        if n.target is SLICE:
            part, why = _gated_part(chain, n)
            if part is None:
                raise Refused(why)
            chain.define(n, f"{part}({chain.exprs[n.args[0]]})")
            half = True
        elif n.target is COLUMN_SUM:
            why = _column_sum_refusal(chain, n)
            if why:
                raise Refused(why)
            # Summed in f32; the output rounds it to the sum's dtype, as eager's sum does.
            chain.define(n, f"col_sum({chain.exprs[n.args[0]]})")
            chain.reductions.add(n)
        elif n.target in RESHAPES:
            chain.exprs[n] = chain.exprs[n.args[0]]
            shape = tuple(t.shape)
            chain.full_shape = shape[:-1] + (2 * shape[-1],) if half else shape
        else:
            chain.in_half = half
            expr = POINTWISE[n.target](chain, n)
            # A comparison's 0/1 needs no rounding; it stays f32 until a cast or an op widens it.
            chain.define(n, expr if t.dtype == torch.bool else cast_to(t.dtype, expr))
    except Refused:
        chain.restore(saved)
        raise
    finally:
        chain.in_half = False
    if half:
        chain.half.add(n)
    chain.nodes.append(n)
