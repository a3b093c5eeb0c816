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
#include <optional>
#include <span>
#include <vector>

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

// Whether two strided views of one buffer already are the gate and up halves of an
// interleaved tensor, so that a gated kernel can read the buffer itself instead of a copy.
// The views must have the same sizes and strides, `up` must start where `gate`'s element 0
// plus one interleave step is, and along `dim` each half must step over the other's element:
// gate = merged.slice(dim, 0, 2n, 2) and up = merged.slice(dim, 1, 2n, 2). Offsets and strides
// are in elements; the caller checks that both views are of the same storage. Returns the
// merged tensor's strides (its sizes are `sizes` with dimension `dim` doubled), or nullopt,
// also where the merged tensor's last dimension is not contiguous (gated kernels read B as
// N × K with K contiguous, and row operands as contiguous vectors).
// One rule for the PyTorch ops (at run time) and the FX pass (on the traced values).
std::optional<std::vector<int64_t>> interleaved_strides(std::span<const int64_t> sizes,
                                                        std::span<const int64_t> gate_strides,
                                                        int64_t gate_offset,
                                                        std::span<const int64_t> up_strides,
                                                        int64_t up_offset, int64_t dim);

}  // namespace evtc
