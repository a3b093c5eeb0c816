// GroupedKernel: grouped (MoE) GEMMs with fused epilogues (include/evtc/grouped.hpp).
#include <fmt/format.h>

#include <chrono>
#include <future>
#include <mutex>
#include <set>

#include "backends/sm90/sm90_grouped_emitter.hpp"
#include "evtc/arch.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/device/abi.h"
#include "evtc/device/grouped_abi.h"
#include "evtc/error.hpp"
#include "evtc/grouped.hpp"
#include "jit/kernel_cache.hpp"
#include "jit/kernel_library.hpp"
#include "runtime/bind.hpp"
#include "runtime/grouped_bind.hpp"
#include "runtime/selection/cost_model.hpp"
#include "runtime/kernel_requests.hpp"
#include "runtime/cuda_check.hpp"
#include "runtime/stream_workspaces.hpp"
#include "evtc/options.hpp"
#include "support/environment.hpp"
#include "support/logging.hpp"

namespace evtc {

BatchedTensorRef BatchedTensorRef::contiguous(const void* data, DType dtype, int64_t batches,
                                              int64_t rows, int64_t cols) {
  return BatchedTensorRef{const_cast<void*>(data), dtype, batches, rows, cols, rows * cols, cols, 1};
}

// Ping-pong 128×192 without a cluster: on the H200 it was the fastest of five configurations
// on both grouped problems measured (bench/results/20261125-0153-h200-grouped-moe.json, gated
// epilogue): 0.3116 ms against 0.3492 for cooperative 128×256 with a 1×2 cluster (the previous
// default) on the moe layer of bench/models.py (8 ragged groups of ~2048 rows, N 2816, K 2048),
// 0.2279 against 0.2325 on W6. A 2×1 cluster pads every group's M tiles to an even count, a 1×2
// one every group's N tiles.
KernelConfig default_grouped_config() {
  return KernelConfig::of(MainloopSchedule::pingpong, 128, 192, 1);
}

// fp8: 128-wide K tiles, and cooperative 128×128 tiles as for dense fp8 (a warp group holding
// 64×256 accumulators twice, for the two-level accumulation, would spill); block-scaled tiles
// also hold whole 128-wide scale blocks along N and K.
KernelConfig default_grouped_config(const GemmDesc& gemm) {
  if (!is_fp8(gemm.a_dtype) && !is_fp8(gemm.b_dtype)) return default_grouped_config();
  KernelConfig c = KernelConfig::of(MainloopSchedule::cooperative, 128, 128, 1);
  c.tile_k = 128;
  return c;
}

namespace {

// Grouped kernels are generated for sm_90a only (the ptr-array kernels of the other backends are
// not built): why `arch` runs them unfused, naming it.
std::string grouped_arch_refusal(int arch) {
  if (arch == kVerifiedArch) return "";
  if (std::string why = arch_refusal(arch); !why.empty()) return why;
  return arch_lacks(arch, "grouped GEMMs");
}

}  // namespace

struct GroupedKernel::Impl {
  Graph graph;
  Graph input_graph;  // as given: the unfused path's dense kernel runs the pipeline on it
  GroupedOptions options;
  bool wait_for_compile = true;
  int arch = kVerifiedArch;  // target_arch: on another architecture every call runs unfused
  KernelConfig config;
  KernelSignature signature;
  std::string output;  // Y: the main output, or the gated [m,n/2] output
  DType output_dtype = DType::bf16;
  bool gated = false;
  mutable std::mutex mu;
  mutable std::shared_ptr<jit::Library> library;
  mutable evtc_grouped_can_implement_fn can_implement = nullptr;
  mutable evtc_grouped_workspace_size_fn workspace_size = nullptr;
  mutable evtc_grouped_run_fn run = nullptr;
  mutable runtime::PointerChecks pointer_checks;
  mutable StreamWorkspaces workspaces;  // the fused kernel's group tables and CUTLASS's workspace
  // The unfused path (wait_for_compile off): the fused kernel's background compile, and a dense
  // kernel of the same epilogue that never fuses (cuBLASLt + the plain epilogue), built at its
  // first use. Under mu.
  mutable std::shared_future<std::string> compiling;
  mutable std::unique_ptr<Kernel> unfused;
  mutable std::set<std::string> logged;

  jit::CompileRequest request() const { return runtime::grouped_request(graph, options, config); }
  void load() const;
  Kernel& unfused_kernel() const;
  // Whether this call runs the fused kernel; false sets `why` (still compiling, or its compile
  // failed) and the call runs unfused.
  bool use_fused(cudaStream_t stream, std::string& why) const;
  void log_once(const std::string& reason) const;
};

namespace runtime {

jit::CompileRequest grouped_request(const Graph& graph, const GroupedOptions& options, const KernelConfig& config) {
  return {.source = sm90::emit_grouped_kernel(graph, options.gemm, config).source,
          .label = "grouped " + config.name(),
          .expression = expression_text(graph),
          .needs_cutlass = true,
          .sm = 90};
}

}  // namespace runtime

void GroupedKernel::Impl::load() const {
  std::lock_guard lock(mu);
  if (library) return;
  runtime::record_kernel(graph, option_text(options.gemm, options.cast_mode, options.precise_math, config), true,
                         0, 0, 0, config);
  auto lib = jit::load_or_compile(request());
  auto version = reinterpret_cast<evtc_abi_version_fn>(lib->symbol("evtc_abi_version"));
  if (version() != EVTC_ABI_VERSION)
    throw RuntimeError(fmt::format("{} has ABI version {}, expected {}", lib->path(), version(),
                                   EVTC_ABI_VERSION));
  can_implement = reinterpret_cast<evtc_grouped_can_implement_fn>(lib->symbol("evtc_grouped_can_implement"));
  workspace_size = reinterpret_cast<evtc_grouped_workspace_size_fn>(lib->symbol("evtc_grouped_workspace_size"));
  run = reinterpret_cast<evtc_grouped_run_fn>(lib->symbol("evtc_grouped_run"));
  library = lib;
}

GroupedKernel::GroupedKernel(const Graph& graph, const GroupedOptions& options)
    : impl_(std::make_unique<Impl>()) {
  PipelineOptions popts;
  popts.cast_mode = options.cast_mode;
  popts.gemm = options.gemm;
  impl_->graph = run_pipeline(graph, popts);
  impl_->input_graph = graph;
  impl_->options = options;
  impl_->wait_for_compile = options.wait_for_compile || env_flag(Env::wait_for_compile);
  impl_->arch = target_arch(options.arch);
  impl_->config = options.config.value_or(default_grouped_config(options.gemm));
  impl_->config.precise_math = options.precise_math;
  impl_->config.fp8_fast_accum = false;
  auto refusals = sm90::grouped_refusals(impl_->graph, options.gemm);
  if (std::string why = config_refusal(impl_->config, options.gemm); !why.empty() && refusals.empty())
    refusals.push_back(std::move(why));
  if (impl_->config.fp8_promotion_k > 0 && refusals.empty())
    refusals.push_back(fmt::format("configuration {} sets fp8's promotion interval, which grouped kernels do "
                                   "not take",
                                   impl_->config.name()));
  if (!refusals.empty()) {
    std::string text;
    for (const auto& r : refusals) text += (text.empty() ? "" : "; ") + r;
    throw UserError("cannot build a grouped kernel: " + text);
  }
  impl_->signature = make_signature(impl_->graph);
  impl_->output = sm90::grouped_output_name(impl_->graph);
  impl_->gated = impl_->signature.d_name.empty();
  impl_->output_dtype = impl_->signature.d_dtype;
  for (const OperandSlot& s : impl_->signature.pointers)
    if (s.name == impl_->output) impl_->output_dtype = s.dtype;
}

GroupedKernel::~GroupedKernel() = default;
GroupedKernel::GroupedKernel(GroupedKernel&&) noexcept = default;
GroupedKernel& GroupedKernel::operator=(GroupedKernel&&) noexcept = default;

std::string GroupedKernel::compile() const {
  impl_->load();
  return impl_->library->path();
}

Kernel& GroupedKernel::Impl::unfused_kernel() const {
  std::lock_guard lock(mu);
  if (!unfused) {
    CompileOptions c;
    c.gemm = options.gemm;
    c.cast_mode = options.cast_mode;
    c.precise_math = options.precise_math;
    c.disable_fusion = true;
    c.arch = arch;
    unfused = std::make_unique<Kernel>(input_graph, c);
  }
  return *unfused;
}

std::string GroupedKernel::compile_fallback() const { return impl_->unfused_kernel().compile_fallback(); }

void GroupedKernel::Impl::log_once(const std::string& reason) const {
  std::lock_guard lock(mu);
  if (logged.insert(reason).second)
    log_warning("running unfused (cuBLASLt + plain epilogue, group by group): {}", reason);
}

bool GroupedKernel::Impl::use_fused(cudaStream_t stream, std::string& why) const {
  if (std::string no = grouped_arch_refusal(arch); !no.empty()) {
    why = std::move(no);
    return false;
  }
  std::shared_future<std::string> pending;
  {
    std::lock_guard lock(mu);
    if (library || wait_for_compile) return true;  // loaded, or load() compiles and waits
    if (!compiling.valid()) compiling = jit::compile_in_background(request());
    pending = compiling;
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess)
    throw RuntimeError("cudaStreamIsCapturing failed");
  // A graph being captured keeps the kernels it records (and the unfused path reads the
  // offsets back, which capture forbids): wait for the fused kernel, or fail with its error.
  if (status != cudaStreamCaptureStatusNone) return true;
  if (pending.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    why = "its fused kernel is still compiling (the calls switch to it when it is ready)";
    return false;
  }
  try {
    pending.get();
    return true;
  } catch (const std::exception& e) {
    why = fmt::format("the fused kernel did not compile: {}", e.what());
    return false;
  }
}

bool GroupedKernel::in_library() const { return jit::library_kernel(impl_->request()).has_value(); }

std::string GroupedKernel::source() const { return impl_->request().source; }
const Graph& GroupedKernel::graph() const { return impl_->graph; }
const KernelSignature& GroupedKernel::signature() const { return impl_->signature; }
const KernelConfig& GroupedKernel::config() const { return impl_->config; }
const std::string& GroupedKernel::output_name() const { return impl_->output; }
DType GroupedKernel::output_dtype() const { return impl_->output_dtype; }
bool GroupedKernel::gated() const { return impl_->gated; }
const GemmDesc& GroupedKernel::gemm() const { return impl_->options.gemm; }

FusionEstimate GroupedKernel::estimate(int64_t total_m, int64_t n, int64_t k, int64_t groups,
                                       const UnfusedWork& unfused) const {
  GemmDesc g = impl_->options.gemm;
  g.m = total_m;
  g.n = n;
  g.k = k;
  const double out = double(total_m) * (gated() ? n / 2 : n) * dtype_bytes(output_dtype());
  // Every group reads its own weights: the B traffic is G times one group's.
  const double other_weights = double(groups - 1) * n * k * dtype_bytes(g.b_dtype);
  FusionEstimate e = estimate_for(config(), g, out, other_weights, unfused);
  e.cublas_us = grouped_mm_us(g, other_weights, unfused.gemms);  // the unfused path's GEMMs: torch._grouped_mm
  e.basis = "model (grouped)";
  return e;
}

std::string GroupedKernel::shape_reason(int64_t n, int64_t k) const {
  if (std::string why = grouped_arch_refusal(impl_->arch); !why.empty()) return why;
  return runtime::grouped_shape_problem(impl_->gated, impl_->output, n, k, impl_->options.gemm.a_dtype);
}

using runtime::cuda_check;

ExecutionPath GroupedKernel::run(const GroupedArguments& args, cudaStream_t stream) const {
  const Impl& im = *impl_;
  const GemmDesc& gemm = im.options.gemm;
  const KernelSignature& sig = im.signature;
  const runtime::GroupedCall call = runtime::bind_grouped(sig, gemm, im.gated, im.output, im.output_dtype, args);
  const TensorRef& X = call.x;
  const BatchedTensorRef& W = call.w;
  const TensorRef& Y = call.y;
  const int64_t groups = call.groups, total_m = call.total_m, n = call.n, k = call.k;
  const int64_t kb = call.k_blocks, nb = call.n_blocks;
  const std::string& out_name = im.output;
  for (const auto& [p, what] : call.device_ptrs) im.pointer_checks.check(p, [&] { return what; });

  // --- unfused, while the fused kernel compiles --------------------------------------------
  if (std::string why; !im.use_fused(stream, why)) {
    im.log_once(why);
    std::vector<int32_t> ends(size_t(groups), 0);
    cuda_check(cudaMemcpyAsync(ends.data(), args.offsets(), ends.size() * sizeof(int32_t), cudaMemcpyDeviceToHost,
                               stream),
               "reading the offsets back");
    cuda_check(cudaStreamSynchronize(stream), "reading the offsets back");
    Kernel& dense = im.unfused_kernel();
    auto at = [](void* base, int64_t elements, DType dtype) {
      return static_cast<void*>(static_cast<char*>(base) + elements * dtype_bytes(dtype));
    };
    int64_t start = 0;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t end = ends[size_t(g)];
      if (end < start || end > total_m)
        throw UserError(fmt::format("offsets[{}] = {}: the end offsets must be non-decreasing and at most x's {} "
                                    "rows (the previous group ends at {})",
                                    g, end, total_m, start));
      if (end == start) continue;
      const int64_t rows = end - start;
      Arguments d;
      d.a(TensorRef{at(X.data, start * X.row_stride, X.dtype), X.dtype, rows, k, X.row_stride, 1});
      void* wg = at(W.data, g * W.batch_stride, W.dtype);
      d.b(call.k_major ? TensorRef{wg, W.dtype, n, k, W.row_stride, 1}.transposed()
                       : TensorRef{wg, W.dtype, k, n, W.row_stride, 1});
      for (size_t i = 0; i < sig.pointers.size(); ++i) {
        const OperandSlot& s = sig.pointers[i];
        if (s.is_output) continue;
        const TensorRef& t = args.tensors().at(s.name);
        void* p = call.group_strides[i] == 0 ? t.data : at(t.data, g * call.group_strides[i], t.dtype);
        d.set(s.name, s.kind == NodeKind::row_vec ? TensorRef::vector(p, t.dtype, n) : TensorRef::scalar(p, t.dtype));
      }
      if (gemm.fp8_blockwise) {  // the group's rows of scale_a; its scale_b as B's K-blocks × N-blocks
        const TensorRef& sa = *call.scale_a;
        const BatchedTensorRef& sb = *call.scale_b;
        d.scale_a(TensorRef{at(sa.data, start * sa.row_stride, DType::f32), DType::f32, rows, kb, sa.row_stride,
                            sa.col_stride});
        d.scale_b(TensorRef{at(sb.data, g * sb.batch_stride, DType::f32), DType::f32, nb, kb, sb.row_stride,
                            sb.col_stride}
                      .transposed());
      }
      for (const auto& [name, value] : args.scalars()) d.set(name, value);
      d.set(out_name,
            TensorRef{at(Y.data, start * Y.row_stride, Y.dtype), Y.dtype, rows, call.out_cols, Y.row_stride, 1});
      dense.run(d, stream);
      start = end;
    }
    return ExecutionPath::fallback;
  }

  // --- launch ----------------------------------------------------------------------------
  im.load();
  evtc_grouped_args a = call.abi();
  char why[256] = {0};
  if (im.can_implement(&a, why, sizeof why) != EVTC_OK)
    throw UserError(fmt::format("CUTLASS cannot implement this grouped problem (G={}, N={}, K={}): {}",
                                groups, n, k, why));
  const size_t bytes = im.workspace_size(&a);
  // Outside capture: this stream's kept workspace, so that a call allocates nothing (an
  // allocation and its release cost about as much host time as the launch). Inside: memory
  // the CUDA graph owns.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cuda_check(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  const int rc = [&] {
    const StreamWorkspaces::Lease workspace =
        im.workspaces.lease(stream, bytes, capture != cudaStreamCaptureStatusNone);
    return im.run(&a, workspace.get(), stream, why, sizeof why);
  }();
  if (rc != EVTC_OK) throw RuntimeError(fmt::format("grouped kernel launch failed: {}", why));
  return ExecutionPath::fused;
}

}  // namespace evtc
