// The kernel cache's files: reading and writing them, the entries' integrity records, the
// temporaries of dead compiles, and the cache's folder, statistics, pruning and clearing.
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "evtc/error.hpp"
#include "jit/cache_internals.hpp"
#include "jit/kernel_cache.hpp"
#include "jit/kernel_library.hpp"
#include "support/environment.hpp"
#include "support/logging.hpp"

namespace evtc::jit {

namespace fs = std::filesystem;

namespace detail {

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

}  // namespace detail

namespace {

using detail::folder_problem;

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

}  // namespace

namespace detail {

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

}  // namespace detail

using detail::entry_intact;
using detail::process_alive;
using detail::read_file;
using detail::temp_owner;
using detail::verified_files;

std::string cache_dir() {
  if (const auto d = env_text(Env::cache_dir)) return *d;
  if (const auto x = env_text(Env::xdg_cache_home)) return (fs::path(*x) / "evtc").string();
  const auto home = env_text(Env::home);
  return (fs::path(home.value_or("/tmp")) / ".cache" / "evtc").string();
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
