"""evtc's FX pass on traced ATen graphs, without a GPU: fake CUDA tensors carry the shapes,
dtypes and strides the pass reads. Skipped where torch is not installed."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the FX pass tests need torch")

import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

import evtc  # noqa: E402
import evtc.torch  # noqa: E402

M, N, K = 1000, 1032, 520


def trace(fn, *shapes_dtypes):
    """fn traced to an ATen graph over fake CUDA tensors (shape, dtype[, transpose])."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        args = []
        for spec in shapes_dtypes:
            shape, dtype = spec[:2]
            t = torch.empty(*shape, device="cuda", dtype=dtype)
            args.append(t)
        return make_fx(fn)(*args)


def fuse(fn, *inputs):
    gm = trace(fn, *inputs)
    report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False)
    gm.recompile()
    return gm, report


BF16 = torch.bfloat16
X = ((M, K), BF16)
W = ((N, K), BF16)


def ops_of(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_mm_activation_becomes_one_op():
    gm, report = fuse(lambda x, w: F.silu(x @ w.t()), X, W)
    assert len(report.fused) == 1 and report.refused == []
    ops = ops_of(gm)
    assert torch.ops.evtc.gemm_epilogue.default in ops
    assert torch.ops.aten.mm.default not in ops and torch.ops.aten.silu.default not in ops
    kernel = evtc.torch._op.spec_kernel(report.fused[0].spec)[0]
    assert "silu" in kernel.ir


def test_bias_and_gate_operands_are_classified_by_broadcast():
    def fn(x, w, bias, scale, gate):
        return (x @ w.t() + bias) * scale.unsqueeze(1) * gate

    gm, report = fuse(fn, X, W, ((N,), BF16), ((M,), torch.float32), ((M, N), BF16))
    (f,) = report.fused
    assert "x0[n]: bf16" in f.expr and "x1[m]: f32" in f.expr and "x2[m,n]: bf16" in f.expr


def test_escaping_value_becomes_an_output():
    def fn(x, w, bias):
        h = x @ w.t() + bias
        return F.gelu(h), h.float().sum()

    gm, report = fuse(fn, X, W, ((N,), BF16))
    (f,) = report.fused
    assert len(f.outputs) == 2
    assert torch.ops.aten.sum.default in ops_of(gm)


def test_three_dimensional_linear_chain_keeps_its_shape():
    def fn(x, w, bias):
        return F.gelu(F.linear(x, w, bias))

    gm, report = fuse(fn, ((4, 250, K), BF16), W, ((N,), BF16))
    assert len(report.fused) == 1, report.summary()
    out = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    out = out[0] if isinstance(out, (tuple, list)) else out
    assert tuple(out.meta["val"].shape) == (4, 250, N)


@pytest.mark.parametrize("fn, inputs, reason", [
    (lambda x, w: x @ w.t(), (X, W), "nothing to fuse"),
    (lambda x, w: F.silu(x @ w.t()), (((M, 516), BF16), ((N, 516), BF16)), "K=516"),
    (lambda x, w: F.silu(x @ w.t()), (((M, K), torch.float32), ((N, K), torch.float32)), "torch.float32"),
    (lambda x, w: F.silu(x @ w[:, ::2]), (X, ((K, 2 * N), BF16)), "strides"),
    (lambda x, w: F.silu(torch.bmm(x, w)), (((2, M, K), BF16), ((2, K, N), BF16)), "bmm"),
])
def test_refused_chains_leave_the_graph_unchanged(fn, inputs, reason):
    before = trace(fn, *inputs)
    gm, report = fuse(fn, *inputs)
    assert report.fused == [] and any(reason in why for _, why in report.refused), report.summary()
    assert [str(n.target) for n in gm.graph.nodes] == [str(n.target) for n in before.graph.nodes]
    assert reason in report.summary()


def test_llama_mlp_takes_the_other_gemm_as_an_operand():
    gm, report = fuse(lambda x, w1, w3: F.silu(x @ w1.t()) * (x @ w3.t()), X, W, W)
    assert len(report.fused) == 1
    assert ops_of(gm).count(torch.ops.aten.mm.default) == 1
    assert "[m,n]" in report.fused[0].expr


def test_rewrite_is_deterministic():
    def fn(x, w, b):
        return F.gelu(x @ w.t() + b) * 0.5

    specs = [[f.spec for f in fuse(fn, X, W, ((N,), BF16))[1].fused] for _ in range(2)]
    assert specs[0] and specs[0] == specs[1]


def test_fake_implementation_gives_output_shapes_and_dtypes():
    spec = evtc.torch.make_spec("out y0: f32 = acc\nout D: f16 = relu(acc)\n", {}, [], ["y0", "D"])
    with FakeTensorMode():
        a = torch.empty(M, K, device="cuda", dtype=BF16)
        b = torch.empty(K, N, device="cuda", dtype=BF16)
        y0, d = torch.ops.evtc.gemm_epilogue(spec, a, b, [])
    assert (tuple(y0.shape), y0.dtype) == ((M, N), torch.float32)
    assert (tuple(d.shape), d.dtype) == ((M, N), torch.float16)
