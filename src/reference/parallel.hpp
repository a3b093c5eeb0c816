// Row-parallel loops for the reference interpreter.
#pragma once
#include <cstdint>
#include <functional>

namespace evtc::reference {

// Calls body(begin, end) on contiguous blocks covering [0, rows), one block per hardware
// thread (std::jthread), or once on the calling thread when rows * cost_per_row is too
// small to pay for starting threads. Blocks are disjoint, so a body that writes only its
// own rows needs no synchronisation, and results never depend on the number of threads.
void for_row_blocks(int64_t rows, int64_t cost_per_row,
                    const std::function<void(int64_t begin, int64_t end)>& body);

}  // namespace evtc::reference
