#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>

#include "backends/cuda/fallback_emitter.hpp"
#include "backends/emit.hpp"
#include "evtc/arch.hpp"
#include "evtc/device/abi.h"
#include "target/device_info.hpp"
#include "evtc/error.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/passes.hpp"
#include "support/environment.hpp"
#include "jit/kernel_library.hpp"
#include "runtime/cublaslt_gemm.hpp"
#include "runtime/cuda_check.hpp"
#include "runtime/kernel_impl.hpp"
#include "runtime/kernel_requests.hpp"
#include "runtime/selection/candidates.hpp"
#include "evtc/options.hpp"
#include "support/logging.hpp"

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

using runtime::cuda_check;

TuneMode tune_mode_from_env(TuneMode fallback) {
  const auto v = env_text(Env::tune);
  if (!v) return fallback;
  if (auto m = parse_tune_mode(*v)) return *m;
  throw UserError(fmt::format("{}='{}': expected off, first-call or ahead", env_name(Env::tune), *v));
}

size_t max_candidates_from_env(int fallback) {
  return env_count(Env::tune_max_candidates, "no limit").value_or(size_t(std::max(fallback, 0)));
}

}  // namespace

void Kernel::Impl::log_once(const std::string& reason) const {
  if (fusion_disabled) return;  // asked for: nothing to warn about
  std::lock_guard lock(mu);
  if (logged.insert(reason).second) log_warning("running unfused (cuBLASLt + plain epilogue): {}", reason);
}

namespace {

// Why a kernel built for `arch` may not launch here: the current GPU is of another architecture
// that its code does not run on (an older one); empty otherwise.
std::string arch_mismatch_note(int arch) {
  const auto device = current_device();
  if (!device || device->arch <= 0 || code_runs_on(arch, device->arch)) return "";
  return fmt::format(" (the kernels are built for {} and this GPU is {}, which cannot run them: leave "
                     "CompileOptions::arch / EVTC_ARCH unset, or set them to the GPU's architecture)",
                     arch_name(arch), arch_name(device->arch));
}

}  // namespace

namespace runtime {

jit::CompileRequest fused_request(const Graph& graph, const CompileOptions& options, const KernelConfig& config) {
  return {.source = backend::emit_dense_kernel(graph, options.gemm, config).source,
          .label = config.name(),
          .expression = expression_text(graph),
          .needs_cutlass = true,
          .sm = options.gemm.sm,
          .backend = backend_features(options.gemm.sm, options.gemm.a_dtype).backend,
          .in_parts = true};
}

jit::CompileRequest fallback_request(const Graph& graph, const KernelSignature& signature, int arch,
                                     const GemmDesc* gemm) {
  return {.source = cuda::emit_fallback_kernel(graph, signature, gemm),
          .label = "plain epilogue",
          .expression = expression_text(graph),
          .needs_cutlass = false,
          .sm = arch};
}

}  // namespace runtime

jit::CompileRequest Kernel::Impl::fused_request(const KernelConfig& config) const {
  return runtime::fused_request(graph, options, config);
}

void Kernel::Impl::record(int64_t m, int64_t n, int64_t k, const KernelConfig& config) const {
  runtime::record_kernel(graph, option_text(options.gemm, options.cast_mode, options.precise_math), false, m, n,
                         k, config);
}

std::shared_ptr<jit::Library> Kernel::Impl::fused_library(const KernelConfig& config) const {
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

std::shared_ptr<jit::Library> Kernel::Impl::fallback_library() const {
  {
    std::lock_guard lock(mu);
    if (fallback) return fallback;
  }
  auto lib = jit::load_or_compile(runtime::fallback_request(graph, signature, options.gemm.sm, &options.gemm));
  std::lock_guard lock(mu);
  fallback = lib;
  return lib;
}

void require_problem_size(int64_t m, int64_t n, int64_t k) {
  for (auto [name, v] : {std::pair{'M', m}, std::pair{'N', n}, std::pair{'K', k}})
    if (v < 0)
      throw UserError(fmt::format("problem size {}={}: sizes are positive, or 0 where not known yet", name, v));
}

std::string Kernel::Impl::fallback_reason(int64_t m, int64_t n, int64_t k) const {
  require_problem_size(m, n, k);
  if (fusion_disabled) return "fusion is disabled (EVTC_DISABLE=1 or disable_fusion)";
  GemmDesc g = options.gemm;
  g.m = m;
  g.n = n;
  g.k = k;
  const Legality legal = check_legality(graph, g);
  std::string out;
  for (const auto& r : legal.reasons) out += (out.empty() ? "" : "; ") + r;
  if (out.empty()) out = shared_memory_refusal(graph, options.gemm, choose_config(m, n, k).config);
  return out;
}

static bool is_ready(const std::shared_future<std::string>& f) {
  return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

// The plan of a call's shape and strides: worked out at the first call, looked up after.
std::shared_ptr<const LaunchPlan> Kernel::Impl::plan_for(const runtime::BoundCall& call, bool wait) const {
  const PlanKey key{call.m, call.n, call.k, call.lda, call.ldb, call.ldc, call.ldd};
  {
    std::lock_guard lock(mu);
    if (auto it = plans.find(key); it != plans.end()) {
      const LaunchPlan& p = *it->second;
      if (!p.compiling.valid() || (!wait && !is_ready(p.compiling))) return it->second;
      plans.erase(it);  // its fused kernel is ready (or must be waited for): plan again
    }
  }
  auto plan = std::make_shared<LaunchPlan>();
  plan->fallback_reason = fallback_reason(call.m, call.n, call.k);
  if (plan->fallback_reason.empty()) {
    try {
      const ConfigChoice choice = choose_config(call.m, call.n, call.k);
      const KernelConfig& config = choice.config;
      plan->order = choice.order;
      record(call.m, call.n, call.k, config);
      bool loaded = false;
      {
        std::lock_guard lock(mu);
        loaded = fused.count(config.name()) || fused_errors.count(config.name());
      }
      if (!wait && !loaded) {
        std::shared_future<std::string> compiling = jit::compile_in_background(fused_request(config));
        if (!is_ready(compiling)) {
          plan->compiling = std::move(compiling);
          plan->fallback_reason = "its fused kernel is still compiling (the calls switch to it when it is ready)";
        }
      }
      if (!plan->compiling.valid()) plan->library = fused_library(config);
      plan->swap_ab = config.swap_ab;
    } catch (const RuntimeError& e) {
      plan->fallback_reason = fmt::format("the fused kernel did not compile: {}", e.what());
    }
  }
  if (plan->library) {
    // can_implement and the workspace size depend on the problem and its strides only.
    const evtc_gemm_args abi = call.abi(plan->swap_ab, plan->order);
    char why[256] = {0};
    auto can = reinterpret_cast<evtc_can_implement_fn>(plan->library->symbol("evtc_can_implement"));
    if (can(&abi, why, sizeof why) != EVTC_OK) {
      plan->fallback_reason = fmt::format("the fused kernel cannot run this problem: {}", why);
      plan->library.reset();
    } else {
      plan->workspace_bytes =
          reinterpret_cast<evtc_workspace_size_fn>(plan->library->symbol("evtc_workspace_size"))(&abi);
      plan->run = reinterpret_cast<evtc_run_fn>(plan->library->symbol("evtc_run"));
    }
  }
  std::lock_guard lock(mu);
  return plans.insert_or_assign(key, std::move(plan)).first->second;
}

void Kernel::Impl::forget_choices() const {
  std::lock_guard lock(mu);
  choices.clear();
  plans.clear();
}

Kernel::Kernel(const Graph& graph, const CompileOptions& given) : impl_(std::make_unique<Impl>()) {
  CompileOptions options = given;
  options.gemm.sm = target_arch(given.arch);
  if (std::string why = fp8_blockwise_refusal(options.gemm); !why.empty()) throw UserError(why);
  if (options.config) {
    if (std::string why = config_refusal(*options.config, options.gemm); !why.empty()) throw UserError(why);
    if (options.config->swap_ab)
      if (std::string why = swap_ab_refusal(graph, options.gemm); !why.empty())
        throw UserError(fmt::format("configuration {} computes the GEMM transposed (swap-AB), which this epilogue "
                                    "cannot take: {}",
                                    options.config->name(), why));
    if (std::string why = epilogue_config_refusal(graph, *options.config); !why.empty()) throw UserError(why);
    // Legal but slow for these operand layouts: the tuner and the tables never pick it.
    if (std::string why = tuning::operand_layout_refusal(*options.config, options.gemm); !why.empty())
      log_warning("configuration {} runs, but slowly: {}", options.config->name(), why);
  }
  for (auto [name, t] : {std::pair{'A', options.gemm.a_dtype}, std::pair{'B', options.gemm.b_dtype}})
    if (is_integer(t))
      throw UserError(fmt::format("operand {} is {}: integer dtypes are allowed only for [m] and [n] input vectors "
                                  "of the epilogue; A and B must be {}",
                                  name, dtype_name(t), or_list(float_dtype_names())));
  runtime::require_runnable_fp8(options.gemm.a_dtype, options.gemm.b_dtype,
                                options.gemm.a_layout == Layout::row_major,
                                options.gemm.b_layout == Layout::row_major);
  PipelineOptions popts;
  popts.cast_mode = options.cast_mode;
  popts.gemm = options.gemm;
  impl_->graph = run_pipeline(graph, popts);
  impl_->options = options;
  impl_->signature = make_signature(impl_->graph);
  impl_->tune_mode = tune_mode_from_env(options.tune_mode);
  impl_->tune_max_candidates = max_candidates_from_env(options.tune_max_candidates);
  impl_->fusion_disabled = options.disable_fusion || env_flag(Env::disable);
  impl_->wait_for_compile = options.wait_for_compile || env_flag(Env::wait_for_compile);
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

std::string Kernel::source(int64_t m, int64_t n, int64_t k) const {
  return backend::emit_dense_kernel(impl_->graph, impl_->options.gemm, config_for(m, n, k)).source;
}

void Kernel::compile(int64_t m, int64_t n, int64_t k) {
  if (const std::string why = impl_->fallback_reason(m, n, k); !why.empty())
    throw UserError("no fused kernel to compile for this epilogue: " + why);
  const KernelConfig config = config_for(m, n, k);
  const std::string path = jit::compile_cached(impl_->fused_request(config));
  impl_->record(m, n, k, config);
  std::lock_guard lock(impl_->mu);
  impl_->fused_path = path;
}

std::string Kernel::compile_fallback() {
  return jit::compile_cached(runtime::fallback_request(impl_->graph, impl_->signature, impl_->options.gemm.sm, &impl_->options.gemm));
}

bool Kernel::in_library(int64_t m, int64_t n, int64_t k) const {
  return jit::library_kernel(impl_->fused_request(config_for(m, n, k))).has_value();
}

bool Kernel::is_compiled(int64_t m, int64_t n, int64_t k) const {
  return jit::compiled_kernel(impl_->fused_request(config_for(m, n, k))).has_value();
}

std::string Kernel::fallback_reason(int64_t m, int64_t n, int64_t k) const {
  return impl_->fallback_reason(m, n, k);
}

ExecutionPath Kernel::run(const Arguments& args, cudaStream_t stream) const {
  const Impl& im = *impl_;
  runtime::BoundCall call = runtime::bind_arguments(im.signature, im.options.gemm, args, im.pointer_checks);

  // --- fused path ----------------------------------------------------------------------
  if (call.reasons.empty()) {
    if (im.tune_mode == TuneMode::first_call && !im.options.config)
      im.tune_on_first_call(call, stream);
    // Whether the stream is being captured into a CUDA graph, asked at most once per call.
    std::optional<bool> captured;
    auto capturing = [&] {
      if (!captured) {
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        cuda_check(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
        captured = status != cudaStreamCaptureStatusNone;
      }
      return *captured;
    };
    std::shared_ptr<const LaunchPlan> plan = im.plan_for(call, im.wait_for_compile);
    // Unfused while the fused kernel compiles, but a graph being captured keeps the kernels
    // it records: it waits for the fused one.
    if (plan->compiling.valid() && capturing()) plan = im.plan_for(call, true);
    if (!plan->fallback_reason.empty()) call.reasons.push_back(plan->fallback_reason);
    if (plan->library) {
      const evtc_gemm_args abi = call.abi(plan->swap_ab, plan->order);
      char why[256];
      why[0] = '\0';
      // Outside capture: this stream's kept workspace (no allocation per call, and the
      // library's launch cache sees the same arguments again). Inside: memory the graph owns.
      const int rc = [&] {
        const StreamWorkspaces::Lease workspace =
            im.workspaces.lease(stream, plan->workspace_bytes, plan->workspace_bytes && capturing());
        return plan->run(&abi, workspace.get(), stream, why, sizeof why);
      }();
      if (rc == EVTC_OK) return ExecutionPath::fused;
      // A compile-checked backend's kernel (sm_100a, sm_120a) that this GPU or driver cannot
      // load or launch: the unfused path answers instead, with the reason.
      if (backend_features(im.options.gemm.sm, im.options.gemm.a_dtype).verified)
        throw RuntimeError(fmt::format("fused kernel launch failed: {}", why));
      call.reasons.push_back(fmt::format("the {} fused kernel did not launch here: {}",
                                         arch_name(im.options.gemm.sm, true), why));
    }
  }

  // --- fallback: cuBLASLt + plain epilogue ---------------------------------------------
  std::string reason;
  for (const auto& r : call.reasons) reason += (reason.empty() ? "" : "; ") + r;
  im.log_once(reason);
  const int64_t m = call.m, n = call.n, k = call.k;
  runtime::require_runnable_fp8(args.a()->dtype, args.b()->dtype, call.a_layout == Layout::row_major,
                                call.b_layout == Layout::row_major, k, call.lda, call.ldb);
  auto lib = im.fallback_library();
  using scratch_fn = size_t (*)(int64_t, int64_t);
  const size_t scratch_floats =
      reinterpret_cast<scratch_fn>(lib->symbol("evtc_fallback_scratch_floats"))(m, n);
  // fp8 block scales: A·scale_a and B·scale_b in fp32 (the K-major layouts the fp8 operands
  // have), then an fp32 GEMM of those.
  const bool blockwise = im.options.gemm.fp8_blockwise;
  const size_t scaled_floats = blockwise ? size_t(m) * k + size_t(n) * k : 0;
  float* acc = nullptr;
  cuda_check(cudaMallocAsync(reinterpret_cast<void**>(&acc),
                             (size_t(m) * n + scratch_floats + scaled_floats) * sizeof(float), stream),
             "fallback workspace allocation");
  const evtc_gemm_args abi = call.abi();
  if (blockwise) {
    float* a32 = acc + size_t(m) * n + scratch_floats;
    float* b32 = a32 + size_t(m) * k;
    using scale_fn = int (*)(const evtc_gemm_args*, float*, float*, void*);
    if (reinterpret_cast<scale_fn>(lib->symbol("evtc_fallback_scale_operands"))(&abi, a32, b32, stream) != EVTC_OK) {
      cudaFreeAsync(acc, stream);
      throw RuntimeError("fallback: scaling the block-scaled fp8 operands failed to launch" +
                         arch_mismatch_note(im.options.gemm.sm));
    }
    runtime::cublaslt_matmul({a32, DType::f32, true, k}, {b32, DType::f32, false, k}, acc, DType::f32, m, n, k,
                             stream);
  } else {
    const DType a_dtype = args.a()->dtype, b_dtype = args.b()->dtype;
    runtime::cublaslt_matmul({call.a, a_dtype, call.a_layout == Layout::row_major, call.lda},
                             {call.b, b_dtype, call.b_layout == Layout::row_major, call.ldb}, acc,
                             DType::f32, m, n, k, stream);
  }
  using fallback_fn = int (*)(const evtc_gemm_args*, const float*, float*, void*);
  const int rc = reinterpret_cast<fallback_fn>(lib->symbol("evtc_fallback_run"))(
      &abi, acc, acc + size_t(m) * n, stream);
  cudaFreeAsync(acc, stream);
  if (rc != EVTC_OK) throw RuntimeError("fallback epilogue launch failed" + arch_mismatch_note(im.options.gemm.sm));
  return ExecutionPath::fallback;
}

}  // namespace evtc
