// evtc cache ls|info|clear|prune: the on-disk kernel cache.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli.hpp"
#include "evtc/jit.hpp"

namespace fs = std::filesystem;

namespace evtc::cli {
namespace {

double age_seconds(fs::file_time_type t) {
  return std::chrono::duration<double>(fs::file_time_type::clock::now() - t).count();
}

std::string age_text(double s) {
  if (s < 120) return fmt::format("{:.0f} s", s);
  if (s < 7200) return fmt::format("{:.0f} min", s / 60);
  if (s < 172800) return fmt::format("{:.0f} h", s / 3600);
  return fmt::format("{:.0f} d", s / 86400);
}

// An entry's expression on one line (its statements joined by "; "), shortened for a listing.
std::string one_line(const std::string& expression) {
  std::string line, statement;
  std::istringstream in(expression);
  while (std::getline(in, statement))
    if (!statement.empty()) line += (line.empty() ? "" : "; ") + statement;
  return line.size() > 100 ? line.substr(0, 97) + "..." : line;
}

}  // namespace

Command add_cache_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("cache", "Inspect, prune or clear the kernel cache");
  sub->require_subcommand(1);
  CLI::App* ls = sub->add_subcommand("ls", "List the cached kernels, least recently used first");
  auto json = std::make_shared<bool>(false);
  ls->add_flag("--json", *json, "One JSON object per kernel (key, label, expression, bytes, age_s, intact)");
  CLI::App* info = sub->add_subcommand("info", "The cache folder, its size and the toolchain");
  CLI::App* clear = sub->add_subcommand("clear", "Remove every cached kernel (compiles in progress are kept)");
  CLI::App* prune = sub->add_subcommand(
      "prune", "Remove kernels not used for a while, then least recently used ones down to a size");
  auto max_size = std::make_shared<std::string>();
  auto unused_days = std::make_shared<double>(-1);
  prune->add_option("--max-size", *max_size, "Keep at most this much (bytes, or 512M, 10G); default EVTC_CACHE_SIZE_LIMIT");
  prune->add_option("--unused-days", *unused_days, "Remove kernels no process has loaded for this many days")
      ->check(non_negative_value("a number of days"));
  return {sub, [=] {
            const std::string dir = jit::cache_dir();
            if (clear->parsed()) {
              const jit::ClearResult r = jit::clear_cache();
              fmt::print("removed {} cached kernels from {}\n", r.removed, dir);
              if (r.failed == 0) return kExitOk;
              fmt::print(stderr, "error: could not remove {} item(s), e.g. {}\n", r.failed, r.first_error);
              return kExitFailed;
            }
            if (info->parsed()) {
              const auto s = jit::cache_stats();
              const auto limit = jit::cache_size_limit();
              fmt::print("cache: {}\nentries: {}{}\nsize: {:.1f} MiB (limit: {})\n", dir, s.entries,
                         s.damaged ? fmt::format(" ({} damaged: compiled again when next used)", s.damaged) : "",
                         s.bytes / 1048576.0,
                         limit ? fmt::format("{:.1f} MiB, EVTC_CACHE_SIZE_LIMIT", *limit / 1048576.0) : "none");
              try {
                const auto& tc = jit::toolchain(true);
                fmt::print("nvcc: {} ({})\ncutlass: {} ({})\nevtc headers: {}\n", tc.nvcc, tc.nvcc_version,
                           tc.cutlass_include, tc.cutlass_version, tc.evtc_include);
              } catch (const std::exception& e) {
                fmt::print("toolchain: {}\n", e.what());
              }
              return kExitOk;
            }
            if (prune->parsed()) {
              std::optional<size_t> bytes =
                  max_size->empty() ? jit::cache_size_limit() : std::optional(jit::parse_size(*max_size, "--max-size"));
              std::optional<std::chrono::seconds> unused;
              if (*unused_days >= 0) unused = std::chrono::seconds(static_cast<int64_t>(*unused_days * 86400));
              const jit::PruneResult r = jit::prune_cache(bytes, unused);
              fmt::print("removed {} cached kernels ({:.1f} MiB) from {}; {} kept ({:.1f} MiB)\n", r.removed,
                         r.bytes_freed / 1048576.0, dir, r.kept, r.kept_bytes / 1048576.0);
              if (r.failed == 0) return kExitOk;
              fmt::print(stderr, "error: could not remove {} kernel(s), e.g. {}\n", r.failed, r.first_error);
              return kExitFailed;
            }
            // ls
            for (const jit::CacheEntry& e : jit::cache_entries()) {
              const double age = age_seconds(e.last_used);
              if (*json) {
                const nlohmann::json j = {{"key", e.key},     {"label", e.label}, {"expression", e.expression},
                                          {"bytes", e.bytes}, {"age_s", age},     {"intact", e.intact}};
                fmt::print("{}\n", j.dump());
              } else {
                fmt::print("{}  {:<36}  {:>7.1f} MiB  {:>6}  {}{}\n", e.key, e.label, e.bytes / 1048576.0,
                           age_text(age), one_line(e.expression), e.intact ? "" : "  (damaged)");
              }
            }
            return kExitOk;
          }};
}

}  // namespace evtc::cli
