"""evtc's merge_gated pass on traced ATen graphs (fake CUDA tensors, no GPU): two projections
that share their input and meet in a gated activation, or one projection split in halves,
become one gated GEMM over interleaved weights. Skipped where torch is not installed."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch", reason="the FX pass tests need torch")

import torch.nn.functional as F  # noqa: E402

import evtc.torch  # noqa: E402
from evtc.torch._op import GEMM_EPILOGUE, GEMM_EPILOGUE_MERGED, GROUPED_GEMM_EPILOGUE_MERGED, spec_kernel  # noqa: E402
from test_fx_pass import BF16, K, M, ops_of, trace  # noqa: E402

F_ = 520  # each projection's features (the merged N = 1040)
X = ((M, K), BF16)
X3 = ((4, 250, K), BF16)
WG = ((F_, K), BF16)


def fuse(fn, *inputs, **settings):
    gm = trace(fn, *inputs)
    report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False, profitability=False, **settings)
    gm.recompile()
    return gm, report


def merged_fusion(report):
    (f,) = [f for f in report.fused if f.merged]
    return f


def output_of(gm):
    out = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    return out[0] if isinstance(out, (tuple, list)) else out


def test_llama_mlp_of_linears_merges_gate_and_up():
    # nn.Linear's forward on a 3-D input, weights as graph inputs (as Inductor sees them)
    gm, report = fuse(lambda x, wg, wu: F.silu(F.linear(x, wg)) * F.linear(x, wu), X3, WG, WG)
    f = merged_fusion(report)
    assert len(f.merged) == 2
    ops = ops_of(gm)
    assert GEMM_EPILOGUE_MERGED in ops and torch.ops.aten.mm.default not in ops
    kernel = spec_kernel(f.spec)[0]
    assert "gate " in kernel.ir and "up " in kernel.ir
    assert [o.shape for o in kernel.outputs] == ["half"]
    assert tuple(output_of(gm).meta["val"].shape) == (4, 250, F_)


@pytest.mark.parametrize("form", ["silu(g)*u", "u*silu(g)", "gelu_tanh", "gptoss", "swiglu7"])
def test_gated_forms_of_two_projections_merge(form):
    def fn(x, wg, wu):
        g, u = x @ wg.t(), x @ wu.t()
        if form == "silu(g)*u":
            return F.silu(g) * u
        if form == "u*silu(g)":
            return u * F.silu(g)
        if form == "gelu_tanh":
            return F.gelu(g, approximate="tanh") * u
        if form == "gptoss":
            g, u = g.clamp(max=7.0), u.clamp(-7.0, 7.0)
            return g * torch.sigmoid(1.702 * g) * (u + 1)
        g, u = g.clamp(max=7), u.clamp(-7, 7)
        return g * torch.sigmoid(1.702 * g) * (u + 1)

    gm, report = fuse(fn, X, WG, WG)
    f = merged_fusion(report)
    assert GEMM_EPILOGUE_MERGED in ops_of(gm), report.summary()
    assert tuple(output_of(gm).meta["val"].shape) == (M, F_)
    assert "gate(h)" in f.expr and "up(h)" in f.expr


def test_biases_of_the_two_linears_are_paired():
    gm, report = fuse(lambda x, wg, bg, wu, bu: F.silu(F.linear(x, wg, bg)) * F.linear(x, wu, bu),
                      X, WG, ((F_,), BF16), WG, ((F_,), BF16))
    f = merged_fusion(report)
    merged = json.loads(f.spec)["merged"]
    assert list(merged["rows"]) == ["xb"] and "input xb[n]" in f.expr and "acc + xb" in f.expr
    (node,) = [n for n in gm.graph.nodes if n.target is GEMM_EPILOGUE_MERGED]
    # the op takes the graph's weights and biases themselves (their version counters tell it
    # when its interleaved copy is stale) and applies the views the graph applied
    assert [s.op for s in node.args[2]] == ["placeholder"] * 4
    assert merged["b"][0]["views"] in ([["permute", 1, 0]], [["t"]])


@pytest.mark.parametrize("split", ["chunk", "split", "slices"])
def test_one_projection_split_in_halves_merges(split):
    def fn(x, w):
        h = F.linear(x, w)
        if split == "chunk":
            g, u = h.chunk(2, dim=-1)
        elif split == "split":
            g, u = h.split(F_, dim=-1)
        else:
            g, u = h[..., :F_], h[..., F_:]
        return F.silu(g) * u

    gm, report = fuse(fn, X3, ((2 * F_, K), BF16))
    f = merged_fusion(report)
    assert GEMM_EPILOGUE_MERGED in ops_of(gm), report.summary()
    assert tuple(output_of(gm).meta["val"].shape) == (4, 250, F_)
    (node,) = [n for n in gm.graph.nodes if n.target is GEMM_EPILOGUE_MERGED]
    (source,) = node.args[2]  # one fused weight, halves taken by the recipes
    gate, up = json.loads(f.spec)["merged"]["b"]
    assert gate["views"][-1] == ["slice", 1, 0, F_, 1] and up["views"][-1][:3] == ["slice", 1, F_], (gate, up)
    assert tuple(source.meta["val"].shape) == (2 * F_, K)


def test_grouped_experts_with_separate_gate_and_up_weights_merge():
    G = 8

    def fn(x, w1, w3, offs):
        g = torch._grouped_mm(x, w1.transpose(-2, -1), offs=offs)
        u = torch._grouped_mm(x, w3.transpose(-2, -1), offs=offs)
        return F.silu(g) * u

    gm, report = fuse(fn, X, ((G, F_, K), BF16), ((G, F_, K), BF16), ((G,), torch.int32))
    f = merged_fusion(report)
    assert GROUPED_GEMM_EPILOGUE_MERGED in ops_of(gm), report.summary()
    kernel, spec = spec_kernel(f.spec)
    assert spec["grouped"] and kernel.gated and spec["options"]["b_layout"] == "col"
    assert tuple(output_of(gm).meta["val"].shape) == (M, F_)


@pytest.mark.parametrize("fn, inputs, reason", [
    # a half used on its own (a training graph saves the pre-activation for backward)
    (lambda x, wg, wu: ((lambda g: (F.silu(g) * (x @ wu.t()), g))(x @ wg.t())), (X, WG, WG), "used outside"),
    # B computed in the graph, not a weight
    (lambda x, wg, wu: F.silu(x @ (wg * 2).t()) * (x @ (wu * 2).t()), (X, WG, WG), "computed in the graph"),
])
def test_refused_merges_say_why(fn, inputs, reason):
    gm, report = fuse(fn, *inputs)
    assert GEMM_EPILOGUE_MERGED not in ops_of(gm)
    if reason:
        assert any(reason in why for _, why in report.refused), report.summary()


def test_projections_of_different_inputs_or_shapes_are_not_merged():
    gm, _ = fuse(lambda x, y, wg, wu: F.silu(x @ wg.t()) * (y @ wu.t()), X, X, WG, WG)
    assert GEMM_EPILOGUE_MERGED not in ops_of(gm)
    gm, _ = fuse(lambda x, wg, wu: F.silu(x @ wg.t())[:, :F_ // 2] * (x @ wu.t()), X, WG, ((F_ // 2, K), BF16))
    assert GEMM_EPILOGUE_MERGED not in ops_of(gm)


def test_projections_that_never_meet_are_not_merged():
    # q, k, v share their input but are not combined pointwise: nothing to gain
    gm, report = fuse(lambda x, wq, wk: (F.silu(x @ wq.t()), F.gelu(x @ wk.t())), X, WG, WG)
    assert GEMM_EPILOGUE_MERGED not in ops_of(gm)
    assert ops_of(gm).count(GEMM_EPILOGUE) == 2


def test_merging_can_be_switched_off():
    gm, report = fuse(lambda x, wg, wu: F.silu(x @ wg.t()) * (x @ wu.t()), X, WG, WG, merge_gated=False)
    assert GEMM_EPILOGUE_MERGED not in ops_of(gm)


def test_merged_fake_implementation_gives_the_output_shape():
    from torch._subclasses.fake_tensor import FakeTensorMode

    recipe = [{"source": 0, "views": [["t"]]}, {"source": 1, "views": [["t"]]}]
    spec = evtc.torch.make_spec("h = acc\nout D: bf16 = silu(gate(h)) * up(h)\n", {}, [], ["D"], {"b": recipe, "rows": {}})
    with FakeTensorMode():
        a = torch.empty(M, K, device="cuda", dtype=BF16)
        w = torch.empty(F_, K, device="cuda", dtype=BF16)
        (d,) = torch.ops.evtc.gemm_epilogue_merged(spec, a, [w, w], [])
    assert tuple(d.shape) == (M, F_)


def test_merged_fake_implementation_reads_recipes_on_symbolic_sizes():
    # One [gate; up] weight, halved by slices (a projection split in halves), traced with symbolic
    # sizes: the op library's recipe reader gives N on fake tensors whose sizes are symbols.
    from torch.fx.experimental.proxy_tensor import make_fx

    halves = [{"source": 0, "views": [["slice", 0, 0, F_ // 2, 1], ["t"]]},
              {"source": 0, "views": [["slice", 0, F_ // 2, 1 << 62, 1], ["t"]]}]
    spec = evtc.torch.make_spec("h = acc\nout D: bf16 = silu(gate(h)) * up(h)\n", {}, [], ["D"],
                                {"b": halves, "rows": {}})

    def f(a, w):
        (d,) = torch.ops.evtc.gemm_epilogue_merged(spec, a, [w], [])
        return d

    gm = make_fx(f, tracing_mode="symbolic")(torch.empty(M, K, dtype=BF16), torch.empty(F_, K, dtype=BF16))
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    d = out.args[0][0].meta["val"] if isinstance(out.args[0], (list, tuple)) else out.args[0].meta["val"]
    assert isinstance(d.shape[0], torch.SymInt) and isinstance(d.shape[1], torch.SymInt)
    # N = the two halves' F_ features; the gated output has N / 2 columns.
    assert d.shape[1].node.hint == F_ // 2 and d.shape[0].node.hint == M
