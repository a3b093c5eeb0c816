// The kernel cache's compile flow and scheduler: a request's key, its compile into the cache
// (one process per key, through the entry lock; a bounded number at once in the process and
// on the machine), the in-process table of compiles, the background compile threads, and the
// loaded libraries. The cache's files are cache_files.cpp's, the compiler's invocation
// compiler.cpp's, the locks compile_locks.cpp's.
#include "jit/kernel_cache.hpp"

#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "evtc/error.hpp"
#include "jit/cache_internals.hpp"
#include "jit/kernel_library.hpp"
#include "jit/process.hpp"
#include "jit/toolchain.hpp"
#include "support/environment.hpp"
#include "support/logging.hpp"

namespace fs = std::filesystem;
namespace evtc::jit {

using namespace detail;

namespace {

struct CompileEvents {
  std::mutex mu;
  std::vector<CompileEvent> events;
};

CompileEvents& compile_event_log() {
  static CompileEvents e;
  return e;
}

void record_compile_event(const std::string& key, const std::string& label, const char* what, double seconds) {
  CompileEvents& e = compile_event_log();
  std::lock_guard lock(e.mu);
  e.events.push_back({key, label, what, seconds});
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The count of compile_slots() in use, and its wait.
struct SlotState {
  std::mutex mu;
  std::condition_variable freed;
  int in_use = 0;
};

SlotState& slot_state() {
  static SlotState s;
  return s;
}

// Holds one of compile_slots() while a CUTLASS kernel compiles.
class CompileSlot {
 public:
  CompileSlot() {
    SlotState& s = slot_state();
    std::unique_lock lock(s.mu);
    while (!s.freed.wait_for(lock, std::chrono::milliseconds(100), [&] { return s.in_use < compile_slots(); }))
      throw_if_interrupted();
    ++s.in_use;
  }
  ~CompileSlot() {
    SlotState& s = slot_state();
    {
      std::lock_guard lock(s.mu);
      --s.in_use;
    }
    s.freed.notify_one();
  }
  CompileSlot(const CompileSlot&) = delete;
  CompileSlot& operator=(const CompileSlot&) = delete;
};

std::string compile_into_cache(const CompileRequest& req, const std::string& key) {
  const CompileInProgress running;  // a signal now unwinds (jit/process.hpp, Interrupted)
  const Toolchain& tc = toolchain(req.needs_cutlass);
  const fs::path root = cache_dir();
  const fs::path final_dir = root / "kernels" / key;
  if (entry_intact(final_dir)) return (final_dir / "kernel.so").string();
  std::error_code exists_error;
  if (fs::exists(final_dir, exists_error)) remove_damaged_entry(final_dir, key);

  if (root.string().find('"') != std::string::npos)  // nvcc writes the source's path into the PTX
    throw RuntimeError(fmt::format("the kernel cache folder {} has a double quote in its path, which nvcc cannot "
                                   "compile in: set EVTC_CACHE_DIR to another folder",
                                   root.string()));
  // Every folder a compile writes, checked before nvcc runs (a kernels/ that is a file or
  // read-only was found only after the compile).
  for (const fs::path& dir : {root, root / "tmp", root / "locks", root / "kernels"})
    if (const std::string problem = folder_problem(dir, true, true); !problem.empty())
      throw RuntimeError(fmt::format("cannot use the kernel cache folder {}: {} (set EVTC_CACHE_DIR to a writable folder)",
                                     root.string(), problem));
  remove_stale_temporaries(root);

  // One process compiles a key; others (on this host or another sharing the folder) wait for
  // its entry.
  std::optional<EntryLock> lock;
  const auto wait_start = std::chrono::steady_clock::now();
  // Another process compiled the entry while this one waited for its lock.
  auto compiled_elsewhere = [&] {
    const double waited = seconds_since(wait_start);
    record_compile_event(key, req.label, "waited", waited);
    log_info("loaded {}, compiled by another process ({:.1f} s wait)", req.label, waited);
    return (final_dir / "kernel.so").string();
  };
  for (bool announced = false;;) {
    std::string holder;
    lock = EntryLock::try_acquire((root / "locks" / (key + ".lock")).string(), &holder);
    if (lock) break;
    if (entry_intact(final_dir)) return compiled_elsewhere();
    if (!announced)
      log_info("waiting for {}, which is compiling {} into the cache (its lock is taken over when older than "
               "EVTC_LOCK_TIMEOUT, {:g} s)",
               holder, req.label, lock_timeout_s());
    announced = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    throw_if_interrupted();
  }
  if (entry_intact(final_dir)) return compiled_elsewhere();  // finished while this process waited

  std::random_device rd;
  const fs::path tmp =
      root / "tmp" / fmt::format("{}-{}-{:08x}", key, static_cast<long>(getpid()), rd());
  fs::create_directories(tmp);
  // Until the compile folder is renamed (into kernels/ or failed/), an error removes it.
  struct RemoveUnlessKept {
    fs::path dir;
    bool keep = false;
    ~RemoveUnlessKept() {
      std::error_code ec;
      if (!keep && !env_flag(Env::keep_temporaries)) fs::remove_all(dir, ec);
    }
  } folder{tmp};
  write_file(tmp / "kernel.cu", req.source);
  compiler_run_count().fetch_add(1);
  const auto compile_start = std::chrono::steady_clock::now();
  std::optional<CompileSlot> slot;  // plain epilogues are not held back
  std::optional<MachineSlot> machine_slot;
  if (req.needs_cutlass) {
    slot.emplace();
    machine_slot.emplace(compile_slots(), machine_slot_dir(), [&] {
      log_info("{} kernel compiles are running on this machine; {} waits for one to finish", compile_slots(),
               req.label);
    });
  }
  log_info("compiling {} [{}]", req.label, key);
  CompilerRun run;
  if (req.in_parts && req.needs_cutlass) {
    run = compile_in_parts(req, tc, tmp);
  } else {
    std::vector<std::string> includes = {"-I" + tc.evtc_include};
    if (req.needs_cutlass) includes.insert(includes.begin(), "-I" + tc.cutlass_include);
    const auto argv = nvcc_argv(tc, kernel_flags(req.sm, req.needs_cutlass, req.backend), includes, "kernel.so", {"kernel.cu"});
    record_commands(tmp, {argv});
    run = run_compiler(argv, tmp / "compile.log", req.label, tmp);
  }
  slot.reset();
  if (const int rc = run.rc; rc != 0) {
    const fs::path failed = root / "failed" / key;
    std::error_code ec;
    fs::create_directories(failed.parent_path(), ec);
    fs::remove_all(failed, ec);
    fs::rename(tmp, failed, ec);
    const fs::path where = ec ? tmp : failed;
    folder.keep = true;  // the message names its files (removed with stale temporaries when in tmp/)
    throw RuntimeError(fmt::format(
        "nvcc failed (exit {}) compiling {}\n  source: {}\n  log: {}\nfirst errors:\n{}", rc,
        req.label, (where / "kernel.cu").string(), (where / "compile.log").string(),
        replace_all(first_errors(run.output, 8), tmp.string(), where.string())));
  }
  record_compile_event(key, req.label, "compiled", seconds_since(compile_start));
  log_info("compiled {} in {:.1f} s", req.label, seconds_since(compile_start));
  write_entry_record(tmp, req.label, req.expression);
  fsync_path(tmp / "kernel.so");
  std::error_code created;
  fs::create_directories(final_dir.parent_path(), created);
  for (int attempt = 0;; ++attempt) {
    std::error_code ec;
    fs::rename(tmp, final_dir, ec);
    if (!ec) break;
    const std::string reason = ec.message();
    // Another process finished the same key first: keep its entry if it is intact, else
    // replace it (once).
    if (entry_intact(final_dir) || attempt > 0) {
      if (!env_flag(Env::keep_temporaries)) fs::remove_all(tmp, ec);
      if (!entry_intact(final_dir))
        throw RuntimeError(fmt::format("cannot move the compiled kernel into {}: {}", final_dir.string(), reason));
      break;
    }
    remove_damaged_entry(final_dir, key);
  }
  if (const auto limit = cache_size_limit()) {
    const PruneResult pruned = prune_cache(limit, std::nullopt);
    if (pruned.removed > 0)
      log_info("removed {} least recently used kernels ({:.1f} MiB) to keep the cache under EVTC_CACHE_SIZE_LIMIT",
               pruned.removed, pruned.bytes_freed / 1048576.0);
  }
  return (final_dir / "kernel.so").string();
}

}  // namespace

Library::Library(const std::string& path) : path_(path) {
  handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) throw RuntimeError(fmt::format("cannot load {}: {}", path, dlerror()));
}

Library::~Library() {
  if (handle_) dlclose(handle_);
}

void* Library::symbol(const char* name) const {
  void* s = dlsym(handle_, name);
  if (!s) throw RuntimeError(fmt::format("{} does not export {}", path_, name));
  return s;
}

std::string cache_key(const CompileRequest& req) {
  return cache_key_for(req, toolchain(req.needs_cutlass).nvcc_version);
}

size_t compiler_runs() { return compiler_run_count().load(); }

std::vector<CompileEvent> compile_events() {
  CompileEvents& e = compile_event_log();
  std::lock_guard lock(e.mu);
  return e.events;
}

namespace {

// Compiles of this process by key: finished (a ready future) or in progress.
struct CompileTable {
  std::mutex mu;
  std::map<std::string, std::shared_future<std::string>> compiling;
};

CompileTable& compile_table() {
  static CompileTable t;
  return t;
}

// The threads compile_in_background runs on (at most compile_slots()). At exit, jobs not yet
// started are dropped (their futures report a broken promise) and running ones finish.
class BackgroundCompiler {
 public:
  // The state the jobs use is constructed first, so it is destroyed after the jobs end.
  BackgroundCompiler() { slot_state(); compile_table(); }
  ~BackgroundCompiler() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      jobs_.clear();
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  void submit(std::function<void()> job) {
    {
      std::lock_guard lock(mu_);
      jobs_.push_back(std::move(job));
      if (jobs_.size() > size_t(idle_) && threads_.size() < size_t(compile_slots()))
        threads_.emplace_back([this] { work(); });
    }
    cv_.notify_one();
  }

 private:
  void work() {
    std::unique_lock lock(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      --idle_;
      if (stopping_) return;
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  int idle_ = 0;
  bool stopping_ = false;
};

BackgroundCompiler& background_compiler() {
  static BackgroundCompiler b;
  return b;
}

}  // namespace

int compile_slots_from_env() {
  const size_t n = env_count(Env::compile_jobs, "the CPU count", max_compile_slots).value_or(0);
  return n > 0 ? int(n) : int(std::max(1u, std::thread::hardware_concurrency()));
}

int compile_slots() {
  static const int slots = compile_slots_from_env();
  return slots;
}

std::shared_future<std::string> compile_in_background(const CompileRequest& req) {
  if (auto path = library_kernel(req)) {
    std::promise<std::string> done;
    done.set_value(*path);
    return done.get_future().share();
  }
  compile_slots();  // a bad EVTC_COMPILE_JOBS fails here, before anything is queued
  const std::string key = cache_key(req);
  CompileTable& table = compile_table();
  auto promise = std::make_shared<std::promise<std::string>>();
  const std::shared_future<std::string> future = promise->get_future().share();
  {
    std::lock_guard lock(table.mu);
    if (auto it = table.compiling.find(key); it != table.compiling.end()) return it->second;
    table.compiling.emplace(key, future);
    std::error_code ec;
    const fs::path done = fs::path(cache_dir()) / "kernels" / key / "kernel.so";
    if (entry_intact(done.parent_path())) {
      promise->set_value(done.string());
      return future;
    }
  }
  background_compiler().submit([req, key, promise] {
    try {
      promise->set_value(compile_into_cache(req, key));
    } catch (...) {
      {
        CompileTable& t = compile_table();
        std::lock_guard lock(t.mu);
        t.compiling.erase(key);  // a later request may try again
      }
      promise->set_exception(std::current_exception());
    }
  });
  return future;
}

std::optional<std::string> compiled_kernel(const CompileRequest& req) {
  if (auto path = library_kernel(req)) return path;
  const fs::path dir = fs::path(cache_dir()) / "kernels" / cache_key(req);
  if (entry_intact(dir)) return (dir / "kernel.so").string();
  return std::nullopt;
}

std::string compile_cached(const CompileRequest& req) {
  if (auto path = library_kernel(req)) return *path;
  CompileTable& table = compile_table();
  auto& mu = table.mu;
  auto& compiling = table.compiling;
  const std::string key = cache_key(req);
  std::promise<std::string> promise;
  std::shared_future<std::string> pending;
  {
    std::lock_guard lock(mu);
    auto it = compiling.find(key);
    if (it != compiling.end()) pending = it->second;
    else compiling.emplace(key, promise.get_future().share());
  }
  if (pending.valid()) {  // compiled, or being compiled by another thread
    std::string path = pending.get();
    if (path.find("/kernels/") == std::string::npos || entry_intact(fs::path(path).parent_path())) {
      std::error_code ec;
      if (fs::exists(path, ec)) return path;
    }
    // The entry went away (cache cleared or moved) or was damaged: forget it and compile again.
    {
      std::lock_guard lock(mu);
      compiling.erase(key);
    }
    return compile_cached(req);
  }
  try {
    std::string path = compile_into_cache(req, key);
    promise.set_value(path);
    return path;
  } catch (...) {
    promise.set_exception(std::current_exception());
    std::lock_guard lock(mu);
    compiling.erase(key);  // a later call may try again (e.g. after fixing the environment)
    throw;
  }
}

std::shared_ptr<Library> load_or_compile(const CompileRequest& req) {
  const std::string path = compile_cached(req);
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<Library>> loaded;
  std::lock_guard lock(mu);
  auto& lib = loaded[path];
  if (!lib) {
    lib = std::make_shared<Library>(path);
    // Last use, for least-recently-used pruning: the entry record's time.
    std::error_code ec;
    const fs::path record = fs::path(path).parent_path() / "entry.json";
    if (fs::exists(record, ec)) fs::last_write_time(record, fs::file_time_type::clock::now(), ec);
  }
  return lib;
}

}  // namespace evtc::jit
