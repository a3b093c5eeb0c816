#include "backends/visitor_lowering.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "evtc/error.hpp"
#include "evtc/passes.hpp"

namespace evtc::backend {

std::string cutlass_type(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::f16: return "cutlass::half_t";
    case DType::bf16: return "cutlass::bfloat16_t";
    case DType::f8e4m3: return "cutlass::float_e4m3_t";
    case DType::f8e5m2: return "cutlass::float_e5m2_t";
    case DType::i32: return "int32_t";
    case DType::i64: return "int64_t";
  }
  return "?";
}

std::string float_literal(double v) {
  if (std::isnan(v)) return "cutlass::platform::numeric_limits<float>::quiet_NaN()";
  if (std::isinf(v))
    return v > 0 ? "cutlass::platform::numeric_limits<float>::infinity()"
                 : "(-cutlass::platform::numeric_limits<float>::infinity())";
  return fmt::format("float({})", v);
}

std::string reduction_identity(ReduceOp op) {
  const double identity = reduce_op_info(op).identity;
  return identity == 0.0 ? "0.0f" : float_literal(identity);
}

std::string device_reduce_op(ReduceOp op) {
  return "evtc::device::" + std::string(reduce_op_info(op).device_fold);
}

std::string reduction_scratch_code(const std::vector<ReductionSlot>& reductions) {
  std::string axes;
  for (const ReductionSlot& r : reductions)
    axes += r.axis == ReduceAxis::all ? 'a' : r.axis == ReduceAxis::col ? 'c' : r.pair_partials ? 'R' : 'r';
  return fmt::format(R"(// The reductions' axes in slot order: a(ll), r(ow, over N), c(olumn, over M); R: a row
// reduction with two floats per partial.
constexpr char kReductionAxes[] = "{}";
constexpr int kReductions = sizeof(kReductionAxes) - 1;
constexpr evtc::device::ReductionScratch<kTileM, kTileN, kEpilogueWarps> kScratch{{kReductionAxes, kReductions}};

size_t scratch_bytes(const evtc_gemm_args& a) {{ return kScratch.total_bytes(a); }}
float* scratch_partials(const evtc_gemm_args& a, char* scratch, int index) {{
  return kScratch.partials(a, scratch, index);
}}
)",
                     axes);
}

std::string reduction_finish_code(const std::vector<ReductionSlot>& reductions) {
  std::string s = R"(
// The fixed-order final stage of every reduction (evtc/device/reduce.cuh).
void finish_reductions(const evtc_gemm_args& a, char* scratch, cudaStream_t s) {
  (void)a; (void)scratch; (void)s;
)";
  for (size_t i = 0; i < reductions.size(); ++i) {
    const ReductionSlot& r = reductions[i];
    const std::string identity = reduction_identity(r.op);
    const std::string out = fmt::format("static_cast<{}*>(a.ptrs[{}])", cutlass_type(r.dtype), r.slot);
    const std::string partials = fmt::format("scratch_partials(a, scratch, {})", i);
    const std::string kernel = fmt::format("evtc::device::{}<{}, {}>",
                                           r.axis == ReduceAxis::all ? "reduce_partials" : "reduce_partial_rows",
                                           device_reduce_op(r.op), cutlass_type(r.dtype));
    if (r.pair_partials)  // rows of the padded M, one per tile column: (m, s) pairs
      s += fmt::format("  evtc::device::reduce_lse_pair_rows<{}><<<int((a.m + 255) / 256), 256, 0, s>>>({}, a.m, "
                       "kScratch.tiles_m(a) * kTileM, kScratch.tiles_n(a), {});\n",
                       cutlass_type(r.dtype), partials, out);
    else if (r.axis == ReduceAxis::all)
      s += fmt::format("  {}<<<1, 1024, 0, s>>>({}, int64_t(kScratch.floats(a, 'a')), {}, {});\n", kernel, partials,
                       out, identity);
    else if (r.axis == ReduceAxis::row)  // rows of the padded M, one per tile column
      s += fmt::format("  {}<<<int((a.m + 255) / 256), 256, 0, s>>>({}, a.m, kScratch.tiles_m(a) * kTileM, "
                       "kScratch.tiles_n(a), {}, {});\n",
                       kernel, partials, out, identity);
    else  // rows of the padded N, one per tile row
      s += fmt::format("  {}<<<int((a.n + 255) / 256), 256, 0, s>>>({}, a.n, kScratch.tiles_n(a) * kTileN, "
                       "kScratch.tiles_m(a), {}, {});\n",
                       kernel, partials, out, identity);
  }
  return s + "}\n";
}

std::string layout_tag(Layout l) {
  return l == Layout::row_major ? "cutlass::layout::RowMajor" : "cutlass::layout::ColumnMajor";
}

std::string op_arguments(const Node& n) {
  const OpInfo& info = op_info(n.op);
  if (info.num_attrs == 0) return "{}";
  std::string args = "{";
  for (int i = 0; i < info.num_attrs; ++i) args += (i ? ", " : "") + float_literal(n.attrs[i]);
  return args + "}";
}

VisitorLowering::VisitorLowering(const Graph& g, bool collective_stores_d)
    : g_(g), sig_(make_signature(g)), main_output_(collective_stores_d ? sig_.d_name : "") {
  for (size_t i = 0; i < sig_.pointers.size(); ++i) ptr_slot_[sig_.pointers[i].name] = i;
  for (size_t i = 0; i < sig_.scalars.size(); ++i) scalar_slot_[sig_.scalars[i].name] = i;
  for (NodeId id : g_.outputs()) {
    const Node& s = g_.node(id);
    if (!main_output_.empty() && s.name == main_output_) d_value_ = s.inputs[0];
    else terminals_.push_back(id);
  }
  std::sort(terminals_.begin(), terminals_.end(),
            [&](NodeId a, NodeId b) { return g_.node(a).name < g_.node(b).name; });
}

std::string VisitorLowering::alias(const std::string& definition, const std::string& comment) {
  std::string name = fmt::format("V{}", next_alias_++);
  decls_ += fmt::format("// {}\nusing {} = {};\n", comment, name, definition);
  return name;
}

std::string VisitorLowering::ptr(const std::string& name, const std::string& ctype, bool is_const) const {
  auto it = ptr_slot_.find(name);
  EVTC_INTERNAL_ASSERT(it != ptr_slot_.end(), "no pointer slot for " + name);
  return fmt::format("static_cast<{}{}*>(a.ptrs[{}])", is_const ? "const " : "", ctype, it->second);
}

// Nested tree for value v where nothing below v is materialised.
Visitor VisitorLowering::tree(NodeId v) {
  if (g_.node(v).inputs.empty()) return emit_node(v);
  std::vector<Visitor> kids;
  for (NodeId in : g_.node(v).inputs) kids.push_back(tree(in));
  return evt(emit_node(v), kids);
}

Visitor VisitorLowering::evt(const Visitor& op, const std::vector<Visitor>& kids) {
  std::string type = tree_template() + "<" + op.type;
  std::string args = "{";
  for (const Visitor& k : kids) {
    type += ", " + k.type;
    args += k.args + ", ";
  }
  type += ">";
  args += op.args + "}";
  const std::string name = alias(type, "tree");
  return {name, fmt::format("typename {}::Arguments{}", name, args)};
}

// amax(x) reduces |x|: an abs node in front of a max reduction.
bool VisitorLowering::terminal_needs_abs(NodeId store) const {
  const Node& in = g_.node(g_.node(store).inputs[0]);
  return in.kind == NodeKind::reduce && reduce_op_info(in.reduce_op).of_abs;
}

Visitor VisitorLowering::emit_terminal_node(NodeId store) {
  const Node& s = g_.node(store);
  const Node& in = g_.node(s.inputs[0]);
  return in.kind == NodeKind::reduce ? emit_reduce(in, s) : emit_store(s);
}

// A terminal as a tree over its input value tree.
Visitor VisitorLowering::terminal_tree(NodeId store, const Visitor& input) {
  Visitor in = input;
  if (terminal_needs_abs(store)) in = evt(abs_op(), {in});
  return evt(emit_terminal_node(store), {in});
}

Visitor VisitorLowering::lower() {
  // Values used more than once are computed once and shared; what becomes a topological
  // visitor's entry is decided by plan_dag, which the shared-memory model reads too.
  const DagPlan plan = plan_dag(g_, main_output_);
  EVTC_INTERNAL_ASSERT(plan.terminals == terminals_ && plan.d_value == d_value_, "visitor plan outputs");
  EVTC_INTERNAL_ASSERT(!terminals_.empty() || d_value_, "graph without outputs");
  if (plan.tree) {
    if (d_value_)
      return yields_f32(*d_value_) ? tree(*d_value_) : evt(identity_f32("main output (as f32)"), {tree(*d_value_)});
    const NodeId t = terminals_.front();
    return terminal_tree(t, tree(store_operands(g_, t)[0]));
  }
  return topological(plan.materialised);
}

Visitor VisitorLowering::topological(const std::vector<bool>& mat) {
  // Order: operands first (post-order from the terminals, then the main output last).
  std::map<NodeId, int> index;
  std::vector<std::string> entries, edges, args;
  auto add_entry = [&](const Visitor& v, const std::vector<int>& in_idx) {
    entries.push_back(v.type);
    args.push_back(v.args);
    std::string e = "cute::seq<";
    for (size_t i = 0; i < in_idx.size(); ++i) e += (i ? ", " : "") + std::to_string(in_idx[i]);
    edges.push_back(e + ">");
    return static_cast<int>(entries.size() - 1);
  };
  auto visit = [&](auto&& self, NodeId v) -> void {
    if (index.count(v)) return;
    const auto& ins = g_.node(v).inputs;
    if (!ins.empty() && reaches_materialised(g_, mat, ins)) {
      std::vector<int> idx;
      for (NodeId in : ins) {
        self(self, in);
        idx.push_back(index.at(in));
      }
      index[v] = add_entry(emit_node(v), idx);
    } else {
      index[v] = add_entry(tree(v), {});
    }
  };
  for (NodeId t : terminals_) {
    const NodeId in = store_operands(g_, t)[0];
    if (mat[in]) {
      visit(visit, in);
      int src = index.at(in);
      if (terminal_needs_abs(t)) src = add_entry(abs_op(), {src});
      add_entry(emit_terminal_node(t), {src});
    } else {
      add_entry(terminal_tree(t, tree(in)), {});
    }
  }
  if (d_value_) {
    if (index.count(*d_value_) || !yields_f32(*d_value_)) {
      // Already an operand of another op (the last op must be the main output), or not
      // f32: an identity op as the last, giving the value as f32.
      visit(visit, *d_value_);
      add_entry(identity_f32("main output (as f32)"), {index.at(*d_value_)});
    } else {
      visit(visit, *d_value_);
    }
  }
  if (entries.size() == 1) return {entries[0], args[0]};
  if (entries.size() == 2) {
    // CUTLASS 4.2's topological visitors do not compile with exactly two ops (they keep the
    // results of all but the last in cute::repeat<1>, which is not a tuple): pass the last
    // op's value through an identity op, which changes nothing it computes.
    add_entry(identity_f32("pass-through (a topological visitor needs three ops)"), {1});
  }
  std::string type = topological_template() + "<float, cute::tuple<";
  for (size_t i = 0; i < edges.size(); ++i) type += (i ? ", " : "") + edges[i];
  type += ">";
  for (const auto& e : entries) type += ", " + e;
  type += ">";
  const std::string name = alias(type, "DAG");
  std::string a = "{";
  for (size_t i = 0; i < args.size(); ++i) a += (i ? ", " : "") + args[i];
  a += "}";
  return {name, fmt::format("typename {}::Arguments{}", name, a)};
}

}  // namespace evtc::backend
