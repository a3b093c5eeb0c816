#include "support/environment.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <string>

#include "evtc/error.hpp"

namespace evtc {

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}

std::optional<size_t> env_count(const char* name, std::string_view zero_means, size_t max) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  const std::string_view text(v);
  unsigned long long n = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (error != std::errc() || end != text.data() + text.size() || n > max)
    throw UserError(fmt::format("{}='{}': expected a count from 0 to {} (0: {})", name, v, max, zero_means));
  return size_t(n);
}

}  // namespace evtc
