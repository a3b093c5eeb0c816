// Every environment variable evtc reads, in one table, and the one spelling of what a flag, a
// count or a text accepts (docs/backend.md, "Environment switches", lists the same names: a unit
// test checks the two agree, and that nothing else in the tree calls getenv).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace evtc {

enum class Env : uint8_t {
  // evtc's own switches
  arch,                 // EVTC_ARCH
  cache_dir,            // EVTC_CACHE_DIR
  cache_size_limit,     // EVTC_CACHE_SIZE_LIMIT
  compile_jobs,         // EVTC_COMPILE_JOBS
  cutlass_dir,          // EVTC_CUTLASS_DIR
  disable,              // EVTC_DISABLE
  include_dir,          // EVTC_INCLUDE_DIR
  keep_temporaries,     // EVTC_KEEP_TEMPORARIES
  kernel_library,       // EVTC_KERNEL_LIBRARY
  lock_timeout,         // EVTC_LOCK_TIMEOUT
  log,                  // EVTC_LOG
  machine_slot_dir,     // EVTC_MACHINE_SLOT_DIR
  record_kernels,       // EVTC_RECORD_KERNELS
  tune,                 // EVTC_TUNE
  tune_max_candidates,  // EVTC_TUNE_MAX_CANDIDATES
  wait_for_compile,     // EVTC_WAIT_FOR_COMPILE
  // other tools' variables evtc honours
  cutlass_dir_plain,    // CUTLASS_DIR
  cudacxx,              // CUDACXX
  cuda_home,            // CUDA_HOME
  cuda_path,            // CUDA_PATH
  // the system's
  path,                 // PATH
  home,                 // HOME
  xdg_cache_home,       // XDG_CACHE_HOME
};

struct EnvVariable {
  Env id;
  std::string_view name;
  // Listed in docs/backend.md's "Environment switches" (the system's PATH, HOME and
  // XDG_CACHE_HOME are not).
  bool documented;
};
// The table, in Env's order.
std::span<const EnvVariable> env_variables();
std::string_view env_name(Env e);

// The value when set and not empty.
std::optional<std::string> env_text(Env e);
// Set, not empty and not "0".
bool env_flag(Env e);
// A count from 0 to `max` (decimal digits only); nullopt when the variable is unset or empty.
// Anything else, a value past `max` included (never wrapped), is a UserError naming the
// variable, its value, the accepted range and what 0 means (`zero_means`, e.g. "no limit").
std::optional<size_t> env_count(Env e, std::string_view zero_means, size_t max = 2147483647);

}  // namespace evtc
