#include "target/device_info.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
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

int resident_cluster_ctas(int sm_count, int cluster_size) {
  if (cluster_size <= 1) return sm_count;
  // cudaOccupancyMaxActiveClusters on an H200, one CTA per multiprocessor (2026-11-29).
  if (sm_count == 132) {
    if (cluster_size >= 16) return 112;
    if (cluster_size >= 4) return 120;
  }
  return std::max(cluster_size, sm_count / cluster_size * cluster_size);
}

}  // namespace evtc
