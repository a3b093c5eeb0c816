// The kernel compiler's public side: the compiler toolchain evtc found, the disk cache of compiled
// kernels (inspect, prune, clear), how many kernels compile at once, and interrupting compiles.
// What a program built on evtc needs to manage compiled kernels (the evtc command's `cache`,
// `fuzz` and signal handling); compiling itself happens behind evtc::Kernel.
#pragma once
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "evtc/error.hpp"

namespace evtc::jit {

// --- the toolchain ------------------------------------------------------------------------------

struct Toolchain {
  std::string nvcc;              // path of nvcc
  std::string nvcc_version;      // "13.0.88"
  std::string cutlass_include;   // folder holding cutlass/cutlass.h
  std::string cutlass_version;   // "4.2.0"
  std::string evtc_include;      // folder holding evtc/device/ops.cuh
};

// Finds nvcc (CUDACXX, CUDA_HOME/bin, PATH, the toolkit evtc was built with; 12.0 or newer),
// the CUTLASS headers (EVTC_CUTLASS_DIR, CUTLASS_DIR, set_cutlass_dir's folder, <datadir>/evtc/cutlass
// relative to the library, the build tree's, set_cutlass_fallback_dir's folder; refused unless
// CUTLASS EVTC_CUTLASS_SERIES) and evtc's
// device headers (EVTC_INCLUDE_DIR, include/ beside the library as in the Python package, the
// install's include folder relative to the library, the build tree's). Throws RuntimeError saying
// what to install or set. `need_cutlass` false skips CUTLASS (fallback kernels).
const Toolchain& toolchain(bool need_cutlass = true);
// The CUTLASS folder to use when EVTC_CUTLASS_DIR and CUTLASS_DIR are unset. Before the first
// compile.
void set_cutlass_dir(const std::string& dir);
// The CUTLASS folder to use when no other is found (the Python package sets that of the
// nvidia-cutlass package when it is installed). Before the first compile.
void set_cutlass_fallback_dir(const std::string& dir);

// --- compiles ---------------------------------------------------------------------------------

// How many CUTLASS kernels compile at once in this process (nvcc processes, whichever thread
// asks): EVTC_COMPILE_JOBS (0 to 1024; 0 or unset: the CPU count; anything else
// is a UserError naming the range). Plain epilogues (a second each) are
// not limited, so the unfused path never waits behind fused kernels.
int compile_slots();

// Interrupts, for a program that stops on SIGTERM/SIGINT by unwinding (the evtc command): its
// signal handler calls note_interrupt (async-signal-safe) while compiles_in_progress() > 0;
// waits for a compiler, a compile lock or a compile slot then throw Interrupted, so a compile's
// lock and folder are removed and its compiler stopped on the way out.
class Interrupted : public RuntimeError {
 public:
  using RuntimeError::RuntimeError;
};
void note_interrupt(int sig);
int interrupt_signal();  // the signal noted, or 0
// Compiles running in this process (CompileInProgress objects alive); async-signal-safe.
int compiles_in_progress();

// --- the disk cache ---------------------------------------------------------------------------

// The cache folder: EVTC_CACHE_DIR, default ~/.cache/evtc.
std::string cache_dir();

struct CacheStats {
  size_t entries = 0;  // folders holding a kernel.so
  size_t damaged = 0;  // of them, those whose kernel.so does not match entry.json
  size_t bytes = 0;
};
CacheStats cache_stats();

// One entry of the disk cache, as `evtc cache ls` shows it.
struct CacheEntry {
  std::string key, label, expression;
  size_t bytes = 0;                          // every file of the entry
  std::filesystem::file_time_type last_used;  // when a process last loaded it (or compiled it)
  bool intact = true;                         // kernel.so matches entry.json
};
// Entries, least recently used first. cache_stats, cache_entries, prune_cache and clear_cache
// throw RuntimeError naming the folder and the reason when the cache folder, or its kernels/
// (for clear_cache also failed/ and tmp/), exists but is not a readable folder; a cache folder
// that does not exist yet is an empty cache. A compile checks that every folder it writes
// (the cache folder, tmp/, locks/, kernels/) is a writable folder before nvcc runs.
std::vector<CacheEntry> cache_entries();
struct PruneResult {
  size_t removed = 0, bytes_freed = 0, failed = 0, kept = 0, kept_bytes = 0;
  std::string first_error;
};
// Removes entries not used for `unused_for` (when given), then least recently used ones until
// the cache holds at most `max_bytes` (when given). Removing an entry a process has loaded is
// safe: its mapping stays valid, and the next process compiles it again.
PruneResult prune_cache(std::optional<size_t> max_bytes, std::optional<std::chrono::seconds> unused_for);
// EVTC_CACHE_SIZE_LIMIT (bytes, or with a K/M/G/T suffix of powers of 1024; 0: none), default 10G:
// after each compile the cache is pruned to it, least recently used entries first.
std::optional<size_t> cache_size_limit();
// "10G", "512M", "123": bytes; throws UserError naming `what` on anything else.
size_t parse_size(const std::string& text, const std::string& what);
struct ClearResult {
  size_t removed = 0;  // entries removed
  size_t failed = 0;   // entries, failures or temporaries that could not be removed
  std::string first_error;
};
// Removes every entry and kept failure, and the temporaries of compiles whose process is gone
// (a compile in progress keeps its folder).
ClearResult clear_cache();

}  // namespace evtc::jit
