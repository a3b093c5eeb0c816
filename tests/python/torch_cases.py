"""The PyTorch programs the GPU tests compile: each with its inputs, how many GEMMs evtc must
fuse in it, and the tolerance of its comparison with eager."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

# Sizes that are not tile multiples (tiles are 128 or 256 wide); N and K keep 16-byte rows.
M, N, K = 1000, 1032, 520


@dataclass
class Case:
    name: str
    fn: Callable
    make_inputs: Callable[[], tuple]
    fused: int  # GEMMs evtc must fuse (0: a negative case)
    rtol: float = 2e-2
    inductor_config: dict = field(default_factory=dict)


def randn(*shape, dtype=torch.bfloat16, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


def x_w(dtype=torch.bfloat16, k=K):
    # Weights scaled by 1/sqrt(K) keep the GEMM's outputs O(1), where activations matter.
    return randn(M, k, dtype=dtype), randn(N, k, dtype=dtype, scale=k ** -0.5)


def activation(f):
    return lambda x, w: f(x @ w.t())


def scaled_mm_inputs():
    m, n, k = 1000, 1040, 528
    a = randn(m, k).to(torch.float8_e4m3fn)
    b = randn(n, k, scale=k ** -0.5).to(torch.float8_e4m3fn).t()
    scale_a = torch.rand(m, 1, device="cuda") + 0.5
    scale_b = torch.rand(1, n, device="cuda") + 0.5
    return a, b, scale_a, scale_b, randn(n)


def scaled_mm_gelu(a, b, scale_a, scale_b, bias):
    y = torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, bias=bias, out_dtype=torch.bfloat16)
    return F.gelu(y)


def escaping(x, w, bias):
    h = x @ w.t() + bias
    return F.gelu(h), h.float().sum(dim=0)


def swiglu7(h):
    """W4's gated activation over interleaved (gate, up) columns."""
    g = h[:, 0::2].clamp(max=7)
    u = h[:, 1::2].clamp(-7, 7)
    return g * torch.sigmoid(1.702 * g) * (u + 1)


def gated_with_preactivation(x, w, bias):
    h = x @ w.t() + bias
    return F.silu(h[:, ::2]) * h[:, 1::2], h


# Grouped GEMMs: 8 experts, ragged group sizes (one empty) that cover every token.
GROUP_ROWS = (130, 0, 257, 1, 64, 300, 120, 128)


def grouped_inputs(k_major=True):
    x = randn(sum(GROUP_ROWS), K)
    w = randn(len(GROUP_ROWS), N, K, scale=K ** -0.5)
    w = w.transpose(1, 2) if k_major else w.transpose(1, 2).contiguous()  # G × K × N either way
    offs = torch.tensor(GROUP_ROWS, device="cuda").cumsum(0).to(torch.int32)
    return x, w, offs


def grouped_gptoss(x, w, offs):
    h = torch._grouped_mm(x, w, offs=offs)
    g = h[:, 0::2].clamp(max=7.0)
    u = h[:, 1::2].clamp(-7.0, 7.0)
    return g * torch.sigmoid(1.702 * g) * (u + 1)


def two_projections():
    """x, the gate projection's weight and the up projection's (nn.Linear layout, N × K each)."""
    return (*x_w(), randn(N, K, scale=K ** -0.5))


def linears_with_biases(x, w1, b1, w3, b3):
    return F.silu(F.linear(x, w1, b1)) * F.linear(x, w3, b3)


def chunked_gate_up(x, w):
    g, u = F.linear(x, w).chunk(2, dim=-1)  # one fused gate_up projection (Phi-3 style)
    return F.silu(g) * u


def gptoss_two_projections(x, w1, w3):
    g = (x @ w1.t()).clamp(max=7.0)
    u = (x @ w3.t()).clamp(-7.0, 7.0)
    return g * torch.sigmoid(1.702 * g) * (u + 1)


def grouped_separate_gate_up(x, w1, offs, w3):
    return F.silu(torch._grouped_mm(x, w1, offs=offs)) * torch._grouped_mm(x, w3, offs=offs)


CASES = [
    Case("silu", activation(F.silu), x_w, 1),
    Case("sigmoid", activation(torch.sigmoid), x_w, 1),
    Case("gelu", activation(F.gelu), x_w, 1),
    Case("gelu_tanh", activation(lambda h: F.gelu(h, approximate="tanh")), x_w, 1),
    Case("quick_gelu", activation(lambda h: h * torch.sigmoid(1.702 * h)), x_w, 1),
    Case("relu", activation(torch.relu), x_w, 1),
    Case("relu_square", activation(lambda h: torch.relu(h) ** 2), x_w, 1),
    Case("scalar_arithmetic", activation(lambda h: ((h + 1.5) * 0.75 - 0.25) / 3.0), x_w, 1),
    Case("addmm_bias", lambda x, w, b: F.linear(x, w, b), lambda: (*x_w(), randn(N)), 1),
    Case("mm_plus_bias_silu", lambda x, w, b: F.silu(x @ w.t() + b), lambda: (*x_w(), randn(N)), 1),
    Case("aux_gate", lambda x, w, g: (x @ w.t()) * g, lambda: (*x_w(), randn(M, N)), 1),
    Case("bf16_via_fp32", activation(lambda h: F.silu(h.float()).to(torch.bfloat16)), x_w, 1),
    Case("fp32_output", activation(lambda h: F.silu(h.float())), x_w, 1),
    Case("bf16_to_fp16", activation(lambda h: F.silu(h).to(torch.float16)), x_w, 1),
    Case("pure_fp16", activation(F.silu), lambda: x_w(torch.float16), 1),
    Case("scaled_mm_rowwise_bias_gelu", scaled_mm_gelu, scaled_mm_inputs, 1, rtol=4e-2),
    Case("llama_mlp", lambda x, w1, w3: F.silu(x @ w1.t()) * (x @ w3.t()),
         lambda: (*x_w(), randn(N, K, scale=K ** -0.5)), 1),
    # Two projections (or one split in halves) meeting in a gated activation: one merged GEMM.
    Case("merged_linears_with_biases", linears_with_biases,
         lambda: (*x_w(), randn(N), randn(N, K, scale=K ** -0.5), randn(N)), 1),
    Case("merged_chunked_gate_up", chunked_gate_up,
         lambda: (randn(4, 250, K), randn(2 * N, K, scale=K ** -0.5)), 1),
    Case("merged_geglu", lambda x, w1, w3: F.gelu(x @ w1.t(), approximate="tanh") * (x @ w3.t()),
         two_projections, 1),
    Case("merged_gptoss", gptoss_two_projections, two_projections, 1),
    Case("merged_grouped_experts", grouped_separate_gate_up,
         lambda: (*grouped_inputs(), grouped_inputs()[1]), 1),
    Case("escaping_intermediate", escaping, lambda: (*x_w(), randn(N)), 1),
    Case("swiglu7_sliced", lambda x, w: swiglu7(x @ w.t()), x_w, 1),
    Case("gated_with_preactivation", gated_with_preactivation, lambda: (*x_w(), randn(N)), 1),
    Case("grouped_gptoss_swiglu", grouped_gptoss, grouped_inputs, 1),
    Case("grouped_n_major_bias_silu", lambda x, w, offs, b: F.silu(torch._grouped_mm(x, w, offs=offs) + b),
         lambda: (*grouped_inputs(k_major=False), randn(N)), 1),
    # Negative cases: nothing fused, results still right.
    Case("bare_mm", lambda x, w: x @ w.t(), x_w, 0),
    Case("k_not_multiple_of_8", activation(F.silu), lambda: x_w(k=516), 0,
         inductor_config={"shape_padding": False}),
    Case("fp32_mm", activation(F.silu), lambda: x_w(torch.float32), 0, rtol=1e-3),
    Case("unsupported_b_strides", lambda x, w: F.silu(x @ w[:, ::2]),
         lambda: (randn(M, K), randn(K, 2 * N, scale=K ** -0.5)), 0),
]


class SwigluMlp(nn.Module):
    """A LLaMA-style MLP, down(silu(gate(x)) · up(x)), with Hugging Face's projection names."""

    def __init__(self, hidden: int, ffn: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=bias)
        self.up_proj = nn.Linear(hidden, ffn, bias=bias)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
