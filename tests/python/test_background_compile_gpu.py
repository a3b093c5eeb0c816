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
