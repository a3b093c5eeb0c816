// Fresh random inputs for the reference interpreter and the device tests.
#include <fmt/format.h>
#include <xxhash.h>

#include <cmath>
#include <numbers>
#include <random>

#include "evtc/error.hpp"
#include "evtc/gemm.hpp"
#include "evtc/reference.hpp"

namespace evtc {
namespace {

// Normal variates by the Box-Muller transform over std::mt19937_64's bits, which the
// standard fixes exactly; std::normal_distribution's algorithm varies between libraries.
class NormalStream {
 public:
  NormalStream(uint64_t seed, std::string_view name)
      : rng_(XXH3_64bits_withSeed(name.data(), name.size(), seed)) {}

  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - uniform();  // in (0, 1]: log(u1) is finite
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * std::numbers::pi * u2);
    has_spare_ = true;
    return r * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  double uniform() { return static_cast<double>(rng_() >> 11) * 0x1p-53; }  // [0, 1)

  std::mt19937_64 rng_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

std::vector<double> random_values(uint64_t seed, std::string_view stream, size_t count,
                                  double stddev, DType dtype) {
  NormalStream normal(seed, stream);
  std::vector<double> v(count);
  for (double& x : v) x = round_to(dtype, stddev * normal.next());
  return v;
}

// Integers drawn uniformly from [-bound, bound].
std::vector<double> random_integers(uint64_t seed, std::string_view stream, size_t count, int bound) {
  std::mt19937_64 rng(XXH3_64bits_withSeed(stream.data(), stream.size(), seed));
  std::vector<double> v(count);
  for (double& x : v) x = static_cast<double>(int64_t(rng() % uint64_t(2 * bound + 1)) - bound);
  return v;
}

// Integers drawn uniformly from [lo, hi].
std::vector<double> random_integers_between(uint64_t seed, std::string_view stream, size_t count, int64_t lo,
                                            int64_t hi) {
  std::mt19937_64 rng(XXH3_64bits_withSeed(stream.data(), stream.size(), seed));
  std::vector<double> v(count);
  for (double& x : v) x = static_cast<double>(lo + int64_t(rng() % uint64_t(hi - lo + 1)));
  return v;
}

// A problem's inputs: A (m×k), B (k×n), C when g reads it and every operand g names, each
// drawn by draw(stream, count, dtype) with a stream name of its own ("gemm:A", "operand:bias").
// Integer operands hold indices of the other axis (a class label per row, a row per column),
// drawn from [-1, n] for an [m] vector and [-1, m] for an [n] vector: `n == t[m]` then holds at
// about one element per row, and the values just outside the range match nothing.
template <class Draw>
ReferenceInputs problem_inputs(const Graph& g, int64_t m, int64_t n, int64_t k, DType a_dtype, DType b_dtype,
                               uint64_t seed, const Draw& draw) {
  if (m <= 0 || n <= 0 || k <= 0)
    throw UserError(
        fmt::format("problem size m={}, n={}, k={}: every size must be positive", m, n, k));
  ReferenceInputs in;
  in.m = m;
  in.n = n;
  in.k = k;
  const auto mn = static_cast<size_t>(m * n);
  in.a = draw("gemm:A", static_cast<size_t>(m * k), a_dtype);
  in.b = draw("gemm:B", static_cast<size_t>(k * n), b_dtype);
  for (const Node& node : g.nodes()) {
    if (node.kind == NodeKind::source) {
      in.c = draw("gemm:C", mn, node.dtype);
      continue;
    }
    if (!node.is_load() || node.kind == NodeKind::accum) continue;
    if (node.kind == NodeKind::scalar && node.scalar_kind == ScalarKind::constant) continue;
    const size_t count = node.shape == Shape::scalar ? 1
                         : node.shape == Shape::row  ? static_cast<size_t>(n)
                         : node.shape == Shape::col  ? static_cast<size_t>(m)
                                                     : mn;
    const std::string stream = "operand:" + node.name;
    if (is_integer(node.dtype))
      in.operands[node.name] = random_integers_between(seed, stream, count, -1, node.shape == Shape::col ? n : m);
    else
      in.operands[node.name] = draw(stream, count, node.dtype);
  }
  return in;
}

}  // namespace

std::vector<double> random_block_scales(uint64_t seed, std::string_view stream, size_t count) {
  std::mt19937_64 rng(XXH3_64bits_withSeed(stream.data(), stream.size(), seed));
  std::vector<double> v(count);
  for (double& x : v) {
    const int e = int(rng() % 7) - 3;
    const double u = 0.5 + 0.5 * static_cast<double>(rng() >> 11) * 0x1p-53;
    x = round_to(DType::f32, std::ldexp(u, e));
  }
  return v;
}

void add_random_block_scales(ReferenceInputs& in, uint64_t seed) {
  const int64_t kb = fp8_scale_blocks(in.k), nb = fp8_scale_blocks(in.n);
  in.scale_a = random_block_scales(seed, "gemm:scale_a", size_t(in.m * kb));
  in.scale_b = random_block_scales(seed, "gemm:scale_b", size_t(kb * nb));
}

ReferenceInputs random_integer_inputs(const Graph& g, int64_t m, int64_t n, int64_t k, uint64_t seed) {
  return problem_inputs(g, m, n, k, DType::f32, DType::f32, seed, [&](const std::string& stream, size_t count, DType) {
    return random_integers(seed, stream, count, stream == "gemm:A" || stream == "gemm:B" ? 1 : 3);
  });
}

ReferenceInputs random_reference_inputs(const Graph& g, int64_t m, int64_t n, int64_t k,
                                        DType a_dtype, DType b_dtype, uint64_t seed) {
  // k^(-1/4) for A and B, so that every element of A@B, a sum of k products, has variance
  // about 1; 1 for the rest.
  const double ab_stddev = k > 0 ? std::pow(static_cast<double>(k), -0.25) : 1.0;
  return problem_inputs(g, m, n, k, a_dtype, b_dtype, seed, [&](const std::string& stream, size_t count, DType dtype) {
    return random_values(seed, stream, count, stream == "gemm:A" || stream == "gemm:B" ? ab_stddev : 1.0, dtype);
  });
}

}  // namespace evtc
