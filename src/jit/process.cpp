#include "jit/process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <thread>

#include <fmt/format.h>

#include "evtc/error.hpp"

namespace evtc::jit {

pid_t spawn_process(const std::vector<std::string>& argv, int output_fd, const std::string& cwd) {
  if (argv.empty()) throw InternalError("spawn_process: no program");
  // Everything the child needs is built before fork (only async-signal-safe calls after it).
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw RuntimeError(fmt::format("cannot start {}: fork failed", argv[0]));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // a compile does not outlive evtc's process
    if (getppid() != parent) _exit(127);  // the parent is already gone
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
  return pid;
}

int wait_process(pid_t pid, const std::function<void(double)>& tick) {
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  while (true) {
    const pid_t r = waitpid(pid, &status, tick ? WNOHANG : 0);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) throw RuntimeError("waitpid failed while waiting for the compiler");
    if (r == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      tick(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
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
