// Reading evtc's environment switches (docs/backend.md, "Environment switches"): the one
// spelling of what a flag or a count accepts, for every module that reads one.
#pragma once
#include <cstddef>
#include <optional>
#include <string_view>

namespace evtc {

// Set, not empty and not "0".
bool env_flag(const char* name);
// A count from 0 to `max` (decimal digits only); nullopt when the variable is unset or empty.
// Anything else, a value past `max` included (never wrapped), is a UserError naming the
// variable, its value, the accepted range and what 0 means (`zero_means`, e.g. "no limit").
std::optional<size_t> env_count(const char* name, std::string_view zero_means, size_t max = 2147483647);

}  // namespace evtc
