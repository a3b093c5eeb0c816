"""The evtc Python module without a GPU: parsing, explain, Kernel construction, errors."""
import os
import subprocess
import sys

import pytest

import evtc

W1 = "out D: bf16 = silu(acc + bias[n])"


def test_compile_builds_a_kernel_with_its_signature():
    k = evtc.compile(W1)
    assert [(o.name, o.dtype, o.shape, o.output) for o in k.signature] == [
        ("bias", "bf16", "row", False),
        ("D", "bf16", "full", True),
    ]
    assert [o.name for o in k.inputs] == ["bias"]
    assert [o.name for o in k.outputs] == ["D"]
    assert "silu" in k.ir
    assert len(k.hash) == 16
    assert repr(k) == f"<evtc.Kernel {k.hash} -> D: bf16>"


def test_same_graph_same_hash():
    assert evtc.compile(W1).hash == evtc.compile("f = acc + bias[n]  # comment\nout D: bf16 = silu(f)").hash
    assert evtc.compile(W1).hash != evtc.compile("out D: bf16 = gelu(acc + bias[n])").hash


def test_multiple_outputs_and_operand_kinds():
    k = evtc.compile("input s: f32 ptr\nf = acc * sa[m] + r[m,n] * s * alpha\nout pre: f32 = f\nout D = relu(f)")
    by_name = {o.name: o for o in k.signature}
    assert by_name["sa"].shape == "col"
    assert by_name["r"].shape == "full"
    assert by_name["s"].shape == "scalar" and by_name["s"].kind == "scalar"
    assert by_name["alpha"].kind == "scalar_value"
    assert by_name["pre"].output and by_name["pre"].dtype == "f32"
    assert by_name["D"].output and by_name["D"].dtype == "bf16"
    assert by_name["pre"].size(3, 5) == (3, 5)
    assert by_name["sa"].size(3, 5) == (3,)


def test_config_and_fallback_reason():
    k = evtc.compile(W1)
    assert k.config_for(4096, 4096, 4096).startswith("coop_")
    assert k.config_for(4096, 4096, 1024).startswith("pingpong_")
    assert k.fallback_reason(4096, 4096, 4096) == ""
    assert "K=1001" in k.fallback_reason(4096, 4096, 1001)
    fixed = evtc.compile(W1, config="pingpong_128x128x64_c2x1_persistent")
    assert fixed.config_for(4096, 4096, 4096) == "pingpong_128x128x64_c2x1_persistent"
    assert "disabled" in evtc.compile(W1, disable_fusion=True).fallback_reason(4096, 4096, 4096)
    # The visiting order: CUTLASS's without a GPU table or a tuned choice, else as given.
    assert k.visit_order_for(4096, 4096, 4096) == "heuristic"
    ordered = evtc.compile(W1, visit_order="along_n_s8")
    assert ordered.visit_order_for(4096, 4096, 4096) == "along_n_s8"
    assert ordered.visit_order_for(16, 4096, 4096) == "along_n_s8"
    assert ordered.config_for(4096, 4096, 4096) == k.config_for(4096, 4096, 4096)  # same kernel


def test_an_architecture_without_fused_kernels_is_named_in_the_reason(monkeypatch):
    monkeypatch.delenv("EVTC_ARCH", raising=False)
    reason = evtc.compile(W1, arch="sm75").fallback_reason(4096, 4096, 4096)
    assert "the target architecture is sm_75" in reason and "sm_80/86/89 (Ampere-class), sm_90a (Hopper)" in reason
    assert evtc.compile(W1, arch="sm_90a").fallback_reason(4096, 4096, 4096) == ""
    # The sm_80 backend: Ampere-class GPUs, and sm_120's 16-bit GEMMs; not fp8 there.
    for arch in ("sm80", "sm86", "sm89", "sm120"):
        assert evtc.compile(W1, arch=arch).fallback_reason(4096, 4096, 4096) == "", arch
    fp8 = evtc.compile(W1, arch="sm89", a_dtype="f8e4m3", b_dtype="f8e4m3")
    assert "the sm_89 backend (Ampere-class, sm_80 code) does not fuse fp8 A and B" in fp8.fallback_reason(4096, 4096, 4096)
    monkeypatch.setenv("EVTC_ARCH", "sm75")  # the environment overrides the option
    assert "sm_75" in evtc.compile(W1, arch="sm90").fallback_reason(4096, 4096, 4096)
    monkeypatch.setenv("EVTC_ARCH", "sm120")
    assert "sm_120" in evtc.grouped("out D: bf16 = silu(acc + bias[n])").shape_reason(4096, 2048)


def test_parse_error_carries_location_and_the_cpp_message():
    with pytest.raises(evtc.ParseError) as e:
        evtc.compile("out D = sigmod(acc)")
    assert (e.value.line, e.value.column) == (1, 9)
    assert "unknown function 'sigmod'; did you mean 'sigmoid'?" in str(e.value)
    assert isinstance(e.value, evtc.UserError) and isinstance(e.value, evtc.Error)


@pytest.mark.parametrize("kwargs, message", [
    ({"a_dtype": "f64"}, "a_dtype: unknown dtype 'f64'"),
    ({"b_layout": "diagonal"}, "b_layout: unknown layout 'diagonal'"),
    ({"cast_mode": "slow"}, "cast_mode: unknown mode 'slow'"),
    ({"config": "big_tiles"}, "config: 'big_tiles' is not a kernel configuration name"),
    ({"operand_dtype": "int8"}, "operand_dtype: unknown dtype 'int8'"),
    ({"arch": "volta"}, "arch: 'volta' is not a GPU architecture"),
    ({"visit_order": "along_k"}, "visit_order: 'along_k' is not a tile visiting order"),
    ({"fp8_blockwise": True}, r"fp8 block scales \(fp8_blockwise\): A is bf16 and B is bf16: block scales apply to fp8"),
    ({"fp8_blockwise": True, "a_dtype": "f8e4m3", "b_dtype": "f8e4m3",
      "config": "pingpong_128x192x128_c2x1_persistent"}, "multiples of its 128-wide scale blocks"),
])
def test_bad_options_raise_user_errors_naming_the_option(kwargs, message):
    with pytest.raises(evtc.UserError, match=message):
        evtc.compile(W1, **kwargs)


def test_graph_errors_from_the_builder_are_user_errors():
    with pytest.raises(evtc.UserError, match="operand 'bias' is used as row_vec"):
        evtc.compile("out D = acc + bias[n] + bias[m]")


def test_explain_shows_each_pass_and_the_verdict():
    x = evtc.explain("out D = silu(acc * 2 * 3)")
    assert [p.name for p in x.passes] == evtc.pass_names()
    assert x.fusable and x.reasons == []
    assert "mul" in x.parsed and "6" in x.ir
    text = str(x)
    assert text.startswith("== parsed ==")
    assert f"hash: {x.hash}" in text
    assert "(unchanged)" in text
    short = evtc.explain("out D = silu(acc)", passes=False)
    assert short.passes == [] and str(short).endswith(f"hash: {short.hash}")


def test_explain_reports_reasons_when_not_fusable():
    # Nine [m,n] outputs: one more than a fused kernel stores.
    x = evtc.explain("\n".join(f"out o{i}: bf16 = acc * {i + 1}" for i in range(9)))
    assert x.fusable is False
    assert x.reasons == ["the epilogue has 9 [m,n] outputs; at most 8 can be fused"]
    ok = evtc.explain("input r[m,n]: f8e4m3\nout D: f32 = acc + r")
    assert ok.fusable is True and ok.reasons == []


def test_parse_returns_canonical_text():
    assert evtc.parse("out D = acc").splitlines()[0] == "%0 = accum : f32[m,n]"


def test_host_arrays_are_refused_with_the_operand_named():
    np = pytest.importorskip("numpy")
    k = evtc.compile(W1)
    a = np.ones((16, 32), np.float32)
    b = np.ones((32, 8), np.float32)
    with pytest.raises(evtc.UserError, match="operand A is not on a CUDA device"):
        k(a, b, bias=np.ones(8, np.float32), out={"D": np.empty((16, 8), np.float32)})


class CudaLooking:
    """An object that says, through the DLPack protocol, that it lives in CUDA memory: the
    checks before any binding take it for a CUDA array (no GPU needed to reach them)."""

    def __dlpack__(self, **kwargs):
        raise AssertionError("not reached: the call is refused before binding")

    def __dlpack_device__(self):
        return (2, 0)


def test_outputs_must_be_given_for_non_torch_arrays():
    k = evtc.compile(W1)
    a = CudaLooking()
    with pytest.raises(evtc.UserError, match="output 'D' .* was not given"):
        k(a, a, bias=a)


def test_native_error_types_are_exported():
    assert issubclass(evtc.UserError, evtc.Error)
    assert issubclass(evtc.EvtcRuntimeError, evtc.Error)
    assert issubclass(evtc.InternalError, evtc.Error)
    assert issubclass(evtc.Error, RuntimeError)


def test_a_failed_background_compile_is_reported_not_raised(tmp_path):
    # In a new process: the toolchain (nvcc, CUTLASS) is looked up once per process, and an
    # earlier test may have found the real CUTLASS headers already.
    script = """
import evtc, sys
k = evtc.compile("out D: bf16 = relu(acc) * 3")
try:
    k.compile_async(256, 256, 256).result()
    sys.exit("compiled without CUTLASS headers")
except evtc.Error:
    pass
errors = k._wait_for_compiles()
assert len(errors) == 1 and "no CUTLASS headers" in errors[0], errors
"""
    env = dict(os.environ, EVTC_CUTLASS_DIR=str(tmp_path / "no-cutlass-here"), EVTC_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_gated_output_is_half_width():
    k = evtc.compile("h = acc + bias[n]\nout pre = h\nout y: bf16 = swiglu7(h)")
    by_name = {o.name: o for o in k.signature}
    assert by_name["y"].shape == "half" and by_name["y"].output
    assert by_name["pre"].shape == "full"
    assert by_name["y"].size(6, 10) == (6, 5)


def test_gated_value_with_row_vector_is_a_user_error():
    with pytest.raises(evtc.UserError, match=r"is a gated \[m,n/2\] value but 'b\[n\]' is \[n\]"):
        evtc.compile("out y = swiglu(acc) * b[n]")


def test_interleave_pairs_puts_gate_j_at_2j_and_up_j_at_2j_plus_1_along_any_dimension():
    torch = pytest.importorskip("torch")
    from evtc._gated import interleave_pairs

    g, u = torch.randn(3, 4, 5), torch.randn(3, 4, 5)
    for dim in (0, 1, 2, -1):
        out = interleave_pairs(g, u, dim)
        d = dim % 3
        assert out.is_contiguous() and out.shape[d] == 2 * g.shape[d]
        assert torch.equal(out.narrow(d, 0, 1), g.narrow(d, 0, 1))
        assert torch.equal(out.index_select(d, torch.arange(0, 2 * g.shape[d], 2)), g)
        assert torch.equal(out.index_select(d, torch.arange(1, 2 * g.shape[d], 2)), u)
    # It is the op library's op (one spelling of the layout): fake tensors take it, and halves of
    # different shapes are refused with both shapes named.
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        assert torch.ops.evtc.interleave_pairs(torch.empty(4, 6), torch.empty(4, 6), 0).shape == (8, 6)
    with pytest.raises(RuntimeError, match=r"gate has shape \[3, 4, 5\] and up \[3, 4, 4\]"):
        interleave_pairs(g, u[..., :4], 1)


def test_interleave_gate_up_round_trips():
    torch = pytest.importorskip("torch")
    w = torch.arange(24.0).reshape(6, 4)  # 2I = 6 Linear features of K = 4
    inter = evtc.interleave_gate_up(w)
    assert inter[0].tolist() == w[0].tolist() and inter[1].tolist() == w[3].tolist()
    assert inter[5].tolist() == w[5].tolist()
    assert torch.equal(evtc.deinterleave_gate_up(inter), w)
    cols = evtc.interleave_gate_up(w.t().contiguous(), dim=1)
    assert torch.equal(cols, inter.t())
    with pytest.raises(ValueError, match="gate and up need the same number"):
        evtc.interleave_gate_up(torch.zeros(5, 4))
    with pytest.raises(ValueError, match=r"takes a 2-D weight, got shape \[2, 3, 4\]"):
        evtc.interleave_gate_up(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="dim must be 0 or 1, got 2"):
        evtc.interleave_gate_up(w, dim=2)
    # evtc's own error types, naming what is wrong, in both directions
    with pytest.raises(evtc.ArgumentTypeError, match="interleave_gate_up takes a torch.Tensor, got list"):
        evtc.interleave_gate_up([[1.0]])
    with pytest.raises(evtc.ArgumentTypeError, match="dim: expected 0 or 1, got str '0'"):
        evtc.interleave_gate_up(w, dim="0")
    with pytest.raises(evtc.UserError, match=r"deinterleave_gate_up takes a 2-D weight, got shape \[6\]"):
        evtc.deinterleave_gate_up(torch.zeros(6))
    with pytest.raises(evtc.UserError, match="the interleaved weight has 5 features along dim 0"):
        evtc.deinterleave_gate_up(torch.zeros(5, 4))
    with pytest.raises(TypeError, match="takes a torch.Tensor, got list"):
        evtc.interleave_gate_up([[1.0, 2.0]])


def test_grouped_kernel_describes_its_gated_output():
    k = evtc.grouped("out y: bf16 = swiglu(acc + bias[n])")
    assert k.gated and k.output.name == "y" and k.output.shape == "half"
    assert [(o.name, o.shape) for o in k.inputs] == [("bias", "row")]
    assert k.output_size(10, 64) == (10, 32)
    # The grouped (pointer-array) CUTLASS kernel, with evtc's half-width store writing y.
    assert "KernelPtrArrayTmaWarpSpecialized" in k.source
    assert "Sm90HalfStore" in k.source
    assert repr(k) == f"<evtc.GroupedKernel {k.hash} -> y: bf16[m,n/2]>"
    plain = evtc.grouped("out D: f16 = silu(acc)", dtype="f16", weights="kn")
    assert not plain.gated and plain.output_size(10, 64) == (10, 64)


def test_grouped_kernel_refusals_name_the_operand():
    with pytest.raises(evtc.UserError, match="operand 'a' is a full \\[m,n\\] operand"):
        evtc.grouped("out D: bf16 = acc * a[m,n]")
    with pytest.raises(evtc.UserError, match="weights: 'mk' is not a weight layout"):
        evtc.grouped("out D: bf16 = acc", weights="mk")


def test_grouped_fp8_and_block_scaled_kernels():
    k = evtc.grouped("input bias[n]: bf16\nout y: bf16 = gptoss_swiglu(acc + bias[n])", dtype="f8e4m3",
                     fp8_blockwise=True)
    assert k.config == "coop_128x128x128_c1x1_persistent"
    assert "KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise" in k.source
    # Undeclared operands of an fp8 kernel are f32, as for evtc.compile's fp8 kernels.
    plain = evtc.grouped("out D: bf16 = acc * s", dtype="f8e4m3")
    assert [(o.name, o.dtype) for o in plain.inputs] == [("s", "f32")]
    assert "FP8Blockwise" not in plain.source
    with pytest.raises(evtc.UserError, match=r"fp8 weights must be G × N × K \(K-major"):
        evtc.grouped("out D: bf16 = acc", dtype="f8e4m3", weights="kn")
    with pytest.raises(evtc.UserError, match="block scales apply to fp8 operands"):
        evtc.grouped("out D: bf16 = acc", fp8_blockwise=True)
    with pytest.raises(evtc.UserError, match="multiples of its 128-wide scale blocks"):
        evtc.grouped("out D: bf16 = acc", dtype="f8e4m3", fp8_blockwise=True,
                     config="pingpong_128x192x64_c1x1_persistent")
    torch = pytest.importorskip("torch")
    x = torch.zeros(4, 128, dtype=torch.float8_e4m3fn)
    with pytest.raises(evtc.UserError, match=r"scale_b has shape \[2, 1\]: expected G × ceil\(K/128\) × "
                                             r"ceil\(N/128\)"):
        k(x, torch.zeros(1, 128, 256, dtype=torch.float8_e4m3fn), torch.tensor([4], dtype=torch.int32),
          scale_a=torch.ones(4, 1), scale_b=torch.ones(2, 1), bias=torch.zeros(256, dtype=torch.bfloat16))


def test_grouped_kernel_argument_errors_name_what_is_wrong():
    o = evtc._evtc.KernelOptions()
    o.a_layout = "col"
    with pytest.raises(evtc.UserError, match="a_layout: a grouped kernel's token matrix x must be row-major"):
        evtc._evtc.GroupedKernel("out D: bf16 = acc", o)
    np = pytest.importorskip("numpy")
    k = evtc.grouped("out y: bf16 = swiglu(acc)")
    x, w, offs = np.zeros((4, 8), np.float16), np.zeros((1, 8, 16), np.float16), np.array([4], np.int32)
    with pytest.raises(evtc.UserError, match=r"x is not on a CUDA device \(DLPack device type 1\)"):
        k(x, w, offs)
    cuda = CudaLooking()
    with pytest.raises(evtc.UserError, match=r"output 'y' was not given: pass out=\{'y': array\}"):
        k(cuda, cuda, cuda)


def test_grouped_kernel_checks_torch_operands_before_running():
    torch = pytest.importorskip("torch")
    k = evtc.grouped("out y: bf16 = swiglu(acc)")
    x = torch.zeros(4, 8, dtype=torch.bfloat16)
    with pytest.raises(evtc.UserError, match=r"w has shape \[8, 16\]: expected G × K × N \(3 dimensions\)"):
        k(x, torch.zeros(8, 16, dtype=torch.bfloat16), torch.tensor([4], dtype=torch.int32))


def test_torch_tensors_off_the_gpu_are_named():
    torch = pytest.importorskip("torch")
    k = evtc.compile("out D: bf16 = silu(acc)")
    with pytest.raises(evtc.UserError, match="operand A is not on a CUDA device"):
        k(torch.randn(8, 8).bfloat16(), torch.randn(8, 8).bfloat16().t())
    g = evtc.grouped("out y: bf16 = silu(acc)")
    with pytest.raises(evtc.UserError, match="operand x is not on a CUDA device"):
        g(torch.randn(8, 8).bfloat16(), torch.randn(2, 8, 8).bfloat16(), torch.tensor([4, 8], dtype=torch.int32))


def test_block_scaled_kernel_describes_itself_and_refuses_scales_elsewhere():
    k = evtc.compile("out D: bf16 = gelu(acc + bias[n])", a_dtype="f8e4m3", b_dtype="f8e4m3", fp8_blockwise=True)
    assert k.config_for(4096, 7168, 2048) == "coop_128x128x128_c1x1_persistent"
    assert [o.name for o in k.inputs] == ["bias"]  # the scales are the GEMM's, not the epilogue's


def test_the_package_source_compiles_without_warnings():
    """Every module of the installed package compiles with warnings as errors: a docstring's
    invalid escape sequence, say, is a SyntaxWarning at import on Python 3.12."""
    import pathlib
    import warnings

    root = pathlib.Path(evtc.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert files
    for path in files:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            compile(path.read_text(encoding="utf-8"), str(path), "exec")
