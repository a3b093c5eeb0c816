// An owned device buffer (the tuner's scratch outputs and workspaces, the test harnesses' operands).
#pragma once
#include <cstddef>

namespace evtc::runtime {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // cudaMalloc of `bytes` (at least 16); a RuntimeError names the CUDA error.
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace evtc::runtime
