#include "frontend/lower_to_graph.hpp"

#include <fmt/format.h>

#include <cctype>

#include <cmath>
#include <limits>
#include <vector>

namespace evtc::frontend {
namespace {

std::string at_text(Loc l) { return fmt::format("{}:{}", l.line, l.column); }

std::string shape_text(Shape s) {
  return s == Shape::scalar ? std::string("a scalar") : std::string(shape_name(s));
}

std::string operand_text(std::string_view name, Shape s) {
  return s == Shape::scalar ? "a scalar" : std::string(name) + std::string(shape_name(s));
}

// "leaky_relu takes 1 argument and an optional parameter (alpha)".
std::string op_takes(const OpInfo& info, bool also_reduction) {
  if (also_reduction)
    return fmt::format("{} takes 1 argument (a reduction over the whole matrix) or 2 (the "
                       "elementwise {})",
                       info.name, info.op == Op::max ? "maximum" : "minimum");
  std::string s = fmt::format("{} takes {} argument{}", info.name, info.arity,
                              info.arity == 1 ? "" : "s");
  if (info.num_attrs == 0) return s;
  std::string names;
  for (int k = 0; k < info.num_attrs; ++k)
    names += fmt::format("{}{}", k ? ", " : "", info.attr_names[k]);
  return s + fmt::format(" and {} ({})",
                         info.num_attrs == 1 ? "an optional parameter" : "optional parameters",
                         names);
}

}  // namespace

GraphLowering::GraphLowering(const SourceFile& source, const ParseOptions& options)
    : src_(source), options_(options) {}

void GraphLowering::fail(Loc at, const std::string& message) const { src_.fail(at, message); }

template <typename F>
Value GraphLowering::checked(Loc at, F&& build) {
  try {
    return build();
  } catch (const ParseError&) {
    throw;
  } catch (const UserError& e) {
    fail(at, e.what());
  }
}

// --- statements -----------------------------------------------------------------------

void GraphLowering::lower(const Statement& s) {
  switch (s.kind) {
    case StatementKind::input: declare(s); break;
    case StatementKind::assign: assign(s); break;
    case StatementKind::output: output(s); break;
  }
}

Graph GraphLowering::finish(Loc end) {
  if (g_.outputs().empty()) fail(end, "the expression defines no output: add `out D = ...`");
  return std::move(g_);
}

void GraphLowering::check_new_name(std::string_view name, Loc at, bool is_declaration) {
  if (name == "acc") fail(at, "'acc' is the GEMM accumulator; choose another name");
  if (const auto axis = index_axis_named(name))
    fail(at, fmt::format("'{}' is the {} index of the output element; choose another name", name,
                         index_axis_role(*axis)));
  if (name == "C" && !is_declaration)
    fail(at, "'C' is the GEMM's source matrix; choose another name");
  if (find_function(name))
    fail(at, fmt::format("'{}' is the name of a function; choose another name", name));
  if (auto it = values_.find(name); it != values_.end())
    fail(at, fmt::format("'{}' is already defined at {}", name, at_text(it->second.loc)));
  if (auto it = declared_.find(name); it != declared_.end())
    fail(at, fmt::format("'{}' is already declared as an input at {}", name,
                         at_text(it->second.loc)));
  std::optional<Loc> used;
  if (auto it = operands_.find(name); it != operands_.end()) used = it->second;
  if (name == "C") used = source_used_;
  if (used && is_declaration)
    fail(at, fmt::format("'{}' is declared after its first use at {}: put `input` declarations "
                         "before the statements that use them",
                         name, at_text(*used)));
  if (used)
    fail(at, fmt::format("'{}' is already used as an input operand at {}; choose another name",
                         name, at_text(*used)));
}

void GraphLowering::declare(const Statement& s) {
  check_new_name(s.name, s.name_loc, true);
  Declaration d;
  d.loc = s.name_loc;
  d.shape = s.shape.value_or(s.name == "C" ? Shape::full : Shape::scalar);
  if (s.name == "C" && d.shape != Shape::full)
    fail(s.shape_loc, "the source matrix C is always [m,n]");
  if (s.by_pointer && d.shape != Shape::scalar)
    fail(s.pointer_loc, fmt::format("only a scalar input can be passed by pointer, but '{}' is {}",
                                    s.name, shape_text(d.shape)));
  if (s.layout && s.name == "C")
    fail(s.layout_loc, "the layout of C is given when the kernel is run, not here");
  if (s.layout && d.shape != Shape::full)
    fail(s.layout_loc, fmt::format("only an [m,n] input has a layout, but '{}' is {}", s.name,
                                   shape_text(d.shape)));
  d.dtype = s.dtype.value_or(d.shape == Shape::scalar ? DType::f32 : options_.operand_dtype);
  d.by_pointer = s.by_pointer;
  d.layout = s.layout.value_or(Layout::row_major);
  declared_.emplace(std::string(s.name), d);
}

void GraphLowering::assign(const Statement& s) {
  check_new_name(s.name, s.name_loc, false);
  const Value v = value_of(*s.value);
  // Again: the value itself may have used the name, as a scalar parameter (`s = acc * s`).
  check_new_name(s.name, s.name_loc, false);
  values_.emplace(std::string(s.name), NamedValue{v.id, s.name_loc});
}

bool GraphLowering::reads_accumulator(NodeId id) {
  // Node ids grow as nodes are added and inputs come first: extend the table in id order.
  for (NodeId i = NodeId(reads_acc_.size()); i < g_.size(); ++i) {
    const Node& n = g_.node(i);
    bool reads = n.kind == NodeKind::accum;
    for (NodeId in : n.inputs) reads = reads || reads_acc_[in];
    reads_acc_.push_back(reads);
  }
  return reads_acc_[id];
}

void GraphLowering::output(const Statement& s) {
  check_new_name(s.name, s.name_loc, false);
  const Value v = value_of(*s.value);
  check_new_name(s.name, s.name_loc, false);
  const bool reduction = v.node().kind == NodeKind::reduce;
  const DType dtype = s.dtype.value_or(reduction ? DType::f32 : options_.output_dtype);
  if (s.layout && reduction) fail(s.layout_loc, "the output of a reduction has no layout");
  checked(s.value->start, [&] {
    return g_.store(s.name, v, dtype, s.layout.value_or(Layout::row_major));
  });
  // The rule the verify pass checks, here with the output's place in the source.
  if (!reads_accumulator(v.id))
    fail(s.value->start, fmt::format("output '{}' does not depend on the accumulator acc; every output of a "
                                     "GEMM epilogue must be computed from it",
                                     s.name));
  values_.emplace(std::string(s.name), NamedValue{v.id, s.name_loc});
}

// --- expressions ----------------------------------------------------------------------

Value GraphLowering::value_of(const Expr& e) {
  switch (e.kind) {
    case ExprKind::number:
      if (!(std::fabs(e.number) <= std::numeric_limits<float>::max()))
        fail(e.loc, fmt::format("the constant {} is too large for f32", e.text));
      return checked(e.loc, [&] { return g_.constant(e.number); });
    case ExprKind::name: return name_value(e);
    case ExprKind::index: return index_value(e);
    case ExprKind::call: return call_value(e);
    case ExprKind::unary: {
      const Value x = operand_of(*e.args[0].value);
      return checked(e.loc, [&] { return g_.compute(Op::neg, {x}); });
    }
    case ExprKind::binary: {
      const Value a = operand_of(*e.args[0].value);
      const Value b = operand_of(*e.args[1].value);
      return checked(e.loc, [&] { return g_.compute(e.op, {a, b}); });
    }
  }
  internal_fail(__FILE__, __LINE__, "unknown expression kind");
}

Value GraphLowering::operand_of(const Expr& e) {
  const Value v = value_of(e);
  const Node& n = v.node();
  if (n.kind != NodeKind::reduce) return v;
  const std::string reduction = reduction_name(n.axis, n.reduce_op);
  if (e.kind == ExprKind::name)
    fail(e.loc, fmt::format("'{}' is a reduction ({}): its result can only be written to an "
                            "output, since it is complete only after the whole kernel has run",
                            e.text, reduction));
  fail(e.loc, fmt::format("{0}(...) is a reduction: its result can only be written to an output "
                          "(`out NAME = {0}(...)`), since it is complete only after the whole "
                          "kernel has run",
                          reduction));
}

Value GraphLowering::name_value(const Expr& e) {
  const std::string_view name = e.text;
  if (name == "acc") return checked(e.loc, [&] { return g_.accum(); });
  if (const auto axis = index_axis_named(name)) return checked(e.loc, [&] { return g_.index(*axis); });
  if (name == "C") return source(e.loc);
  if (auto it = values_.find(name); it != values_.end()) return g_.value(it->second.id);
  if (auto it = declared_.find(name); it != declared_.end()) {
    const Declaration& d = it->second;
    return load(name, d.shape, d.dtype, d.by_pointer, d.layout, e.loc);
  }
  if (find_function(name)) fail(e.loc, fmt::format("'{0}' is a function: call it as {0}(...)", name));
  // nan and inf read as numbers but would be parameters named so (with whatever value a call
  // passes): refused rather than taken silently.
  {
    std::string lower(name);
    for (char& ch : lower) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    if (lower == "nan" || lower == "inf" || lower == "infinity")
      fail(e.loc, fmt::format("'{}' is not a number in expressions (it would be a runtime scalar parameter of "
                              "that name): write a finite constant, or give the parameter another name",
                              name));
  }
  // Any other name is a runtime scalar parameter, passed by value.
  return load(name, Shape::scalar, DType::f32, false, Layout::row_major, e.loc);
}

Value GraphLowering::index_value(const Expr& e) {
  const std::string_view name = e.text;
  if (name == "acc") fail(e.loc, "'acc' takes no index: the accumulator is always [m,n]");
  if (name == "C") fail(e.loc, "'C' takes no index: the source matrix is always [m,n]");
  if (const auto axis = index_axis_named(name))
    fail(e.loc, fmt::format("'{0}' takes no index: it is the {1} index of the output element, always [{0}]",
                            name, index_axis_role(*axis)));
  if (values_.count(name))
    fail(e.loc, fmt::format("'{0}' is a named value, not an input operand: write {0} without an "
                            "index",
                            name));
  if (find_function(name)) fail(e.loc, fmt::format("'{0}' is a function: call it as {0}(...)", name));
  if (auto it = declared_.find(name); it != declared_.end()) {
    const Declaration& d = it->second;
    if (d.shape != e.index)
      fail(e.loc, fmt::format("'{}' is declared as {} at {}, but used here as {}", name,
                              operand_text(name, d.shape), at_text(d.loc),
                              operand_text(name, e.index)));
    return load(name, d.shape, d.dtype, d.by_pointer, d.layout, e.loc);
  }
  return load(name, e.index, options_.operand_dtype, false, Layout::row_major, e.loc);
}

Value GraphLowering::load(std::string_view name, Shape shape, DType dtype, bool by_pointer,
                          Layout layout, Loc at) {
  operands_.try_emplace(std::string(name), at);
  return checked(at, [&] {
    switch (shape) {
      case Shape::scalar:
        return g_.param(name, dtype, by_pointer ? ScalarKind::pointer : ScalarKind::value);
      case Shape::row: return g_.row_vec(name, dtype);
      case Shape::col: return g_.col_vec(name, dtype);
      case Shape::full:
      case Shape::half: break;  // operands are never half-width: the parser gives [m,n]
    }
    return g_.aux(name, dtype, layout);
  });
}

Value GraphLowering::source(Loc at) {
  if (!source_used_) source_used_ = at;
  auto it = declared_.find("C");
  const DType dtype = it != declared_.end() ? it->second.dtype : options_.operand_dtype;
  return checked(at, [&] { return g_.source(dtype); });
}

// --- calls ----------------------------------------------------------------------------

void GraphLowering::arity_error(const Expr& e, const std::string& takes, size_t max_args) const {
  size_t positional = 0;
  for (const Argument& a : e.args) positional += a.keyword.empty() ? 1 : 0;
  // Too many: point at the first one too many; too few: at the ')'.
  Loc at = e.close;
  if (positional > max_args) at = e.args[max_args].value->start;
  fail(at, fmt::format("{}, got {}", takes, positional));
}

Value GraphLowering::call_value(const Expr& e) {
  const std::string_view name = e.text;
  if (auto gated = find_gated_function(name)) return gated_call(e, *gated);
  const std::optional<Function> fn = find_function(name);
  if (!fn) {
    if (values_.count(name) || declared_.count(name) || operands_.count(name) || name == "acc" ||
        name == "C" || index_axis_named(name))
      fail(e.loc, fmt::format("'{}' is a value, not a function", name));
    if (auto op = find_op(name); op && op_info(*op).comparison)
      fail(e.loc, fmt::format("comparisons are operators: write {}(a, b) as a {} b", name, op_info(*op).infix));
    if (auto near = nearest_name(name, function_names()))
      fail(e.loc, fmt::format("unknown function '{}'; did you mean '{}'?", name, *near));
    fail(e.loc, fmt::format("unknown function '{}'", name));
  }
  // Positional arguments come first; named parameters (`alpha=0.2`) after them.
  size_t positional = 0;
  for (const Argument& a : e.args) {
    if (a.keyword.empty() && positional < static_cast<size_t>(&a - e.args.data()))
      fail(a.value->start, "a positional argument cannot follow a named parameter");
    if (a.keyword.empty()) ++positional;
  }
  const bool is_reduction = fn->reduce_axis && (!fn->op || positional == 1);
  if (!is_reduction && !fn->cast) return op_call(e, *fn->op);

  for (const Argument& a : e.args)
    if (!a.keyword.empty()) fail(a.keyword_loc, fmt::format("{} has no parameters", name));
  if (positional != 1) arity_error(e, fmt::format("{} takes 1 argument", name), 1);
  const Value x = operand_of(*e.args[0].value);
  if (fn->cast) return checked(e.loc, [&] { return g_.cast(x, *fn->cast); });
  const Shape shape = x.node().shape;
  if (shape != Shape::full)
    fail(e.loc, fmt::format("{} reduces an [m,n] value, but its argument {} is {}", name,
                            g_.describe(x.id), shape_text(shape)));
  return checked(e.loc, [&] { return g_.reduce(*fn->reduce_axis, fn->reduce_op, x); });
}

Value GraphLowering::gated_call(const Expr& e, const GatedFunctionInfo& fn) {
  // One [m,n] argument (interleaved gate/up columns), then the function's parameters.
  std::vector<double> params;
  std::vector<bool> given(fn.params.size(), false);
  for (const auto& p : fn.params) params.push_back(p.second);
  std::string takes = fmt::format("{} takes 1 argument", fn.name);
  if (!fn.params.empty()) {
    takes += " (an [m,n] value of interleaved gate/up columns) and the parameters";
    for (size_t k = 0; k < fn.params.size(); ++k)
      takes += fmt::format("{} {}={}", k ? "," : "", fn.params[k].first, fn.params[k].second);
  }
  const Expr* x_expr = nullptr;
  size_t positional = 0;
  for (const Argument& a : e.args) {
    size_t k = 0;
    if (a.keyword.empty()) {
      if (positional == 0) {
        x_expr = a.value.get();
        ++positional;
        continue;
      }
      k = positional - 1;
      if (k >= fn.params.size()) arity_error(e, takes, 1 + fn.params.size());
      ++positional;
    } else {
      while (k < fn.params.size() && fn.params[k].first != a.keyword) ++k;
      if (k == fn.params.size())
        fail(a.keyword_loc, fn.params.empty()
                                ? fmt::format("{} has no parameters", fn.name)
                                : fmt::format("{} has no parameter '{}'", fn.name, a.keyword));
      if (given[k])
        fail(a.keyword_loc, fmt::format("the parameter {} of {} is given twice", a.keyword, fn.name));
    }
    if (a.value->kind != ExprKind::number)
      fail(a.value->start, fmt::format("the parameter {} of {} must be a number",
                                       fn.params[k].first, fn.name));
    params[k] = a.value->number;
    given[k] = true;
  }
  if (!x_expr) arity_error(e, takes, 1);
  const Value x = operand_of(*x_expr);
  return checked(e.loc, [&] {
    auto g = [&] { return gate(x); };
    auto u = [&] { return up(x); };
    switch (fn.fn) {
      case GatedFunction::gate: return g();
      case GatedFunction::up: return u();
      case GatedFunction::swiglu: return silu(g()) * u();
      case GatedFunction::geglu: return gelu(g()) * u();
      case GatedFunction::geglu_tanh: return gelu_tanh(g()) * u();
      case GatedFunction::reglu: return relu(g()) * u();
      case GatedFunction::gptoss_swiglu:
      case GatedFunction::swiglu7: {
        const double alpha = fn.fn == GatedFunction::swiglu7 ? 1.702 : params[0];
        const double limit = fn.fn == GatedFunction::swiglu7 ? 7.0 : params[1];
        const Value gl = min(g(), g_.constant(limit));
        const Value ul = clamp(u(), -limit, limit);
        return gl * sigmoid(gl * alpha) * (ul + 1.0);
      }
    }
    return g();
  });
}

Value GraphLowering::op_call(const Expr& e, Op op) {
  const OpInfo& info = op_info(op);
  const auto arity = static_cast<size_t>(info.arity);
  const auto num_attrs = static_cast<size_t>(info.num_attrs);
  // max and min are also reductions (with one argument), which their arity error mentions.
  const std::string takes = op_takes(info, find_function(info.name)->reduce_axis.has_value());
  std::vector<const Expr*> inputs;
  std::vector<const Expr*> params(num_attrs, nullptr);
  size_t positional = 0;
  for (const Argument& a : e.args) {
    if (a.keyword.empty()) {
      // Operands first, then the op's parameters in table order.
      if (positional < arity)
        inputs.push_back(a.value.get());
      else if (positional - arity < num_attrs)
        params[positional - arity] = a.value.get();
      else
        arity_error(e, takes, arity + num_attrs);
      ++positional;
      continue;
    }
    if (num_attrs == 0) fail(a.keyword_loc, fmt::format("{} has no parameters", info.name));
    size_t k = 0;
    while (k < num_attrs && info.attr_names[k] != a.keyword) ++k;
    if (k == num_attrs)
      fail(a.keyword_loc, fmt::format("{} has no parameter '{}' (its parameter is {})", info.name,
                                      a.keyword, info.attr_names[0]));
    if (params[k])
      fail(a.keyword_loc, fmt::format("the parameter {} of {} is given twice", a.keyword, info.name));
    params[k] = a.value.get();
  }
  if (inputs.size() < arity) arity_error(e, takes, arity);

  std::vector<double> attrs(num_attrs);
  for (size_t k = 0; k < num_attrs; ++k) {
    attrs[k] = info.attr_defaults[k];
    if (!params[k]) continue;
    if (params[k]->kind != ExprKind::number)
      fail(params[k]->start, fmt::format("the parameter {} of {} must be a number",
                                         info.attr_names[k], info.name));
    attrs[k] = params[k]->number;
  }
  std::vector<Value> values;
  for (const Expr* in : inputs) values.push_back(operand_of(*in));
  return checked(e.loc, [&] { return g_.compute(op, values, attrs); });
}

}  // namespace evtc::frontend
