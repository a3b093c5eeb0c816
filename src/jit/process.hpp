// Starting the compiler: the one way evtc runs another program (fork and execv, no shell, so no
// path needs quoting).
#pragma once
#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "evtc/error.hpp"
#include "evtc/jit.hpp"

namespace evtc::jit {

// Starts argv (argv[0] is the program's path) in the folder `cwd` (empty: this one) with its
// stdout and stderr on `output_fd`, under a supervisor process: the leader of a new process group
// holding the program and every process it starts. When the thread that started it dies (evtc
// killed, even by SIGKILL), the supervisor kills the whole group, so neither the program nor its
// children (nvcc's cicc, ptxas, cudafe++) outlive evtc. Returns the supervisor's pid (its exit
// status is the program's); RuntimeError when fork fails.
pid_t spawn_process(const std::vector<std::string>& argv, int output_fd, const std::string& cwd = "");
// Kills what spawn_process started (the whole group) and reaps it.
void stop_process(pid_t pid);

// Waits for `pid`, calling `tick(seconds since start)` about every 100 ms while it runs. Returns
// its exit status (128 + the signal when a signal ended it). When an interrupt was noted
// (note_interrupt), stops the process and throws Interrupted.
int wait_process(pid_t pid, const std::function<void(double)>& tick = {});

// Interrupts (Interrupted, note_interrupt, interrupt_signal, compiles_in_progress): evtc/jit.hpp.
void throw_if_interrupted();
struct CompileInProgress {
  CompileInProgress();
  ~CompileInProgress();
  CompileInProgress(const CompileInProgress&) = delete;
  CompileInProgress& operator=(const CompileInProgress&) = delete;
};

// Runs argv with its stdout and stderr into the file `log` (created or truncated).
int run_process(const std::vector<std::string>& argv, const std::string& log, const std::string& cwd = "",
                const std::function<void(double)>& tick = {});

// Runs argv and returns what it wrote on stdout and stderr; `status` receives its exit status.
std::string capture_process(const std::vector<std::string>& argv, int* status = nullptr);

}  // namespace evtc::jit
