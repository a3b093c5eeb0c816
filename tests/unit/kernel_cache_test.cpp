// Tests of the JIT disk cache (src/jit/kernel_cache). They need nvcc but no GPU: the
// libraries compiled here are plain CUDA fallback epilogues (no CUTLASS, a few seconds each),
// and nothing is loaded. Each test gets a fresh EVTC_CACHE_DIR, and each compiles a source
// no other test uses, since a process remembers the keys it has compiled.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <regex>

#include "golden_files.hpp"
#include "scoped_env.hpp"
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/fallback_emitter.hpp"
#include "evtc/error.hpp"
#include "evtc/expression.hpp"
#include "evtc/kernel_config.hpp"
#include "evtc/log.hpp"
#include "evtc/passes.hpp"
#include "support/environment.hpp"
#include "jit/kernel_cache.hpp"
#include "jit/toolchain.hpp"

namespace fs = std::filesystem;
using namespace evtc;

namespace {

using evtc::test::read_file;
using evtc::test::ScopedEnv;

size_t entries_in(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return 0;
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}


// The fallback epilogue of a one-op graph, made unique to `tag`.
jit::CompileRequest fallback_request(const std::string& tag) {
  const Graph g = run_pipeline(parse_expression("out D: bf16 = relu(acc)"));
  jit::CompileRequest req;
  req.source = cuda::emit_fallback_kernel(g, make_signature(g)) + "// " + tag + "\n";
  req.label = "test " + tag;
  req.needs_cutlass = false;
  req.sm = 90;
  return req;
}

class KernelCache : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "evtc-cache-test-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << "cannot create a temporary folder";
    dir_ = pattern;
    env_.emplace("EVTC_CACHE_DIR", dir_.string());
    print_.emplace("EVTC_LOG", std::nullopt);
    keep_.emplace("EVTC_KEEP_TEMPORARIES", std::nullopt);
  }
  void TearDown() override {
    keep_.reset();
    print_.reset();
    env_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  fs::path entry(const std::string& key) const { return dir_ / "kernels" / key; }
  // Every file a finished entry holds.
  void expect_complete_entry(const jit::CompileRequest& req, const std::string& key) const {
    for (const char* f : {"kernel.cu", "kernel.so", "compile.log", "command.txt"})
      EXPECT_TRUE(fs::is_regular_file(entry(key) / f)) << f << " missing in " << entry(key);
    EXPECT_EQ(read_file(entry(key) / "kernel.cu"), req.source);
    EXPECT_GT(fs::file_size(entry(key) / "kernel.so"), 0u);
    const std::string command = read_file(entry(key) / "command.txt");
    EXPECT_EQ(command.rfind(jit::toolchain(false).nvcc + " ", 0), 0u) << command;
    EXPECT_NE(command.find(" -o "), std::string::npos) << command;
    EXPECT_NE(command.find("-gencode=arch=compute_90,code=[sm_90,compute_90]"), std::string::npos) << command;
    EXPECT_EQ(command.find("cutlass"), std::string::npos) << "a plain CUDA compile: " << command;
    EXPECT_EQ(entries_in(dir_ / "tmp"), 0u) << "a compile folder was left in tmp/";
  }

  // At EVTC_LOG=debug, one compile logs three lines: its start (label and key), its nvcc command
  // (as command.txt has it) and its end with the time taken; and this process recorded it.
  void expect_one_compile_logged(const std::string& err, const jit::CompileRequest& req,
                                 const std::string& key) const {
    const std::string start = fmt::format("evtc: compiling {} [{}]\n", req.label, key);
    const std::string command = "evtc: " + read_file(entry(key) / "command.txt");
    ASSERT_EQ(err.rfind(start + command, 0), 0u) << err;
    const std::string end = err.substr(start.size() + command.size());
    EXPECT_TRUE(std::regex_match(end, std::regex("evtc: compiled " + req.label + " in [0-9]+\\.[0-9] s\n")))
        << end;
    const auto events = jit::compile_events();
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.back().key, key);
    EXPECT_EQ(events.back().label, req.label);
    EXPECT_EQ(events.back().what, "compiled");
    EXPECT_EQ(std::count_if(events.begin(), events.end(), [&](const auto& e) { return e.key == key; }), 1);
  }

  fs::path dir_;
  std::optional<ScopedEnv> env_, print_, keep_;
};

TEST_F(KernelCache, KeyIsSixteenHexDigitsOfSourceAndTarget) {
  const jit::CompileRequest req = fallback_request("key");
  const std::string key = jit::cache_key(req);
  EXPECT_EQ(key.size(), 16u);
  EXPECT_EQ(key.find_first_not_of("0123456789abcdef"), std::string::npos) << key;
  EXPECT_EQ(jit::cache_key(req), key) << "not stable";

  jit::CompileRequest other = req;
  other.source += " ";
  EXPECT_NE(jit::cache_key(other), key) << "the source changed";
  other = req;
  other.sm = 80;
  EXPECT_NE(jit::cache_key(other), key) << "the target changed";
  other = req;
  other.label = "another label";
  EXPECT_EQ(jit::cache_key(other), key) << "the label only names the compile in messages";
  // Keys do not depend on where the cache is.
  ScopedEnv elsewhere("EVTC_CACHE_DIR", (dir_ / "elsewhere").string());
  EXPECT_EQ(jit::cache_key(req), key);
}

TEST_F(KernelCache, CacheDirComesFromTheEnvironment) {
  EXPECT_EQ(jit::cache_dir(), dir_.string());
  ScopedEnv no_dir("EVTC_CACHE_DIR", std::nullopt);
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "/some/xdg");
    EXPECT_EQ(jit::cache_dir(), "/some/xdg/evtc");
  }
  ScopedEnv no_xdg("XDG_CACHE_HOME", std::nullopt);
  ScopedEnv home("HOME", "/some/home");
  EXPECT_EQ(jit::cache_dir(), "/some/home/.cache/evtc");
}

// Another process compiles; this one finds the entry on disk and runs no compiler.
TEST_F(KernelCache, EntryCompiledByAnotherProcessIsFoundOnDisk) {
  const jit::CompileRequest req = fallback_request("other process");
  const std::string key = jit::cache_key(req);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int rc = 1;
    try {
      rc = jit::compile_cached(req) == (entry(key) / "kernel.so").string() ? 0 : 2;
    } catch (const std::exception& e) {
      fmt::print(stderr, "{}\n", e.what());
    }
    _exit(rc);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the compile in the child failed";
  expect_complete_entry(req, key);
  const auto mtime = fs::last_write_time(entry(key) / "kernel.so");

  // Keep the compile folder of a second compile (were there one) and show its command.
  ScopedEnv keep("EVTC_KEEP_TEMPORARIES", "1");
  ScopedEnv print("EVTC_LOG", "debug");
  testing::internal::CaptureStderr();
  const std::string first = jit::compile_cached(req);
  const std::string second = jit::compile_cached(req);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(first, (entry(key) / "kernel.so").string());
  EXPECT_EQ(second, first);
  EXPECT_EQ(err, "") << "nvcc ran again";
  EXPECT_EQ(fs::last_write_time(entry(key) / "kernel.so"), mtime);
  EXPECT_EQ(entries_in(dir_ / "tmp"), 0u);
  EXPECT_EQ(entries_in(dir_ / "kernels"), 1u);
  const jit::CacheStats stats = jit::cache_stats();
  EXPECT_EQ(stats.entries, 1u);
  EXPECT_GT(stats.bytes, fs::file_size(entry(key) / "kernel.so"));
}

TEST_F(KernelCache, ConcurrentRequestsCompileOnce) {
  const jit::CompileRequest req = fallback_request("concurrent");
  const std::string key = jit::cache_key(req);
  ScopedEnv print("EVTC_LOG", "debug");
  testing::internal::CaptureStderr();
  std::vector<std::string> paths(4);
  std::vector<std::string> errors(4);
  {
    std::vector<std::jthread> threads;
    for (size_t i = 0; i < paths.size(); ++i)
      threads.emplace_back([&, i] {
        try {
          paths[i] = jit::compile_cached(req);
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
      });
  }
  const std::string err = testing::internal::GetCapturedStderr();
  for (size_t i = 0; i < paths.size(); ++i) {
    EXPECT_EQ(errors[i], "") << "thread " << i;
    EXPECT_EQ(paths[i], (entry(key) / "kernel.so").string()) << "thread " << i;
  }
  expect_complete_entry(req, key);
  EXPECT_EQ(entries_in(dir_ / "kernels"), 1u);
  EXPECT_FALSE(fs::exists(dir_ / "failed"));
  // EVTC_LOG=debug printed the one compile's start, command (as command.txt has it) and end.
  expect_one_compile_logged(err, req, key);

  EXPECT_EQ(jit::clear_cache().removed, 1u);
  EXPECT_EQ(entries_in(dir_ / "kernels"), 0u);
  EXPECT_EQ(jit::cache_stats().entries, 0u);
}

TEST_F(KernelCache, CompileErrorKeepsTheSourceAndNamesTheFirstError) {
  jit::CompileRequest req = fallback_request("syntax error");
  req.source += "int broken() { return 1 }\n";
  const std::string key = jit::cache_key(req);
  const fs::path failed = dir_ / "failed" / key;
  for (int attempt = 0; attempt < 2; ++attempt) {  // a failure is not remembered: it compiles again
    SCOPED_TRACE(attempt);
    std::string message;
    try {
      jit::compile_cached(req);
      ADD_FAILURE() << "a source with a syntax error compiled";
    } catch (const RuntimeError& e) {
      message = e.what();
    }
    EXPECT_NE(message.find((failed / "kernel.cu").string()), std::string::npos) << message;
    EXPECT_NE(message.find((failed / "compile.log").string()), std::string::npos) << message;
    EXPECT_NE(message.find("error: expected a \";\""), std::string::npos) << message;
    EXPECT_NE(message.find(req.label), std::string::npos) << message;
    EXPECT_EQ(read_file(failed / "kernel.cu"), req.source);
    EXPECT_NE(read_file(failed / "compile.log").find("error"), std::string::npos);
    EXPECT_TRUE(fs::is_regular_file(failed / "command.txt"));
    EXPECT_FALSE(fs::exists(entry(key))) << "a failed compile made an entry";
    EXPECT_EQ(entries_in(dir_ / "tmp"), 0u);
  }
  EXPECT_EQ(jit::cache_stats().entries, 0u);
}

// A cache on a small filesystem of its own (a tmpfs, mounted for the test; skipped where this
// process may not mount one): a full disk and a read-only cache, as a user meets them.
class MountedCache {
 public:
  explicit MountedCache(const fs::path& where, const std::string& size) : where_(where) {
    fs::create_directories(where_);
    mounted_ = std::system(fmt::format("mount -t tmpfs -o size={} tmpfs '{}' 2>/dev/null", size, where_.string())
                               .c_str()) == 0;
  }
  ~MountedCache() {
    if (mounted_) (void)std::system(fmt::format("umount '{}' 2>/dev/null", where_.string()).c_str());
  }
  bool mounted() const { return mounted_; }
  bool make_read_only() const {
    return std::system(fmt::format("mount -o remount,ro '{}' 2>/dev/null", where_.string()).c_str()) == 0;
  }

 private:
  fs::path where_;
  bool mounted_ = false;
};

// The message of the error compiling `req` into a cache too small for it.
std::string error_on_small_disk(const jit::CompileRequest& req) {
  try {
    jit::compile_cached(req);
    ADD_FAILURE() << "a compile into a filesystem too small for it succeeded";
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

// A full disk: the compile fails with the system's own words ("No space left on device"), and
// leaves neither an entry nor a compile folder behind.
TEST_F(KernelCache, AFullDiskSaysSoAndLeavesNothingBehind) {
  const fs::path small = dir_ / "small";
  MountedCache disk(small, "48k");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here";
  ScopedEnv cache("EVTC_CACHE_DIR", small.string());
  const jit::CompileRequest req = fallback_request("full disk");
  const std::string message = error_on_small_disk(req);
  EXPECT_NE(message.find("No space left on device"), std::string::npos) << message;
  EXPECT_EQ(message.find("the compiler printed nothing"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(small / "kernels" / jit::cache_key(req)));
  EXPECT_EQ(entries_in(small / "tmp"), 0u) << "a compile folder was left in tmp/";
}

// A disk too full for the source itself: the error names the file it could not write, and the
// compile folder is removed (a partial one stayed in tmp/ before).
TEST_F(KernelCache, ADiskTooFullForTheSourceLeavesNoCompileFolder) {
  const fs::path tiny = dir_ / "tiny";
  MountedCache disk(tiny, "4k");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here";
  ScopedEnv cache("EVTC_CACHE_DIR", tiny.string());
  jit::CompileRequest req = fallback_request("tiny disk");
  req.source += "// " + std::string(8192, 'x') + "\n";  // larger than the filesystem
  const std::string message = error_on_small_disk(req);
  EXPECT_NE(message.find("kernel.cu"), std::string::npos) << message;
  EXPECT_NE(message.find("No space left on device"), std::string::npos) << message;
  EXPECT_EQ(entries_in(tiny / "tmp"), 0u) << "a compile folder was left in tmp/";
}

// A read-only cache: `clear` removes nothing, says so and names what it could not remove; the
// entry is still used.
TEST_F(KernelCache, ClearingAReadOnlyCacheRemovesNothingAndSaysWhy) {
  const fs::path ro = dir_ / "ro";
  MountedCache disk(ro, "16m");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here";
  ScopedEnv cache("EVTC_CACHE_DIR", ro.string());
  const jit::CompileRequest req = fallback_request("read-only");
  const std::string path = jit::compile_cached(req);
  ASSERT_TRUE(disk.make_read_only());
  const jit::ClearResult r = jit::clear_cache();
  EXPECT_EQ(r.removed, 0u);
  EXPECT_GE(r.failed, 1u);
  EXPECT_NE(r.first_error.find(jit::cache_key(req)), std::string::npos) << r.first_error;
  EXPECT_TRUE(fs::exists(path));
  EXPECT_EQ(jit::cache_stats().entries, 1u);
}

// The message of the RuntimeError `f` throws, or "" (with a failure) when it throws none.
std::string runtime_error_of(const std::function<void()>& f) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const RuntimeError& e) {
    return e.what();
  }
  return {};
}

// A cache whose folders cannot be used is found before nvcc runs (it ran to the end first, then
// failed with a raw "filesystem error" or "cannot move the compiled kernel" with no reason), and
// the error names the folder and the system's reason.
TEST_F(KernelCache, UnusableCacheFoldersAreFoundBeforeCompiling) {
  const jit::CompileRequest req = fallback_request("unusable folders");
  const size_t before = jit::compiler_runs();
  for (const char* sub : {"kernels", "locks", "tmp"}) {
    SCOPED_TRACE(sub);
    fs::remove_all(dir_ / sub);
    std::ofstream(dir_ / sub) << "not a folder";
    const std::string message = runtime_error_of([&] { jit::compile_cached(req); });
    EXPECT_NE(message.find(fmt::format("cannot use the kernel cache folder {}: {} is not a folder (set "
                                       "EVTC_CACHE_DIR to a writable folder)",
                                       dir_.string(), (dir_ / sub).string())),
              std::string::npos)
        << message;
    EXPECT_EQ(jit::compiler_runs(), before) << "nvcc ran";
    fs::remove(dir_ / sub);
  }
  // kernels/ read-only (a read-only bind mount: permissions do not stop root).
  const fs::path kernels = dir_ / "kernels";
  fs::create_directories(kernels);
  const std::string k = kernels.string();
  if (std::system(fmt::format("mount --bind '{0}' '{0}' 2>/dev/null && mount -o remount,ro,bind '{0}' 2>/dev/null",
                              k).c_str()) != 0) {
    (void)std::system(fmt::format("umount '{}' 2>/dev/null", k).c_str());
    GTEST_SKIP() << "cannot mount a read-only folder here";
  }
  const std::string message = runtime_error_of([&] { jit::compile_cached(req); });
  (void)std::system(fmt::format("umount '{}' 2>/dev/null", k).c_str());
  EXPECT_NE(message.find(fmt::format("cannot use the kernel cache folder {}: {}: Read-only file system",
                                     dir_.string(), k)),
            std::string::npos)
      << message;
  EXPECT_EQ(jit::compiler_runs(), before) << "nvcc ran";
}

// Listing, sizing, pruning and clearing a cache whose folder (or kernels/) is not a folder is an
// error naming it; they reported an empty cache before. A cache folder that does not exist yet
// is an empty cache.
TEST_F(KernelCache, InspectingAnUnusableCacheIsAnError) {
  const fs::path file = dir_ / "file";
  std::ofstream(file) << "x";
  for (const auto& [root, bad] : {std::pair{file, file}, std::pair{dir_ / "c", dir_ / "c" / "kernels"}}) {
    SCOPED_TRACE(root.string());
    ScopedEnv cache("EVTC_CACHE_DIR", root.string());
    if (bad != root) {
      fs::create_directories(root);
      std::ofstream(bad) << "x";
    }
    const std::string want = fmt::format("cannot read the kernel cache folder {}: {} is not a folder", root.string(),
                                         bad.string());
    for (const auto& f : std::vector<std::function<void()>>{
             [] { jit::cache_entries(); }, [] { jit::cache_stats(); }, [] { jit::clear_cache(); },
             [] { jit::prune_cache(std::nullopt, std::nullopt); }}) {
      const std::string message = runtime_error_of(f);
      EXPECT_NE(message.find(want), std::string::npos) << message;
    }
  }
  ScopedEnv cache("EVTC_CACHE_DIR", (dir_ / "not-yet").string());
  EXPECT_EQ(jit::cache_entries().size(), 0u);
  EXPECT_EQ(jit::cache_stats().entries, 0u);
  EXPECT_EQ(jit::clear_cache().failed, 0u);
}

TEST_F(KernelCache, BackgroundCompileSharesTheInProcessTable) {
  const jit::CompileRequest req = fallback_request("background");
  const std::string key = jit::cache_key(req);
  ScopedEnv print("EVTC_LOG", "debug");
  testing::internal::CaptureStderr();
  std::shared_future<std::string> first = jit::compile_in_background(req);
  // A second request, and a blocking compile_cached, join the compile in flight.
  std::shared_future<std::string> second = jit::compile_in_background(req);
  const std::string blocking = jit::compile_cached(req);
  ASSERT_EQ(first.wait_for(std::chrono::minutes(5)), std::future_status::ready);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(first.get(), (entry(key) / "kernel.so").string());
  EXPECT_EQ(second.get(), first.get());
  EXPECT_EQ(blocking, first.get());
  expect_complete_entry(req, key);
  expect_one_compile_logged(err, req, key);  // nvcc ran once
  // Found compiled: a ready future at once.
  std::shared_future<std::string> again = jit::compile_in_background(req);
  EXPECT_EQ(again.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_EQ(again.get(), first.get());
  EXPECT_GE(jit::compile_slots(), 1);
}

TEST(Environment, CompileJobsIsACount) {
  {
    ScopedEnv jobs("EVTC_COMPILE_JOBS", "3");
    EXPECT_EQ(jit::compile_slots_from_env(), 3);
  }
  {
    ScopedEnv jobs("EVTC_COMPILE_JOBS", "0");  // 0 and unset: one per core
    EXPECT_GE(jit::compile_slots_from_env(), 1);
  }
  {
    ScopedEnv jobs("EVTC_COMPILE_JOBS", "1024");  // the most
    EXPECT_EQ(jit::compile_slots_from_env(), 1024);
  }
  // Out of range: an error naming the range, never a wrap to a negative or absurd slot count
  // (2^31 made the count negative, so compiles waited forever for a slot; 2^32 + 1 became 1).
  for (const char* bad : {"many", "-2", "4x", "", " 3", "1025", "2147483648", "4294967296", "4294967297",
                          "9223372036854775807", "99999999999999999999"}) {
    if (!*bad) continue;  // empty: unset
    ScopedEnv jobs("EVTC_COMPILE_JOBS", bad);
    std::string message;
    try {
      jit::compile_slots_from_env();
    } catch (const UserError& e) {
      message = e.what();
    }
    EXPECT_EQ(message, fmt::format("EVTC_COMPILE_JOBS='{}': expected a count from 0 to 1024 (0: the CPU count)", bad));
  }
}

TEST(Environment, CountsAreBoundedAndNamedWithTheirRange) {
  {
    ScopedEnv count("EVTC_TUNE_MAX_CANDIDATES", "2147483647");
    EXPECT_EQ(env_count(Env::tune_max_candidates, "none"), size_t(2147483647));
  }
  ScopedEnv count("EVTC_TUNE_MAX_CANDIDATES", "18446744073709551617");
  try {
    env_count(Env::tune_max_candidates, "none");
    ADD_FAILURE() << "2^64 + 1 was accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              "EVTC_TUNE_MAX_CANDIDATES='18446744073709551617': expected a count from 0 to 2147483647 (0: none)");
  }
}

TEST(Environment, FlagsAreSetNonEmptyAndNotZero) {
  for (auto [value, want] : {std::pair<std::optional<std::string>, bool>{std::nullopt, false},
                             {"", false}, {"0", false}, {"1", true}, {"yes", true}}) {
    ScopedEnv flag("EVTC_KEEP_TEMPORARIES", value);
    EXPECT_EQ(env_flag(Env::keep_temporaries), want) << value.value_or("(unset)");
  }
  ScopedEnv count("EVTC_TUNE_MAX_CANDIDATES", "");
  EXPECT_EQ(env_count(Env::tune_max_candidates, "none"), std::nullopt);
}

TEST_F(KernelCache, BackgroundCompileErrorReachesTheFutureAndIsNotRemembered) {
  jit::CompileRequest req = fallback_request("background syntax error");
  req.source += "int broken() { return 1 }\n";
  for (int attempt = 0; attempt < 2; ++attempt) {
    SCOPED_TRACE(attempt);
    std::shared_future<std::string> f = jit::compile_in_background(req);
    std::string message;
    try {
      f.get();
      ADD_FAILURE() << "a source with a syntax error compiled";
    } catch (const RuntimeError& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("error: expected a \";\""), std::string::npos) << message;
    EXPECT_NE(message.find(req.label), std::string::npos) << message;
  }
  EXPECT_EQ(jit::cache_stats().entries, 0u);
}

// A pid no process has: a child that has exited and been waited for.
long dead_pid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  return child;
}

TEST_F(KernelCache, ClearCacheRemovesEntriesFailuresAndTemporariesOfDeadCompiles) {
  const std::string dead = fmt::format("tmp/0000000000000004-{}-2/kernel.cu", dead_pid());
  const std::string live = fmt::format("tmp/0000000000000005-{}-3/kernel.cu", static_cast<long>(getpid()));
  for (const std::string& f : {std::string("kernels/0000000000000001/kernel.so"),
                               std::string("kernels/0000000000000002/kernel.so"),
                               std::string("failed/0000000000000003/kernel.cu"), dead, live}) {
    fs::create_directories((dir_ / f).parent_path());
    std::ofstream(dir_ / f) << "x";
  }
  // Stray files and empty folders are not entries.
  std::ofstream(dir_ / "kernels" / "stray.txt") << "x";
  fs::create_directories(dir_ / "kernels" / "0000000000000009");
  std::ofstream(dir_ / "unrelated.txt") << "kept";
  const jit::CacheStats stats = jit::cache_stats();
  EXPECT_EQ(stats.entries, 2u);
  EXPECT_EQ(stats.damaged, 2u);  // no entry.json: not made by a finished compile
  const jit::ClearResult r = jit::clear_cache();
  EXPECT_EQ(r.removed, 2u);
  EXPECT_EQ(r.failed, 0u) << r.first_error;
  EXPECT_FALSE(fs::exists(dir_ / "kernels" / "0000000000000001"));
  EXPECT_FALSE(fs::exists(dir_ / "failed" / "0000000000000003"));
  EXPECT_FALSE(fs::exists((dir_ / dead).parent_path()));
  EXPECT_TRUE(fs::exists(dir_ / live)) << "a compile in progress lost its folder";
  EXPECT_TRUE(fs::exists(dir_ / "unrelated.txt"));
  EXPECT_EQ(jit::cache_stats().entries, 0u);
  EXPECT_EQ(jit::clear_cache().removed, 0u);
}

// A kernel.so changed after its entry was made (truncated, overwritten with bytes of the same
// size, or missing) is not used: the next request compiles it again, into a whole entry.
TEST_F(KernelCache, DamagedEntriesAreNotUsedAndHeal) {
  const jit::CompileRequest req = fallback_request("damaged");
  const std::string key = jit::cache_key(req);
  const std::string path = jit::compile_cached(req);
  const std::string good = read_file(path);
  ASSERT_TRUE(fs::exists(entry(key) / "entry.json"));
  EXPECT_EQ(jit::cache_stats().damaged, 0u);

  const std::vector<std::function<void()>> damage = {
      [&] { fs::resize_file(path, good.size() / 2); },
      [&] {
        std::string other = good;
        other[other.size() / 2] ^= 0x5a;
        std::ofstream(path, std::ios::binary) << other;
        // Keep the size; a later modification time is what makes the check run again.
        fs::last_write_time(path, fs::last_write_time(path) + std::chrono::seconds(2));
      },
      [&] { fs::remove(path); },
      [&] { fs::remove(entry(key) / "entry.json"); },
  };
  testing::internal::CaptureStderr();
  for (size_t i = 0; i < damage.size(); ++i) {
    damage[i]();
    if (i < 2) EXPECT_EQ(jit::cache_stats().damaged, 1u) << "damage " << i;
    const size_t runs = jit::compiler_runs();
    EXPECT_EQ(jit::compile_cached(req), path) << "damage " << i;
    EXPECT_EQ(jit::compiler_runs(), runs + 1) << "damage " << i << ": not compiled again";
    EXPECT_EQ(read_file(path).size(), good.size()) << "damage " << i;
    EXPECT_EQ(jit::cache_stats().damaged, 0u) << "damage " << i;
    EXPECT_EQ(jit::compile_in_background(req).get(), path);
    EXPECT_EQ(jit::compiler_runs(), runs + 1) << "damage " << i << ": an intact entry compiled again";
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("was incomplete or damaged"), std::string::npos) << err;
  // The temporaries of the replaced entries are gone.
  EXPECT_EQ(entries_in(dir_ / "tmp"), 0u);
}

}  // namespace

namespace {
// compiled_kernel: a cache lookup that never compiles (`evtc fuzz --compile-for` uses it to tell
// a compiled kernel, which needs no compile slot, from one that would start nvcc).
TEST_F(KernelCache, CompiledKernelFindsOnlyIntactEntries) {
  const jit::CompileRequest req = fallback_request("compiled_kernel lookup");
  EXPECT_FALSE(jit::compiled_kernel(req).has_value());
  EXPECT_EQ(entries_in(dir_ / "kernels"), 0u) << "a lookup must not compile";
  const std::string path = jit::compile_cached(req);
  ASSERT_TRUE(jit::compiled_kernel(req).has_value());
  EXPECT_EQ(*jit::compiled_kernel(req), path);
  std::ofstream(path, std::ios::trunc) << "damaged";
  EXPECT_FALSE(jit::compiled_kernel(req).has_value()) << "a damaged entry is not compiled";
}
}  // namespace

namespace {

std::string this_host() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// Two processes need one kernel at the same moment (torchrun ranks, replicas sharing a cache):
// one runs nvcc, the other waits for its entry.
TEST_F(KernelCache, TwoProcessesNeedingOneKernelCompileItOnce) {
  const jit::CompileRequest req = fallback_request("two processes");
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  const size_t before = jit::compiler_runs();  // the child inherits the count
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char c;
    (void)!read(go[0], &c, 1);  // start together with the parent
    int rc = 100;
    try {
      const std::string path = jit::compile_cached(req);
      rc = fs::exists(path) ? static_cast<int>(jit::compiler_runs() - before) : 101;
    } catch (const std::exception& e) {
      fmt::print(stderr, "{}\n", e.what());
    }
    _exit(rc);
  }
  ScopedEnv quiet("EVTC_LOG", "warning");
  (void)!write(go[1], "x", 1);
  const std::string path = jit::compile_cached(req);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child did not exit";
  const int child_runs = WEXITSTATUS(status);
  ASSERT_LT(child_runs, 100) << "the child's compile failed";
  EXPECT_EQ(jit::compiler_runs() - before + size_t(child_runs), 1u) << "nvcc ran in both processes";
  EXPECT_TRUE(fs::exists(path));
  EXPECT_EQ(entries_in(dir_ / "locks"), 0u) << "a lock was left behind";
  close(go[0]);
  close(go[1]);
}

TEST_F(KernelCache, EntryLocksOfLiveOwnersHoldAndStaleOnesAreTakenOver) {
  fs::create_directories(dir_ / "locks");
  const std::string file = (dir_ / "locks" / "k.lock").string();
  auto write_lock = [&](const std::string& owner) { std::ofstream(file, std::ios::trunc) << owner << "\n"; };
  std::string holder;

  write_lock(fmt::format("{} {}", this_host(), static_cast<long>(getppid())));  // alive, this host
  EXPECT_FALSE(jit::EntryLock::try_acquire(file, &holder).has_value());
  EXPECT_EQ(holder, fmt::format("process {} on {}", static_cast<long>(getppid()), this_host()));

  write_lock(fmt::format("{} {}", this_host(), dead_pid()));  // its owner died
  {
    auto lock = jit::EntryLock::try_acquire(file);
    ASSERT_TRUE(lock.has_value());
    EXPECT_NE(read_file(file).find(std::to_string(getpid())), std::string::npos) << "the lock names its owner";
  }
  EXPECT_FALSE(fs::exists(file)) << "released on destruction";

  write_lock("another-host 4242");  // another host: only its age tells
  EXPECT_FALSE(jit::EntryLock::try_acquire(file).has_value());
  fs::last_write_time(file, fs::file_time_type::clock::now() - std::chrono::seconds(60));
  {
    ScopedEnv timeout("EVTC_LOCK_TIMEOUT", "30");
    EXPECT_TRUE(jit::EntryLock::try_acquire(file).has_value());
  }
  ScopedEnv bad("EVTC_LOCK_TIMEOUT", "soon");
  write_lock("another-host 4242");
  try {
    jit::EntryLock::try_acquire(file);
    ADD_FAILURE() << "EVTC_LOCK_TIMEOUT=soon was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("EVTC_LOCK_TIMEOUT='soon': expected a number of seconds greater than 0"),
              std::string::npos)
        << e.what();
  }
}

// Locks whose owner cannot be the process the lock names, or that name no owner at all: every
// wait ends. The waiting process's own pid (a restarted container with a fixed host name and a
// persistent cache reuses pids) is taken over at once unless this process holds the lock; a pid
// whose process started after the lock was written was reused; a live owner on this host holds
// it at most EVTC_LOCK_TIMEOUT seconds, as one on another host does; a lock file that does not
// read "host pid" (random bytes) holds for ten seconds, and its bytes are never shown.
TEST_F(KernelCache, EntryLocksThatNameNoPlausibleOwnerAreTakenOver) {
  fs::create_directories(dir_ / "locks");
  const std::string file = (dir_ / "locks" / "k.lock").string();
  auto write_lock = [&](const std::string& owner) { std::ofstream(file, std::ios::trunc) << owner; };
  auto age = [&](std::chrono::seconds s) { fs::last_write_time(file, fs::file_time_type::clock::now() - s); };
  std::string holder;

  write_lock(fmt::format("{} {}\n", this_host(), static_cast<long>(getpid())));  // this pid, not held here
  EXPECT_TRUE(jit::EntryLock::try_acquire(file).has_value());
  {
    auto held = jit::EntryLock::try_acquire(file);  // held by this process: still a lock
    ASSERT_TRUE(held.has_value());
    EXPECT_FALSE(jit::EntryLock::try_acquire(file, &holder).has_value());
    EXPECT_EQ(holder, fmt::format("process {} on {}", static_cast<long>(getpid()), this_host()));
  }

  write_lock(fmt::format("{} 1\n", this_host()));  // pid 1: alive, and started before the lock
  EXPECT_FALSE(jit::EntryLock::try_acquire(file).has_value());
  age(std::chrono::seconds(60));
  {
    ScopedEnv timeout("EVTC_LOCK_TIMEOUT", "30");
    EXPECT_TRUE(jit::EntryLock::try_acquire(file).has_value());
  }

  // A live process that started long after the lock was written: its pid was reused.
  write_lock(fmt::format("{} {}\n", this_host(), static_cast<long>(getppid())));
  fs::last_write_time(file, fs::file_time_type::clock::now() - std::chrono::hours(24 * 365 * 20));
  {
    ScopedEnv timeout("EVTC_LOCK_TIMEOUT", "1e12");
    EXPECT_TRUE(jit::EntryLock::try_acquire(file).has_value());
  }

  std::string noise = "\x1b[2J\x01\xff\xfe";
  for (int i = 0; i < 200; ++i) noise += char((i * 37 + 11) % 256);
  write_lock(noise);
  EXPECT_FALSE(jit::EntryLock::try_acquire(file, &holder).has_value());
  EXPECT_EQ(holder, "a process whose lock file does not name it");
  age(std::chrono::seconds(20));
  EXPECT_TRUE(jit::EntryLock::try_acquire(file).has_value());
}

// A compile that finds a lock naming a live process of this host that never finishes (pid 1)
// waits at most EVTC_LOCK_TIMEOUT seconds, saying how long, then compiles.
TEST_F(KernelCache, WaitingForALockThatIsNeverReleasedEnds) {
  const jit::CompileRequest req = fallback_request("lock of pid 1");
  const std::string key = jit::cache_key(req);
  fs::create_directories(dir_ / "locks");
  std::ofstream(dir_ / "locks" / (key + ".lock")) << this_host() << " 1\n";
  ScopedEnv timeout("EVTC_LOCK_TIMEOUT", "2");
  ScopedEnv info("EVTC_LOG", "info");
  const auto start = std::chrono::steady_clock::now();
  testing::internal::CaptureStderr();
  std::string path;
  try {
    path = jit::compile_cached(req);
  } catch (...) {
    testing::internal::GetCapturedStderr();
    throw;
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(fs::exists(path));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  EXPECT_NE(err.find(fmt::format("waiting for process 1 on {}, which is compiling {} into the cache (its lock is "
                                 "taken over when older than EVTC_LOCK_TIMEOUT, 2 s)",
                                 this_host(), req.label)),
            std::string::npos)
      << err;
  EXPECT_EQ(entries_in(dir_ / "locks"), 0u) << "a lock was left behind";
}

// The machine-wide cap: a second process waits for the one slot the first holds.
TEST_F(KernelCache, MachineSlotsCapCompilesAcrossProcesses) {
  const std::string slots = (dir_ / "slots").string();
  int go[2], report[2];
  ASSERT_EQ(pipe(go), 0);
  ASSERT_EQ(pipe(report), 0);
  // The child is forked before the parent takes the slot, so it does not share the slot's open
  // file (a flock belongs to it, and a forked copy would keep it held).
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char c;
    (void)!read(go[0], &c, 1);
    jit::MachineSlot slot(1, slots, [&] { (void)!write(report[1], "w", 1); });
    (void)!write(report[1], "g", 1);
    _exit(0);
  }
  std::optional<jit::MachineSlot> held;
  held.emplace(1, slots);
  const auto t0 = std::chrono::steady_clock::now();
  (void)!write(go[1], "x", 1);
  char c = 0;
  ASSERT_EQ(read(report[0], &c, 1), 1);
  EXPECT_EQ(c, 'w') << "the child got a slot while the parent held the only one";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  held.reset();
  ASSERT_EQ(read(report[0], &c, 1), 1);
  EXPECT_EQ(c, 'g');
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(300));
  int status = 0;
  waitpid(child, &status, 0);
  for (int fd : {go[0], go[1], report[0], report[1]}) close(fd);
}

}  // namespace

namespace {

jit::CompileRequest described_request(const std::string& tag) {
  jit::CompileRequest req = fallback_request(tag);
  req.expression = "out D: bf16 = relu(acc)\n";
  return req;
}

// Listing and pruning: entries carry their expression and label, least recently used first;
// prune removes the unused and then the oldest down to a size; EVTC_CACHE_SIZE_LIMIT prunes
// after each compile.
TEST_F(KernelCache, EntriesAreListedAndPrunedLeastRecentlyUsedFirst) {
  ScopedEnv quiet("EVTC_LOG", "warning");
  ScopedEnv limit("EVTC_CACHE_SIZE_LIMIT", "0");
  std::vector<std::string> keys;
  for (const char* tag : {"lru a", "lru b", "lru c"}) {
    const jit::CompileRequest req = described_request(tag);
    jit::compile_cached(req);
    keys.push_back(jit::cache_key(req));
  }
  // a used 3 days ago, b 2 days ago, c now.
  const auto now = fs::file_time_type::clock::now();
  fs::last_write_time(entry(keys[0]) / "entry.json", now - std::chrono::hours(72));
  fs::last_write_time(entry(keys[1]) / "entry.json", now - std::chrono::hours(48));
  std::vector<jit::CacheEntry> entries = jit::cache_entries();
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].key, keys[0]);
  EXPECT_EQ(entries[2].key, keys[2]);
  EXPECT_EQ(entries[0].expression, "out D: bf16 = relu(acc)\n");
  EXPECT_EQ(entries[0].label, "test lru a");
  EXPECT_TRUE(entries[0].intact);
  EXPECT_GT(entries[0].bytes, 0u);

  jit::PruneResult r = jit::prune_cache(std::nullopt, std::chrono::hours(60));  // unused for 2.5 days
  EXPECT_EQ(r.removed, 1u);
  EXPECT_FALSE(fs::exists(entry(keys[0])));
  r = jit::prune_cache(entries[2].bytes + 1, std::nullopt);  // room for one: the most recent stays
  EXPECT_EQ(r.removed, 1u);
  EXPECT_EQ(r.kept, 1u);
  EXPECT_FALSE(fs::exists(entry(keys[1])));
  EXPECT_TRUE(fs::exists(entry(keys[2]) / "kernel.so"));

  // The limit applies after a compile: the new entry stays, the older one goes.
  ScopedEnv small("EVTC_CACHE_SIZE_LIMIT", std::to_string(entries[2].bytes + 1));
  fs::last_write_time(entry(keys[2]) / "entry.json", now - std::chrono::hours(1));
  const jit::CompileRequest d = described_request("lru d");
  jit::compile_cached(d);
  EXPECT_TRUE(fs::exists(entry(jit::cache_key(d)) / "kernel.so"));
  EXPECT_FALSE(fs::exists(entry(keys[2])));

  EXPECT_EQ(jit::parse_size("10G", "x"), size_t(10) << 30);
  EXPECT_EQ(jit::parse_size("512MiB", "x"), size_t(512) << 20);
  EXPECT_EQ(jit::parse_size("123", "x"), 123u);
  for (const char* bad : {"", "ten", "-1G", "5Q", "1e30"}) EXPECT_THROW(jit::parse_size(bad, "x"), UserError) << bad;
}

}  // namespace

// EVTC_LOG picks the level; set_log_level overrides it; set_default_log_level changes what an
// unset EVTC_LOG means; a value that is no level is said once and the default is used.
TEST(Logging, OneSwitchWithLevels) {
  ScopedEnv unset("EVTC_LOG", std::nullopt);
  reset_log_level();
  EXPECT_EQ(log_level(), LogLevel::info);
  EXPECT_TRUE(log_enabled(LogLevel::info));
  EXPECT_FALSE(log_enabled(LogLevel::debug));
  {
    ScopedEnv debug("EVTC_LOG", "debug");
    EXPECT_EQ(log_level(), LogLevel::debug);
    set_log_level(LogLevel::error);
    EXPECT_EQ(log_level(), LogLevel::error);
    EXPECT_FALSE(log_enabled(LogLevel::warning));
    reset_log_level();
    EXPECT_EQ(log_level(), LogLevel::debug);
  }
  set_default_log_level(LogLevel::warning);
  EXPECT_EQ(log_level(), LogLevel::warning);
  set_default_log_level(LogLevel::info);
  EXPECT_EQ(parse_log_level("warning"), LogLevel::warning);
  EXPECT_EQ(parse_log_level("verbose"), std::nullopt);
  EXPECT_EQ(log_level_names(), (std::vector<std::string>{"error", "warning", "info", "debug"}));
  // Messages are whole lines with the prefix; below the level, nothing.
  testing::internal::CaptureStderr();
  log(LogLevel::info, "one line");
  log(LogLevel::debug, "not shown");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "evtc: one line\n");
  ScopedEnv odd("EVTC_LOG", "chatty");
  testing::internal::CaptureStderr();
  EXPECT_EQ(log_level(), LogLevel::info);
  EXPECT_EQ(log_level(), LogLevel::info);
  const std::string said = testing::internal::GetCapturedStderr();
  // Said once per process (an earlier test may have said it already).
  EXPECT_TRUE(said.empty() || said == "evtc: EVTC_LOG='chatty' is not a level (error, warning, info, debug): using info\n")
      << said;
}
