#include "runtime/stream_workspaces.hpp"

#include <algorithm>

#include "runtime/cuda_check.hpp"

namespace evtc {

using runtime::cuda_check;

StreamWorkspaces::Lease::~Lease() {
  // Stream-ordered: released after the call that used it, within the graph being captured.
  if (graph_owned_ && ptr_) cudaFreeAsync(ptr_, stream_);
}

StreamWorkspaces::Lease StreamWorkspaces::lease(cudaStream_t stream, size_t bytes, bool captured) {
  if (bytes == 0) return Lease(nullptr, stream, false);
  if (!captured) return Lease(get(stream, bytes), stream, false);
  void* ptr = nullptr;
  cuda_check(cudaMallocAsync(&ptr, bytes, stream), "workspace allocation");
  return Lease(ptr, stream, true);
}

StreamWorkspaces::~StreamWorkspaces() {
  // cudaFree waits for the work that still uses them.
  for (const Entry& e : entries_) cudaFree(e.ptr);
}

void* StreamWorkspaces::get(cudaStream_t stream, size_t bytes) {
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  // 0, cudaStreamLegacy, cudaStreamPerThread: possibly a different stream in each thread.
  const bool per_thread = reinterpret_cast<uintptr_t>(stream) <= 2;
  const std::thread::id thread = per_thread ? std::this_thread::get_id() : std::thread::id();
  std::lock_guard lock(mu_);
  Entry* entry = nullptr;
  for (Entry& e : entries_)
    if (e.stream == stream && e.device == device && e.thread == thread) entry = &e;
  if (!entry) {
    if (entries_.size() >= kMaxEntries) {
      // Drop the least recently used stream's workspace (cudaFree waits for its work).
      auto oldest = std::min_element(entries_.begin(), entries_.end(),
                                     [](const Entry& a, const Entry& b) { return a.last_use < b.last_use; });
      cudaFree(oldest->ptr);
      entries_.erase(oldest);
    }
    entries_.push_back({stream, device, thread, nullptr, 0, 0});
    entry = &entries_.back();
  }
  entry->last_use = ++uses_;
  if (entry->bytes < bytes) {
    // Stream-ordered: the old buffer is released after the stream's earlier calls used it.
    if (entry->ptr) cudaFreeAsync(entry->ptr, stream);
    entry->ptr = nullptr;
    entry->bytes = 0;
    cuda_check(cudaMallocAsync(&entry->ptr, bytes, stream), "workspace allocation");
    entry->bytes = bytes;
  }
  return entry->ptr;
}

}  // namespace evtc
