// The current CUDA device as the runtime's choices see it (configuration, tuning, cost).
#pragma once
#include <optional>
#include <string>

namespace evtc {

struct DeviceInfo {
  std::string name;
  int arch = 0;  // 90 for sm_90
  int sm_count = 0;
};

// The current device's name, arch and multiprocessor count (queried once per device);
// nullopt without a usable device.
std::optional<DeviceInfo> current_device();

// CTAs resident at once in clusters of `cluster_size` CTAs, one CTA per multiprocessor: the
// persistent grid of a kernel in such clusters (the fused kernels launch as many clusters as
// cudaOccupancyMaxActiveClusters reports). Whole clusters fit in a GPC, so where the GPCs'
// multiprocessor counts are no multiple of the size this is below sm_count / size × size:
// measured on the H200 (132 multiprocessors), 132 in clusters of 2, 120 in clusters of 4 and
// of 8, 112 in clusters of 16. Other multiprocessor counts: whole clusters of the count.
int resident_cluster_ctas(int sm_count, int cluster_size);

}  // namespace evtc
