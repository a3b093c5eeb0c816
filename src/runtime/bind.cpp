#include "runtime/bind.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <tuple>

#include "evtc/error.hpp"

namespace evtc::runtime {
namespace {

std::optional<Layout> layout_of(const TensorRef& t) {
  return matrix_layout(t.rows, t.cols, t.row_stride, t.col_stride);
}

const char* layout_text(Layout l) { return l == Layout::row_major ? "row-major" : "column-major"; }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The C source or the D output: an M×N row-major matrix of the compiled dtype.
template <typename What>
void check_mn_matrix(const TensorRef& t, DType want, int64_t m, int64_t n, const What& what,
                     PointerChecks& pointers, std::vector<std::string>& reasons) {
  if (t.dtype != want)
    throw UserError(fmt::format("{}: dtype {} given, the kernel was compiled for {}", what(),
                                dtype_name(t.dtype), dtype_name(want)));
  if (t.rows != m || t.cols != n)
    throw UserError(fmt::format("{}: shape {}×{} given, expected M×N = {}×{}", what(), t.rows,
                                t.cols, m, n));
  if (t.col_stride != 1 || t.row_stride < n)
    throw UserError(fmt::format("{}: strides ({}, {}) given, expected a row-major matrix with "
                                "strides ({}, 1)",
                                what(), t.row_stride, t.col_stride, n));
  pointers.check(t.data, what);
  if (!aligned16(t.data) || (t.row_stride * dtype_bytes(t.dtype)) % 16 != 0)
    reasons.push_back(fmt::format("{} is not 16-byte aligned (TMA needs aligned rows)", what()));
}

// An operand or extra output of the signature's pointer table.
void check_slot(const OperandSlot& s, const TensorRef& t, int64_t m, int64_t n, PointerChecks& pointers,
                std::vector<std::string>& reasons) {
  auto what = [&] { return fmt::format("{} '{}'", s.is_output ? "output" : "operand", s.name); };
  if (t.dtype != s.dtype)
    throw UserError(fmt::format("{}: dtype {} given, the kernel was compiled for {}", what(),
                                dtype_name(t.dtype), dtype_name(s.dtype)));
  if (s.shape == Shape::half) {
    // A gated output: the (gate, up) pairs of the M×N product, one column per pair.
    if (n % 2 != 0)
      throw UserError(fmt::format("{}: N={} is odd, but a gated output takes whole (gate, up) "
                                  "column pairs (gate in even columns, up in odd ones)",
                                  what(), n));
    if (t.rows != m || t.cols != n / 2)
      throw UserError(fmt::format("{}: shape {}×{} given, expected M×N/2 = {}×{} (a gated "
                                  "output has one column per (gate, up) pair)",
                                  what(), t.rows, t.cols, m, n / 2));
    if (t.col_stride != 1 || t.row_stride != n / 2)
      throw UserError(fmt::format("{}: strides ({}, {}) given, expected a contiguous row-major "
                                  "matrix with strides ({}, 1)",
                                  what(), t.row_stride, t.col_stride, n / 2));
  } else if (s.shape == Shape::full) {
    const bool row = s.layout == Layout::row_major;
    if (t.rows != m || t.cols != n)
      throw UserError(fmt::format("{}: shape {}×{} given, expected M×N = {}×{}", what(), t.rows, t.cols, m, n));
    if (row ? (t.col_stride != 1 || t.row_stride != n) : (t.row_stride != 1 || t.col_stride != m))
      throw UserError(fmt::format("{}: strides ({}, {}) given, expected a contiguous {} matrix "
                                  "with strides {}",
                                  what(), t.row_stride, t.col_stride, layout_text(s.layout),
                                  row ? fmt::format("({}, 1)", n) : fmt::format("(1, {})", m)));
    if (!aligned16(t.data)) reasons.push_back(fmt::format("{} is not 16-byte aligned", what()));
  } else {
    const int64_t want = s.shape == Shape::row ? n : s.shape == Shape::col ? m : 1;
    const char* dim = s.shape == Shape::row ? " (N)" : s.shape == Shape::col ? " (M)" : "";
    if (t.rows * t.cols != want || (t.rows != 1 && t.cols != 1))
      throw UserError(fmt::format("{}: {}×{} given, expected a vector of {} elements{}", what(),
                                  t.rows, t.cols, want, dim));
    const int64_t step = t.rows == 1 ? t.col_stride : t.row_stride;
    if (want > 1 && step != 1)
      throw UserError(fmt::format("{}: elements are {} apart, expected contiguous", what(), step));
    if (s.shape != Shape::scalar && !aligned16(t.data))
      reasons.push_back(fmt::format("{} is not 16-byte aligned", what()));
  }
  pointers.check(t.data, what);
}

}  // namespace

void refuse_unexpected_block_scales(bool scale_a, bool scale_b, const char* kernel) {
  if (scale_a || scale_b)
    throw UserError(fmt::format("{} given, but the {} was not built for fp8 block scales (fp8_blockwise)",
                                scale_a ? "scale_a" : "scale_b", kernel));
}

void require_f32_block_scales(const char* name, DType dtype) {
  if (dtype != DType::f32)
    throw UserError(fmt::format("{}: dtype {} given, block scales are f32", name, dtype_name(dtype)));
}

namespace {

// fp8 block scales: both given (and only) for a block-scaled GEMM, f32, in the layouts of
// GemmDesc::fp8_blockwise.
void bind_block_scales(const GemmDesc& gemm, const Arguments& args, int64_t m, int64_t n, int64_t k,
                       PointerChecks& pointers, BoundCall& call) {
  const auto& sa = args.scale_a();
  const auto& sb = args.scale_b();
  if (!gemm.fp8_blockwise) {
    refuse_unexpected_block_scales(sa.has_value(), sb.has_value(), "kernel");
    return;
  }
  const int64_t kb = fp8_scale_blocks(k), nb = fp8_scale_blocks(n);
  if (!sa)
    throw UserError(fmt::format("scale_a was not given: a block-scaled kernel needs A's f32 scales, "
                                "an M × ceil(K/128) = {}×{} matrix with M adjacent",
                                m, kb));
  if (!sb)
    throw UserError(fmt::format("scale_b was not given: a block-scaled kernel needs B's f32 scales, "
                                "a ceil(K/128) × ceil(N/128) = {}×{} row-major matrix",
                                kb, nb));
  require_f32_block_scales("scale_a", sa->dtype);
  require_f32_block_scales("scale_b", sb->dtype);
  if (sa->rows != m || sa->cols != kb)
    throw UserError(fmt::format("scale_a: shape {}×{} given, expected M × ceil(K/128) = {}×{} (one "
                                "scale per row of A and 128 of K)",
                                sa->rows, sa->cols, m, kb));
  if (sb->rows != kb || sb->cols != nb)
    throw UserError(fmt::format("scale_b: shape {}×{} given, expected ceil(K/128) × ceil(N/128) = {}×{} "
                                "(one scale per 128×128 block of B)",
                                sb->rows, sb->cols, kb, nb));
  pointers.check(sa->data, [] { return std::string("scale_a"); });
  pointers.check(sb->data, [] { return std::string("scale_b"); });
  call.scale_a = sa->data;
  call.scale_b = sb->data;
  // Strides of a dimension of one element do not matter: the canonical ones stand in.
  call.scale_a_m_stride = m > 1 ? sa->row_stride : 1;
  call.ld_scale_a = kb > 1 ? sa->col_stride : m;
  call.scale_b_k_stride = kb > 1 ? sb->row_stride : nb;
  call.scale_b_n_stride = nb > 1 ? sb->col_stride : 1;
  // The fused kernel reads A's scales with M adjacent, 16-byte rows of them per K block (TMA),
  // and B's row-major; the unfused path reads any strides.
  if (call.scale_a_m_stride != 1 || call.ld_scale_a < m)
    call.reasons.push_back(fmt::format("scale_a has strides ({}, {}): the fused kernel reads it with M "
                                       "adjacent, strides (1, ld) with ld ≥ M = {} (PyTorch: "
                                       "scale.t().contiguous().t())",
                                       sa->row_stride, sa->col_stride, m));
  else if (!aligned16(sa->data) || (call.ld_scale_a * 4) % 16 != 0)
    call.reasons.push_back(fmt::format("scale_a's K blocks are not 16-byte aligned (pointer {}, "
                                       "ld {}: the fused kernel needs ld a multiple of 4)",
                                       sa->data, call.ld_scale_a));
  if (call.scale_b_k_stride != nb || call.scale_b_n_stride != 1)
    call.reasons.push_back(fmt::format("scale_b has strides ({}, {}): the fused kernel reads it row-major, "
                                       "strides ({}, 1) (PyTorch: scale_b.contiguous())",
                                       sb->row_stride, sb->col_stride, nb));
}

}  // namespace

bool PointerChecks::known(const void* p, int device) {
  std::lock_guard lock(mu_);
  for (const auto& [q, d] : seen_)
    if (q == p && d == device) return true;
  return false;
}

void PointerChecks::query(const void* p, int device, const std::string& what) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess || attr.type == cudaMemoryTypeHost ||
      attr.type == cudaMemoryTypeUnregistered) {
    cudaGetLastError();
    throw UserError(fmt::format("{}: pointer {} is not device memory", what, p));
  }
  if (attr.type == cudaMemoryTypeDevice && attr.device != device)
    throw UserError(fmt::format("{}: lives on device {} but the current device is {}", what,
                                attr.device, device));
  std::lock_guard lock(mu_);
  seen_[next_] = {p, device};
  next_ = (next_ + 1) % seen_.size();
}

void PointerChecks::fail_null(const std::string& what) {
  throw UserError(fmt::format("{}: no data (null pointer)", what));
}

evtc_gemm_args BoundCall::abi(bool swap_ab, const VisitOrder& order) const {
  evtc_gemm_args a{};
  a.raster = order.raster == VisitOrder::Raster::along_m   ? 1
             : order.raster == VisitOrder::Raster::along_n ? 2
                                                           : 0;
  a.swizzle = order.swizzle;
  a.m = m;
  a.n = n;
  a.k = k;
  a.a = this->a;
  a.b = this->b;
  a.c = c;
  a.d = d;
  a.lda = lda;
  a.ldb = ldb;
  a.ldc = ldc;
  a.ldd = ldd;
  a.ptrs = ptrs.data();
  a.scalars = scalars.data();
  a.sm_count = 0;
  a.scale_a = scale_a;
  a.scale_b = scale_b;
  a.ld_scale_a = ld_scale_a;
  a.scale_a_m_stride = scale_a_m_stride;
  a.scale_b_k_stride = scale_b_k_stride;
  a.scale_b_n_stride = scale_b_n_stride;
  if (swap_ab) {
    std::swap(a.m, a.n);
    std::swap(a.a, a.b);
    std::swap(a.lda, a.ldb);
  }
  return a;
}

BoundCall bind_arguments(const KernelSignature& sig, const GemmDesc& gemm, const Arguments& args,
                         PointerChecks& pointers) {
  BoundCall call;
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
  // The index leaves are f32 values: every index below 2^24 is exact, larger ones are not.
  for (auto [reads, extent, size, axis] : {std::tuple{sig.reads_row_index, m, 'M', IndexAxis::m},
                                           std::tuple{sig.reads_col_index, n, 'N', IndexAxis::n}})
    if (reads && extent > kExactF32Integer)
      throw UserError(fmt::format("{}={} is too large for the epilogue's {} index '{}': indices are f32 values, "
                                  "exact up to {} (2^24)",
                                  size, extent, index_axis_role(axis), index_axis_name(axis), kExactF32Integer));
  const auto la = layout_of(A), lb = layout_of(B);
  if (!la) throw UserError("operand A: neither its rows nor its columns are contiguous");
  if (!lb) throw UserError("operand B: neither its rows nor its columns are contiguous");
  pointers.check(A.data, [] { return std::string("operand A"); });
  pointers.check(B.data, [] { return std::string("operand B"); });
  call.m = m;
  call.n = n;
  call.k = k;
  call.a_layout = *la;
  call.b_layout = *lb;
  call.a = A.data;
  call.b = B.data;
  call.lda = *la == Layout::row_major ? A.row_stride : A.col_stride;
  call.ldb = *lb == Layout::row_major ? B.row_stride : B.col_stride;
  if (*la != gemm.a_layout)
    call.reasons.push_back(fmt::format("A is {} but the kernel was built for {} A", layout_text(*la),
                                       layout_text(gemm.a_layout)));
  if (*lb != gemm.b_layout)
    call.reasons.push_back(fmt::format("B is {} but the kernel was built for {} B", layout_text(*lb),
                                       layout_text(gemm.b_layout)));

  // --- fp8 block scales ------------------------------------------------------------------
  bind_block_scales(gemm, args, m, n, k, pointers, call);

  // --- C and D -------------------------------------------------------------------------
  call.ldc = n;
  if (sig.reads_c) {
    if (!args.c()) throw UserError("the source matrix C was not given (the epilogue reads C)");
    check_mn_matrix(*args.c(), sig.c_dtype, m, n, [] { return std::string("source matrix C"); },
                    pointers, call.reasons);
    call.c = args.c()->data;
    call.ldc = args.c()->row_stride;
  }
  call.ldd = n;
  if (!sig.d_name.empty()) {
    auto it = args.tensors().find(sig.d_name);
    if (it == args.tensors().end())
      throw UserError(fmt::format("output '{}' ({}[m,n]) was not given", sig.d_name, dtype_name(sig.d_dtype)));
    check_mn_matrix(it->second, sig.d_dtype, m, n,
                    [&] { return fmt::format("output '{}'", sig.d_name); }, pointers, call.reasons);
    call.d = it->second.data;
    call.ldd = it->second.row_stride;
  }

  // --- operands and extra outputs -------------------------------------------------------
  call.ptrs.reserve(sig.pointers.size());
  for (const OperandSlot& s : sig.pointers) {
    auto it = args.tensors().find(s.name);
    if (it == args.tensors().end())
      throw UserError(fmt::format("{} '{}' ({}{}) was not given", s.is_output ? "output" : "operand",
                                  s.name, dtype_name(s.dtype), shape_name(s.shape)));
    check_slot(s, it->second, m, n, pointers, call.reasons);
    call.ptrs.push_back(it->second.data);
  }
  call.scalars.reserve(sig.scalars.size());
  for (const OperandSlot& s : sig.scalars) {
    auto it = args.scalars().find(s.name);
    if (it == args.scalars().end())
      throw UserError(fmt::format("scalar parameter '{}' was not given", s.name));
    call.scalars.push_back(it->second);
  }
  if (args.tensors().size() != sig.pointers.size() + (sig.d_name.empty() ? 0 : 1)) {
    for (const auto& [name, t] : args.tensors()) {
      bool known = name == sig.d_name;
      for (const auto& s : sig.pointers) known |= s.name == name;
      if (!known) throw UserError(fmt::format("'{}' is not an operand or output of this epilogue", name));
    }
  }
  return call;
}

}  // namespace evtc::runtime
