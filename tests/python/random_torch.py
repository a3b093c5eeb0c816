"""Random PyTorch functions for the differential test of the torch.compile path: a GEMM (``x @ w.t()``,
``x @ w`` with an N-major weight, or ``addmm``) followed by a random chain of pointwise operations
(activations, arithmetic with broadcast operands, clamps, casts), one or two outputs.

Each function is Python source text, so a failure is reproducible from what the test prints.
Casts are written ``cast(h, dtype)``: the function under test gets ``Tensor.to``, the float64
reference a cast that rounds to the dtype and goes on in float64. Every function is fusable by
construction: its chain reads the GEMM result through pointwise operations only, and its sizes
meet the alignment evtc needs (N and K multiples of 8; M too where a vector runs along M), while
none is a multiple of a tile.
"""
from __future__ import annotations

import dataclasses
import random

# (template, is_unary); `h` is the running value, `{o}` an operand, `{c}` a constant.
UNARY = [
    "F.silu(h)", "F.gelu(h)", "F.gelu(h, approximate='tanh')", "torch.relu(h)", "torch.sigmoid(h)",
    "torch.tanh(h)", "-h", "torch.abs(h)", "h * h", "torch.exp(torch.tanh(h))", "torch.sqrt(torch.abs(h) + 1)",
    "torch.rsqrt(h * h + 1)", "torch.erf(h)", "torch.clamp(h, -{c}, {c})", "torch.clamp(h, min=-{c})",
    "1 - h", "h * {c}", "h + {c}", "h / (1 + torch.sigmoid(h))",
]
BINARY = ["h + {o}", "h * {o}", "h - {o}", "{o} - h", "torch.maximum(h, {o})", "torch.minimum(h, {o})",
          "h * torch.sigmoid({o})"]
# The activations' derivatives of a backward pass (an incoming gradient and the activation's input
# or output), with an operand of h's dtype, as autograd passes them.
DERIVATIVES = ["torch.ops.aten.silu_backward(h, {o}.to(h.dtype))", "torch.ops.aten.silu_backward({o}.to(h.dtype), h)",
               "torch.ops.aten.gelu_backward(h, {o}.to(h.dtype))", "torch.ops.aten.gelu_backward(h, {o}.to(h.dtype), approximate='tanh')",
               "torch.ops.aten.sigmoid_backward(h, torch.sigmoid({o}).to(h.dtype))", "torch.ops.aten.tanh_backward(h, torch.tanh({o}).to(h.dtype))",
               "torch.ops.aten.threshold_backward(h, {o}.to(h.dtype), 0.0)"]
# operand kinds: name -> (shape in terms of M and N, how the source refers to it)
OPERANDS = {
    "bias": ("[N]", "bias"),
    "row": ("[M, 1]", "row"),
    "col": ("[M]", "col.unsqueeze(1)"),
    "full": ("[M, N]", "full"),
}


@dataclasses.dataclass
class RandomFunction:
    name: str
    source: str           # defines `fn(x, w, <operands>, cast)`
    m: int
    n: int
    k: int
    weight_n_major: bool  # w is K×N (x @ w) rather than N×K (x @ w.t())
    operands: list[str]   # operand names, after x and w
    operand_dtypes: dict[str, str]
    outputs: int

    def function(self, namespace: dict):
        scope = dict(namespace)
        exec(compile(self.source, self.name, "exec"), scope)  # noqa: S102 - generated test code
        return scope["fn"]


def generate(seed: int, index: int) -> RandomFunction:
    rng = random.Random(seed * 1_000_003 + index)
    m = rng.randrange(97, 1500)
    n = 8 * rng.randrange(17, 194)
    k = 8 * rng.randrange(8, 130)
    n_major = rng.random() < 0.25
    used: list[str] = []
    dtypes: dict[str, str] = {}

    def operand() -> str:
        kind = rng.choice(list(OPERANDS))
        if kind not in used:
            used.append(kind)
            dtypes[kind] = rng.choice(["torch.bfloat16", "torch.bfloat16", "torch.float32"])
        return OPERANDS[kind][1]

    lines = []
    product = "x @ w" if n_major else "x @ w.t()"
    if not n_major and rng.random() < 0.2:
        used.append("bias")
        dtypes["bias"] = "torch.bfloat16"
        lines.append("h = torch.addmm(bias, x, w.t())")
    else:
        lines.append(f"h = {product}")
    if rng.random() < 0.3:
        lines.append("h = cast(h, torch.float32)")
    outputs = []
    steps = rng.randint(1, 5)
    for step in range(steps):
        roll = rng.random()
        if roll < 0.5:
            expr = rng.choice(UNARY)
        elif roll < 0.9:
            expr = rng.choice(BINARY).replace("{o}", operand())
        else:
            expr = rng.choice(DERIVATIVES).replace("{o}", operand())
        expr = expr.replace("{c}", repr(round(rng.uniform(0.25, 3.0), 2)))
        lines.append(f"h = {expr}")
        if rng.random() < 0.15:
            lines.append(f"h = cast(h, {rng.choice(['torch.bfloat16', 'torch.float32'])})")
        if step < steps - 1 and not outputs and rng.random() < 0.2:
            lines.append(f"y0 = cast(h, {rng.choice(['torch.bfloat16', 'torch.float32'])})")
            outputs.append("y0")
    lines.append(f"y{len(outputs)} = cast(h, {rng.choice(['torch.bfloat16', 'torch.bfloat16', 'torch.float32'])})")
    outputs.append(f"y{len(outputs)}")
    if {"row", "col"} & set(used):  # vectors along M need 16-byte alignment: M a multiple of 8
        m = (m + 7) // 8 * 8
    params = ", ".join(["x", "w"] + used + ["cast"])
    body = "\n".join("    " + line for line in lines)
    ret = outputs[0] if len(outputs) == 1 else "(" + ", ".join(outputs) + ")"
    source = f"def fn({params}):\n{body}\n    return {ret}\n"
    return RandomFunction(f"random_torch_{seed}_{index}", source, m, n, k, n_major, used, dtypes, len(outputs))


def make_inputs(f: RandomFunction, torch, device: str, generator=None) -> list:
    """x, w and the operands in the function's parameter order (bf16 GEMM operands, values of a
    size that keeps the chain well inside each op's domain)."""
    def randn(*shape, dtype):
        return torch.randn(*shape, device=device, generator=generator, dtype=torch.float32).to(dtype)

    bf16 = torch.bfloat16
    x = randn(f.m, f.k, dtype=bf16) / 4
    w = randn(f.k, f.n, dtype=bf16) if f.weight_n_major else randn(f.n, f.k, dtype=bf16)
    w = w / (f.k ** 0.5) * 4
    shapes = {"bias": (f.n,), "row": (f.m, 1), "col": (f.m,), "full": (f.m, f.n)}
    extra = [randn(*shapes[name], dtype=getattr(torch, f.operand_dtypes[name].split(".")[1])) for name in f.operands]
    return [x, w] + extra
