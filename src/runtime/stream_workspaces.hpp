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
// CUDA graph do not use these (the graph would outlive or race with them): their lease is
// stream-ordered memory that the graph owns. Thread-safe.
class StreamWorkspaces {
 public:
  // One call's workspace: the stream's kept one, or (under capture) memory allocated in the
  // stream's order and released in it when the lease ends, so that the graph owns both.
  class Lease {
   public:
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();
    void* get() const { return ptr_; }

   private:
    friend class StreamWorkspaces;
    Lease(void* ptr, cudaStream_t stream, bool graph_owned) : ptr_(ptr), stream_(stream), graph_owned_(graph_owned) {}
    void* ptr_;
    cudaStream_t stream_;
    bool graph_owned_;
  };

  StreamWorkspaces() = default;
  StreamWorkspaces(const StreamWorkspaces&) = delete;
  StreamWorkspaces& operator=(const StreamWorkspaces&) = delete;
  ~StreamWorkspaces();
  // At least `bytes` of device memory for one call on `stream` of the current device, which
  // `captured` says is being captured into a CUDA graph. No memory (nullptr) for 0 bytes.
  Lease lease(cudaStream_t stream, size_t bytes, bool captured);
  static constexpr size_t kMaxEntries = 16;

 private:
  // At least `bytes` of device memory for work on `stream` of the current device, kept.
  void* get(cudaStream_t stream, size_t bytes);
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
