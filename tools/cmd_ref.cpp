#include "cli.hpp"

namespace evtc::cli {
Command add_ref_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("ref", "(being written)");
  return {sub, [] { return kExitUsage; }};
}
}  // namespace evtc::cli
