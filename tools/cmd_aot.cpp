// evtc aot build|show: kernel libraries, compiled ahead of time (include/evtc/kernel_library.hpp).
#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli.hpp"
#include "evtc/error.hpp"
#include "evtc/kernel_library.hpp"
#include "evtc/options.hpp"

namespace evtc::cli {
namespace {

std::string read_text(const std::string& path, const char* option) {
  std::ifstream f(path);
  if (!f) throw UserError(fmt::format("{}: cannot read '{}'", option, path));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

Command add_aot_command(CLI::App& app) {
  struct Args {
    std::string out, preset, show_dir, gpu;
    std::vector<std::string> exprs, lists, shapes, configs;
    GemmFlags gemm;
    bool precise = false, json = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("aot", "Kernel libraries: kernels compiled ahead of time, run with no nvcc");
  sub->require_subcommand(1);

  CLI::App* build = sub->add_subcommand(
      "build", "Compile kernels into a library folder (adds to it if it exists; needs nvcc, not a GPU)");
  build->add_option("-o,--output", a->out, "Library folder")->required();
  build->add_option("--expr", a->exprs, "An epilogue expression, or a file holding one (repeatable)");
  build->add_option("--list", a->lists, "A kernel list (JSON; e.g. written by EVTC_RECORD_KERNELS) (repeatable)")
      ->check(CLI::ExistingFile);
  build->add_option("--preset", a->preset, "A preset list of common epilogues")
      ->check(CLI::IsMember(kernel_list_presets()));
  build->add_option("--shape,-s", a->shapes,
                    "Problem size MxNxK the --expr and --preset kernels are built for (repeat, or "
                    "comma-separated; none: a shape of unknown size)")
      ->delimiter(',');
  build->add_option("--config", a->configs, "Build --expr kernels with this configuration (repeatable)")
      ->check(config_value());
  a->gemm.add_to(build);
  build->add_flag("--precise", a->precise, "Full-precision transcendental math (--expr kernels)");
  build->add_option("--gpu", a->gpu,
                    "Choose each kernel's configuration as on this GPU class, from its selection table "
                    "(default: as here; a machine without that GPU chooses by the rules)")
      ->check(CLI::IsMember(kernel_library_gpus()));

  CLI::App* show = sub->add_subcommand("show", "List a library's kernels and whether it can be used here");
  show->add_option("dir", a->show_dir, "Library folder")->required();
  show->add_flag("--json", a->json, "Print the manifest's kernels as JSON");

  return {sub, [a, build, show] {
            if (show->parsed()) {
              const KernelLibraryInfo info = read_kernel_library(a->show_dir);
              if (a->json) {
                nlohmann::json out = nlohmann::json::array();
                for (const auto& k : info.kernels)
                  out.push_back({{"key", k.key}, {"file", k.file}, {"label", k.label}, {"kind", k.kind},
                                 {"bytes", k.bytes}, {"origin", nlohmann::json::parse(k.origin_json)}});
                fmt::print("{}\n", out.dump(1));
                return kExitOk;
              }
              fmt::print("library: {}\narch: {}\ncutlass: {}\nnvcc: {}\nevtc: {}\ncreated: {}\nkernels: {}\n",
                         info.dir, info.arch, info.cutlass, info.nvcc, info.evtc, info.created, info.kernels.size());
              for (const auto& k : info.kernels)
                fmt::print("  {}  {:<8} {:>6.1f} MiB  {}\n", k.key, k.kind, k.bytes / 1048576.0, k.label);
              try {
                add_kernel_library(a->show_dir);
                fmt::print("usable here: yes\n");
                return kExitOk;
              } catch (const Error& e) {
                fmt::print("usable here: no: {}\n", e.what());
                return kExitFailed;
              }
            }
            (void)build;
            std::vector<std::array<int64_t, 3>> shapes;
            for (const Shape3& s : parse_shapes(a->shapes)) shapes.push_back({s.m, s.n, s.k});
            if (a->exprs.empty() && a->lists.empty() && a->preset.empty())
              throw UserError("aot build: nothing to build: give --expr, --list or --preset");
            if (!a->configs.empty() && a->exprs.empty())
              throw UserError("--config: applies to --expr kernels, and none was given");
            // Every source becomes one kernel list; the library takes them in turn.
            std::vector<std::pair<std::string, std::string>> lists;  // (what, JSON)
            if (!a->exprs.empty()) {
              OptionText o = option_text(a->gemm.desc(), CastMode::eager, a->precise);
              const ParseOptions p = a->gemm.parse_options();
              o.operand_dtype = dtype_name(p.operand_dtype);
              o.output_dtype = dtype_name(p.output_dtype);
              nlohmann::json kernels = nlohmann::json::array();
              for (const auto& e : a->exprs) {
                nlohmann::json s = nlohmann::json::array();
                for (const auto& [m, n, k] : shapes) {
                  if (a->configs.empty()) s.push_back({{"m", m}, {"n", n}, {"k", k}});
                  for (const auto& c : a->configs) s.push_back({{"m", m}, {"n", n}, {"k", k}, {"config", c}});
                }
                if (shapes.empty())
                  for (const auto& c : a->configs) s.push_back({{"config", c}});
                nlohmann::json entry = {{"expr", read_expression_arg(e).text}, {"options", nlohmann::json::parse(option_text_json(o))}};
                if (!s.empty()) entry["shapes"] = s;
                kernels.push_back(entry);
              }
              lists.emplace_back("--expr", kernel_list_of(kernels.dump()));
            }
            for (const auto& l : a->lists) lists.emplace_back("--list " + l, read_text(l, "--list"));
            if (!a->preset.empty()) lists.emplace_back("--preset " + a->preset, preset_kernel_list(a->preset, shapes));
            int rc = kExitOk;
            for (const auto& [what, json] : lists) {
              LibraryBuildResult r;
              try {
                r = build_kernel_library(json, a->out, progress_printer("evtc aot: " + what), a->gpu);
              } catch (const UserError& e) {
                throw UserError(fmt::format("{}: {}", what, e.what()));
              }
              fmt::print("{}: {} kernels in {} ({} added, {} compiled by nvcc, {:.1f} s)\n", what, r.kernels, r.dir,
                         r.added, r.compiled, r.seconds);
              for (const auto& e : r.errors) fmt::print(stderr, "  not built: {}\n", e);
              if (!r.errors.empty()) rc = kExitFailed;
            }
            return rc;
          }};
}

}  // namespace evtc::cli
