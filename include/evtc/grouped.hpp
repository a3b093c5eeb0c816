// Grouped (mixture-of-experts) GEMMs with fused epilogues: GroupedKernel runs, in one launch,
//   Y[start_g:end_g, :] = epilogue(X[start_g:end_g, :] @ W_g^T, ...)   for every group g,
// with the operands as torch._grouped_mm takes them: a token matrix X (sum of M_g × K,
// row-major), the groups' END offsets on the device (int32, one per group; group g holds rows
// [offsets[g-1], offsets[g]) with offsets[-1] = 0), the weights W as G × N × K (each group's
// N×K, K-major, like stacked nn.Linear weights) or, when compiled for it, G × K × N, and the
// output Y (sum of M_g × N). Empty groups are allowed.
//
// Gated epilogues (docs/expressions.md) halve N: `out y: bf16 = gptoss_swiglu(acc + bias[n])`
// over weights whose rows interleave (gate, up) (evtc::interleave_gate_up, per group) writes
// Y as sum of M_g × N/2, group g's rows starting at row offsets[g-1], N even.
//
//   evtc::GroupedKernel kernel(evtc::parse_expression("out D: bf16 = silu(acc + bias[n])"));
//   evtc::GroupedArguments args;
//   args.x(TensorRef::matrix(x, DType::bf16, total_m, K))
//       .weights(BatchedTensorRef::contiguous(w, DType::bf16, G, N, K))
//       .offsets(offsets_dev, G)
//       .set("bias", TensorRef::matrix(bias, DType::bf16, G, N))   // one row per group
//       .set("D", TensorRef::matrix(y, DType::bf16, total_m, N));
//   kernel.run(args, stream);
//
// The epilogue is any elementwise graph over acc, row vectors [n] and scalars. A row vector
// is bound as a G×N matrix (one row per group, any row stride) or as a length-N vector (shared
// by all groups); a scalar by pointer (`input s: f32 ptr`) as G values (one per group) or one;
// a scalar by value is one for all groups. The kernel builds its per-group tables on the
// device from the offsets, so a run never synchronises with the host and can be captured in
// a CUDA graph; replays read the offsets as they are then.
//
// fp8 (e4m3/e5m2) X and W need K-major weights (G × N × K). Block-scaled fp8 (GemmDesc::
// fp8_blockwise, DeepSeek-V3's format as for dense kernels) takes its f32 scales with every call:
//   scale_a: total_m × ceil(K/128), one per token row and 128 of K;
//   scale_b: G × ceil(N/128) × ceil(K/128), one per 128×128 block of each group's N×K weights.
// The kernel reads scale_a row-major (strides (ceil(K/128), 1)) and scale_b with strides
// (·, ceil(K/128), 1) in place; scales with other strides (e.g. the dense kernels' scale_a with
// M adjacent) are first copied into that layout on the device, in the same call.
//
// Refused when the GroupedKernel is built, with a UserError naming the operand: [m,n]
// operands, column vectors [m], the source C, reductions and second outputs (CUTLASS
// 4.2's grouped kernels have no per-group aux loads/stores and its column reduction does not
// compile with GroupProblemShape); 16-bit X and W of different dtypes, fp8 mixed with 16-bit,
// fp8 with G × K × N weights; a column-major X.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "evtc/kernel_config.hpp"
#include "evtc/passes.hpp"
#include "evtc/reference.hpp"
#include "evtc/runtime.hpp"

namespace evtc {

// A stack of `batches` matrices of rows × cols on the device. Strides are in elements.
struct BatchedTensorRef {
  void* data = nullptr;
  DType dtype = DType::bf16;
  int64_t batches = 0, rows = 0, cols = 0;
  int64_t batch_stride = 0, row_stride = 0, col_stride = 1;

  // Contiguous: batch_stride = rows × cols, row_stride = cols.
  static BatchedTensorRef contiguous(const void* data, DType dtype, int64_t batches, int64_t rows,
                                     int64_t cols);
};

class GroupedArguments {
 public:
  GroupedArguments& x(const TensorRef& t) { x_ = t; return *this; }
  GroupedArguments& weights(const BatchedTensorRef& w) { w_ = w; return *this; }
  // `count` int32 end offsets in device memory (count must be the number of groups).
  GroupedArguments& offsets(const int32_t* device_offsets, int64_t count) {
    offsets_ = device_offsets;
    offsets_count_ = count;
    return *this;
  }
  // fp8 block scales (a block-scaled kernel only): total_m × ceil(K/128) and
  // G × ceil(N/128) × ceil(K/128), f32, any strides (see above).
  GroupedArguments& scale_a(const TensorRef& t) { scale_a_ = t; return *this; }
  GroupedArguments& scale_b(const BatchedTensorRef& t) { scale_b_ = t; return *this; }
  GroupedArguments& set(const std::string& name, const TensorRef& t) { tensors_[name] = t; return *this; }
  GroupedArguments& set(const std::string& name, double value) { scalars_[name] = value; return *this; }

  const std::optional<TensorRef>& x() const { return x_; }
  const std::optional<BatchedTensorRef>& weights() const { return w_; }
  const int32_t* offsets() const { return offsets_; }
  int64_t offsets_count() const { return offsets_count_; }
  const std::optional<TensorRef>& scale_a() const { return scale_a_; }
  const std::optional<BatchedTensorRef>& scale_b() const { return scale_b_; }
  const std::map<std::string, TensorRef>& tensors() const { return tensors_; }
  const std::map<std::string, double>& scalars() const { return scalars_; }

 private:
  std::optional<TensorRef> x_;
  std::optional<BatchedTensorRef> w_;
  const int32_t* offsets_ = nullptr;
  int64_t offsets_count_ = -1;
  std::optional<TensorRef> scale_a_;
  std::optional<BatchedTensorRef> scale_b_;
  std::map<std::string, TensorRef> tensors_;
  std::map<std::string, double> scalars_;
};

struct GroupedOptions {
  // X/W dtypes (16-bit and equal, or fp8) and the weights' layout: b_layout col_major =
  // G × N × K (K-major, the default), row_major = G × K × N (16-bit only). a_layout must stay
  // row-major. fp8_blockwise: block-scaled fp8 (scales with every call, see above).
  GemmDesc gemm;
  // The kernel configuration; default_grouped_config() when unset.
  std::optional<KernelConfig> config;
  CastMode cast_mode = CastMode::eager;
  bool precise_math = false;
  // A call whose fused kernel is not compiled yet: true waits for the compile; false runs
  // unfused while the kernel compiles in the background (one cuBLASLt GEMM + the plain
  // epilogue per non-empty group, after reading the offsets back to the host), and switches to
  // the fused kernel at the first call after it is ready. A call being captured into a CUDA
  // graph always waits. EVTC_WAIT_FOR_COMPILE=1 makes every kernel wait.
  bool wait_for_compile = true;
  // As CompileOptions::arch. On an architecture other than 90 every call runs the unfused
  // path above (and cannot be captured in a CUDA graph: it reads the offsets back).
  std::optional<int> arch;
};

// Measured on the H200 (bench/grouped_moe.py, docs/grouped.md): ping-pong 128×192, no cluster.
KernelConfig default_grouped_config();
// The default for `gemm`'s dtypes: the above for 16-bit and plain fp8 operands; for block-scaled
// fp8, whose tiles must hold whole 128-wide scale blocks along N and K, the configuration
// measured in bench/grouped_blockwise.py (docs/grouped.md).
KernelConfig default_grouped_config(const GemmDesc& gemm);

class GroupedKernel {
 public:
  // Runs the pass pipeline; throws UserError (naming the operand) for graphs a grouped kernel
  // cannot run.
  explicit GroupedKernel(const Graph& graph, const GroupedOptions& options = {});
  ~GroupedKernel();
  GroupedKernel(GroupedKernel&&) noexcept;
  GroupedKernel& operator=(GroupedKernel&&) noexcept;

  // Compiles (or finds in the disk cache) the kernel now rather than at the first run; needs
  // no GPU. Returns the library path.
  std::string compile() const;
  // Whether a kernel library (evtc/kernel_library.hpp) holds this kernel.
  bool in_library() const;
  // Validates every operand (UserError naming it) and launches on `stream`: the table-building
  // kernel, then the grouped GEMM. No host synchronisation. Returns the path taken: fallback
  // only while the fused kernel compiles in the background (GroupedOptions::wait_for_compile
  // off), or after that compile failed; that path reads the offsets back (a synchronisation).
  ExecutionPath run(const GroupedArguments& args, cudaStream_t stream = nullptr) const;
  // Compiles (or loads) the unfused path's plain epilogue now; returns its library path.
  std::string compile_fallback() const;

  // Why problems with N output columns and K would not run fused: a shape the kernel cannot
  // take (a UserError from run), or a target architecture without fused kernels (run then
  // takes the unfused path); empty when they would. Front ends ask before they build a call
  // (the PyTorch FX pass).
  std::string shape_reason(int64_t n, int64_t k) const;
  // The cost model's estimate for `groups` groups of `total_m` rows in all (evtc/cost_model.hpp).
  FusionEstimate estimate(int64_t total_m, int64_t n, int64_t k, int64_t groups, const UnfusedWork& unfused) const;
  // The generated CUDA source.
  std::string source() const;
  const Graph& graph() const;  // after the pass pipeline
  const KernelSignature& signature() const;
  const KernelConfig& config() const;
  // The one output Y: the [m,n] main output (sum of M_g × N), or for a gated epilogue its
  // [m,n/2] output (sum of M_g × N/2).
  const std::string& output_name() const;
  DType output_dtype() const;
  bool gated() const;
  const GemmDesc& gemm() const;  // X/W dtypes, the weights' layout, fp8_blockwise

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// --- the fp64 reference, group by group ---------------------------------------------------
struct GroupedReferenceInputs {
  int64_t n = 0, k = 0;
  std::vector<int64_t> rows;  // M_g of each group (G entries; zeros allowed)
  std::vector<double> x;      // sum(M_g) × K, row-major
  std::vector<double> w;      // G × N × K (each group's N×K, row-major)
  // By operand name: row vectors G×N (per group) or N (shared); scalars G or 1 values.
  std::map<std::string, std::vector<double>> operands;
  // Block-scaled fp8 (empty otherwise): sum(M_g) × ceil(K/128) and G × ceil(N/128) × ceil(K/128),
  // row-major; the product becomes Σ_k x·scale_a · w·scale_b, as in ReferenceInputs.
  std::vector<double> scale_a, scale_b;
};

// The reference outputs of every group, stacked like Y: [m,n] outputs sum(M_g) × N, gated
// [m,n/2] outputs sum(M_g) × N/2.
ReferenceOutputs evaluate_grouped_reference(const Graph& g, const GroupedReferenceInputs& inputs);

}  // namespace evtc
