#include "testing/host_convert.hpp"

#include <cmath>
#include <cstring>
#include <limits>

namespace evtc::runtime {
namespace {

struct Bits {
  int ebits, mbits, bias;
  bool has_inf;  // e4m3 (the "fn" variant) has no infinity: all-ones is NaN
};

Bits bits_of(DType t) {
  switch (t) {
    case DType::f16: return {5, 10, 15, true};
    case DType::bf16: return {8, 7, 127, true};
    case DType::f8e4m3: return {4, 3, 7, false};
    case DType::f8e5m2: return {5, 2, 15, true};
    case DType::f32:
    case DType::i32:
    case DType::i64: break;  // encoded apart (encode, decode)
  }
  return {8, 23, 127, true};
}

uint32_t encode_small(DType t, double x) {
  const Bits b = bits_of(t);
  const int total = 1 + b.ebits + b.mbits;
  const uint32_t sign = std::signbit(x) ? 1u << (total - 1) : 0u;
  const uint32_t exp_all = (1u << b.ebits) - 1;
  if (std::isnan(x)) return b.has_inf ? (exp_all << b.mbits) | 1u << (b.mbits - 1) : (1u << (total - 1)) - 1;
  if (std::isinf(x) && b.has_inf) return sign | (exp_all << b.mbits);
  x = round_to(t, x);  // e4m3 has no infinity: it saturates like the device conversion
  const double a = std::fabs(x);
  if (a == 0.0) return sign;
  int e = 0;
  std::frexp(a, &e);
  int E = e - 1;  // a = 1.f * 2^E
  const int emin = 1 - b.bias;
  if (E < emin) {  // subnormal
    const auto mant = static_cast<uint32_t>(std::ldexp(a, b.mbits - emin));
    return sign | mant;
  }
  const auto mant = static_cast<uint32_t>(std::ldexp(a, b.mbits - E)) & ((1u << b.mbits) - 1);
  return sign | (static_cast<uint32_t>(E + b.bias) << b.mbits) | mant;
}

double decode_small(DType t, uint32_t v) {
  const Bits b = bits_of(t);
  const int total = 1 + b.ebits + b.mbits;
  const bool neg = (v >> (total - 1)) & 1u;
  const uint32_t ex = (v >> b.mbits) & ((1u << b.ebits) - 1);
  const uint32_t mant = v & ((1u << b.mbits) - 1);
  const uint32_t exp_all = (1u << b.ebits) - 1;
  double r;
  if (b.has_inf && ex == exp_all) {
    r = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (!b.has_inf && ex == exp_all && mant == (1u << b.mbits) - 1) {
    r = std::numeric_limits<double>::quiet_NaN();
  } else if (ex == 0) {
    r = std::ldexp(static_cast<double>(mant), 1 - b.bias - b.mbits);
  } else {
    r = std::ldexp(1.0 + std::ldexp(static_cast<double>(mant), -b.mbits), static_cast<int>(ex) - b.bias);
  }
  return neg ? -r : r;
}

}  // namespace

std::vector<uint8_t> encode(DType t, std::span<const double> values) {
  const int bytes = dtype_bytes(t);
  std::vector<uint8_t> out(values.size() * bytes);
  for (size_t i = 0; i < values.size(); ++i) {
    if (t == DType::f32) {
      const float f = static_cast<float>(values[i]);
      std::memcpy(&out[i * 4], &f, 4);
    } else if (t == DType::i32) {
      const auto v = static_cast<int32_t>(round_to(t, values[i]));
      std::memcpy(&out[i * 4], &v, 4);
    } else if (t == DType::i64) {
      const auto v = static_cast<int64_t>(round_to(t, values[i]));
      std::memcpy(&out[i * 8], &v, 8);
    } else {
      const uint32_t v = encode_small(t, values[i]);
      std::memcpy(&out[i * bytes], &v, bytes);  // little-endian: the low bytes
    }
  }
  return out;
}

std::vector<double> decode(DType t, const void* data, size_t count) {
  const auto* p = static_cast<const uint8_t*>(data);
  const int bytes = dtype_bytes(t);
  std::vector<double> out(count);
  for (size_t i = 0; i < count; ++i) {
    if (t == DType::f32) {
      float f;
      std::memcpy(&f, p + i * 4, 4);
      out[i] = f;
    } else if (t == DType::i32) {
      int32_t v;
      std::memcpy(&v, p + i * 4, 4);
      out[i] = double(v);
    } else if (t == DType::i64) {
      int64_t v;
      std::memcpy(&v, p + i * 8, 8);
      out[i] = double(v);
    } else {
      uint32_t v = 0;
      std::memcpy(&v, p + i * bytes, bytes);
      out[i] = decode_small(t, v);
    }
  }
  return out;
}

}  // namespace evtc::runtime
