// Grouped (MoE) GEMMs on the GPU: random group sizes (empty groups and sizes that are not
// tile multiples included) for G = 1, 8 and 64, per-group and shared operands, both weight
// layouts, gated epilogues (N -> N/2 per group), compared group by group with the fp64
// reference on poisoned outputs; and CUDA-graph capture, replayed after the device offsets
// changed.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "evtc/expression.hpp"
#include "evtc/grouped.hpp"
#include "testing/grouped_harness.hpp"

namespace evtc {
namespace {

const char* kBiasSilu = "out D: bf16 = silu(acc + bias[n])";
const char* kGated = "out y: bf16 = gptoss_swiglu(acc + bias[n])";  // W6's epilogue
const char* kScalars = "input s: f32 ptr; input bias[n]: f32; out D: bf16 = gelu(acc + bias[n]) * s * alpha";

void cuda_ok(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

std::vector<int64_t> random_rows(size_t groups, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> rows(groups);
  for (auto& r : rows) r = rng() % 5 == 0 ? 0 : int64_t(rng() % 300);
  return rows;
}

int64_t total(const std::vector<int64_t>& rows) { return std::accumulate(rows.begin(), rows.end(), int64_t(0)); }

void expect_matches(const GroupedKernel& kernel, const std::vector<int64_t>& rows, int64_t n, int64_t k,
                    uint64_t seed, const std::map<std::string, double>& scalars = {}) {
  auto inputs = runtime::random_grouped_inputs(kernel, rows, n, k, seed, scalars);
  runtime::GroupedDeviceProblem problem(kernel, inputs, total(rows) + 17, scalars);
  problem.poison_output(nullptr);
  kernel.run(problem.arguments(), nullptr);
  const auto got = problem.read_output(total(rows), nullptr);
  const auto cmp = runtime::check_grouped_output(kernel, got, evaluate_grouped_reference(kernel.graph(), inputs));
  EXPECT_TRUE(cmp.pass) << "G=" << rows.size() << " total M=" << total(rows) << ": " << cmp.describe();
}

GroupedKernel& bias_silu() {
  static GroupedKernel k(parse_expression(kBiasSilu));
  return k;
}

TEST(GroupedGemm, RandomGroupSizesMatchReference) {
  expect_matches(bias_silu(), {237}, 384, 264, 1);
  expect_matches(bias_silu(), {0, 5, 128, 300, 0, 1, 129, 77}, 384, 264, 2);  // empty first group
  expect_matches(bias_silu(), random_rows(8, 3), 512, 128, 3);
  expect_matches(bias_silu(), random_rows(64, 4), 384, 264, 4);
  expect_matches(bias_silu(), {0, 0, 0, 0}, 256, 64, 5);  // nothing to do
}

TEST(GroupedGemm, GatedRandomGroupSizesMatchReference) {
  // Group g's N/2 gated columns land at rows offsets[g-1].. of the (sum M_g) × N/2 output;
  // the poisoned rows past the groups (capacity = total + 17) must stay untouched by the
  // per-group pointers, and every written row is checked.
  static GroupedKernel k(parse_expression(kGated));
  ASSERT_TRUE(k.gated());
  expect_matches(k, {237}, 384, 264, 21);
  expect_matches(k, {0, 5, 128, 300, 0, 1, 129, 77}, 384, 264, 22);
  expect_matches(k, random_rows(8, 23), 512, 128, 23);
  expect_matches(k, random_rows(64, 24), 272, 136, 24);
  // Larger activations, so the clamp at 7 and the gate's min(., 7) are reached.
  auto rows = random_rows(8, 25);
  auto in = runtime::random_grouped_inputs(k, rows, 256, 64, 25);
  for (double& b : in.operands["bias"]) b = std::round(b * 8.0);  // exact in bf16
  runtime::GroupedDeviceProblem problem(k, in, total(rows) + 5);
  problem.poison_output(nullptr);
  k.run(problem.arguments(), nullptr);
  const auto got = problem.read_output(total(rows) + 5, nullptr);
  const auto want = evaluate_grouped_reference(k.graph(), in);
  const std::vector<double> written(got.begin(), got.begin() + total(rows) * 128);
  const auto cmp = runtime::check_grouped_output(k, written, want);
  EXPECT_TRUE(cmp.pass) << cmp.describe();
  for (size_t i = size_t(total(rows) * 128); i < got.size(); ++i)
    ASSERT_TRUE(std::isnan(got[i])) << "row " << i / 128 << " past the groups was written";
}

TEST(GroupedGemm, PerGroupScalarsAndF32BiasPingpong) {
  GroupedOptions opts;
  opts.config = KernelConfig::parse("pingpong_128x128x64_c1x2_persistent");
  GroupedKernel k(parse_expression(kScalars), opts);
  expect_matches(k, random_rows(8, 6), 392, 136, 6, {{"alpha", -0.75}});
  expect_matches(k, {130}, 392, 136, 7, {{"alpha", 2.0}});
}

TEST(GroupedGemm, SharedBiasAndScalar) {
  // A length-N bias and a single scalar read by every group (group stride 0).
  GroupedOptions opts;
  opts.config = KernelConfig::parse("pingpong_128x128x64_c1x2_persistent");
  GroupedKernel k(parse_expression(kScalars), opts);
  const std::vector<int64_t> rows = {50, 0, 200};
  auto in = runtime::random_grouped_inputs(k, rows, 136, 72, 8, {{"alpha", 1.0}});
  in.operands["bias"].resize(136);
  in.operands["s"].resize(1);
  runtime::GroupedDeviceProblem problem(k, in, total(rows), {{"alpha", 1.0}});
  auto args = problem.arguments();
  const TensorRef bias = args.tensors().at("bias"), s = args.tensors().at("s");
  args.set("bias", TensorRef::vector(bias.data, DType::f32, 136)).set("s", TensorRef::vector(s.data, DType::f32, 1));
  problem.poison_output(nullptr);
  k.run(args, nullptr);
  const auto cmp = runtime::check_grouped_output(k, problem.read_output(total(rows), nullptr),
                                                 evaluate_grouped_reference(k.graph(), in));
  EXPECT_TRUE(cmp.pass) << cmp.describe();
}

TEST(GroupedGemm, KxNWeights) {
  GroupedOptions opts;
  opts.gemm.b_layout = Layout::row_major;  // G × K × N
  GroupedKernel k(parse_expression(kBiasSilu), opts);
  const std::vector<int64_t> rows = random_rows(8, 9);
  auto in = runtime::random_grouped_inputs(k, rows, 264, 200, 9);
  // The harness uploads G × N × K; give the kernel the same weights as G × K × N.
  auto kn = in;
  for (size_t g = 0; g < rows.size(); ++g)
    for (int64_t j = 0; j < 264; ++j)
      for (int64_t kk = 0; kk < 200; ++kk) kn.w[(g * 200 + kk) * 264 + j] = in.w[(g * 264 + j) * 200 + kk];
  runtime::GroupedDeviceProblem problem(k, kn, total(rows));
  auto args = problem.arguments();
  BatchedTensorRef w = *args.weights();
  args.weights(BatchedTensorRef::contiguous(w.data, DType::bf16, int64_t(rows.size()), 200, 264));
  problem.poison_output(nullptr);
  k.run(args, nullptr);
  const auto cmp = runtime::check_grouped_output(k, problem.read_output(total(rows), nullptr),
                                                 evaluate_grouped_reference(k.graph(), in));
  EXPECT_TRUE(cmp.pass) << cmp.describe();
}

GroupedOptions fp8_options(bool blockwise) {
  GroupedOptions o;
  o.gemm.a_dtype = o.gemm.b_dtype = DType::f8e4m3;
  o.gemm.fp8_blockwise = blockwise;
  return o;
}

// Block-scaled fp8 (DeepSeek-V3's format) per group: N and K that are not multiples of the
// 128-wide scale blocks (partial last blocks), empty groups, and group sizes that are not tile
// multiples. The harness gives scale_a with M adjacent, which the kernel copies into its
// row-major layout first; the second run gives it row-major, read in place.
TEST(GroupedGemm, BlockScaledFp8MatchesReference) {
  static GroupedKernel k(parse_expression("input bias[n]: bf16; out y: bf16 = gptoss_swiglu(acc + bias[n])"),
                         fp8_options(true));
  expect_matches(k, {0, 5, 128, 300, 0, 1, 129, 77}, 264, 400, 31);
  expect_matches(k, random_rows(16, 32), 384, 272, 32);
  const std::vector<int64_t> rows = random_rows(8, 33);
  const int64_t n = 392, kk = 656, kb = fp8_scale_blocks(kk);
  auto in = runtime::random_grouped_inputs(k, rows, n, kk, 33);
  runtime::GroupedDeviceProblem problem(k, in, total(rows));
  runtime::DeviceBuffer sa(in.scale_a.size() * sizeof(float));
  const std::vector<float> sa32(in.scale_a.begin(), in.scale_a.end());
  cuda_ok(cudaMemcpy(sa.get(), sa32.data(), sa.bytes(), cudaMemcpyHostToDevice));
  GroupedArguments args = problem.arguments();
  args.scale_a(TensorRef::matrix(sa.get(), DType::f32, total(rows), kb));
  problem.poison_output(nullptr);
  EXPECT_EQ(k.run(args, nullptr), ExecutionPath::fused);
  const auto cmp = runtime::check_grouped_output(k, problem.read_output(total(rows), nullptr),
                                                 evaluate_grouped_reference(k.graph(), in));
  EXPECT_TRUE(cmp.pass) << "row-major scale_a: " << cmp.describe();
}

// The same problem on the unfused path (arch sm80: cuBLASLt on the scaled operands + the plain
// epilogue, group by group), and fp8 without block scales (two-level accumulation, a per-group
// scale by pointer).
TEST(GroupedGemm, BlockScaledFp8UnfusedAndPlainFp8) {
  GroupedOptions unfused_opts = fp8_options(true);
  unfused_opts.arch = 80;
  GroupedKernel unfused(parse_expression("input bias[n]: bf16; out y: bf16 = gptoss_swiglu(acc + bias[n])"),
                        unfused_opts);
  auto rows = std::vector<int64_t>{0, 5, 128, 300, 0, 1, 129, 77};
  auto in = runtime::random_grouped_inputs(unfused, rows, 264, 400, 31);
  runtime::GroupedDeviceProblem problem(unfused, in, total(rows));
  problem.poison_output(nullptr);
  EXPECT_EQ(unfused.run(problem.arguments(), nullptr), ExecutionPath::fallback);
  auto cmp = runtime::check_grouped_output(unfused, problem.read_output(total(rows), nullptr),
                                           evaluate_grouped_reference(unfused.graph(), in));
  EXPECT_TRUE(cmp.pass) << "unfused: " << cmp.describe();

  GroupedKernel plain(parse_expression("input s: f32 ptr; out D: bf16 = silu(acc * s)"), fp8_options(false));
  expect_matches(plain, random_rows(8, 34), 392, 272, 34);
}

TEST(GroupedGemm, CudaGraphReplaysWithChangedOffsets) {
  GroupedKernel& k = bias_silu();
  const std::vector<int64_t> first = {100, 0, 300, 37, 250, 1, 0, 200};
  const std::vector<int64_t> second = {0, 400, 3, 3, 129, 0, 300, 50};  // same capacity
  ASSERT_LE(total(second), total(first));
  const int64_t n = 256, kk = 128;
  auto in = runtime::random_grouped_inputs(k, first, n, kk, 10);
  runtime::GroupedDeviceProblem problem(k, in, total(first));
  cudaStream_t stream;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  k.run(problem.arguments(), stream);
  cuda_ok(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0));

  for (const auto& rows : {first, second, first}) {
    problem.set_rows(rows, stream);
    problem.poison_output(stream);
    cuda_ok(cudaGraphLaunch(exec, stream));
    const auto got = problem.read_output(total(rows), stream);
    GroupedReferenceInputs now = in;
    now.rows = rows;
    now.x.resize(size_t(total(rows) * kk));
    const auto cmp = runtime::check_grouped_output(k, got, evaluate_grouped_reference(k.graph(), now));
    EXPECT_TRUE(cmp.pass) << "replay with total M=" << total(rows) << ": " << cmp.describe();
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace evtc

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
