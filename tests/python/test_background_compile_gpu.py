"""While a fused kernel compiles, its op runs unfused (cuBLASLt + the plain epilogue) and the
model keeps running; the op switches to the fused kernel once it is ready, with the same results.
Each test fuses an epilogue with a constant of this run's own, so its kernel is compiled cold."""
from __future__ import annotations

import os
import time

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch integration tests need torch")
if not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)):
    pytest.skip("needs a Hopper (sm_90) GPU", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402

import evtc.torch  # noqa: E402
from test_torch_gpu import poison_allocator  # noqa: E402
from torch_cases import K, M, N, randn  # noqa: E402

FUSE_ALL = {"evtc.profitability": False}


@pytest.fixture(autouse=True)
def background_mode(monkeypatch):
    monkeypatch.delenv("EVTC_WAIT_FOR_COMPILE", raising=False)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def fresh_constant(salt: int) -> float:
    """A multiplier no earlier run compiled a kernel for (its value is in the kernel's source)."""
    return 1.0 + ((time.time_ns() // 1000 + 7919 * salt + os.getpid()) % 100003) / 2 ** 20


def skip_unless_grouped_kernels_fuse():
    """Fused grouped kernels are sm_90a's (under EVTC_ARCH=sm80 they run unfused by design)."""
    if why := evtc.grouped("out y: bf16 = acc").shape_reason(264, 136):
        pytest.skip(f"no fused grouped kernels for this target: {why}")


def only_fusion(start: int):
    (fusion,) = [f for r in evtc.torch.reports[start:] for f in r.fused]
    return fusion


def check(got: torch.Tensor, want: torch.Tensor) -> None:
    assert not got.isnan().any(), "unwritten elements"
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


def inputs():
    return randn(M, K), randn(N, K, scale=K ** -0.5), randn(N)


def test_runs_unfused_while_compiling_then_switches_with_the_same_results():
    scale = fresh_constant(1)

    def fn(x, w, b):
        return F.silu(x @ w.t() + b) * scale

    compiled = torch.compile(fn, backend="evtc", options=FUSE_ALL)
    x, w, b = inputs()
    want = F.silu(x.double() @ w.double().t() + b.double()) * scale
    start = len(evtc.torch.reports)
    poison_allocator()
    t0 = time.monotonic()
    first = compiled(x, w, b).clone()
    print(f"first call (trace, Inductor, unfused run): {time.monotonic() - t0:.1f} s")
    spec = only_fusion(start).spec
    assert evtc.torch.path_counts(spec) == {"fused": 0, "fallback": 1}
    check(first, want)
    assert not evtc.torch.wait_for_compiles()
    poison_allocator()
    second = compiled(x, w, b)
    assert evtc.torch.path_counts(spec) == {"fused": 1, "fallback": 1}
    check(second, want)
    # The switch changes no result beyond the last bf16 bit (the two paths sum K in different orders).
    torch.testing.assert_close(second, first, rtol=1e-2, atol=1e-2 * first.abs().max().item())


def test_wait_for_compile_option_waits():
    scale = fresh_constant(2)

    def fn(x, w, b):
        return F.gelu(x @ w.t() + b, approximate="tanh") * scale

    compiled = torch.compile(fn, backend="evtc", options={**FUSE_ALL, "evtc.wait_for_compile": True})
    x, w, b = inputs()
    start = len(evtc.torch.reports)
    poison_allocator()
    got = compiled(x, w, b)
    assert evtc.torch.path_counts(only_fusion(start).spec) == {"fused": 1, "fallback": 0}
    check(got, F.gelu(x.double() @ w.double().t() + b.double(), approximate="tanh") * scale)


def test_cuda_graph_capture_waits_for_the_fused_kernel():
    """Inductor's CUDA-graph trees run once, then record: the recording waits for the fused
    kernel (a recorded graph could not switch later), and replays run it."""
    scale = fresh_constant(3)

    def fn(x, w, b):
        return torch.relu(x @ w.t() + b) * scale

    # mode="reduce-overhead" is these options (torch.compile takes one of mode and options).
    compiled = torch.compile(fn, backend="evtc", options={**FUSE_ALL, "triton.cudagraphs": True})
    _, w, b = inputs()
    start = len(evtc.torch.reports)
    for _ in range(4):  # warm-up (unfused), recording (waits, fused), replays
        x = randn(M, K)
        torch.compiler.cudagraph_mark_step_begin()
        got = compiled(x, w, b).clone()
        check(got, torch.relu(x.double() @ w.double().t() + b.double()) * scale)
    counts = evtc.torch.path_counts(only_fusion(start).spec)
    assert counts["fused"] >= 1, counts


# --- grouped (MoE) kernels: group by group while compiling ---------------------------------

ROWS = [0, 77, 300, 1, 0, 130]  # ragged, with empty groups (not tile multiples)


def grouped_inputs(n: int, k: int):
    g = len(ROWS)
    x = randn(sum(ROWS), k)
    w = randn(g, n, k, scale=k ** -0.5)  # stacked nn.Linear weights
    offs = torch.tensor(ROWS, device="cuda").cumsum(0).to(torch.int32)
    return x, w, offs


def per_group(x, w, fn) -> list[tuple[int, int, torch.Tensor]]:
    """(first row, rows, fn(group index, x_g @ w_g^T in float64)) of every non-empty group."""
    out, start = [], 0
    for i, r in enumerate(ROWS):
        if r:
            out.append((start, r, fn(i, x[start:start + r].double() @ w[i].double().t())))
        start += r
    return out


def check_groups(y: torch.Tensor, want) -> None:
    for start, r, ref in want:
        check(y[start:start + r], ref)


def test_grouped_kernel_runs_group_by_group_while_compiling_then_switches():
    """evtc.grouped(..., wait_for_compile=False): a per-group bias and a per-group scalar by
    pointer, gated output (N -> N/2) and plain output."""
    skip_unless_grouped_kernels_fuse()
    scale = fresh_constant(4)
    n, k = 264, 136
    x, w, offs = grouped_inputs(n, k)
    g = len(ROWS)
    bias, s = randn(g, n), torch.rand(g, device="cuda") + 0.5
    plain = evtc.grouped(f"input bias[n]: bf16\ninput s: f32 ptr\nout y: bf16 = silu(acc + bias[n]) * s * {scale}",
                         wait_for_compile=False)
    gated = evtc.grouped(f"out y: bf16 = gptoss_swiglu(acc * {scale} + bias[n], alpha=1.5, limit=3)",
                         wait_for_compile=False)

    def swiglu(i, h):
        h = h * scale + bias[i].double()
        gate, up = h[:, 0::2].clamp(max=3), h[:, 1::2].clamp(-3, 3)
        return gate * torch.sigmoid(1.5 * gate) * (up + 1)

    cases = [(plain, dict(bias=bias, s=s), per_group(x, w, lambda i, h: F.silu(h + bias[i].double())
                                                    * s[i].double() * scale)),
             (gated, dict(bias=bias), per_group(x, w, swiglu))]
    for kernel, operands, want in cases:
        poison_allocator()
        first = kernel(x, w.transpose(1, 2), offs, **operands).clone()
        assert kernel.last_path == "fallback", kernel
        check_groups(first, want)
        kernel._native.compile()  # waits for the background compile
        poison_allocator()
        second = kernel(x, w.transpose(1, 2), offs, **operands)
        assert kernel.last_path == "fused", kernel
        check_groups(second, want)
        torch.testing.assert_close(second, first, rtol=1e-2, atol=1e-2 * first.abs().max().item())


def test_grouped_unfused_path_refuses_offsets_that_go_backwards():
    kernel = evtc.grouped(f"out y: bf16 = silu(acc) * {fresh_constant(6)}", wait_for_compile=False)
    x, w, _ = grouped_inputs(264, 136)
    offs = torch.tensor([100, 50, 200, 300, 400, 508], device="cuda", dtype=torch.int32)
    with pytest.raises(evtc.UserError, match=r"offsets\[1\] = 50: the end offsets must be non-decreasing "
                                             r"and at most x's 508 rows \(the previous group ends at 100\)"):
        kernel(x, w.transpose(1, 2), offs)


def test_grouped_op_in_a_model_runs_unfused_while_compiling():
    skip_unless_grouped_kernels_fuse()
    scale = fresh_constant(5)
    n, k = 264, 136

    def fn(x, w, offs, b):
        return F.silu(torch._grouped_mm(x, w.transpose(-2, -1), offs=offs) + b) * scale

    compiled = torch.compile(fn, backend="evtc", options=FUSE_ALL)
    x, w, offs = grouped_inputs(n, k)
    b = randn(n)
    want = per_group(x, w, lambda i, h: F.silu(h + b.double()) * scale)
    start = len(evtc.torch.reports)
    poison_allocator()
    first = compiled(x, w, offs, b).clone()
    spec = only_fusion(start).spec
    assert evtc.torch.path_counts(spec) == {"fused": 0, "fallback": 1}
    check_groups(first, want)
    assert not evtc.torch.wait_for_compiles()
    poison_allocator()
    second = compiled(x, w, offs, b)
    assert evtc.torch.path_counts(spec) == {"fused": 1, "fallback": 1}
    check_groups(second, want)
    torch.testing.assert_close(second, first, rtol=1e-2, atol=1e-2 * first.abs().max().item())
