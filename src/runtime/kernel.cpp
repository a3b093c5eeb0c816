#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <set>

#include "backends/cuda/fallback_emitter.hpp"
#include "backends/sm90/sm90_emitter.hpp"
#include "evtc/device/abi.h"
#include "evtc/error.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/runtime.hpp"
#include "jit/kernel_cache.hpp"
#include "runtime/cublaslt_gemm.hpp"

namespace evtc {

TensorRef TensorRef::matrix(void* data, DType dtype, int64_t rows, int64_t cols) {
  return TensorRef{data, dtype, rows, cols, cols, 1};
}

TensorRef TensorRef::vector(const void* data, DType dtype, int64_t length) {
  return TensorRef{const_cast<void*>(data), dtype, 1, length, length, 1};
}

TensorRef TensorRef::transposed() const {
  return TensorRef{data, dtype, cols, rows, col_stride, row_stride};
}

namespace {

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw RuntimeError(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}

// Layout of an M×N (or M×K ...) view: row-major if its columns are contiguous.
std::optional<Layout> layout_of(const TensorRef& t) {
  if (t.col_stride == 1 && (t.rows <= 1 || t.row_stride >= t.cols)) return Layout::row_major;
  if (t.row_stride == 1 && (t.cols <= 1 || t.col_stride >= t.rows)) return Layout::col_major;
  return std::nullopt;
}

void check_device_pointer(const void* p, const std::string& what) {
  if (!p) throw UserError(fmt::format("{}: no data (null pointer)", what));
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess || attr.type == cudaMemoryTypeHost ||
      attr.type == cudaMemoryTypeUnregistered) {
    cudaGetLastError();
    throw UserError(fmt::format("{}: pointer {} is not device memory", what, p));
  }
  int device = 0;
  cudaGetDevice(&device);
  if (attr.type == cudaMemoryTypeDevice && attr.device != device)
    throw UserError(fmt::format("{}: lives on device {} but the current device is {}", what,
                                attr.device, device));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

struct Kernel::Impl {
  Graph graph;
  CompileOptions options;
  KernelSignature signature;
  mutable std::mutex mu;
  // Compiled fused kernels by configuration name, and configurations that failed to compile
  // (kept so each failure is reported once).
  mutable std::map<std::string, std::shared_ptr<jit::Library>> fused;
  mutable std::map<std::string, std::string> fused_errors;
  mutable std::string fused_path;  // the latest compiled or loaded
  mutable std::shared_ptr<jit::Library> fallback;
  mutable std::set<std::string> logged;

  void log_once(const std::string& reason) const {
    std::lock_guard lock(mu);
    if (logged.insert(reason).second && !env_flag("EVTC_QUIET"))
      fmt::print(stderr, "evtc: running unfused (cuBLASLt + plain epilogue): {}\n", reason);
  }

  // The configuration for a problem: the one the options fix, else the heuristic default.
  KernelConfig config_for(int64_t m, int64_t n, int64_t k) const {
    GemmDesc g = options.gemm;
    g.m = m;
    g.n = n;
    g.k = k;
    KernelConfig c = options.config.value_or(default_config(graph, g));
    c.precise_math = c.precise_math || options.precise_math;
    return c;
  }

  jit::CompileRequest fused_request(const KernelConfig& config) const {
    return {sm90::emit_kernel(graph, options.gemm, config).source, config.name(), true, 90};
  }

  std::shared_ptr<jit::Library> fused_library(const KernelConfig& config) const {
    const std::string name = config.name();
    {
      std::lock_guard lock(mu);
      if (auto it = fused.find(name); it != fused.end()) return it->second;
      if (auto it = fused_errors.find(name); it != fused_errors.end()) throw RuntimeError(it->second);
    }
    try {
      auto lib = jit::load_or_compile(fused_request(config));
      auto version = reinterpret_cast<evtc_abi_version_fn>(lib->symbol("evtc_abi_version"));
      if (version() != EVTC_ABI_VERSION)
        throw RuntimeError(fmt::format("{} has ABI version {}, expected {}", lib->path(), version(),
                                       EVTC_ABI_VERSION));
      std::lock_guard lock(mu);
      fused[name] = lib;
      fused_path = lib->path();
      return lib;
    } catch (const RuntimeError& e) {
      std::lock_guard lock(mu);
      fused_errors[name] = e.what();
      throw;
    }
  }

  std::shared_ptr<jit::Library> fallback_library() const {
    {
      std::lock_guard lock(mu);
      if (fallback) return fallback;
    }
    auto lib = jit::load_or_compile(
        {cuda::emit_fallback_kernel(graph, signature), "plain epilogue", false, 90});
    std::lock_guard lock(mu);
    fallback = lib;
    return lib;
  }
};

Kernel::Kernel(const Graph& graph, const CompileOptions& options) : impl_(std::make_unique<Impl>()) {
  PipelineOptions popts;
  popts.cast_mode = options.cast_mode;
  popts.gemm = options.gemm;
  impl_->graph = run_pipeline(graph, popts);
  impl_->options = options;
  impl_->signature = make_signature(impl_->graph);
}

Kernel::~Kernel() = default;
Kernel::Kernel(Kernel&&) noexcept = default;
Kernel& Kernel::operator=(Kernel&&) noexcept = default;

const Graph& Kernel::graph() const { return impl_->graph; }
const KernelSignature& Kernel::signature() const { return impl_->signature; }
const CompileOptions& Kernel::options() const { return impl_->options; }

std::string Kernel::library_path() const {
  std::lock_guard lock(impl_->mu);
  return impl_->fused_path;
}

void Kernel::compile(int64_t m, int64_t n, int64_t k) {
  const std::string path = jit::compile_cached(impl_->fused_request(impl_->config_for(m, n, k)));
  std::lock_guard lock(impl_->mu);
  impl_->fused_path = path;
}

KernelConfig Kernel::config_for(int64_t m, int64_t n, int64_t k) const {
  return impl_->config_for(m, n, k);
}

std::string Kernel::compile_fallback() {
  return jit::compile_cached({cuda::emit_fallback_kernel(impl_->graph, impl_->signature),
                              "plain epilogue", false, 90});
}

std::string Kernel::fallback_reason(int64_t m, int64_t n, int64_t k) const {
  if (impl_->options.disable_fusion || env_flag("EVTC_DISABLE"))
    return "fusion is disabled (EVTC_DISABLE=1 or disable_fusion)";
  GemmDesc g = impl_->options.gemm;
  g.m = m;
  g.n = n;
  g.k = k;
  const Legality legal = check_legality(impl_->graph, g);
  std::string out;
  for (const auto& r : legal.reasons) out += (out.empty() ? "" : "; ") + r;
  return out;
}

ExecutionPath Kernel::run(const Arguments& args, cudaStream_t stream) const {
  const Impl& im = *impl_;
  const KernelSignature& sig = im.signature;
  const GemmDesc& gemm = im.options.gemm;

  // --- A and B -------------------------------------------------------------------------
  if (!args.a()) throw UserError("operand A was not given");
  if (!args.b()) throw UserError("operand B was not given");
  const TensorRef& A = *args.a();
  const TensorRef& B = *args.b();
  const int64_t m = A.rows, k = A.cols, n = B.cols;
  if (B.rows != k)
    throw UserError(fmt::format("operand B is {}×{} but A is {}×{}: B must have K={} rows", B.rows,
                                B.cols, m, k, k));
  if (m <= 0 || n <= 0 || k <= 0)
    throw UserError(fmt::format("empty problem: M={}, N={}, K={}", m, n, k));
  for (auto [name, t, want] : {std::tuple{"A", &A, gemm.a_dtype}, std::tuple{"B", &B, gemm.b_dtype}})
    if (t->dtype != want)
      throw UserError(fmt::format("operand {} is {} but the kernel was compiled for {}", name,
                                  dtype_name(t->dtype), dtype_name(want)));
  const auto la = layout_of(A), lb = layout_of(B);
  if (!la) throw UserError("operand A: neither its rows nor its columns are contiguous");
  if (!lb) throw UserError("operand B: neither its rows nor its columns are contiguous");
  check_device_pointer(A.data, "operand A");
  check_device_pointer(B.data, "operand B");
  const int64_t lda = *la == Layout::row_major ? A.row_stride : A.col_stride;
  const int64_t ldb = *lb == Layout::row_major ? B.row_stride : B.col_stride;

  std::vector<std::string> reasons;
  if (*la != gemm.a_layout)
    reasons.push_back(fmt::format("A is {} but the kernel was built for {} A",
                                  *la == Layout::row_major ? "row-major" : "column-major",
                                  gemm.a_layout == Layout::row_major ? "row-major" : "column-major"));
  if (*lb != gemm.b_layout)
    reasons.push_back(fmt::format("B is {} but the kernel was built for {} B",
                                  *lb == Layout::row_major ? "row-major" : "column-major",
                                  gemm.b_layout == Layout::row_major ? "row-major" : "column-major"));

  // --- C and D -------------------------------------------------------------------------
  auto check_matrix = [&](const TensorRef& t, DType want, const std::string& what, bool packed) {
    if (t.dtype != want)
      throw UserError(fmt::format("{}: dtype {} given, the kernel was compiled for {}", what,
                                  dtype_name(t.dtype), dtype_name(want)));
    if (t.rows != m || t.cols != n)
      throw UserError(fmt::format("{}: shape {}×{} given, expected M×N = {}×{}", what, t.rows,
                                  t.cols, m, n));
    if (t.col_stride != 1 || t.row_stride < n || (packed && t.row_stride != n))
      throw UserError(fmt::format("{}: strides ({}, {}) given, expected a row-major matrix with "
                                  "strides ({}, 1)",
                                  what, t.row_stride, t.col_stride, n));
    check_device_pointer(t.data, what);
    if (!aligned16(t.data) || (t.row_stride * dtype_bytes(t.dtype)) % 16 != 0)
      reasons.push_back(fmt::format("{} is not 16-byte aligned (TMA needs aligned rows)", what));
  };
  const void* c_ptr = nullptr;
  int64_t ldc = n;
  if (sig.reads_c) {
    if (!args.c()) throw UserError("the source matrix C was not given (the epilogue reads C)");
    check_matrix(*args.c(), sig.c_dtype, "source matrix C", false);
    c_ptr = args.c()->data;
    ldc = args.c()->row_stride;
  }
  void* d_ptr = nullptr;
  int64_t ldd = n;
  if (!sig.d_name.empty()) {
    auto it = args.tensors().find(sig.d_name);
    if (it == args.tensors().end())
      throw UserError(fmt::format("output '{}' ({}[m,n]) was not given", sig.d_name, dtype_name(sig.d_dtype)));
    check_matrix(it->second, sig.d_dtype, fmt::format("output '{}'", sig.d_name), false);
    d_ptr = it->second.data;
    ldd = it->second.row_stride;
  }

  // --- operands and extra outputs -------------------------------------------------------
  std::vector<void*> ptrs;
  for (const OperandSlot& s : sig.pointers) {
    const std::string what = fmt::format("{} '{}'", s.is_output ? "output" : "operand", s.name);
    auto it = args.tensors().find(s.name);
    if (it == args.tensors().end())
      throw UserError(fmt::format("{} ({}{}) was not given", what, dtype_name(s.dtype), shape_name(s.shape)));
    const TensorRef& t = it->second;
    if (t.dtype != s.dtype)
      throw UserError(fmt::format("{}: dtype {} given, the kernel was compiled for {}", what,
                                  dtype_name(t.dtype), dtype_name(s.dtype)));
    if (s.shape == Shape::full) {
      const bool row = s.layout == Layout::row_major;
      if (t.rows != m || t.cols != n)
        throw UserError(fmt::format("{}: shape {}×{} given, expected M×N = {}×{}", what, t.rows, t.cols, m, n));
      if (row ? (t.col_stride != 1 || t.row_stride != n) : (t.row_stride != 1 || t.col_stride != m))
        throw UserError(fmt::format("{}: strides ({}, {}) given, expected a contiguous {} matrix "
                                    "with strides {}",
                                    what, t.row_stride, t.col_stride, row ? "row-major" : "column-major",
                                    row ? fmt::format("({}, 1)", n) : fmt::format("(1, {})", m)));
      if (!aligned16(t.data)) reasons.push_back(fmt::format("{} is not 16-byte aligned", what));
    } else {
      const int64_t want = s.shape == Shape::row ? n : s.shape == Shape::col ? m : 1;
      const char* dim = s.shape == Shape::row ? " (N)" : s.shape == Shape::col ? " (M)" : "";
      if (t.rows * t.cols != want || (t.rows != 1 && t.cols != 1))
        throw UserError(fmt::format("{}: {}×{} given, expected a vector of {} elements{}", what,
                                    t.rows, t.cols, want, dim));
      const int64_t step = t.rows == 1 ? t.col_stride : t.row_stride;
      if (want > 1 && step != 1)
        throw UserError(fmt::format("{}: elements are {} apart, expected contiguous", what, step));
      if (s.shape != Shape::scalar && !aligned16(t.data))
        reasons.push_back(fmt::format("{} is not 16-byte aligned", what));
    }
    check_device_pointer(t.data, what);
    ptrs.push_back(t.data);
  }
  std::vector<double> scalars;
  for (const OperandSlot& s : sig.scalars) {
    auto it = args.scalars().find(s.name);
    if (it == args.scalars().end())
      throw UserError(fmt::format("scalar parameter '{}' was not given", s.name));
    scalars.push_back(it->second);
  }
  for (const auto& [name, t] : args.tensors()) {
    bool known = name == sig.d_name;
    for (const auto& s : sig.pointers) known |= s.name == name;
    if (!known) throw UserError(fmt::format("'{}' is not an operand or output of this epilogue", name));
  }

  evtc_gemm_args abi{};
  abi.m = m;
  abi.n = n;
  abi.k = k;
  abi.a = A.data;
  abi.b = B.data;
  abi.c = c_ptr;
  abi.d = d_ptr;
  abi.lda = lda;
  abi.ldb = ldb;
  abi.ldc = ldc;
  abi.ldd = ldd;
  abi.ptrs = ptrs.data();
  abi.scalars = scalars.data();
  abi.sm_count = 0;

  // --- fused path ----------------------------------------------------------------------
  if (const std::string r = fallback_reason(m, n, k); !r.empty()) reasons.push_back(r);
  if (reasons.empty()) {
    std::shared_ptr<jit::Library> lib;
    try {
      lib = im.fused_library(im.config_for(m, n, k));
    } catch (const RuntimeError& e) {
      reasons.push_back(fmt::format("the fused kernel did not compile: {}", e.what()));
    }
    if (lib) {
      char why[256] = {0};
      auto can = reinterpret_cast<evtc_can_implement_fn>(lib->symbol("evtc_can_implement"));
      if (can(&abi, why, sizeof why) != EVTC_OK) {
        reasons.push_back(fmt::format("CUTLASS cannot implement this problem: {}", why));
      } else {
        auto ws_size = reinterpret_cast<evtc_workspace_size_fn>(lib->symbol("evtc_workspace_size"))(&abi);
        void* workspace = nullptr;
        if (ws_size) cuda_check(cudaMallocAsync(&workspace, ws_size, stream), "workspace allocation");
        auto run = reinterpret_cast<evtc_run_fn>(lib->symbol("evtc_run"));
        const int rc = run(&abi, workspace, stream, why, sizeof why);
        if (workspace) cudaFreeAsync(workspace, stream);
        if (rc != EVTC_OK) throw RuntimeError(fmt::format("fused kernel launch failed: {}", why));
        return ExecutionPath::fused;
      }
    }
  }

  // --- fallback: cuBLASLt + plain epilogue ---------------------------------------------
  std::string reason;
  for (const auto& r : reasons) reason += (reason.empty() ? "" : "; ") + r;
  im.log_once(reason);
  auto lib = im.fallback_library();
  using scratch_fn = size_t (*)(int64_t, int64_t);
  const size_t scratch_floats =
      reinterpret_cast<scratch_fn>(lib->symbol("evtc_fallback_scratch_floats"))(m, n);
  float* acc = nullptr;
  cuda_check(cudaMallocAsync(reinterpret_cast<void**>(&acc),
                             (size_t(m) * n + scratch_floats) * sizeof(float), stream),
             "fallback workspace allocation");
  runtime::cublaslt_matmul({A.data, A.dtype, *la == Layout::row_major, lda},
                           {B.data, B.dtype, *lb == Layout::row_major, ldb}, acc, DType::f32, m, n, k,
                           stream);
  using fallback_fn = int (*)(const evtc_gemm_args*, const float*, float*, void*);
  const int rc = reinterpret_cast<fallback_fn>(lib->symbol("evtc_fallback_run"))(
      &abi, acc, acc + size_t(m) * n, stream);
  cudaFreeAsync(acc, stream);
  if (rc != EVTC_OK) throw RuntimeError("fallback epilogue launch failed");
  return ExecutionPath::fallback;
}

}  // namespace evtc
