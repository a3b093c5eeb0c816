#include "target/device_info.hpp"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>

namespace evtc {

std::optional<DeviceInfo> current_device() {
  static std::mutex mu;
  static std::map<int, std::optional<DeviceInfo>> known;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return std::nullopt;
  }
  std::lock_guard lock(mu);
  if (auto it = known.find(device); it != known.end()) return it->second;
  cudaDeviceProp p{};
  std::optional<DeviceInfo> info;
  if (cudaGetDeviceProperties(&p, device) == cudaSuccess)
    info = DeviceInfo{p.name, p.major * 10 + p.minor, p.multiProcessorCount};
  else
    cudaGetLastError();
  known[device] = info;
  return info;
}

}  // namespace evtc
