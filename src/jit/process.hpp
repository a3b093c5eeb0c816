// Starting the compiler: the one way evtc runs another program (fork and execv, no shell, so no
// path needs quoting).
#pragma once
#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace evtc::jit {

// Starts argv (argv[0] is the program's path) in the folder `cwd` (empty: this one) with its
// stdout and stderr on `output_fd`. The child dies with this process. Returns its pid;
// RuntimeError when fork fails.
pid_t spawn_process(const std::vector<std::string>& argv, int output_fd, const std::string& cwd = "");

// Waits for `pid`, calling `tick(seconds since start)` about every 100 ms while it runs. Returns
// its exit status (128 + the signal when a signal ended it).
int wait_process(pid_t pid, const std::function<void(double)>& tick = {});

// Runs argv with its stdout and stderr into the file `log` (created or truncated).
int run_process(const std::vector<std::string>& argv, const std::string& log, const std::string& cwd = "",
                const std::function<void(double)>& tick = {});

// Runs argv and returns what it wrote on stdout and stderr; `status` receives its exit status.
std::string capture_process(const std::vector<std::string>& argv, int* status = nullptr);

}  // namespace evtc::jit
