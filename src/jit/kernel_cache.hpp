// Compiles generated CUDA sources into shared libraries, caches them on disk and in the
// process, and loads them.
//
// Disk layout under $EVTC_CACHE_DIR (default ~/.cache/evtc):
//   kernels/<key>/kernel.cu, kernel.so, entry.json, compile.log, command.txt   a finished entry
//                (entry.json: kernel.so's size and XXH3 checksum, verified before it is used;
//                 a damaged or incomplete entry is replaced by a new compile)
//   failed/<key>/...                                               the last failed compile
//   tmp/<key>-<pid>-<random>                                       compiles in progress (those of
//                dead processes are removed at the next compile)
// The key hashes the source (which names the graph hash, kernel config and arch), the
// compile flags, the nvcc and CUTLASS versions and evtc's device headers. A compile writes
// into a fresh folder under tmp/ and renames it into kernels/ when complete, so a crash or
// a concurrent process never leaves a half entry: if another process finished the same key
// first, its entry is kept and ours dropped.
#pragma once
#include "evtc/jit.hpp"
#include "evtc/kernel_library.hpp"
#include <chrono>
#include <filesystem>
#include <vector>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>

namespace evtc::jit {

class Library {
 public:
  explicit Library(const std::string& path);
  ~Library();
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  // Looks a symbol up; throws RuntimeError naming the library when it is missing.
  void* symbol(const char* name) const;
  const std::string& path() const { return path_; }

 private:
  void* handle_;
  std::string path_;
};

struct CompileRequest {
  std::string source;
  std::string label;          // shown in progress lines, e.g. the kernel config name
  std::string expression;     // the epilogue (expression_text), recorded in the entry; not in the key
  bool needs_cutlass = true;  // fused kernels; false for plain CUDA fallback epilogues
  int sm = 90;
  // The fused kernel's backend when it is not `sm`'s own (ArchFeatures::backend; sm_120's
  // 16-bit kernels are the sm_80 backend's); 0 = `sm`'s own. It picks nvcc's code target.
  int backend = 0;
  // Compile the source as two parts in parallel, the kernel alone into a cubin (EVTC_PART=1)
  // and the host code (EVTC_PART=2), then link them into one library: the host half
  // (template instantiation on the host, the host compiler) no longer adds to the device
  // half's time. For sources written for it (dense CUTLASS kernels).
  bool in_parts = false;
};

// Returns the path of the compiled library for the request: from a registered kernel library
// (jit/kernel_library.hpp) if one has it, else the disk cache, compiling it if that does not
// have it. Needs no GPU. Thread-safe: concurrent requests for one key compile it once.
std::string compile_cached(const CompileRequest& request);
// The compiled library's path when a kernel library or the disk cache holds it (no compile).
std::optional<std::string> compiled_kernel(const CompileRequest& request);
// Starts compiling the request on one of evtc's background compile threads (or finds it
// compiled: in the disk cache, or by an earlier call) and returns the library path's future;
// get() rethrows a compile error. Shares compile_cached's in-process table, so a kernel being
// compiled by a compile_cached call elsewhere is not compiled twice.
std::shared_future<std::string> compile_in_background(const CompileRequest& request);
// The lock of one cache entry while a process compiles it: the file locks/<key>.lock, created
// exclusively (O_CREAT | O_EXCL, which local disks and NFS honour) and holding "host pid", so
// that processes needing one kernel (torchrun ranks, replicas sharing a network cache) run one
// nvcc and the others wait for the entry. A lock is stale, and is taken over, when it is older
// than EVTC_LOCK_TIMEOUT seconds (default 1800), whoever holds it; and sooner when its owner is
// on this host and no longer runs, or runs but started after the lock was written (a reused
// pid), or is this process's pid but not a lock this process holds (a restarted container with
// a persistent cache); or when the file does not read "host pid" (an owner that died before
// writing it, random bytes) and is older than 10 s (or EVTC_LOCK_TIMEOUT, if shorter). So every
// wait for a lock ends. Released (the file removed) on destruction.
class EntryLock {
 public:
  // The lock, or nullopt while another live process holds it (`holder` then names it).
  static std::optional<EntryLock> try_acquire(const std::string& path, std::string* holder = nullptr);
  ~EntryLock();
  EntryLock(EntryLock&& o) noexcept;
  EntryLock& operator=(EntryLock&& o) noexcept;
  EntryLock(const EntryLock&) = delete;
  EntryLock& operator=(const EntryLock&) = delete;

 private:
  explicit EntryLock(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// One of `slots` kernel compiles on this machine, across processes: an flock on one of the files
// slot-0 ... slot-(slots-1) in `dir` (released when the holder closes it or dies). Waits for a
// free one, calling on_wait once if it has to. Every CUTLASS compile holds one
// (compile_slots() of them, in machine_slot_dir()), so N processes run at most EVTC_COMPILE_JOBS
// heavy nvcc compiles together, not N times as many.
class MachineSlot {
 public:
  MachineSlot(int slots, const std::string& dir, const std::function<void()>& on_wait = {});
  ~MachineSlot();
  MachineSlot(const MachineSlot&) = delete;
  MachineSlot& operator=(const MachineSlot&) = delete;

 private:
  int fd_ = -1;
};
// EVTC_MACHINE_SLOT_DIR, default <temp>/evtc-compile-slots-<uid> (a local folder: the cap is per machine).
std::string machine_slot_dir();

// The most EVTC_COMPILE_JOBS accepts (each slot is a thread and a file in machine_slot_dir()).
inline constexpr size_t max_compile_slots = 1024;
// compile_slots' value, read from the environment now (compile_slots reads it once).
int compile_slots_from_env();
// How many nvcc processes this process has started.
size_t compiler_runs();
// The kernels this process compiled, or waited for another process to compile (evtc::compile_events).
std::vector<CompileEvent> compile_events();
// compile_cached, then loads the library (once per process and path).
std::shared_ptr<Library> load_or_compile(const CompileRequest& request);

// Writes `text` to `path` through a temporary file in the same folder renamed over it, so a
// reader sees the old file or the new one, never half of one. RuntimeError naming `path`.
void write_file_atomically(const std::string& path, const std::string& text);

// The cache key a request maps to (16 hex digits); needs nvcc (its version is part of it).
std::string cache_key(const CompileRequest& request);

}  // namespace evtc::jit
