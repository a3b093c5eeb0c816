#include "jit/kernel_cache.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "evtc/error.hpp"
#include "support/environment.hpp"
#include "support/logging.hpp"
#include "jit/process.hpp"
#include "jit/kernel_library.hpp"
#include <nlohmann/json.hpp>
#include "jit/toolchain.hpp"

namespace fs = std::filesystem;

namespace evtc::jit {
namespace {


std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Throws RuntimeError naming the file and the system's reason ("No space left on device").
void write_file(const fs::path& p, const std::string& text) {
  FILE* f = std::fopen(p.c_str(), "wb");
  if (!f) throw RuntimeError(fmt::format("cannot write {}: {}", p.string(), std::strerror(errno)));
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0;
  const int error = errno;
  if (std::fclose(f) != 0 || !written)
    throw RuntimeError(fmt::format("cannot write {}: {}", p.string(), std::strerror(written ? errno : error)));
}

void fsync_path(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}


// Why `dir` (the cache folder or one of its folders) cannot be used, or "" when it can. One that
// does not exist is created with `create` and is fine without (nothing is cached there yet);
// `write`: it must also be writable.
std::string folder_problem(const fs::path& dir, bool create, bool write) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (st.type() == fs::file_type::not_found) {
    if (!create) return {};
    fs::create_directories(dir, ec);
    return ec ? fmt::format("cannot create {}: {}", dir.string(), ec.message()) : std::string();
  }
  if (ec) return fmt::format("{}: {}", dir.string(), ec.message());
  if (st.type() != fs::file_type::directory) return fmt::format("{} is not a folder", dir.string());
  if (::access(dir.c_str(), (write ? W_OK : R_OK) | X_OK) != 0)
    return fmt::format("{}: {}", dir.string(), std::strerror(errno));
  return {};
}

// Throws RuntimeError naming the cache folder, the first of its folders `subs` that cannot be
// read and the reason. A cache folder that does not exist is an empty cache.
void check_cache_readable(const fs::path& root, std::initializer_list<const char*> subs) {
  std::string problem = folder_problem(root, false, false);
  for (auto sub = subs.begin(); problem.empty() && sub != subs.end(); ++sub)
    problem = folder_problem(root / *sub, false, false);
  if (!problem.empty())
    throw RuntimeError(fmt::format("cannot read the kernel cache folder {}: {} (set EVTC_CACHE_DIR to another folder)",
                                   root.string(), problem));
}

// --- entry integrity ---------------------------------------------------------------------
// A finished entry holds entry.json with its kernel.so's size and XXH3 checksum, written before
// the entry is renamed into place. An entry is used only when its kernel.so matches: checked
// once per process and file state (size, modification time), so a file changed later is
// checked again.

struct VerifiedFiles {
  std::mutex mu;
  std::map<std::string, std::pair<uintmax_t, fs::file_time_type>> ok;
};

VerifiedFiles& verified_files() {
  static VerifiedFiles v;
  return v;
}

void write_entry_record(const fs::path& dir, const std::string& label, const std::string& expression) {
  const fs::path so = dir / "kernel.so";
  const auto sum = file_checksum(so.string());
  if (!sum) throw RuntimeError(fmt::format("cannot read the compiled kernel {}", so.string()));
  nlohmann::json j = {{"bytes", fs::file_size(so)}, {"xxh3", *sum}, {"label", label}, {"expression", expression}};
  write_file(dir / "entry.json", j.dump() + "\n");
}

// Whether the entry folder holds a kernel.so that matches its entry.json.
bool entry_intact(const fs::path& dir) {
  const fs::path so = dir / "kernel.so";
  std::error_code ec;
  const uintmax_t size = fs::file_size(so, ec);
  if (ec) return false;
  const fs::file_time_type mtime = fs::last_write_time(so, ec);
  if (ec || !fs::exists(dir / "entry.json", ec)) return false;
  VerifiedFiles& v = verified_files();
  {
    std::lock_guard lock(v.mu);
    if (auto it = v.ok.find(so.string()); it != v.ok.end() && it->second == std::pair{size, mtime}) return true;
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(read_file(dir / "entry.json"));
    if (j.at("bytes").get<uintmax_t>() != size || j.at("xxh3").get<std::string>() != file_checksum(so.string()))
      return false;
  } catch (const std::exception&) {
    return false;
  }
  std::lock_guard lock(v.mu);
  v.ok[so.string()] = {size, mtime};
  return true;
}

// Moves a damaged or incomplete entry out of the way (renamed first, so other processes never
// see half of it), saying so once.
void remove_damaged_entry(const fs::path& dir, const std::string& key) {
  std::random_device rd;
  // Named like a compile folder (<key>-<pid>-<random>): if this process dies before removing it,
  // the next compile in the cache removes it as a dead process's temporary.
  const fs::path aside = dir.parent_path().parent_path() / "tmp" /
                         fmt::format("{}-{}-{:08x}", key, static_cast<long>(getpid()), rd());
  std::error_code ec;
  fs::create_directories(aside.parent_path(), ec);
  fs::rename(dir, aside, ec);
  if (ec) return;  // gone already, or another process moved it
  fs::remove_all(aside, ec);
  log_warning("the cached kernel {} was incomplete or damaged (its kernel.so does not match entry.json): "
              "compiling it again",
              key);
}

// The process that made a tmp/ folder (named <key>-<pid>-<random>), or 0.
long temp_owner(const std::string& name) {
  const size_t first = name.find('-');
  if (first == std::string::npos) return 0;
  const size_t second = name.find('-', first + 1);
  if (second == std::string::npos) return 0;
  try {
    return std::stol(name.substr(first + 1, second - first - 1));
  } catch (const std::exception&) {
    return 0;
  }
}

bool process_alive(long pid) { return pid > 0 && (::kill(pid_t(pid), 0) == 0 || errno == EPERM); }

// Removes tmp/ folders whose process is gone (a killed compile, a full disk), once per process.
void remove_stale_temporaries(const fs::path& root) {
  static std::once_flag once;
  std::call_once(once, [&] {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root / "tmp", ec)) {
      const long owner = temp_owner(e.path().filename().string());
      if (owner != 0 && !process_alive(owner)) fs::remove_all(e.path(), ec);
    }
  });
}

struct CompilerRun {
  int rc = 0;
  std::string output;  // what the compiler printed
};

// Runs argv in the folder `cwd` and keeps what it prints, also in the file `log` when one is
// named; with `show_progress`, shows a progress line on stderr while it takes longer than a
// second (on a terminal, at log level info; elsewhere the compile's start and finish lines stand
// alone). Compiles run in their own folder and name their files relatively. The output goes to a
// file in the system's temporary folder (or, without one, in `cwd`) while the compiler runs and is
// copied to `log` after, where that can be written: the cache folder may be on the very disk
// that is full, and the compiler's own words ("No space left on device") must still reach the
// error.
CompilerRun run_compiler(const std::vector<std::string>& argv, const std::optional<fs::path>& log,
                         const std::string& label, const fs::path& cwd, bool show_progress = true) {
  const bool show = show_progress && isatty(2) && log_enabled(LogLevel::info);
  bool shown = false;
  std::string capture = (fs::temp_directory_path() / "evtc-compiler-output-XXXXXX").string();
  int fd = ::mkstemp(capture.data());
  if (fd < 0) {
    capture = (cwd / "compiler-output-XXXXXX").string();
    fd = ::mkstemp(capture.data());
  }
  if (fd >= 0) ::close(fd);
  CompilerRun run;
  try {
    run.rc = run_process(argv, capture, cwd.string(), [&](double secs) {
      if (show && secs >= 1.0) {
        fmt::print(stderr, "\r\033[Kevtc: compiling {} ({:.0f} s)", label, secs);
        shown = true;
      }
    });
  } catch (...) {  // interrupted: the output file goes too
    if (shown) fmt::print(stderr, "\r\033[K");
    std::error_code ec;
    fs::remove(capture, ec);
    throw;
  }
  if (shown) fmt::print(stderr, "\r\033[K");
  run.output = read_file(capture);
  std::error_code ec;
  fs::remove(capture, ec);
  if (log) {
    try {
      write_file(*log, run.output);
    } catch (const RuntimeError&) {
      // The cache's disk is full or read-only: the output is still in the error message.
    }
  }
  return run;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

std::string first_errors(const std::string& log, size_t max_lines) {
  std::stringstream in(log);
  std::string line, out;
  size_t n = 0;
  while (std::getline(in, line) && n < max_lines)
    if (line.find("error") != std::string::npos || line.find("No space left") != std::string::npos ||
        line.find("fatal") != std::string::npos || line.find("Killed") != std::string::npos) {
      out += "  " + line + "\n";
      ++n;
    }
  if (out.empty()) {  // no line says "error": show the tail
    std::stringstream again(log);
    std::vector<std::string> lines;
    while (std::getline(again, line)) lines.push_back(line);
    for (size_t i = lines.size() > max_lines ? lines.size() - max_lines : 0; i < lines.size(); ++i)
      out += "  " + lines[i] + "\n";
  }
  if (out.empty()) out = "  (the compiler printed nothing; its command line is in command.txt beside the log)\n";
  return out;
}

std::atomic<size_t>& compiler_run_count() {
  static std::atomic<size_t> n{0};
  return n;
}

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

// --- one compile per kernel across processes and hosts -----------------------------------

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

double lock_timeout_s() {
  const std::string v = env_text(Env::lock_timeout).value_or("");
  if (v.empty()) return 1800.0;
  try {
    size_t used = 0;
    const double s = std::stod(v, &used);
    if (used == v.size() && s > 0) return s;
  } catch (const std::exception&) {
  }
  throw UserError(fmt::format("EVTC_LOCK_TIMEOUT='{}': expected a number of seconds greater than 0", v));
}

// The lock files this process holds (EntryLock objects alive): a lock naming this process's pid
// that is not among them was left by an earlier process with the same pid (pid reuse in a
// restarted container with a persistent cache).
struct HeldLocks {
  std::mutex mu;
  std::set<std::string> paths;
};

HeldLocks& held_locks() {
  static HeldLocks h;
  return h;
}

bool holds_lock(const std::string& path) {
  HeldLocks& h = held_locks();
  std::lock_guard lock(h.mu);
  return h.paths.count(path) > 0;
}

void forget_lock(const std::string& path) {
  HeldLocks& h = held_locks();
  std::lock_guard lock(h.mu);
  h.paths.erase(path);
}

// When process `pid` of this host started (seconds since the epoch), from /proc; nullopt where
// that cannot be read.
std::optional<double> process_start_time(long pid) {
  std::ifstream stat_file(fmt::format("/proc/{}/stat", pid));
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  const size_t name_end = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (name_end == std::string::npos) return std::nullopt;
  std::istringstream fields(stat.substr(name_end + 1));
  std::string field;
  for (int i = 3; i < 22 && fields >> field; ++i) {
  }
  unsigned long long ticks = 0;
  if (!(fields >> ticks)) return std::nullopt;  // field 22: start time, in clock ticks after boot
  std::ifstream system_stat("/proc/stat");
  std::string line;
  while (std::getline(system_stat, line))
    if (line.rfind("btime ", 0) == 0) {
      const long hz = sysconf(_SC_CLK_TCK);
      if (hz <= 0) return std::nullopt;
      return std::stod(line.substr(6)) + double(ticks) / double(hz);
    }
  return std::nullopt;
}

// A lock file's owner: "host pid\n" as EntryLock writes it, with a host name of printable
// characters; nullopt for anything else (a lock whose owner died before writing, random bytes).
std::optional<std::pair<std::string, long>> lock_owner(const std::string& text) {
  const size_t space = text.find(' ');
  if (space == 0 || space == std::string::npos || space > 255) return std::nullopt;
  const std::string host = text.substr(0, space);
  if (!std::all_of(host.begin(), host.end(), [](char c) { return c > ' ' && c < 127; })) return std::nullopt;
  std::string_view rest = std::string_view(text).substr(space + 1);
  if (!rest.empty() && rest.back() == '\n') rest.remove_suffix(1);
  long pid = 0;
  const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), pid);
  if (error != std::errc() || end != rest.data() + rest.size() || pid <= 0) return std::nullopt;
  return std::pair{host, pid};
}

}  // namespace

std::optional<EntryLock> EntryLock::try_acquire(const std::string& path, std::string* holder) {
  const fs::path file(path);
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int fd = ::open(file.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd >= 0) {
      const std::string owner = fmt::format("{} {}\n", host_name(), static_cast<long>(getpid()));
      const bool written = ::write(fd, owner.data(), owner.size()) == static_cast<ssize_t>(owner.size());
      ::close(fd);
      if (!written) {
        ::unlink(file.c_str());
        throw RuntimeError(fmt::format("cannot write the compile lock {}", path));
      }
      std::lock_guard held(held_locks().mu);
      held_locks().paths.insert(path);
      return EntryLock(path);
    }
    if (errno != EEXIST)
      throw RuntimeError(fmt::format("cannot create the compile lock {}: {}", path, std::strerror(errno)));
    // Held: by whom, and is its owner still there?
    const auto owner = lock_owner(read_file(file).substr(0, 512));
    struct stat st {};
    if (::stat(file.c_str(), &st) != 0) continue;  // released meanwhile: try again
    const double age = std::difftime(std::time(nullptr), st.st_mtime);
    const double timeout = lock_timeout_s();
    bool stale = false;
    if (!owner) {
      // The owner died before writing its name, or the file is not a lock: it is written at once
      // after the file is created, so a few seconds tell.
      stale = age > std::min(10.0, timeout);
    } else if (owner->first != host_name()) {
      stale = age > timeout;  // another host: only the lock's age tells
    } else if (owner->second == static_cast<long>(getpid())) {
      stale = !holds_lock(path);  // this pid, but not this process's lock: an earlier process's
    } else if (!process_alive(owner->second)) {
      stale = true;
    } else {
      // A live process of this host: one that started after the lock was written has a reused
      // pid; any other holds it at most EVTC_LOCK_TIMEOUT seconds, like another host's.
      const auto started = process_start_time(owner->second);
      // (10 s of slack: a network filesystem's clock may differ a little from this host's.)
      stale = (started && *started > double(st.st_mtime) + 10.0) || age > timeout;
    }
    if (holder)
      *holder = owner ? fmt::format("process {} on {}", owner->second, owner->first)
                      : std::string("a process whose lock file does not name it");
    if (!stale) return std::nullopt;
    // Take the stale lock out of the way atomically (of two processes that find it stale, one
    // renames it), then try again.
    std::random_device rd;
    const fs::path aside = file.string() + fmt::format(".stale-{}-{:08x}", static_cast<long>(getpid()), rd());
    if (::rename(file.c_str(), aside.c_str()) == 0) ::unlink(aside.c_str());
  }
  return std::nullopt;
}

EntryLock::~EntryLock() {
  if (!path_.empty()) {
    forget_lock(path_);
    ::unlink(path_.c_str());
  }
}

EntryLock::EntryLock(EntryLock&& o) noexcept : path_(std::move(o.path_)) { o.path_.clear(); }

EntryLock& EntryLock::operator=(EntryLock&& o) noexcept {
  if (this != &o) {
    if (!path_.empty()) {
      forget_lock(path_);
      ::unlink(path_.c_str());
    }
    path_ = std::move(o.path_);
    o.path_.clear();
  }
  return *this;
}

std::string machine_slot_dir() {
  if (const auto d = env_text(Env::machine_slot_dir)) return *d;
  return (fs::temp_directory_path() / fmt::format("evtc-compile-slots-{}", static_cast<long>(getuid()))).string();
}

MachineSlot::MachineSlot(int slots, const std::string& dir, const std::function<void()>& on_wait) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  bool waited = false;
  for (;;) {
    for (int i = 0; i < slots; ++i) {
      const fs::path file = fs::path(dir) / fmt::format("slot-{}", i);
      const int fd = ::open(file.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0666);
      if (fd < 0) {
        if (i == 0 && ec) return;  // no slot folder: no machine-wide cap (the in-process one holds)
        continue;
      }
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
        fd_ = fd;  // released by close, or by the kernel when this process dies
        return;
      }
      ::close(fd);
    }
    if (!waited && on_wait) on_wait();
    waited = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    throw_if_interrupted();
  }
}

MachineSlot::~MachineSlot() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

std::string command_line(const std::vector<std::string>& argv) {
  std::string command;
  for (const auto& a : argv) command += (command.empty() ? "" : " ") + a;
  return command;
}

// nvcc with `flags` and `includes`, writing `out` from `inputs` (names in the compile's folder).
std::vector<std::string> nvcc_argv(const Toolchain& tc, const std::vector<std::string>& flags,
                                   const std::vector<std::string>& includes, const std::string& out,
                                   const std::vector<std::string>& inputs) {
  std::vector<std::string> argv = {tc.nvcc};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), includes.begin(), includes.end());
  argv.push_back("-o");
  argv.push_back(out);
  argv.insert(argv.end(), inputs.begin(), inputs.end());
  return argv;
}

// Writes a compile's command lines into its command.txt, and prints them when
// EVTC_LOG=debug.
void record_commands(const fs::path& tmp, const std::vector<std::vector<std::string>>& commands) {
  std::string text;
  for (const auto& argv : commands) text += command_line(argv) + "\n";
  write_file(tmp / "command.txt", text);
  for (const auto& argv : commands) log_debug("{}", command_line(argv));
}

// CompileRequest::in_parts: the device and host parts in parallel, then the link. Writes
// command.txt and compile.log (the three logs in turn) into `tmp`; returns nvcc's exit code
// (the first that failed) and that log.
CompilerRun compile_in_parts(const CompileRequest& req, const Toolchain& tc, const fs::path& tmp) {
  const std::vector<std::string> includes = {"-I" + tc.cutlass_include, "-I" + tc.evtc_include};
  const auto device = nvcc_argv(tc, device_part_flags(req.sm, req.backend), includes, "kernel.cubin", {"kernel.cu"});
  const auto host = nvcc_argv(tc, host_part_flags(req.sm, req.backend), includes, "host.o", {"kernel.cu"});
  // The cubin becomes the host part's evtc_kernel_image (hidden: each library its own).
  write_file(tmp / "image.cpp",
             "// The device part's cubin, as the host part's evtc_kernel_image.\n"
             "__asm__(\".section .rodata\\n.balign 128\\n.globl evtc_kernel_image\\n"
             ".hidden evtc_kernel_image\\n.type evtc_kernel_image, @object\\nevtc_kernel_image:\\n"
             ".incbin \\\"kernel.cubin\\\"\\n.byte 0\\n.previous\\n\");\n");
  const auto link = nvcc_argv(tc, link_parts_flags(req.sm, req.backend), {}, "kernel.so", {"host.o", "image.cpp"});
  record_commands(tmp, {device, host, link});

  // Each part's output is kept in memory; compile.log gets them all below.
  auto device_run = std::async(std::launch::async, [&] { return run_compiler(device, std::nullopt, req.label, tmp); });
  const CompilerRun host_run = run_compiler(host, std::nullopt, req.label, tmp, false);
  const CompilerRun device_done = device_run.get();
  CompilerRun all;  // each part's output under its name; empty when no part printed anything
  all.rc = device_done.rc != 0 ? device_done.rc : host_run.rc;
  auto add_log = [&](const char* part, const CompilerRun& r) {
    if (!r.output.empty()) all.output += fmt::format("== {} (exit {})\n{}", part, r.rc, r.output);
  };
  add_log("device part", device_done);
  add_log("host part", host_run);
  if (all.rc == 0) {
    const CompilerRun link_run = run_compiler(link, std::nullopt, req.label, tmp, false);
    all.rc = link_run.rc;
    add_log("link", link_run);
  }
  if (all.rc == 0) {  // the library holds both parts
    std::error_code ec;
    for (const char* name : {"kernel.cubin", "host.o", "image.cpp"}) fs::remove(tmp / name, ec);
  }
  try {
    write_file(tmp / "compile.log", all.output);
  } catch (const RuntimeError&) {
    // A full or read-only disk: the output goes into the error message instead.
  }
  return all;
}

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

std::string cache_dir() {
  if (const auto d = env_text(Env::cache_dir)) return *d;
  if (const auto x = env_text(Env::xdg_cache_home)) return (fs::path(*x) / "evtc").string();
  const auto home = env_text(Env::home);
  return (fs::path(home.value_or("/tmp")) / ".cache" / "evtc").string();
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

void write_file_atomically(const std::string& path, const std::string& text) {
  const fs::path target(path);
  std::random_device rd;
  const fs::path tmp = target.parent_path() /
                       fmt::format(".{}-{}-{:08x}.tmp", target.filename().string(), static_cast<long>(getpid()), rd());
  {
    std::ofstream f(tmp, std::ios::binary);
    f << text;
    f.close();
    if (!f) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw RuntimeError(fmt::format("cannot write {}", path));
    }
  }
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw RuntimeError(fmt::format("cannot write {}: {}", path, ec.message()));
  }
}

CacheStats cache_stats() {
  CacheStats s;
  check_cache_readable(cache_dir(), {"kernels"});
  const fs::path kernels = fs::path(cache_dir()) / "kernels";
  std::error_code ec;
  if (!fs::exists(kernels, ec)) return s;
  for (const auto& e : fs::directory_iterator(kernels, ec)) {
    if (!e.is_directory(ec) || !fs::exists(e.path() / "kernel.so", ec)) continue;  // stray files, empty folders
    ++s.entries;
    if (!entry_intact(e.path())) ++s.damaged;
    for (const auto& f : fs::recursive_directory_iterator(e.path(), ec))
      if (f.is_regular_file(ec)) s.bytes += f.file_size(ec);
  }
  return s;
}

std::vector<CacheEntry> cache_entries() {
  std::vector<CacheEntry> out;
  check_cache_readable(cache_dir(), {"kernels"});
  const fs::path kernels = fs::path(cache_dir()) / "kernels";
  std::error_code ec;
  if (!fs::exists(kernels, ec)) return out;
  for (const auto& e : fs::directory_iterator(kernels, ec)) {
    if (!e.is_directory(ec) || !fs::exists(e.path() / "kernel.so", ec)) continue;
    CacheEntry c;
    c.key = e.path().filename().string();
    c.intact = entry_intact(e.path());
    for (const auto& f : fs::recursive_directory_iterator(e.path(), ec))
      if (f.is_regular_file(ec)) c.bytes += f.file_size(ec);
    const fs::path record = e.path() / "entry.json";
    c.last_used = fs::last_write_time(fs::exists(record, ec) ? record : e.path() / "kernel.so", ec);
    try {
      const nlohmann::json j = nlohmann::json::parse(read_file(record));
      c.label = j.value("label", "");
      c.expression = j.value("expression", "");
    } catch (const std::exception&) {
    }
    out.push_back(std::move(c));
  }
  std::sort(out.begin(), out.end(), [](const CacheEntry& a, const CacheEntry& b) {
    return a.last_used != b.last_used ? a.last_used < b.last_used : a.key < b.key;
  });
  return out;
}

PruneResult prune_cache(std::optional<size_t> max_bytes, std::optional<std::chrono::seconds> unused_for) {
  PruneResult r;
  const std::vector<CacheEntry> entries = cache_entries();
  size_t total = 0;
  for (const CacheEntry& e : entries) total += e.bytes;
  const auto now = fs::file_time_type::clock::now();
  const fs::path kernels = fs::path(cache_dir()) / "kernels";
  for (const CacheEntry& e : entries) {  // least recently used first
    const bool old = unused_for && now - e.last_used > *unused_for;
    const bool over = max_bytes && total > *max_bytes;
    if (!old && !over) {
      ++r.kept;
      r.kept_bytes += e.bytes;
      continue;
    }
    std::error_code ec;
    fs::remove_all(kernels / e.key, ec);
    if (ec) {
      if (r.failed++ == 0) r.first_error = fmt::format("{}: {}", (kernels / e.key).string(), ec.message());
      ++r.kept;
      r.kept_bytes += e.bytes;
      continue;
    }
    ++r.removed;
    r.bytes_freed += e.bytes;
    total -= e.bytes;
  }
  return r;
}

size_t parse_size(const std::string& text, const std::string& what) {
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
  }
  std::string suffix = text.substr(std::min(used, text.size()));
  if (!suffix.empty() && (suffix.back() == 'B' || suffix.back() == 'b')) suffix.pop_back();
  if (!suffix.empty() && (suffix.back() == 'i')) suffix.pop_back();
  double scale = 1;
  if (suffix == "K" || suffix == "k") scale = 1024.0;
  else if (suffix == "M" || suffix == "m") scale = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g") scale = 1024.0 * 1024 * 1024;
  else if (suffix == "T" || suffix == "t") scale = 1024.0 * 1024 * 1024 * 1024;
  else if (!suffix.empty()) v = -1;
  if (used == 0 || !(v >= 0) || v * scale > 1e18)
    throw UserError(fmt::format("{}: '{}' is not a size (a number of bytes, or with a K, M, G or T suffix: 512M, 10G)",
                                what, text));
  return static_cast<size_t>(v * scale);
}

std::optional<size_t> cache_size_limit() {
  const auto v = env_text(Env::cache_size_limit);
  const size_t bytes = v ? parse_size(*v, std::string(env_name(Env::cache_size_limit))) : size_t(10) << 30;
  if (bytes == 0) return std::nullopt;
  return bytes;
}

ClearResult clear_cache() {
  const fs::path root = cache_dir();
  check_cache_readable(root, {"kernels", "failed", "tmp"});
  ClearResult r;
  std::error_code ec;
  auto remove = [&](const fs::path& p, bool counts) {
    std::error_code e;
    const bool entry = counts && fs::exists(p / "kernel.so", e);
    fs::remove_all(p, e);
    if (e || fs::exists(p, e)) {
      ++r.failed;
      if (r.first_error.empty()) r.first_error = fmt::format("{}: {}", p.string(), e ? e.message() : "still there");
    } else if (entry) {
      ++r.removed;
    }
  };
  for (const char* sub : {"kernels", "failed"})
    for (const auto& e : fs::directory_iterator(root / sub, ec)) remove(e.path(), std::string(sub) == "kernels");
  // Compiles in progress (their process is alive) keep their folders: clearing must not break them.
  for (const auto& e : fs::directory_iterator(root / "tmp", ec)) {
    if (!process_alive(temp_owner(e.path().filename().string()))) remove(e.path(), false);
  }
  std::lock_guard lock(verified_files().mu);
  verified_files().ok.clear();
  return r;
}

}  // namespace evtc::jit
