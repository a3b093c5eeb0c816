// One compile per kernel across processes and hosts: the entries' lock files (EntryLock) and
// the machine-wide compile slots (MachineSlot), both declared in jit/kernel_cache.hpp.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "evtc/error.hpp"
#include "jit/cache_internals.hpp"
#include "jit/kernel_cache.hpp"
#include "jit/process.hpp"
#include "support/environment.hpp"

namespace evtc::jit {

namespace fs = std::filesystem;
using detail::process_alive;
using detail::read_file;

namespace {

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

}  // namespace

double detail::lock_timeout_s() {
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

namespace {

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

using detail::lock_timeout_s;

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

}  // namespace evtc::jit
