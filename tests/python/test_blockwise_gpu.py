"""Block-scaled fp8 GEMMs (DeepSeek-V3's format) through evtc.compile on a Hopper GPU: the fused
kernel and the unfused path against a float64 reference of the scaled product, on operands
quantized the way such models quantize them, at sizes that are not tile or block multiples."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the block-scaled fp8 tests need torch")
if not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)):
    pytest.skip("needs a Hopper (sm_90) GPU", allow_module_level=True)

import evtc  # noqa: E402

BLOCK = 128
E4M3_MAX = 448.0
EXPR = "input bias[n]: bf16\nout D: bf16 = gelu(acc + bias[n])"


def quantize_rows(x: torch.Tensor):
    """x (M×K) to e4m3 with one scale per row and 128 of K; the scales as an M × ceil(K/128)
    matrix with M adjacent (PyTorch's 1×128 layout)."""
    m, k = x.shape
    kb = -(-k // BLOCK)
    padded = torch.nn.functional.pad(x, (0, kb * BLOCK - k)).view(m, kb, BLOCK)
    scale = padded.abs().amax(dim=2).clamp(min=1e-4) / E4M3_MAX
    q = (padded / scale[:, :, None]).to(torch.float8_e4m3fn).view(m, kb * BLOCK)[:, :k]
    return q.contiguous(), scale.t().contiguous().t()


def quantize_blocks(w: torch.Tensor):
    """w (N×K) to e4m3 with one scale per 128×128 block; the scales as a ceil(K/128) ×
    ceil(N/128) row-major matrix (what evtc takes for B = w.t())."""
    n, k = w.shape
    nb, kb = -(-n // BLOCK), -(-k // BLOCK)
    padded = torch.nn.functional.pad(w, (0, kb * BLOCK - k, 0, nb * BLOCK - n)).view(nb, BLOCK, kb, BLOCK)
    scale = padded.abs().amax(dim=(1, 3)).clamp(min=1e-4) / E4M3_MAX  # nb × kb
    q = (padded / scale[:, None, :, None]).to(torch.float8_e4m3fn).view(nb * BLOCK, kb * BLOCK)[:n, :k]
    return q.contiguous(), scale.t().contiguous()


def dequantized(q: torch.Tensor, scale_rows: torch.Tensor, scale_cols_per_block: bool) -> torch.Tensor:
    """float64 values of a quantized operand (rows × K) times its scales."""
    rows, k = q.shape
    ks = torch.arange(k, device=q.device) // BLOCK
    if scale_cols_per_block:  # B: scale (kb × nb), block (row // 128, k // 128)
        rs = torch.arange(rows, device=q.device) // BLOCK
        s = scale_rows.double()[ks][:, rs].t()
    else:  # A: scale (m × kb)
        s = scale_rows.double()[:, ks]
    return q.double() * s


def problem(m: int, n: int, k: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g) * torch.exp2(torch.randint(-3, 4, (m, 1), device="cuda", generator=g))
    w = torch.randn(n, k, device="cuda", generator=g) * 0.05
    a, sa = quantize_rows(x)
    wq, sb = quantize_blocks(w)
    bias = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
    acc = dequantized(a, sa, False) @ dequantized(wq, sb, True).t()
    want = torch.nn.functional.gelu(acc + bias.double())
    return a, wq, sa, sb, bias, want


def check(got: torch.Tensor, want: torch.Tensor):
    assert not torch.isnan(got).any(), "an output element was not written (NaN poison left)"
    err = (got.double() - want).abs()
    tol = 2.0**-7 * want.abs() + 2.0**-7 * want.pow(2).mean().sqrt()
    bad = int((err > tol).sum())
    rel_l2 = float(err.norm() / want.norm())
    assert bad == 0 and rel_l2 < 2.0**-8, f"{bad} elements outside the bf16 bound; rel L2 {rel_l2:.2e}"


@pytest.fixture(scope="module")
def kernels():
    fused = evtc.compile(EXPR, a_dtype="f8e4m3", b_dtype="f8e4m3", fp8_blockwise=True)
    unfused = evtc.compile(EXPR, a_dtype="f8e4m3", b_dtype="f8e4m3", fp8_blockwise=True, disable_fusion=True)
    fused.compile_async(0, 0, 0)
    return fused, unfused


@pytest.mark.parametrize("m,n,k", [(1000, 1040, 1008), (264, 4096, 4096), (4096, 512, 7168)])
def test_blockwise_fused_and_unfused_match_float64(kernels, m, n, k):
    fused, unfused = kernels
    a, wq, sa, sb, bias, want = problem(m, n, k, seed=m + n + k)
    for kernel, path in ((fused, "fused"), (unfused, "fallback")):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        kernel(a, wq.t(), scale_a=sa, scale_b=sb, bias=bias, out={"D": out})
        torch.cuda.synchronize()
        assert kernel.last_path == path
        check(out, want)


def test_blockwise_matches_torch_scaled_mm_where_torch_has_it(kernels):
    """torch._scaled_mm takes the same scales (its scale_b with K blocks adjacent: the transpose
    of evtc's layout); where this torch build runs it, the two products agree to bf16 rounding."""
    fused, _ = kernels
    m, n, k = 512, 1024, 2048
    a, wq, sa, sb, bias, want = problem(m, n, k, seed=5)
    try:
        ref = torch._scaled_mm(a, wq.t(), scale_a=sa, scale_b=sb.t().contiguous().t(), out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError, ValueError) as e:
        pytest.skip(f"torch._scaled_mm has no 1x128/128x128 blockwise path here: {str(e)[:200]}")
    plain = evtc.compile("out D: bf16 = acc", a_dtype="f8e4m3", b_dtype="f8e4m3", fp8_blockwise=True)
    got = plain(a, wq.t(), scale_a=sa, scale_b=sb)
    err = float((got.double() - ref.double()).norm() / ref.double().norm())
    assert err < 2.0**-7, f"evtc and torch._scaled_mm differ by rel L2 {err:.2e}"


def test_blockwise_scales_in_other_layouts_run_unfused(kernels):
    """Scales with other strides (K-adjacent scale_a, PyTorch's K-adjacent scale_b) are read as
    they are by the unfused path, which the call takes and logs."""
    fused, _ = kernels
    m, n, k = 520, 392, 656
    a, wq, sa, sb, bias, want = problem(m, n, k, seed=21)
    for scale_a, scale_b in ((sa.contiguous(), sb), (sa, sb.t().contiguous().t())):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        fused(a, wq.t(), scale_a=scale_a, scale_b=scale_b, bias=bias, out={"D": out})
        torch.cuda.synchronize()
        assert fused.last_path == "fallback"
        check(out, want)


def test_blockwise_argument_errors_name_the_scale(kernels):
    fused, _ = kernels
    m, n, k = 256, 256, 256
    a, wq, sa, sb, bias, _ = problem(m, n, k, seed=9)
    with pytest.raises(evtc.UserError, match="scale_b was not given"):
        fused(a, wq.t(), scale_a=sa, bias=bias)
    with pytest.raises(evtc.UserError, match=r"scale_b: shape 1×2 given, expected ceil\(K/128\) × ceil\(N/128\)"):
        fused(a, wq.t(), scale_a=sa, scale_b=sb[:1].contiguous(), bias=bias)
    with pytest.raises(evtc.UserError, match="scale_a: dtype bf16"):
        fused(a, wq.t(), scale_a=sa.to(torch.bfloat16), scale_b=sb, bias=bias)
    with pytest.raises(evtc.UserError, match=r"scale_a was not given: a block-scaled kernel needs A's f32 scales, "
                                             r"an M × ceil\(K/128\) = 256×2 matrix with M adjacent"):
        fused(a, wq.t(), scale_b=sb, bias=bias)
    with pytest.raises(evtc.UserError, match=r"scale_a: shape 128×2 given, expected M × ceil\(K/128\) = 256×2"):
        fused(a, wq.t(), scale_a=sa[:128], scale_b=sb, bias=bias)
    plain = evtc.compile("out D: bf16 = acc")
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(evtc.UserError, match=r"scale_a given, but the kernel was not built for fp8 block scales "
                                             r"\(fp8_blockwise\)"):
        plain(x, x.t(), scale_a=sa)


def test_torch_compile_fuses_a_block_scaled_scaled_mm_and_its_epilogue():
    """torch.compile with evtc's backend: _scaled_mm with block scales + bias + GELU becomes one
    block-scaled evtc kernel (Inductor alone cannot lower block scales with an epilogue)."""
    import evtc.torch
    import torch._dynamo

    def f(a, b, sa, sb, bias):
        y = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
        return torch.nn.functional.gelu(y + bias)

    m, n, k = 1000, 1040, 1008
    a, wq, sa, sb, bias, want = problem(m, n, k, seed=21)
    torch._dynamo.reset()
    start = len(evtc.torch.reports)
    compiled = torch.compile(f, backend="evtc", dynamic=False,
                             options={"evtc.profitability": False, "evtc.wait_for_compile": True})
    got = compiled(a, wq.t(), sa, sb.t().contiguous().t(), bias)
    torch.cuda.synchronize()
    fused = [fz for r in evtc.torch.reports[start:] for fz in r.fused]
    assert len(fused) == 1, [r.refused for r in evtc.torch.reports[start:]]
    assert evtc.torch.path_counts(fused[0].spec)["fused"] >= 1
    check(got, want)


def test_grouped_block_scaled_fp8_matches_float64():
    """evtc.grouped with fp8_blockwise: experts quantized with 128×128 block scales, tokens with
    1×128 ones, ragged groups (an empty one, sizes that are not tile multiples), N and K with
    partial scale blocks; gated GPT-OSS SwiGLU epilogue; the fused kernel against float64, with
    scale_a given row-major (read in place) and with M adjacent (copied first)."""
    groups, n, k = 6, 392, 656
    rows = [130, 0, 257, 1, 64, 300]
    g = torch.Generator(device="cuda").manual_seed(41)
    x = torch.randn(sum(rows), k, device="cuda", generator=g)
    w = torch.randn(groups, n, k, device="cuda", generator=g) * 0.05
    xq, sa = quantize_rows(x)                                     # sa: M adjacent
    wq, sb = zip(*(quantize_blocks(w[e]) for e in range(groups)))  # each sb: ceil(K/128) × ceil(N/128)
    wq, sb = torch.stack(wq), torch.stack(sb)                     # G × N × K, G × Kb × Nb
    bias = torch.randn(groups, n, device="cuda", generator=g).to(torch.bfloat16)
    offsets = torch.tensor(rows, device="cuda").cumsum(0).to(torch.int32)
    kernel = evtc.grouped("input bias[n]: bf16\nout y: bf16 = gptoss_swiglu(acc + bias[n])",
                          dtype="f8e4m3", fp8_blockwise=True)
    want = torch.empty(sum(rows), n // 2, device="cuda", dtype=torch.float64)
    start = 0
    for e, r in enumerate(rows):
        acc = dequantized(xq[start:start + r], sa[start:start + r], False) @ dequantized(wq[e], sb[e], True).t()
        pre = acc + bias[e].double()
        gate, up = pre[:, 0::2].clamp(max=7.0), pre[:, 1::2].clamp(-7.0, 7.0)
        want[start:start + r] = gate * torch.sigmoid(1.702 * gate) * (up + 1)
        start += r
    # The weights' scales as the kernel reads them: G × Kb × Nb oriented like w (a transpose of
    # the G × Nb × Kb blocks), and w as G × K × N.
    scale_b = sb.transpose(1, 2).contiguous().transpose(1, 2)
    for scale_a in (sa.contiguous(), sa):
        y = torch.full((sum(rows), n // 2), float("nan"), device="cuda", dtype=torch.bfloat16)
        kernel(xq, wq.transpose(1, 2), offsets, scale_a=scale_a, scale_b=scale_b, bias=bias, out={"y": y})
        torch.cuda.synchronize()
        assert kernel.last_path == "fused"
        check(y, want)
    # One N block short (the message counts G × N blocks × K blocks, as the kernel reads them).
    with pytest.raises(evtc.UserError, match=r"scale_b: shape 6×3×6 given, expected G × ceil\(N/128\) × "
                                             r"ceil\(K/128\) = 6×4×6"):
        kernel(xq, wq.transpose(1, 2), offsets, scale_a=sa, scale_b=scale_b[:, :, :3], bias=bias)
