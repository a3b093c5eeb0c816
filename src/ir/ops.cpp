#include "evtc/ops.hpp"

#include <algorithm>
#include <cmath>

#include "evtc/error.hpp"

namespace evtc {
namespace {

using Args = std::span<const double>;

double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double softplus_ref(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }
constexpr double kSqrt2OverPi = 0.79788456080286535587989211986876;

// One row per op. Columns: op, name, arity, #attrs, attr names, attr defaults, commutative,
// cost, CPU reference (fp64), device functor (evtc/device/ops.cuh), argument domains, exact on
// integers, comparison, its operator.
const OpInfo kOpTable[] = {
    {Op::relu, "relu", 1, 0, {}, {}, false, 1,
     [](Args a, Args) { return a[0] > 0 || std::isnan(a[0]) ? a[0] : 0.0; }, "Relu", {}, true},
    {Op::relu_square, "relu_square", 1, 0, {}, {}, false, 2,
     [](Args a, Args) { double r = a[0] > 0 || std::isnan(a[0]) ? a[0] : 0.0; return r * r; }, "ReluSquare", {}, true},
    {Op::sigmoid, "sigmoid", 1, 0, {}, {}, false, 8,
     [](Args a, Args) { return sigmoid_ref(a[0]); }, "Sigmoid"},
    {Op::silu, "silu", 1, 0, {}, {}, false, 8,
     [](Args a, Args) { return a[0] * sigmoid_ref(a[0]); }, "Silu"},
    {Op::gelu, "gelu", 1, 0, {}, {}, false, 12,
     [](Args a, Args) { return 0.5 * a[0] * (1.0 + std::erf(a[0] / std::sqrt(2.0))); }, "Gelu"},
    {Op::gelu_tanh, "gelu_tanh", 1, 0, {}, {}, false, 10,
     [](Args a, Args) {
       double x = a[0];
       return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
     }, "GeluTanh"},
    {Op::quick_gelu, "quick_gelu", 1, 0, {}, {}, false, 8,
     [](Args a, Args) { return a[0] * sigmoid_ref(1.702 * a[0]); }, "QuickGelu"},
    {Op::tanh, "tanh", 1, 0, {}, {}, false, 6,
     [](Args a, Args) { return std::tanh(a[0]); }, "Tanh"},
    {Op::exp, "exp", 1, 0, {}, {}, false, 4,
     [](Args a, Args) { return std::exp(a[0]); }, "Exp", {Domain::bounded}},
    {Op::log, "log", 1, 0, {}, {}, false, 4,
     [](Args a, Args) { return std::log(a[0]); }, "Log", {Domain::positive}},
    {Op::neg, "neg", 1, 0, {}, {}, false, 1,
     [](Args a, Args) { return -a[0]; }, "Neg", {}, true},
    {Op::abs, "abs", 1, 0, {}, {}, false, 1,
     [](Args a, Args) { return std::fabs(a[0]); }, "Abs", {}, true},
    {Op::sqrt, "sqrt", 1, 0, {}, {}, false, 4,
     [](Args a, Args) { return std::sqrt(a[0]); }, "Sqrt", {Domain::positive}},
    {Op::rsqrt, "rsqrt", 1, 0, {}, {}, false, 4,
     [](Args a, Args) { return 1.0 / std::sqrt(a[0]); }, "Rsqrt", {Domain::positive}},
    {Op::square, "square", 1, 0, {}, {}, false, 1,
     [](Args a, Args) { return a[0] * a[0]; }, "Square", {}, true},
    {Op::reciprocal, "reciprocal", 1, 0, {}, {}, false, 4,
     [](Args a, Args) { return 1.0 / a[0]; }, "Reciprocal", {Domain::nonzero}},
    {Op::erf, "erf", 1, 0, {}, {}, false, 10,
     [](Args a, Args) { return std::erf(a[0]); }, "Erf"},
    {Op::softplus, "softplus", 1, 0, {}, {}, false, 10,
     [](Args a, Args) { return softplus_ref(a[0]); }, "Softplus"},
    {Op::hardswish, "hardswish", 1, 0, {}, {}, false, 3,
     [](Args a, Args) { return a[0] * std::clamp(a[0] + 3.0, 0.0, 6.0) / 6.0; }, "Hardswish"},
    {Op::mish, "mish", 1, 0, {}, {}, false, 14,
     [](Args a, Args) { return a[0] * std::tanh(softplus_ref(a[0])); }, "Mish"},
    {Op::leaky_relu, "leaky_relu", 1, 1, {"alpha"}, {0.01}, false, 1,
     [](Args a, Args p) { return a[0] > 0 ? a[0] : a[0] * p[0]; }, "LeakyRelu"},
    {Op::add, "add", 2, 0, {}, {}, true, 1,
     [](Args a, Args) { return a[0] + a[1]; }, "Add", {}, true},
    {Op::sub, "sub", 2, 0, {}, {}, false, 1,
     [](Args a, Args) { return a[0] - a[1]; }, "Sub", {}, true},
    {Op::mul, "mul", 2, 0, {}, {}, true, 1,
     [](Args a, Args) { return a[0] * a[1]; }, "Mul", {}, true},
    {Op::div, "div", 2, 0, {}, {}, false, 4,
     [](Args a, Args) { return a[0] / a[1]; }, "Div", {Domain::any, Domain::nonzero}},
    {Op::max, "max", 2, 0, {}, {}, true, 1,
     [](Args a, Args) { return std::isnan(a[0]) || std::isnan(a[1]) ? NAN : std::max(a[0], a[1]); },
     "Max", {}, true},
    {Op::min, "min", 2, 0, {}, {}, true, 1,
     [](Args a, Args) { return std::isnan(a[0]) || std::isnan(a[1]) ? NAN : std::min(a[0], a[1]); },
     "Min", {}, true},
    {Op::pow, "pow", 2, 0, {}, {}, false, 8,
     [](Args a, Args) { return std::pow(a[0], a[1]); }, "Pow", {Domain::positive, Domain::bounded}},
    // Comparisons compare values that random testing draws from the inputs (Domain::condition):
    // a computed value near the threshold can land on either side in f32 and in fp64.
    {Op::eq, "eq", 2, 0, {}, {}, true, 1,
     [](Args a, Args) { return a[0] == a[1] ? 1.0 : 0.0; }, "Eq", {Domain::condition, Domain::condition}, true, true, "=="},
    {Op::ne, "ne", 2, 0, {}, {}, true, 1,
     [](Args a, Args) { return a[0] != a[1] ? 1.0 : 0.0; }, "Ne", {Domain::condition, Domain::condition}, true, true, "!="},
    {Op::lt, "lt", 2, 0, {}, {}, false, 1,
     [](Args a, Args) { return a[0] < a[1] ? 1.0 : 0.0; }, "Lt", {Domain::condition, Domain::condition}, true, true, "<"},
    {Op::le, "le", 2, 0, {}, {}, false, 1,
     [](Args a, Args) { return a[0] <= a[1] ? 1.0 : 0.0; }, "Le", {Domain::condition, Domain::condition}, true, true, "<="},
    {Op::gt, "gt", 2, 0, {}, {}, false, 1,
     [](Args a, Args) { return a[0] > a[1] ? 1.0 : 0.0; }, "Gt", {Domain::condition, Domain::condition}, true, true, ">"},
    {Op::ge, "ge", 2, 0, {}, {}, false, 1,
     [](Args a, Args) { return a[0] >= a[1] ? 1.0 : 0.0; }, "Ge", {Domain::condition, Domain::condition}, true, true, ">="},
    {Op::clamp, "clamp", 3, 0, {}, {}, false, 2,
     [](Args a, Args) { return std::isnan(a[0]) ? a[0] : std::min(std::max(a[0], a[1]), a[2]); },
     "Clamp", {}, true},
    {Op::where, "where", 3, 0, {}, {}, false, 1,
     [](Args a, Args) { return a[0] != 0.0 ? a[1] : a[2]; }, "Where", {Domain::condition}, true},
    {Op::fma, "fma", 3, 0, {}, {}, false, 1,
     [](Args a, Args) { return a[0] * a[1] + a[2]; }, "Fma", {}, true},
};

constexpr size_t kNumOps = sizeof(kOpTable) / sizeof(kOpTable[0]);

const std::array<std::string_view, kNumOps> kOpNames = [] {
  std::array<std::string_view, kNumOps> names{};
  for (size_t i = 0; i < kNumOps; ++i) names[i] = kOpTable[i].name;
  return names;
}();

}  // namespace

std::span<const OpInfo> op_table() { return kOpTable; }

const OpInfo& op_info(Op op) {
  const auto i = static_cast<size_t>(op);
  EVTC_INTERNAL_ASSERT(i < kNumOps && kOpTable[i].op == op, "op table out of order");
  return kOpTable[i];
}

std::optional<Op> find_op(std::string_view name) {
  for (const OpInfo& info : kOpTable)
    if (info.name == name) return info.op;
  return std::nullopt;
}

std::span<const std::string_view> op_names() { return kOpNames; }

}  // namespace evtc
