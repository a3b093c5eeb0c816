#include "passes/classify_loads.hpp"

#include <fmt/format.h>

#include <optional>
#include <vector>

#include "passes/graph_rewriter.hpp"

namespace evtc {

std::string_view load_class_name(LoadClass c) {
  switch (c) {
    case LoadClass::scalar: return "scalar";
    case LoadClass::row_vec: return "row_vec";
    case LoadClass::col_vec: return "col_vec";
    case LoadClass::aux_row_major: return "aux_row_major";
    case LoadClass::aux_col_major: return "aux_col_major";
    case LoadClass::not_fusable: return "not_fusable";
  }
  return "?";
}

LoadClass classify_view(const OperandView& v, int64_t m, int64_t n, std::string* why) {
  auto refuse = [&](std::string reason) {
    if (why) *why = std::move(reason);
    return LoadClass::not_fusable;
  };
  const std::string shape = fmt::format("{}x{} view with strides ({}, {})", v.rows, v.cols,
                                        v.row_stride, v.col_stride);
  if (v.rows <= 0 || v.cols <= 0) return refuse(fmt::format("the {} has no elements", shape));
  if (m == 0) m = v.rows;
  if (n == 0) n = v.cols;
  if ((v.rows != 1 && v.rows != m) || (v.cols != 1 && v.cols != n))
    return refuse(fmt::format("the {} does not broadcast to the {}x{} output", shape, m, n));
  // A dimension of size 1 is read at index 0 only: it is broadcast whatever its stride.
  const int64_t rs = v.rows == 1 ? 0 : v.row_stride;
  const int64_t cs = v.cols == 1 ? 0 : v.col_stride;
  if (rs == 0 && cs == 0) return LoadClass::scalar;
  if (rs == 0 && cs == 1) return LoadClass::row_vec;
  if (rs == 1 && cs == 0) return LoadClass::col_vec;
  if (rs == n && cs == 1) return LoadClass::aux_row_major;
  if (rs == 1 && cs == m) return LoadClass::aux_col_major;
  if (rs == 0)
    return refuse(fmt::format("the {} is a row vector whose elements are {} apart; a fused "
                              "row vector must be contiguous",
                              shape, cs));
  if (cs == 0)
    return refuse(fmt::format("the {} is a column vector whose elements are {} apart; a "
                              "fused column vector must be contiguous",
                              shape, rs));
  return refuse(fmt::format("the {} is neither a contiguous row-major ({}, 1) nor a "
                            "contiguous column-major (1, {}) {}x{} matrix",
                            shape, n, m, m, n));
}

std::optional<Layout> matrix_layout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  if (col_stride == 1 && (rows <= 1 || row_stride >= cols)) return Layout::row_major;
  if (row_stride == 1 && (cols <= 1 || col_stride >= rows)) return Layout::col_major;
  return std::nullopt;
}

namespace {

std::string dims_text(std::span<const int64_t> v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", v[i]);
  return out + "]";
}

// The stride that steps through the (non-broadcast) dimensions `sizes` as one flattened
// dimension, or nullopt when their strides are not nested (a copy is needed to flatten them).
std::optional<int64_t> flat_stride(std::span<const int64_t> sizes, std::span<const int64_t> strides) {
  std::optional<int64_t> inner;  // stride of the innermost dimension of size > 1 so far
  int64_t span = 1;              // elements the inner dimensions cover
  for (size_t i = sizes.size(); i-- > 0;) {
    if (sizes[i] == 1) continue;
    if (!inner) inner = strides[i];
    else if (strides[i] != *inner * span) return std::nullopt;
    span *= sizes[i];
  }
  return inner.value_or(1);
}

}  // namespace

OperandPlacement place_operand(std::span<const int64_t> sizes, std::span<const int64_t> strides,
                               std::span<const int64_t> full) {
  OperandPlacement p;
  auto refuse = [&](std::string why) {
    p.load = LoadClass::not_fusable;
    p.why = std::move(why);
    return p;
  };
  const std::string what = fmt::format("an operand of shape {}", dims_text(sizes));
  if (sizes.size() != strides.size()) return refuse(fmt::format("{} has {} strides", what, strides.size()));
  if (full.empty()) return refuse("the epilogue's shape has no dimensions");
  if (sizes.size() > full.size()) {
    // The same M×N values with M split differently (a [4, 1024, N] activation saved by a
    // training graph's forward, read beside the backward's [4096, N] GEMM result): the leading
    // dimensions flatten into the rows, as the op library's reshape does at run time (a view
    // where their strides nest, else a copy).
    const size_t lead = sizes.size() - 1;
    int64_t rows = 1, full_rows = 1;
    for (size_t i = 0; i < lead; ++i) rows *= sizes[i];
    for (size_t i = 0; i + 1 < full.size(); ++i) full_rows *= full[i];
    if (rows != full_rows || (sizes.back() != full.back() && sizes.back() != 1))
      return refuse(fmt::format("{} has more dimensions than the result {}", what, dims_text(full)));
    const std::optional<int64_t> nested = flat_stride(sizes.first(lead), strides.first(lead));
    const int64_t flat_sizes[2] = {rows, sizes.back()};
    const int64_t flat_strides[2] = {nested.value_or(sizes.back()), nested ? strides.back() : 1};
    const int64_t flat_full[2] = {full_rows, full.back()};
    OperandPlacement flat = place_operand(flat_sizes, flat_strides, flat_full);
    flat.needs_copy |= !nested && flat.load != LoadClass::not_fusable;
    return flat;
  }
  // Broadcast to `full`: missing leading dimensions and dimensions of size 1 get stride 0.
  const size_t pad = full.size() - sizes.size();
  std::vector<int64_t> st(full.size(), 0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t f = full[pad + i];
    if (sizes[i] != f && sizes[i] != 1)
      return refuse(fmt::format("{} does not broadcast to {}", what, dims_text(full)));
    st[pad + i] = sizes[i] == 1 ? 0 : strides[i];
  }
  const size_t last = full.size() - 1;
  const int64_t n = full[last];
  const bool constant_over_n = n == 1 || st[last] == 0;
  // The leading dimensions (of size > 1): all broadcast, all varying, or a mix.
  int64_t m = 1;
  bool broadcast = false, varying = false;
  for (size_t i = 0; i < last; ++i) {
    m *= full[i];
    if (full[i] == 1) continue;
    (st[i] == 0 ? broadcast : varying) = true;
  }
  if (broadcast && varying)
    return refuse(fmt::format("{} broadcasts over part of the rows of the result {}", what, dims_text(full)));
  const std::optional<int64_t> ms =
      flat_stride(std::span<const int64_t>(full).first(last), std::span<const int64_t>(st).first(last));
  if (!varying && constant_over_n) {
    p.load = LoadClass::scalar;
  } else if (!varying) {
    p.load = LoadClass::row_vec;
    p.needs_copy = st[last] != 1;
  } else if (constant_over_n) {
    p.load = LoadClass::col_vec;
    p.needs_copy = !ms || *ms != 1;
  } else if (ms && *ms == n && st[last] == 1) {
    p.load = LoadClass::aux_row_major;
  } else if (ms && *ms == 1 && st[last] == m) {
    p.load = LoadClass::aux_col_major;
  } else {
    p.load = LoadClass::aux_row_major;
    p.needs_copy = true;
  }
  return p;
}

namespace passes {

Graph classify_loads(const Graph& g, const PipelineOptions& options) {
  return rewrite_graph(g, [&](GraphRewriter& rw, NodeId, Node n) {
    if (n.kind != NodeKind::aux) return rw.add(std::move(n));
    auto view = options.views.find(n.name);
    if (view == options.views.end()) return rw.add(std::move(n));
    switch (classify_view(view->second, options.gemm.m, options.gemm.n, nullptr)) {
      case LoadClass::scalar:
        n.kind = NodeKind::scalar;
        n.scalar_kind = ScalarKind::pointer;
        break;
      case LoadClass::row_vec: n.kind = NodeKind::row_vec; break;
      case LoadClass::col_vec: n.kind = NodeKind::col_vec; break;
      case LoadClass::aux_row_major: n.layout = Layout::row_major; break;
      case LoadClass::aux_col_major: n.layout = Layout::col_major; break;
      case LoadClass::not_fusable: break;
    }
    if (n.kind != NodeKind::aux) n.layout = Layout::row_major;
    return rw.add(std::move(n));
  });
}

}  // namespace passes
}  // namespace evtc
