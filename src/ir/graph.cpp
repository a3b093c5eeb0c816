#include "evtc/graph.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <limits>

#include "evtc/error.hpp"

namespace evtc {

std::string_view node_kind_name(NodeKind k) {
  switch (k) {
    case NodeKind::accum: return "accum";
    case NodeKind::index: return "index";
    case NodeKind::scalar: return "scalar";
    case NodeKind::row_vec: return "row_vec";
    case NodeKind::col_vec: return "col_vec";
    case NodeKind::aux: return "aux";
    case NodeKind::source: return "source";
    case NodeKind::compute: return "compute";
    case NodeKind::cast: return "cast";
    case NodeKind::pair: return "pair";
    case NodeKind::reduce: return "reduce";
    case NodeKind::store: return "store";
  }
  return "?";
}

std::string_view reduce_axis_name(ReduceAxis a) {
  switch (a) {
    case ReduceAxis::row: return "row";
    case ReduceAxis::col: return "col";
    case ReduceAxis::all: return "all";
  }
  return "?";
}

namespace {
double nan_or(double acc, double x, double v) { return std::isnan(acc) || std::isnan(x) ? NAN : v; }
double sum_step(double acc, double x) { return acc + x; }
double max_step(double acc, double x) { return nan_or(acc, x, std::max(acc, x)); }
double min_step(double acc, double x) { return nan_or(acc, x, std::min(acc, x)); }
double amax_step(double acc, double x) { return nan_or(acc, x, std::max(acc, std::fabs(x))); }
// log(e^acc + e^x) without overflow: the larger plus log1p of the smaller's share. Both
// -inf stay -inf, and a +inf wins (e^inf + anything is inf).
double log_add_exp_step(double acc, double x) {
  if (std::isnan(acc) || std::isnan(x)) return NAN;
  const double hi = std::max(acc, x), lo = std::min(acc, x);
  if (std::isinf(hi)) return hi;
  return hi + std::log1p(std::exp(lo - hi));
}
constexpr double kInf = std::numeric_limits<double>::infinity();

constexpr std::array kReduceOpTable = {
    ReduceOpInfo{ReduceOp::sum, "sum", 0.0, false, sum_step, "SumOp", "cutlass::plus", false},
    ReduceOpInfo{ReduceOp::max, "max", -kInf, false, max_step, "MaxOp", "cutlass::maximum", true},
    ReduceOpInfo{ReduceOp::min, "min", kInf, false, min_step, "MinOp", "cutlass::minimum", true},
    // max(|x|) >= 0: the fold starts at 0.
    ReduceOpInfo{ReduceOp::amax, "amax", 0.0, true, amax_step, "MaxOp", "cutlass::maximum", true},
    // log(sum(exp(x))): the fold of two values is log(e^a + e^b), exact up to rounding and
    // independent of how the values are grouped, so per-tile partials combine like a sum's.
    ReduceOpInfo{ReduceOp::logsumexp, "logsumexp", -kInf, false, log_add_exp_step, "LogAddExpOp",
                 "evtc::device::LogAddExpFn", false},
};
}  // namespace

std::span<const ReduceOpInfo> reduce_op_table() { return kReduceOpTable; }

const ReduceOpInfo& reduce_op_info(ReduceOp op) {
  for (const ReduceOpInfo& r : kReduceOpTable)
    if (r.op == op) return r;
  internal_fail(__FILE__, __LINE__, "reduce_op_info: unknown reduction");
}

std::string_view reduce_op_name(ReduceOp o) { return reduce_op_info(o).name; }

std::string reduction_name(ReduceAxis axis, ReduceOp op) {
  const std::string prefix = axis == ReduceAxis::all ? "" : std::string(reduce_axis_name(axis)) + "_";
  return prefix + std::string(reduce_op_name(op));
}

std::string_view pair_part_name(PairPart p) { return p == PairPart::gate ? "gate" : "up"; }

std::string_view index_axis_name(IndexAxis a) { return a == IndexAxis::m ? "m" : "n"; }

Shape index_shape(IndexAxis a) { return a == IndexAxis::m ? Shape::col : Shape::row; }

std::string_view index_axis_role(IndexAxis a) { return a == IndexAxis::m ? "row" : "column"; }

std::optional<IndexAxis> index_axis_named(std::string_view name) {
  if (name == "m") return IndexAxis::m;
  if (name == "n") return IndexAxis::n;
  return std::nullopt;
}

bool Node::is_load() const {
  switch (kind) {
    case NodeKind::scalar:
    case NodeKind::row_vec:
    case NodeKind::col_vec:
    case NodeKind::aux:
    case NodeKind::source: return true;
    default: return false;
  }
}

const Node& Value::node() const { return graph->node(id); }

namespace {

bool is_identifier(std::string_view s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

bool is_named_load(const Node& n) {
  return (n.kind == NodeKind::scalar && n.scalar_kind != ScalarKind::constant) ||
         n.kind == NodeKind::row_vec || n.kind == NodeKind::col_vec || n.kind == NodeKind::aux;
}

std::string load_signature(const Node& n) {
  std::string s = fmt::format("{} {}{}", node_kind_name(n.kind), dtype_name(n.dtype),
                              shape_name(n.shape));
  if (n.kind == NodeKind::scalar && n.scalar_kind == ScalarKind::pointer) s += " (by pointer)";
  if (n.kind == NodeKind::aux && n.layout == Layout::col_major) s += " (column-major)";
  return s;
}

int expected_arity(const Node& n) {
  switch (n.kind) {
    case NodeKind::compute: return op_info(n.op).arity;
    case NodeKind::cast:
    case NodeKind::pair:
    case NodeKind::reduce:
    case NodeKind::store: return 1;
    default: return 0;
  }
}

}  // namespace

std::string Graph::describe(NodeId id) const {
  // A short expression rendering, two levels deep, for error messages.
  auto render = [this](auto&& self, NodeId i, int depth) -> std::string {
    const Node& n = nodes_.at(i);
    switch (n.kind) {
      case NodeKind::accum: return "acc";
      case NodeKind::index: return std::string(index_axis_name(n.index_axis));
      case NodeKind::source: return "C";
      case NodeKind::scalar:
        return n.scalar_kind == ScalarKind::constant ? fmt::format("{}", n.value) : n.name;
      case NodeKind::row_vec: return n.name + "[n]";
      case NodeKind::col_vec: return n.name + "[m]";
      case NodeKind::aux: return n.name + "[m,n]";
      case NodeKind::store: return "out " + n.name;
      default: break;
    }
    std::string head = n.kind == NodeKind::compute ? std::string(op_info(n.op).name)
                       : n.kind == NodeKind::cast  ? std::string(dtype_name(n.dtype))
                       : n.kind == NodeKind::pair  ? std::string(pair_part_name(n.part))
                                                   : fmt::format("{}_{}", reduce_axis_name(n.axis),
                                                                 reduce_op_name(n.reduce_op));
    if (depth == 0) return head + "(...)";
    std::string s = head + "(";
    for (size_t k = 0; k < n.inputs.size(); ++k)
      s += std::string(k ? ", " : "") + self(self, n.inputs[k], depth - 1);
    return s + ")";
  };
  return fmt::format("'{}'", render(render, id, 2));
}

NodeId Graph::push(Node n) {
  nodes_.push_back(std::move(n));
  const auto id = static_cast<NodeId>(nodes_.size() - 1);
  const Node& added = nodes_.back();
  if (added.kind == NodeKind::store) outputs_.push_back(id);
  if (added.kind == NodeKind::accum) accum_ = id;
  if (added.kind == NodeKind::source) source_ = id;
  if (added.kind == NodeKind::index) (added.index_axis == IndexAxis::m ? index_m_ : index_n_) = id;
  if (added.kind == NodeKind::store || is_named_load(added)) named_.emplace(added.name, id);
  return id;
}

namespace {
// i32 and i64 hold indices (class labels, token ids) read by [m] and [n] vector loads; nothing
// else takes them. One rule, checked for every node the graph is given.
void check_integer_dtype(const Node& n, const Graph& g) {
  if (!is_integer(n.dtype) || n.kind == NodeKind::row_vec || n.kind == NodeKind::col_vec) return;
  const std::string what =
      n.kind == NodeKind::scalar && n.scalar_kind != ScalarKind::constant ? fmt::format("scalar '{}'", n.name)
      : n.kind == NodeKind::scalar  ? std::string("constant")
      : n.kind == NodeKind::aux     ? fmt::format("operand '{}[m,n]'", n.name)
      : n.kind == NodeKind::source  ? std::string("source matrix C")
      : n.kind == NodeKind::store   ? fmt::format("output '{}'", n.name)
      : n.kind == NodeKind::cast    ? fmt::format("cast of {}", g.describe(n.inputs[0]))
      : n.kind == NodeKind::compute ? fmt::format("computation {}", op_info(n.op).name)
                                    : std::string(node_kind_name(n.kind));
  throw UserError(fmt::format(
      "{} {}: integer dtypes (i32, i64) are allowed only for [m] and [n] input vectors (such as "
      "`input t[m]: i32`), whose values are read as f32 numbers",
      dtype_name(n.dtype), what));
}

// m and n are the index leaves: no output or operand (`what`) may be called so.
void check_not_index_name(const std::string& name, std::string_view what) {
  if (const auto axis = index_axis_named(name))
    throw UserError(fmt::format("{0} '{1}': '{1}' is the {2} index of the output element and cannot name an {0}",
                                what, name, index_axis_role(*axis)));
}
}  // namespace

NodeId Graph::add(Node n) {
  const int arity = expected_arity(n);
  if (static_cast<int>(n.inputs.size()) != arity) {
    std::string what = n.kind == NodeKind::compute ? std::string(op_info(n.op).name)
                                                   : std::string(node_kind_name(n.kind));
    throw UserError(fmt::format("{} takes {} operand{}, got {}", what, arity,
                                arity == 1 ? "" : "s", n.inputs.size()));
  }
  for (NodeId in : n.inputs)
    if (in >= nodes_.size()) throw UserError(fmt::format("operand %{} does not exist", in));

  for (NodeId in : n.inputs) {
    const Node& src = nodes_[in];
    if (src.kind == NodeKind::store)
      throw UserError(fmt::format("{} is an output and cannot be used as an operand", describe(in)));
    if (src.kind == NodeKind::reduce && n.kind != NodeKind::store)
      throw UserError(fmt::format(
          "the reduction {} can only be written to an output: an epilogue cannot use a "
          "reduction's result, which is complete only after the whole kernel has run",
          describe(in)));
  }

  check_integer_dtype(n, *this);

  switch (n.kind) {
    case NodeKind::accum:
      n.dtype = DType::f32;
      n.shape = Shape::full;
      if (accum_) return *accum_;
      break;
    case NodeKind::index: {
      n.dtype = DType::f32;
      n.shape = index_shape(n.index_axis);
      const std::optional<NodeId>& made = n.index_axis == IndexAxis::m ? index_m_ : index_n_;
      if (made) return *made;
      break;
    }
    case NodeKind::source:
      n.shape = Shape::full;
      if (source_) {
        if (nodes_[*source_].dtype != n.dtype)
          throw UserError(fmt::format("the source matrix C is used as {} and as {}",
                                      dtype_name(nodes_[*source_].dtype), dtype_name(n.dtype)));
        return *source_;
      }
      break;
    case NodeKind::scalar:
      n.shape = Shape::scalar;
      if (n.scalar_kind == ScalarKind::constant) {
        n.name.clear();
        n.value = round_to(n.dtype, n.value);
      }
      break;
    case NodeKind::row_vec: n.shape = Shape::row; break;
    case NodeKind::col_vec: n.shape = Shape::col; break;
    case NodeKind::aux: n.shape = Shape::full; break;
    case NodeKind::compute: {
      const OpInfo& info = op_info(n.op);
      Shape s = Shape::scalar;
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        const Node& src = nodes_[n.inputs[k]];
        for (size_t j = 0; j < k; ++j) {
          const Node& other = nodes_[n.inputs[j]];
          if (broadcastable(other.shape, src.shape)) continue;
          const bool k_half = src.shape == Shape::half;
          const NodeId half = k_half ? n.inputs[k] : n.inputs[j];
          const NodeId wide = k_half ? n.inputs[j] : n.inputs[k];
          throw UserError(fmt::format(
              "{}: {} is a gated [m,n/2] value but {} is {}: a gated value only combines with "
              "scalars, [m] vectors and other gated values (apply [n] and [m,n] operands "
              "before gate()/up())",
              info.name, describe(half), describe(wide), shape_name(nodes_[wide].shape)));
        }
        if (!widens_losslessly(src.dtype, n.dtype))
          throw UserError(fmt::format(
              "{}: operand {} ({}) is {} but the op computes in {}; cast it explicitly to "
              "round it",
              info.name, k + 1, describe(n.inputs[k]), dtype_name(src.dtype),
              dtype_name(n.dtype)));
        s = broadcast(s, src.shape);
      }
      n.shape = s;
      for (int k = info.num_attrs; k < kMaxOpAttrs; ++k) n.attrs[k] = 0.0;
      break;
    }
    case NodeKind::cast: n.shape = nodes_[n.inputs[0]].shape; break;
    case NodeKind::pair: {
      const Node& src = nodes_[n.inputs[0]];
      if (src.shape != Shape::full)
        throw UserError(fmt::format(
            "{}({}): gate() and up() take an [m,n] value whose columns are interleaved "
            "(gate, up) pairs, but this one is {}",
            pair_part_name(n.part), describe(n.inputs[0]),
            src.shape == Shape::scalar ? "a scalar" : std::string(shape_name(src.shape))));
      n.dtype = src.dtype;
      n.shape = Shape::half;
      break;
    }
    case NodeKind::reduce: {
      const Node& src = nodes_[n.inputs[0]];
      if (src.shape != Shape::full)
        throw UserError(fmt::format(
            "{}_{} of {}: a reduction takes an [m,n] value, but this one is {}{}",
            reduce_axis_name(n.axis), reduce_op_name(n.reduce_op), describe(n.inputs[0]),
            src.shape == Shape::scalar ? "a scalar" : std::string(shape_name(src.shape)),
            src.shape == Shape::half ? " (reductions of gated values are not supported)" : ""));
      n.dtype = DType::f32;
      n.shape = n.axis == ReduceAxis::row ? Shape::col
                : n.axis == ReduceAxis::col ? Shape::row
                                            : Shape::scalar;
      break;
    }
    case NodeKind::store: {
      const Node& src = nodes_[n.inputs[0]];
      if (!is_identifier(n.name))
        throw UserError(fmt::format("output name '{}' is not an identifier", n.name));
      check_not_index_name(n.name, "output");
      if (src.shape != Shape::full && src.shape != Shape::half && src.kind != NodeKind::reduce)
        throw UserError(fmt::format(
            "output '{}' would be {} ({}): an output must be an [m,n] value, a gated "
            "[m,n/2] value or a reduction",
            n.name, src.shape == Shape::scalar ? "a scalar" : std::string(shape_name(src.shape)),
            describe(n.inputs[0])));
      n.shape = src.shape;
      if (n.shape == Shape::half && n.layout != Layout::row_major)
        throw UserError(fmt::format(
            "output '{}' is a gated [m,n/2] value: it can only be stored row-major", n.name));
      if (const auto it = named_.find(n.name); it != named_.end()) {
        if (nodes_[it->second].kind == NodeKind::store)
          throw UserError(fmt::format("output '{}' is defined twice", n.name));
        throw UserError(fmt::format("output '{}' has the same name as an input operand", n.name));
      }
      break;
    }
  }

  if (is_named_load(n)) {
    if (!is_identifier(n.name))
      throw UserError(fmt::format("operand name '{}' is not an identifier", n.name));
    check_not_index_name(n.name, "operand");
    if (const auto it = named_.find(n.name); it != named_.end()) {
      const Node& other = nodes_[it->second];
      if (other.kind == NodeKind::store)
        throw UserError(fmt::format("operand '{}' has the same name as an output", n.name));
      if (load_signature(other) != load_signature(n))
        throw UserError(fmt::format("operand '{}' is used as {} and as {}", n.name,
                                    load_signature(other), load_signature(n)));
      return it->second;
    }
  }
  return push(std::move(n));
}

// --- typed constructors ---------------------------------------------------------------

Value Graph::accum() {
  Node n;
  n.kind = NodeKind::accum;
  return value(add(std::move(n)));
}

Value Graph::index(IndexAxis axis) {
  Node n;
  n.kind = NodeKind::index;
  n.index_axis = axis;
  return value(add(std::move(n)));
}

Value Graph::constant(double v, DType dtype) {
  Node n;
  n.kind = NodeKind::scalar;
  n.scalar_kind = ScalarKind::constant;
  n.value = v;
  n.dtype = dtype;
  return value(add(std::move(n)));
}

Value Graph::param(std::string_view name, DType dtype, ScalarKind kind) {
  EVTC_INTERNAL_ASSERT(kind != ScalarKind::constant, "use Graph::constant for constants");
  Node n;
  n.kind = NodeKind::scalar;
  n.scalar_kind = kind;
  n.name = name;
  n.dtype = dtype;
  return value(add(std::move(n)));
}

namespace {
Node named_load(NodeKind kind, std::string_view name, DType dtype) {
  Node n;
  n.kind = kind;
  n.name = name;
  n.dtype = dtype;
  return n;
}
}  // namespace

Value Graph::row_vec(std::string_view name, DType dtype) {
  return value(add(named_load(NodeKind::row_vec, name, dtype)));
}

Value Graph::col_vec(std::string_view name, DType dtype) {
  return value(add(named_load(NodeKind::col_vec, name, dtype)));
}

Value Graph::aux(std::string_view name, DType dtype, Layout layout) {
  Node n = named_load(NodeKind::aux, name, dtype);
  n.layout = layout;
  return value(add(std::move(n)));
}

Value Graph::source(DType dtype) {
  Node n;
  n.kind = NodeKind::source;
  n.dtype = dtype;
  return value(add(std::move(n)));
}

Value Graph::compute(Op op, std::span<const Value> inputs, std::span<const double> attrs,
                     DType dtype) {
  const OpInfo& info = op_info(op);
  Node n;
  n.kind = NodeKind::compute;
  n.op = op;
  n.dtype = dtype;
  for (const Value& v : inputs) {
    EVTC_INTERNAL_ASSERT(v.graph == this, "operand from another graph");
    n.inputs.push_back(v.id);
  }
  if (attrs.size() > static_cast<size_t>(info.num_attrs))
    throw UserError(fmt::format("{} takes {} parameter{}, got {}", info.name, info.num_attrs,
                                info.num_attrs == 1 ? "" : "s", attrs.size()));
  for (int k = 0; k < info.num_attrs; ++k)
    n.attrs[k] = k < static_cast<int>(attrs.size()) ? attrs[k] : info.attr_defaults[k];
  return value(add(std::move(n)));
}

Value Graph::compute(Op op, std::initializer_list<Value> inputs,
                     std::initializer_list<double> attrs, DType dtype) {
  return compute(op, std::span<const Value>(inputs.begin(), inputs.size()),
                 std::span<const double>(attrs.begin(), attrs.size()), dtype);
}

Value Graph::cast(Value v, DType dtype) {
  Node n;
  n.kind = NodeKind::cast;
  n.dtype = dtype;
  n.inputs = {v.id};
  return value(add(std::move(n)));
}

Value Graph::reduce(ReduceAxis axis, ReduceOp op, Value v) {
  Node n;
  n.kind = NodeKind::reduce;
  n.axis = axis;
  n.reduce_op = op;
  n.inputs = {v.id};
  return value(add(std::move(n)));
}

Value Graph::pair(PairPart part, Value v) {
  Node n;
  n.kind = NodeKind::pair;
  n.part = part;
  n.inputs = {v.id};
  return value(add(std::move(n)));
}

Value Graph::store(std::string_view name, Value v, DType dtype, Layout layout) {
  Node n;
  n.kind = NodeKind::store;
  n.name = name;
  n.dtype = dtype;
  n.layout = layout;
  n.inputs = {v.id};
  return value(add(std::move(n)));
}

std::vector<std::vector<NodeId>> Graph::users() const {
  std::vector<std::vector<NodeId>> u(nodes_.size());
  for (NodeId i = 0; i < nodes_.size(); ++i)
    for (NodeId in : nodes_[i].inputs) u[in].push_back(i);
  return u;
}

// --- builder operators ----------------------------------------------------------------

namespace {
Value lift(Graph* g, double c) { return g->constant(c); }
}  // namespace

Value apply(Op op, std::initializer_list<Value> args, std::initializer_list<double> attrs) {
  EVTC_INTERNAL_ASSERT(args.size() > 0, "apply needs an operand");
  return args.begin()->graph->compute(op, args, attrs);
}

Value operator+(Value a, Value b) { return apply(Op::add, {a, b}); }
Value operator-(Value a, Value b) { return apply(Op::sub, {a, b}); }
Value operator*(Value a, Value b) { return apply(Op::mul, {a, b}); }
Value operator/(Value a, Value b) { return apply(Op::div, {a, b}); }
Value operator-(Value a) { return apply(Op::neg, {a}); }
Value operator+(Value a, double b) { return a + lift(a.graph, b); }
Value operator-(Value a, double b) { return a - lift(a.graph, b); }
Value operator*(Value a, double b) { return a * lift(a.graph, b); }
Value operator/(Value a, double b) { return a / lift(a.graph, b); }
Value operator+(double a, Value b) { return lift(b.graph, a) + b; }
Value operator-(double a, Value b) { return lift(b.graph, a) - b; }
Value operator*(double a, Value b) { return lift(b.graph, a) * b; }
Value operator/(double a, Value b) { return lift(b.graph, a) / b; }
Value relu(Value x) { return apply(Op::relu, {x}); }
Value sigmoid(Value x) { return apply(Op::sigmoid, {x}); }
Value silu(Value x) { return apply(Op::silu, {x}); }
Value gelu(Value x) { return apply(Op::gelu, {x}); }
Value gelu_tanh(Value x) { return apply(Op::gelu_tanh, {x}); }
Value exp(Value x) { return apply(Op::exp, {x}); }
Value log(Value x) { return apply(Op::log, {x}); }
Value tanh(Value x) { return apply(Op::tanh, {x}); }
Value max(Value a, Value b) { return apply(Op::max, {a, b}); }
Value min(Value a, Value b) { return apply(Op::min, {a, b}); }
Value clamp(Value x, double lo, double hi) {
  return apply(Op::clamp, {x, lift(x.graph, lo), lift(x.graph, hi)});
}
Value cast(Value x, DType dtype) { return x.graph->cast(x, dtype); }
Value gate(Value x) { return x.graph->pair(PairPart::gate, x); }
Value up(Value x) { return x.graph->pair(PairPart::up, x); }

}  // namespace evtc
