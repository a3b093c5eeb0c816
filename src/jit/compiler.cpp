// The compiler's invocation for the kernel cache: nvcc's command lines, a run that keeps what
// it prints (with a progress line on a terminal), the two-part compile of dense CUTLASS
// kernels, and the first errors of a failed compile.
#include <fmt/format.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <sstream>

#include "evtc/error.hpp"
#include "jit/cache_internals.hpp"
#include "jit/process.hpp"
#include "support/logging.hpp"

namespace evtc::jit::detail {

// Runs argv in the folder `cwd` and keeps what it prints, also in the file `log` when one is
// named; with `show_progress`, shows a progress line on stderr while it takes longer than a
// second (on a terminal, at log level info; elsewhere the compile's start and finish lines stand
// alone). Compiles run in their own folder and name their files relatively. The output goes to a
// file in the system's temporary folder (or, without one, in `cwd`) while the compiler runs and is
// copied to `log` after, where that can be written: the cache folder may be on the very disk
// that is full, and the compiler's own words ("No space left on device") must still reach the
// error.
CompilerRun run_compiler(const std::vector<std::string>& argv, const std::optional<fs::path>& log,
                         const std::string& label, const fs::path& cwd, bool show_progress) {
  const bool show = show_progress && isatty(2) && log_enabled(LogLevel::info);
  bool shown = false;
  std::string capture = (fs::temp_directory_path() / "evtc-compiler-output-XXXXXX").string();
  int fd = ::mkstemp(capture.data());
  if (fd < 0) {
    capture = (cwd / "compiler-output-XXXXXX").string();
    fd = ::mkstemp(capture.data());
  }
  if (fd >= 0) ::close(fd);
  CompilerRun run;
  try {
    run.rc = run_process(argv, capture, cwd.string(), [&](double secs) {
      if (show && secs >= 1.0) {
        fmt::print(stderr, "\r\033[Kevtc: compiling {} ({:.0f} s)", label, secs);
        shown = true;
      }
    });
  } catch (...) {  // interrupted: the output file goes too
    if (shown) fmt::print(stderr, "\r\033[K");
    std::error_code ec;
    fs::remove(capture, ec);
    throw;
  }
  if (shown) fmt::print(stderr, "\r\033[K");
  run.output = read_file(capture);
  std::error_code ec;
  fs::remove(capture, ec);
  if (log) {
    try {
      write_file(*log, run.output);
    } catch (const RuntimeError&) {
      // The cache's disk is full or read-only: the output is still in the error message.
    }
  }
  return run;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

std::string first_errors(const std::string& log, size_t max_lines) {
  std::stringstream in(log);
  std::string line, out;
  size_t n = 0;
  while (std::getline(in, line) && n < max_lines)
    if (line.find("error") != std::string::npos || line.find("No space left") != std::string::npos ||
        line.find("fatal") != std::string::npos || line.find("Killed") != std::string::npos) {
      out += "  " + line + "\n";
      ++n;
    }
  if (out.empty()) {  // no line says "error": show the tail
    std::stringstream again(log);
    std::vector<std::string> lines;
    while (std::getline(again, line)) lines.push_back(line);
    for (size_t i = lines.size() > max_lines ? lines.size() - max_lines : 0; i < lines.size(); ++i)
      out += "  " + lines[i] + "\n";
  }
  if (out.empty()) out = "  (the compiler printed nothing; its command line is in command.txt beside the log)\n";
  return out;
}

std::atomic<size_t>& compiler_run_count() {
  static std::atomic<size_t> n{0};
  return n;
}

std::string command_line(const std::vector<std::string>& argv) {
  std::string command;
  for (const auto& a : argv) command += (command.empty() ? "" : " ") + a;
  return command;
}

// nvcc with `flags` and `includes`, writing `out` from `inputs` (names in the compile's folder).
std::vector<std::string> nvcc_argv(const Toolchain& tc, const std::vector<std::string>& flags,
                                   const std::vector<std::string>& includes, const std::string& out,
                                   const std::vector<std::string>& inputs) {
  std::vector<std::string> argv = {tc.nvcc};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), includes.begin(), includes.end());
  argv.push_back("-o");
  argv.push_back(out);
  argv.insert(argv.end(), inputs.begin(), inputs.end());
  return argv;
}

// Writes a compile's command lines into its command.txt, and prints them when
// EVTC_LOG=debug.
void record_commands(const fs::path& tmp, const std::vector<std::vector<std::string>>& commands) {
  std::string text;
  for (const auto& argv : commands) text += command_line(argv) + "\n";
  write_file(tmp / "command.txt", text);
  for (const auto& argv : commands) log_debug("{}", command_line(argv));
}

// CompileRequest::in_parts: the device and host parts in parallel, then the link. Writes
// command.txt and compile.log (the three logs in turn) into `tmp`; returns nvcc's exit code
// (the first that failed) and that log.
CompilerRun compile_in_parts(const CompileRequest& req, const Toolchain& tc, const fs::path& tmp) {
  const std::vector<std::string> includes = {"-I" + tc.cutlass_include, "-I" + tc.evtc_include};
  const auto device = nvcc_argv(tc, device_part_flags(req.sm, req.backend), includes, "kernel.cubin", {"kernel.cu"});
  const auto host = nvcc_argv(tc, host_part_flags(req.sm, req.backend), includes, "host.o", {"kernel.cu"});
  // The cubin becomes the host part's evtc_kernel_image (hidden: each library its own).
  write_file(tmp / "image.cpp",
             "// The device part's cubin, as the host part's evtc_kernel_image.\n"
             "__asm__(\".section .rodata\\n.balign 128\\n.globl evtc_kernel_image\\n"
             ".hidden evtc_kernel_image\\n.type evtc_kernel_image, @object\\nevtc_kernel_image:\\n"
             ".incbin \\\"kernel.cubin\\\"\\n.byte 0\\n.previous\\n\");\n");
  const auto link = nvcc_argv(tc, link_parts_flags(req.sm, req.backend), {}, "kernel.so", {"host.o", "image.cpp"});
  record_commands(tmp, {device, host, link});

  // Each part's output is kept in memory; compile.log gets them all below.
  auto device_run = std::async(std::launch::async, [&] { return run_compiler(device, std::nullopt, req.label, tmp); });
  const CompilerRun host_run = run_compiler(host, std::nullopt, req.label, tmp, false);
  const CompilerRun device_done = device_run.get();
  CompilerRun all;  // each part's output under its name; empty when no part printed anything
  all.rc = device_done.rc != 0 ? device_done.rc : host_run.rc;
  auto add_log = [&](const char* part, const CompilerRun& r) {
    if (!r.output.empty()) all.output += fmt::format("== {} (exit {})\n{}", part, r.rc, r.output);
  };
  add_log("device part", device_done);
  add_log("host part", host_run);
  if (all.rc == 0) {
    const CompilerRun link_run = run_compiler(link, std::nullopt, req.label, tmp, false);
    all.rc = link_run.rc;
    add_log("link", link_run);
  }
  if (all.rc == 0) {  // the library holds both parts
    std::error_code ec;
    for (const char* name : {"kernel.cubin", "host.o", "image.cpp"}) fs::remove(tmp / name, ec);
  }
  try {
    write_file(tmp / "compile.log", all.output);
  } catch (const RuntimeError&) {
    // A full or read-only disk: the output goes into the error message instead.
  }
  return all;
}

}  // namespace evtc::jit::detail
