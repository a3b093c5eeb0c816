// evtc cache ls|info|clear: the on-disk kernel cache.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "cli.hpp"
#include "jit/kernel_cache.hpp"
#include "jit/toolchain.hpp"

namespace fs = std::filesystem;

namespace evtc::cli {

Command add_cache_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("cache", "Inspect or clear the kernel cache");
  auto action = std::make_shared<std::string>();
  sub->add_option("action", *action, "ls, info or clear")
      ->required()
      ->check(CLI::IsMember({"ls", "info", "clear"}));
  return {sub, [action] {
            const std::string dir = jit::cache_dir();
            if (*action == "clear") {
              const jit::ClearResult r = jit::clear_cache();
              fmt::print("removed {} cached kernels from {}\n", r.removed, dir);
              if (r.failed == 0) return kExitOk;
              fmt::print(stderr, "error: could not remove {} item(s), e.g. {}\n", r.failed, r.first_error);
              return kExitFailed;
            }
            if (*action == "info") {
              const auto s = jit::cache_stats();
              fmt::print("cache: {}\nentries: {}{}\nsize: {:.1f} MiB\n", dir, s.entries,
                         s.damaged ? fmt::format(" ({} damaged: compiled again when next used)", s.damaged) : "",
                         s.bytes / 1048576.0);
              try {
                const auto& tc = jit::toolchain(true);
                fmt::print("nvcc: {} ({})\ncutlass: {} ({})\n", tc.nvcc, tc.nvcc_version,
                           tc.cutlass_include, tc.cutlass_version);
              } catch (const std::exception& e) {
                fmt::print("toolchain: {}\n", e.what());
              }
              return kExitOk;
            }
            const fs::path kernels = fs::path(dir) / "kernels";
            std::error_code ec;
            if (!fs::exists(kernels, ec)) return kExitOk;
            for (const auto& e : fs::directory_iterator(kernels, ec)) {
              if (!e.is_directory(ec) || !fs::exists(e.path() / "kernel.so", ec)) continue;
              // The first comment lines of kernel.cu name what the entry is.
              std::ifstream f(e.path() / "kernel.cu");
              std::string first, second;
              std::getline(f, first);
              std::getline(f, second);
              fmt::print("{}  {}\n", e.path().filename().string(), second.size() > 3 ? second.substr(3) : "");
            }
            return kExitOk;
          }};
}

}  // namespace evtc::cli
