#include <fmt/format.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "cli.hpp"
#include "evtc/error.hpp"

namespace evtc::cli {

std::string read_expression_arg(const std::string& arg) {
  // A file if one exists by that name (and the argument has no newline); else the text.
  if (arg.find('\n') == std::string::npos) {
    std::ifstream f(arg);
    if (f) {
      std::stringstream ss;
      ss << f.rdbuf();
      return ss.str();
    }
  }
  return arg;
}

Layout parse_layout(const std::string& s, const char* which) {
  if (s == "r" || s == "row") return Layout::row_major;
  if (s == "c" || s == "col") return Layout::col_major;
  throw UserError(fmt::format("--layout-{}: expected r or c, got '{}'", which, s));
}

ProgressFn progress_printer(const std::string& what) {
  const bool tty = isatty(fileno(stderr));
  return [what, tty](const std::string& stage, int done, int total) {
    fmt::print(stderr, "{}{}: {} {}/{}{}", tty ? "\r" : "", what, stage, done, total,
               tty && done < total ? "   " : "\n");
  };
}

// One per tools/cmd_*.cpp.
Command add_explain_command(CLI::App& app);
Command add_ref_command(CLI::App& app);
Command add_run_command(CLI::App& app);
Command add_compile_command(CLI::App& app);
Command add_cache_command(CLI::App& app);
Command add_tune_command(CLI::App& app);

}  // namespace evtc::cli

int main(int argc, char** argv) {
  using namespace evtc::cli;
  CLI::App app{"evtc: fuses GEMM epilogues into CUTLASS Epilogue-Visitor-Tree kernels"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("evtc ") + EVTC_CLI_VERSION);
  const std::vector<Command> commands = {
      add_explain_command(app), add_ref_command(app), add_run_command(app),
      add_compile_command(app), add_cache_command(app), add_tune_command(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  try {
    for (const Command& c : commands)
      if (c.app->parsed()) return c.run();
  } catch (const evtc::UserError& e) {
    fmt::print(stderr, "{}\n", e.what());
    return kExitUsage;
  } catch (const evtc::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return kExitFailed;
  }
  return kExitUsage;
}
