#pragma once
// Device workspaces kept between a kernel's calls, one per stream.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace evtc {

// Workspaces of the fused paths (dense and grouped kernels), one per stream (and device),
// kept between calls so that a call does not allocate: calls on one stream run in order, so
// they can share one; calls on different streams each have their own. Streams 0,
// cudaStreamLegacy and cudaStreamPerThread name a different stream in each thread under
// per-thread default streams, so those are kept per thread too. Calls being captured into a
// CUDA graph do not use these (the graph would outlive or race with them): they allocate
// stream-ordered memory that the graph owns. Thread-safe.
class StreamWorkspaces {
 public:
  StreamWorkspaces() = default;
  StreamWorkspaces(const StreamWorkspaces&) = delete;
  StreamWorkspaces& operator=(const StreamWorkspaces&) = delete;
  ~StreamWorkspaces();
  // At least `bytes` of device memory for work on `stream` of the current device.
  void* get(cudaStream_t stream, size_t bytes);
  static constexpr size_t kMaxEntries = 16;

 private:
  struct Entry {
    cudaStream_t stream = nullptr;
    int device = -1;
    std::thread::id thread;
    void* ptr = nullptr;
    size_t bytes = 0;
    uint64_t last_use = 0;
  };
  std::mutex mu_;
  std::vector<Entry> entries_;
  uint64_t uses_ = 0;
};

}  // namespace evtc
