#include "jit/environment.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "evtc/error.hpp"

namespace evtc {

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}

std::optional<size_t> env_count(const char* name, std::string_view zero_means) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end || n < 0) throw UserError(fmt::format("{}='{}': expected a count (0: {})", name, v, zero_means));
  return size_t(n);
}

}  // namespace evtc
