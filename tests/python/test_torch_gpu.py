"""evtc.torch on a Hopper GPU: torch.compile with evtc's backend fuses GEMM epilogues (the
tests count the fused GEMMs) and matches eager; negative cases fuse nothing and still match.

All kernels compile up front, in parallel: the session fixture traces every program once
inside evtc.torch.compile_only() (which queues each new kernel's nvcc compile) and waits."""
from __future__ import annotations

import functools
import json
import zlib

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch integration tests need torch")
if not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)):
    pytest.skip("needs a Hopper (sm_90) GPU", allow_module_level=True)

import torch._dynamo  # noqa: E402
import torch._inductor.config as inductor_config  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import evtc  # noqa: E402
import evtc.torch  # noqa: E402
from evtc.torch._op import spec_kernel  # noqa: E402
from torch_cases import CASES, M, N, K, SwigluMlp, randn, x_w  # noqa: E402


def poison_allocator():
    """Fills freed memory of torch's caching allocator with NaN, so that an output the kernel
    fails to write shows up."""
    junk = torch.full((256 << 20,), float("nan"), device="cuda", dtype=torch.float32)
    del junk


def fused_count(reports) -> int:
    return sum(len(r.fused) for r in reports)


# These tests check what fusion computes, so they fuse every legal chain whether or not the
# cost model expects it to pay at their sizes (test_profitability.py tests the decisions), and
# each op waits for its fused kernel (test_background_compile_gpu.py tests the unfused start).
MECHANICS = {"evtc.profitability": False, "evtc.wait_for_compile": True}
EVTC = functools.partial(evtc.torch.backend, options=MECHANICS)


def ran_fused(spec: str) -> bool:
    counts = evtc.torch.path_counts(spec)
    return counts["fused"] > 0 and counts["fallback"] == 0


class Compiled:
    """One program compiled with evtc's backend, traced during warm-up."""

    def __init__(self, case):
        torch.manual_seed(zlib.crc32(case.name.encode()))
        self.case = case
        self.inputs = case.make_inputs()
        self.fn = torch.compile(case.fn, backend="evtc", options=MECHANICS, dynamic=False)
        start = len(evtc.torch.reports)
        with inductor_config.patch(case.inductor_config), evtc.torch.compile_only():
            self.fn(*self.inputs)
        self.reports = evtc.torch.reports[start:]

    def __call__(self):
        with inductor_config.patch(self.case.inductor_config):
            return self.fn(*self.inputs)


def train_mlp(backend, steps=6, seed=0):
    """A few SGD steps of a small bf16 MLP; returns the losses."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(520, 1032), nn.GELU(), nn.Linear(1032, 264), nn.SiLU(),
                          nn.Linear(264, 136)).cuda().to(torch.bfloat16)
    x = randn(1000, 520)
    y = randn(1000, 136)
    compiled = torch.compile(model, backend=backend) if backend else model
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(compiled(x).float(), y.float())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def swiglu_gradients(backend, dtype=torch.bfloat16):
    """The weights' gradients of mean(out²) over a [4, 250, 520] batch (the saved activations
    are 3-D beside the backward's [1000, N] GEMM results), the same weights and input in each
    dtype."""
    torch.manual_seed(7)
    model = SwigluMlp(K, N).cuda().to(torch.bfloat16).to(dtype)  # sizes that are not tile multiples
    x = randn(4, M // 4, K).to(dtype)
    compiled = torch.compile(model, backend=backend) if backend else model
    (compiled(x).float() ** 2).mean().backward()
    return [p.grad for p in model.parameters()]


def bias_gradients(backend, dtype=torch.bfloat16):
    """The parameters' gradients of mean(out²) for a GELU MLP with biases over a [4, 250, 520]
    batch: the backward's data gradient through the second layer computes GELU's derivative in
    its epilogue, and the first layer's bias gradient as that result's column sums."""
    torch.manual_seed(11)
    model = nn.Sequential(nn.Linear(K, N), nn.GELU(approximate="tanh"), nn.Linear(N, 264))
    model = model.cuda().to(torch.bfloat16).to(dtype)  # the same weights in each dtype
    x = randn(4, M // 4, K).to(dtype)
    compiled = torch.compile(model, backend=backend) if backend else model
    (compiled(x).float() ** 2).mean().backward()
    return [p.grad for p in model.parameters()]


@pytest.fixture(scope="session")
def compiled_cases():
    torch._dynamo.reset()
    torch._dynamo.config.cache_size_limit = 64
    cases = {c.name: Compiled(c) for c in CASES}
    # The training test's graphs (forward and backward) and the export test's kernel.
    start = len(evtc.torch.reports)
    with evtc.torch.compile_only():
        train_mlp(EVTC, steps=1)
    cases["training"] = evtc.torch.reports[start:]
    start = len(evtc.torch.reports)
    with evtc.torch.compile_only():
        swiglu_gradients(EVTC)
    cases["swiglu_training"] = evtc.torch.reports[start:]
    start = len(evtc.torch.reports)
    with evtc.torch.compile_only():
        bias_gradients(EVTC)
    cases["bias_gradients"] = evtc.torch.reports[start:]
    spec_kernel(EXPORT_SPEC)[0].compile_async(M, N, K)
    GROUPED_API.compile_async()
    failed = evtc.torch.wait_for_compiles()
    assert not spec_kernel(EXPORT_SPEC)[0]._wait_for_compiles()
    assert not GROUPED_API._wait_for_compiles()
    assert not failed, failed
    return cases


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_compiled_program_fuses_and_matches_eager(compiled_cases, name):
    c = compiled_cases[name]
    summary = "\n".join(r.summary() for r in c.reports)
    if "does not fuse fp8 A and B" in summary or "does not fuse grouped GEMMs" in summary:
        # The target's backend (EVTC_ARCH=sm80: the sm_80 backend) has no fp8 or grouped kernels:
        # it says so, and the program runs unfused, still matching eager below.
        assert fused_count(c.reports) == 0, summary
    else:
        assert fused_count(c.reports) == c.case.fused, summary
    poison_allocator()
    got = c()
    want = c.case.fn(*c.inputs)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert not g.isnan().any()
        scale = w.float().abs().max().item()
        torch.testing.assert_close(g.float(), w.float(), rtol=c.case.rtol, atol=c.case.rtol * scale)
    for r in c.reports:
        for f in r.fused:
            assert ran_fused(f.spec), (f.expr, evtc.torch.path_counts(f.spec))


def test_negative_cases_say_why(compiled_cases):
    reasons = {name: [why for r in compiled_cases[name].reports for _, why in r.refused]
               for name in ("bare_mm", "k_not_multiple_of_8", "fp32_mm", "unsupported_b_strides")}
    assert any("nothing to fuse" in w for w in reasons["bare_mm"]), reasons
    assert any("K=516" in w for w in reasons["k_not_multiple_of_8"]), reasons
    assert any("torch.float32" in w for w in reasons["fp32_mm"]), reasons
    assert any("strides" in w for w in reasons["unsupported_b_strides"]), reasons


def test_escaping_intermediate_becomes_an_extra_output(compiled_cases):
    (fusion,) = [f for r in compiled_cases["escaping_intermediate"].reports for f in r.fused]
    assert len(json.loads(fusion.spec)["outputs"]) == 2, fusion.expr


def test_llama_mlp_merges_gate_and_up_into_one_gated_gemm(compiled_cases):
    (fusion,) = [f for r in compiled_cases["llama_mlp"].reports for f in r.fused]
    assert len(fusion.merged) == 2, fusion
    ir = spec_kernel(fusion.spec)[0].ir
    assert "silu" in ir and "gate " in ir and "up " in ir


def test_training_step_fuses_and_follows_the_same_losses(compiled_cases):
    reports = compiled_cases["training"]
    assert fused_count(reports) >= 2, "\n".join(r.summary() for r in reports)
    # Forward graph: the saved pre-activation is an extra output of a fused op.
    assert any(len(json.loads(f.spec)["outputs"]) > 1 for r in reports for f in r.fused)
    with_evtc = train_mlp(EVTC)
    without = train_mlp(None)
    assert with_evtc[-1] < with_evtc[0]
    for a, b in zip(with_evtc, without):
        assert abs(a - b) <= 2e-2 * abs(b), (with_evtc, without)


def test_swiglu_derivative_fuses_into_the_down_projections_data_gradient(compiled_cases):
    reports = compiled_cases["swiglu_training"]
    summary = "\n".join(r.summary() for r in reports)
    # The backward's down-projection data gradient computes SwiGLU's derivative in its epilogue:
    # silu(g) and its derivative recomputed from the saved g, read with u as the only operands.
    # (The forward's silu(g)·u chain reads u alone.)
    fused = [f for r in reports for f in r.fused]
    derivative = [f for f in fused if "exp(" in f.expr and f.expr.count("[m,n]") == 2 and
                  len(json.loads(f.spec)["outputs"]) == 2]
    assert derivative, summary + "".join("\n" + f.expr for f in fused)
    poison_allocator()
    got = swiglu_gradients(EVTC)
    want = swiglu_gradients(None, torch.float64)
    for g, w in zip(got, want):
        assert not g.isnan().any()
        error = (g.double() - w).norm() / w.norm()
        assert error < 1e-2, (error.item(), summary)


def test_a_bias_gradient_is_summed_in_the_epilogue_of_the_gemm_that_writes_its_input(compiled_cases):
    reports = compiled_cases["bias_gradients"]
    summary = "\n".join(r.summary() for r in reports)
    summed = [f for r in reports for f in r.fused if "col_sum(" in f.expr]
    assert len(summed) == 1 and "tanh" in summed[0].expr, summary
    poison_allocator()
    got = bias_gradients(EVTC)
    assert ran_fused(summed[0].spec), evtc.torch.path_counts(summed[0].spec)
    want = bias_gradients(None, torch.float64)
    eager = bias_gradients(None)
    for g, w, e in zip(got, want, eager):
        assert g.dtype == torch.bfloat16 and g.shape == w.shape and not g.isnan().any()
        error = ((g.double() - w).norm() / w.norm()).item()
        eager_error = ((e.double() - w).norm() / w.norm()).item()
        # bf16 rounding of the gradients themselves is 2^-9 relative: within twice eager's error
        assert error < max(2 * eager_error, 4e-3), (error, eager_error, summary)


def test_rewritten_graph_is_deterministic():
    def fn(x, w, b):
        return F.gelu(x @ w.t() + b)

    inputs = (*x_w(), randn(N))
    hashes = []
    for _ in range(2):
        torch._dynamo.reset()
        start = len(evtc.torch.reports)
        with evtc.torch.compile_only():
            torch.compile(fn, backend=EVTC)(*inputs)
        hashes.append([(f.hash, f.spec) for r in evtc.torch.reports[start:] for f in r.fused])
    assert hashes[0] and hashes[0] == hashes[1]


def test_cuda_graph_capture_and_replay(compiled_cases):
    c = compiled_cases["mm_plus_bias_silu"]
    x, w, b = c.inputs
    static_x = x.clone()
    c.fn(static_x, w, b)  # warm up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = c.fn(static_x, w, b)
    static_x.copy_(randn(M, K))
    graph.replay()
    torch.cuda.synchronize()
    want = c.case.fn(static_x, w, b)
    torch.testing.assert_close(out.float(), want.float(), rtol=2e-2, atol=2e-2 * want.abs().max().item())


def test_dynamic_batch_size_reuses_the_fused_kernel(compiled_cases):
    fn = compiled_cases["silu"].case.fn
    compiled = torch.compile(fn, backend=EVTC, dynamic=True)
    _, w = x_w()
    start = len(evtc.torch.reports)
    for m in (1000, 777, 64):
        x = randn(m, K)
        poison_allocator()
        got = compiled(x, w)
        want = fn(x, w)
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2 * want.abs().max().item())
    assert fused_count(evtc.torch.reports[start:]) >= 1


def test_runtime_shape_outside_the_legality_guard_falls_back(compiled_cases):
    """The op checks every call as the legality pass would: K=516 (rows not 16-byte aligned)
    runs the unfused path, K=520 the fused kernel, both right."""
    paths = []
    for k in (520, 516):
        x, w = x_w(k=k)
        b = randn(N)
        poison_allocator()
        before = evtc.torch.path_counts(EXPORT_SPEC)
        (got,) = torch.ops.evtc.gemm_epilogue(EXPORT_SPEC, x, w.t(), [b])
        after = evtc.torch.path_counts(EXPORT_SPEC)
        paths += [p for p in ("fused", "fallback") if after[p] > before[p]]
        want = F.silu(x @ w.t() + b)
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2 * want.abs().max().item())
    assert paths == ["fused", "fallback"], paths


def test_dynamic_k_compiles_and_stays_right(compiled_cases):
    """A program traced with a symbolic K: the pass cannot check K at trace time, and every
    size still computes the right result."""

    def fn(x, w):  # a code object of its own, so that torch.compile traces it here
        return F.gelu(x @ w.t(), approximate="tanh")

    compiled = torch.compile(fn, backend=EVTC, dynamic=True)
    for k in (520, 516):
        x, w = x_w(k=k)
        got = compiled(x, w)
        want = fn(x, w)
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2 * want.abs().max().item())


EXPORT_SPEC = evtc.torch.make_spec("input x0[n]: bf16\nout D: bf16 = silu(acc + x0)\n",
                                   {"a_dtype": "bf16", "b_dtype": "bf16", "a_layout": "row", "b_layout": "col"},
                                   [("x0", "row")], ["D"])


class FusedLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(randn(N, K, scale=K ** -0.5))
        self.bias = nn.Parameter(randn(N))

    def forward(self, x):
        (y,) = torch.ops.evtc.gemm_epilogue(EXPORT_SPEC, x, self.weight.t(), [self.bias])
        return y


def test_custom_op_exports_and_runs(compiled_cases):
    mod = FusedLinear()
    x = randn(M, K)
    with torch.no_grad():
        ep = torch.export.export(mod, (x,))
        assert any(n.target is torch.ops.evtc.gemm_epilogue.default for n in ep.graph.nodes)
        got = ep.module()(x)
        want = F.silu(x @ mod.weight.t() + mod.bias)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2 * want.abs().max().item())


def test_kernel_call_runs_on_the_current_torch_stream(compiled_cases):
    kernel = spec_kernel(EXPORT_SPEC)[0]
    x, w = x_w()
    b = randn(N)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = kernel(x, w.t(), x0=b)
    s.synchronize()
    assert kernel.last_path == "fused"
    want = F.silu(x @ w.t() + b)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2 * want.abs().max().item())


def test_other_architectures_run_the_unfused_path_built_for_them(monkeypatch):
    """arch= an architecture without fused kernels: every call runs cuBLASLt + the plain
    epilogue compiled for it (sm_75 code runs on Hopper through its PTX), with the right result."""
    monkeypatch.delenv("EVTC_ARCH", raising=False)
    kernel = evtc.compile("out D: bf16 = silu(acc + bias[n]) * 1.5", arch="sm75")
    x, w = x_w()
    b = randn(N)
    poison_allocator()
    got = kernel(x, w.t(), bias=b)
    assert kernel.last_path == "fallback"
    assert not got.isnan().any(), "unwritten elements"
    want = F.silu(x.double() @ w.double().t() + b.double()) * 1.5
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


def test_the_sm80_backend_fuses_and_runs_on_hopper(monkeypatch):
    """arch="sm80": the sm_80 backend's CUTLASS 2.x kernel (sm_80 code and compute_80 PTX, which
    the driver compiles for this GPU) runs fused, with a gated output and a row reduction."""
    monkeypatch.delenv("EVTC_ARCH", raising=False)
    kernel = evtc.compile("h = acc + bias[n]\nout y: bf16 = swiglu(h)\nout r: f32 = row_sum(h)", arch="sm80",
                          wait_for_compile=True)
    x, w = x_w()
    b = randn(N)
    poison_allocator()
    got = kernel(x, w.t(), bias=b)
    assert kernel.last_path == "fused"
    h = x.double() @ w.double().t() + b.double()
    want_y = F.silu(h[:, 0::2]) * h[:, 1::2]
    torch.testing.assert_close(got["y"].double(), want_y, rtol=2e-2, atol=2e-2 * want_y.abs().max().item())
    torch.testing.assert_close(got["r"].double(), h.sum(1), rtol=1e-3, atol=1e-3 * h.abs().sum(1).max().item())


def test_a_blackwell_target_on_hopper_says_why_it_cannot_run(monkeypatch):
    """arch="sm100" on a Hopper GPU: the sm_100a backend fuses the epilogue and its kernel
    compiles, but neither it nor the unfused path's sm_100 code runs on sm_90: the error says so
    (the fused kernel's failed launch falls back first; the fallback's names the mismatch)."""
    monkeypatch.delenv("EVTC_ARCH", raising=False)
    kernel = evtc.compile("input r[m,n]: bf16\nout D: bf16 = silu(acc + bias[n]) + r[m,n]", arch="sm100")
    assert kernel.fallback_reason(M, N, K) == ""  # the sm_100a backend fuses this epilogue
    x, w = x_w()
    with pytest.raises(evtc.EvtcRuntimeError, match=r"built for sm_100 and this GPU is sm_90, which cannot run them"):
        kernel(x, w.t(), bias=randn(N), r=randn(M, N))
        torch.cuda.synchronize()


def test_kernel_errors_name_the_operand(compiled_cases):
    kernel = spec_kernel(EXPORT_SPEC)[0]
    x, w = x_w()
    with pytest.raises(evtc.UserError, match="operand 'x0'.* was not given"):
        kernel(x, w.t())
    with pytest.raises(evtc.UserError, match="'x0'.*expected a vector of 1032 elements"):
        kernel(x, w.t(), x0=randn(N + 8))
    with pytest.raises(evtc.UserError, match="operand A is f32"):
        kernel(x.float(), w.t(), x0=randn(N))


# evtc.grouped called directly: per-group bias, a gated output, ragged groups with empty ones.
GROUPED_API = evtc.grouped("out y: bf16 = gptoss_swiglu(acc + bias[n], alpha=1.5, limit=3)")


def grouped_problem(rows, n=264, k=136):
    g = len(rows)
    x = randn(sum(rows), k)
    w = randn(g, n, k, scale=k ** -0.5)  # stacked nn.Linear weights, (gate, up) interleaved
    bias = randn(g, n)
    offs = torch.tensor(rows, device="cuda").cumsum(0).to(torch.int32)
    return x, w, bias, offs


def check_grouped_api(y, rows, x, w, bias):
    n = w.shape[1]
    assert y.shape == (sum(rows), n // 2) and y.dtype == torch.bfloat16
    assert not y.isnan().any(), "unwritten elements"
    start = 0
    for i, r in enumerate(rows):
        if r == 0:
            continue  # an empty group writes nothing (and starts where the next one does)
        h = x[start:start + r].double() @ w[i].double().t() + bias[i].double()
        gate, up = h[:, 0::2].clamp(max=3), h[:, 1::2].clamp(-3, 3)
        want = gate * torch.sigmoid(1.5 * gate) * (up + 1)
        got = y[start:start + r].double()
        assert not got.isnan().any(), f"group {i}: unwritten rows"
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * max(want.abs().max().item(), 1e-3))
        start += r


def test_grouped_kernel_matches_a_float64_reference_per_group(compiled_cases):
    rows = [0, 77, 300, 1, 0, 130]
    x, w, bias, offs = grouped_problem(rows)
    poison_allocator()
    y = GROUPED_API(x, w.transpose(1, 2), offs, bias=bias)
    check_grouped_api(y, rows, x, w, bias)


def test_grouped_calls_back_to_back_share_the_streams_workspace(compiled_cases):
    # The fused kernel keeps one workspace per stream (group tables and CUTLASS's): calls
    # queued without a synchronisation between them, the second with more groups (a larger
    # workspace) and the third with the first's again, each read their own tables.
    problems = [[0, 77, 300, 1, 0, 130], [5, 0, 64, 200, 31, 9, 120, 2, 40], [0, 77, 300, 1, 0, 130]]
    made = [grouped_problem(rows) for rows in problems]
    poison_allocator()
    ys = [GROUPED_API(x, w.transpose(1, 2), offs, bias=bias) for x, w, bias, offs in made]
    for y, rows, (x, w, bias, _) in zip(ys, problems, made):
        check_grouped_api(y, rows, x, w, bias)


def test_grouped_kernel_errors_name_the_operand(compiled_cases):
    x = randn(64, 136)
    w = randn(2, 264, 136)
    offs = torch.tensor([30, 64], device="cuda", dtype=torch.int32)
    with pytest.raises(evtc.UserError, match="operand 'bias'.*was not given"):
        GROUPED_API(x, w.transpose(1, 2), offs)
    with pytest.raises(evtc.UserError, match="offsets has 1 entries but the weights have 2 groups"):
        GROUPED_API(x, w.transpose(1, 2), offs[:1], bias=randn(264))
    with pytest.raises(evtc.UserError, match="weights must be"):
        GROUPED_API(x, w.transpose(1, 2).contiguous(), offs, bias=randn(264))
    with pytest.raises(evtc.UserError, match="offsets must be a contiguous 1-D int32 CUDA array"):
        GROUPED_API(x, w.transpose(1, 2), offs.long(), bias=randn(264))


class Gpt2Stream(nn.Module):
    """GPT-2's residual stream around its second LayerNorm: y = x + c_proj(a), then
    y + mlp_proj(gelu(c_fc(ln_2(y))))."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.c_proj, self.ln_2 = nn.Linear(width, width), nn.LayerNorm(width)
        self.c_fc, self.mlp_proj = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x, a):
        y = x + self.c_proj(a)
        return y + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(y)), approximate="tanh"))


def gpt2_stream(backend, options=None, dtype=torch.bfloat16):
    """The stream's output and its parameters' gradients of mean(out²), over [4, 250, 776]
    (sizes that are not tile multiples), the same weights and inputs in each dtype."""
    torch.manual_seed(13)
    model = Gpt2Stream(776, 1544).cuda().to(torch.bfloat16).to(dtype)
    x, a = randn(4, 250, 776).to(dtype), randn(4, 250, 776).to(dtype)
    compiled = torch.compile(model, backend=backend, options=options, dynamic=False) if backend else model
    out = compiled(x, a)
    (out.float() ** 2).mean().backward()
    return [out.detach()] + [p.grad for p in model.parameters()]


def test_f32_residual_sums_give_plain_compiles_errors():
    """evtc.residual_sums "f32": c_proj's fused op writes x + c_proj(a) in f32 for ln_2 and
    mlp_proj's residual add, which plain compile computes from the two terms and never rounds.
    Forward and backward, each result's error against float64 is plain compile's (the fused
    kernels sum their products in another order: within 5 %)."""
    torch._dynamo.reset()
    start = len(evtc.torch.reports)
    poison_allocator()
    got = gpt2_stream("evtc", {**MECHANICS, "evtc.residual_sums": "f32"})
    reports = evtc.torch.reports[start:]
    summary = "\n".join(r.summary() for r in reports)
    wide = [f for r in reports for f in r.fused if ": f32 = " in f.expr.split("\nout ", 1)[-1]]
    assert wide and any(f.outputs == ["add"] for f in wide), summary + "".join("\n" + f.expr for r in reports
                                                                               for f in r.fused)
    assert any("[m,n]: f32" in f.expr for r in reports for f in r.fused), summary  # read by the later add
    torch._dynamo.reset()
    plain = gpt2_stream("inductor")
    want = gpt2_stream(None, dtype=torch.float64)
    names = ["output"] + [n for n, _ in Gpt2Stream(8, 8).named_parameters()]
    for name, g, p, w in zip(names, got, plain, want):
        assert g.dtype == torch.bfloat16 and not g.isnan().any(), name
        error = ((g.double() - w).norm() / w.norm()).item()
        plain_error = ((p.double() - w).norm() / w.norm()).item()
        assert error <= 1.05 * plain_error, (name, error, plain_error, summary)
