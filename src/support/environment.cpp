#include "support/environment.hpp"

#include <fmt/format.h>

#include <array>
#include <charconv>
#include <cstdlib>

#include "evtc/error.hpp"

namespace evtc {

namespace {

constexpr std::array kVariables = {
    EnvVariable{Env::arch, "EVTC_ARCH", true},
    EnvVariable{Env::cache_dir, "EVTC_CACHE_DIR", true},
    EnvVariable{Env::cache_size_limit, "EVTC_CACHE_SIZE_LIMIT", true},
    EnvVariable{Env::compile_jobs, "EVTC_COMPILE_JOBS", true},
    EnvVariable{Env::cutlass_dir, "EVTC_CUTLASS_DIR", true},
    EnvVariable{Env::disable, "EVTC_DISABLE", true},
    EnvVariable{Env::include_dir, "EVTC_INCLUDE_DIR", true},
    EnvVariable{Env::keep_temporaries, "EVTC_KEEP_TEMPORARIES", true},
    EnvVariable{Env::kernel_library, "EVTC_KERNEL_LIBRARY", true},
    EnvVariable{Env::lock_timeout, "EVTC_LOCK_TIMEOUT", true},
    EnvVariable{Env::log, "EVTC_LOG", true},
    EnvVariable{Env::machine_slot_dir, "EVTC_MACHINE_SLOT_DIR", true},
    EnvVariable{Env::record_kernels, "EVTC_RECORD_KERNELS", true},
    EnvVariable{Env::tune, "EVTC_TUNE", true},
    EnvVariable{Env::tune_max_candidates, "EVTC_TUNE_MAX_CANDIDATES", true},
    EnvVariable{Env::wait_for_compile, "EVTC_WAIT_FOR_COMPILE", true},
    EnvVariable{Env::cutlass_dir_plain, "CUTLASS_DIR", true},
    EnvVariable{Env::cudacxx, "CUDACXX", true},
    EnvVariable{Env::cuda_home, "CUDA_HOME", true},
    EnvVariable{Env::cuda_path, "CUDA_PATH", true},
    EnvVariable{Env::path, "PATH", false},
    EnvVariable{Env::home, "HOME", false},
    EnvVariable{Env::xdg_cache_home, "XDG_CACHE_HOME", false},
};

constexpr bool in_enum_order() {
  for (size_t i = 0; i < kVariables.size(); ++i)
    if (size_t(kVariables[i].id) != i) return false;
  return true;
}
static_assert(in_enum_order(), "kVariables lists every Env in the enum's order");

}  // namespace

std::span<const EnvVariable> env_variables() { return kVariables; }

std::string_view env_name(Env e) { return kVariables[size_t(e)].name; }

std::optional<std::string> env_text(Env e) {
  const char* v = std::getenv(kVariables[size_t(e)].name.data());
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

bool env_flag(Env e) {
  const auto v = env_text(e);
  return v && *v != "0";
}

std::optional<size_t> env_count(Env e, std::string_view zero_means, size_t max) {
  const auto v = env_text(e);
  if (!v) return std::nullopt;
  unsigned long long n = 0;
  const auto [end, error] = std::from_chars(v->data(), v->data() + v->size(), n);
  if (error != std::errc() || end != v->data() + v->size() || n > max)
    throw UserError(fmt::format("{}='{}': expected a count from 0 to {} (0: {})", env_name(e), *v, max, zero_means));
  return size_t(n);
}

}  // namespace evtc
