"""The FX pass's profitability decisions on traced graphs (fake CUDA tensors, no GPU): a chain
is fused only where evtc's cost model expects the fused kernel to beat cuBLAS plus Inductor's
epilogue kernel, and the report carries the model's numbers."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the FX pass tests need torch")

import torch.nn.functional as F  # noqa: E402

import evtc.torch  # noqa: E402
from test_fx_pass import BF16, trace  # noqa: E402


def decide(fn, *inputs):
    gm = trace(fn, *inputs)
    return evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False)


def test_a_large_epilogue_is_fused_with_its_estimate():
    report = decide(lambda x, w, b: F.silu(x @ w.t() + b), ((8192, 4096), BF16), ((4096, 4096), BF16),
                    ((4096,), BF16))
    (f,) = report.fused
    e = f.estimate
    assert e["fused_us"] < e["cublas_us"] + e["epilogue_us"]
    assert e["saved_bytes"] == 2 * 8192 * 4096 * 2 and e["basis"] == "model"
    assert "us fused vs" in report.summary()


def test_a_gemm_followed_only_by_a_view_stays_with_cublas():
    report = decide(lambda x, w: (x @ w.t()).view(8, 1024, 4096), ((8192, 4096), BF16), ((4096, 4096), BF16))
    assert not report.fused
    ((_, why),) = report.refused
    assert why.startswith("not profitable at 8192x4096x4096") and "+ 0.0 us unfused" in why


def test_decode_sized_gemms_stay_with_cublas():
    report = decide(lambda x, w: F.silu(x @ w.t()), ((64, 4096), BF16), ((11008, 4096), BF16))
    assert not report.fused and "not profitable at 64x11008x4096" in report.refused[0][1]


def test_merged_gate_and_up_are_costed_as_two_gemms_and_a_kernel():
    report = decide(lambda x, w1, w3: F.silu(x @ w1.t()) * (x @ w3.t()), ((8192, 4096), BF16),
                    ((11008, 4096), BF16), ((11008, 4096), BF16))
    (f,) = [f for f in report.fused if f.merged]
    assert f.estimate["n"] == 22016 and f.estimate["epilogue_us"] > 0


def test_profitability_can_be_switched_off():
    gm = trace(lambda x, w: F.silu(x @ w.t()), ((64, 4096), BF16), ((11008, 4096), BF16))
    report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False, profitability=False)
    assert len(report.fused) == 1 and report.fused[0].estimate == {}
