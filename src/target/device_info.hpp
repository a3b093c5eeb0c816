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

}  // namespace evtc
