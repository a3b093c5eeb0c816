#include "passes/classify_loads.h"

#include <fmt/format.h>

#include "passes/graph_rewriter.h"

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
