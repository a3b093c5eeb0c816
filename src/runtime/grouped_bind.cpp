#include "runtime/grouped_bind.hpp"

#include <fmt/format.h>

#include "evtc/error.hpp"
#include "runtime/bind.hpp"

namespace evtc::runtime {

// What a grouped problem with N output columns and K must be, on either path.
std::string grouped_shape_problem(bool gated, const std::string& output, int64_t n, int64_t k, DType x_dtype) {
  if (gated && n % 2 != 0)
    return fmt::format("output '{}' is gated (one column per interleaved (gate, up) pair of the weights' N "
                       "rows): N={} must be even",
                       output, n);
  const int64_t per_row = 16 / dtype_bytes(x_dtype);
  if (k % per_row != 0)
    return fmt::format("K={} is not a multiple of {} ({} x and weights need 16-byte rows)", k, per_row,
                       dtype_name(x_dtype));
  if (n % 8 != 0) return fmt::format("N={} is not a multiple of 8 (the output's rows must be 16-byte aligned)", n);
  return {};
}

namespace {

// TMA reads and writes rows of 16 bytes: base addresses and leading dimensions must be
// multiples of 16 bytes.
void require_aligned(const std::string& what, const void* data, int64_t ld, DType dtype) {
  const int64_t bytes = dtype_bytes(dtype);
  if (reinterpret_cast<uintptr_t>(data) % 16 != 0)
    throw UserError(fmt::format("{}: its data must be 16-byte aligned", what));
  if ((ld * bytes) % 16 != 0)
    throw UserError(fmt::format("{}: its row stride ({} elements) must be a multiple of {} elements "
                                "(16 bytes)",
                                what, ld, 16 / bytes));
}

}  // namespace


GroupedCall bind_grouped(const KernelSignature& sig, const GemmDesc& gemm, bool gated, const std::string& output,
                         DType output_dtype, const GroupedArguments& args) {
  // Device pointers are checked by the caller after every shape, dtype and stride (cheap
  // checks first, and they need no GPU).
  std::vector<std::pair<const void*, std::string>> device_ptrs;
  // --- X, W, offsets -----------------------------------------------------------------------
  if (!args.x()) throw UserError("grouped operand x (the token matrix) was not given");
  if (!args.weights()) throw UserError("grouped operand weights was not given");
  const TensorRef& X = *args.x();
  const BatchedTensorRef& W = *args.weights();
  const int64_t total_m = X.rows, k = X.cols;
  if (X.dtype != gemm.a_dtype)
    throw UserError(fmt::format("x is {} but the kernel was compiled for {}", dtype_name(X.dtype),
                                dtype_name(gemm.a_dtype)));
  if (W.dtype != gemm.b_dtype)
    throw UserError(fmt::format("weights are {} but the kernel was compiled for {}", dtype_name(W.dtype),
                                dtype_name(gemm.b_dtype)));
  if (X.col_stride != 1 || X.row_stride < k)
    throw UserError(fmt::format("x must be row-major (sum of M_g × K with unit column stride); got "
                                "strides ({}, {})",
                                X.row_stride, X.col_stride));
  if (total_m < 0 || k <= 0) throw UserError(fmt::format("x is {}×{}: K must be positive", total_m, k));
  const int64_t groups = W.batches;
  if (groups <= 0) throw UserError("weights: there must be at least one group");
  const bool k_major = gemm.b_layout == Layout::col_major;
  const int64_t n = k_major ? W.rows : W.cols;
  const int64_t w_k = k_major ? W.cols : W.rows;
  const char* w_shape = k_major ? "[G, N, K]" : "[G, K, N]";
  if (W.col_stride != 1)
    throw UserError(fmt::format(
        "weights must be {} with unit stride along {} ({}); got a column stride of {}{}", w_shape,
        k_major ? "K" : "N", k_major ? "each group's N×K is K-major, like nn.Linear's weight" : "N-major",
        W.col_stride, k_major ? " (pass W.transpose(1, 2).contiguous(), or build the kernel for G×K×N "
                                "weights: GemmDesc::b_layout = row_major)"
                              : ""));
  if (w_k != k)
    throw UserError(fmt::format("weights are {} = [{}, {}, {}] but x has K={} columns", w_shape, groups,
                                W.rows, W.cols, k));
  if (n <= 0) throw UserError("weights: N must be positive");
  if (W.row_stride < W.cols || W.batch_stride < W.rows * W.row_stride)
    throw UserError(fmt::format("weights: strides ({}, {}, 1) overlap for shape [{}, {}, {}]",
                                W.batch_stride, W.row_stride, groups, W.rows, W.cols));
  if (const std::string why = grouped_shape_problem(gated, output, n, k, gemm.a_dtype); !why.empty())
    throw UserError(why);
  if (!args.offsets()) throw UserError("offsets (the groups' int32 end offsets) were not given");
  if (args.offsets_count() != groups)
    throw UserError(fmt::format("offsets has {} entries but the weights have {} groups: give one end "
                                "offset per group",
                                args.offsets_count(), groups));
  require_aligned("x", X.data, X.row_stride, X.dtype);
  require_aligned("weights", W.data, W.row_stride, W.dtype);
  if ((W.batch_stride * dtype_bytes(W.dtype)) % 16 != 0)
    throw UserError("weights: the stride between groups must be a multiple of 16 bytes");
  if (total_m > 0) device_ptrs.emplace_back(X.data, "x");
  device_ptrs.emplace_back(W.data, "weights");
  device_ptrs.emplace_back(args.offsets(), "offsets");

  // --- fp8 block scales --------------------------------------------------------------------
  const int64_t kb = fp8_scale_blocks(k), nb = fp8_scale_blocks(n);
  const std::optional<TensorRef>& scale_a = args.scale_a();
  const std::optional<BatchedTensorRef>& scale_b = args.scale_b();
  if (!gemm.fp8_blockwise) {
    refuse_unexpected_block_scales(scale_a.has_value(), scale_b.has_value(), "grouped kernel");
  } else {
    if (!scale_a)
      throw UserError(fmt::format("scale_a was not given: a block-scaled grouped kernel needs x's f32 scales, a "
                                  "total_m × ceil(K/128) = {}×{} matrix",
                                  total_m, kb));
    if (!scale_b)
      throw UserError(fmt::format("scale_b was not given: a block-scaled grouped kernel needs the weights' f32 "
                                  "scales, G × ceil(N/128) × ceil(K/128) = {}×{}×{}",
                                  groups, nb, kb));
    require_f32_block_scales("scale_a", scale_a->dtype);
    require_f32_block_scales("scale_b", scale_b->dtype);
    if (scale_a->rows != total_m || scale_a->cols != kb)
      throw UserError(fmt::format("scale_a: shape {}×{} given, expected total_m × ceil(K/128) = {}×{} (one scale "
                                  "per row of x and 128 of K)",
                                  scale_a->rows, scale_a->cols, total_m, kb));
    if (scale_b->batches != groups || scale_b->rows != nb || scale_b->cols != kb)
      throw UserError(fmt::format("scale_b: shape {}×{}×{} given, expected G × ceil(N/128) × ceil(K/128) = "
                                  "{}×{}×{} (one scale per 128×128 block of each group's N×K weights)",
                                  scale_b->batches, scale_b->rows, scale_b->cols, groups, nb, kb));
    if (scale_a->row_stride < 0 || scale_a->col_stride < 0 || scale_b->batch_stride < 0 || scale_b->row_stride < 0 ||
        scale_b->col_stride < 0)
      throw UserError("scale_a, scale_b: strides must not be negative");
    if (total_m > 0) device_ptrs.emplace_back(scale_a->data, "scale_a");
    device_ptrs.emplace_back(scale_b->data, "scale_b");
  }

  // --- the output ------------------------------------------------------------------------
  const std::string& out_name = output;
  const int64_t out_cols = gated ? n / 2 : n;
  const char* out_shape = gated ? "[m,n/2], sum of M_g × N/2" : "[m,n], sum of M_g × N";
  auto out = args.tensors().find(out_name);
  if (out == args.tensors().end())
    throw UserError(fmt::format("output '{}' ({}{}) was not given", out_name, dtype_name(output_dtype),
                                out_shape));
  const TensorRef& Y = out->second;
  if (Y.dtype != output_dtype)
    throw UserError(fmt::format("output '{}' is {} but the epilogue writes {}", out_name,
                                dtype_name(Y.dtype), dtype_name(output_dtype)));
  if (Y.rows != total_m || Y.cols != out_cols || Y.col_stride != 1 || Y.row_stride < out_cols)
    throw UserError(fmt::format("output '{}' must be a row-major {}×{} matrix (x's rows × {}); got {}×{} "
                                "with strides ({}, {})",
                                out_name, total_m, out_cols, gated ? "N/2" : "N", Y.rows, Y.cols,
                                Y.row_stride, Y.col_stride));
  if (gated) {
    // Written element by element from registers (no TMA): only the element's alignment.
    if (reinterpret_cast<uintptr_t>(Y.data) % uintptr_t(dtype_bytes(Y.dtype)) != 0)
      throw UserError(fmt::format("output '{}': its data must be aligned to its {}-byte elements", out_name,
                                  dtype_bytes(Y.dtype)));
  } else {
    require_aligned(fmt::format("output '{}'", out_name), Y.data, Y.row_stride, Y.dtype);
  }
  if (total_m > 0) device_ptrs.emplace_back(Y.data, fmt::format("output '{}'", out_name));

  // --- epilogue operands -----------------------------------------------------------------
  std::vector<void*> ptrs;
  std::vector<int64_t> group_strides;
  for (const OperandSlot& s : sig.pointers) {
    if (s.is_output) {  // the gated output Y (its half store also reads a.y's per-group table)
      ptrs.push_back(Y.data);
      group_strides.push_back(0);
      continue;
    }
    auto it = args.tensors().find(s.name);
    const bool row = s.kind == NodeKind::row_vec;
    const std::string want =
        row ? fmt::format("a {}×{} matrix (one row per group) or a vector of {}", groups, n, n)
            : fmt::format("{} values (one per group) or one", groups);
    if (it == args.tensors().end())
      throw UserError(fmt::format("operand '{}' ({}{}) was not given: expected {}", s.name,
                                  dtype_name(s.dtype), shape_name(s.shape), want));
    const TensorRef& t = it->second;
    if (t.dtype != s.dtype)
      throw UserError(fmt::format("operand '{}' is {} but the epilogue reads {}", s.name,
                                  dtype_name(t.dtype), dtype_name(s.dtype)));
    int64_t stride = 0;
    if (row) {
      if (t.cols != n || t.col_stride != 1 || !(t.rows == 1 || t.rows == groups))
        throw UserError(fmt::format("operand '{}' is {}×{} with strides ({}, {}): expected {}", s.name,
                                    t.rows, t.cols, t.row_stride, t.col_stride, want));
      stride = t.rows == 1 ? 0 : t.row_stride;
      if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0 || (stride * dtype_bytes(t.dtype)) % 16 != 0)
        throw UserError(fmt::format("operand '{}': each group's row must start 16-byte aligned", s.name));
    } else {  // a scalar by pointer
      const int64_t count = t.rows * t.cols;
      if (!(count == 1 || count == groups) || (count > 1 && t.rows != 1 && t.cols != 1))
        throw UserError(fmt::format("operand '{}' has {}×{} values: expected {}", s.name, t.rows, t.cols, want));
      stride = count == 1 ? 0 : (t.rows == 1 ? t.col_stride : t.row_stride);
    }
    device_ptrs.emplace_back(t.data, fmt::format("operand '{}'", s.name));
    ptrs.push_back(t.data);
    group_strides.push_back(stride);
  }
  std::vector<double> scalars;
  for (const OperandSlot& s : sig.scalars) {
    auto it = args.scalars().find(s.name);
    if (it == args.scalars().end()) throw UserError(fmt::format("scalar parameter '{}' was not given", s.name));
    scalars.push_back(it->second);
  }
  for (const auto& [name, t] : args.tensors()) {
    bool known = name == out_name;
    for (const auto& s : sig.pointers) known |= s.name == name;
    if (!known) throw UserError(fmt::format("'{}' is not an operand or output of this epilogue", name));
  }


  GroupedCall call;
  call.x = X;
  call.w = W;
  call.offsets = args.offsets();
  call.groups = groups;
  call.total_m = total_m;
  call.n = n;
  call.k = k;
  call.k_major = k_major;
  call.scale_a = scale_a;
  call.scale_b = scale_b;
  call.k_blocks = kb;
  call.n_blocks = nb;
  call.y = Y;
  call.out_cols = out_cols;
  call.ptrs = std::move(ptrs);
  call.group_strides = std::move(group_strides);
  call.scalars = std::move(scalars);
  call.device_ptrs = std::move(device_ptrs);
  return call;
}

evtc_grouped_args GroupedCall::abi() const {
  evtc_grouped_args a{};
  a.groups = groups;
  a.total_m = total_m;
  a.n = n;
  a.k = k;
  a.x = x.data;
  a.w = w.data;
  a.offsets = offsets;
  a.y = y.data;
  a.ldx = x.row_stride;
  a.ldw = w.row_stride;
  a.w_group_stride = w.batch_stride;
  a.ldy = y.row_stride;
  a.ptrs = ptrs.data();
  a.scalars = scalars.data();
  a.group_strides = group_strides.data();
  if (scale_a && scale_b) {
    a.scale_a = static_cast<const float*>(scale_a->data);
    a.scale_a_strides[0] = scale_a->row_stride;
    a.scale_a_strides[1] = scale_a->col_stride;
    a.scale_b = static_cast<const float*>(scale_b->data);
    a.scale_b_strides[0] = scale_b->batch_stride;
    a.scale_b_strides[1] = scale_b->row_stride;
    a.scale_b_strides[2] = scale_b->col_stride;
  }
  return a;
}

}  // namespace evtc::runtime
