// Runtime behaviour on the GPU: CUDA-graph capture and replay, two streams at once, and the
// per-call validation of operands.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <vector>

#include "evtc/error.hpp"
#include "gpu_suite.hpp"

using namespace evtc;
using evtc::gpu_test::kernel;

namespace {

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); }
  ~Stream() { cudaStreamDestroy(s); }
};

void expect_all_pass(const Kernel& k, const runtime::DeviceProblem& p, const ReferenceInputs& in,
                     cudaStream_t s) {
  const ReferenceOutputs got = p.read_outputs(s);
  const ReferenceOutputs want = evaluate_reference(k.graph(), in);
  for (const auto& c : runtime::check_outputs(k, got, want))
    EXPECT_TRUE(c.comparison.pass) << "output " << c.name << ": " << c.comparison.describe();
}

ReferenceInputs inputs_for(const Kernel& k, int64_t m, int64_t n, int64_t kk, uint64_t seed) {
  return random_reference_inputs(k.graph(), m, n, kk, k.options().gemm.a_dtype,
                                 k.options().gemm.b_dtype, seed);
}

// Captures one call of `k` in a CUDA graph and returns the instantiated graph; the call must
// take `path`.
cudaGraphExec_t capture(const Kernel& k, const Arguments& args, cudaStream_t s, ExecutionPath path) {
  cudaGraph_t graph;
  cudaGraphExec_t exec = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(k.run(args, s), path);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  cudaGraphDestroy(graph);
  return exec;
}

std::string error_of(const Kernel& k, const Arguments& a) {
  try {
    k.run(a, nullptr);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(CudaGraph, CapturedReductionsReplayWithoutStaleAccumulation) {
  const Kernel& k = kernel("reductions");
  const ReferenceInputs in = inputs_for(k, 1000, 1016, 512, 41);
  runtime::DeviceProblem p(k, in);
  Stream stream;
  cudaGraphExec_t exec = capture(k, p.arguments(), stream.s, ExecutionPath::fused);
  ASSERT_NE(exec, nullptr);
  for (int replay = 0; replay < 3; ++replay) {
    p.poison_outputs(stream.s);
    ASSERT_EQ(cudaGraphLaunch(exec, stream.s), cudaSuccess);
    SCOPED_TRACE(replay);
    expect_all_pass(k, p, in, stream.s);
  }
  cudaGraphExecDestroy(exec);
}

TEST(CudaGraph, CapturedFallbackReplays) {
  const Kernel& k = kernel("w1");
  const ReferenceInputs in = inputs_for(k, 256, 264, 1001, 42);  // K=1001: unfused
  runtime::DeviceProblem p(k, in);
  Stream stream;
  cudaGraphExec_t exec = capture(k, p.arguments(), stream.s, ExecutionPath::fallback);
  ASSERT_NE(exec, nullptr);
  p.poison_outputs(stream.s);
  ASSERT_EQ(cudaGraphLaunch(exec, stream.s), cudaSuccess);
  expect_all_pass(k, p, in, stream.s);
  cudaGraphExecDestroy(exec);
}

TEST(Streams, OneKernelOnTwoStreamsAtOnce) {
  const Kernel& k = kernel("reductions");
  const ReferenceInputs in1 = inputs_for(k, 2048, 1016, 2048, 43);
  const ReferenceInputs in2 = inputs_for(k, 1000, 2040, 1024, 44);
  runtime::DeviceProblem p1(k, in1), p2(k, in2);
  Stream s1, s2;
  for (int round = 0; round < 3; ++round) {
    p1.poison_outputs(s1.s);
    p2.poison_outputs(s2.s);
    k.run(p1.arguments(), s1.s);
    k.run(p2.arguments(), s2.s);
    k.run(p1.arguments(), s1.s);  // repeated calls: no state carried between them
    SCOPED_TRACE(round);
    expect_all_pass(k, p1, in1, s1.s);
    expect_all_pass(k, p2, in2, s2.s);
  }
}

// The kernel library reuses the Params of a call whose arguments it has seen (its launch
// cache): a call that changes only a scalar, with every pointer the same, must still see the
// new value, and going back to the first arguments must give the first results again.
TEST(Runtime, RepeatedCallsWithAChangedScalarUseTheNewValue) {
  const Kernel& k = kernel("unary_a");
  const ReferenceInputs in = inputs_for(k, 256, 512, 256, 46);
  runtime::DeviceProblem p(k, in);
  Stream stream;
  p.poison_outputs(stream.s);
  ASSERT_EQ(k.run(p.arguments(), stream.s), ExecutionPath::fused);
  expect_all_pass(k, p, in, stream.s);
  ReferenceInputs in2 = in;
  in2.operands["beta"] = {in.operands.at("beta").at(0) * -3.0 + 1.0};
  Arguments changed = p.arguments();
  changed.set("beta", in2.operands["beta"][0]);
  for (int call = 0; call < 2; ++call) {  // the first call builds new Params, the second reuses them
    SCOPED_TRACE(call);
    p.poison_outputs(stream.s);
    ASSERT_EQ(k.run(changed, stream.s), ExecutionPath::fused);
    expect_all_pass(k, p, in2, stream.s);
  }
  p.poison_outputs(stream.s);
  k.run(p.arguments(), stream.s);
  expect_all_pass(k, p, in, stream.s);
}

TEST(Validation, OperandErrorsNameTheOperand) {
  const Kernel& k = kernel("w1");
  const ReferenceInputs in = inputs_for(k, 128, 256, 64, 45);
  runtime::DeviceProblem p(k, in);
  const Arguments& good = p.arguments();
  const TensorRef bias = good.tensors().at("bias");

  Arguments missing;
  missing.a(*good.a()).b(*good.b()).set("D", good.tensors().at("D"));
  EXPECT_EQ(error_of(k, missing), "operand 'bias' (bf16[n]) was not given");

  Arguments wrong_dtype = good;
  wrong_dtype.set("bias", TensorRef::vector(bias.data, DType::f16, 256));
  EXPECT_EQ(error_of(k, wrong_dtype), "operand 'bias': dtype f16 given, the kernel was compiled for bf16");

  Arguments wrong_length = good;
  wrong_length.set("bias", TensorRef::vector(bias.data, DType::bf16, 100));
  EXPECT_EQ(error_of(k, wrong_length),
            "operand 'bias': 1×100 given, expected a vector of 256 elements (N)");

  std::vector<uint16_t> host(256);
  Arguments host_memory = good;
  host_memory.set("bias", TensorRef::vector(host.data(), DType::bf16, 256));
  EXPECT_NE(error_of(k, host_memory).find("operand 'bias': pointer"), std::string::npos);
  EXPECT_NE(error_of(k, host_memory).find("is not device memory"), std::string::npos);

  Arguments unknown = good;
  unknown.set("bais", bias);
  EXPECT_EQ(error_of(k, unknown), "'bais' is not an operand or output of this epilogue");

  Arguments wrong_d = good;
  const TensorRef d = good.tensors().at("D");
  wrong_d.set("D", TensorRef::matrix(d.data, DType::bf16, 128, 255));
  EXPECT_EQ(error_of(k, wrong_d), "output 'D': shape 128×255 given, expected M×N = 128×256");

  // A gated output is M×N/2, contiguous row-major, and needs an even N.
  const Kernel& gated = kernel("w4_swiglu7");
  runtime::DeviceProblem gp(gated, inputs_for(gated, 128, 256, 64, 46));
  const TensorRef y = gp.arguments().tensors().at("y");
  Arguments wrong_y = gp.arguments();
  wrong_y.set("y", TensorRef::matrix(y.data, DType::bf16, 128, 256));
  EXPECT_EQ(error_of(gated, wrong_y),
            "output 'y': shape 128×256 given, expected M×N/2 = 128×128 (a gated output has one "
            "column per (gate, up) pair)");
  Arguments strided_y = gp.arguments();
  strided_y.set("y", TensorRef{y.data, DType::bf16, 128, 128, 1, 128});
  EXPECT_EQ(error_of(gated, strided_y),
            "output 'y': strides (1, 128) given, expected a contiguous row-major matrix with "
            "strides (128, 1)");

  Arguments wrong_a = good;
  wrong_a.a(TensorRef::matrix(good.a()->data, DType::f16, 128, 64));
  EXPECT_EQ(error_of(k, wrong_a), "operand A is f16 but the kernel was compiled for bf16");

  Arguments wrong_k = good;
  wrong_k.b(TensorRef::matrix(good.b()->data, DType::bf16, 32, 256));
  EXPECT_EQ(error_of(k, wrong_k), "operand B is 32×256 but A is 128×64: B must have K=64 rows");
}
