"""The FX pass's profitability decisions on traced graphs (fake CUDA tensors, no GPU): a chain
is fused only where evtc's cost model expects the fused kernel to beat cuBLAS plus Inductor's
epilogue kernel, and the report carries the model's numbers."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the FX pass tests need torch")

import torch.nn.functional as F  # noqa: E402

import evtc.torch  # noqa: E402
from evtc import _evtc  # noqa: E402
from evtc.torch import inductor_config  # noqa: E402
from test_fx_pass import BF16, trace  # noqa: E402


# Without a GPU the cost model prices an H200 (4.3 TB/s) by its model alone: tables apply only to
# a device that is present. On a GPU machine it prices that device, whose numbers and table differ.
DEFAULT_DEVICE = not torch.cuda.is_available()


def decide(fn, *inputs):
    gm = trace(fn, *inputs)
    return evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False)


def test_a_large_epilogue_is_fused_with_its_estimate():
    report = decide(lambda x, w, b: F.silu(x @ w.t() + b), ((8192, 4096), BF16), ((4096, 4096), BF16),
                    ((4096,), BF16))
    (f,) = report.fused
    e = f.estimate
    assert e["fused_us"] < e["cublas_us"] + e["epilogue_us"]
    assert e["saved_bytes"] == 2 * 8192 * 4096 * 2
    assert e["basis"] == "model" or (not DEFAULT_DEVICE and e["basis"].startswith("table "))
    assert "us fused vs" in report.summary()


def test_a_gemm_followed_only_by_a_view_stays_with_cublas():
    report = decide(lambda x, w: (x @ w.t()).view(8, 1024, 4096), ((8192, 4096), BF16), ((4096, 4096), BF16))
    assert not report.fused
    ((_, why),) = report.refused
    assert why.startswith("nothing to fuse: the mm result feeds no epilogue op, and at 8192x4096x4096 ")
    assert "+ 0.0 us unfused" in why


# A GEMM with nothing to fuse (its result only viewed) leaves cuBLAS only on an estimate anchored
# to the selection table's measurement of both kernels, which needs the GPU the table is for.
BARE_SHAPES = (((16, 4096), BF16), ((4096, 4096), BF16))


def bare_mm(x, w):
    return (x @ w.t()).view(1, 16, 4096)


@pytest.mark.skipif(not DEFAULT_DEVICE, reason="on a GPU the selection table may measure the shape")
def test_a_bare_gemm_priced_by_the_model_alone_stays_with_cublas():
    report = decide(bare_mm, *BARE_SHAPES)
    assert not report.fused
    ((_, why),) = report.refused
    assert why.startswith("nothing to fuse: the mm result feeds no epilogue op, and at 16x4096x4096 no measurement")
    assert "(model, " in why and "selection table's measurements" in why


class MeasuredEstimate:
    """What the native estimate reports where the selection table measured evtc's kernel at
    ``fused_us`` and cuBLAS's at ``cublas_us`` (a GPU with a table; faked here)."""

    def __init__(self, fused_us: float, cublas_us: float, measured: bool = True):
        self.fused_us, self.cublas_us, self.epilogue_us, self.saved_bytes = fused_us, cublas_us, 0.0, 0.0
        self.config, self.measured = "pingpong_64x16x256_c1x1_persistent_swap", measured
        self.basis = "table h200-bf16.json at 16x4096x4096" if measured else "model"
        self.profitable = fused_us < cublas_us - max(0.5, 0.03 * cublas_us)  # FusionEstimate::profitable's rule

    def describe(self) -> str:
        return f"{self.fused_us:.1f} us fused vs {self.cublas_us:.1f} + 0.0 us unfused ({self.basis}, {self.config})"


@pytest.fixture
def measured(monkeypatch):
    """Makes every kernel's estimate the given MeasuredEstimate."""
    from evtc.torch import _op

    def use(estimate: MeasuredEstimate):
        real = _op.spec_kernel

        def spec_kernel(spec):
            kernel, *rest = real(spec)
            native = kernel._native

            class Native:
                def __getattr__(self, name):
                    return getattr(native, name)

                def estimate(self, *args):
                    return estimate

            class Kernel:
                def __getattr__(self, name):
                    return getattr(kernel, name)

                _native = Native()

            return (Kernel(), *rest)

        monkeypatch.setattr(_op, "spec_kernel", spec_kernel)
    return use


def test_a_bare_gemm_measured_faster_than_cublas_runs_in_evtcs_kernel(measured):
    measured(MeasuredEstimate(13.9, 15.2))
    gm = trace(bare_mm, *BARE_SHAPES)
    report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False)
    (f,) = report.fused
    assert "bf16(acc)" in f.expr and "out D: bf16" in f.expr, f.expr
    assert f.estimate["replaces_cublas"] and f.estimate["basis"].startswith("table ")
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.mm.default not in targets and torch.ops.evtc.gemm_epilogue.default in targets
    assert "13.9 us fused vs 15.2 + 0.0 us unfused (table h200-bf16.json" in report.summary()


@pytest.mark.parametrize("estimate, why", [
    (MeasuredEstimate(14.9, 15.2), "at 16x4096x4096 evtc's kernel is not faster than cuBLAS's by the model's margin"),
    (MeasuredEstimate(10.0, 15.2, measured=False), "at 16x4096x4096 no measurement says"),
])
def test_a_bare_gemm_needs_a_measured_margin(measured, estimate, why):
    measured(estimate)
    report = decide(bare_mm, *BARE_SHAPES)
    assert not report.fused
    ((_, reason),) = report.refused
    assert reason.startswith("nothing to fuse: the mm result feeds no epilogue op, and ") and why in reason, reason


def test_bare_gemms_can_be_left_to_cublas(measured):
    measured(MeasuredEstimate(13.9, 15.2))
    report = evtc.torch.fuse_gemm_epilogues(trace(bare_mm, *BARE_SHAPES).graph, compile=False, bare_gemms=False)
    assert not report.fused
    assert report.refused[0][1] == "nothing to fuse: the mm result feeds no epilogue op (evtc.bare_gemms is off)"
    assert inductor_config(None, {"evtc.bare_gemms": False})["post_grad_custom_post_pass"].bare_gemms is False
    with pytest.raises(RuntimeError, match="evtc.bare_gemms='no'"):
        inductor_config(None, {"evtc.bare_gemms": "no"})


def test_a_bare_gemm_of_symbolic_size_stays_with_cublas(measured, monkeypatch):
    from evtc.torch.passes import profitability

    measured(MeasuredEstimate(13.9, 15.2))
    # A graph traced with dynamic shapes (its sizes symbols; _fusion.is_static says which).
    monkeypatch.setattr(profitability, "is_static", lambda chain: False)
    gm = trace(lambda x, w: x @ w.t(), *BARE_SHAPES)
    report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False)
    assert not report.fused
    assert "at symbolic sizes no measurement says" in report.refused[0][1], report.summary()


def test_with_profitability_off_a_lone_mm_is_still_not_a_fusion():
    report = evtc.torch.fuse_gemm_epilogues(trace(lambda x, w: x @ w.t(), *BARE_SHAPES).graph, compile=False,
                                            profitability=False)
    assert not report.fused and report.refused[0][1] == "nothing to fuse: the mm result feeds no epilogue op"


@pytest.mark.skipif(not DEFAULT_DEVICE, reason="on a GPU with a table, its measurement prices the shape")
def test_decode_sized_gemms_stay_with_cublas():
    report = decide(lambda x, w: F.silu(x @ w.t()), ((64, 4096), BF16), ((11008, 4096), BF16))
    assert not report.fused and "not profitable at 64x11008x4096" in report.refused[0][1]


def test_merged_gate_and_up_are_costed_as_two_gemms_and_a_kernel():
    # LLaMA-2 hidden 2048 / FFN 5632, and hidden 4096 / FFN 11008, where the gain is smaller:
    # unfused, two GEMMs of half the width run (each with its own launch and tile grid) and
    # the SwiGLU kernel; the model puts the merged kernel 3.3 % ahead there, and with it fused
    # the LLaMA MLP block ran 1.016x plain compile (bench/results/
    # 20261124-2351-h200-models-profitability-off.json).
    report = decide(lambda x, w1, w3: F.silu(x @ w1.t()) * (x @ w3.t()), ((8192, 2048), BF16),
                    ((5632, 2048), BF16), ((5632, 2048), BF16))
    (f,) = [f for f in report.fused if f.merged]
    assert f.estimate["n"] == 11264 and f.estimate["epilogue_us"] > 0
    big = decide(lambda x, w1, w3: F.silu(x @ w1.t()) * (x @ w3.t()), ((8192, 4096), BF16),
                 ((11008, 4096), BF16), ((11008, 4096), BF16))
    (f,) = [f for f in big.fused if f.merged]
    e = f.estimate
    assert e["n"] == 22016 and e["fused_us"] < e["cublas_us"] + e["epilogue_us"]
    # Two GEMMs over halves of N cost more than one over all of it (two launches, two grids).
    kernel = evtc.compile("out y: bf16 = swiglu(acc)", b_layout="col")
    work = _evtc.UnfusedWork()
    halves = kernel._native.estimate(8192, 22016, 4096, work)
    work.gemms = 2
    assert kernel._native.estimate(8192, 22016, 4096, work).cublas_us > halves.cublas_us + 3.0


@pytest.mark.skipif(not DEFAULT_DEVICE, reason="on a GPU with a table, its measurement prices the shape")
def test_profitability_can_be_switched_off():
    def f(x, w):
        return F.silu(x @ w.t())
    shapes = ((64, 4096), BF16), ((11008, 4096), BF16)
    refused = evtc.torch.fuse_gemm_epilogues(trace(f, *shapes).graph, compile=False)
    assert not refused.fused and "not profitable at 64x11008x4096" in refused.refused[0][1]
    # Switched off, the fusion is made, and the model's numbers are still reported.
    report = evtc.torch.fuse_gemm_epilogues(trace(f, *shapes).graph, compile=False, profitability=False)
    assert len(report.fused) == 1
    e = report.fused[0].estimate
    assert (e["m"], e["n"], e["k"]) == (64, 11008, 4096)
    assert e["fused_us"] > 0 and e["cublas_us"] > 0


def _rms(h):
    return h * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(h.dtype)


def test_a_residual_read_by_a_norm_and_kept_saves_one_pass_and_no_kernel():
    # Unfused, Inductor adds the residual inside the norm's kernel, which writes h too (it is
    # returned): fusion saves reading the GEMM's result back (64 MiB: 15.6 us at 4.3 TB/s),
    # not a kernel, which is less than the model's margin at this shape.
    def block(x, w, r):
        h = x @ w.t() + r
        return h, _rms(h)

    report = decide(block, ((8192, 4096), BF16), ((4096, 4096), BF16), ((8192, 4096), BF16))
    assert not report.fused
    ((_, why),) = report.refused
    assert "inside the kernel of" in why
    assert ("+ 15.6 us unfused" if DEFAULT_DEVICE else "us unfused") in why


def test_an_epilogue_read_by_one_kernel_inductor_makes_is_not_fused():
    # silu(acc) read only by a flip: Inductor computes the silu inside the flip's kernel, so
    # fusing saves nothing and evtc's GEMM is not faster than cuBLAS's.
    report = decide(lambda x, w: torch.flip(F.silu(x @ w.t()), [-1]), ((8192, 4096), BF16), ((4096, 4096), BF16))
    assert not report.fused, report.summary()
    (why,) = [why for _, why in report.refused if "not profitable" in why]
    assert "+ 0.0 us unfused" in why and "inside the kernel of" in why


def test_an_epilogue_read_by_a_library_kernel_keeps_its_own_kernel():
    # silu(x @ w1) feeds another GEMM: unfused, it needs a kernel of its own.
    report = decide(lambda x, w1, w2: F.silu(x @ w1.t()) @ w2.t(), ((8192, 4096), BF16), ((4096, 4096), BF16),
                    ((4096, 4096), BF16))
    (f,) = report.fused
    assert "folded_into" not in f.estimate and f.estimate["saved_bytes"] == 2 * 8192 * 4096 * 2


def test_merged_gate_and_up_save_reading_both_halves_and_writing_the_product():
    report = decide(lambda x, w1, w3, w2: (F.silu(x @ w1.t()) * (x @ w3.t())) @ w2.t(), ((8192, 2048), BF16),
                    ((5632, 2048), BF16), ((5632, 2048), BF16), ((2048, 5632), BF16))
    (f,) = [f for f in report.fused if f.merged]
    assert f.estimate["saved_bytes"] == 8192 * 11264 * 2 + 8192 * 5632 * 2


def test_an_epilogue_of_its_own_reads_its_matrix_operands_unfused():
    # r[m,n] read by the chain whose value feeds another GEMM: unfused, Inductor's kernel reads
    # the GEMM's result and r and writes the value.
    report = decide(lambda x, w1, r, w2: (F.silu(x @ w1.t()) * r) @ w2.t(), ((8192, 4096), BF16),
                    ((4096, 4096), BF16), ((8192, 4096), BF16), ((4096, 4096), BF16))
    (f,) = report.fused
    assert f.estimate["saved_bytes"] == 3 * 8192 * 4096 * 2
