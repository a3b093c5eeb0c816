#include "passes/normalize_casts.hpp"

#include "passes/graph_rewriter.hpp"

namespace evtc::passes {

std::optional<NodeId> value_preserving_cast_operand(const Graph& built, const Node& cast) {
  if (cast.kind != NodeKind::cast) return std::nullopt;
  const NodeId in = cast.inputs[0];
  // widens_losslessly(t, t) holds: a cast to the operand's own dtype is one of these.
  if (widens_losslessly(built.node(in).dtype, cast.dtype)) return in;
  return std::nullopt;
}

Node store_without_same_rounding(const Graph& built, Node store) {
  if (store.kind != NodeKind::store) return store;
  const Node& in = built.node(store.inputs[0]);
  if (in.kind == NodeKind::cast && in.dtype == store.dtype) store.inputs[0] = in.inputs[0];
  return store;
}

bool library_gemm_result(const Graph& g, NodeId id) {
  const Node& n = g.node(id);
  if (n.kind == NodeKind::accum) return true;
  if (n.kind != NodeKind::compute || (n.op != Op::add && n.op != Op::mul)) return false;
  int on_path = 0;
  for (NodeId in : n.inputs) {
    const Shape shape = g.node(in).shape;
    if (shape == Shape::row || shape == Shape::col || shape == Shape::scalar) continue;  // broadcast
    if (!library_gemm_result(g, in)) return false;
    ++on_path;
  }
  return on_path == 1;
}

namespace {

bool sixteen_bit_float(DType t) { return t == DType::bf16 || t == DType::f16; }

}  // namespace

Graph normalize_casts(const Graph& g, const PipelineOptions& options) {
  const CastMode mode = options.cast_mode;
  return rewrite_graph(g, [mode](GraphRewriter& rw, NodeId, Node n) {
    switch (n.kind) {
      case NodeKind::cast:
        if (mode == CastMode::fast) return n.inputs[0];
        // A compiler fusing the ops computes them in f32 and rounds only what it writes; the
        // GEMM's own result (with addmm's bias or _scaled_mm's scales) is written by the
        // library GEMM, rounded.
        if (mode == CastMode::compile && sixteen_bit_float(n.dtype) &&
            !library_gemm_result(rw.built(), n.inputs[0]))
          return n.inputs[0];
        if (auto in = value_preserving_cast_operand(rw.built(), n)) return *in;
        break;
      case NodeKind::compute:
        if (mode == CastMode::fast || (mode == CastMode::compile && sixteen_bit_float(n.dtype))) n.dtype = DType::f32;
        break;
      case NodeKind::store: n = store_without_same_rounding(rw.built(), std::move(n)); break;
      default: break;
    }
    return rw.add(std::move(n));
  });
}

}  // namespace evtc::passes

namespace evtc {

namespace {

constexpr std::pair<CastMode, std::string_view> kCastModes[] = {
    {CastMode::eager, "eager"}, {CastMode::fast, "fast"}, {CastMode::compile, "compile"}};

}  // namespace

std::string_view cast_mode_name(CastMode mode) {
  for (const auto& [m, name] : kCastModes)
    if (m == mode) return name;
  return "eager";
}

std::optional<CastMode> cast_mode_named(std::string_view name) {
  for (const auto& [m, spelled] : kCastModes)
    if (spelled == name) return m;
  return std::nullopt;
}

const std::vector<std::string>& cast_mode_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& [m, name] : kCastModes) out.emplace_back(name);
    return out;
  }();
  return names;
}

}  // namespace evtc
