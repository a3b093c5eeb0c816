// The operand signature of a kernel: what it reads and writes, derived from its graph, in the
// order the generated library's C tables use (evtc/kernel.hpp).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "evtc/ir_text.hpp"
#include "evtc/kernel_config.hpp"

namespace evtc {

namespace {
OperandSlot slot_of(const Node& n) {
  OperandSlot s;
  s.name = n.name;
  s.kind = n.kind;
  s.dtype = n.dtype;
  s.shape = n.shape;
  s.layout = n.layout;
  return s;
}
}  // namespace

KernelSignature make_signature(const Graph& g) {
  KernelSignature sig;
  const auto order = canonical_order(g);
  // The main output.
  for (NodeId id : order) {
    const Node& n = g.node(id);
    if (n.kind == NodeKind::store && n.shape == Shape::full && n.name == "D") sig.d_name = n.name;
  }
  if (sig.d_name.empty())
    for (NodeId id : order) {
      const Node& n = g.node(id);
      if (n.kind == NodeKind::store && n.shape == Shape::full) {
        sig.d_name = n.name;
        break;
      }
    }
  for (NodeId id : order) {
    const Node& n = g.node(id);
    OperandSlot s = slot_of(n);
    switch (n.kind) {
      case NodeKind::source:
        sig.reads_c = true;
        sig.c_dtype = n.dtype;
        break;
      case NodeKind::scalar:
        if (n.scalar_kind == ScalarKind::constant) break;
        s.scalar_kind = n.scalar_kind;
        (n.scalar_kind == ScalarKind::value ? sig.scalars : sig.pointers).push_back(s);
        break;
      case NodeKind::row_vec:
      case NodeKind::col_vec:
      case NodeKind::aux: sig.pointers.push_back(s); break;
      case NodeKind::index:
        (n.index_axis == IndexAxis::m ? sig.reads_row_index : sig.reads_col_index) = true;
        break;
      default: break;
    }
  }
  for (NodeId id : order) {
    const Node& n = g.node(id);
    if (n.kind != NodeKind::store) continue;
    if (n.name == sig.d_name) {
      sig.d_dtype = n.dtype;
      continue;
    }
    OperandSlot s = slot_of(n);
    s.is_output = true;
    const Node& in = g.node(n.inputs[0]);
    if (in.kind == NodeKind::reduce) {
      s.is_reduction = true;
      s.reduce_op = in.reduce_op;
    }
    sig.pointers.push_back(s);
  }
  return sig;
}

std::string KernelSignature::to_json() const {
  using nlohmann::json;
  auto slot_json = [](const OperandSlot& s) {
    json j{{"name", s.name},
           {"kind", node_kind_name(s.kind)},
           {"dtype", dtype_name(s.dtype)},
           {"shape", s.shape == Shape::scalar ? "scalar" : std::string(shape_name(s.shape))},
           {"output", s.is_output}};
    if (s.is_reduction) j["reduce"] = reduce_op_name(s.reduce_op);
    if (s.kind == NodeKind::scalar) j["by_pointer"] = s.scalar_kind == ScalarKind::pointer;
    return j;
  };
  json j;
  j["pointers"] = json::array();
  for (const auto& s : pointers) j["pointers"].push_back(slot_json(s));
  j["scalars"] = json::array();
  for (const auto& s : scalars) j["scalars"].push_back(slot_json(s));
  j["reads_c"] = reads_c;
  if (reads_c) j["c_dtype"] = dtype_name(c_dtype);
  j["d"] = d_name;
  if (!d_name.empty()) j["d_dtype"] = dtype_name(d_dtype);
  // Only where an index is read, so that other kernels' signatures stay as they were.
  if (reads_row_index || reads_col_index) {
    j["index"] = json::array();
    if (reads_row_index) j["index"].push_back("m");
    if (reads_col_index) j["index"].push_back("n");
  }
  return j.dump();
}

std::string KernelSignature::c_export() const {
  std::string escaped;
  for (char c : to_json()) {
    if (c == '"' || c == '\\') escaped += '\\';
    escaped += c;
  }
  return fmt::format("const char* evtc_kernel_signature(void) {{ return \"{}\"; }}\n", escaped);
}

}  // namespace evtc
