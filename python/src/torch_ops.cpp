// evtc's PyTorch operators, registered with the dispatcher from C++ (evtc/_evtc_torch.so, loaded
// by `import evtc.torch`). A call from Inductor's generated code (or torch.ops.evtc.*) goes
// through the dispatcher straight to evtc::Kernel::run: the spec string is resolved to its
// kernel and operand plan once per process, and a call only places its tensors, allocates its
// outputs with torch's allocator and launches on torch's current stream. No Python runs.
//
// Ops (schemas in TORCH_LIBRARY below; fake implementations are registered from Python):
//   gemm_epilogue(spec, a, b, operands) -> outputs
//   gemm_epilogue_merged(spec, a, b_gate, b_up, operands, paired) -> outputs
//       the GEMM over B = the columns of b_gate and b_up interleaved (gate j, up j) -> gated
//       epilogues; the interleaved copy is cached per source tensors and rebuilt when they change
//   grouped_gemm_epilogue(spec, x, w, offs, operands) -> y
//   grouped_gemm_epilogue_merged(spec, x, w_gate, w_up, offs, operands, paired) -> y
//   _compile_only(delta) -> depth, _wait_for_compiles() -> errors, _path_counts(spec) -> [fused, fallback]
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <atomic>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <semaphore>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "evtc/error.hpp"
#include "evtc/expression.hpp"
#include "evtc/grouped.hpp"
#include "evtc/options.hpp"
#include "evtc/passes.hpp"
#include "evtc/runtime.hpp"

namespace evtc::torch_ops {
namespace {

// --- dtypes and tensor views --------------------------------------------------------------------

at::ScalarType scalar_type(DType d) {
  switch (d) {
    case DType::f32: return at::kFloat;
    case DType::f16: return at::kHalf;
    case DType::bf16: return at::kBFloat16;
    case DType::f8e4m3: return at::kFloat8_e4m3fn;
    case DType::f8e5m2: return at::kFloat8_e5m2;
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
    default:
      throw UserError(c10::str(what, " has dtype ", c10::toString(t.scalar_type()), "; evtc takes float32, float16, bfloat16 and float8 (e4m3fn, e5m2) tensors"));
  }
}

void require_cuda(const at::Tensor& t, const std::string& what) {
  if (!t.is_cuda()) throw UserError(c10::str(what, " is on ", t.device().str(), ", not a CUDA device"));
}

TensorRef matrix_ref(const at::Tensor& t, const std::string& what) {
  require_cuda(t, what);
  if (t.dim() != 2)
    throw UserError(c10::str(what, " has ", t.dim(), " dimensions; expected a matrix"));
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
  const int64_t full[2] = {m, n};
  const OperandPlacement p = place_operand(t2.sizes().vec(), t2.strides().vec(), full);
  if (p.load != expected)
    throw UserError(c10::str(what, " of shape ", c10::str(t.sizes()), " is read as a ", load_class_name(p.load), " now but was traced as a ", load_class_name(expected), p.why.empty() ? "" : ": " + p.why));
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
  throw InternalError(c10::str(what, ": no placement"));
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
  throw UserError(c10::str("spec: operand ", what, " has class '", name, "' (expected row, col, scalar, aux or aux_col)"));
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
  std::vector<std::pair<std::string, LoadClass>> operands;
  std::vector<std::string> paired;  // row operands given as (gate, up) vectors to interleave
  std::vector<Output> outputs;
  std::atomic<int64_t> fused_calls{0}, fallback_calls{0};
};

nlohmann::json parse_spec(std::string_view spec) {
  try {
    return nlohmann::json::parse(spec);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(c10::str("evtc op spec is not JSON: ", e.what()));
  }
}

std::unique_ptr<Plan> make_plan(std::string_view text) {
  const nlohmann::json s = parse_spec(text);
  auto plan = std::make_unique<Plan>();
  const OptionText options = option_text_from_json(s.at("options").dump());
  const Graph graph = parse_expression(s.at("expr").get<std::string>(), parse_options(options));
  for (const auto& o : s.at("operands"))
    plan->operands.emplace_back(o.at(0).get<std::string>(), class_of(o.at(1).get<std::string>(), o.at(0).get<std::string>()));
  if (s.contains("paired"))
    for (const auto& p : s.at("paired")) plan->paired.push_back(p.get<std::string>());
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
    if (!found) throw UserError(c10::str("spec: the epilogue has no output '", want, "'"));
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

// --- compile-only mode: ops queue their kernel's compile and return unwritten outputs ----------

std::atomic<int64_t> compile_only_depth{0};

struct CompileQueue {
  std::mutex mu;
  std::map<std::string, std::shared_future<std::string>> started;  // key -> error ("" when fine)
  std::counting_semaphore<1024> slots{std::max<std::ptrdiff_t>(1, std::thread::hardware_concurrency())};

  void start(const std::string& key, std::function<void()> compile) {
    std::lock_guard lock(mu);
    if (started.count(key)) return;
    started[key] = std::async(std::launch::async, [this, compile = std::move(compile)]() -> std::string {
                     slots.acquire();
                     std::string error;
                     try {
                       compile();
                     } catch (const std::exception& e) {
                       error = e.what();
                     }
                     slots.release();
                     return error;
                   }).share();
  }

  std::vector<std::string> wait() {
    std::vector<std::shared_future<std::string>> all;
    {
      std::lock_guard lock(mu);
      for (auto& [key, f] : started) all.push_back(f);
    }
    std::vector<std::string> errors;
    for (auto& f : all)
      if (std::string e = f.get(); !e.empty()) errors.push_back(e);
    return errors;
  }
};

CompileQueue& compile_queue() {
  static CompileQueue q;
  return q;
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
           sizes == t.sizes().vec() && strides == t.strides().vec() && version == t._version();
  }
};

struct MergedCopy {
  SourceState gate, up;
  int dim;
  at::Tensor merged;
};

// Interleaves `gate` and `up` along dimension `dim` (element j of gate at 2j, of up at 2j+1),
// returning a contiguous tensor; `transposed` lays it out for a K-major read of the last two
// dimensions (the result's last dimension contiguous after swapping them).
at::Tensor interleave(const at::Tensor& gate, const at::Tensor& up, int64_t dim) {
  return at::stack({gate, up}, dim + 1).flatten(dim, dim + 1);
}

class MergedCache {
 public:
  // The interleaved tensor of (gate, up), made by `build` when there is no valid copy.
  at::Tensor get(const at::Tensor& gate, const at::Tensor& up, int dim, const std::function<at::Tensor()>& build,
                 cudaStream_t stream) {
    std::lock_guard lock(mu_);
    for (auto it = copies_.begin(); it != copies_.end();) {
      if (it->gate.storage.expired() || it->up.storage.expired()) {
        it = copies_.erase(it);  // the sources are gone: so is the copy
        continue;
      }
      if (it->dim == dim && it->gate.same_as(gate) && it->up.same_as(up)) return it->merged;
      ++it;
    }
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) capture = cudaStreamCaptureStatusNone;
    at::Tensor merged = build();
    // A copy made while a CUDA graph is being captured lives in the graph's memory and is
    // rebuilt by every replay: it is used, not kept.
    if (capture != cudaStreamCaptureStatusNone) return merged;
    // Drop older copies of the same sources (an earlier version of these weights).
    std::erase_if(copies_, [&](const MergedCopy& c) {
      return c.dim == dim && c.gate.storage._unsafe_get_target() == gate.storage().unsafeGetStorageImpl() &&
             c.up.storage._unsafe_get_target() == up.storage().unsafeGetStorageImpl();
    });
    copies_.push_back({SourceState(gate), SourceState(up), dim, merged});
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
};

MergedCache& merged_cache() {
  static MergedCache c;
  return c;
}

// --- the ops --------------------------------------------------------------------------------------

std::string operand_what(const std::string& name) { return c10::str("operand ", name); }

// The paired row operands of a merged op: (gate, up) vectors of N/2 interleaved into N.
void bind_paired(const Plan& plan, at::TensorList paired, int64_t n, cudaStream_t stream,
                 const std::function<void(const std::string&, const TensorRef&)>& set, std::vector<at::Tensor>& keep) {
  if (paired.size() != 2 * plan.paired.size())
    throw UserError(c10::str(paired.size(), " paired operand tensors given, the spec names ", plan.paired.size(), " pairs"));
  for (size_t i = 0; i < plan.paired.size(); ++i) {
    const at::Tensor& g = paired[2 * i];
    const at::Tensor& u = paired[2 * i + 1];
    const std::string what = operand_what(plan.paired[i]);
    require_cuda(g, what);
    require_cuda(u, what);
    at::Tensor merged = merged_cache().get(g, u, g.dim() - 1, [&] { return interleave(g, u, g.dim() - 1).contiguous(); },
                                           stream);
    keep.push_back(merged);
    if (merged.dim() == 1) {
      if (merged.size(0) != n)
        throw UserError(c10::str(what, ": the paired vectors give ", merged.size(0), " values, the GEMM has N = ", n));
      set(plan.paired[i], TensorRef::vector(merged.data_ptr(), evtc_dtype(merged, what), n));
    } else {  // per-group G × N (grouped kernels)
      set(plan.paired[i], matrix_ref(merged, what));
    }
  }
}

std::vector<at::Tensor> dense_outputs(const Plan& plan, const at::Tensor& a, int64_t m, int64_t n) {
  if (!plan.dense) throw UserError("this spec describes a grouped kernel: call grouped_gemm_epilogue");
  std::vector<at::Tensor> outputs;
  outputs.reserve(plan.outputs.size());
  for (const Output& o : plan.outputs) outputs.push_back(at::empty(output_size(o.shape, m, n), a.options().dtype(o.dtype)));
  return outputs;
}

// In compile-only mode: queues the kernel's compile for this size; the outputs stay unwritten.
std::vector<at::Tensor> compile_only(const Plan& plan, const at::Tensor& a, int64_t m, int64_t n, int64_t k) {
  std::vector<at::Tensor> outputs = dense_outputs(plan, a, m, n);
  Kernel* kernel = plan.dense.get();
  compile_queue().start(c10::str(static_cast<const void*>(kernel), "/", m, "x", n, "x", k),
                        [kernel, m, n, k] { kernel->compile(m, n, k); });
  return outputs;
}

std::vector<at::Tensor> run_dense(Plan& plan, const at::Tensor& a, const at::Tensor& b, at::TensorList operands,
                                  at::TensorList paired, cudaStream_t stream) {
  if (operands.size() != plan.operands.size())
    throw UserError(c10::str(operands.size(), " operand tensors given, the spec names ", plan.operands.size()));
  const int64_t m = a.size(0), n = b.size(1);
  std::vector<at::Tensor> outputs = dense_outputs(plan, a, m, n);
  Arguments args;
  args.a(matrix_ref(a, "operand A")).b(matrix_ref(b, "operand B"));
  std::vector<at::Tensor> keep;
  for (size_t i = 0; i < operands.size(); ++i) {
    const auto& [name, cls] = plan.operands[i];
    args.set(name, operand_ref(operands[i], cls, m, n, operand_what(name), keep));
  }
  bind_paired(plan, paired, n, stream, [&](const std::string& name, const TensorRef& t) { args.set(name, t); }, keep);
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
  if (compile_only_depth.load() > 0) return compile_only(plan, a, a.size(0), b.size(1), a.size(1));
  return run_dense(plan, a, b, operands, {}, current_stream(a));
}

// B (K × N) from the two GEMMs' B operands (K × N/2 each): column j of b_gate at 2j, of b_up
// at 2j+1, laid out K-major (N × K contiguous) as the gated kernels read nn.Linear weights.
at::Tensor merged_b(const at::Tensor& b_gate, const at::Tensor& b_up, cudaStream_t stream) {
  if (b_gate.dim() != 2 || b_up.dim() != 2 || b_gate.sizes() != b_up.sizes())
    throw UserError(c10::str("merged GEMM: B operands of shapes ", c10::str(b_gate.sizes()), " and ", c10::str(b_up.sizes()), "; expected two K × N/2 matrices of one shape"));
  at::Tensor rows = merged_cache().get(b_gate, b_up, 1, [&] {
    // (N/2, K) each -> (N, K) with gate j at row 2j: the K-major interleaved weight.
    return interleave(b_gate.t(), b_up.t(), 0).contiguous();
  }, stream);
  return rows.t();
}

std::vector<at::Tensor> gemm_epilogue_merged(c10::string_view spec, const at::Tensor& a, const at::Tensor& b_gate,
                                             const at::Tensor& b_up, at::TensorList operands, at::TensorList paired) {
  Plan& plan = plan_for(std::string_view(spec.data(), spec.size()));
  require_cuda(a, "operand A");
  require_cuda(b_gate, "operand B (gate)");
  require_cuda(b_up, "operand B (up)");
  c10::cuda::CUDAGuard guard(a.device());
  if (compile_only_depth.load() > 0) return compile_only(plan, a, a.size(0), 2 * b_gate.size(1), a.size(1));
  const cudaStream_t stream = current_stream(a);
  return run_dense(plan, a, merged_b(b_gate, b_up, stream), operands, paired, stream);
}

// x, w and offs in the layout the grouped kernel reads (copies only where they differ).
BatchedTensorRef grouped_weights(const Plan& plan, const at::Tensor& w, std::vector<at::Tensor>& keep) {
  require_cuda(w, "weights");
  if (w.dim() != 3)
    throw UserError(c10::str("weights have shape ", c10::str(w.sizes()), ": expected G × K × N (3 dimensions)"));
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
                       at::TensorList operands, at::TensorList paired, cudaStream_t stream) {
  if (!plan.grouped) throw UserError("this spec describes a dense kernel: call gemm_epilogue");
  if (operands.size() != plan.operands.size())
    throw UserError(c10::str(operands.size(), " operand tensors given, the spec names ", plan.operands.size()));
  require_cuda(x_in, "x");
  require_cuda(offs_in, "offsets");
  const int64_t rows = x_in.size(0), n = w.size(2);
  const Output& out = plan.outputs[0];
  at::Tensor y = at::empty(output_size(out.shape, rows, n), x_in.options().dtype(out.dtype));
  if (compile_only_depth.load() > 0) {
    GroupedKernel* kernel = plan.grouped.get();
    compile_queue().start(c10::str(static_cast<const void*>(kernel)), [kernel] { kernel->compile(); });
    return y;
  }
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
  bind_paired(plan, paired, n, stream, [&](const std::string& name, const TensorRef& t) { args.set(name, t); }, keep);
  args.set(out.name, matrix_ref(y, "output"));
  plan.grouped->run(args, stream);
  plan.fused_calls.fetch_add(1, std::memory_order_relaxed);
  return y;
}

at::Tensor grouped_gemm_epilogue(c10::string_view spec, const at::Tensor& x, const at::Tensor& w, const at::Tensor& offs,
                                 at::TensorList operands) {
  Plan& plan = plan_for(std::string_view(spec.data(), spec.size()));
  require_cuda(x, "x");
  c10::cuda::CUDAGuard guard(x.device());
  return run_grouped(plan, x, w, offs, operands, {}, current_stream(x));
}

at::Tensor grouped_gemm_epilogue_merged(c10::string_view spec, const at::Tensor& x, const at::Tensor& w_gate,
                                        const at::Tensor& w_up, const at::Tensor& offs, at::TensorList operands,
                                        at::TensorList paired) {
  Plan& plan = plan_for(std::string_view(spec.data(), spec.size()));
  require_cuda(x, "x");
  require_cuda(w_gate, "weights (gate)");
  require_cuda(w_up, "weights (up)");
  if (w_gate.dim() != 3 || w_gate.sizes() != w_up.sizes())
    throw UserError(c10::str("merged grouped GEMM: weights of shapes ", c10::str(w_gate.sizes()), " and ", c10::str(w_up.sizes()), "; expected two G × K × N/2 tensors of one shape"));
  c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = current_stream(x);
  if (compile_only_depth.load() > 0) {  // no weight copy while only compiling
    GroupedKernel* kernel = plan.grouped.get();
    compile_queue().start(c10::str(static_cast<const void*>(kernel)), [kernel] { kernel->compile(); });
    const Output& out = plan.outputs[0];
    return at::empty(output_size(out.shape, x.size(0), 2 * w_gate.size(2)), x.options().dtype(out.dtype));
  }
  // G × K × N/2 each -> G × K × N with gate j at column 2j, stored K-major (G × N × K).
  at::Tensor w = merged_cache().get(w_gate, w_up, 2, [&] {
    return interleave(w_gate.transpose(1, 2), w_up.transpose(1, 2), 1).contiguous();
  }, stream).transpose(1, 2);
  return run_grouped(plan, x, w, offs, operands, paired, stream);
}

int64_t set_compile_only(int64_t delta) { return compile_only_depth.fetch_add(delta) + delta; }

std::vector<std::string> wait_for_compiles() { return compile_queue().wait(); }

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
  m.def("gemm_epilogue_merged(str spec, Tensor a, Tensor b_gate, Tensor b_up, Tensor[] operands, "
        "Tensor[] paired) -> Tensor[]");
  m.def("grouped_gemm_epilogue(str spec, Tensor x, Tensor w, Tensor offs, Tensor[] operands) -> Tensor");
  m.def("grouped_gemm_epilogue_merged(str spec, Tensor x, Tensor w_gate, Tensor w_up, Tensor offs, "
        "Tensor[] operands, Tensor[] paired) -> Tensor");
  m.def("_compile_only(int delta) -> int", &evtc::torch_ops::set_compile_only);
  m.def("_wait_for_compiles() -> str[]", &evtc::torch_ops::wait_for_compiles);
  m.def("_path_counts(str spec) -> int[]", &evtc::torch_ops::path_counts);
  m.def("_merged_cache_bytes() -> int", &evtc::torch_ops::merged_cache_bytes);
  m.def("_clear_merged_cache() -> int", &evtc::torch_ops::clear_merged_cache);
}

TORCH_LIBRARY_IMPL(evtc, CUDA, m) {
  m.impl("gemm_epilogue", &evtc::torch_ops::gemm_epilogue);
  m.impl("gemm_epilogue_merged", &evtc::torch_ops::gemm_epilogue_merged);
  m.impl("grouped_gemm_epilogue", &evtc::torch_ops::grouped_gemm_epilogue);
  m.impl("grouped_gemm_epilogue_merged", &evtc::torch_ops::grouped_gemm_epilogue_merged);
}
