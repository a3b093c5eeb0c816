// What every backend's emitter returns: the generated translation unit and the operand signature
// of its C ABI (include/evtc/device/abi.h).
#pragma once
#include <string>

#include "evtc/kernel_config.hpp"

namespace evtc::backend {

struct EmittedKernel {
  std::string source;  // the .cu file
  KernelSignature signature;
};

}  // namespace evtc::backend
