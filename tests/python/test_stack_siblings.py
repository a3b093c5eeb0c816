"""Sibling projections of one input as one GEMM, on the CPU: merge_projections stacks q/k/v
into consecutive rows of one buffer with nothing else changed; torch.ops.evtc.stacked_linear
computes a @ cat(weights).T (+ cat(biases)) reading such a buffer in place and copying others;
the stack_siblings pass rewrites ATen graphs and torch.compile'd models (inference and
training) to use it, and leaves everything else as it was. Skipped where torch is not
installed."""
from __future__ import annotations

import copy
import logging

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch integration tests need torch")

import torch.nn as nn  # noqa: E402
from torch.func import functional_call  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

import evtc  # noqa: E402
import evtc.torch  # noqa: E402
from evtc.torch._op import rows_of_one_buffer  # noqa: E402
from evtc.torch.passes.stack_siblings import Stacked  # noqa: E402

K, NQ, NKV = 40, 48, 16  # grouped-query attention: k and v narrower than q


class Attention(nn.Module):
    """q, k and v projections of one input, combined only after reshapes (no epilogue op)."""

    def __init__(self, bias: bool = False, names=("q_proj", "k_proj", "v_proj")):
        super().__init__()
        self.names = names
        for name, n in zip(names, (NQ, NKV, NKV)):
            setattr(self, name, nn.Linear(K, n, bias=bias))
        self.o_proj = nn.Linear(NQ, K, bias=False)

    def forward(self, x):
        q, k, v = (getattr(self, name)(x) for name in self.names)
        b, s, _ = x.shape
        q = q.view(b, s, 3, NKV)
        mixed = q * k.view(b, s, 1, NKV).sigmoid() + v.view(b, s, 1, NKV)
        return self.o_proj(mixed.reshape(b, s, NQ))


def weights(m, names=("q_proj", "k_proj", "v_proj")):
    return [getattr(m, n).weight for n in names]


def biases(m, names=("q_proj", "k_proj", "v_proj")):
    return [getattr(m, n).bias for n in names]


# --- merge_projections ------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [False, True])
def test_stacks_become_row_blocks_of_one_buffer_with_values_names_and_objects_kept(bias):
    torch.manual_seed(0)
    model = Attention(bias)
    before = copy.deepcopy(model)
    params = dict(model.named_parameters())
    assert not rows_of_one_buffer(weights(model))
    assert evtc.torch.merge_projections(model) == ["Attention: q_proj + k_proj + v_proj"]
    after = dict(model.named_parameters())
    assert list(after) == list(params) and all(after[n] is params[n] for n in params)
    for n, p in before.named_parameters():
        assert after[n].shape == p.shape and torch.equal(after[n], p), n
    w = weights(model)
    assert rows_of_one_buffer(w) and all(t.is_contiguous() for t in w)
    assert w[1].data_ptr() - w[0].data_ptr() == NQ * K * w[0].element_size()
    assert rows_of_one_buffer(biases(model)) == bias
    assert not rows_of_one_buffer([w[1], w[0]])  # in the buffer's order only
    x = torch.randn(2, 3, K)
    assert torch.equal(model(x), before(x))
    # Again: nothing moves.
    ptr = w[0].data_ptr()
    assert evtc.torch.merge_projections(model) == ["Attention: q_proj + k_proj + v_proj"]
    assert weights(model)[0].data_ptr() == ptr


def test_stacked_state_dict_round_trips_exactly_and_adamw_keeps_the_stack():
    torch.manual_seed(0)
    model = Attention(bias=True)
    reference = copy.deepcopy(model)
    evtc.torch.merge_projections(model)
    sd = model.state_dict()
    assert {k: v.shape for k, v in sd.items()} == {k: v.shape for k, v in reference.state_dict().items()}
    for k, v in reference.state_dict().items():
        assert torch.equal(sd[k], v), k
    fresh = Attention(bias=True)
    fresh.load_state_dict(sd)
    for (n, p), (_, q) in zip(fresh.named_parameters(), reference.named_parameters()):
        assert torch.equal(p, q), n
    opt, opt_ref = (torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, reference))
    for _ in range(3):
        x = torch.randn(2, 3, K)
        for m, o in ((model, opt), (reference, opt_ref)):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
    for (n, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=n)
    assert rows_of_one_buffer(weights(model)) and rows_of_one_buffer(biases(model))


def test_named_stacks_must_exist_and_match_and_defaults_skip_with_the_reason(caplog):
    model = Attention(names=("wq", "wk", "wv"))
    assert evtc.torch.merge_projections(model, stacks=[("wq", "wk", "wv")]) == ["Attention: wq + wk + wv"]
    with pytest.raises(evtc.UserError, match=r"no submodule has all of \('a', 'b'\)"):
        evtc.torch.merge_projections(model, stacks=[("a", "b")])
    with pytest.raises(evtc.ArgumentTypeError, match="two or more attribute names"):
        evtc.torch.merge_projections(model, stacks=[("wq",)])
    with pytest.raises(evtc.ArgumentTypeError, match="two or more attribute names"):
        evtc.torch.merge_projections(model, stacks=["wq"])
    mixed = nn.Module()
    mixed.q_proj, mixed.k_proj, mixed.v_proj = nn.Linear(K, 8), nn.Linear(K, 8, bias=False), nn.Linear(K, 8)
    with pytest.raises(evtc.UserError, match="some projections have a bias and others none"):
        evtc.torch.merge_projections(mixed, stacks=[("q_proj", "k_proj", "v_proj")])
    wide = nn.Module()
    wide.q_proj, wide.k_proj, wide.v_proj = nn.Linear(K, 8), nn.Linear(K + 1, 8), nn.Linear(K, 8)
    with caplog.at_level(logging.DEBUG, logger="evtc"):
        assert evtc.torch.merge_projections(wide) == []
    assert "not stacked: the weights have 40 and 41 input features" in caplog.text
    tied = Attention()
    alias = nn.Module()
    alias.register_buffer("view", tied.k_proj.weight.detach()[:2])  # another tensor on k's storage
    holder = nn.ModuleDict({"attn": tied, "alias": alias})
    with caplog.at_level(logging.DEBUG, logger="evtc"):
        assert evtc.torch.merge_projections(holder) == []
    assert "a weight shares its storage with alias.view (tied weights)" in caplog.text
    assert not rows_of_one_buffer(weights(tied))
    # One Parameter under two modules stays one: stacking moves it for both.
    shared = Attention()
    both = nn.ModuleDict({"attn": shared, "other": nn.Linear(K, NKV, bias=False)})
    both["other"].weight = shared.k_proj.weight
    assert evtc.torch.merge_projections(both) == ["attn: q_proj + k_proj + v_proj"]
    assert both["other"].weight is shared.k_proj.weight and rows_of_one_buffer(weights(shared))
    # Pairs named alone leave q/k/v alone.
    assert evtc.torch.merge_projections(Attention(), pairs=[]) == []


# --- the op -----------------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("stacked", [True, False])
def test_stacked_linear_matches_float64_in_place_or_copied(bias, stacked):
    torch.manual_seed(1)
    model = Attention(bias).double()
    if stacked:
        evtc.torch.merge_projections(model)
    a = torch.randn(7, K, dtype=torch.float64)
    w, b = weights(model), biases(model) if bias else []
    y = torch.ops.evtc.stacked_linear(a, w, b)
    expect = torch.cat([a @ t.T + (bb if bias else 0) for t, bb in zip(w, biases(model))], 1)
    assert y.shape == (7, NQ + 2 * NKV)
    torch.testing.assert_close(y, expect, rtol=1e-12, atol=1e-12)
    assert rows_of_one_buffer(w) == stacked


def test_stacked_linear_names_the_operand_that_is_wrong():
    a, w = torch.randn(4, K), [torch.randn(8, K), torch.randn(4, K)]
    with pytest.raises(RuntimeError, match=r"weight 1 has shape \[4, 41\]; it must be \[n, K\] with K = 40"):
        torch.ops.evtc.stacked_linear(a, [w[0], torch.randn(4, K + 1)], [])
    with pytest.raises(RuntimeError, match="operand A has 3 dimensions"):
        torch.ops.evtc.stacked_linear(a.view(2, 2, K), w, [])
    with pytest.raises(RuntimeError, match="1 biases for 2 weights"):
        torch.ops.evtc.stacked_linear(a, w, [torch.randn(8)])
    with pytest.raises(RuntimeError, match=r"bias 1 has shape \[8\]; it must be \[4\]"):
        torch.ops.evtc.stacked_linear(a, w, [torch.randn(8), torch.randn(8)])
    with pytest.raises(RuntimeError, match="no weights were given"):
        torch.ops.evtc.stacked_linear(a, [], [])


# --- the pass ---------------------------------------------------------------------------------


def traced(model, x):
    params = dict(model.named_parameters())
    gm = make_fx(lambda p, x: functional_call(model, p, (x,)), tracing_mode="fake")(params, x)
    return gm, params


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("bias", [False, True])
def test_pass_runs_stacked_siblings_as_one_gemm_with_the_same_results(bias):
    torch.manual_seed(2)
    model = Attention(bias).double()
    evtc.torch.merge_projections(model)
    x = torch.randn(2, 5, K, dtype=torch.float64)
    gm, params = traced(model, x)
    report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False)
    gm.recompile()
    assert targets(gm).count(torch.ops.evtc.stacked_linear.default) == 1
    assert targets(gm).count(torch.ops.aten.addmm.default) == 0
    assert targets(gm).count(torch.ops.aten.mm.default) == 1  # o_proj's, left alone
    assert len(report.stacked) == 1 and isinstance(report.stacked[0], Stacked)
    s = report.stacked[0]
    assert (s.m, s.n, s.k) == (10, NQ + 2 * NKV, K) and len(s.gemms) == 3
    assert report.gemms == 4  # each GEMM once, however many candidates it was refused in
    assert f"as one GEMM of 10x{NQ + 2 * NKV}x{K}" in report.summary()
    torch.testing.assert_close(gm(params, x), model(x), rtol=1e-12, atol=1e-12)


def test_pass_leaves_separate_weights_other_inputs_and_disabled_settings_alone(caplog):
    torch.manual_seed(3)
    model = Attention().double()
    x = torch.randn(2, 5, K, dtype=torch.float64)
    with caplog.at_level(logging.DEBUG, logger="evtc.torch"):
        gm, _ = traced(model, x)
        report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False)
    assert not report.stacked and torch.ops.evtc.stacked_linear.default not in targets(gm)
    assert "their weights are not row blocks of one buffer" in caplog.text
    evtc.torch.merge_projections(model)
    gm, _ = traced(model, x)
    report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False, stack_siblings=False)
    assert not report.stacked and torch.ops.evtc.stacked_linear.default not in targets(gm)

    class TwoInputs(nn.Module):  # stacked weights, but each projection reads its own input
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (nn.Linear(K, 8, bias=False) for _ in range(3))

        def forward(self, x, y):
            return self.q_proj(x) * self.k_proj(y) + self.v_proj(x)

    two = TwoInputs().double()
    evtc.torch.merge_projections(two)
    params = dict(two.named_parameters())
    y = torch.randn(5, K, dtype=torch.float64)
    gm = make_fx(lambda p, x, y: functional_call(two, p, (x, y)), tracing_mode="fake")(params, y, y + 1)
    report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False)
    gm.recompile()
    # q and v read x and lie apart in the buffer (k between them): not one run of rows.
    assert not report.stacked
    torch.testing.assert_close(gm(params, y, y + 1), two(y, y + 1), rtol=1e-12, atol=1e-12)


def test_compiled_training_matches_eager_with_the_stack_kept():
    torch.manual_seed(4)
    model = Attention(bias=True)
    reference = copy.deepcopy(model)
    evtc.torch.merge_projections(model)
    evtc.torch.reports.clear()
    compiled = torch.compile(model, backend="evtc")
    opt, opt_ref = (torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, reference))
    for _ in range(3):
        x = torch.randn(2, 5, K)
        out, expect = compiled(x), reference(x)
        torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-6)
        for o, y in ((opt, out), (opt_ref, expect)):
            o.zero_grad()
            y.square().mean().backward()
        for (n, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=n)
        opt.step()
        opt_ref.step()
    assert rows_of_one_buffer(weights(model))
    assert sum(len(r.stacked) for r in evtc.torch.reports) == 1  # the forward graph's


def test_dynamic_shapes_stack_once_for_every_size():
    torch.manual_seed(5)
    model = Attention(bias=True)
    evtc.torch.merge_projections(model)
    evtc.torch.reports.clear()
    compiled = torch.compile(model, backend="evtc", dynamic=True)
    with torch.no_grad():
        for tokens in (5, 7, 11):
            x = torch.randn(2, tokens, K)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
    stacked = [s for r in evtc.torch.reports for s in r.stacked]
    assert len(stacked) == 1 and not isinstance(stacked[0].m, int)  # one graph, M symbolic


def test_fsdp2_sharded_stacks_are_refused_when_named_and_skipped_by_default(tmp_path, caplog):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        pytest.skip("FSDP2 (fully_shard) is not available")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        model = Attention()
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        with pytest.raises(evtc.UserError, match=r"Attention: q_proj \+ k_proj \+ v_proj: the weights are DTensors "
                                                 r"\(FSDP2 or tensor parallelism\), which cannot be views of one buffer"):
            evtc.torch.merge_projections(model, stacks=[("q_proj", "k_proj", "v_proj")])
        with caplog.at_level(logging.DEBUG, logger="evtc"):
            assert evtc.torch.merge_projections(model) == []
        assert "not stacked: the weights are DTensors" in caplog.text
    finally:
        dist.destroy_process_group()
