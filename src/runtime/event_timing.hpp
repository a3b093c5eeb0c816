// Timing launches with CUDA events: the tuner's measurements and the benchmarks'.
#pragma once
#include <cuda_runtime_api.h>

#include <functional>

namespace evtc::runtime {

// Median time in milliseconds of `launch` on `stream`, each launch timed with its own pair
// of CUDA events after `warmup` untimed launches.
double median_ms(const std::function<void()>& launch, cudaStream_t stream, int warmup = 10,
                 int iterations = 50);

}  // namespace evtc::runtime
