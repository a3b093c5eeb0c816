#include "evtc/types.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "evtc/error.hpp"

namespace evtc {

namespace {
struct FloatFormat {
  int precision;   // significant bits, the implicit one included
  int min_exp;     // frexp exponent of the smallest normal value
  double max_finite;
  bool saturates;  // conversion clamps to max_finite instead of overflowing to infinity
};

FloatFormat format_of(DType t) {
  switch (t) {
    case DType::f16: return {11, -13, 65504.0, false};
    case DType::bf16: return {8, -125, 3.38953138925153547590470800371487866880e38, false};
    case DType::f8e4m3: return {4, -5, 448.0, true};
    case DType::f8e5m2: return {3, -13, 57344.0, true};
    case DType::f32:
    case DType::i32:
    case DType::i64: break;
  }
  internal_fail(__FILE__, __LINE__, "format_of: not a narrow float type");
}
}  // namespace

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f8e4m3: return "f8e4m3";
    case DType::f8e5m2: return "f8e5m2";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

std::string_view torch_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::f8e4m3: return "float8_e4m3fn";
    case DType::f8e5m2: return "float8_e5m2";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
  }
  return "?";
}

namespace {
constexpr DType kAllDTypes[] = {DType::f32,    DType::f16, DType::bf16, DType::f8e4m3,
                                DType::f8e5m2, DType::i32, DType::i64};
}  // namespace

std::optional<DType> parse_dtype(std::string_view s) {
  for (DType t : kAllDTypes)
    if (s == dtype_name(t) || s == torch_dtype_name(t)) return t;
  // Other common spellings.
  if (s == "fp32") return DType::f32;
  if (s == "fp16" || s == "half") return DType::f16;
  if (s == "fp8e4m3" || s == "e4m3") return DType::f8e4m3;
  if (s == "fp8e5m2" || s == "e5m2") return DType::f8e5m2;
  return std::nullopt;
}

const std::vector<std::string>& dtype_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (DType t : kAllDTypes)
      v.emplace_back(dtype_name(t));
    return v;
  }();
  return names;
}

const std::vector<std::string>& float_dtype_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (DType t : kAllDTypes)
      if (!is_integer(t)) v.emplace_back(dtype_name(t));
    return v;
  }();
  return names;
}

bool is_tensor_core_input(DType t) { return t == DType::bf16 || t == DType::f16 || is_fp8(t); }

const std::vector<std::string>& tensor_core_input_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (DType t : kAllDTypes)
      if (is_tensor_core_input(t)) v.emplace_back(dtype_name(t));
    return v;
  }();
  return names;
}

std::string or_list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) out += i + 1 == names.size() ? " or " : ", ";
    out += names[i];
  }
  return out;
}

int dtype_bits(DType t) {
  switch (t) {
    case DType::f32:
    case DType::i32: return 32;
    case DType::i64: return 64;
    case DType::f16:
    case DType::bf16: return 16;
    case DType::f8e4m3:
    case DType::f8e5m2: return 8;
  }
  return 0;
}

bool is_fp8(DType t) { return t == DType::f8e4m3 || t == DType::f8e5m2; }

bool is_integer(DType t) { return t == DType::i32 || t == DType::i64; }

double dtype_max(DType t) {
  if (t == DType::f32) return std::numeric_limits<float>::max();
  if (t == DType::i32) return double(std::numeric_limits<int32_t>::max());
  if (t == DType::i64) return double(std::numeric_limits<int64_t>::max());
  return format_of(t).max_finite;
}

double round_to(DType t, double x) {
  if (t == DType::f32) return static_cast<double>(static_cast<float>(x));
  if (is_integer(t)) {
    if (std::isnan(x)) return 0.0;
    const double lo = t == DType::i32 ? double(std::numeric_limits<int32_t>::min())
                                      : double(std::numeric_limits<int64_t>::min());
    return std::clamp(std::nearbyint(x), lo, dtype_max(t));
  }
  if (std::isnan(x)) return x;
  const FloatFormat f = format_of(t);
  if (std::isinf(x)) return f.saturates ? std::copysign(f.max_finite, x) : x;
  if (x == 0.0) return x;
  int e = 0;
  std::frexp(x, &e);
  // Quantum of the binade (fixed below the smallest normal: subnormals are evenly spaced).
  const int q = std::max(e, f.min_exp) - f.precision;
  const double r = std::ldexp(std::nearbyint(std::ldexp(x, -q)), q);  // ties to even
  if (std::fabs(r) > f.max_finite) {
    return f.saturates ? std::copysign(f.max_finite, x)
                       : std::copysign(std::numeric_limits<double>::infinity(), x);
  }
  return r;
}

bool widens_losslessly(DType from, DType to) {
  if (is_integer(to)) return from == to;  // nothing computes in an integer type
  if (from == to || to == DType::f32) return true;  // integer operands: see the header
  if (to == DType::f16) return from == DType::f8e4m3 || from == DType::f8e5m2;
  if (to == DType::bf16) return from == DType::f8e4m3 || from == DType::f8e5m2;
  return false;
}

std::string_view shape_name(Shape s) {
  switch (s) {
    case Shape::scalar: return "";
    case Shape::row: return "[n]";
    case Shape::col: return "[m]";
    case Shape::full: return "[m,n]";
    case Shape::half: return "[m,n/2]";
  }
  return "?";
}

bool broadcastable(Shape a, Shape b) {
  if (a != Shape::half && b != Shape::half) return true;
  const Shape other = a == Shape::half ? b : a;
  return other == Shape::half || other == Shape::scalar || other == Shape::col;
}

Shape broadcast(Shape a, Shape b) {
  if (a == b) return a;
  if (a == Shape::scalar) return b;
  if (b == Shape::scalar) return a;
  if (a == Shape::half || b == Shape::half) return Shape::half;  // with a column vector
  return Shape::full;  // row with col, or anything with full
}

void internal_fail(const char* file, int line, const std::string& what) {
  throw InternalError("internal error (a bug in evtc) at " + std::string(file) + ":" +
                      std::to_string(line) + ": " + what);
}

}  // namespace evtc
