#include "reference/parallel.hpp"

#include <algorithm>
#include <thread>
#include <vector>

namespace evtc::reference {

namespace {
// Below this many elementary operations, starting threads costs more than it saves.
constexpr int64_t kMinParallelWork = int64_t{1} << 18;
}  // namespace

void for_row_blocks(int64_t rows, int64_t cost_per_row,
                    const std::function<void(int64_t, int64_t)>& body) {
  if (rows <= 0) return;
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t work = rows * std::max<int64_t>(1, cost_per_row);
  const int64_t threads = work < kMinParallelWork ? 1 : std::min(hw, rows);
  if (threads == 1) {
    body(0, rows);
    return;
  }
  const int64_t block = (rows + threads - 1) / threads;
  std::vector<std::jthread> workers;
  workers.reserve(static_cast<size_t>(threads));
  for (int64_t begin = 0; begin < rows; begin += block)
    workers.emplace_back([&body, begin, end = std::min(rows, begin + block)] { body(begin, end); });
  // The jthreads join as `workers` goes out of scope.
}

}  // namespace evtc::reference
