// evtc's PyTorch operators, registered with the dispatcher from C++ (evtc/_evtc_torch.so, loaded
// by `import evtc.torch`). A call from Inductor's generated code (or torch.ops.evtc.*) goes
// through the dispatcher straight to evtc::Kernel::run: the spec string is resolved to its
// kernel and operand plan once per process, and a call only places its tensors, allocates its
// outputs with torch's allocator and launches on torch's current stream. No Python runs.
//
// Ops (schemas in TORCH_LIBRARY below; fake implementations are registered from Python):
//   gemm_epilogue(spec, a, b, operands) -> outputs
//   gemm_epilogue_merged(spec, a, sources, operands) -> outputs
//       the GEMM over B = the columns of two K × N/2 halves interleaved (gate j at 2j, up j at
//       2j+1), for gated epilogues; the halves (and any (gate, up) row operands) are views of
//       the source tensors (the graph's weights) that the spec's recipes describe, and the
//       interleaved copy is cached per source tensors, rebuilt when their version counters move;
//       halves that are the even and odd features of one buffer (evtc.torch.merge_projections)
//       are read in place, with no copy
//   grouped_gemm_epilogue(spec, x, w, offs, operands) -> y
//   grouped_gemm_epilogue_merged(spec, x, sources, offs, operands) -> y
//   interleave_pairs(gate, up, dim) -> the (gate, up) layout above, contiguous (any device)
//   stacked_linear(a, weights, biases) -> a @ cat(weights).T (+ cat(biases)): sibling projections
//       (q, k, v) as one GEMM, weights that are row blocks of one buffer read in place (any device)
//   _rows_of_one_buffer(parts) -> whether stacked_linear reads those parts in place
//   _compile_only(delta) -> depth, _take_pending_compiles() -> ["M,N,K,spec"], _path_counts(spec) -> [fused, fallback]
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <shared_mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "evtc/error.hpp"
#include "evtc/expression.hpp"
#include "evtc/gated.hpp"
#include "evtc/grouped.hpp"
#include "evtc/options.hpp"
#include "evtc/passes.hpp"
#include "evtc/runtime.hpp"

namespace evtc::torch_ops {
namespace {

// --- messages -----------------------------------------------------------------------------------

// Text of numbers, strings and shapes joined, without iostreams: formatting numbers through a
// stream's locale facets in a library loaded beside torch's has crashed, so messages here are
// built from std::to_string.
std::string piece(const std::string& s) { return s; }
std::string piece(std::string_view s) { return std::string(s); }
std::string piece(const char* s) { return s; }
std::string piece(at::IntArrayRef v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}
template <typename T>
  requires std::is_arithmetic_v<T>
std::string piece(T v) {
  return std::to_string(v);
}
template <typename... Parts>
std::string cat(const Parts&... parts) {
  return (std::string() + ... + piece(parts));
}

// --- dtypes and tensor views --------------------------------------------------------------------

at::ScalarType scalar_type(DType d) {
  switch (d) {
    case DType::f32: return at::kFloat;
    case DType::f16: return at::kHalf;
    case DType::bf16: return at::kBFloat16;
    case DType::f8e4m3: return at::kFloat8_e4m3fn;
    case DType::f8e5m2: return at::kFloat8_e5m2;
    case DType::i32: return at::kInt;
    case DType::i64: return at::kLong;
  }
  throw InternalError("unknown dtype");
}

DType evtc_dtype(const at::Tensor& t, const std::string& what) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::f32;
    case at::kHalf: return DType::f16;
    case at::kBFloat16: return DType::bf16;
    case at::kFloat8_e4m3fn: return DType::f8e4m3;
    case at::kFloat8_e5m2: return DType::f8e5m2;
    case at::kInt: return DType::i32;
    case at::kLong: return DType::i64;
    default:
      throw UserError(cat(what, " has dtype ", c10::toString(t.scalar_type()), "; evtc takes float32, float16, bfloat16 and float8 (e4m3fn, e5m2) tensors, and int32/int64 [m] or [n] vectors"));
  }
}

void require_cuda(const at::Tensor& t, const std::string& what) {
  if (!t.is_cuda()) throw UserError(cat(what, " is on ", t.device().str(), ", not a CUDA device"));
}

TensorRef matrix_ref(const at::Tensor& t, const std::string& what) {
  require_cuda(t, what);
  if (t.dim() != 2)
    throw UserError(cat(what, " has ", t.dim(), " dimensions; expected a matrix"));
  return TensorRef{t.data_ptr(), evtc_dtype(t, what), t.size(0), t.size(1), t.stride(0), t.stride(1)};
}

// The operand `t` as the kernel reads it in an M×N epilogue, placed by the same rule as at
// trace time (place_operand); copies go to `keep`, which outlives the launch.
TensorRef operand_ref(const at::Tensor& t, LoadClass expected, int64_t m, int64_t n, const std::string& what,
                      std::vector<at::Tensor>& keep) {
  require_cuda(t, what);
  const DType dt = evtc_dtype(t, what);
  // Leading dimensions flatten into M (a view where their strides nest, else a copy).
  at::Tensor t2 = t.dim() <= 2 ? t : t.reshape({-1, t.size(-1)});
  // A column vector traced as [M, 1] (or [..., 1]) can reach the op as [M] (seen in the
  // backward graphs of bench/models.py's llama and hf_llama training rows with every fusion
  // made: the op was given [4096] and [8192]). The values are the same, one per row: read them
  // as the column traced. A 1-D tensor is otherwise never a column, so nothing else changes.
  if (expected == LoadClass::col_vec && t2.dim() == 1 && t2.size(0) == m && m != 1) t2 = t2.unsqueeze(1);
  const int64_t full[2] = {m, n};
  const OperandPlacement p = place_operand({t2.sizes().data(), t2.sizes().size()},
                                           {t2.strides().data(), t2.strides().size()}, full);
  if (p.load != expected)
    throw UserError(cat(what, " of shape ", t.sizes(), " is read as a ", load_class_name(p.load), " now but was traced as a ", load_class_name(expected), p.why.empty() ? "" : ": " + p.why));
  switch (expected) {
    case LoadClass::scalar:
      return TensorRef::scalar(t2.data_ptr(), dt);
    case LoadClass::row_vec: {
      at::Tensor v = t2.dim() == 2 ? t2.select(0, 0) : t2;
      if (p.needs_copy) keep.push_back(v = v.expand({n}).contiguous());
      return TensorRef::vector(v.data_ptr(), dt, n);
    }
    case LoadClass::col_vec: {
      at::Tensor v = t2.dim() == 2 ? t2.select(1, 0) : t2.expand({m});
      if (p.needs_copy) keep.push_back(v = v.expand({m}).contiguous());
      return TensorRef::vector(v.data_ptr(), dt, m);
    }
    case LoadClass::aux_row_major: {
      at::Tensor v = t2;
      if (p.needs_copy) keep.push_back(v = t2.expand({m, n}).contiguous());
      return TensorRef{v.data_ptr(), dt, m, n, v.stride(0), 1};
    }
    case LoadClass::aux_col_major:
      return TensorRef{t2.data_ptr(), dt, m, n, 1, t2.stride(1)};
    case LoadClass::not_fusable: break;
  }
  throw InternalError(cat(what, ": no placement"));
}

std::vector<int64_t> output_size(Shape s, int64_t m, int64_t n) {
  switch (s) {
    case Shape::full: return {m, n};
    case Shape::half: return {m, n / 2};
    case Shape::row: return {n};
    case Shape::col: return {m};
    case Shape::scalar: return {};
  }
  return {};
}

// --- specs and their plans ------------------------------------------------------------------------

LoadClass class_of(const std::string& name, const std::string& what) {
  if (name == "row") return LoadClass::row_vec;
  if (name == "col") return LoadClass::col_vec;
  if (name == "scalar") return LoadClass::scalar;
  if (name == "aux") return LoadClass::aux_row_major;
  if (name == "aux_col") return LoadClass::aux_col_major;
  throw UserError(cat("spec: operand ", what, " has class '", name, "' (expected row, col, scalar, aux or aux_col)"));
}

// --- merged (gate, up) operands: how to get them from the op's source tensors ---------------------

// One view step of a recipe, as the FX graph applies it to a graph input: ["permute", d...],
// ["t"], ["transpose", d0, d1], ["slice", dim, start, end, step], ["view", size...].
struct ViewStep {
  std::string op;
  std::vector<int64_t> args;
};

// A tensor made from source tensor `source` of the op by views.
struct Recipe {
  size_t source = 0;
  std::vector<ViewStep> steps;
};

// The gate and up halves of a merged operand; `key` names the pair (its recipes) in the cache.
struct MergedPart {
  Recipe gate, up;
  std::string key;
};

Recipe parse_recipe(const nlohmann::json& j) {
  Recipe r;
  r.source = j.at("source").get<size_t>();
  for (const auto& step : j.at("views")) {
    ViewStep v;
    v.op = step.at(0).get<std::string>();
    for (size_t i = 1; i < step.size(); ++i) v.args.push_back(step.at(i).get<int64_t>());
    r.steps.push_back(std::move(v));
  }
  return r;
}

MergedPart parse_part(const nlohmann::json& j) {
  return {parse_recipe(j.at(0)), parse_recipe(j.at(1)), j.dump()};
}

at::Tensor apply(const Recipe& r, at::TensorList sources, const std::string& what) {
  if (r.source >= sources.size())
    throw UserError(cat(what, ": the spec reads source tensor ", r.source, " of ", sources.size()));
  at::Tensor t = sources[r.source];
  for (const ViewStep& v : r.steps) {
    const auto& a = v.args;
    if (v.op == "permute") t = t.permute(a);
    else if (v.op == "t") t = t.t();
    else if (v.op == "transpose" && a.size() == 2) t = t.transpose(a[0], a[1]);
    // Sizes as SymInts: the fake implementations read recipes on fake tensors with symbolic sizes.
    else if (v.op == "slice" && a.size() == 4)
      t = t.slice_symint(a[0], c10::SymInt(a[1]), c10::SymInt(a[2]).min(t.sym_size(a[0])), c10::SymInt(a[3]));
    else if (v.op == "view") t = t.view(a);
    else throw UserError(cat(what, ": unknown view step '", v.op, "' with ", a.size(), " arguments"));
  }
  return t;
}

struct Output {
  std::string name;
  at::ScalarType dtype;
  Shape shape;
};

// One spec, resolved: the kernel, how each operand is read, and the outputs in order.
struct Plan {
  std::unique_ptr<Kernel> dense;
  std::unique_ptr<GroupedKernel> grouped;
  bool k_major = true;  // grouped: weights read K-major (b_layout col)
  // By name and class; "@scale_a" / "@scale_b" (make_plan admits no other name starting with
  // '@') are a block-scaled GEMM's scales, bound beside A and B.
  std::vector<std::pair<std::string, LoadClass>> operands;
  std::optional<MergedPart> merged_b;  // a merged op's B: gate and up columns interleaved
  std::vector<std::pair<std::string, MergedPart>> merged_rows;  // row operands made the same way
  std::vector<Output> outputs;
  std::atomic<int64_t> fused_calls{0}, fallback_calls{0};
};

nlohmann::json parse_spec(std::string_view spec) {
  try {
    return nlohmann::json::parse(spec);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(cat("evtc op spec is not JSON: ", e.what()));
  }
}

std::unique_ptr<Plan> make_plan(std::string_view text) {
  const nlohmann::json s = parse_spec(text);
  auto plan = std::make_unique<Plan>();
  const OptionText options = option_text_from_json(s.at("options").dump());
  const Graph graph = parse_expression(s.at("expr").get<std::string>(), parse_options(options));
  for (const auto& o : s.at("operands")) {
    const std::string name = o.at(0).get<std::string>(), cls = o.at(1).get<std::string>();
    // A block-scaled _scaled_mm's scales ("@scale_a", "@scale_b"): the GEMM's, not the epilogue's.
    if (cls == "block_scale") {
      if (name != "@scale_a" && name != "@scale_b")
        throw UserError(cat("spec: block scale operand '", name, "' (expected @scale_a or @scale_b)"));
      plan->operands.emplace_back(name, LoadClass::scalar);  // the class is not used for these
      continue;
    }
    if (name.empty() || name[0] == '@')
      throw UserError(cat("spec: operand '", name, "' of class ", cls, ": only block scales (class block_scale) have "
                          "names that start with '@'"));
    plan->operands.emplace_back(name, class_of(cls, name));
  }
  if (s.contains("merged")) {
    const nlohmann::json& m = s.at("merged");
    plan->merged_b = parse_part(m.at("b"));
    const nlohmann::json rows = m.value("rows", nlohmann::json::object());  // outlives the loop
    for (const auto& [name, part] : rows.items()) plan->merged_rows.emplace_back(name, parse_part(part));
  }
  if (s.value("grouped", false)) {
    plan->grouped = std::make_unique<GroupedKernel>(graph, grouped_options(options));
    plan->k_major = layout_option(options.b_layout, "b_layout") == Layout::col_major;
    const Shape shape = plan->grouped->gated() ? Shape::half : Shape::full;
    plan->outputs.push_back({plan->grouped->output_name(), scalar_type(plan->grouped->output_dtype()), shape});
    return plan;
  }
  plan->dense = std::make_unique<Kernel>(graph, compile_options(options));
  const KernelSignature& sig = plan->dense->signature();
  for (const auto& name : s.at("outputs")) {
    const std::string want = name.get<std::string>();
    if (want == sig.d_name) {
      plan->outputs.push_back({want, scalar_type(sig.d_dtype), Shape::full});
      continue;
    }
    bool found = false;
    for (const OperandSlot& slot : sig.pointers)
      if (slot.is_output && slot.name == want) {
        plan->outputs.push_back({want, scalar_type(slot.dtype), slot.shape});
        found = true;
      }
    if (!found) throw UserError(cat("spec: the epilogue has no output '", want, "'"));
  }
  return plan;
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

Plan& plan_for(std::string_view spec) {
  static std::shared_mutex mu;
  static std::unordered_map<std::string, std::unique_ptr<Plan>, StringHash, std::equal_to<>> plans;
  {
    std::shared_lock lock(mu);
    if (auto it = plans.find(spec); it != plans.end()) return *it->second;
  }
  auto plan = make_plan(spec);  // parsing and passes, outside the lock
  std::unique_lock lock(mu);
  auto [it, inserted] = plans.emplace(std::string(spec), std::move(plan));
  return *it->second;
}

// --- compile-only mode: ops note their kernel's problem size and return unwritten outputs ---

std::atomic<int64_t> compile_only_depth{0};

// The (spec, M, N, K) of every call made in compile-only mode, for evtc.torch to compile (its
// compile threads share the kernel cache with this library's kernels). Grouped kernels have
// one configuration for every size: M, N and K are 0.
class PendingCompiles {
 public:
  void add(std::string_view spec, int64_t m, int64_t n, int64_t k) {
    std::lock_guard lock(mu_);
    pending_.emplace(std::string(spec), m, n, k);
  }
  // Takes the pending entries as "M,N,K,spec" strings (a spec is JSON: no commas before it).
  std::vector<std::string> take() {
    std::lock_guard lock(mu_);
    std::vector<std::string> out;
    for (const auto& [spec, m, n, k] : pending_) out.push_back(cat(m, ",", n, ",", k, ",", spec));
    pending_.clear();
    return out;
  }

 private:
  std::mutex mu_;
  std::set<std::tuple<std::string, int64_t, int64_t, int64_t>> pending_;
};

PendingCompiles& pending_compiles() {
  static PendingCompiles p;
  return p;
}

// --- interleaved (gate, up) copies, kept while their sources are unchanged ------------------------

// A source tensor as it was when a copy was made: its storage (held weakly, so the cache
// never keeps a model's weights alive and a new tensor at a recycled address is not mistaken
// for it), where it starts, its shape and strides, and its version counter (bumped by every
// in-place update: optimizer steps, load_state_dict, w.add_()).
struct SourceState {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  int64_t offset = 0;
  std::vector<int64_t> sizes, strides;
  int64_t version = 0;

  explicit SourceState(const at::Tensor& t)
      : storage(t.storage().getWeakStorageImpl()), offset(t.storage_offset()), sizes(t.sizes().vec()),
        strides(t.strides().vec()), version(t._version()) {}

  bool same_as(const at::Tensor& t) const {
    if (storage.expired()) return false;
    return storage._unsafe_get_target() == t.storage().unsafeGetStorageImpl() && offset == t.storage_offset() &&
           t.sizes().equals(sizes) && t.strides().equals(strides) && version == t._version();
  }
};

struct MergedCopy {
  std::string key;
  SourceState gate, up;
  at::Tensor merged;
};

// Interleaves `gate` and `up` along dimension `dim` (element j of gate at 2j, of up at 2j+1).
at::Tensor interleave(const at::Tensor& gate, const at::Tensor& up, int64_t dim) {
  return at::stack({gate, up}, dim + 1).flatten(dim, dim + 1);
}

// The op interleave_pairs(gate, up, dim): the same layout, contiguous, for Python (the FX pass's
// constant weights and biases, merge_projections' buffers, evtc.interleave_gate_up), so that the
// gated kernels' (gate, up) layout is spelled once. Composite: it runs on any device and on fake
// tensors.
at::Tensor interleave_pairs(const at::Tensor& gate, const at::Tensor& up, int64_t dim) {
  TORCH_CHECK(gate.sizes() == up.sizes(), "interleave_pairs: gate has shape ", gate.sizes(), " and up ",
              up.sizes(), "; they must be the same");
  return interleave(gate, up, c10::maybe_wrap_dim(dim, gate.dim())).contiguous();
}

// Row blocks of one buffer: where `parts` (sizes equal but for dimension 0, the same strides and
// dtype) lie one after the other along dimension 0 of one storage, the view of that storage
// spanning them all; else nothing. evtc.torch.merge_projections stacks q/k/v projections so
// (their weights [n_i, K] and biases [n_i]), and the op below reads such a span in place. Reads
// sizes, strides and storages only, so it runs on fake tensors too (the FX pass's check).
std::optional<at::Tensor> rows_of_one_buffer(at::TensorList parts) {
  if (parts.empty()) return std::nullopt;
  const at::Tensor& first = parts[0];
  if (first.dim() < 1 || first.layout() != at::kStrided) return std::nullopt;
  int64_t rows = 0, next = first.storage_offset();
  for (const at::Tensor& t : parts) {
    if (t.dim() != first.dim() || t.layout() != at::kStrided || t.scalar_type() != first.scalar_type() ||
        t.device() != first.device() || !t.strides().equals(first.strides()) ||
        !t.sizes().slice(1).equals(first.sizes().slice(1)) ||
        t.storage().unsafeGetStorageImpl() != first.storage().unsafeGetStorageImpl() || t.storage_offset() != next)
      return std::nullopt;
    rows += t.size(0);
    next += t.size(0) * t.stride(0);
  }
  std::vector<int64_t> sizes(first.sizes().begin(), first.sizes().end());
  sizes[0] = rows;
  return first.as_strided(sizes, first.strides(), first.storage_offset());
}

// The op _rows_of_one_buffer(parts): whether rows_of_one_buffer finds a span (the FX pass and
// merge_projections ask it, so that the rule is written once).
bool rows_of_one_buffer_op(at::TensorList parts) { return rows_of_one_buffer(parts).has_value(); }

// The op stacked_linear(a, weights, biases): a @ cat(weights).T (+ cat(biases)), one GEMM for
// sibling projections of one input (q, k and v), its [M, sum of n_i] result column blocks in
// the weights' order. Weights (and biases) that are row blocks of one buffer are read in place
// (one cuBLAS GEMM, nothing copied); others are concatenated first (a copy per call: correct,
// not fast). Composite over ATen's mm/addmm: any device, captured by CUDA graphs.
at::Tensor stacked_linear(const at::Tensor& a, at::TensorList weights, at::TensorList biases) {
  TORCH_CHECK(a.dim() == 2, "stacked_linear: operand A has ", a.dim(), " dimensions; it must be 2-D [M, K]");
  TORCH_CHECK(!weights.empty(), "stacked_linear: no weights were given");
  TORCH_CHECK(biases.empty() || biases.size() == weights.size(), "stacked_linear: ", biases.size(),
              " biases for ", weights.size(), " weights; give one per weight or none");
  for (size_t i = 0; i < weights.size(); ++i) {
    TORCH_CHECK(weights[i].dim() == 2 && weights[i].size(1) == a.size(1), "stacked_linear: weight ", i,
                " has shape ", weights[i].sizes(), "; it must be [n, K] with K = ", a.size(1), " (A's columns)");
    if (!biases.empty())
      TORCH_CHECK(biases[i].dim() == 1 && biases[i].size(0) == weights[i].size(0), "stacked_linear: bias ", i,
                  " has shape ", biases[i].sizes(), "; it must be [", weights[i].size(0), "] (its weight's rows)");
  }
  const auto span = rows_of_one_buffer(weights);
  const at::Tensor w = span ? *span : at::cat(weights, 0);
  if (biases.empty()) return at::mm(a, w.t());
  const auto bias_span = rows_of_one_buffer(biases);
  return at::addmm(bias_span ? *bias_span : at::cat(biases, 0), a, w.t());
}

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw RuntimeError(cat(what, ": ", cudaGetErrorString(e)));
}

// Interleaved copies of merged operands, kept while their source tensors are unchanged.
class MergedCache {
 public:
  MergedCache() {
    cuda_ok(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    cuda_ok(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
  }

  // The copy of `part` from `gate_src`/`up_src` (the source tensors its recipes read), made by
  // `build` when there is no valid one. Copies are made on a side stream, outside any memory
  // pool the current stream allocates from (CUDA-graph trees run their warm-up calls in the
  // graph's private pool, which must hold nothing but the graph's outputs afterwards); the
  // current stream waits for the copy. While a CUDA graph is being captured a missing copy is
  // made in the graph instead, and not kept (every replay would rebuild it).
  at::Tensor get(const std::string& key, const at::Tensor& gate_src, const at::Tensor& up_src,
                 const std::function<at::Tensor()>& build, cudaStream_t stream) {
    std::lock_guard lock(mu_);
    for (auto it = copies_.begin(); it != copies_.end();) {
      if (it->gate.storage.expired() || it->up.storage.expired()) {
        it = copies_.erase(it);  // the sources are gone: so is the copy
        continue;
      }
      if (it->key == key && it->gate.same_as(gate_src) && it->up.same_as(up_src)) return it->merged;
      ++it;
    }
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) capture = cudaStreamCaptureStatusNone;
    if (capture != cudaStreamCaptureStatusNone) return build();
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(gate_src.device().index());
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, gate_src.device().index());
    at::Tensor merged;
    {
      cuda_ok(cudaEventRecord(ready_, current.stream()), "cudaEventRecord");
      cuda_ok(cudaStreamWaitEvent(side.stream(), ready_, 0), "cudaStreamWaitEvent");  // sources written on `current`
      c10::cuda::CUDAStreamGuard on_side(side);
      merged = build();
      cuda_ok(cudaEventRecord(done_, side.stream()), "cudaEventRecord");
      cuda_ok(cudaStreamWaitEvent(current.stream(), done_, 0), "cudaStreamWaitEvent");
    }
    c10::cuda::CUDACachingAllocator::recordStream(merged.storage().data_ptr(), current);
    // Drop older copies of the same part of these weights (an earlier version of them); other
    // layers' copies share the part's recipes but not its weights, and stay.
    std::erase_if(copies_, [&](const MergedCopy& c) {
      return c.key == key && c.gate.storage._unsafe_get_target() == gate_src.storage().unsafeGetStorageImpl() &&
             c.up.storage._unsafe_get_target() == up_src.storage().unsafeGetStorageImpl();
    });
    copies_.push_back({key, SourceState(gate_src), SourceState(up_src), merged});
    return merged;
  }

  int64_t bytes() {
    std::lock_guard lock(mu_);
    int64_t total = 0;
    for (const auto& c : copies_) total += c.merged.nbytes();
    return total;
  }

  void clear() {
    std::lock_guard lock(mu_);
    copies_.clear();
  }

 private:
  std::mutex mu_;
  std::vector<MergedCopy> copies_;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;  // used under mu_
};

MergedCache& merged_cache() {
  static MergedCache c;
  return c;
}

// --- the ops --------------------------------------------------------------------------------------

std::string operand_what(const std::string& name) { return cat("operand ", name); }

// The gate and up halves of a merged operand as the op reads them: (G ×) N/2 × K for B
// (`k_major`: the recipes' K × N/2, transposed), (G ×) N/2 for row operands.
std::pair<at::Tensor, at::Tensor> merged_halves(const MergedPart& part, at::TensorList sources, bool k_major,
                                                const std::string& what) {
  at::Tensor g = apply(part.gate, sources, what), u = apply(part.up, sources, what);
  if (g.sizes() != u.sizes())
    throw UserError(cat(what, ": the gate and up halves have shapes ", g.sizes(), " and ", u.sizes()));
  if (k_major) return {g.transpose(-2, -1), u.transpose(-2, -1)};
  return {g, u};
}

// The merged operand without a copy, where its two halves already are the even and odd
// features of one buffer (evtc.torch.merge_projections makes a model's weights so): a view of
// that buffer, which in-place updates of the weights write and CUDA-graph replays read. None
// when they are not (the rule: evtc::interleaved_strides). The caller has checked that the
// two sources share one storage (so do these views of them).
std::optional<at::Tensor> interleaved_view(const MergedPart& part, at::TensorList sources, bool k_major,
                                           const std::string& what) {
  auto [g, u] = merged_halves(part, sources, k_major, what);
  if (g.dtype() != u.dtype()) return std::nullopt;
  const int64_t dim = g.dim() - (k_major ? 2 : 1);
  const std::optional<std::vector<int64_t>> strides =
      interleaved_strides(g.sizes().vec(), g.strides().vec(), g.storage_offset(), u.strides().vec(),
                          u.storage_offset(), dim);
  if (!strides) return std::nullopt;
  std::vector<int64_t> sizes = g.sizes().vec();
  sizes[dim] *= 2;
  return g.as_strided(sizes, *strides, g.storage_offset());
}

// The interleaved copy of a merged operand from the op's sources: row operands ((G ×) N/2
// vectors) interleave along their last dimension; B halves ((G ×) K × N/2, `k_major`) are
// transposed first and interleaved along their rows, so that the copy is (G ×) N × K with K
// contiguous, which the caller reads transposed (the K-major B of the gated kernels).
at::Tensor merged_part(const MergedPart& part, at::TensorList sources, bool k_major, const std::string& what,
                       cudaStream_t stream) {
  if (std::max(part.gate.source, part.up.source) >= sources.size())
    throw UserError(cat(what, ": the spec reads source tensor ", std::max(part.gate.source, part.up.source), " of ",
                        sources.size()));
  const at::Tensor& gs = sources[part.gate.source];
  const at::Tensor& us = sources[part.up.source];
  require_cuda(gs, what);
  require_cuda(us, what);
  // Views of one buffer share their sources' storage: only then is the in-place check worth its views.
  if (gs.storage().is_alias_of(us.storage()))
    if (std::optional<at::Tensor> view = interleaved_view(part, sources, k_major, what)) return *view;
  return merged_cache().get(part.key, gs, us, [&] {
    auto [g, u] = merged_halves(part, sources, k_major, what);
    return interleave(g, u, g.dim() - (k_major ? 2 : 1)).contiguous();
  }, stream);
}

// A merged op's row operands: (gate, up) vectors of N/2 interleaved into N (per group: G × N).
void bind_merged_rows(const Plan& plan, at::TensorList sources, int64_t n, cudaStream_t stream,
                      const std::function<void(const std::string&, const TensorRef&)>& set,
                      std::vector<at::Tensor>& keep) {
  for (const auto& [name, part] : plan.merged_rows) {
    const std::string what = operand_what(name);
    at::Tensor merged = merged_part(part, sources, false, what, stream);
    keep.push_back(merged);
    if (merged.size(-1) != n)
      throw UserError(cat(what, ": the (gate, up) vectors give ", merged.size(-1), " values, the GEMM has N = ", n));
    set(name, merged.dim() == 1 ? TensorRef::vector(merged.data_ptr(), evtc_dtype(merged, what), n)
                                : matrix_ref(merged, what));
  }
}

std::vector<at::Tensor> dense_outputs(const Plan& plan, const at::Tensor& a, int64_t m, int64_t n) {
  if (!plan.dense) throw UserError("this spec describes a grouped kernel: call grouped_gemm_epilogue");
  std::vector<at::Tensor> outputs;
  outputs.reserve(plan.outputs.size());
  for (const Output& o : plan.outputs) outputs.push_back(at::empty(output_size(o.shape, m, n), a.options().dtype(o.dtype)));
  return outputs;
}

// In compile-only mode: notes the problem size to compile; the outputs stay unwritten.
std::vector<at::Tensor> compile_only(std::string_view spec, const Plan& plan, const at::Tensor& a, int64_t m,
                                     int64_t n, int64_t k) {
  pending_compiles().add(spec, m, n, k);
  return dense_outputs(plan, a, m, n);
}

std::vector<at::Tensor> run_dense(Plan& plan, const at::Tensor& a, const at::Tensor& b, at::TensorList operands,
                                  at::TensorList sources, cudaStream_t stream) {
  if (operands.size() != plan.operands.size())
    throw UserError(cat(operands.size(), " operand tensors given, the spec names ", plan.operands.size()));
  const int64_t m = a.size(0), n = b.size(1);
  std::vector<at::Tensor> outputs = dense_outputs(plan, a, m, n);
  Arguments args;
  args.a(matrix_ref(a, "operand A")).b(matrix_ref(b, "operand B"));
  std::vector<at::Tensor> keep;
  for (size_t i = 0; i < operands.size(); ++i) {
    const auto& [name, cls] = plan.operands[i];
    if (name[0] == '@') {
      if (name == "@scale_a") {
        args.scale_a(matrix_ref(operands[i], "scale_a"));
      } else {
        // _scaled_mm's 128×128 scale_b has its K blocks adjacent; evtc reads N blocks adjacent.
        at::Tensor t = operands[i].contiguous();
        if (!t.is_same(operands[i])) keep.push_back(t);
        args.scale_b(matrix_ref(t, "scale_b"));
      }
      continue;
    }
    args.set(name, operand_ref(operands[i], cls, m, n, operand_what(name), keep));
  }
  bind_merged_rows(plan, sources, n, stream, [&](const std::string& name, const TensorRef& t) { args.set(name, t); },
                   keep);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor& t = outputs[i];
    args.set(plan.outputs[i].name, t.dim() == 2   ? TensorRef{t.data_ptr(), evtc_dtype(t, "output"), t.size(0), t.size(1), t.stride(0), 1}
                                    : t.dim() == 1 ? TensorRef::vector(t.data_ptr(), evtc_dtype(t, "output"), t.size(0))
                                                   : TensorRef::scalar(t.data_ptr(), evtc_dtype(t, "output")));
  }
  const ExecutionPath path = plan.dense->run(args, stream);
  (path == ExecutionPath::fused ? plan.fused_calls : plan.fallback_calls).fetch_add(1, std::memory_order_relaxed);
  return outputs;
}

cudaStream_t current_stream(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

std::vector<at::Tensor> gemm_epilogue(c10::string_view spec, const at::Tensor& a, const at::Tensor& b,
                                      at::TensorList operands) {
  Plan& plan = plan_for(std::string_view(spec.data(), spec.size()));
  require_cuda(a, "operand A");
  c10::cuda::CUDAGuard guard(a.device());
  if (compile_only_depth.load() > 0)
    return compile_only(std::string_view(spec.data(), spec.size()), plan, a, a.size(0), b.size(1), a.size(1));
  return run_dense(plan, a, b, operands, {}, current_stream(a));
}

// A merged op's B (K × N): the gate and up B halves (K × N/2 each) from its sources,
// column j of gate at 2j and of up at 2j+1, stored K-major (N × K contiguous) as the gated
// kernels read nn.Linear weights.
at::Tensor merged_b(const Plan& plan, at::TensorList sources, cudaStream_t stream) {
  if (!plan.merged_b) throw UserError("this spec describes no merged GEMM: call gemm_epilogue");
  return merged_part(*plan.merged_b, sources, true, "merged B", stream).transpose(-2, -1);
}

// The size of a merged op's N (twice a half's columns), from the recipes alone (no copy).
c10::SymInt merged_sym_n(const Plan& plan, at::TensorList sources) {
  if (!plan.merged_b) throw UserError("this spec describes no merged GEMM: call gemm_epilogue");
  return apply(plan.merged_b->gate, sources, "merged B").sym_size(-1) * 2;
}

int64_t merged_n(const Plan& plan, at::TensorList sources) {
  return merged_sym_n(plan, sources).guard_int(__FILE__, __LINE__);
}

// The op _merged_n: the merged op's N for the fake implementations (python/evtc/torch/_op.py),
// so that the recipes are read in one place; on fake tensors the size may be symbolic.
c10::SymInt merged_n_op(c10::string_view spec, at::TensorList sources) {
  return merged_sym_n(plan_for(std::string_view(spec.data(), spec.size())), sources);
}

std::vector<at::Tensor> gemm_epilogue_merged(c10::string_view spec, const at::Tensor& a, at::TensorList sources,
                                             at::TensorList operands) {
  Plan& plan = plan_for(std::string_view(spec.data(), spec.size()));
  require_cuda(a, "operand A");
  c10::cuda::CUDAGuard guard(a.device());
  if (compile_only_depth.load() > 0)  // no weight copy while only compiling
    return compile_only(std::string_view(spec.data(), spec.size()), plan, a, a.size(0), merged_n(plan, sources),
                        a.size(1));
  const cudaStream_t stream = current_stream(a);
  at::Tensor b = merged_b(plan, sources, stream);
  return run_dense(plan, a, b, operands, sources, stream);
}

// The weights as the grouped kernel reads them (a copy only where their layout differs).
BatchedTensorRef grouped_weights(const Plan& plan, const at::Tensor& w, std::vector<at::Tensor>& keep) {
  require_cuda(w, "weights");
  if (w.dim() != 3)
    throw UserError(cat("weights have shape ", w.sizes(), ": expected G × K × N (3 dimensions)"));
  const int64_t bytes = w.element_size();
  auto aligned = [&](int64_t stride) { return (stride * bytes) % 16 == 0; };
  at::Tensor v = w;
  const bool ptr_ok = reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 == 0;
  if (plan.k_major) {
    if (w.stride(1) != 1 || !aligned(w.stride(2)) || !aligned(w.stride(0)) || !ptr_ok)
      keep.push_back(v = w.transpose(1, 2).contiguous().transpose(1, 2));
  } else if (w.stride(2) != 1 || !aligned(w.stride(1)) || !aligned(w.stride(0)) || !ptr_ok) {
    keep.push_back(v = w.contiguous());
  }
  BatchedTensorRef r;
  r.data = v.data_ptr();
  r.dtype = evtc_dtype(v, "weights");
  r.batches = v.size(0);
  r.batch_stride = v.stride(0);
  const int rows = plan.k_major ? 2 : 1, cols = plan.k_major ? 1 : 2;  // dim 1 is K, dim 2 is N
  r.rows = v.size(rows);
  r.cols = v.size(cols);
  r.row_stride = v.stride(rows);
  r.col_stride = v.stride(cols);
  return r;
}

at::Tensor run_grouped(Plan& plan, const at::Tensor& x_in, const at::Tensor& w, const at::Tensor& offs_in,
                       at::TensorList operands, at::TensorList sources, cudaStream_t stream) {
  if (!plan.grouped) throw UserError("this spec describes a dense kernel: call gemm_epilogue");
  if (operands.size() != plan.operands.size())
    throw UserError(cat(operands.size(), " operand tensors given, the spec names ", plan.operands.size()));
  require_cuda(x_in, "x");
  require_cuda(offs_in, "offsets");
  const int64_t rows = x_in.size(0), n = w.size(2);
  const Output& out = plan.outputs[0];
  at::Tensor y = at::empty(output_size(out.shape, rows, n), x_in.options().dtype(out.dtype));
  if (compile_only_depth.load() > 0) return y;
  std::vector<at::Tensor> keep;
  at::Tensor x = x_in;
  const int64_t bytes = x.element_size();
  if (x.dim() != 2 || x.stride(1) != 1 || (x.stride(0) * bytes) % 16 || reinterpret_cast<uintptr_t>(x.data_ptr()) % 16)
    keep.push_back(x = x.contiguous());
  at::Tensor offs = offs_in;
  if (offs.scalar_type() != at::kInt || offs.dim() != 1 || offs.stride(0) != 1)
    keep.push_back(offs = offs.to(at::kInt).contiguous());
  GroupedArguments args;
  args.x(matrix_ref(x, "x")).weights(grouped_weights(plan, w, keep)).offsets(offs.data_ptr<int32_t>(), offs.size(0));
  for (size_t i = 0; i < operands.size(); ++i) {
    const auto& [name, cls] = plan.operands[i];
    // Grouped epilogues read [N] row vectors shared by all groups and scalars.
    TensorRef t = operand_ref(operands[i], cls, rows, n, operand_what(name), keep);
    if (reinterpret_cast<uintptr_t>(t.data) % 16) {  // the grouped epilogue loads 16-byte aligned vectors
      at::Tensor copy = at::from_blob(t.data, {t.cols}, x.options().dtype(scalar_type(t.dtype))).clone();
      keep.push_back(copy);
      t.data = copy.data_ptr();
    }
    args.set(name, t);
  }
  bind_merged_rows(plan, sources, n, stream, [&](const std::string& name, const TensorRef& t) { args.set(name, t); },
                   keep);
  args.set(out.name, matrix_ref(y, "output"));
  if (plan.grouped->run(args, stream) == ExecutionPath::fused)
    plan.fused_calls.fetch_add(1, std::memory_order_relaxed);
  else
    plan.fallback_calls.fetch_add(1, std::memory_order_relaxed);
  return y;
}

at::Tensor grouped_gemm_epilogue(c10::string_view spec, const at::Tensor& x, const at::Tensor& w, const at::Tensor& offs,
                                 at::TensorList operands) {
  Plan& plan = plan_for(std::string_view(spec.data(), spec.size()));
  if (compile_only_depth.load() > 0) pending_compiles().add(std::string_view(spec.data(), spec.size()), 0, 0, 0);
  require_cuda(x, "x");
  c10::cuda::CUDAGuard guard(x.device());
  return run_grouped(plan, x, w, offs, operands, {}, current_stream(x));
}

at::Tensor grouped_gemm_epilogue_merged(c10::string_view spec, const at::Tensor& x, at::TensorList sources,
                                        const at::Tensor& offs, at::TensorList operands) {
  Plan& plan = plan_for(std::string_view(spec.data(), spec.size()));
  require_cuda(x, "x");
  c10::cuda::CUDAGuard guard(x.device());
  if (compile_only_depth.load() > 0) {  // no weight copy while only compiling
    pending_compiles().add(std::string_view(spec.data(), spec.size()), 0, 0, 0);
    const Output& out = plan.outputs[0];
    return at::empty(output_size(out.shape, x.size(0), merged_n(plan, sources)), x.options().dtype(out.dtype));
  }
  const cudaStream_t stream = current_stream(x);
  return run_grouped(plan, x, merged_b(plan, sources, stream), offs, operands, sources, stream);
}

int64_t set_compile_only(int64_t delta) { return compile_only_depth.fetch_add(delta) + delta; }

std::vector<std::string> take_pending_compiles() { return pending_compiles().take(); }

std::vector<int64_t> path_counts(c10::string_view spec) {
  Plan& plan = plan_for(std::string_view(spec.data(), spec.size()));
  return {plan.fused_calls.load(), plan.fallback_calls.load()};
}

int64_t merged_cache_bytes() { return merged_cache().bytes(); }

int64_t clear_merged_cache() {
  merged_cache().clear();
  return 0;
}

}  // namespace
}  // namespace evtc::torch_ops

TORCH_LIBRARY(evtc, m) {
  m.def("gemm_epilogue(str spec, Tensor a, Tensor b, Tensor[] operands) -> Tensor[]");
  m.def("gemm_epilogue_merged(str spec, Tensor a, Tensor[] sources, Tensor[] operands) -> Tensor[]");
  m.def("grouped_gemm_epilogue(str spec, Tensor x, Tensor w, Tensor offs, Tensor[] operands) -> Tensor");
  m.def("grouped_gemm_epilogue_merged(str spec, Tensor x, Tensor[] sources, Tensor offs, Tensor[] operands) -> Tensor");
  m.def("_compile_only(int delta) -> int", &evtc::torch_ops::set_compile_only);
  m.def("_take_pending_compiles() -> str[]", &evtc::torch_ops::take_pending_compiles);
  m.def("_path_counts(str spec) -> int[]", &evtc::torch_ops::path_counts);
  m.def("_merged_cache_bytes() -> int", &evtc::torch_ops::merged_cache_bytes);
  m.def("_clear_merged_cache() -> int", &evtc::torch_ops::clear_merged_cache);
  m.def("_merged_n(str spec, Tensor[] sources) -> SymInt", &evtc::torch_ops::merged_n_op);
  m.def("interleave_pairs(Tensor gate, Tensor up, int dim) -> Tensor");
  m.def("stacked_linear(Tensor a, Tensor[] weights, Tensor[] biases) -> Tensor");
  m.def("_rows_of_one_buffer(Tensor[] parts) -> bool", &evtc::torch_ops::rows_of_one_buffer_op);
}

TORCH_LIBRARY_IMPL(evtc, CompositeImplicitAutograd, m) {
  m.impl("interleave_pairs", &evtc::torch_ops::interleave_pairs);
}

// Explicit, so that graphs keep it as one op (its fake implementation is registered from Python).
TORCH_LIBRARY_IMPL(evtc, CompositeExplicitAutograd, m) {
  m.impl("stacked_linear", &evtc::torch_ops::stacked_linear);
}

TORCH_LIBRARY_IMPL(evtc, CUDA, m) {
  m.impl("gemm_epilogue", &evtc::torch_ops::gemm_epilogue);
  m.impl("gemm_epilogue_merged", &evtc::torch_ops::gemm_epilogue_merged);
  m.impl("grouped_gemm_epilogue", &evtc::torch_ops::grouped_gemm_epilogue);
  m.impl("grouped_gemm_epilogue_merged", &evtc::torch_ops::grouped_gemm_epilogue_merged);
}
