// Host-side encoding of values into the bit patterns a dtype stores on the device, and back.
// Used to upload test and benchmark inputs and to read outputs for checking.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "evtc/types.hpp"

namespace evtc::runtime {

// Rounds each value to `t` (round_to) and encodes it: dtype_bytes(t) bytes per value.
std::vector<uint8_t> encode(DType t, std::span<const double> values);
// Decodes `count` stored values of type `t`.
std::vector<double> decode(DType t, const void* data, size_t count);

}  // namespace evtc::runtime
