// Weight layout for gated epilogues (SwiGLU and its family, `gate()`/`up()` in expressions).
//
// A gated kernel computes h = A @ B with 2·I output columns and combines each (gate, up)
// column pair into one of I output columns. It wants the pairs interleaved: column 2j of B
// is gate feature j and column 2j+1 is up feature j. Checkpoints usually store the two
// projections stacked instead, [W_gate; W_up]: these functions convert once, at load time.
//
// Layouts (of B as the GEMM sees it, K×2I):
//  - Layout::col_major: B is 2I×K with K contiguous, i.e. a PyTorch Linear weight W (2I, K)
//    used as x @ W.T. Stacked: rows [0, I) gate, rows [I, 2I) up. Interleaved: row 2j gate j,
//    row 2j+1 up j.
//  - Layout::row_major: B is K×2I with 2I contiguous. Stacked: columns [0, I) gate, [I, 2I) up.
//    Interleaved: column 2j gate j, column 2j+1 up j.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

#include "evtc/graph.hpp"

namespace evtc {

// Device memory, asynchronously on `stream` (device-to-device copies, no kernel launch,
// capturable in a CUDA graph). `stacked` and `interleaved` hold 2·inter·k elements of
// `dtype`, contiguous in the given layout, and must not overlap. Throws UserError for a bad
// size or pointer, RuntimeError for a CUDA failure.
void interleave_gate_up(const void* stacked, void* interleaved, int64_t inter, int64_t k,
                        DType dtype, Layout layout, cudaStream_t stream = nullptr);

// The same conversion on host memory.
void interleave_gate_up_host(const void* stacked, void* interleaved, int64_t inter, int64_t k,
                             DType dtype, Layout layout);

}  // namespace evtc
