#include "evtc/log.hpp"
#include "support/environment.hpp"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace evtc {
namespace {

constexpr std::array<std::string_view, 4> kNames = {"error", "warning", "info", "debug"};

// -1: not set by set_log_level (EVTC_LOG decides).
std::atomic<int>& level_override() {
  static std::atomic<int> level{-1};
  return level;
}

std::atomic<int>& default_level() {
  static std::atomic<int> level{int(LogLevel::info)};
  return level;
}

void write_line(const std::string& line) {
  static std::mutex mu;
  std::lock_guard lock(mu);
  // One write per line, so lines of several threads and processes do not interleave.
  const ssize_t ignored = ::write(2, line.data(), line.size());
  (void)ignored;
}

}  // namespace

std::optional<LogLevel> parse_log_level(std::string_view name) {
  for (size_t i = 0; i < kNames.size(); ++i)
    if (name == kNames[i]) return LogLevel(i);
  return std::nullopt;
}

std::string_view log_level_name(LogLevel level) { return kNames.at(size_t(level)); }

const std::vector<std::string>& log_level_names() {
  static const std::vector<std::string> names(kNames.begin(), kNames.end());
  return names;
}

LogLevel log_level() {
  if (const int set = level_override().load(); set >= 0) return LogLevel(set);
  const auto v = env_text(Env::log);
  const LogLevel fallback = LogLevel(default_level().load());
  if (!v) return fallback;
  if (auto level = parse_log_level(*v)) return *level;
  static std::once_flag said;
  std::call_once(said, [&] {
    write_line(std::string("evtc: EVTC_LOG='") + *v + "' is not a level (error, warning, info, debug): using " +
               std::string(log_level_name(fallback)) + "\n");
  });
  return fallback;
}

void set_log_level(LogLevel level) { level_override().store(int(level)); }

void set_default_log_level(LogLevel level) { default_level().store(int(level)); }

void reset_log_level() { level_override().store(-1); }

std::string_view version() { return EVTC_VERSION; }

bool log_enabled(LogLevel level) { return int(level) <= int(log_level()); }

void log(LogLevel level, std::string_view message) {
  if (!log_enabled(level)) return;
  std::string line = "evtc: ";
  line += message;
  if (line.back() != '\n') line += '\n';
  write_line(line);
}

}  // namespace evtc
