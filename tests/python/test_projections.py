"""evtc.torch.merge_projections on the CPU: a model's gate and up projections become the even
and odd rows of one buffer with nothing else changed (values, names, shapes, Parameter
objects, eager results, state_dict, optimizer steps), and the merge_gated pass then merges
them under CUDA graphs on traced (fake CUDA) values. Skipped where torch is not installed."""
from __future__ import annotations

import copy
import functools

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch integration tests need torch")

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

import evtc  # noqa: E402
import evtc.torch  # noqa: E402
from evtc._gated import interleaved_in_place  # noqa: E402
from torch_cases import SwigluMlp  # noqa: E402

HIDDEN, FFN = 24, 40


Mlp = functools.partial(SwigluMlp, HIDDEN, FFN)


class Experts(nn.Module):
    """Stacked expert weights (E, I, K), features along the second-to-last dimension."""

    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(3, FFN, HIDDEN))
        self.w3 = nn.Parameter(torch.randn(3, FFN, HIDDEN))

    def forward(self, x):
        return F.silu(torch.einsum("ek,eik->ei", x, self.w1)) * torch.einsum("ek,eik->ei", x, self.w3)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Mlp(), Mlp(bias=True)])
        self.experts = Experts()
        # Not a pair: a router "gate" with no "up", and a mismatched gate/up pair.
        self.router = nn.Module()
        self.router.gate = nn.Linear(HIDDEN, 4)
        self.odd = nn.Module()
        self.odd.gate, self.odd.up = nn.Linear(HIDDEN, 8), nn.Linear(HIDDEN, 6)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x.sum() + self.experts(x[:3]).sum()


def merged_model():
    torch.manual_seed(0)
    model = Model()
    before = copy.deepcopy(model)
    names = evtc.torch.merge_projections(model) + evtc.torch.merge_projections(model, pairs=[("w1", "w3")])
    return model, before, names


def test_pairs_become_views_of_one_buffer_with_values_names_and_objects_kept():
    torch.manual_seed(0)
    model = Model()
    before = copy.deepcopy(model)
    params = dict(model.named_parameters())
    names = evtc.torch.merge_projections(model)
    assert names == ["layers.0: gate_proj + up_proj", "layers.1: gate_proj + up_proj"]
    assert not interleaved_in_place(model.experts.w1, model.experts.w3, -2)  # Parameters only when named
    names += evtc.torch.merge_projections(model, pairs=[("w1", "w3")])
    assert names[-1] == "experts: w1 + w3"
    after = dict(model.named_parameters())
    assert list(after) == list(params) and all(after[n] is params[n] for n in params)  # same objects
    for n, p in before.named_parameters():
        assert after[n].shape == p.shape and torch.equal(after[n], p), n
    for layer in model.layers:
        g, u = layer.gate_proj.weight, layer.up_proj.weight
        assert interleaved_in_place(g, u, -2)
        assert g.stride() == (2 * HIDDEN, 1) and u.data_ptr() - g.data_ptr() == HIDDEN * g.element_size()
    assert interleaved_in_place(model.layers[1].gate_proj.bias, model.layers[1].up_proj.bias, -1)
    assert interleaved_in_place(model.experts.w1, model.experts.w3, -2)
    assert not interleaved_in_place(model.odd.gate.weight[:6], model.odd.up.weight, -2)  # untouched
    x = torch.randn(5, HIDDEN)
    assert torch.equal(model(x), before(x))


def test_merging_again_changes_nothing():
    model, _, names = merged_model()
    ptr = model.layers[0].gate_proj.weight.data_ptr()
    assert evtc.torch.merge_projections(model) + evtc.torch.merge_projections(model, pairs=[("w1", "w3")]) == names
    assert model.layers[0].gate_proj.weight.data_ptr() == ptr


def test_state_dict_round_trips_and_loads_into_the_buffer():
    model, before, _ = merged_model()
    sd = model.state_dict()
    assert {k: v.shape for k, v in sd.items()} == {k: v.shape for k, v in before.state_dict().items()}
    fresh = Model()  # other values
    fresh.load_state_dict(sd)
    for (n, p), (_, q) in zip(fresh.named_parameters(), before.named_parameters()):
        assert torch.equal(p, q), n
    # Loading into a merged model writes the values into its buffer; the views stay.
    target, _, _ = merged_model()
    torch.manual_seed(5)
    other = Model()
    target.load_state_dict(other.state_dict())
    g, u = target.layers[0].gate_proj.weight, target.layers[0].up_proj.weight
    assert interleaved_in_place(g, u, -2) and torch.equal(g, other.layers[0].gate_proj.weight)


@pytest.mark.parametrize("foreach", [False, True])
def test_adamw_steps_match_the_unmerged_model(foreach):
    model, before, _ = merged_model()
    # An optimizer made before the merge keeps working: the Parameter objects are the same.
    torch.manual_seed(1)
    early = Model()
    opt_early = torch.optim.AdamW(early.parameters(), lr=1e-2, foreach=foreach)
    evtc.torch.merge_projections(early, pairs=[("gate_proj", "up_proj"), ("w1", "w3")])
    reference = copy.deepcopy(early)  # deepcopy gives each parameter its own storage again
    assert not interleaved_in_place(reference.layers[0].gate_proj.weight, reference.layers[0].up_proj.weight, -2)
    opt_ref = torch.optim.AdamW(reference.parameters(), lr=1e-2, foreach=foreach)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=foreach)
    opt_before = torch.optim.AdamW(before.parameters(), lr=1e-2, foreach=foreach)
    for step in range(3):
        x = torch.randn(5, HIDDEN)
        for m, o in ((model, opt), (before, opt_before), (early, opt_early), (reference, opt_ref)):
            o.zero_grad()
            m(x).backward()
            o.step()
    for (n, p), (_, q) in zip(model.named_parameters(), before.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=n)
    for (n, p), (_, q) in zip(early.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=n)
    assert interleaved_in_place(model.layers[0].gate_proj.weight, model.layers[0].up_proj.weight, -2)
    assert interleaved_in_place(early.layers[0].gate_proj.weight, early.layers[0].up_proj.weight, -2)


def test_named_pairs_must_exist_and_match():
    model = Model()
    with pytest.raises(evtc.UserError, match=r"odd: gate \+ up: the weights have shapes \[8, 24\] and \[6, 24\]"):
        evtc.torch.merge_projections(model, pairs=[("gate", "up")])
    with pytest.raises(evtc.UserError, match=r"no submodule has all of \('fc_g', 'fc_u'\)"):
        evtc.torch.merge_projections(model, pairs=[("gate_proj", "up_proj"), ("fc_g", "fc_u")])
    with pytest.raises(evtc.ArgumentTypeError, match="two attribute names"):
        evtc.torch.merge_projections(model, pairs=[("gate_proj",)])
    mixed = nn.Module()
    mixed.gate, mixed.up = nn.Linear(HIDDEN, 8, bias=True), nn.Linear(HIDDEN, 8, bias=False)
    with pytest.raises(evtc.UserError, match="one projection has a bias and the other has none"):
        evtc.torch.merge_projections(mixed, pairs=[("gate", "up")])
    assert evtc.torch.merge_projections(mixed) == []  # by default, skipped


def test_fake_views_of_one_buffer_are_recognised():
    with FakeTensorMode():
        buffer = torch.empty(2 * FFN, HIDDEN, device="cuda", dtype=torch.bfloat16)
        other = torch.empty(FFN, HIDDEN, device="cuda", dtype=torch.bfloat16)
        assert interleaved_in_place(buffer[0::2], buffer[1::2], -2)
        assert not interleaved_in_place(buffer[1::2], buffer[0::2], -2)  # up before gate
        assert not interleaved_in_place(buffer[:FFN], buffer[FFN:], -2)  # stacked, not interleaved
        assert not interleaved_in_place(buffer[0::2], other, -2)  # another buffer


def gated(x, wg, wu):
    return F.silu(x @ wg.t()) * (x @ wu.t())


def fuse_under_cuda_graphs(weights):
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(64, HIDDEN, device="cuda", dtype=torch.bfloat16)
        gm = make_fx(gated)(x, *weights())
    with torch._inductor.config.patch({"triton.cudagraphs": True}):
        return evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False, profitability=False)


def test_merge_gated_merges_under_cuda_graphs_only_weights_merged_in_place():
    def views():
        buffer = torch.empty(2 * FFN, HIDDEN, device="cuda", dtype=torch.bfloat16)
        return buffer[0::2], buffer[1::2]

    def separate():
        return (torch.empty(FFN, HIDDEN, device="cuda", dtype=torch.bfloat16),
                torch.empty(FFN, HIDDEN, device="cuda", dtype=torch.bfloat16))

    report = fuse_under_cuda_graphs(views)
    assert [f for f in report.fused if f.merged], report.summary()
    report = fuse_under_cuda_graphs(separate)
    assert not [f for f in report.fused if f.merged]
    assert any("merge_projections" in why for _, why in report.refused), report.summary()


def weight_grad_strides(model, backend):
    """The strides of each new weight gradient as autograd hands it to accumulation."""
    seen = {}

    def record(name):
        def hook(grad):
            seen.setdefault(name, grad.stride())
        return hook

    for name, p in model.named_parameters():
        if p.dim() == 2:
            p.register_hook(record(name))
    torch._dynamo.reset()
    run = torch.compile(model, backend=backend) if backend else model
    run(torch.randn(5, HIDDEN)).sum().backward()
    return seen


@pytest.mark.parametrize("bias", [False, True])
def test_compiled_backward_writes_merged_weight_gradients_row_major(bias):
    # Autograd's mm backward gives a strided weight view its gradient column-major, which
    # accumulation then copies; evtc's joint-graph pass has the GEMM write it row-major.
    torch.manual_seed(0)
    mlp = Mlp(bias=bias)
    evtc.torch.merge_projections(mlp)
    eager = weight_grad_strides(mlp, None)
    assert eager["gate_proj.weight"] == (1, FFN)  # what the pass is for
    mlp.zero_grad(set_to_none=True)
    compiled = weight_grad_strides(mlp, "evtc")
    assert compiled["gate_proj.weight"] == (HIDDEN, 1) and compiled["up_proj.weight"] == (HIDDEN, 1)
    assert compiled["down_proj.weight"] == eager["down_proj.weight"]  # a dense weight keeps its layout


def test_weight_grad_pass_gradients_equal_autograds():
    torch.manual_seed(0)
    mlp = Mlp(bias=True)
    evtc.torch.merge_projections(mlp)
    ref = copy.deepcopy(mlp)
    evtc.torch.merge_projections(ref)
    x = torch.randn(7, HIDDEN)
    ref(x).square().sum().backward()
    torch._dynamo.reset()
    torch.compile(mlp, backend="evtc")(x).square().sum().backward()
    for (n, p), (_, q) in zip(mlp.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=n)


@pytest.fixture
def process_group(tmp_path):
    """A one-process gloo group on the CPU."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_ddp_keeps_the_views_and_trains_like_the_unmerged_model(process_group):
    torch.manual_seed(0)
    model = Mlp()
    before = copy.deepcopy(model)
    evtc.torch.merge_projections(model)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt, opt_before = (torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (ddp, before))
    for _ in range(3):
        x = torch.randn(5, HIDDEN)
        for m, o in ((ddp, opt), (before, opt_before)):
            o.zero_grad()
            m(x).square().sum().backward()
            o.step()
    assert interleaved_in_place(model.gate_proj.weight, model.up_proj.weight, -2)
    for (n, p), (_, q) in zip(model.named_parameters(), before.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=n)


def test_fsdp2_sharded_weights_are_refused_with_the_reason(process_group):
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        pytest.skip("FSDP2 (fully_shard) is not available")
    model = Mlp()
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
    with pytest.raises(evtc.UserError, match="are DTensors .FSDP2 or tensor parallelism."):
        evtc.torch.merge_projections(model)


def test_tied_or_identical_weights_are_left_alone_with_the_reason():
    # Moving a weight tied to another tensor into a new buffer would untie them: nothing lost.
    model = Mlp()
    tied = nn.Linear(HIDDEN, FFN, bias=False)
    tied.weight = model.gate_proj.weight  # the same Parameter under another module
    holder = nn.ModuleDict({"mlp": model, "tied": tied})
    assert evtc.torch.merge_projections(holder) == ["mlp: gate_proj + up_proj"]  # one object, two names: fine
    assert tied.weight is model.gate_proj.weight

    other = Mlp()
    alias = nn.Module()
    alias.register_buffer("view", other.up_proj.weight.detach()[:2])  # another tensor on up's storage
    holder = nn.ModuleDict({"mlp": other, "alias": alias})
    assert evtc.torch.merge_projections(holder) == []
    with pytest.raises(evtc.UserError, match=r"mlp: gate_proj \+ up_proj: a weight shares its storage with "
                                             r"alias.view \(tied weights\)"):
        evtc.torch.merge_projections(holder, pairs=[("gate_proj", "up_proj")])
    assert not interleaved_in_place(other.gate_proj.weight, other.up_proj.weight, -2)

    same = nn.Module()
    same.gate = nn.Linear(HIDDEN, FFN, bias=False)
    same.up = same.gate
    with pytest.raises(evtc.UserError, match="two of the weights are the same tensor"):
        evtc.torch.merge_projections(same, pairs=[("gate", "up")])
