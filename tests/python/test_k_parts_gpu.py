"""K in parts on a Hopper GPU (KernelConfig::k_parts, docs/backend.md "K in parts"): the GEMM
writes the parts' fp32 products into the workspace and the plain epilogue adds them and evaluates
the expression. Checked against float64 on outputs poisoned with NaN, at sizes that are not tile
multiples: transposed (swap-AB) kernels with [n] and [m] vectors, C, an [m,n] operand, the column
index and an extra f32 output; an untransposed gated kernel with B row-major; a call captured into
a CUDA graph (the parts live in the graph's workspace) next to calls outside it; and a K that does
not split into 16-byte parts, which runs the unfused path with the reason."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the K-in-parts tests need torch")
if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
    pytest.skip("needs a Hopper (sm_90) GPU", allow_module_level=True)

import evtc  # noqa: E402

SWAP_EXPR = ("input s[m]: f32; h = acc * s[m] + bias[n]; out D: bf16 = silu(h) + C + n * 0.001; "
             "out P: f32 = h + r[m,n]")
GATED_EXPR = "h = acc + bias[n]; out P: bf16 = h + r[m,n]; out y: bf16 = swiglu(h)"
SWAP = {parts: evtc.compile(SWAP_EXPR, config=f"pingpong_64x16x128_c1x1_persistent_kparts{parts}_swap")
        for parts in (2, 4)}
GATED = evtc.compile(GATED_EXPR, b_layout="row", config="pingpong_64x64x128_c1x1_persistent_kparts3")


@pytest.fixture(scope="module", autouse=True)
def compiled():
    """The kernels compile side by side before the tests."""
    for f in [k.compile_async(0, 0, 0) for k in [*SWAP.values(), GATED]]:
        f.result()


def randn(*shape, scale=1.0, seed=0, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)


def nan(*shape, dtype=torch.bfloat16):
    return torch.full(shape, float("nan"), device="cuda", dtype=dtype)


def close(got, want, where):
    assert not got.isnan().any(), f"{where}: unwritten elements"
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item(), msg=where)


def swap_problem(m, n, k, seed):
    return dict(a=randn(m, k, seed=seed), w=randn(n, k, scale=k ** -0.5, seed=seed + 1),
                s=randn(m, seed=seed + 2, dtype=torch.float32), bias=randn(n, seed=seed + 3),
                C=randn(m, n, seed=seed + 4), r=randn(m, n, seed=seed + 5))


def run_swap(kernel, p, out=None):
    m, n = p["a"].shape[0], p["w"].shape[0]
    out = out or {"D": nan(m, n), "P": nan(m, n, dtype=torch.float32)}
    kernel(p["a"], p["w"].t(), s=p["s"], bias=p["bias"], C=p["C"], r=p["r"], out=out)
    return out


def check_swap(out, p, where):
    h = (p["a"].double() @ p["w"].double().t()) * p["s"].double()[:, None] + p["bias"].double()
    cols = torch.arange(h.shape[1], device="cuda", dtype=torch.float64)
    close(out["D"], torch.nn.functional.silu(h) + p["C"].double() + cols * 0.001, f"{where}: D")
    close(out["P"], h + p["r"].double(), f"{where}: P")


@pytest.mark.parametrize("parts", [2, 4])
# M a multiple of 8: the [m] vector's 16-byte alignment, which legality asks of every kernel.
@pytest.mark.parametrize("m, n, k", [(8, 1000, 4128), (40, 2056, 2080), (64, 776, 1056), (136, 1000, 4160)])
def test_transposed_parts_match_float64(parts, m, n, k):
    p = swap_problem(m, n, k, seed=m + n)
    out = run_swap(SWAP[parts], p)
    assert SWAP[parts].last_path == "fused"
    check_swap(out, p, f"{parts} parts at {m}x{n}x{k}")


@pytest.mark.parametrize("m, n, k", [(37, 2 * 500, 3096), (200, 2 * 1500, 1560)])
def test_gated_parts_with_b_row_major_match_float64(m, n, k):
    a, w, bias, r = randn(m, k, seed=m), randn(k, n, scale=k ** -0.5, seed=m + 1), randn(n, seed=m + 2), randn(m, n, seed=m + 3)
    out = {"P": nan(m, n), "y": nan(m, n // 2)}
    GATED(a, w, bias=bias, r=r, out=out)  # w: K×N row-major
    assert GATED.last_path == "fused"
    h = a.double() @ w.double() + bias.double()
    close(out["P"], h + r.double(), f"{m}x{n}x{k}: P")
    gate, up = h[:, 0::2], h[:, 1::2]
    close(out["y"], torch.nn.functional.silu(gate) * up, f"{m}x{n}x{k}: y")


def test_a_captured_call_and_calls_outside_capture_keep_their_own_parts():
    kernel = SWAP[4]
    stream = torch.cuda.Stream()
    small, large = swap_problem(16, 1000, 2080, seed=1), swap_problem(48, 3000, 4160, seed=9)
    with torch.cuda.stream(stream):
        out = run_swap(kernel, small)  # outside capture first: the stream's kept workspace
    stream.synchronize()
    check_swap(out, small, "first call")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        run_swap(kernel, small, out)
    with torch.cuda.stream(stream):
        out2 = run_swap(kernel, large)  # a larger workspace outside capture
        small["a"].copy_(randn(*small["a"].shape, seed=40))
        for t in out.values():
            t.fill_(float("nan"))
        graph.replay()
        out3 = run_swap(kernel, large)
    stream.synchronize()
    assert kernel.last_path == "fused"
    check_swap(out, small, "replay on new inputs")
    check_swap(out2, large, "larger call outside capture")
    check_swap(out3, large, "larger call after the replay")


def test_a_k_that_does_not_split_runs_unfused_with_the_reason(capfd):
    # 4104 / 4 = 1026: not whole 16-byte rows (K itself is: legality passes it).
    p = swap_problem(16, 1000, 4104, seed=3)
    capfd.readouterr()
    out = run_swap(SWAP[4], p)
    assert SWAP[4].last_path == "fallback"
    check_swap(out, p, "unfused")
    log = capfd.readouterr().err
    assert "K = 4104 does not split into 4 parts of a multiple of 8 elements" in log, log
