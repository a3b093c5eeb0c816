#include "gpu_suite.hpp"

#include "evtc/arch.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "evtc/expression.hpp"

namespace evtc::gpu_test {
namespace {

struct SuiteKernel {
  const char* name;
  const char* expr;
  DType ab;
  Layout a_layout, b_layout;
  const char* config = nullptr;  // KernelConfig name; the default configuration when null
  std::optional<DType> b_dtype;  // B's dtype when it differs from A's
  bool fp8_blockwise = false;    // GemmDesc::fp8_blockwise
};

// Under EVTC_ARCH=sm80 (the sm_80 backend, run on this GPU through its sm_80 code) the suite's
// Hopper configurations become multistage ones of the same role: other tiles and stage counts
// than the default's, at the same partial-tile sizes.
const char* sm80_config(const char* hopper) {
  if (!hopper) return nullptr;
  const std::string c = hopper;
  if (c.starts_with("pingpong_128x128")) return "ms_128x128x32_s4";
  if (c.starts_with("coop_128x128x64_c1x2_streamk")) return "ms_64x128x64_s4";
  if (c.starts_with("coop_256x192")) return "ms_256x128x64_s3";
  if (c.starts_with("pingpong_128x192")) return "ms_128x128x64_s3";
  return nullptr;  // fp8 configurations: the sm_80 backend does not fuse fp8
}

// Few kernels, each testing many ops through several outputs (one CUTLASS kernel takes
// about a minute to compile). Operands are chosen so every op sees its whole domain:
// log/sqrt/rsqrt/pow/reciprocal get |f| + c.
const SuiteKernel kSuite[] = {
    {"unary_a", R"(
input s[m]: f32
input alpha: f32 ptr
f = acc * s[m] + bias[n]
out D: bf16 = relu(f) + relu_square(f) * 0.25 + sigmoid(f) + silu(f)
out u1: bf16 = gelu(f) + gelu_tanh(f) + quick_gelu(f) + tanh(f)
out u2: f32 = exp(-abs(f)) + log(abs(f) + 1) + neg(f) * beta + sqrt(abs(f))
out u3: bf16 = rsqrt(abs(f) + 0.5) + square(f) + reciprocal(abs(f) + 0.5) + erf(f) * alpha
)",
     DType::bf16, Layout::row_major, Layout::col_major},
    {"ops_b", R"(
input C: f16
input res[m,n]: f16
input bias[n]: f16
input s[m]: f16
f = acc + C
out D: f16 = softplus(f) + hardswish(f) + mish(f) + leaky_relu(f, 0.2)
out b1: f16 = max(f, res[m,n]) + min(f, 0.5) - f / (abs(res[m,n]) + 1) + pow(abs(f) + 0.5, 1.5)
out b2: f32 = clamp(f, -1, 1) + where(relu(res[m,n]), f, -f) + fma(f, bias[n], s[m])
out b3: f16 = where(f > 0, f, 0.01 * f) + (res[m,n] >= 0.5) * f - (bias[n] != s[m]) + (res[m,n] == res[m,n])
)",
     DType::f16, Layout::col_major, Layout::row_major},
    {"w1_f32_out", "out D: f32 = silu(acc + bias[n])", DType::bf16, Layout::col_major,
     Layout::col_major},
    {"w1", "out D: bf16 = silu(acc + bias[n])", DType::bf16, Layout::row_major, Layout::row_major},
    {"w1_pingpong", "out D: bf16 = silu(acc + bias[n])", DType::bf16, Layout::row_major,
     Layout::col_major, "pingpong_128x128x64_c1x1_persistent"},
    {"w1_streamk", "out D: bf16 = gelu(acc * s[m] + bias[n])", DType::bf16, Layout::row_major,
     Layout::col_major, "coop_128x128x64_c1x2_streamk"},
    // The 192-column tiles light epilogues take by default on large problems.
    {"w1_coop_256x192", "out D: bf16 = silu(acc + bias[n])", DType::bf16, Layout::row_major,
     Layout::col_major, "coop_256x192x64_c2x1_persistent"},
    {"swiglu_pingpong_128x192", "out y: bf16 = swiglu(acc)", DType::bf16, Layout::row_major,
     Layout::col_major, "pingpong_128x192x64_c2x1_persistent"},
    // The configurations of small and decode-sized problems: 64-row ping-pong tiles of any
    // multiple of 16 columns with deep K tiles and clusters along N, and split-K/stream-K with a
    // 96-column tile. Each carries gated outputs, an [m,n] operand, extra [m,n] outputs and
    // (where the scheduler allows) row and column reductions.
    {"decode_mix", R"(
input bias[n]: bf16
input r[m,n]: bf16
h = acc + bias[n]
out P: bf16 = h + r[m,n]
out y: bf16 = swiglu(h)
out rs = row_sum(h)
out cm = col_max(h)
)",
     DType::bf16, Layout::row_major, Layout::col_major, "pingpong_64x48x128_c1x2_persistent"},
    {"narrow_16", R"(
input bias[n]: bf16
out y: bf16 = swiglu(acc + bias[n])
out rm = row_max(acc)
)",
     DType::bf16, Layout::row_major, Layout::col_major, "pingpong_64x16x128_c1x1_persistent"},
    {"split_k", R"(
input s[m]: f32
input r[m,n]: bf16
out D: bf16 = gelu(acc * s[m] + bias[n])
out P: bf16 = acc + r[m,n]
out y: bf16 = swiglu(acc)
)",
     DType::bf16, Layout::row_major, Layout::col_major, "coop_128x96x64_c1x1_splitk4"},
    {"stream_k_gated", "out y: bf16 = gptoss_swiglu(acc + bias[n], alpha=1.702, limit=7)", DType::bf16,
     Layout::row_major, Layout::col_major, "coop_128x64x64_c1x1_streamk"},
    // Transposed kernels (swap-AB): [n] and [m] vectors, C, row- and column-major [m,n]
    // operands, an extra [m,n] output and every reduction axis, each read or written in the
    // other layout by the transposed problem; split-K with B row-major (A' = Bᵀ is then
    // M-major); fp8 row-wise scales with an amax.
    {"swap_mix", R"(
input bias[n]: bf16
input s[m]: f32
input r[m,n]: bf16
input q[m,n]: bf16 col_major
h = acc * s[m] + bias[n]
out D: bf16 = silu(h) + C
out P: f32 = h + r[m,n] - q[m,n]
out rs = row_sum(h)
out cm = col_max(h)
out t = sum(h)
)",
     DType::bf16, Layout::row_major, Layout::col_major, "pingpong_64x16x128_c1x1_persistent_swap"},
    {"swap_split_k", R"(
input s[m]: f32
input r[m,n]: bf16
out D: bf16 = gelu(acc * s[m] + bias[n]) + r[m,n]
out P: bf16 = acc
)",
     DType::bf16, Layout::row_major, Layout::row_major, "coop_128x32x128_c1x1_splitk4_swap"},
    {"swap_fp8", R"(
input sa[m]: f32
input sb[n]: f32
input bias[n]: bf16
y = acc * sa[m] * sb[n]
out D: bf16 = gelu(y + bias[n])
out ay = amax(y)
)",
     DType::f8e4m3, Layout::row_major, Layout::col_major, "pingpong_64x32x128_c1x1_persistent_swap"},
    // K in parts added by a second kernel (the plain epilogue): transposed, with [n] and [m]
    // vectors, C, the column index, row- and column-major [m,n] operands and an extra f32
    // output; untransposed with B row-major (its K slices N-major), a gated output and an
    // extra [m,n] output.
    {"k_parts_swap", R"(
input bias[n]: bf16
input s[m]: f32
input r[m,n]: bf16
input q[m,n]: bf16 col_major
h = acc * s[m] + bias[n]
out D: bf16 = silu(h) + C + n * 0.001
out P: f32 = h + r[m,n] - q[m,n]
)",
     DType::bf16, Layout::row_major, Layout::col_major, "pingpong_64x16x128_c1x1_persistent_kparts4_swap"},
    {"k_parts_gated", R"(
input r[m,n]: bf16
h = acc + bias[n]
out P: bf16 = h + r[m,n]
out y: bf16 = swiglu(h)
)",
     DType::bf16, Layout::row_major, Layout::row_major, "pingpong_64x64x128_c1x1_persistent_kparts3"},
    // The default configuration of nn.Linear's operands, from the GPU's shipped table where it has one.
    {"w1_linear", "out D: bf16 = silu(acc + bias[n])", DType::bf16, Layout::row_major, Layout::col_major},
    {"reductions", R"(
input s[m]: f32
f = acc * s[m]
out D: bf16 = f
out rs = row_sum(f)
out rmx = row_max(f)
out rmn = row_min(f)
out ra = row_amax(f)
out cs = col_sum(f)
out cmx = col_max(f)
out cmn = col_min(f)
out ca = col_amax(f)
out ts = sum(f)
out tmx = max(f)
out tmn = min(f)
out ta = amax(f)
out rl = row_logsumexp(f)
out cl = col_logsumexp(f)
out tl = logsumexp(f)
)",
     DType::bf16, Layout::row_major, Layout::row_major},
    {"bce_loss", R"(
f = acc + bias[n]
out loss = sum((C - 1) * f + log(clamp(sigmoid(f), 1e-3, 0.999)))
)",
     DType::bf16, Layout::row_major, Layout::col_major},
    // fp8 (A row-major, B column-major: both K-major). Row-wise and column-wise scales, then
    // a bias + gelu, an f32 copy, an fp8 output scaled past the e4m3 range (so it must
    // saturate) and the amax of the pre-scale value.
    {"fp8_rowwise", R"(
input sa[m]: f32
input sb[n]: f32
input bias[n]: bf16
y = acc * sa[m] * sb[n]
out D: bf16 = y
out g: bf16 = gelu(y + bias[n])
out y32: f32 = y
out q: f8e4m3 = y * 100
out ay = amax(y)
)",
     DType::f8e4m3, Layout::row_major, Layout::col_major},
    // e4m3 x e5m2 with an fp8 main output scaled by a tensor-wise scale read from device
    // memory, and the amax of the unscaled product for delayed scaling.
    {"fp8_out_e5m2", R"(
input sa[m]: f32
input st: f32 ptr
y = acc * sa[m]
out D: f8e4m3 = y * st
out amax_y = amax(y)
out rmax: bf16 = row_amax(y)
)",
     DType::f8e4m3, Layout::row_major, Layout::col_major, nullptr, DType::f8e5m2},
    // The fast-accumulation main loop, ping-pong, with W3's bias + gelu epilogue.
    {"fp8_fastacc", R"(
input sa[m]: f32
input sb[n]: f32
input bias[n]: bf16
out D: bf16 = gelu(acc * sa[m] * sb[n] + bias[n])
)",
     DType::f8e4m3, Layout::row_major, Layout::col_major,
     "pingpong_128x128x128_c2x1_persistent_fastacc"},
    // Block-scaled fp8 (DeepSeek-V3's format: A per row and 128 of K, B per 128×128 block)
    // with a bias, GELU, an f32 copy of the scaled product and a row maximum after it.
    {"fp8_blockwise", R"(
input bias[n]: bf16
out D: bf16 = gelu(acc + bias[n])
out y32: f32 = acc
out rmax: bf16 = row_amax(acc)
)",
     DType::f8e4m3, Layout::row_major, Layout::col_major, nullptr, std::nullopt, true},
    // The same main loop with the ping-pong schedule.
    {"fp8_blockwise_pingpong", "out D: bf16 = silu(acc) * s[m]", DType::f8e4m3, Layout::row_major,
     Layout::col_major, "pingpong_64x128x128_c1x1_persistent", std::nullopt, true},
    // Gated activations (N -> N/2 over interleaved gate/up columns): every gated form, with
    // parameters, a bias before the activation, the full pre-activation as the main output
    // and an fp8 gated output with a scale.
    {"gated", R"(
input bias[n]: bf16
input s[m]: f32
h = acc + bias[n]
out D: bf16 = h
out sw: bf16 = swiglu(h)
out ge: f16 = geglu(h) * s[m]
out gt: bf16 = geglu_tanh(h)
out re: f32 = reglu(h)
out go: bf16 = gptoss_swiglu(h, alpha=1.5, limit=2)
out q: f8e4m3 = swiglu7(h) * qs
)",
     DType::bf16, Layout::row_major, Layout::col_major},
    // An f32 main output whose value is rounded to bf16 (eager's h.float() after a residual
    // add in a training graph), beside the bf16 value itself.
    {"rounded_f32_main", R"(
input x0[n]: bf16
input x1[m,n]: bf16
v1 = bf16(bf16(acc + x0[n]) + x1[m,n])
out y0: bf16 = v1
out D: f32 = f32(v1)
)",
     DType::bf16, Layout::row_major, Layout::col_major},
    // The indices m and n and integer operands: an LM head's target logit (a row sum of the
    // one-hot-masked logits) and cross-entropy gradient (softmax minus the one-hot target, times
    // the incoming gradient), a triangular and a column mask, an i64 row vector, and a gated
    // output whose n is the full-width column (the first 50 (gate, up) pairs kept) and whose m
    // scales rows.
    {"lm_head_loss", R"(
input t[m]: i32
input lse[m]: f32
input g[m]: f32
input first[n]: i64
out target = row_sum(where(n == t[m], acc, 0))
out dlogits: bf16 = (exp(acc - lse[m]) - (n == t[m])) * g[m]
out D: bf16 = acc * (m >= n) + (n < 100) - (m == first[n]) + 0.001 * m
out y: bf16 = swiglu(acc * (n < 100)) * (0.001 * m + 1)
)",
     DType::bf16, Layout::row_major, Layout::col_major},
    // The same in a transposed (swap-AB) kernel: m and n exchanged, the i32 [m] labels read by a
    // row broadcast.
    {"swap_indices", R"(
input t[m]: i32
out D: bf16 = acc * (n == t[m]) + (m < n) + 0.01 * n
out target = row_sum(where(n == t[m], acc, 0))
)",
     DType::bf16, Layout::row_major, Layout::col_major, "pingpong_64x16x128_c1x1_persistent_swap"},
    // W4's kernel: swiglu7 of x @ w.T, the gated output alone (no main output).
    {"w4_swiglu7", "out y: bf16 = swiglu7(acc)", DType::bf16, Layout::row_major,
     Layout::col_major},
};

std::map<std::string, std::unique_ptr<Kernel>>& kernels() {
  static std::map<std::string, std::unique_ptr<Kernel>> k;
  return k;
}

class SuiteEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
      GTEST_FAIL() << "the GPU suite needs a CUDA device";
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    fmt::print("device: {} (sm_{}{})\n", prop.name, prop.major, prop.minor);
    for (const SuiteKernel& s : kSuite) {
      CompileOptions o;
      o.gemm.a_dtype = s.ab;
      o.gemm.b_dtype = s.b_dtype.value_or(s.ab);
      o.gemm.a_layout = s.a_layout;
      o.gemm.b_layout = s.b_layout;
      o.gemm.fp8_blockwise = s.fp8_blockwise;
      const bool multistage = arch_features(target_arch()).backend == 80;
      if (const char* c = multistage ? sm80_config(s.config) : s.config) o.config = KernelConfig::parse(c);
      ParseOptions p;
      p.operand_dtype = p.output_dtype = is_fp8(s.ab) ? DType::bf16 : s.ab;
      kernels()[s.name] = std::make_unique<Kernel>(parse_expression(s.expr, p), o);
    }
    // Compile every fused kernel at once: each is one single-threaded nvcc. With
    // EVTC_SUITE_KERNELS=name,name (for a --gtest_filter run) only those; the others compile
    // when a test first runs them.
    const char* only = std::getenv("EVTC_SUITE_KERNELS");
    const std::string wanted = only ? fmt::format(",{},", only) : "";
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::jthread> threads;
    std::vector<std::string> errors(kernels().size());
    size_t i = 0;
    for (auto& [name, k] : kernels()) {
      if (only && wanted.find("," + name + ",") == std::string::npos) {
        ++i;
        continue;
      }
      threads.emplace_back([&, idx = i, kp = k.get(), n = name] {
        try {
          kp->compile();
          kp->compile_fallback();
        } catch (const std::exception& e) {
          errors[idx] = n + ": " + e.what();
        }
      });
      ++i;
    }
    const size_t compiled = threads.size();
    threads.clear();  // joins
    fmt::print("compiled {} kernels in {:.1f} s\n", compiled,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    for (const auto& e : errors)
      if (!e.empty()) fmt::print(stderr, "compile failure: {}\n", e);
  }
};

const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new SuiteEnvironment);

}  // namespace

Kernel& kernel(const std::string& name) { return *kernels().at(name); }

void expect_matches_reference(const Kernel& k, int64_t m, int64_t n, int64_t kk, uint64_t seed,
                              ExecutionPath expected_path, cudaStream_t stream) {
  const GemmDesc& g = k.options().gemm;
  ReferenceInputs inputs = random_reference_inputs(k.graph(), m, n, kk, g.a_dtype, g.b_dtype, seed);
  if (g.fp8_blockwise) add_random_block_scales(inputs, seed);
  runtime::DeviceProblem problem(k, inputs);
  problem.poison_outputs(stream);
  const ExecutionPath path = k.run(problem.arguments(), stream);
  EXPECT_EQ(path, expected_path) << (path == ExecutionPath::fused
                                          ? std::string("ran fused")
                                          : "ran the fallback: " + k.fallback_reason(m, n, kk));
  const ReferenceOutputs got = problem.read_outputs(stream);
  const ReferenceOutputs want = evaluate_reference(k.graph(), inputs);
  for (const auto& c : runtime::check_outputs(k, got, want))
    EXPECT_TRUE(c.comparison.pass) << "output " << c.name << ": " << c.comparison.describe();
}

}  // namespace evtc::gpu_test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
