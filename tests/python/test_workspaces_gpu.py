"""Fused kernels' workspaces on a Hopper GPU: a call captured into a CUDA graph uses memory the
graph owns, calls outside capture use their stream's kept workspace, and neither disturbs the
other. Dense split-K and stream-K kernels (their partial sums live in the workspace) and the
grouped kernel (its group tables do) are captured, then called outside capture on the same
stream at a larger problem (the kept workspace grows), and the graph is replayed on new inputs:
every result is checked against float64 on outputs poisoned with NaN, at sizes that are not
tile multiples."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the workspace tests need torch")
if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
    pytest.skip("needs a Hopper (sm_90) GPU", allow_module_level=True)

import evtc  # noqa: E402

EXPR = "out D: bf16 = silu(acc + bias[n])"
# Split-K and stream-K: both keep partial tiles in the workspace.
CONFIGS = ["coop_128x128x64_c1x1_splitk2", "coop_128x128x64_c1x1_streamk"]
KERNELS = {config: evtc.compile(EXPR, config=config) for config in CONFIGS}
GROUPED = evtc.grouped("out y: bf16 = gptoss_swiglu(acc + bias[n], alpha=1.5, limit=3)")


@pytest.fixture(scope="module", autouse=True)
def compiled():
    """The three kernels compile side by side before the tests."""
    for f in [k.compile_async(0, 0, 0) for k in KERNELS.values()] + [GROUPED.compile_async()]:
        f.result()


def randn(*shape, scale=1.0, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, generator=g, device="cuda") * scale).bfloat16()


def dense_problem(m, n, k, seed):
    return randn(m, k, seed=seed), randn(n, k, scale=k ** -0.5, seed=seed + 1), randn(n, seed=seed + 2)


def check_dense(d, a, w, bias, where):
    assert not d.isnan().any(), f"{where}: unwritten elements"
    want = torch.nn.functional.silu(a.double() @ w.double().t() + bias.double())
    torch.testing.assert_close(d.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item(), msg=where)


@pytest.mark.parametrize("config", CONFIGS)
def test_a_captured_dense_call_and_calls_outside_capture_keep_their_own_workspaces(config):
    kernel = KERNELS[config]
    stream = torch.cuda.Stream()
    small, large = (1000, 776, 1040), (1500, 1304, 2056)
    a, w, bias = dense_problem(*small, seed=1)
    d = torch.full(small[:2], float("nan"), device="cuda", dtype=torch.bfloat16)
    with torch.cuda.stream(stream):
        kernel(a, w.t(), bias=bias, out={"D": d})  # outside capture first: the stream's kept workspace
    stream.synchronize()
    check_dense(d, a, w, bias, f"{config}, first call")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        kernel(a, w.t(), bias=bias, out={"D": d})
    assert kernel.last_path == "fused"
    # Outside capture on the same stream, a larger problem: the kept workspace grows (the old
    # one is released in stream order) while the graph keeps its own.
    a2, w2, bias2 = dense_problem(*large, seed=5)
    d2 = torch.full(large[:2], float("nan"), device="cuda", dtype=torch.bfloat16)
    with torch.cuda.stream(stream):
        kernel(a2, w2.t(), bias=bias2, out={"D": d2})
        a.copy_(randn(*a.shape, seed=9))
        d.fill_(float("nan"))
        graph.replay()
        d3 = torch.full(large[:2], float("nan"), device="cuda", dtype=torch.bfloat16)
        kernel(a2, w2.t(), bias=bias2, out={"D": d3})  # again, after the replay
    stream.synchronize()
    assert kernel.last_path == "fused"
    check_dense(d, a, w, bias, f"{config}, replay")
    check_dense(d2, a2, w2, bias2, f"{config}, larger call outside capture")
    check_dense(d3, a2, w2, bias2, f"{config}, larger call after the replay")


def grouped_problem(rows, seed, n=264, k=136):
    g = len(rows)
    x = randn(sum(rows), k, seed=seed)
    w = randn(g, n, k, scale=k ** -0.5, seed=seed + 1)  # stacked nn.Linear weights, (gate, up) interleaved
    bias = randn(g, n, seed=seed + 2)
    offs = torch.tensor(rows, device="cuda").cumsum(0).to(torch.int32)
    return x, w, bias, offs


def check_grouped(y, rows, x, w, bias, where):
    assert not y.isnan().any(), f"{where}: unwritten elements"
    start = 0
    for i, r in enumerate(rows):
        h = x[start:start + r].double() @ w[i].double().t() + bias[i].double()
        gate, up = h[:, 0::2].clamp(max=3), h[:, 1::2].clamp(-3, 3)
        want = gate * torch.sigmoid(1.5 * gate) * (up + 1)
        if r:
            torch.testing.assert_close(y[start:start + r].double(), want, rtol=2e-2,
                                       atol=2e-2 * want.abs().max().item(), msg=f"{where}, group {i}")
        start += r


def test_a_captured_grouped_call_and_calls_outside_capture_keep_their_own_workspaces():
    rows_a, rows_b = [0, 77, 300, 1, 0, 130], [5, 0, 64, 200, 31, 9, 120, 2, 40]
    x, w, bias, offs = grouped_problem(rows_a, seed=20)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y = GROUPED(x, w.transpose(1, 2), offs, bias=bias)  # compiles; outside capture
    stream.synchronize()
    check_grouped(y, rows_a, x, w, bias, "first call")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        y = GROUPED(x, w.transpose(1, 2), offs, bias=bias)
    # More groups outside capture (a larger kept workspace), then the replay on new inputs,
    # then the larger call again: each reads its own group tables.
    x2, w2, bias2, offs2 = grouped_problem(rows_b, seed=30)
    with torch.cuda.stream(stream):
        y2 = GROUPED(x2, w2.transpose(1, 2), offs2, bias=bias2)
        x.copy_(randn(*x.shape, seed=40))
        y.fill_(float("nan"))
        graph.replay()
        y3 = GROUPED(x2, w2.transpose(1, 2), offs2, bias=bias2)
    stream.synchronize()
    check_grouped(y, rows_a, x, w, bias, "replay")
    check_grouped(y2, rows_b, x2, w2, bias2, "more groups outside capture")
    check_grouped(y3, rows_b, x2, w2, bias2, "more groups after the replay")
