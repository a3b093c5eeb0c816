"""Merged gate/up GEMMs on a Hopper GPU: results against a float64 reference (poisoned outputs),
with weights that change in place (w.add_(), an optimizer step), under freezing, and in CUDA
graphs (Inductor's "reduce-overhead" CUDA-graph trees)."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch integration tests need torch")
if not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)):
    pytest.skip("needs a Hopper (sm_90) GPU", allow_module_level=True)

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import evtc.torch  # noqa: E402
from evtc.torch._op import GEMM_EPILOGUE_MERGED  # noqa: E402
from test_torch_gpu import poison_allocator  # noqa: E402
from torch_cases import K, M, N, randn  # noqa: E402

MECHANICS = {"evtc.profitability": False, "evtc.wait_for_compile": True}


@pytest.fixture(autouse=True)
def fresh_compiles():
    """Each test compiles its own graphs (and CUDA-graph trees) from scratch."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class GatedMLP(nn.Module):
    """LLaMA's gate and up projections (with biases, to cover their merge too)."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(K, N, device="cuda", dtype=torch.bfloat16)
        self.up = nn.Linear(K, N, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(randn(*p.shape, scale=K ** -0.5))

    def forward(self, x):
        return F.silu(self.gate(x)) * self.up(x)


def reference(mlp: GatedMLP, x: torch.Tensor) -> torch.Tensor:
    """float64, rounding h to bf16 where eager does."""
    d = {n: p.detach().double() for n, p in mlp.named_parameters()}
    g = (x.double() @ d["gate.weight"].t() + d["gate.bias"]).to(torch.bfloat16).double()
    u = (x.double() @ d["up.weight"].t() + d["up.bias"]).to(torch.bfloat16).double()
    return F.silu(g) * u


def check(got: torch.Tensor, want: torch.Tensor) -> None:
    assert not got.isnan().any(), "unwritten elements"
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


def new_reports(start: int):
    return evtc.torch.reports[start:]


def merged_fusions(reports):
    return [f for r in reports for f in r.fused if f.merged]


def test_merged_weights_follow_in_place_updates():
    mlp = GatedMLP()
    compiled = torch.compile(mlp, backend="evtc", options=MECHANICS)
    start = len(evtc.torch.reports)
    x = randn(M, K)
    with torch.no_grad():
        compiled(x)
        (fusion,) = merged_fusions(new_reports(start))
        for step in range(3):
            poison_allocator()
            check(compiled(x), reference(mlp, x))
            mlp.gate.weight.add_(randn(N, K, scale=0.05))  # version counters move
            mlp.up.bias.mul_(1.5)
    assert evtc.torch.path_counts(fusion.spec)["fused"] >= 3
    assert evtc.torch.merged_weights_bytes() > 0


def test_each_layer_keeps_its_own_merged_weights():
    """Layers of one architecture merge with the same recipes: each keeps its own copy, so a
    forward through several layers builds them once (not once per layer per call)."""
    layers = nn.Sequential(GatedMLP(), nn.Linear(N, K, device="cuda", dtype=torch.bfloat16), GatedMLP())
    compiled = torch.compile(layers, backend="evtc", options=MECHANICS)
    evtc.torch.clear_merged_weights()
    x = randn(M, K)
    with torch.no_grad():
        compiled(x)
        held = evtc.torch.merged_weights_bytes()
        one_layer = 2 * N * K * 2 + 2 * N * 2  # bf16 gate and up weights, and biases
        assert held == 2 * one_layer
        poison_allocator()
        got = compiled(x)
        assert evtc.torch.merged_weights_bytes() == held
    h = reference(layers[0], x).to(torch.bfloat16).double()
    h = F.linear(h, layers[1].weight.detach().double(), layers[1].bias.detach().double()).to(torch.bfloat16)
    check(got, reference(layers[2], h))


def test_merged_weights_follow_an_optimizer_step():
    mlp = GatedMLP()
    compiled = torch.compile(mlp, backend="evtc", options=MECHANICS)
    opt = torch.optim.SGD(mlp.parameters(), lr=1.0)
    x = randn(M, K)
    for _ in range(2):
        with torch.no_grad():
            poison_allocator()
            check(compiled(x), reference(mlp, x))
        opt.zero_grad()
        mlp(x).float().square().mean().backward()  # eager training step on the same weights
        opt.step()


def test_freezing_interleaves_the_weights_once_at_compile_time():
    # Dynamo decides at trace time whether parameters may be frozen, from Inductor's global
    # setting (options={"freezing": True} reaches the compiler only after tracing).
    mlp = GatedMLP()
    compiled = torch.compile(mlp, backend="evtc", options=MECHANICS)
    x = randn(M, K)
    start = len(evtc.torch.reports)
    with torch.no_grad(), torch._inductor.config.patch(freezing=True):
        compiled(x)
        (fusion,) = merged_fusions(new_reports(start))
        assert "merged" not in json.loads(fusion.spec)  # the interleaved weight and bias are constants
        poison_allocator()
        check(compiled(x), reference(mlp, x))


@pytest.mark.parametrize("options, freezing, merges", [
    ({"triton.cudagraphs": True}, True, True),
    ({"triton.cudagraphs": True}, False, False),  # refused: replays could not follow weight updates
])
def test_cuda_graph_trees_replay_merged_gemms(options, freezing, merges):
    mlp = GatedMLP()
    compiled = torch.compile(mlp, backend="evtc", options={**MECHANICS, **options})
    start = len(evtc.torch.reports)
    with torch.no_grad(), torch._inductor.config.patch(freezing=freezing):
        for _ in range(4):  # warm-up, recording, then replays with new inputs
            x = randn(M, K)
            torch.compiler.cudagraph_mark_step_begin()
            got = compiled(x)
            check(got.clone(), reference(mlp, x))
    reports = new_reports(start)
    assert bool(merged_fusions(reports)) == merges, "\n".join(r.summary() for r in reports)
    if not merges:
        assert any("CUDA graphs" in why for r in reports for _, why in r.refused)


def test_projections_merged_in_place_run_under_cuda_graphs_and_follow_updates():
    """merge_projections: the merged GEMM reads the weights' own buffer (no copy), so it merges
    under CUDA graphs without freezing, and replays see in-place updates of the weights."""
    mlp = GatedMLP()
    assert evtc.torch.merge_projections(mlp) == ["GatedMLP: gate + up"]
    evtc.torch.clear_merged_weights()
    compiled = torch.compile(mlp, backend="evtc", options={**MECHANICS, "triton.cudagraphs": True})
    start = len(evtc.torch.reports)
    with torch.no_grad():
        for step in range(6):  # warm-up, recording, then replays; the weights change from step 3
            if step >= 3:
                mlp.gate.weight.mul_(0.5)
                mlp.up.bias.add_(0.25)
            x = randn(M, K)
            torch.compiler.cudagraph_mark_step_begin()
            got = compiled(x)
            check(got.clone(), reference(mlp, x))
    reports = new_reports(start)
    assert merged_fusions(reports), "\n".join(r.summary() for r in reports)
    assert evtc.torch.merged_weights_bytes() == 0  # no interleaved copy was made


def test_merged_op_reads_interleaved_views_in_place():
    recipe = [{"source": 0, "views": [["t"]]}, {"source": 1, "views": [["t"]]}]
    spec = evtc.torch.make_spec("h = acc\nout D: bf16 = silu(gate(h)) * up(h)\n", {}, [], ["D"],
                                {"b": recipe, "rows": {}})
    x, buffer = randn(M, K), randn(2 * N, K, scale=K ** -0.5)
    wg, wu = buffer[0::2], buffer[1::2]  # gate feature j at row 2j, up j at 2j + 1
    evtc.torch.clear_merged_weights()
    poison_allocator()
    (d,) = GEMM_EPILOGUE_MERGED(spec, x, [wg, wu], [])
    g = (x.double() @ wg.double().t()).to(torch.bfloat16).double()
    u = (x.double() @ wu.double().t()).to(torch.bfloat16).double()
    check(d, F.silu(g) * u)
    assert evtc.torch.merged_weights_bytes() == 0
    # Views of one buffer that are not its even and odd rows are copied, as separate tensors are.
    (d,) = GEMM_EPILOGUE_MERGED(spec, x, [buffer[:N], buffer[N:]], [])
    g = (x.double() @ buffer[:N].double().t()).to(torch.bfloat16).double()
    u = (x.double() @ buffer[N:].double().t()).to(torch.bfloat16).double()
    check(d, F.silu(g) * u)
    assert evtc.torch.merged_weights_bytes() > 0


def test_reduce_overhead_mode_through_the_registered_backend():
    def fn(x, w, b):
        return F.gelu(x @ w.t() + b, approximate="tanh")

    compiled = torch.compile(fn, backend="evtc", mode="reduce-overhead")
    w, b = randn(N, K, scale=K ** -0.5), randn(N)
    for _ in range(4):
        x = randn(M, K)
        torch.compiler.cudagraph_mark_step_begin()
        got = compiled(x, w, b).clone()
        want = F.gelu(x.double() @ w.double().t() + b.double(), approximate="tanh")
        check(got, want)


def test_merged_op_called_directly_checks_its_operands():
    recipe = [{"source": 0, "views": [["t"]]}, {"source": 1, "views": [["t"]]}]
    spec = evtc.torch.make_spec("h = acc\nout D: bf16 = silu(gate(h)) * up(h)\n", {}, [], ["D"],
                                {"b": recipe, "rows": {}})
    x, wg, wu = randn(M, K), randn(N, K, scale=K ** -0.5), randn(N, K, scale=K ** -0.5)
    with pytest.raises(RuntimeError, match="gate and up halves have shapes"):
        GEMM_EPILOGUE_MERGED(spec, x, [wg, randn(N + 8, K)], [])
    poison_allocator()
    (d,) = GEMM_EPILOGUE_MERGED(spec, x, [wg, wu], [])
    g = (x.double() @ wg.double().t()).to(torch.bfloat16).double()
    u = (x.double() @ wu.double().t()).to(torch.bfloat16).double()
    check(d, F.silu(g) * u)
