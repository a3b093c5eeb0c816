// Host-side helpers of evtc's generated kernel libraries, dense and grouped alike: one copy,
// included by the generated sources (which the kernel cache keys on, with every header here).
#ifndef EVTC_DEVICE_HOST_SUPPORT_H
#define EVTC_DEVICE_HOST_SUPPORT_H

#include <cuda_runtime_api.h>
#include <cutlass/kernel_hardware_info.h>

#include <cstddef>
#include <cstring>

namespace evtc::device {

// The current device's multiprocessor count. Cached per thread, since threads may use different
// devices; the lookup runs again when the thread's device changes.
inline int sm_count_of_current_device() {
  int device = 0;
  cudaGetDevice(&device);
  thread_local int cached_device = -1;
  thread_local int cached_count = 0;
  if (device != cached_device) {
    cached_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
    cached_device = device;
  }
  return cached_count;
}

// Writes `text` into the caller's reason buffer of `size` bytes, truncated and NUL-terminated.
inline void set_reason(char* why, size_t size, const char* text) {
  if (why && size) {
    std::strncpy(why, text, size - 1);
    why[size - 1] = '\0';
  }
}

}  // namespace evtc::device

#endif  // EVTC_DEVICE_HOST_SUPPORT_H
