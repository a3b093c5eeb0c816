// Kernel's state, shared by kernel.cpp (construction, the run path) and selection/tuner.cpp
// (configuration choice and autotuning).
#pragma once
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "evtc/runtime.hpp"
#include "jit/kernel_cache.hpp"
#include "runtime/selection/candidates.hpp"
#include "runtime/selection/tuning_store.hpp"
#include "runtime/bind.hpp"
#include "runtime/stream_workspaces.hpp"

namespace evtc {

// What the run path remembers about one problem shape and stride set, so that a repeated
// call does not re-run legality checks, configuration lookup or CUTLASS's can_implement.
struct LaunchPlan {
  std::string fallback_reason;  // non-empty: this shape never takes the fused path
  std::shared_ptr<jit::Library> library;
  evtc_run_fn run = nullptr;
  size_t workspace_bytes = 0;
  bool swap_ab = false;  // the kernel computes the transposed problem (BoundCall::abi)
  VisitOrder order;      // the tile scheduler's visiting order (ConfigChoice::order)
  // Valid while the shape runs unfused only because its fused kernel is still compiling
  // (CompileOptions::wait_for_compile off): the plan is made again once this is ready.
  std::shared_future<std::string> compiling;
};
using PlanKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;

// The sizes a caller asks about (compile, config_for, fallback_reason, ...): positive, or 0
// where not known yet; a UserError naming the first negative one otherwise.
void require_problem_size(int64_t m, int64_t n, int64_t k);

struct Kernel::Impl {
  Graph graph;
  CompileOptions options;
  KernelSignature signature;
  TuneMode tune_mode = TuneMode::ahead;
  size_t tune_max_candidates = 6;
  bool fusion_disabled = false;
  bool wait_for_compile = true;

  mutable std::mutex mu;
  // Compiled fused kernels by configuration name, and configurations that failed to compile
  // (kept so each failure is reported once).
  mutable std::map<std::string, std::shared_ptr<jit::Library>> fused;
  mutable std::map<std::string, std::string> fused_errors;
  mutable std::string fused_path;  // the latest compiled or loaded
  mutable std::shared_ptr<jit::Library> fallback;
  mutable std::set<std::string> logged;
  // Shared pointers: a call keeps its plan while forget_choices clears the map.
  mutable std::map<PlanKey, std::shared_ptr<const LaunchPlan>> plans;
  mutable StreamWorkspaces workspaces;
  mutable std::map<std::tuple<int64_t, int64_t, int64_t>, ConfigChoice> choices;
  // Tuned records of this graph on the current device, read once (nullopt: not yet read).
  mutable std::optional<std::vector<tuning::TuningRecord>> records;
  mutable runtime::PointerChecks pointer_checks;

  void log_once(const std::string& reason) const;
  ConfigChoice choose_config(int64_t m, int64_t n, int64_t k) const;
  // The identity tuned choices are stored under; nullopt without a usable GPU.
  std::optional<tuning::ProblemIdentity> identity() const;
  jit::CompileRequest fused_request(const KernelConfig& config) const;
  // Adds this kernel for problems of m×n×k with `config` to the kernel list being recorded.
  void record(int64_t m, int64_t n, int64_t k, const KernelConfig& config) const;
  std::shared_ptr<jit::Library> fused_library(const KernelConfig& config) const;
  std::shared_ptr<jit::Library> fallback_library() const;
  std::string fallback_reason(int64_t m, int64_t n, int64_t k) const;
  // `wait`: build the fused kernel now if it is not compiled (else a plan may run unfused
  // while it compiles; see LaunchPlan::compiling).
  std::shared_ptr<const LaunchPlan> plan_for(const runtime::BoundCall& call, bool wait) const;
  TuneResult tune(const runtime::BoundCall& call, cudaStream_t stream, const ProgressFn& progress) const;
  std::map<std::string, std::string> compile_configs(const std::vector<KernelConfig>& configs,
                                                     const ProgressFn& progress) const;
  // In first-call mode: tunes the call's shape unless it has a tuned choice (not during
  // CUDA-graph capture, which cannot synchronise).
  void tune_on_first_call(const runtime::BoundCall& call, cudaStream_t stream) const;
  // Forgets the configuration choices and launch plans made so far (after a shape was
  // tuned: it, and shapes that borrowed a nearest tuned choice, may choose differently).
  void forget_choices() const;
};

}  // namespace evtc
