// Runs the built evtc command line (EVTC_CLI_PATH) for CLI tests.
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace evtc::test {

struct CliResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// `env` is prepended to the command line (e.g. "CUDACXX=/nonexistent").
inline CliResult run_cli(const std::string& args, const std::string& env = "") {
  CliResult r;
  FILE* p = popen((env + (env.empty() ? "" : " ") + std::string(EVTC_CLI_PATH) + " " + args + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace evtc::test
