#include "jit/process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <thread>

#include <fmt/format.h>

#include "evtc/error.hpp"

namespace evtc::jit {

namespace {

volatile std::sig_atomic_t interrupt_signal_seen = 0;
std::atomic<int> compiles_running{0};

// The supervisor's end: what the compiler's wait status says, as an exit code (128 + the signal
// when a signal ended it), so that wait_process reads the same through the supervisor.
[[noreturn]] void exit_like(int status) {
  _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

}  // namespace

pid_t spawn_process(const std::vector<std::string>& argv, int output_fd, const std::string& cwd) {
  if (argv.empty()) throw InternalError("spawn_process: no program");
  // Everything the children need is built before fork (only async-signal-safe calls after it).
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  sigset_t watched, old_mask;
  sigemptyset(&watched);
  for (int sig : {SIGCHLD, SIGHUP, SIGTERM, SIGINT}) sigaddset(&watched, sig);
  // Blocked in this thread across the fork, so the supervisor starts with them blocked.
  pthread_sigmask(SIG_BLOCK, &watched, &old_mask);
  const pid_t pid = fork();
  if (pid < 0) {
    pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
    throw RuntimeError(fmt::format("cannot start {}: fork failed", argv[0]));
  }
  if (pid == 0) {
    // The supervisor: the leader of a process group that holds the program and every process it
    // starts (nvcc starts cicc, ptxas, cudafe++). It dies with evtc's thread (SIGHUP), and then,
    // or when asked to stop, kills the whole group, so no compiler outlives evtc.
    setpgid(0, 0);
    for (int sig : {SIGCHLD, SIGHUP, SIGTERM, SIGINT}) signal(sig, SIG_DFL);
    prctl(PR_SET_PDEATHSIG, SIGHUP);
    if (getppid() != parent) _exit(127);  // the parent is already gone
    const pid_t program = fork();
    if (program < 0) _exit(127);
    if (program == 0) {
      sigprocmask(SIG_SETMASK, &old_mask, nullptr);
      if (output_fd >= 0) {
        dup2(output_fd, 1);
        dup2(output_fd, 2);
      }
      if (!cwd.empty() && chdir(cwd.c_str()) != 0) {
        static const char msg[] = "evtc: cannot enter the compile folder\n";
        const ssize_t ignored = write(2, msg, sizeof msg - 1);
        (void)ignored;
        _exit(126);
      }
      execv(args[0], args.data());
      _exit(127);
    }
    for (;;) {
      int sig = 0;
      if (sigwait(&watched, &sig) != 0) continue;
      if (sig == SIGCHLD) {
        int status = 0;
        if (waitpid(program, &status, WNOHANG) == program) exit_like(status);
        continue;
      }
      kill(0, SIGKILL);  // evtc died, or asked: the group, this process included
      _exit(128 + sig);
    }
  }
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  setpgid(pid, pid);  // also here, so that a kill of the group right away finds it
  return pid;
}

void stop_process(pid_t pid) {
  kill(-pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

void note_interrupt(int sig) { interrupt_signal_seen = sig; }

int interrupt_signal() { return interrupt_signal_seen; }

int compiles_in_progress() { return compiles_running.load(); }

CompileInProgress::CompileInProgress() { compiles_running.fetch_add(1); }
CompileInProgress::~CompileInProgress() { compiles_running.fetch_sub(1); }

void throw_if_interrupted() {
  if (const int sig = interrupt_signal())
    throw Interrupted(fmt::format("interrupted by signal {} ({})", sig, strsignal(sig)));
}

int wait_process(pid_t pid, const std::function<void(double)>& tick) {
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  while (true) {
    if (interrupt_signal()) {
      stop_process(pid);
      throw_if_interrupted();
    }
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) throw RuntimeError("waitpid failed while waiting for the compiler");
    if (r == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(tick ? 100 : 20));
      if (tick) tick(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int run_process(const std::vector<std::string>& argv, const std::string& log, const std::string& cwd,
                const std::function<void(double)>& tick) {
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw RuntimeError(fmt::format("cannot write the compile log {}", log));
  pid_t pid = -1;
  try {
    pid = spawn_process(argv, fd, cwd);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return wait_process(pid, tick);
}

std::string capture_process(const std::vector<std::string>& argv, int* status) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw RuntimeError(fmt::format("cannot start {}: no pipe", argv.at(0)));
  pid_t pid = -1;
  try {
    pid = spawn_process(argv, fds[1]);
  } catch (...) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw;
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    out.append(buf, size_t(n));
  }
  ::close(fds[0]);
  const int rc = wait_process(pid);
  if (status) *status = rc;
  return out;
}

}  // namespace evtc::jit
