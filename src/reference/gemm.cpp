#include "reference/gemm.hpp"

#include <algorithm>

#include "reference/parallel.hpp"

namespace evtc::reference {

namespace {
// Tiles of B that stay in cache while a block of rows of A streams past: kTileK rows of
// kTileN doubles of B (512 KiB), and one kTileN-wide slice of a row of the result (4 KiB).
constexpr int64_t kTileK = 128;
constexpr int64_t kTileN = 512;
}  // namespace

std::vector<double> gemm_f64(std::span<const double> a, std::span<const double> b, int64_t m,
                             int64_t n, int64_t k) {
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for_row_blocks(m, n * k, [&](int64_t row_begin, int64_t row_end) {
    for (int64_t j0 = 0; j0 < n; j0 += kTileN) {
      const int64_t j1 = std::min(n, j0 + kTileN);
      // k tiles in increasing order: each element still sums its products in k order.
      for (int64_t k0 = 0; k0 < k; k0 += kTileK) {
        const int64_t k1 = std::min(k, k0 + kTileK);
        for (int64_t i = row_begin; i < row_end; ++i) {
          double* c_row = c.data() + i * n;
          const double* a_row = a.data() + i * k;
          for (int64_t kk = k0; kk < k1; ++kk) {
            // No skipping of zero a values: 0 * inf must give NaN as on the device.
            const double av = a_row[kk];
            const double* b_row = b.data() + kk * n;
            for (int64_t j = j0; j < j1; ++j) c_row[j] += av * b_row[j];
          }
        }
      }
    }
  });
  return c;
}

}  // namespace evtc::reference
