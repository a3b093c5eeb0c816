// The op table: every elementwise operation evtc knows, in one place. Every layer reads it:
// the expression parser (names, arity, parameters), the printer, the reference interpreter
// (cpu), the passes (commutativity, cost) and the CUDA backends (functor names in
// evtc/device/ops.cuh). Adding an op means adding one row to kOpTable in src/ir/ops.cpp and
// one functor in the device header.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace evtc {

enum class Op : uint8_t {
  // unary
  relu, relu_square, sigmoid, silu, gelu, gelu_tanh, quick_gelu, tanh, exp, log, neg, abs,
  sqrt, rsqrt, square, reciprocal, erf, softplus, hardswish, mish, leaky_relu,
  // binary
  add, sub, mul, div, max, min, pow,
  // comparisons: 1 where true, 0 where false (NaN compares unequal to everything)
  eq, ne, lt, le, gt, ge,
  // ternary
  clamp, where, fma,
};

inline constexpr int kMaxOpAttrs = 1;

// Where an op's argument gives finite, well-conditioned results (what random testing feeds it).
enum class Domain : uint8_t {
  any,       // every finite value
  positive,  // > 0 (log, sqrt, rsqrt, pow's base)
  nonzero,   // away from 0 (a reciprocal, a divisor)
  bounded,   // |x| of a few units (exp's argument, pow's exponent: no overflow)
  condition, // an input value, not a computed one (where's condition: a computed value near 0
             // is 0 in f32 and not in fp64, or the other way, and where jumps between branches)
};

struct OpInfo {
  Op op;
  std::string_view name;
  int arity;
  // Compile-time parameters (e.g. leaky_relu's negative slope), with defaults.
  int num_attrs;
  std::array<std::string_view, kMaxOpAttrs> attr_names;
  std::array<double, kMaxOpAttrs> attr_defaults;
  bool commutative;  // for binary ops: f(a, b) == f(b, a)
  // Rough relative cost of one evaluation on the GPU (1 = an add), for lowering decisions.
  int cost;
  // fp64 reference: args has `arity` entries, attrs `num_attrs`.
  double (*cpu)(std::span<const double> args, std::span<const double> attrs);
  // Name of the device functor template in evtc/device/ops.cuh (namespace evtc::device).
  std::string_view cuda_functor;
  // The domain of each argument (rows that leave it out take any value).
  std::array<Domain, 3> domains{};
  // On integer-valued arguments the result is an integer, computed exactly in f32 while it
  // stays below 2^24 (add, mul, max, relu, ...): random testing's integer mode checks these
  // bit for bit.
  bool exact_on_integers = false;
  // A comparison: the result is 1 or 0, for where() or a mask (eq ne lt le gt ge). The
  // expression language writes comparisons only with their operator, `infix` (a > b).
  bool comparison = false;
  std::string_view infix = {};
};

std::span<const OpInfo> op_table();
const OpInfo& op_info(Op op);
std::optional<Op> find_op(std::string_view name);
// Every op name, for "did you mean" suggestions.
std::span<const std::string_view> op_names();

}  // namespace evtc
