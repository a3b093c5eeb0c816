#include "runtime/event_timing.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "evtc/error.hpp"
#include "runtime/cuda_check.hpp"

namespace evtc::runtime {

double median_ms(const std::function<void()>& launch, cudaStream_t stream, int warmup,
                 int iterations) {
  for (int i = 0; i < warmup; ++i) launch();
  cuda_check(cudaStreamSynchronize(stream), "warm-up");
  std::vector<cudaEvent_t> events(2 * iterations);
  for (auto& e : events) cuda_check(cudaEventCreate(&e), "cudaEventCreate");
  for (int i = 0; i < iterations; ++i) {
    cuda_check(cudaEventRecord(events[2 * i], stream), "cudaEventRecord");
    launch();
    cuda_check(cudaEventRecord(events[2 * i + 1], stream), "cudaEventRecord");
  }
  cuda_check(cudaStreamSynchronize(stream), "timed runs");
  std::vector<float> ms(iterations);
  for (int i = 0; i < iterations; ++i)
    cuda_check(cudaEventElapsedTime(&ms[i], events[2 * i], events[2 * i + 1]), "cudaEventElapsedTime");
  for (auto& e : events) cudaEventDestroy(e);
  std::nth_element(ms.begin(), ms.begin() + iterations / 2, ms.end());
  return ms[iterations / 2];
}

}  // namespace evtc::runtime
