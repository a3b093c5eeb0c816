#include <gtest/gtest.h>

#include <vector>

#include <cmath>
#include <cstring>
#include <random>

#include "testing/host_convert.hpp"

using namespace evtc;
using evtc::runtime::decode;
using evtc::runtime::encode;

TEST(HostConvert, KnownBitPatterns) {
  const double one = 1.0;
  auto bf = encode(DType::bf16, std::span(&one, 1));
  EXPECT_EQ(bf[0] | (bf[1] << 8), 0x3F80);
  auto h = encode(DType::f16, std::span(&one, 1));
  EXPECT_EQ(h[0] | (h[1] << 8), 0x3C00);
  const double v448 = 448.0;
  EXPECT_EQ(encode(DType::f8e4m3, std::span(&v448, 1))[0], 0x7E);
  const double v57344 = -57344.0;
  EXPECT_EQ(encode(DType::f8e5m2, std::span(&v57344, 1))[0], 0xFB);
  const double sub = std::ldexp(1.0, -9);  // smallest e4m3 subnormal
  EXPECT_EQ(encode(DType::f8e4m3, std::span(&sub, 1))[0], 0x01);
  const uint8_t nan = 0x7F;
  EXPECT_TRUE(std::isnan(decode(DType::f8e4m3, &nan, 1)[0]));
  const uint16_t hinf = 0x7C00;
  EXPECT_TRUE(std::isinf(decode(DType::f16, &hinf, 1)[0]));
}

// Integer operands: little-endian two's complement int32/int64, as torch.int32/int64 hold them.
TEST(HostConvert, IntegerBuffers) {
  const std::vector<double> values = {0, -1, 32000, -2147483648.0, 2147483647.0};
  const std::vector<uint8_t> i32 = encode(DType::i32, values);
  ASSERT_EQ(i32.size(), 20u);
  EXPECT_EQ((std::vector<uint8_t>(i32.begin() + 4, i32.begin() + 8)), (std::vector<uint8_t>{0xFF, 0xFF, 0xFF, 0xFF}));
  EXPECT_EQ((std::vector<uint8_t>(i32.begin() + 8, i32.begin() + 12)), (std::vector<uint8_t>{0x00, 0x7D, 0x00, 0x00}));
  EXPECT_EQ(decode(DType::i32, i32.data(), values.size()), values);
  const std::vector<double> wide = {-1, 1e15, 3};
  const std::vector<uint8_t> i64 = encode(DType::i64, wide);
  ASSERT_EQ(i64.size(), 24u);
  EXPECT_EQ(i64[7], 0xFF);  // -1: all ones
  EXPECT_EQ(decode(DType::i64, i64.data(), wide.size()), wide);
}

TEST(HostConvert, RoundTripsRoundedValues) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> nd(0.0, 30.0);
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::f8e4m3, DType::f8e5m2}) {
    std::vector<double> v(2000);
    for (auto& x : v) x = round_to(t, nd(rng) * (rng() % 2 ? 1e-3 : 1.0));
    auto bytes = encode(t, v);
    auto back = decode(t, bytes.data(), v.size());
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(back[i], v[i]) << dtype_name(t) << " " << v[i];
  }
}

TEST(HostConvert, EveryFp8PatternDecodesAndReencodes) {
  for (DType t : {DType::f8e4m3, DType::f8e5m2}) {
    for (int p = 0; p < 256; ++p) {
      const uint8_t b = static_cast<uint8_t>(p);
      const double v = decode(t, &b, 1)[0];
      if (std::isnan(v)) continue;
      ASSERT_EQ(encode(t, std::span(&v, 1))[0], b) << dtype_name(t) << " pattern " << p;
    }
  }
}
