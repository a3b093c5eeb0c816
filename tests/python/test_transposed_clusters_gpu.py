"""Transposed (swap-AB) kernels in 4x1 clusters on a Hopper GPU: the decode tiles the H200's table
picks at M <= 64 (docs/backend.md, "Selection tables"): 64-row ping-pong tiles with K tiles of 64
and 128, and 128-row cooperative ones, four CTAs along N sharing the activations' tile. Checked
against float64 on outputs poisoned with NaN, at sizes that are no multiple of a tile or of a
cluster's four tiles: [m] and [n] vectors, C, an [m,n] operand, an extra f32 output, a row sum
and a column max (each over the transposed kernel's other axis). Gated epilogues take no
transposed kernel (their pairs of columns would lie in different threads): legality refuses them."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the transposed-cluster tests need torch")
if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
    pytest.skip("needs a Hopper (sm_90) GPU", allow_module_level=True)

import evtc  # noqa: E402

MIX_EXPR = ("input s[m]: f32; input r[m,n]: bf16; h = acc * s[m] + bias[n]; out D: bf16 = silu(h) + C; "
            "out P: f32 = h + r[m,n]; out rs: f32 = row_sum(h); out cm: f32 = col_max(h)")
MIX_CONFIGS = ["pingpong_64x16x64_c4x1_persistent_swap", "pingpong_64x32x128_c4x1_persistent_swap",
               "pingpong_64x64x64_c4x1_persistent_swap", "coop_128x32x64_c4x1_persistent_swap"]
MIX = {c: evtc.compile(MIX_EXPR, config=c) for c in MIX_CONFIGS}


@pytest.fixture(scope="module", autouse=True)
def compiled():
    """The kernels compile side by side before the tests."""
    for f in [k.compile_async(0, 0, 0) for k in MIX.values()]:
        f.result()


def randn(*shape, scale=1.0, seed=0, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)


def nan(*shape, dtype=torch.bfloat16):
    return torch.full(shape, float("nan"), device="cuda", dtype=dtype)


def close(got, want, where, tol=2e-2):
    assert not got.isnan().any(), f"{where}: unwritten elements"
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * want.abs().max().item(), msg=where)


@pytest.mark.parametrize("config", MIX_CONFIGS)
# M a multiple of 8 (the [m] vector's 16-byte rows); N no multiple of four 128-row tiles.
@pytest.mark.parametrize("m, n, k", [(8, 1000, 1000), (40, 2056, 4104), (56, 776, 520)])
def test_transposed_cluster_kernels_match_float64(config, m, n, k):
    kernel = MIX[config]
    seed = m + n + k
    a, w = randn(m, k, seed=seed), randn(n, k, scale=k ** -0.5, seed=seed + 1)
    s, bias = randn(m, seed=seed + 2, dtype=torch.float32), randn(n, seed=seed + 3)
    C, r = randn(m, n, seed=seed + 4), randn(m, n, seed=seed + 5)
    out = {"D": nan(m, n), "P": nan(m, n, dtype=torch.float32), "rs": nan(m, dtype=torch.float32),
           "cm": nan(n, dtype=torch.float32)}
    kernel(a, w.t(), s=s, bias=bias, C=C, r=r, out=out)
    torch.cuda.synchronize()
    assert kernel.last_path == "fused", kernel.fallback_reason(m, n, k)
    h = (a.double() @ w.double().t()) * s.double()[:, None] + bias.double()
    where = f"{config} at {m}x{n}x{k}"
    close(out["D"], torch.nn.functional.silu(h) + C.double(), f"{where}: D")
    close(out["P"], h + r.double(), f"{where}: P")
    close(out["rs"], h.sum(1), f"{where}: row_sum", tol=1e-3)
    close(out["cm"], h.max(0).values, f"{where}: col_max")
