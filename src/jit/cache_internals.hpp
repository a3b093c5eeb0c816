// What the kernel cache's parts share (jit/kernel_cache.hpp is the cache's interface): its
// files and their integrity (cache_files.cpp), the compiler's invocation (compiler.cpp) and the
// cross-process locks (compile_locks.cpp, declared in kernel_cache.hpp), used by the compile
// flow and its scheduler (kernel_cache.cpp).
#pragma once
#include <atomic>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "jit/kernel_cache.hpp"
#include "jit/toolchain.hpp"

namespace evtc::jit::detail {

namespace fs = std::filesystem;

// --- files (cache_files.cpp) ----------------------------------------------------------------
std::string read_file(const fs::path& p);
// Throws RuntimeError naming the file and the system's reason ("No space left on device").
void write_file(const fs::path& p, const std::string& text);
void fsync_path(const fs::path& p);
// Why `dir` (the cache folder or one of its folders) cannot be used, or "" when it can. One that
// does not exist is created with `create` and is fine without (nothing is cached there yet);
// `write`: it must also be writable.
std::string folder_problem(const fs::path& dir, bool create, bool write);
// An entry's record (entry.json: kernel.so's size and XXH3 checksum, its label and expression).
void write_entry_record(const fs::path& dir, const std::string& label, const std::string& expression);
// Whether the entry folder holds a kernel.so that matches its entry.json.
bool entry_intact(const fs::path& dir);
// Moves a damaged or incomplete entry out of the way, saying so once.
void remove_damaged_entry(const fs::path& dir, const std::string& key);
bool process_alive(long pid);
// Removes tmp/ folders whose process is gone (a killed compile, a full disk), once per process.
void remove_stale_temporaries(const fs::path& root);

// --- the compiler (compiler.cpp) ------------------------------------------------------------
struct CompilerRun {
  int rc = 0;
  std::string output;  // what the compiler printed
};
// Runs argv in `cwd`, keeping what it prints (also in `log` when named); see compiler.cpp.
CompilerRun run_compiler(const std::vector<std::string>& argv, const std::optional<fs::path>& log,
                         const std::string& label, const fs::path& cwd, bool show_progress = true);
// The first lines of a compile log that say what failed (or its tail), indented.
std::string first_errors(const std::string& log, size_t max_lines);
std::string replace_all(std::string s, const std::string& from, const std::string& to);
// nvcc with `flags` and `includes`, writing `out` from `inputs` (names in the compile's folder).
std::vector<std::string> nvcc_argv(const Toolchain& tc, const std::vector<std::string>& flags,
                                   const std::vector<std::string>& includes, const std::string& out,
                                   const std::vector<std::string>& inputs);
// Writes a compile's command lines into its command.txt, and prints them when EVTC_LOG=debug.
void record_commands(const fs::path& tmp, const std::vector<std::vector<std::string>>& commands);
// CompileRequest::in_parts: the device and host parts in parallel, then the link.
CompilerRun compile_in_parts(const CompileRequest& req, const Toolchain& tc, const fs::path& tmp);
// How many compilers this process has started.
std::atomic<size_t>& compiler_run_count();

// --- locks (compile_locks.cpp) --------------------------------------------------------------
// EVTC_LOCK_TIMEOUT, in seconds (default 1800).
double lock_timeout_s();

}  // namespace evtc::jit::detail
