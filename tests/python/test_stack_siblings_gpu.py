"""Sibling projections as one GEMM on a CUDA GPU: torch.ops.evtc.stacked_linear in bf16 against
float64 (stacked in place and copied, with and without biases, at sizes that are not tile
multiples), and a q/k/v attention block compiled with backend="evtc" in default mode and under
CUDA graphs ("reduce-overhead"), inference and training, against float64 eager within plain
torch.compile's own error."""
from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch", reason="the stacked-projection GPU tests need torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import evtc  # noqa: E402
import evtc.torch  # noqa: E402
from evtc.torch._op import rows_of_one_buffer  # noqa: E402


def randn(*shape, scale=1.0, seed=0, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)


@pytest.mark.parametrize("m,k,widths", [(13, 1000, (136, 40, 40)), (300, 520, (264, 264, 264)), (1, 264, (8, 16))])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("stacked", [True, False])
def test_stacked_linear_matches_float64(m, k, widths, bias, stacked):
    a = randn(m, k, seed=1)
    if stacked:
        buffer = randn(sum(widths), k, scale=k ** -0.5, seed=2)
        bias_buffer = randn(sum(widths), seed=3)
        starts = [sum(widths[:i]) for i in range(len(widths))]
        w = [buffer[s:s + n] for s, n in zip(starts, widths)]
        b = [bias_buffer[s:s + n] for s, n in zip(starts, widths)] if bias else []
    else:
        w = [randn(n, k, scale=k ** -0.5, seed=10 + i) for i, n in enumerate(widths)]
        b = [randn(n, seed=20 + i) for i, n in enumerate(widths)] if bias else []
    assert rows_of_one_buffer(w) == stacked
    y = torch.ops.evtc.stacked_linear(a, w, b)
    want = torch.cat([a.double() @ t.double().T + (b[i].double() if bias else 0) for i, t in enumerate(w)], 1)
    assert y.shape == want.shape and y.dtype == torch.bfloat16
    torch.testing.assert_close(y.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


class Block(nn.Module):
    """LLaMA-style attention's projections with grouped-query k/v, and biases as Qwen2 has."""

    def __init__(self, hidden=520, heads=8, kv_heads=2, head_dim=64, bias=True):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return x + self.o_proj(o.transpose(1, 2).reshape(b, s, -1))


def rel(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compiled_inference_stacks_qkv_within_plain_compiles_error(mode):
    torch.manual_seed(0)
    model = Block().cuda().to(torch.bfloat16).eval()
    reference = copy.deepcopy(model).double()
    plain = torch.compile(copy.deepcopy(model), mode=mode)
    assert evtc.torch.merge_projections(model) == ["Block: q_proj + k_proj + v_proj"]
    evtc.torch.reports.clear()
    compiled = torch.compile(model, backend="evtc", mode=mode)
    with torch.no_grad():
        for step in range(3):  # CUDA graphs record on a later call
            x = randn(3, 37, 520, seed=40 + step)
            # Cloned at once: the next CUDA-graph replay (of either model) reuses their outputs' memory.
            got = compiled(x).clone()
            base = plain(x).clone()
            want = reference(x.double())
            assert rel(got, want) <= max(2 * rel(base, want), 1e-2), step
    assert sum(len(r.stacked) for r in evtc.torch.reports) == 1


def test_compiled_training_stacks_qkv_with_gradients_within_plain_compiles_error():
    torch.manual_seed(1)
    model = Block().cuda().to(torch.bfloat16)
    reference = copy.deepcopy(model).double()
    plain_model = copy.deepcopy(model)
    plain = torch.compile(plain_model)
    evtc.torch.merge_projections(model)
    evtc.torch.reports.clear()
    compiled = torch.compile(model, backend="evtc")
    x = randn(2, 45, 520, seed=50)
    for m, f in ((model, compiled), (plain_model, plain), (reference, reference)):
        f(x.to(next(m.parameters()).dtype)).float().square().mean().backward()
    for (n, p), (_, q), (_, r) in zip(model.named_parameters(), plain_model.named_parameters(),
                                      reference.named_parameters()):
        assert rel(p.grad, r.grad) <= max(2 * rel(q.grad, r.grad), 1e-2), n
    assert rows_of_one_buffer([model.q_proj.weight, model.k_proj.weight, model.v_proj.weight])
    assert sum(len(r.stacked) for r in evtc.torch.reports) == 1
