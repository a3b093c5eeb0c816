#include "frontend/functions.hpp"

#include <algorithm>
#include <array>

namespace evtc::frontend {
namespace {

constexpr std::array kReduceAxes = {ReduceAxis::all, ReduceAxis::row, ReduceAxis::col};
// i32 and i64 are cast names too, so that `i32(x)` says what integer dtypes are for (the
// graph refuses a cast to them) instead of being an unknown function.
constexpr std::array kDTypes = {DType::f32,    DType::f16, DType::bf16, DType::f8e4m3,
                                DType::f8e5m2, DType::i32, DType::i64};

}  // namespace

std::optional<Function> find_function(std::string_view name) {
  Function f;
  f.op = find_op(name);
  // Comparisons are operators (a > b), not functions: their IR names (eq, ne, lt, le, gt, ge)
  // stay free for values and outputs, as they were before comparisons existed.
  if (f.op && op_info(*f.op).comparison) f.op.reset();
  for (ReduceAxis axis : kReduceAxes)
    for (const ReduceOpInfo& r : reduce_op_table())
      if (reduction_name(axis, r.op) == name) {
        f.reduce_axis = axis;
        f.reduce_op = r.op;
      }
  // Only the canonical dtype names are casts: `bf16(x)`, not `bfloat16(x)`.
  for (DType t : kDTypes)
    if (dtype_name(t) == name) f.cast = t;
  if (!f.op && !f.reduce_axis && !f.cast) return std::nullopt;
  return f;
}

namespace {
const std::vector<GatedFunctionInfo>& gated_functions() {
  static const std::vector<GatedFunctionInfo> table = {
      {GatedFunction::gate, "gate", {}, true},
      {GatedFunction::up, "up", {}, true},
      {GatedFunction::swiglu, "swiglu", {}},
      {GatedFunction::geglu, "geglu", {}},
      {GatedFunction::geglu_tanh, "geglu_tanh", {}},
      {GatedFunction::reglu, "reglu", {}, true},
      {GatedFunction::gptoss_swiglu, "gptoss_swiglu", {{"alpha", 1.702}, {"limit", 7.0}}},
      {GatedFunction::swiglu7, "swiglu7", {}},
  };
  return table;
}
}  // namespace

const std::vector<GatedFunctionInfo>& gated_function_table() { return gated_functions(); }

std::optional<GatedFunctionInfo> find_gated_function(std::string_view name) {
  for (const GatedFunctionInfo& f : gated_functions())
    if (f.name == name) return f;
  return std::nullopt;
}

const std::vector<std::string>& function_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const OpInfo& op : op_table())
      if (!op.comparison) out.emplace_back(op.name);
    for (ReduceAxis axis : kReduceAxes)
      for (const ReduceOpInfo& r : reduce_op_table()) {
        std::string n = reduction_name(axis, r.op);
        if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
      }
    for (DType t : kDTypes) out.emplace_back(dtype_name(t));
    for (const GatedFunctionInfo& f : gated_functions()) out.emplace_back(f.name);
    return out;
  }();
  return names;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  // d[i][j]: distance between the first i characters of a and the first j of b.
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t subst = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + subst});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

std::optional<std::string> nearest_name(std::string_view name,
                                        const std::vector<std::string>& candidates) {
  // A third of the name's length (at least 1) may differ: "slu" finds "silu", "frobnicate"
  // finds nothing.
  const size_t limit = std::max<size_t>(1, name.size() / 3);
  std::optional<std::string> best;
  size_t best_distance = limit + 1;
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(name, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

}  // namespace evtc::frontend
