// Grouped (MoE) GEMMs on the CPU: which graphs are refused and why, the generated source, the
// validation of a call's operands (before anything touches a GPU) and the per-group fp64
// reference.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/sm90/sm90_grouped_emitter.hpp"
#include "evtc/error.hpp"
#include "evtc/expression.hpp"
#include "evtc/grouped.hpp"

namespace evtc {
namespace {

// Asserts that `text` contains every one of `parts`, printing the text when it does not.
void expect_has(const std::string& text, std::initializer_list<const char*> parts) {
  for (const char* p : parts) EXPECT_NE(text.find(p), std::string::npos) << "'" << p << "' not in:\n" << text;
}

std::string refusal(const std::string& expr, GroupedOptions opts = {}) {
  try {
    GroupedKernel k(parse_expression(expr), opts);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(GroupedRefusals, NameTheOperandAndTheReason) {
  EXPECT_EQ(refusal("out D: bf16 = silu(acc + bias[n])"), "");
  expect_has(refusal("out D: bf16 = acc + R[m,n]"), {"operand 'R'", "Sm90AuxLoad", "GroupProblemShape"});
  expect_has(refusal("out D: bf16 = acc * s[m]"), {"operand 's[m]' is a column vector"});
  expect_has(refusal("out D: bf16 = acc + C"), {"source C"});
  expect_has(refusal("out D: bf16 = acc * (n < 8)"), {"reads the index 'n'", "dense kernels"});
  expect_has(refusal("input q[n]: i32\nout D: bf16 = acc + q[n]"), {"operand 'q[n]' is i32", "floating-point row vectors"});
  expect_has(refusal("out D: bf16 = acc; out r = row_sum(acc)"), {"output 'r' is a reduction", "Sm90ColReduction"});
  expect_has(refusal("out D: bf16 = acc; out P: bf16 = relu(acc)"), {"output 'P' is a second output"});
  expect_has(refusal("out loss = sum(acc)"), {"needs an output ([m,n], or a gated [m,n/2])"});
  // Gated epilogues: one [m,n/2] output, and nothing besides it.
  EXPECT_EQ(refusal("out y: bf16 = gptoss_swiglu(acc + bias[n])"), "");
  expect_has(refusal("out D: bf16 = acc; out y: bf16 = swiglu(acc)"), {"output 'y' is a second output", "'D'"});
  expect_has(refusal("out y: bf16 = swiglu(acc); out z: bf16 = reglu(acc)"), {"output 'z' is a second output", "'y'"});
  // fp8: both operands, K-major weights, two-level accumulation; block scales need tiles of
  // whole 128-wide scale blocks.
  GroupedOptions fp8;
  fp8.gemm.a_dtype = fp8.gemm.b_dtype = DType::f8e4m3;
  EXPECT_EQ(refusal("out D: bf16 = acc", fp8), "");
  GroupedOptions mixed = fp8;
  mixed.gemm.b_dtype = DType::bf16;
  expect_has(refusal("out D: bf16 = acc", mixed), {"grouped fp8 GEMMs take fp8 X and W (got f8e4m3 and bf16)"});
  GroupedOptions kn = fp8;
  kn.gemm.b_layout = Layout::row_major;
  expect_has(refusal("out D: bf16 = acc", kn), {"fp8 weights must be G × N × K (K-major"});
  GroupedOptions fast = fp8;
  fast.gemm.fp8_fast_accum = true;
  expect_has(refusal("out D: bf16 = acc", fast), {"no fast accumulation"});
  GroupedOptions wide = fp8;
  wide.gemm.fp8_blockwise = true;
  EXPECT_EQ(refusal("out D: bf16 = acc", wide), "");
  wide.config = default_grouped_config();  // 128×192 tiles
  expect_has(refusal("out D: bf16 = acc", wide), {"pingpong_128x192x64", "multiples of its 128-wide scale blocks"});
  GroupedOptions f16;
  f16.gemm.a_dtype = DType::f16;
  expect_has(refusal("out D: bf16 = acc", f16), {"bf16 or f16 X and W of one dtype, or fp8 X and W (got f16 and bf16)"});
  GroupedOptions promote = fp8;
  promote.config = KernelConfig::parse("coop_128x128x128_c1x1_persistent_pk256");
  expect_has(refusal("out D: bf16 = acc", promote), {"grouped kernels do not take"});
  // Every reason at once, in one message.
  expect_has(refusal("out D: bf16 = acc + R[m,n] + s[m]"), {"operand 'R'", "operand 's[m]'"});
}

TEST(GroupedEmitter, PtrArrayKernelWithPerGroupOperands) {
  GroupedKernel k(parse_expression("input s: f32 ptr; out D: bf16 = silu(acc + bias[n]) * s * alpha"));
  EXPECT_EQ(k.config().name(), default_grouped_config().name());
  const std::string src = k.source();
  expect_has(src, {"cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>"});
  expect_has(src, {"KernelPtrArrayTmaWarpSpecializedPingpong"});  // the default: ping-pong 128×192
  expect_has(src, {"PtrArrayTmaWarpSpecializedPingpong"});
  expect_has(src, {"cutlass::layout::RowMajor*"});
  // The row vector and the scalar by pointer step by their group stride; the node emission is
  // the dense emitter's (same functors).
  expect_has(src, {"Sm90RowBroadcast<0, TileShape, cutlass::bfloat16_t, float, "
                             "cute::Stride<cute::_0, cute::_1, int64_t>>"});
  expect_has(src, {"Sm90ScalarBroadcast<float, cute::Stride<cute::_0, cute::_0, int64_t>>"});
  expect_has(src, {"a.group_strides[0]"});
  expect_has(src, {"a.group_strides[1]"});
  expect_has(src, {"evtc::device::Silu"});
  expect_has(src, {"__global__ void build_group_tables"});
  expect_has(src, {"int evtc_grouped_run("});
  EXPECT_EQ(src.find("int evtc_run("), std::string::npos);  // not callable as a dense kernel

  GroupedOptions coop;
  coop.config = KernelConfig::parse("coop_128x256x64_c1x2_persistent");
  coop.gemm.b_layout = Layout::row_major;
  const std::string src2 = GroupedKernel(parse_expression("out D: bf16 = acc"), coop).source();
  expect_has(src2, {"KernelPtrArrayTmaWarpSpecializedCooperative"});
  expect_has(src2, {"PtrArrayTmaWarpSpecializedCooperative"});
  expect_has(src2, {"cute::get<1>(sb) = ldw;"});  // G×K×N weights: N-major B
}

TEST(GroupedEmitter, GatedKernelWritesHalfWidthThroughPerGroupPointers) {
  GroupedKernel k(parse_expression("out y: bf16 = gptoss_swiglu(acc + bias[n])"));
  EXPECT_TRUE(k.gated());
  EXPECT_EQ(k.output_name(), "y");
  EXPECT_EQ(k.output_dtype(), DType::bf16);
  const std::string src = k.source();
  // No D: the collective epilogue is built without it, its unused staging sized by ElementAux.
  expect_has(src, {"using ElementD = void;", "using ElementY = cutlass::bfloat16_t;",
                   "struct Callbacks : ", "using ElementAux = ElementDesc;",
                   "128 / cutlass::sizeof_bits<ElementDesc>::value",
                   "#include \"evtc/device/sm90_half_store.cuh\""});
  // The half store takes each group's output row 0 from the table built from the offsets,
  // ldy elements between rows; CUTLASS gets no D pointers.
  expect_has(src, {"evtc::device::Sm90HalfStore<cutlass::bfloat16_t,", "a.ldy, t.ptr_y}",
                   "t.ptr_y[g] = y + start * ldy;", "nullptr, nullptr},  // no D",
                   "evtc::device::PairGate", "evtc::device::PairUp",
                   "cute::Stride<cute::_0, cute::_1, int64_t>>"});
  EXPECT_EQ(src.find("t.ptr_y, t.stride_d}"), std::string::npos);
  // Not gated: D through CUTLASS's own store, no half store.
  const std::string plain = GroupedKernel(parse_expression("out D: bf16 = acc + bias[n]")).source();
  expect_has(plain, {"using ElementD = cutlass::bfloat16_t;", "t.ptr_y, t.stride_d}"});
  EXPECT_EQ(plain.find("sm90_half_store.cuh"), std::string::npos);
  EXPECT_FALSE(GroupedKernel(parse_expression("out D: bf16 = acc")).gated());
}

TEST(GroupedEmitter, BlockScaledFp8KernelReadsPerGroupScales) {
  GroupedOptions o;
  o.gemm.a_dtype = o.gemm.b_dtype = DType::f8e4m3;
  o.gemm.fp8_blockwise = true;
  GroupedKernel k(parse_expression("out y: bf16 = gptoss_swiglu(acc + bias[n])"), o);
  EXPECT_EQ(k.config().name(), default_grouped_config(o.gemm).name());
  EXPECT_EQ(k.config().tile_k, 128);
  const std::string src = k.source();
  expect_has(src, {"KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise",
                   "sm90_mma_array_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp",
                   // K adjacent in both scales: a group's A scales are a slice of rows
                   "Sm90BlockwiseScaleConfig<1, 128, 128, cute::GMMA::Major::K, cute::GMMA::Major::K>",
                   "cute::tuple<LayoutA*, LayoutSFA*>", "cute::tuple<LayoutB*, LayoutSFB*>",
                   "constexpr bool kBlockScaled = true;",
                   "t.ptr_sfa[g] = sfa + start * ((k + kScaleBlockSize - 1) / kScaleBlockSize);",
                   "t.ptr_sfb[g] = sfb + int64_t(g) * sfb_group_stride;",
                   "t.ptr_a, t.stride_a, t.ptr_b, t.stride_b, t.ptr_sfa, nullptr, t.ptr_sfb, nullptr}",
                   // scales in other strides are copied into the kernel's layout first
                   "__global__ void compact_scales(", "if (t.sfa_copy) {", "if (t.sfb_copy) {",
                   "using ElementA = cutlass::float_e4m3_t;"});
  // Not block-scaled: the same tables without scales.
  GroupedOptions plain = o;
  plain.gemm.fp8_blockwise = false;
  const std::string p = GroupedKernel(parse_expression("out D: bf16 = acc"), plain).source();
  expect_has(p, {"constexpr bool kBlockScaled = false;", "    ElementA, LayoutA*, 128 /",
                 "KernelPtrArrayTmaWarpSpecializedCooperative;"});
  EXPECT_EQ(p.find("FP8Blockwise"), std::string::npos);
}

// --- validation: every error names the operand; no GPU is touched before these checks ----

struct Call {
  int64_t groups = 4, total_m = 40, n = 64, k = 32;
  void* p = reinterpret_cast<void*>(uintptr_t(0x10000));  // never dereferenced
  GroupedArguments args() const {
    GroupedArguments a;
    a.x(TensorRef::matrix(p, DType::bf16, total_m, k))
        .weights(BatchedTensorRef::contiguous(p, DType::bf16, groups, n, k))
        .offsets(static_cast<const int32_t*>(p), groups)
        .set("bias", TensorRef::matrix(p, DType::bf16, groups, n))
        .set("D", TensorRef::matrix(p, DType::bf16, total_m, n));
    return a;
  }
};

std::string run_error(const GroupedKernel& k, const GroupedArguments& a) {
  try {
    k.run(a);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(GroupedValidation, ErrorsNameTheOperand) {
  GroupedKernel k(parse_expression("out D: bf16 = silu(acc + bias[n])"));
  Call c;
  {
    auto a = c.args();
    a.x(TensorRef::matrix(c.p, DType::f16, c.total_m, c.k));
    expect_has(run_error(k, a), {"x is f16 but the kernel was compiled for bf16"});
  }
  {
    auto a = c.args();
    a.offsets(static_cast<const int32_t*>(c.p), c.groups - 1);
    expect_has(run_error(k, a), {"offsets has 3 entries but the weights have 4 groups"});
  }
  {
    auto a = c.args();  // G×K×N weights given to a kernel built for G×N×K
    BatchedTensorRef w = BatchedTensorRef::contiguous(c.p, DType::bf16, c.groups, c.k, c.n);
    std::swap(w.rows, w.cols);
    std::swap(w.row_stride, w.col_stride);
    a.weights(w);
    expect_has(run_error(k, a), {"weights must be [G, N, K]", "K-major"});
  }
  {
    Call odd;
    odd.k = 36;
    expect_has(run_error(k, odd.args()), {"K=36 is not a multiple of 8"});
  }
  {
    auto a = c.args();
    a.weights(BatchedTensorRef::contiguous(c.p, DType::bf16, c.groups, c.n, c.k + 8));
    expect_has(run_error(k, a), {"but x has K=32 columns"});
  }
  {
    auto a = c.args();
    a.set("bias", TensorRef::matrix(c.p, DType::bf16, 3, c.n));
    expect_has(run_error(k, a), {"operand 'bias' is 3×64", "a 4×64 matrix (one row per group) or a vector of 64"});
  }
  {
    auto a = c.args();
    a.set("bias", TensorRef::matrix(c.p, DType::f32, c.groups, c.n));
    expect_has(run_error(k, a), {"operand 'bias' is f32 but the epilogue reads bf16"});
  }
  {
    auto a = c.args();
    a.set("D", TensorRef::matrix(c.p, DType::bf16, c.total_m - 1, c.n));
    expect_has(run_error(k, a), {"output 'D' must be a row-major 40×64 matrix"});
  }
  {
    auto a = c.args();
    a.set("extra", TensorRef::vector(c.p, DType::bf16, c.n));
    expect_has(run_error(k, a), {"'extra' is not an operand or output"});
  }
  {
    GroupedArguments a;
    expect_has(run_error(k, a), {"x (the token matrix) was not given"});
  }
  {
    GroupedKernel ks(parse_expression("input s: f32 ptr; out D: bf16 = acc * s"));
    auto a = c.args();
    a.set("bias", TensorRef::vector(c.p, DType::bf16, 1));
    expect_has(run_error(ks, a), {"operand 's' (f32) was not given: expected 4 values (one per group) or one"});
    a.set("s", TensorRef::vector(c.p, DType::f32, 1));
    expect_has(run_error(ks, a), {"'bias' is not an operand"});
    GroupedArguments b;
    b.x(TensorRef::matrix(c.p, DType::bf16, c.total_m, c.k))
        .weights(BatchedTensorRef::contiguous(c.p, DType::bf16, c.groups, c.n, c.k))
        .offsets(static_cast<const int32_t*>(c.p), c.groups)
        .set("s", TensorRef::vector(c.p, DType::f32, 3))
        .set("D", TensorRef::matrix(c.p, DType::bf16, c.total_m, c.n));
    expect_has(run_error(ks, b), {"operand 's' has 1×3 values: expected 4 values (one per group) or one"});
  }
}

TEST(GroupedValidation, BlockScalesAreCheckedByName) {
  GroupedOptions o;
  o.gemm.a_dtype = o.gemm.b_dtype = DType::f8e4m3;
  o.gemm.fp8_blockwise = true;
  GroupedKernel k(parse_expression("out D: bf16 = acc"), o);
  Call c;
  c.n = 256;
  c.k = 272;  // 3 K blocks, 2 N blocks
  auto args = [&] {
    GroupedArguments a;
    a.x(TensorRef::matrix(c.p, DType::f8e4m3, c.total_m, c.k))
        .weights(BatchedTensorRef::contiguous(c.p, DType::f8e4m3, c.groups, c.n, c.k))
        .offsets(static_cast<const int32_t*>(c.p), c.groups)
        .set("D", TensorRef::matrix(c.p, DType::bf16, c.total_m, c.n));
    return a;
  };
  expect_has(run_error(k, args()), {"scale_a was not given", "40×3"});
  auto a = args();
  a.scale_a(TensorRef::matrix(c.p, DType::f32, c.total_m, 3));
  expect_has(run_error(k, a), {"scale_b was not given", "4×2×3"});
  a.scale_b(BatchedTensorRef::contiguous(c.p, DType::f32, c.groups, 3, 2));  // K × N blocks: wrong
  expect_has(run_error(k, a), {"scale_b: shape 4×3×2 given, expected G × ceil(N/128) × ceil(K/128) = 4×2×3"});
  a.scale_b(BatchedTensorRef::contiguous(c.p, DType::f32, c.groups, 2, 3));
  a.scale_a(TensorRef::matrix(c.p, DType::f32, c.total_m, 2));
  expect_has(run_error(k, a), {"scale_a: shape 40×2 given, expected total_m × ceil(K/128) = 40×3"});
  a.scale_a(TensorRef::matrix(c.p, DType::bf16, c.total_m, 3));
  expect_has(run_error(k, a), {"scale_a: dtype bf16 given, block scales are f32"});
  a.scale_a(TensorRef::matrix(c.p, DType::f32, c.total_m, 3));
  a.scale_b(BatchedTensorRef::contiguous(c.p, DType::f16, c.groups, 2, 3));
  expect_has(run_error(k, a), {"scale_b: dtype f16 given, block scales are f32"});
  BatchedTensorRef backwards = BatchedTensorRef::contiguous(c.p, DType::f32, c.groups, 2, 3);
  backwards.batch_stride = -6;
  a.scale_b(backwards);
  expect_has(run_error(k, a), {"scale_a, scale_b: strides must not be negative"});
  Call odd = c;
  odd.k = 264;  // fp8 rows of 264 bytes: not 16-byte multiples
  GroupedArguments b;
  b.x(TensorRef::matrix(c.p, DType::f8e4m3, c.total_m, odd.k))
      .weights(BatchedTensorRef::contiguous(c.p, DType::f8e4m3, c.groups, c.n, odd.k))
      .offsets(static_cast<const int32_t*>(c.p), c.groups);
  expect_has(run_error(k, b), {"K=264 is not a multiple of 16 (f8e4m3 x and weights need 16-byte rows)"});
  // Scales given to a kernel without block scales.
  GroupedKernel plain(parse_expression("out D: bf16 = acc"));
  auto p = c.args();
  p.set("bias", TensorRef::matrix(c.p, DType::bf16, c.groups, c.n));
  GroupedArguments q;
  q.x(TensorRef::matrix(c.p, DType::bf16, c.total_m, c.k))
      .weights(BatchedTensorRef::contiguous(c.p, DType::bf16, c.groups, c.n, c.k))
      .offsets(static_cast<const int32_t*>(c.p), c.groups)
      .scale_a(TensorRef::matrix(c.p, DType::f32, c.total_m, 3))
      .set("D", TensorRef::matrix(c.p, DType::bf16, c.total_m, c.n));
  expect_has(run_error(plain, q), {"scale_a given, but the grouped kernel was not built for fp8 block scales"});
}

TEST(GroupedValidation, GatedOutputIsSumOfRowsByHalfN) {
  GroupedKernel k(parse_expression("out y: bf16 = gptoss_swiglu(acc + bias[n])"));
  Call c;
  auto gated_args = [&](const Call& call, int64_t y_cols) {
    GroupedArguments a;
    a.x(TensorRef::matrix(call.p, DType::bf16, call.total_m, call.k))
        .weights(BatchedTensorRef::contiguous(call.p, DType::bf16, call.groups, call.n, call.k))
        .offsets(static_cast<const int32_t*>(call.p), call.groups)
        .set("bias", TensorRef::matrix(call.p, DType::bf16, call.groups, call.n))
        .set("y", TensorRef::matrix(call.p, DType::bf16, call.total_m, y_cols));
    return a;
  };
  expect_has(run_error(k, gated_args(c, c.n)),
             {"output 'y' must be a row-major 40×32 matrix (x's rows × N/2); got 40×64"});
  {
    auto a = gated_args(c, c.n / 2);
    a.set("y", TensorRef::matrix(c.p, DType::f32, c.total_m, c.n / 2));
    expect_has(run_error(k, a), {"output 'y' is f32 but the epilogue writes bf16"});
  }
  {
    Call odd;
    odd.n = 65;
    expect_has(run_error(k, gated_args(odd, 32)), {"output 'y' is gated", "N=65 must be even"});
  }
  {
    GroupedArguments a = c.args();  // D instead of y
    expect_has(run_error(k, a), {"output 'y' (bf16[m,n/2], sum of M_g × N/2) was not given"});
    a = gated_args(c, c.n / 2);
    a.set("D", TensorRef::matrix(c.p, DType::bf16, c.total_m, c.n));
    expect_has(run_error(k, a), {"'D' is not an operand or output"});
  }
}

// --- the reference, group by group ---------------------------------------------------------

TEST(GroupedReference, EachGroupUsesItsOwnWeightsAndBias) {
  const Graph g = parse_expression("input s: f32 ptr; out D: f32 = (acc + bias[n]) * s");
  GroupedReferenceInputs in;
  in.n = 2;
  in.k = 2;
  in.rows = {1, 0, 2};  // an empty group in the middle
  in.x = {1, 2, /* group 2: */ 3, 4, 5, 6};
  in.w = {1, 0, 0, 1,  /* group 1 (no rows) */ 9, 9, 9, 9, /* group 2 */ 1, 1, 2, -1};
  in.operands["bias"] = {10, 20, 0, 0, 100, 200};
  in.operands["s"] = {1, 7, 2};
  const auto out = evaluate_grouped_reference(g, in);
  const std::vector<double> want = {
      (1 + 10) * 1.0, (2 + 20) * 1.0,                // x0 @ I
      (3 + 4 + 100) * 2.0, (2 * 3 - 4 + 200) * 2.0,  // rows of group 2: w = [[1,1],[2,-1]]
      (5 + 6 + 100) * 2.0, (2 * 5 - 6 + 200) * 2.0};
  EXPECT_EQ(out.at("D"), want);

  in.operands["bias"] = {1, 2};  // one bias for every group
  in.operands["s"] = {3};
  EXPECT_EQ(evaluate_grouped_reference(g, in).at("D")[0], (1 + 1) * 3.0);

  in.operands["bias"] = {1, 2, 3};
  EXPECT_THROW(evaluate_grouped_reference(g, in), UserError);
}

TEST(GroupedReference, BlockScalesAreEachGroupsOwn) {
  // K = 200: two K blocks; N = 2: one N block. Group 0 has one row, group 1 two.
  const Graph g = parse_expression("out D: f32 = acc");
  GroupedReferenceInputs in;
  in.n = 2;
  in.k = 200;
  in.rows = {1, 2};
  in.x.assign(3 * 200, 1.0);
  in.w.assign(2 * 2 * 200, 1.0);
  in.scale_a = {1, 2, /* group 1: */ 3, 4, 5, 6};  // rows × K blocks
  in.scale_b = {10, 100, /* group 1: */ 1, -1};    // per group: N blocks × K blocks
  const auto out = evaluate_grouped_reference(g, in).at("D");
  // Row r: 128 · sa[r][0] · sb[0] + 72 · sa[r][1] · sb[1].
  EXPECT_EQ(out[0], 128.0 * 1 * 10 + 72.0 * 2 * 100);
  EXPECT_EQ(out[2], 128.0 * 3 * 1 - 72.0 * 4);
  EXPECT_EQ(out[5], 128.0 * 5 * 1 - 72.0 * 6);
  in.scale_b.pop_back();
  EXPECT_THROW(evaluate_grouped_reference(g, in), UserError);
}

TEST(GroupedReference, GatedOutputsStackHalfWidthRows) {
  // N = 4: columns (0, 1) and (2, 3) are (gate, up) pairs; y = gate(h) * up(h), h = acc + bias.
  const Graph g = parse_expression("h = acc + bias[n]; out y: f32 = gate(h) * up(h)");
  GroupedReferenceInputs in;
  in.n = 4;
  in.k = 2;
  in.rows = {1, 0, 2};
  in.x = {1, 2, /* group 2: */ 3, 4, -1, 1};
  in.w = {1, 0, 0, 1, 1, 1, 2, 0,  /* group 1 */ 9, 9, 9, 9, 9, 9, 9, 9,
          /* group 2 */ 1, 1, 0, 1, 1, 0, -1, 2};
  in.operands["bias"] = {0, 1, 2, 3, /* group 1 */ 5, 5, 5, 5, /* group 2 */ 1, 0, 0, -1};
  const auto out = evaluate_grouped_reference(g, in);
  // group 0, x = (1, 2): acc = (1, 2, 3, 2), h = (1, 3, 5, 5) -> (1*3, 5*5)
  // group 2, x = (3, 4): acc = (7, 4, 3, 5), h = (8, 4, 3, 4) -> (32, 12)
  //          x = (-1, 1): acc = (0, 1, -1, 3), h = (1, 1, -1, 2) -> (1, -2)
  const std::vector<double> want = {3, 25, 32, 12, 1, -2};
  EXPECT_EQ(out.at("y"), want);
  in.n = 3;  // odd N: no (gate, up) pairs
  in.w.resize(3 * 3 * 2);
  in.operands["bias"].resize(9);
  EXPECT_THROW(evaluate_grouped_reference(g, in), UserError);
}

}  // namespace
}  // namespace evtc
