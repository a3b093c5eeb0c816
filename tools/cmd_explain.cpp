#include "cli.hpp"

namespace evtc::cli {
Command add_explain_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("explain", "(being written)");
  return {sub, [] { return kExitUsage; }};
}
}  // namespace evtc::cli
