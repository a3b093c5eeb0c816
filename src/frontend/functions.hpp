// The functions an expression can call: every op of the op table by its name, the
// reductions (sum, max, min, amax and their row_/col_ forms) and the casts (one per dtype).
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "evtc/graph.hpp"

namespace evtc::frontend {

// What a function name can mean. `max` and `min` are both an op (two arguments: the
// elementwise maximum) and a reduction (one argument: the maximum over the whole matrix).
struct Function {
  std::optional<Op> op;
  std::optional<ReduceAxis> reduce_axis;
  ReduceOp reduce_op = ReduceOp::sum;
  std::optional<DType> cast;
};

std::optional<Function> find_function(std::string_view name);

// Functions over the interleaved (gate, up) column pairs of an [m,n] value, giving an
// [m,n/2] value: gate(x) and up(x) themselves, and the gated activations built from them.
enum class GatedFunction : uint8_t {
  gate,           // x's even columns
  up,             // x's odd columns
  swiglu,         // silu(gate) * up
  geglu,          // gelu(gate) * up (erf form)
  geglu_tanh,     // gelu_tanh(gate) * up
  reglu,          // relu(gate) * up
  gptoss_swiglu,  // g = min(gate, limit), u = clamp(up, -limit, limit): g*sigmoid(alpha*g)*(u+1)
  swiglu7,        // gptoss_swiglu with alpha=1.702, limit=7
};
struct GatedFunctionInfo {
  GatedFunction fn;
  std::string_view name;
  std::vector<std::pair<std::string_view, double>> params;  // name, default
  bool exact_on_integers = false;  // as OpInfo::exact_on_integers
};
std::optional<GatedFunctionInfo> find_gated_function(std::string_view name);
// Every gated function, gate and up first.
const std::vector<GatedFunctionInfo>& gated_function_table();
using evtc::reduction_name;  // declared with the graph (evtc/graph.hpp)
// Every function name, ops first (in op-table order), then reductions, then casts.
const std::vector<std::string>& function_names();

// Optimal-string-alignment distance: insertions, deletions, substitutions and swaps of two
// adjacent characters each cost 1 ("sliu" is 1 from "silu").
size_t edit_distance(std::string_view a, std::string_view b);
// The candidate nearest to `name`, if one is close enough to be a plausible typo.
std::optional<std::string> nearest_name(std::string_view name,
                                        const std::vector<std::string>& candidates);

}  // namespace evtc::frontend
