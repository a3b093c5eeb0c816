#include "runtime/device_buffer.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "runtime/cuda_check.hpp"

namespace evtc::runtime {

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  cuda_check(cudaMalloc(&ptr_, std::max<size_t>(bytes, 16)), "cudaMalloc");
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
  }
  return *this;
}

}  // namespace evtc::runtime
