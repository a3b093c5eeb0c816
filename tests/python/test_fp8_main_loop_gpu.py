"""fp8's two-level main loop on a Hopper GPU: evtc's overlapped promotion
(evtc/device/sm90_fp8_mainloop.cuh, the default where it fits) against CUTLASS's own loop at the
same promotion interval (the `_pk128` configurations, which keep CUTLASS's loop) and a float64
reference, at sizes that are not tile multiples and K tile counts of 1, 2, 3 and more, odd and
even, including a partial last K tile. Both loops add the same partial sums in the same order,
so their outputs must be the same bits."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the fp8 main-loop tests need torch")
if not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)):
    pytest.skip("needs a Hopper (sm_90) GPU", allow_module_level=True)

import evtc  # noqa: E402

EXPR = "input sa[m]: f32\ninput sb[n]: f32\ninput r[m,n]: bf16\nout D: f32 = acc * sa[m] * sb[n]\nout E: bf16 = silu(acc) + r"
FP8 = {"a_dtype": "f8e4m3", "b_dtype": "f8e4m3"}
# The overlapped loop's tiles: cooperative 128x128 (two warp groups on one tile, also split-K),
# ping-pong 64x128 and a transposed decode tile.
CONFIGS = ["coop_128x128x128_c1x1_persistent", "pingpong_64x128x128_c1x1_persistent",
           "coop_128x128x128_c1x1_splitk2", "pingpong_64x32x128_c1x1_persistent_swap"]
SHAPES = [(200, 328, 128), (136, 1000, 256), (1000, 1096, 384), (520, 776, 1040), (40, 2056, 4000)]


def operands(m, n, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = (torch.randn(m, k, generator=g, device="cuda") * 2).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, generator=g, device="cuda") * 2).to(torch.float8_e4m3fn)
    sa = torch.rand(m, generator=g, device="cuda") + 0.5
    sb = torch.rand(n, generator=g, device="cuda") + 0.5
    r = torch.randn(m, n, generator=g, device="cuda").to(torch.bfloat16)
    return a, w, sa, sb, r


@pytest.mark.parametrize("config", CONFIGS)
def test_overlapped_promotion_gives_cutlasss_bits_and_matches_float64(config):
    kernels = {name: evtc.compile(EXPR, config=name, **FP8) for name in (config, config + "_pk128")}
    for f in [k.compile_async(0, 0, 0) for k in kernels.values()]:
        f.result()
    for i, (m, n, k) in enumerate(SHAPES):
        a, w, sa, sb, r = operands(m, n, k, seed=100 + i)
        outs = {}
        for name, kern in kernels.items():
            d = torch.full((m, n), float("nan"), device="cuda")
            e = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            kern(a, w.t(), sa=sa, sb=sb, r=r, out={"D": d, "E": e})
            assert kern.last_path == "fused", f"{name} at {m}x{n}x{k}: ran {kern.last_path}"
            outs[name] = (d, e)
        torch.cuda.synchronize()
        (d0, e0), (d1, e1) = outs[config], outs[config + "_pk128"]
        where = f"{config} at {m}x{n}x{k}"
        assert not torch.isnan(d0).any() and not torch.isnan(e0).any(), f"{where}: unwritten elements"
        assert torch.equal(d0, d1), f"{where}: D differs from CUTLASS's loop at {(d0 != d1).sum().item()} elements"
        assert torch.equal(e0, e1), f"{where}: E differs from CUTLASS's loop"
        acc = a.double() @ w.double().t()
        want = acc * sa.double()[:, None] * sb.double()[None, :]
        rel = ((d0.double() - want).norm() / want.norm()).item()
        # fp8 products summed by the tensor cores in 128-wide K blocks, then in fp32: well
        # within 2^-11 of the float64 result (the bound evtc's checks use for fp8 A/B).
        assert rel < 2.0**-11, f"{where}: rel L2 {rel:.2e} against float64"
        want_e = torch.nn.functional.silu(acc) + r.double()
        rel_e = ((e0.double() - want_e).norm() / want_e.norm()).item()
        assert rel_e < 2.0**-7, f"{where}: E rel L2 {rel_e:.2e} against float64"
