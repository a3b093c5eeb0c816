"""evtc's FX pass on traced ATen graphs, without a GPU: fake CUDA tensors carry the shapes,
dtypes and strides the pass reads. Skipped where torch is not installed."""
from __future__ import annotations

import json
import operator
import re

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
    report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False, profitability=False)
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


def test_an_architecture_without_fused_kernels_leaves_chains_to_inductor(monkeypatch):
    # Kernels are built once per spec and process, for the architecture of that moment: the
    # ones built here must not serve the other tests.
    evtc.torch._op.spec_kernel.cache_clear()
    monkeypatch.setenv("EVTC_ARCH", "sm75")
    try:
        gm, report = fuse(lambda x, w: F.silu(x @ w.t()), X, W)
        assert not report.fused and "the target architecture is sm_75" in report.refused[0][1]
        assert torch.ops.aten.mm.default in ops_of(gm)
        _, grouped_report = fuse(grouped(F.silu), TOKENS, EXPERTS, OFFS)
        assert not grouped_report.fused and "sm_75" in grouped_report.refused[0][1]
    finally:
        evtc.torch._op.spec_kernel.cache_clear()


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


def test_leaky_relu_written_with_where_and_a_comparison_fuses():
    def fn(x, w):
        h = x @ w.t()
        return torch.where(h > 0, h, 0.01 * h)

    gm, report = fuse(fn, X, W)
    (f,) = report.fused
    ops = ops_of(gm)
    assert torch.ops.aten.gt.Scalar not in ops and torch.ops.aten.where.self not in ops
    assert "where(" in f.expr and " > 0" in f.expr
    # The comparison is computed in the kernel: its IR has gt, and no operand reads a mask.
    kernel = evtc.torch._op.spec_kernel(f.spec)[0]
    assert "gt " in kernel.ir and "bool" not in f.expr


def test_a_mask_against_an_operand_becomes_a_comparison_in_the_epilogue():
    def fn(x, w, threshold):
        h = x @ w.t()
        return h * (h >= threshold).to(h.dtype)

    gm, report = fuse(fn, X, W, ((N,), BF16))
    (f,) = report.fused
    assert " >= x0" in f.expr and "x0[n]: bf16" in f.expr
    assert torch.ops.aten.ge.Tensor not in ops_of(gm)


def test_a_comparison_read_outside_the_epilogue_stays_outside():
    def fn(x, w):
        h = F.silu(x @ w.t())
        return h, h > 0  # the mask is an output of the graph: evtc writes no boolean tensors

    gm, report = fuse(fn, X, W)
    (f,) = report.fused
    assert ">" not in f.expr and len(f.outputs) == 1
    assert torch.ops.aten.gt.Scalar in ops_of(gm)


def test_where_over_a_boolean_tensor_from_outside_stays_outside(caplog):
    def fn(x, w, mask):
        return torch.where(mask, x @ w.t(), 0.0)

    with caplog.at_level("DEBUG", logger="evtc.torch"):
        gm, report = fuse(fn, X, W, ((M, N), torch.bool))
    assert report.fused == [] and torch.ops.aten.where.self in ops_of(gm)
    assert "where with a boolean condition tensor from outside the epilogue (evtc operands are floating point; " \
           "a condition the epilogue computes, such as x > 0, fuses)" in caplog.text


def test_the_debug_log_shows_each_chains_epilogue(caplog):
    # refused ones too: the expression is what a refusal's numbers are about
    with caplog.at_level("DEBUG", logger="evtc.torch"):
        fuse(lambda x, w, r: F.silu(x @ w.t()) * r, X, W, ((M, N), BF16))
    assert f"mm at {M}x{N}x{K} with its epilogue:" in caplog.text
    assert "  input x0[m,n]: bf16" in caplog.text and "silu(" in caplog.text


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


ATEN = torch.ops.aten


@pytest.mark.parametrize("fn, inputs, fragment", [
    # the incoming gradient from the GEMM, the activation's input (or output) an [m,n] operand
    (lambda x, w, g: ATEN.silu_backward.default(x @ w.t(), g), (X, W, ((M, N), BF16)), "sigmoid"),
    (lambda x, w, g: ATEN.gelu_backward.default(x @ w.t(), g), (X, W, ((M, N), BF16)), "erf"),
    (lambda x, w, g: ATEN.gelu_backward.default(x @ w.t(), g, approximate="tanh"), (X, W, ((M, N), BF16)), "tanh"),
    (lambda x, w, y: ATEN.sigmoid_backward.default(x @ w.t(), y), (X, W, ((M, N), BF16)), "1.0 -"),
    (lambda x, w, y: ATEN.tanh_backward.default(x @ w.t(), y), (X, W, ((M, N), BF16)), "1.0 -"),
    (lambda x, w, g: ATEN.threshold_backward.default(x @ w.t(), g, 0.0), (X, W, ((M, N), BF16)), "where"),
    # the activation's input from the GEMM, the gradient an operand
    (lambda x, w, dy: ATEN.silu_backward.default(dy, x @ w.t()), (X, W, ((M, N), BF16)), "sigmoid"),
])
def test_activation_derivatives_join_the_chain(fn, inputs, fragment):
    gm, report = fuse(fn, *inputs)
    assert len(report.fused) == 1, report.summary()
    assert [op for op in ops_of(gm) if op.__name__.endswith("_backward.default")] == []
    assert fragment in report.fused[0].expr


def test_swiglu_backward_after_the_down_projections_data_gradient_is_one_op(caplog):
    # autograd's SwiGLU backward: d_up = dh * silu(g), d_gate = silu_backward(dh * u, g), with
    # dh the down projection's data gradient (dy @ W_down: W_down row-major, K × N)
    # dh viewed as the forward's [batch, seq, N], d_up viewed back to [M, N] for its weight
    # gradient before d_gate is computed (the order of autograd's graph); silu(g) recomputed
    # from the saved g, as AOT autograd's partitioner has it
    def fn(dy, w_down, g, u):
        dh = (dy @ w_down).view(4, M // 4, N)
        d_up = (dh * F.silu(g)).view(M, N)
        return d_up, ATEN.silu_backward.default(dh * u, g).view(M, N)

    saved = ((4, M // 4, N), BF16)
    with caplog.at_level("DEBUG", logger="evtc.torch"):
        gm, report = fuse(fn, ((M, K), BF16), ((K, N), BF16), saved, saved)
    assert len(report.fused) == 1, report.summary()
    # The debug log says what the epilogue computes again instead of reading.
    assert (f"evtc: mm computes silu in its epilogue (1 op(s)) from tensors it reads, instead of reading it: "
            f"{M * N * 2 / 1e6:.1f} MB not read") in caplog.text
    gm.graph.eliminate_dead_code()  # as Inductor does: silu(g) has no reader left
    ops = ops_of(gm)
    assert ops.count(torch.ops.evtc.gemm_epilogue.default) == 1
    for op in (ATEN.silu_backward.default, ATEN.mul.Tensor, ATEN.silu.default):
        assert op not in ops, report.fused[0].expr
    # g and u are read; silu(g) is computed in the epilogue, not read
    assert report.fused[0].expr.count("[m,n]") == 2, report.fused[0].expr
    assert "silu(" in report.fused[0].expr


def gelu_bias_backward(dy, w2, pre, x):
    """Autograd's backward of gelu_tanh(x @ w1ᵀ + b1) @ w2ᵀ for w1's layer: the data gradient
    through GELU's derivative, then b1's gradient (addmm's sum over rows, keepdim) and w1's."""
    d_pre = ATEN.gelu_backward.default(dy @ w2, pre, approximate="tanh")
    db1 = ATEN.sum.dim_IntList(d_pre, [0], True).view(-1)
    return db1, d_pre.t() @ x


def test_a_bias_gradient_becomes_a_column_sum_of_the_fused_op():
    gm, report = fuse(gelu_bias_backward, ((M, 264), BF16), ((264, N), BF16), ((M, N), BF16), X)
    (fusion,) = report.fused
    assert fusion.outputs == ["gelu_backward", "sum_1"], report.summary()
    assert "col_sum(" in fusion.expr and "out r0: bf16 = " in fusion.expr, fusion.expr
    assert json.loads(fusion.spec)["outputs"] == ["D", "r0"]
    ops = ops_of(gm)
    assert ATEN.sum.dim_IntList not in ops and ATEN.gelu_backward.default not in ops
    # The op's [N] column sums viewed back to the sum's [1, N], then to the gradient's [N].
    out = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    assert tuple(out[0].meta["val"].shape) == (N,) and out[0].meta["val"].dtype == BF16
    kernel = evtc.torch._op.spec_kernel(fusion.spec)[0]
    assert {o.name: o.shape for o in kernel.outputs} == {"D": "full", "r0": "row"}


def test_a_three_dimensional_bias_gradient_sums_over_both_leading_dimensions():
    # A linear over [batch, seq, K]: its bias gradient sums the 3-D gradient over [0, 1], in f32 here.
    def fn(dy, w2, pre):
        d_pre = ATEN.gelu_backward.default((dy @ w2).view(4, M // 4, N), pre)
        return ATEN.sum.dim_IntList(d_pre, [0, 1], dtype=torch.float32), d_pre

    gm, report = fuse(fn, ((M, 264), BF16), ((264, N), BF16), ((4, M // 4, N), BF16))
    (fusion,) = report.fused
    assert "out r0: f32 = " in fusion.expr, fusion.expr
    out = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    assert tuple(out[0].meta["val"].shape) == (N,) and out[0].meta["val"].dtype == torch.float32
    assert tuple(out[1].meta["val"].shape) == (4, M // 4, N)


@pytest.mark.parametrize("sum_of", [
    lambda h: ATEN.sum.dim_IntList(h, [1]),  # over N (a row sum, as a norm's)
    lambda h: ATEN.sum.dim_IntList(h, [-1], True),
    lambda h: ATEN.sum.default(h),  # over everything (a loss)
])
def test_sums_other_than_column_sums_stay_outside(sum_of):
    def fn(x, w):
        h = F.gelu(x @ w.t())
        return h, sum_of(h)

    gm, report = fuse(fn, X, W)
    (fusion,) = report.fused  # the GEMM and its GELU; the sum reads their output
    assert "col_sum" not in fusion.expr and fusion.outputs == ["gelu"], fusion.expr
    assert any(str(op).startswith("aten.sum") for op in ops_of(gm))


def test_a_column_sum_refusal_names_the_sum_and_its_dimensions():
    from evtc.torch._chain import absorbable
    from evtc.torch._gemm import start_chain

    gm = trace(lambda x, w: ATEN.sum.dim_IntList(x @ w.t(), [1]), X, W)
    mm = next(n for n in gm.graph.nodes if n.target is ATEN.mm.default)
    total = next(n for n in gm.graph.nodes if n.target is ATEN.sum.dim_IntList)
    assert absorbable(start_chain(mm), total) == (
        f"sum {total.name} over dimensions [1] of a 2-D value: only a sum over every dimension but the last (a column sum, "
        "such as a bias gradient) fuses")


def test_a_chain_refused_with_its_column_sum_is_fused_without_it(monkeypatch, caplog):
    from evtc.torch.passes import profitability

    decide = profitability.decide

    def refuse_sums(chain, kernel, outs, settings):
        if chain.reductions:
            raise evtc.torch._chain.Refused("not profitable (the test's)")
        return decide(chain, kernel, outs, settings)

    monkeypatch.setattr(profitability, "decide", refuse_sums)
    with caplog.at_level("DEBUG", logger="evtc.torch"):
        gm, report = fuse(gelu_bias_backward, ((M, 264), BF16), ((264, N), BF16), ((M, N), BF16), X)
    (fusion,) = report.fused
    assert "col_sum" not in fusion.expr and fusion.outputs == ["gelu_backward"], report.summary()
    assert ATEN.sum.dim_IntList in ops_of(gm)  # Inductor sums the fused op's output
    assert ("evtc: mm with the column sums sum_1 refused (not profitable (the test's)); trying it without them"
            in caplog.text)


def test_a_value_computed_from_a_column_sum_stays_outside():
    # The sum is complete only after the kernel's last tile: the epilogue cannot use it.
    def fn(dy, w2, pre, x):
        db1, dw1 = gelu_bias_backward(dy, w2, pre, x)
        return db1 * 0.375, dw1

    gm, report = fuse(fn, ((M, 264), BF16), ((264, N), BF16), ((M, N), BF16), X)
    (fusion,) = report.fused
    assert "col_sum(" in fusion.expr and "0.375" not in fusion.expr, fusion.expr
    assert ATEN.mul.Tensor in ops_of(gm)


def test_fused_ops_round_as_inductor_by_default_and_as_eager_on_request():
    # The default cast mode rounds as Inductor's kernel would (the GEMM's result and the outputs;
    # docs/passes.md, "normalize_casts"): plain torch.compile's numerics, not eager's.
    fn = lambda x, w, u: F.silu(x @ w.t()) * u  # noqa: E731
    inputs = (X, W, ((M, N), BF16))
    _, report = fuse(fn, *inputs)
    assert json.loads(report.fused[0].spec)["options"]["cast_mode"] == "compile"
    gm = trace(fn, *inputs)
    eager = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False, profitability=False, cast_mode="eager")
    assert json.loads(eager.fused[0].spec)["options"]["cast_mode"] == "eager"
    with pytest.raises(Exception, match="cast_mode: unknown mode 'slow'"):
        evtc.compile("out D = acc", cast_mode="slow")


def test_compile_mode_keeps_the_rounding_of_addmms_biased_result():
    # cuBLAS adds addmm's bias in its own epilogue and writes the sum rounded to bf16, which is
    # what Inductor's GELU kernel then reads: the fused op rounds it there too (docs/passes.md,
    # "normalize_casts"), while the GELU's own ops compute in f32.
    fn = lambda x, w, b: F.gelu(torch.addmm(b, x, w.t()), approximate="tanh")  # noqa: E731
    _, report = fuse(fn, X, W, ((N,), BF16))
    (fusion,) = report.fused
    ir = evtc.torch._op.spec_kernel(fusion.spec)[0].ir
    add = re.search(r"(%\d+) = add %\d+, %\d+ : f32\[m,n\]", ir)
    assert add and f"= cast {add.group(1)} : bf16[m,n]" in ir, ir
    assert ir.count("= cast ") == 1 and "tanh" in ir, ir


def gpt2_residual_stream(x, a, w1, b1, w2, b2, ln_w, ln_b):
    """GPT-2's residual stream around its second LayerNorm: y = x + c_proj(a), then
    y + mlp_proj(ln_2(y)) (the MLP's hidden layer left out)."""
    y = x + torch.addmm(b1, a, w1)
    return y + torch.addmm(b2, F.layer_norm(y, (N,), ln_w, ln_b), w2)


GPT2_STREAM = (((M, N), BF16), ((M, K), BF16), ((K, N), BF16), ((N,), BF16), ((N, N), BF16), ((N,), BF16),
               ((N,), BF16), ((N,), BF16))


def test_a_residual_sum_that_a_norm_reads_is_stored_by_the_fused_kernel_by_default():
    gm, report = fuse(gpt2_residual_stream, *GPT2_STREAM)
    first, second = report.fused
    assert first.outputs == ["add"] and second.outputs == ["add_1"]
    norm = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.native_layer_norm.default)
    assert norm.args[0].target is operator.getitem  # ln_2 reads the sum the fused kernel stored
    assert [o[1] for o in json.loads(second.spec)["operands"]] == ["row", "aux"]


def test_recomputed_residual_sums_round_the_stream_where_plain_compile_does():
    """With the setting, the sum ln_2 reads stays with Inductor (which adds it again in ln_2's
    kernel), and mlp_proj's epilogue adds x and c_proj's result itself, in f32: the sum is never
    rounded, while c_proj's own biased result is, as cuBLAS writes it."""
    gm = trace(gpt2_residual_stream, *GPT2_STREAM)
    report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False, profitability=False,
                                            residual_sums="recomputed")
    first, second = report.fused
    assert first.outputs == ["addmm"], first.expr  # c_proj with its bias alone
    norm = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.native_layer_norm.default)
    assert norm.args[0].target is torch.ops.aten.add.Tensor
    assert second.outputs == ["add_1"]
    spec = json.loads(second.spec)
    assert [o[1] for o in spec["operands"]] == ["row", "aux", "aux"]
    ir = evtc.torch._op.spec_kernel(second.spec)[0].ir
    aux = re.findall(r"(%\d+) = aux x\d : bf16\[m,n\]", ir)
    total = re.search(rf"(%\d+) = add {aux[0]}, {aux[1]} : f32\[m,n\]", ir)
    assert total and f"= cast {total.group(1)}" not in ir, ir
    assert ir.count("= cast ") == 1, ir  # acc + bias only, as cuBLAS rounds it
    # Eager's roundings keep it: the cast mode decides, the setting only what is stored.
    eager = evtc.torch.fuse_gemm_epilogues(trace(gpt2_residual_stream, *GPT2_STREAM).graph, compile=False,
                                           profitability=False, residual_sums="recomputed", cast_mode="eager")
    assert evtc.torch._op.spec_kernel(eager.fused[1].spec)[0].ir.count("= cast ") == 2  # the sum too


def test_recomputed_residual_sums_keep_a_sum_only_the_output_or_a_gemm_reads():
    def fn(x, a, w1, w2):
        y = x + a @ w1.t()
        # Stored by plain compile too: a graph output and a GEMM's input (through a view).
        return y, y.view(M, N) @ w2.t()

    gm = trace(fn, ((M, N), BF16), ((M, K), BF16), W, ((N, N), BF16))
    report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False, profitability=False,
                                            residual_sums="recomputed")
    (fusion,) = report.fused
    assert "add" in fusion.outputs, fusion.outputs  # the sum is stored by the fused kernel


def test_recomputed_residual_sums_read_a_term_that_is_itself_an_unstored_sum():
    """Two LLaMA-style layers: the first layer's output is a sum the second layer's norm reads,
    so no kernel stores it and the last residual add reads it as the term it is."""
    def rms(h, g):
        hf = h.float()
        return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6) * g).to(BF16)

    def fn(x, o, w1, w2, w3, g):
        h = x + o @ w1.t()
        out = h + rms(h, g) @ w2.t()
        h2 = out + rms(out, g) @ w3.t()
        return h2

    sq = ((N, N), BF16)
    gm = trace(fn, ((M, N), BF16), ((M, N), BF16), sq, sq, sq, ((N,), BF16))
    report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False, profitability=False,
                                            residual_sums="recomputed")
    (last,) = report.fused
    assert last.outputs == ["add_4"] and len(report.refused) == 2
    assert [o[1] for o in json.loads(last.spec)["operands"]] == ["aux", "aux"]


def trace_decomposed(fn, *shapes_dtypes):
    """trace() with Inductor's decompositions: the graph its post-grad passes see (a LayerNorm
    as a cast to f32, var_mean and pointwise ops)."""
    from torch._inductor.decomposition import select_decomp_table

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        args = [torch.empty(*spec[0], device="cuda", dtype=spec[1]) for spec in shapes_dtypes]
        gm = make_fx(fn, decomposition_table=select_decomp_table())(*args)
    gm.graph.eliminate_dead_code()  # the decompositions' unused casts, which Inductor drops too
    return gm


def test_f32_residual_sums_write_the_sum_a_norm_and_a_later_add_read_unrounded():
    """residual_sums="f32": c_proj's fused op writes x + proj in f32 (its bias result rounded,
    as cuBLAS writes it, the sum not), ln_2's cast to f32 reads that tensor, and mlp_proj's
    epilogue adds it unrounded: the roundings of plain compile, which never stores the sum."""
    gm = trace_decomposed(gpt2_residual_stream, *GPT2_STREAM)
    report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False, profitability=False, residual_sums="f32")
    gm.recompile()
    first, second = report.fused
    assert first.outputs == ["add"] and second.outputs == ["add_3"], report.summary()
    assert "out D: f32 = " in first.expr, first.expr
    ir = evtc.torch._op.spec_kernel(first.spec)[0].ir
    assert ir.count("= cast ") == 1, ir  # acc + bias, as cuBLAS rounds it; the sum stays f32
    fused = [n for n in gm.graph.nodes if n.target is evtc.torch._op.GEMM_EPILOGUE]
    wide = next(u for u in fused[0].users)
    assert wide.meta["val"].dtype == torch.float32
    # ln_2 starts from the f32 sum: no cast of it to bf16 and back is left.
    var_mean = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.var_mean.correction)
    assert var_mean.args[0] is wide
    assert not any(n.target is torch.ops.prims.convert_element_type.default and n.args[0] is wide
                   for n in gm.graph.nodes), gm.graph
    spec = json.loads(second.spec)
    assert [o[1] for o in spec["operands"]] == ["row", "aux"] and fused[1].args[3][1] is wide
    assert "input x1[m,n]: f32" in second.expr, second.expr
    result = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    assert result.meta["val"].dtype == BF16


def test_f32_residual_sums_keep_the_rounded_sum_for_other_readers():
    """A sum the graph also returns (saved for backward) or a GEMM reads keeps a bf16 copy,
    rounded from the f32 sum; a sum that no reader takes in f32 is written in its dtype."""
    def fn(x, a, w1, w2, ln_w, ln_b):
        y = x + a @ w1.t()
        return y, F.layer_norm(y, (N,), ln_w, ln_b), y @ w2.t()

    gm = trace_decomposed(fn, ((M, N), BF16), ((M, K), BF16), W, ((N, N), BF16), ((N,), BF16), ((N,), BF16))
    report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False, profitability=False, residual_sums="f32")
    gm.recompile()
    fusion = next(f for f in report.fused if "add" in f.outputs)
    assert "out D: f32 = " in fusion.expr
    out = next(n for n in gm.graph.nodes if n.op == "output")
    y = out.args[0][0]
    assert y.target is torch.ops.prims.convert_element_type.default and y.meta["val"].dtype == BF16
    assert y.args[0].meta["val"].dtype == torch.float32

    def no_norm(x, a, w1, w2):
        y = x + a @ w1.t()
        return y, y @ w2.t()

    gm = trace_decomposed(no_norm, ((M, N), BF16), ((M, K), BF16), W, ((N, N), BF16))
    report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False, profitability=False, residual_sums="f32")
    assert all("f32" not in f.expr.split("out ")[-1] for f in report.fused), [f.expr for f in report.fused]


def test_f32_residual_sums_through_3d_views_at_symbolic_sizes():
    """A [batch, tokens, width] stream with symbolic batch and tokens: the f32 sum reaches the
    norm through the view the pass makes with the graph's own size nodes."""
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    width, k = 64, 80

    def stream(x, a, w1, b1, w2, b2, ln_w, ln_b):
        y = x + F.linear(a, w1, b1)
        return y + F.linear(F.layer_norm(y, (width,), ln_w, ln_b), w2, b2)

    with FakeTensorMode(allow_non_fake_inputs=True):
        made = [torch.empty(*s, device="cuda", dtype=BF16)
                for s in [(4, 96, width), (4, 96, k), (width, k), (width,), (width, width), (width,), (width,), (width,)]]
    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.DYNAMIC, DimDynamic.STATIC])
    args = [mode.from_tensor(t, symbolic_context=dynamic) for t in made[:2]] + [mode.from_tensor(t) for t in made[2:]]
    with mode:
        gm = make_fx(stream, decomposition_table=select_decomp_table())(*args)
    gm.graph.eliminate_dead_code()
    report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False, profitability=False, residual_sums="f32")
    gm.graph.lint()
    first, second = report.fused
    assert "out D: f32 = " in first.expr and "input x1[m,n]: f32" in second.expr, (first.expr, second.expr)
    var_mean = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.var_mean.correction)
    wide = var_mean.args[0]
    assert wide.target is torch.ops.aten.view.default and wide.meta["val"].dtype == torch.float32
    assert isinstance(wide.meta["val"].shape[0], torch.SymInt) and wide.meta["val"].shape[2] == width


def test_f32_residual_sums_give_every_view_of_the_sum_its_dtype():
    """A sum read outside the chain both as it is and through a view (one output of the fused
    op): each reader gets the f32 tensor where it casts to f32, else the rounded bf16 copy."""
    def fn(x, a, w1, ln_w, ln_b):
        y = x + a @ w1.t()
        batched = y.view(8, M // 8, N)  # a view the chain takes in: the same value as y
        flat = y.view(M * N)  # one it does not: a reader of y
        return F.layer_norm(y, (N,), ln_w, ln_b), batched.cumsum(1), flat.amax(), flat.float().sum()

    gm = trace_decomposed(fn, ((M, N), BF16), ((M, K), BF16), W, ((N,), BF16), ((N,), BF16))
    report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False, profitability=False, residual_sums="f32")
    gm.graph.lint()
    (fusion,) = report.fused
    assert "out D: f32 = " in fusion.expr and len(fusion.outputs) == 2, (fusion.expr, fusion.outputs)
    readers = [n for n in gm.graph.nodes if n.target in (torch.ops.aten.amax.default, torch.ops.aten.cumsum.default)]
    assert len(readers) == 2 and all(r.args[0].meta["val"].dtype == BF16 == r.meta["val"].dtype for r in readers)
    total = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.sum.default)
    assert total.args[0].meta["val"].dtype == torch.float32 and total.args[0].meta["val"].shape == (M * N,)


def test_f32_residual_sums_apply_to_compiles_roundings_only():
    gm = trace_decomposed(gpt2_residual_stream, *GPT2_STREAM)
    report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False, profitability=False, residual_sums="f32",
                                            cast_mode="eager")
    assert all("out D: bf16" in f.expr for f in report.fused), [f.expr for f in report.fused]
    with pytest.raises(ValueError, match="residual_sums: unknown value 'wide'; choose one of rounded, f32, "
                                         "recomputed"):
        evtc.torch.fuse_gemm_epilogues(gm.graph, residual_sums="wide")


def test_fused_ops_take_fast_math_by_default_and_precise_math_on_request():
    fn = lambda x, w: torch.tanh(x @ w.t())  # noqa: E731
    _, report = fuse(fn, X, W)
    assert json.loads(report.fused[0].spec)["options"]["precise_math"] is False
    precise = evtc.torch.fuse_gemm_epilogues(trace(fn, X, W).graph, compile=False, profitability=False,
                                             precise_math=True)
    spec = json.loads(precise.fused[0].spec)
    assert spec["options"]["precise_math"] is True
    # the fused op's kernel is built with it
    assert evtc.torch._op.spec_kernel(precise.fused[0].spec)[0]._options.precise_math
    assert not evtc.torch._op.spec_kernel(report.fused[0].spec)[0]._options.precise_math


def test_llama_mlp_without_merging_takes_the_other_gemm_as_an_operand():
    gm = trace(lambda x, w1, w3: F.silu(x @ w1.t()) * (x @ w3.t()), X, W, W)
    report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False, profitability=False, merge_gated=False)
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


# --- gated activations over interleaved (gate, up) columns ------------------------------------

def swiglu7(h):
    """W4's epilogue: gate columns 0::2, up columns 1::2."""
    g = h[:, 0::2].clamp(max=7)
    u = h[:, 1::2].clamp(-7, 7)
    return g * torch.sigmoid(1.702 * g) * (u + 1)


def test_sliced_gated_chain_becomes_one_op_with_a_half_width_output():
    gm, report = fuse(lambda x, w: swiglu7(x @ w.t()), X, W)
    (f,) = report.fused
    ops = ops_of(gm)
    assert torch.ops.aten.slice.Tensor not in ops and torch.ops.aten.mm.default not in ops
    kernel = evtc.torch._op.spec_kernel(f.spec)[0]
    assert "gate " in kernel.ir and "up " in kernel.ir
    (out,) = kernel.outputs
    assert out.shape == "half"
    result = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    result = result[0] if isinstance(result, (tuple, list)) else result
    assert tuple(result.meta["val"].shape) == (M, N // 2)


def test_gated_chain_keeps_the_pre_activation_as_a_second_output():
    def fn(x, w, b, s):
        h = x @ w.t() + b
        return F.silu(h[:, ::2]) * h[:, 1::2] * s.unsqueeze(1), h

    gm, report = fuse(fn, X, W, ((N,), BF16), ((M,), torch.float32))
    (f,) = report.fused
    shapes = sorted(o.shape for o in evtc.torch._op.spec_kernel(f.spec)[0].outputs)
    assert shapes == ["full", "half"], f.expr
    assert "x1[m]: f32" in f.expr


def test_a_row_vector_over_the_gated_columns_stays_outside():
    def fn(x, w, r):
        h = x @ w.t()
        return (F.silu(h[:, 0::2]) * h[:, 1::2]) * r

    gm, report = fuse(fn, X, W, ((N // 2,), BF16))
    (f,) = report.fused
    assert "[n]" not in f.expr
    assert torch.ops.aten.mul.Tensor in ops_of(gm)  # the product with r runs after the fused op


def test_gated_chain_of_a_three_dimensional_linear():
    def fn(x, w):
        h = F.linear(x, w)
        return F.gelu(h[..., 0::2], approximate="tanh") * h[..., 1::2]

    gm, report = fuse(fn, ((4, 250, K), BF16), W)
    assert len(report.fused) == 1, report.summary()
    result = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    result = result[0] if isinstance(result, (tuple, list)) else result
    assert tuple(result.meta["val"].shape) == (4, 250, N // 2)


# --- grouped GEMMs (torch._grouped_mm) -------------------------------------------------------

G = 8
TOKENS = ((M, K), BF16)
EXPERTS = ((G, N, K), BF16)
OFFS = ((G,), torch.int32)


def grouped(h_fn):
    return lambda x, w, offs, *rest: h_fn(torch._grouped_mm(x, w.transpose(-2, -1), offs=offs), *rest)


def test_grouped_mm_with_gated_activation_becomes_one_grouped_op():
    gm, report = fuse(grouped(swiglu7), TOKENS, EXPERTS, OFFS)
    (f,) = report.fused
    ops = ops_of(gm)
    assert torch.ops.evtc.grouped_gemm_epilogue.default in ops
    assert torch.ops.aten._grouped_mm.default not in ops and torch.ops.aten.slice.Tensor not in ops
    kernel, spec = evtc.torch._op.spec_kernel(f.spec)
    assert spec["grouped"] and spec["options"]["b_layout"] == "col" and kernel.gated
    result = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    result = result[0] if isinstance(result, (tuple, list)) else result
    assert tuple(result.meta["val"].shape) == (M, N // 2)


def test_grouped_mm_chunked_into_gate_and_up_halves_becomes_one_grouped_op():
    def halves(h):
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up

    gm, report = fuse(grouped(halves), TOKENS, EXPERTS, OFFS)
    (f,) = report.fused
    assert "gate(h)" in f.expr and "up(h)" in f.expr
    assert torch.ops.aten._grouped_mm.default not in ops_of(gm)
    assert evtc.torch._op.spec_kernel(f.spec)[0].gated


def test_grouped_mm_reads_a_shared_bias_and_n_major_weights():
    def fn(x, w, offs, b):
        return F.silu(torch._grouped_mm(x, w, offs=offs) + b)

    gm, report = fuse(fn, TOKENS, ((G, K, N), BF16), OFFS, ((N,), BF16))
    (f,) = report.fused
    spec = evtc.torch._op.spec_kernel(f.spec)[1]
    assert spec["options"]["b_layout"] == "row" and spec["options"]["wait_for_compile"] is False and spec["operands"] == [["x0", "row"]]


@pytest.mark.parametrize("fn, inputs, reason", [
    (grouped(lambda h: h), (TOKENS, EXPERTS, OFFS), "nothing to fuse"),
    (grouped(lambda h: (F.silu(h), h)), (TOKENS, EXPERTS, OFFS), "writes one output"),
    (grouped(F.silu), (TOKENS, ((G, 1020, K), BF16), OFFS), "N=1020"),
    (lambda a, b: F.silu(torch._grouped_mm(a, b)), (((G, 64, K), BF16), ((G, K, N), BF16)), "3-D weights form"),
])
def test_refused_grouped_chains_say_why(fn, inputs, reason):
    before = trace(fn, *inputs)
    gm, report = fuse(fn, *inputs)
    assert report.fused == [] and any(reason in why for _, why in report.refused), report.summary()
    assert [str(n.target) for n in gm.graph.nodes] == [str(n.target) for n in before.graph.nodes]


def test_a_column_vector_stays_outside_a_grouped_epilogue():
    def fn(x, w, offs, s):
        return F.silu(torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)) * s.unsqueeze(1)

    gm, report = fuse(fn, TOKENS, EXPERTS, OFFS, ((M,), BF16))
    (f,) = report.fused
    assert "[m]" not in f.expr and torch.ops.aten.mul.Tensor in ops_of(gm)


def test_grouped_fake_implementation_gives_the_output_shape():
    spec = evtc.torch.make_grouped_spec("out y: bf16 = swiglu(acc)\n", {"b_layout": "col"}, [])
    with FakeTensorMode():
        x = torch.empty(M, K, device="cuda", dtype=BF16)
        w = torch.empty(G, K, N, device="cuda", dtype=BF16)
        offs = torch.empty(G, device="cuda", dtype=torch.int32)
        y = torch.ops.evtc.grouped_gemm_epilogue(spec, x, w, offs, [])
    assert (tuple(y.shape), y.dtype) == ((M, N // 2), BF16)


def test_norm_after_a_residual_add_stays_with_inductor():
    """o_proj + residual, then RMSNorm: the GEMM writes the bf16 sum; the f32 cast and the
    square that only the norm's reduction reads stay outside (Inductor computes them in it)."""
    def fn(x, w, r, g):
        h = x @ w.t() + r
        hf = h.float()
        y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6)
        return h, (y * g).to(torch.bfloat16)

    gm, report = fuse(fn, X, W, ((M, N), BF16), ((N,), BF16))
    (f,) = report.fused
    kernel = evtc.torch._op.spec_kernel(f.spec)[0]
    assert [o.dtype for o in kernel.outputs] == ["bf16"], f.expr
    assert "pow" not in f.expr and "square" not in f.expr


def block_scaled_gelu(a, w, sa_t, sb_t, bias):
    """_scaled_mm with DeepSeek-V3's block scales (A's M × K/128 with M adjacent, B's K/128 ×
    N/128 with K adjacent: PyTorch's layouts), then a bias and GELU."""
    y = torch._scaled_mm(a, w.t(), scale_a=sa_t.t(), scale_b=sb_t.t(), out_dtype=torch.bfloat16)
    return F.gelu(y + bias)


def test_block_scaled_scaled_mm_becomes_a_block_scaled_kernel():
    m, n, k = 1000, 1040, 528  # 5 K blocks (the last partial), 9 N blocks
    kb, nb = -(-k // 128), -(-n // 128)
    gm, report = fuse(block_scaled_gelu, ((m, k), torch.float8_e4m3fn), ((n, k), torch.float8_e4m3fn),
                      ((kb, m), torch.float32), ((nb, kb), torch.float32), ((n,), BF16))
    assert len(report.fused) == 1, report.refused
    ops = ops_of(gm)
    assert torch.ops.aten._scaled_mm.default not in ops and torch.ops.aten.gelu.default not in ops
    kernel, spec = evtc.torch._op.spec_kernel(report.fused[0].spec)
    assert spec["options"]["fp8_blockwise"] is True
    assert [o[1] for o in spec["operands"]].count("block_scale") == 2
    assert "gelu" in kernel.ir and "@scale" not in kernel.ir  # the scales are the main loop's
    assert kernel.config_for(m, n, k) == "coop_128x128x128_c1x1_persistent"


def test_row_wise_scales_stay_epilogue_operands():
    m, n, k = 1000, 1040, 528
    gm, report = fuse(lambda a, w, sa, sb: torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=BF16) * 2,
                      ((m, k), torch.float8_e4m3fn), ((n, k), torch.float8_e4m3fn), ((m, 1), torch.float32),
                      ((1, n), torch.float32))
    assert len(report.fused) == 1, report.refused
    kernel, spec = evtc.torch._op.spec_kernel(report.fused[0].spec)
    assert not spec["options"].get("fp8_blockwise", False)
    assert [o[1] for o in spec["operands"]] == ["col", "row"]
