// Kernel's configuration choice and autotuning: which configuration a problem runs with,
// compiling candidates in parallel, timing them on scratch outputs, persisting the winner.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "evtc/arch.hpp"
#include "evtc/error.hpp"
#include "evtc/ir_text.hpp"
#include "support/environment.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/event_timing.hpp"
#include "target/device_info.hpp"
#include "runtime/kernel_impl.hpp"
#include "runtime/selection/candidates.hpp"
#include "runtime/selection/default_config.hpp"
#include "support/logging.hpp"

namespace evtc {
namespace {

size_t compile_jobs() { return size_t(jit::compile_slots()); }



size_t output_bytes(const OperandSlot& s, int64_t m, int64_t n) {
  const size_t count = s.shape == Shape::full ? size_t(m) * n
                       : s.shape == Shape::half ? size_t(m) * (n / 2)
                       : s.shape == Shape::row ? size_t(n)
                       : s.shape == Shape::col ? size_t(m)
                                               : 1;
  return count * dtype_bytes(s.dtype);
}

}  // namespace

const char* tune_mode_name(TuneMode m) {
  switch (m) {
    case TuneMode::off: return "off";
    case TuneMode::first_call: return "first-call";
    case TuneMode::ahead: return "ahead";
  }
  return "?";
}

std::optional<TuneMode> parse_tune_mode(const std::string& name) {
  for (auto m : {TuneMode::off, TuneMode::first_call, TuneMode::ahead})
    if (name == tune_mode_name(m)) return m;
  return std::nullopt;
}

std::string ConfigChoice::describe() const {
  switch (source) {
    case Source::fixed: return "given";
    case Source::tuned: return fmt::format("tuned for {}x{}x{}", tuned_m, tuned_n, tuned_k);
    case Source::nearest_tuned:
      return fmt::format("nearest tuned shape, {}x{}x{}", tuned_m, tuned_n, tuned_k);
    case Source::table: return fmt::format("table {} at {}x{}x{}", table, tuned_m, tuned_n, tuned_k);
    case Source::heuristic: return "heuristic default";
  }
  return "?";
}

std::optional<tuning::ProblemIdentity> Kernel::Impl::identity() const {
  const auto dev = current_device();
  // Kernels of a verified backend only (run and timed on such GPUs), built for the GPU they run on.
  if (!dev || dev->arch != options.gemm.sm || !backend_features(options.gemm.sm, options.gemm.a_dtype).verified)
    return std::nullopt;
  tuning::ProblemIdentity id;
  id.graph_hash = graph_hash_hex(graph);
  id.gemm = options.gemm;
  id.gemm.m = id.gemm.n = id.gemm.k = 0;
  id.precise_math = options.precise_math;
  id.arch = 90;
  id.device_name = dev->name;
  return id;
}

ConfigChoice Kernel::Impl::choose_config(int64_t m, int64_t n, int64_t k) const {
  require_problem_size(m, n, k);
  ConfigChoice choice;
  if (options.config) {
    choice.config = *options.config;
    choice.source = ConfigChoice::Source::fixed;
  } else {
    {
      std::lock_guard lock(mu);
      if (auto it = choices.find({m, n, k}); it != choices.end()) return it->second;
    }
    GemmDesc g = options.gemm;
    g.m = m;
    g.n = n;
    g.k = k;
    // default_config's own first step is this table lookup: asking it directly keeps the entry.
    if (const auto t = selection::table_choice(graph, g)) {
      choice.config = t->config;
      choice.order = t->entry.order;
      choice.source = ConfigChoice::Source::table;
      choice.tuned_m = t->entry.m;
      choice.tuned_n = t->entry.n;
      choice.tuned_k = t->entry.k;
      choice.table = t->table;
    } else {
      choice.config = default_config(graph, g);
    }
    // Unknown sizes (0) have no nearest shape: they take the heuristic default.
    const bool sized = m > 0 && n > 0 && k > 0;
    const auto id = tune_mode == TuneMode::off || !sized ? std::nullopt : identity();
    if (id) {
      std::lock_guard lock(mu);
      if (!records) records = tuning::TuningStore(jit::cache_dir(), *id).all();
      // The nearest tuned shape's choice, when it suits this shape too.
      if (auto r = tuning::nearest(*records, m, n, k);
          r && tuning::prune_reason(r->best, graph, g).empty()) {
        choice.config = r->best;
        choice.order = r->order;
        choice.source = r->m == m && r->n == n && r->k == k ? ConfigChoice::Source::tuned
                                                            : ConfigChoice::Source::nearest_tuned;
        choice.tuned_m = r->m;
        choice.tuned_n = r->n;
        choice.tuned_k = r->k;
        choice.table.clear();
        // A transposed tile borrowed from a smaller M widens to one tile across this M, as a
        // table entry's does (selection::one_token_tile).
        if (choice.source == ConfigChoice::Source::nearest_tuned) {
          const tuning::DeviceLimits limits = selection::current_device_limits();
          if (const auto wide = selection::one_token_tile(choice.config, g, limits, r->m);
              wide && tuning::prune_reason(*wide, graph, g, limits).empty())
            choice.config = *wide;
        }
      }
    }
    // A visiting order is kept at the shape it was measured at only: borrowed by another shape
    // (a table's nearest entry, the nearest tuned shape) it runs CUTLASS's own. Of five shapes
    // outside the H200 table whose nearest entries name an order, each ran as fast or faster with
    // CUTLASS's (1.419 -> 1.193x cuBLAS at 160x3072x2048, 1.057 -> 1.026x at 7000x5120x5120;
    // docs/backend.md, "Shapes outside the table").
    if (choice.tuned_m != m || choice.tuned_n != n || choice.tuned_k != k) choice.order = VisitOrder{};
  }
  if (options.visit_order) choice.order = *options.visit_order;
  choice.config = selection::with_kernel_options(choice.config, options);
  if (!options.config) {
    std::lock_guard lock(mu);
    choices[{m, n, k}] = choice;
  }
  return choice;
}

std::map<std::string, std::string> Kernel::Impl::compile_configs(
    const std::vector<KernelConfig>& configs, const ProgressFn& progress) const {
  std::map<std::string, std::string> errors;
  std::mutex progress_mu;
  std::atomic<size_t> next{0};
  int done = 0;
  const int total = int(configs.size());
  if (progress) progress("compiling", 0, total);
  {
    std::vector<std::jthread> workers;
    for (size_t w = 0; w < std::min(compile_jobs(), configs.size()); ++w)
      workers.emplace_back([&] {
        for (size_t i; (i = next++) < configs.size();) {
          std::string error;
          try {
            jit::compile_cached(fused_request(configs[i]));
          } catch (const Error& e) {
            error = e.what();
          }
          std::lock_guard lock(progress_mu);
          if (!error.empty()) errors[configs[i].name()] = error;
          ++done;
          if (progress) progress("compiling", done, total);
        }
      });
  }  // the jthreads join here
  return errors;
}

TuneResult Kernel::Impl::tune(const runtime::BoundCall& call, cudaStream_t stream,
                              const ProgressFn& progress) const {
  const auto id = identity();
  if (!id) throw RuntimeError("autotuning needs a Hopper (sm_90) GPU as the current device");
  const int64_t m = call.m, n = call.n, k = call.k;
  GemmDesc g = options.gemm;
  g.m = m;
  g.n = n;
  g.k = k;
  tuning::DeviceLimits limits;
  limits.sm_count = current_device()->sm_count;
  std::vector<KernelConfig> candidates = tuning::candidate_configs(graph, g, limits, tune_max_candidates);
  for (auto& c : candidates) c.precise_math = c.precise_math || options.precise_math;
  const auto compile_errors = compile_configs(candidates, progress);

  // Scratch outputs: the candidates write there, never to the caller's buffers.
  runtime::BoundCall scratch = call;
  std::vector<runtime::DeviceBuffer> buffers;
  if (scratch.d) {
    buffers.emplace_back(size_t(m) * scratch.ldd * dtype_bytes(signature.d_dtype));
    scratch.d = buffers.back().get();
  }
  for (size_t i = 0; i < signature.pointers.size(); ++i)
    if (signature.pointers[i].is_output) {
      buffers.emplace_back(output_bytes(signature.pointers[i], m, n));
      scratch.ptrs[i] = buffers.back().get();
    }

  TuneResult result;
  result.m = m;
  result.n = n;
  result.k = k;
  auto timed = [&](const KernelConfig& config, const VisitOrder& order) {
    auto lib = fused_library(config);
    const evtc_gemm_args abi = scratch.abi(config.swap_ab, order);
    char why[256] = {0};
    if (reinterpret_cast<evtc_can_implement_fn>(lib->symbol("evtc_can_implement"))(&abi, why, sizeof why) != EVTC_OK)
      throw RuntimeError(fmt::format("CUTLASS cannot implement it: {}", why));
    const size_t ws_bytes = reinterpret_cast<evtc_workspace_size_fn>(lib->symbol("evtc_workspace_size"))(&abi);
    runtime::DeviceBuffer workspace(ws_bytes);
    auto run = reinterpret_cast<evtc_run_fn>(lib->symbol("evtc_run"));
    return runtime::median_ms(
        [&] {
          if (run(&abi, workspace.get(), stream, why, sizeof why) != EVTC_OK)
            throw RuntimeError(fmt::format("launch failed: {}", why));
        },
        stream, 5, 20);
  };
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (progress) progress("timing", int(i), int(candidates.size()));
    TuneResult::Candidate cand{candidates[i], -1, {}};
    if (auto it = compile_errors.find(candidates[i].name()); it != compile_errors.end()) {
      cand.error = "did not compile: " + it->second.substr(0, 300);
    } else {
      try {
        cand.median_ms = timed(candidates[i], VisitOrder{});
      } catch (const Error& e) {
        cand.error = e.what();
      }
    }
    result.candidates.push_back(cand);
  }
  if (progress) progress("timing", int(candidates.size()), int(candidates.size()));

  const TuneResult::Candidate* best = nullptr;
  for (const auto& c : result.candidates)
    if (c.median_ms >= 0 && (!best || c.median_ms < best->median_ms)) best = &c;
  if (!best) {
    std::string why;
    for (const auto& c : result.candidates) why += fmt::format("\n  {}: {}", c.config.name(), c.error);
    throw RuntimeError(fmt::format("autotuning {}x{}x{}: no candidate ran:{}", m, n, k, why));
  }
  result.best = best->config;
  result.best_ms = best->median_ms;
  // The visiting orders, on the best configuration only (run-time arguments: no compiles). The
  // candidates were timed with CUTLASS's order, which is timed again here beside the others so
  // that all orders are compared under the same conditions; another order is kept only where it
  // is at least VisitOrder::keep_margin faster (noise must not pick one).
  if (best->config.schedule != MainloopSchedule::multistage) {
    const std::vector<VisitOrder> orders = VisitOrder::all();
    double heuristic_ms = -1;
    for (size_t i = 0; i < orders.size(); ++i) {
      if (progress) progress("timing visiting orders", int(i), int(orders.size()));
      try {
        const double ms = timed(result.best, orders[i]);
        result.orders.push_back({orders[i], ms});
        if (orders[i] == VisitOrder{}) heuristic_ms = ms;
      } catch (const Error& e) {
        log_debug("tuning {}x{}x{}: {} with order {}: {}", m, n, k, result.best.name(), orders[i].name(), e.what());
      }
    }
    if (progress) progress("timing visiting orders", int(orders.size()), int(orders.size()));
    if (heuristic_ms > 0) {
      result.best_ms = heuristic_ms;
      for (const auto& o : result.orders)
        if (o.median_ms > 0 && o.median_ms < result.best_ms && o.median_ms < heuristic_ms * (1 - VisitOrder::keep_margin)) {
          result.best_order = o.order;
          result.best_ms = o.median_ms;
        }
    }
  }
  {
    std::lock_guard lock(mu);
    if (auto it = fused.find(result.best.name()); it != fused.end()) fused_path = it->second->path();
  }

  tuning::TuningRecord record;
  record.m = m;
  record.n = n;
  record.k = k;
  record.best = result.best;
  record.best_ms = result.best_ms;
  record.order = result.best_order;
  for (const auto& o : result.orders) record.orders.emplace_back(o.order.name(), o.median_ms);
  record.identity = *id;
  record.tuned_at = tuning::utc_now();
  for (const auto& c : result.candidates)
    record.candidates.push_back({c.config.name(), c.median_ms, c.error});
  result.record_path = tuning::TuningStore(jit::cache_dir(), *id).save(record);
  {
    std::lock_guard lock(mu);
    if (records) {
      std::erase_if(*records, [&](const auto& r) { return r.m == m && r.n == n && r.k == k; });
      records->push_back(record);
    }
  }
  forget_choices();
  return result;
}

void Kernel::Impl::tune_on_first_call(const runtime::BoundCall& call, cudaStream_t stream) const {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capturing) != cudaSuccess) cudaGetLastError();
  if (capturing != cudaStreamCaptureStatusNone) return;
  if (choose_config(call.m, call.n, call.k).source == ConfigChoice::Source::tuned) return;
  if (!fallback_reason(call.m, call.n, call.k).empty()) return;
  {
    std::lock_guard lock(mu);
    // One attempt per shape and Kernel, even when it fails or another thread is at it.
    if (!logged.insert(fmt::format("tune {}x{}x{}", call.m, call.n, call.k)).second) return;
  }
  ProgressFn progress;
  if (log_enabled(LogLevel::info))
    progress = [&, last = std::string()](const std::string& stage, int done, int total) mutable {
      // One line per stage (compiling, timing) and its end, not one per candidate.
      if (stage == last && done != total) return;
      last = stage;
      log_info("tuning {}x{}x{}: {} {}/{}", call.m, call.n, call.k, stage, done, total);
    };
  try {
    const TuneResult r = tune(call, stream, progress);
    log_info("tuned {}x{}x{}: {} ({:.4f} ms)", r.m, r.n, r.k, r.best.name(), r.best_ms);
  } catch (const RuntimeError& e) {
    log_warning("tuning failed, keeping the current configuration: {}", e.what());
  }
}

KernelConfig Kernel::config_for(int64_t m, int64_t n, int64_t k) const {
  return impl_->choose_config(m, n, k).config;
}

ConfigChoice Kernel::config_choice(int64_t m, int64_t n, int64_t k) const {
  return impl_->choose_config(m, n, k);
}

std::vector<KernelConfig> Kernel::tuning_candidates(int64_t m, int64_t n, int64_t k) const {
  require_problem_size(m, n, k);
  GemmDesc g = impl_->options.gemm;
  g.m = m;
  g.n = n;
  g.k = k;
  const tuning::DeviceLimits limits = selection::current_device_limits();
  auto out = tuning::candidate_configs(impl_->graph, g, limits, impl_->tune_max_candidates);
  for (auto& c : out) c.precise_math = c.precise_math || impl_->options.precise_math;
  return out;
}

std::map<std::string, std::string> Kernel::compile_configs(const std::vector<KernelConfig>& configs,
                                                           const ProgressFn& progress) {
  return impl_->compile_configs(configs, progress);
}

TuneResult Kernel::tune(const Arguments& args, cudaStream_t stream, const ProgressFn& progress) {
  const runtime::BoundCall call =
      runtime::bind_arguments(impl_->signature, impl_->options.gemm, args, impl_->pointer_checks);
  std::string reason;
  for (const auto& r : call.reasons) reason += (reason.empty() ? "" : "; ") + r;
  if (reason.empty()) reason = impl_->fallback_reason(call.m, call.n, call.k);
  if (!reason.empty())
    throw UserError(fmt::format("cannot tune: this problem does not take the fused path: {}", reason));
  return impl_->tune(call, stream, progress);
}

}  // namespace evtc
