// Formatting front ends of evtc::log (include/evtc/log.hpp) for the library's own messages.
#pragma once
#include <fmt/format.h>

#include <utility>

#include "evtc/log.hpp"

namespace evtc {

template <class... Args>
void log_at(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (log_enabled(level)) log(level, fmt::format(format, std::forward<Args>(args)...));
}
template <class... Args>
void log_warning(fmt::format_string<Args...> format, Args&&... args) {
  log_at(LogLevel::warning, format, std::forward<Args>(args)...);
}
template <class... Args>
void log_info(fmt::format_string<Args...> format, Args&&... args) {
  log_at(LogLevel::info, format, std::forward<Args>(args)...);
}
template <class... Args>
void log_debug(fmt::format_string<Args...> format, Args&&... args) {
  log_at(LogLevel::debug, format, std::forward<Args>(args)...);
}

}  // namespace evtc
