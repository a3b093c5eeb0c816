// The fp64 matrix product behind the reference accumulator.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace evtc::reference {

// A (m×k) @ B (k×n), both row-major, in fp64; returns m×n row-major. Every element sums its
// k products in increasing k order, whatever the number of threads, so results are
// reproducible bit for bit.
std::vector<double> gemm_f64(std::span<const double> a, std::span<const double> b, int64_t m,
                             int64_t n, int64_t k);

}  // namespace evtc::reference
