// Running fused epilogue GEMMs: Kernel (one compiled epilogue) and Arguments (one call's
// tensors and scalars).
//
//   evtc::Kernel kernel(evtc::parse_expression("out D: bf16 = silu(acc + bias[n])"));
//   evtc::Arguments args;
//   args.a(TensorRef::matrix(a_ptr, DType::bf16, M, K))
//       .b(TensorRef::matrix(b_ptr, DType::bf16, N, K).transposed())   // B given as N×K
//       .set("bias", TensorRef::vector(bias_ptr, DType::bf16, N))
//       .set("D", TensorRef::matrix(d_ptr, DType::bf16, M, N));
//   kernel.run(args, stream);
//
// Every call validates each operand (device, dtype, shape, strides, alignment) and throws a
// UserError naming the operand and what was expected. A Kernel keeps no per-call state: two
// streams may run it at once, and calls can be captured in CUDA graphs.
#pragma once
#include <cuda_runtime_api.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "evtc/cost_model.hpp"
#include "evtc/gemm.hpp"
#include "evtc/graph.hpp"
#include "evtc/kernel_config.hpp"
#include "evtc/passes.hpp"

namespace evtc {

// A device matrix or vector view. Strides are in elements.
struct TensorRef {
  void* data = nullptr;
  DType dtype = DType::bf16;
  int64_t rows = 0, cols = 0;
  int64_t row_stride = 0, col_stride = 1;

  // A contiguous row-major rows×cols matrix.
  static TensorRef matrix(void* data, DType dtype, int64_t rows, int64_t cols);
  static TensorRef matrix(const void* data, DType dtype, int64_t rows, int64_t cols) {
    return matrix(const_cast<void*>(data), dtype, rows, cols);
  }
  // A contiguous vector of `length` elements.
  static TensorRef vector(const void* data, DType dtype, int64_t length);
  static TensorRef scalar(const void* data, DType dtype) { return vector(data, dtype, 1); }
  // The transpose view (swaps shape and strides): a row-major N×K is a column-major K×N.
  TensorRef transposed() const;
};

class Arguments {
 public:
  Arguments& a(const TensorRef& t) { a_ = t; return *this; }
  Arguments& b(const TensorRef& t) { b_ = t; return *this; }
  Arguments& c(const TensorRef& t) { c_ = t; return *this; }
  // fp8 block scales (GemmDesc::fp8_blockwise), f32. scale_a: M × ceil(K/128), M adjacent
  // (column-major, strides (1, ld) with ld ≥ M: PyTorch's 1×128 layout); scale_b:
  // ceil(K/128) × ceil(N/128), row-major and contiguous.
  Arguments& scale_a(const TensorRef& t) { scale_a_ = t; return *this; }
  Arguments& scale_b(const TensorRef& t) { scale_b_ = t; return *this; }
  // An input operand or output by name (D included).
  Arguments& set(const std::string& name, const TensorRef& t) { tensors_[name] = t; return *this; }
  // A scalar parameter passed by value.
  Arguments& set(const std::string& name, double value) { scalars_[name] = value; return *this; }

  const std::optional<TensorRef>& a() const { return a_; }
  const std::optional<TensorRef>& b() const { return b_; }
  const std::optional<TensorRef>& c() const { return c_; }
  const std::optional<TensorRef>& scale_a() const { return scale_a_; }
  const std::optional<TensorRef>& scale_b() const { return scale_b_; }
  const std::map<std::string, TensorRef>& tensors() const { return tensors_; }
  const std::map<std::string, double>& scalars() const { return scalars_; }

 private:
  std::optional<TensorRef> a_, b_, c_, scale_a_, scale_b_;
  std::map<std::string, TensorRef> tensors_;
  std::map<std::string, double> scalars_;
};

// When the autotuner picks a problem's kernel configuration (docs/backend.md, "Autotuning").
enum class TuneMode : uint8_t {
  off,         // the heuristic default only (default_config); tuned choices are ignored
  first_call,  // a shape with no tuned choice is tuned at its first call, then persisted
  ahead,       // tuned choices (`evtc tune`, Kernel::tune) are used; never tunes during a call
};
const char* tune_mode_name(TuneMode m);  // "off", "first-call", "ahead"
std::optional<TuneMode> parse_tune_mode(const std::string& name);

struct CompileOptions {
  // A/B dtypes and layouts the fused kernel is built for (m, n, k are ignored).
  GemmDesc gemm;
  // Kernel configuration for every problem; when unset, default_config picks one per
  // problem shape (each configuration compiles on first use).
  std::optional<KernelConfig> config;
  // The tile scheduler's visiting order for every problem (no recompile: VisitOrder); when
  // unset, each problem takes its configuration's measured order (the shipped table's or a
  // tuned one) where there is one, else CUTLASS's heuristic.
  std::optional<VisitOrder> visit_order;
  CastMode cast_mode = CastMode::eager;
  bool precise_math = false;
  // Never fuse: always run cuBLASLt + the plain epilogue (also EVTC_DISABLE=1).
  bool disable_fusion = false;
  // How configurations are chosen when `config` is unset; EVTC_TUNE=off|first-call|ahead
  // overrides it.
  TuneMode tune_mode = TuneMode::ahead;
  // Most candidates compiled and timed per problem (0: every candidate that survives pruning);
  // EVTC_TUNE_MAX_CANDIDATES overrides it.
  int tune_max_candidates = 6;
  // A call whose fused kernel is not compiled yet: true waits for the compile; false runs
  // unfused (cuBLASLt + the plain epilogue, which compiles in about a second) while the fused
  // kernel compiles in the background, and switches to it at the first call after it is ready.
  // A call being captured into a CUDA graph always waits (the graph could not switch later).
  // EVTC_WAIT_FOR_COMPILE=1 makes every kernel wait.
  bool wait_for_compile = true;
  // The GPU architecture to build for (compute capability × 10, evtc/arch.hpp); unset: the
  // current device's (90 without one). EVTC_ARCH overrides it. Fused kernels exist for 90
  // only: elsewhere every call runs cuBLASLt + the plain epilogue, compiled for this
  // architecture, and the reason (naming it) is logged once.
  std::optional<int> arch;
};

// Where a problem's configuration came from.
struct ConfigChoice {
  KernelConfig config;
  // table: the shipped configuration table of this GPU (measured per GPU class and shipped with
  // evtc; src/runtime/selection/shipped_table.hpp), at the shape or at the nearest measured one.
  enum class Source { fixed, tuned, nearest_tuned, table, heuristic } source = Source::heuristic;
  int64_t tuned_m = 0, tuned_n = 0, tuned_k = 0;  // the tuned (or table) shape it came from
  std::string table;                              // the table's file, for Source::table
  // The tile visiting order the kernel runs with: CompileOptions::visit_order where given, else
  // the order measured with this configuration at the tuned or table shape, else CUTLASS's.
  VisitOrder order;
  std::string describe() const;  // e.g. "tuned for 4096x4096x4096", "table h100-bf16.json at 64x4096x4096", "heuristic default"
};

// Progress of long work: stage ("compiling", "timing"), items done, items in all.
using ProgressFn = std::function<void(const std::string& stage, int done, int total)>;

struct TuneResult {
  int64_t m = 0, n = 0, k = 0;
  KernelConfig best;
  double best_ms = 0;  // with best_order
  // The visiting order the best configuration ran fastest with (each order timed on it after
  // the candidates were; one is kept over CUTLASS's only where it is at least 1 % faster).
  VisitOrder best_order;
  struct OrderTiming {
    VisitOrder order;
    double median_ms = -1;
  };
  std::vector<OrderTiming> orders;  // the best configuration's time with each order
  struct Candidate {
    KernelConfig config;
    double median_ms = -1;  // < 0 when it failed
    std::string error;
  };
  std::vector<Candidate> candidates;  // in the order they were timed
  std::string record_path;            // the persisted choice
};

// Which path a call took.
enum class ExecutionPath { fused, fallback };

class Kernel {
 public:
  explicit Kernel(const Graph& graph, const CompileOptions& options = {});
  ~Kernel();
  Kernel(Kernel&&) noexcept;
  Kernel& operator=(Kernel&&) noexcept;

  // Compiles the fused kernel for problems of this size now (or finds it in the disk cache)
  // instead of at the first call; needs no GPU. Sizes of 0 mean unknown. Throws UserError
  // (with fallback_reason's text) when such problems would not be fused, RuntimeError when the
  // kernel does not compile.
  void compile(int64_t m = 0, int64_t n = 0, int64_t k = 0);
  // The kernel configuration a problem of this size runs with: the options' config; else,
  // unless tuning is off, the choice tuned for this shape on the current GPU, or the nearest
  // tuned shape's; else default_config's choice.
  KernelConfig config_for(int64_t m, int64_t n, int64_t k) const;
  ConfigChoice config_choice(int64_t m, int64_t n, int64_t k) const;

  // Autotuning (src/runtime/selection/candidates.hpp). The pruned candidate configurations of a problem.
  std::vector<KernelConfig> tuning_candidates(int64_t m, int64_t n, int64_t k) const;
  // Compiles configurations in parallel (one nvcc per core, or EVTC_COMPILE_JOBS); returns
  // the error of each one that failed, by config name. Needs no GPU.
  std::map<std::string, std::string> compile_configs(const std::vector<KernelConfig>& configs,
                                                     const ProgressFn& progress = {});
  // Tunes the problem of `args` on the current GPU: compiles the candidates, times each on
  // these operands (median of CUDA-event timings after warm-up) writing every output to
  // scratch buffers (the arguments' outputs are not touched), persists the winner in the
  // cache folder and uses it from now on. Throws UserError for invalid arguments, and
  // RuntimeError when no candidate ran.
  TuneResult tune(const Arguments& args, cudaStream_t stream = nullptr, const ProgressFn& progress = {});
  // Compiles (or loads) the unfused fallback epilogue now; returns its library path.
  std::string compile_fallback();
  // Whether a kernel library (evtc/kernel_library.hpp) holds the fused kernel problems of
  // this size run with, so that it needs no compile.
  bool in_library(int64_t m, int64_t n, int64_t k) const;
  // Whether that fused kernel is compiled already (in a kernel library or the disk cache).
  bool is_compiled(int64_t m, int64_t n, int64_t k) const;
  // Runs on `stream`. Returns the path taken (fused, or fallback with the reason logged once).
  ExecutionPath run(const Arguments& args, cudaStream_t stream = nullptr) const;
  // Why a problem of this size would not be fused; empty if it would be.
  std::string fallback_reason(int64_t m, int64_t n, int64_t k) const;
  // The cost model's estimate of running this problem fused against cuBLAS plus an unfused
  // epilogue doing `unfused` (evtc/cost_model.hpp); measured times when the shape is tuned.
  FusionEstimate estimate(int64_t m, int64_t n, int64_t k, const UnfusedWork& unfused) const;

  const Graph& graph() const;  // after the pass pipeline
  const KernelSignature& signature() const;
  const CompileOptions& options() const;
  // Path of the compiled fused library (empty before compile()).
  std::string library_path() const;
  // The CUDA source of the fused kernel for problems of m×n×k (with config_for's configuration;
  // 0: unknown sizes), as it is compiled; generating it needs no GPU and compiles nothing.
  std::string source(int64_t m = 0, int64_t n = 0, int64_t k = 0) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace evtc
