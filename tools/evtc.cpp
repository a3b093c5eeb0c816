#include <fmt/format.h>

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <fstream>
#include <regex>
#include <sstream>
#include <vector>

#include "cli.hpp"
#include "evtc/jit.hpp"
#include "evtc/arch.hpp"
#include "evtc/error.hpp"
#include "evtc/log.hpp"

namespace evtc::cli {

ExpressionArg read_expression_arg(const std::string& arg) {
  // A file if one exists by that name (and the argument has no newline); else the text.
  std::error_code ec;
  if (arg.find('\n') == std::string::npos && std::filesystem::is_regular_file(arg, ec)) {
    std::ifstream f(arg);
    if (!f) throw UserError(fmt::format("cannot read '{}': {}", arg, std::strerror(errno)));
    std::stringstream ss;
    ss << f.rdbuf();
    return {ss.str(), arg};
  }
  // Something that exists but is not a regular file is not read (a FIFO would wait for a writer).
  if (arg.find('\n') == std::string::npos && arg.find('=') == std::string::npos) {
    namespace fs = std::filesystem;
    const fs::file_type type = fs::status(arg, ec).type();
    const char* what = type == fs::file_type::directory                                        ? "a folder"
                       : type == fs::file_type::fifo                                           ? "a FIFO"
                       : type == fs::file_type::character || type == fs::file_type::block     ? "a device"
                       : type == fs::file_type::socket                                         ? "a socket"
                                                                                               : nullptr;
    if (what) throw UserError(fmt::format("'{}' is {}, not an expression file", arg, what));
  }
  // Every statement has a '=', so an argument without one, without a call, and shaped like a
  // path (a folder or an extension) is a file name that does not exist.
  const bool path_like = arg.find('/') != std::string::npos ||
                         (arg.rfind('.') != std::string::npos && arg.rfind('.') + 1 < arg.size() &&
                          std::isalpha(static_cast<unsigned char>(arg[arg.rfind('.') + 1])));
  if (arg.find('=') == std::string::npos && arg.find('(') == std::string::npos && path_like)
    throw UserError(fmt::format("no such file: '{}' (and it is not an expression: statements are `out NAME = ...`)", arg));
  return {arg, "expr"};
}

Graph parse_expression_arg(const std::string& arg, const ParseOptions& options) {
  const ExpressionArg e = read_expression_arg(arg);
  return parse_expression(e.text, options, e.name);
}

namespace {

// The command line's layout spellings: r or row, c or col.
std::optional<Layout> layout_of(const std::string& s) {
  if (s == "r" || s == "row") return Layout::row_major;
  if (s == "c" || s == "col") return Layout::col_major;
  return std::nullopt;
}

}  // namespace

Layout parse_layout(const std::string& s) {
  if (auto l = layout_of(s)) return *l;
  throw InternalError(fmt::format("layout '{}' passed layout_value()", s));
}

const CLI::Validator& dtype_value() {
  static const CLI::Validator v = CLI::Validator(
      [](std::string& text) -> std::string {
        const auto t = parse_dtype(text);
        if (!t) return fmt::format("unknown dtype '{}' (expected {})", text, fmt::join(float_dtype_names(), ", "));
        if (is_integer(*t))
          return fmt::format("dtype '{}' is an integer dtype, allowed only for [m] and [n] input vectors (declare "
                             "them in the expression: `input t[m]: {}`); expected {}",
                             text, dtype_name(*t), fmt::join(float_dtype_names(), ", "));
        text = std::string(dtype_name(*t));
        return {};
      },
      fmt::format("{{{}}}", fmt::join(float_dtype_names(), ",")));
  return v;
}

void add_cast_mode_option(CLI::App* sub, std::string& mode) {
  sub->add_option("--cast-mode", mode,
                  "Round where eager PyTorch rounds (eager), only at outputs (fast), or as a compiler fusing the "
                  "ops does: the GEMM's result and the outputs (compile)")
      ->capture_default_str()
      ->check(CLI::IsMember(cast_mode_names()));
}

CastMode cast_mode_option(const std::string& mode) {
  return *cast_mode_named(mode);  // add_cast_mode_option's validator has checked it
}

void add_arch_option(CLI::App* sub, std::string& arch) {
  static const CLI::Validator v = CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          text = fmt::format("sm{}", parse_arch(text, "--arch"));
        } catch (const UserError& e) {
          // CLI11 names the option itself.
          const std::string what = e.what();
          return what.substr(what.find(": ") + 2);
        }
        return {};
      },
      "ARCH");
  sub->add_option("--arch", arch,
                  "GPU architecture to build for: sm80, sm86, sm89, sm90, sm100, sm120, ... (default: the "
                  "device's; fused kernels exist for sm90, and compile-checked ones for sm100 and sm120 (fp8); elsewhere "
                  "the unfused path runs)")
      ->check(v);
}

std::optional<int> arch_option(const std::string& arch) {
  if (arch.empty()) return std::nullopt;
  return parse_arch(arch, "--arch");
}

const CLI::Validator& layout_value() {
  static const CLI::Validator v = CLI::Validator(
      [](std::string& text) -> std::string {
        return layout_of(text) ? std::string() : fmt::format("unknown layout '{}' (expected r or c)", text);
      },
      "{r,c}");
  return v;
}

const CLI::Validator& config_value() {
  static const CLI::Validator v = CLI::Validator(
      [](std::string& text) -> std::string {
        if (KernelConfig::parse(text)) return {};
        return fmt::format("'{}' is not a kernel config name (e.g. coop_128x256x64_c2x1_persistent; "
                           "`evtc tune --list-candidates` lists a shape's)",
                           text);
      },
      "CONFIG");
  return v;
}

const CLI::Validator& visit_order_value() {
  static const CLI::Validator v = CLI::Validator(
      [](std::string& text) -> std::string {
        if (VisitOrder::parse(text)) return {};
        return fmt::format("'{}' is not a tile visiting order ({})", text, VisitOrder::forms());
      },
      "ORDER");
  return v;
}

void GemmFlags::add_to(CLI::App* sub) {
  sub->add_option("--dtype", dtype, "A/B dtype, and default operand/output dtype")
      ->capture_default_str()
      ->check(dtype_value());
  sub->add_option("--dtype-b", dtype_b, "B's dtype when it differs from A's (e.g. f8e5m2)")->check(dtype_value());
  sub->add_option("--layout-a", layout_a, "A layout: r (row-major M×K) or c")
      ->capture_default_str()
      ->check(layout_value());
  sub->add_option("--layout-b", layout_b, "B layout: r (row-major K×N) or c (N×K, K-major)")
      ->capture_default_str()
      ->check(layout_value());
  sub->add_flag("--fast-accum", fast_accum,
                "fp8 A/B: accumulate in the tensor cores throughout K (faster, less accurate)");
  sub->add_flag("--fp8-blockwise", fp8_blockwise,
                "fp8 A/B with block scales (DeepSeek-V3's format): f32 scales per row of A and 128 of K, "
                "and per 128x128 block of B, applied in the main loop");
}

GemmDesc GemmFlags::desc() const {
  GemmDesc g;
  // dtype_value() has checked both.
  const auto a = parse_dtype(dtype);
  const auto b = dtype_b.empty() ? a : parse_dtype(dtype_b);
  if (!a || !b) throw InternalError(fmt::format("dtype '{}'/'{}' passed dtype_value()", dtype, dtype_b));
  g.a_dtype = *a;
  g.b_dtype = *b;
  g.a_layout = parse_layout(layout_a);
  g.b_layout = parse_layout(layout_b);
  if (fast_accum && !is_fp8(*a) && !is_fp8(*b))
    throw UserError(fmt::format("--fast-accum: only fp8 A/B have a fast-accumulation main loop, "
                                "but A and B are {}",
                                dtype_name(*a)));
  g.fp8_fast_accum = fast_accum;
  g.fp8_blockwise = fp8_blockwise;
  if (std::string why = fp8_blockwise_refusal(g); !why.empty()) throw UserError("--fp8-blockwise: " + why);
  return g;
}

ParseOptions GemmFlags::parse_options() const {
  const GemmDesc g = desc();
  ParseOptions p;
  p.operand_dtype = is_fp8(g.a_dtype) ? DType::f32 : g.a_dtype;
  p.output_dtype = is_fp8(g.a_dtype) ? DType::bf16 : g.a_dtype;
  return p;
}

void write_output_file(const std::string& path, const std::string& text, const char* option) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw UserError(fmt::format("{}: cannot write '{}': it is a folder", option, path));
  errno = 0;
  std::ofstream f(path, std::ios::binary);
  if (f) {
    f << text;
    f.close();
  }
  if (!f)
    throw RuntimeError(fmt::format("{}: cannot write '{}': {}", option, path,
                                   errno ? std::strerror(errno) : "write failed"));
}

namespace {

// An integer from `lo` to `hi` written in decimal digits only (no sign, no overflow).
CLI::Validator integer_in(int64_t lo, int64_t hi, const std::string& what) {
  return CLI::Validator(
      [lo, hi, what](std::string& text) -> std::string {
        int64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        if (!digits || ec != std::errc() || ptr != end || v < lo || v > hi)
          return fmt::format("'{}' is not {} (an integer from {} to {})", text, what, lo, hi);
        return {};
      },
      what);
}

}  // namespace

const CLI::Validator& size_value() {
  static const CLI::Validator v = integer_in(1, int64_t(1) << 40, "a size");
  return v;
}

const CLI::Validator& count_value() {
  static const CLI::Validator v = integer_in(0, int64_t(1) << 40, "a count");
  return v;
}

CLI::Validator non_negative_value(const std::string& what) {
  return CLI::Validator(
      [what](std::string& text) -> std::string {
        double v = -1;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec != std::errc() || ptr != end || !std::isfinite(v) || v < 0)
          return fmt::format("'{}' is not {} (a number, 0 or more)", text, what);
        return {};
      },
      what);
}

const CLI::Validator& seed_value() {
  static const CLI::Validator v = CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos || ec != std::errc() ||
            ptr != end)
          return fmt::format("'{}' is not a seed (a non-negative integer below 2^64)", text);
        return {};
      },
      "a seed");
  return v;
}

void check_output_path(const std::string& path, const char* option) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw UserError(fmt::format("{}: cannot write '{}': it is a folder", option, path));
  const fs::path parent = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  if (!fs::is_directory(parent, ec))
    throw RuntimeError(
        fmt::format("{}: cannot write '{}': the folder {} does not exist", option, path, parent.string()));
  if (access(parent.c_str(), W_OK) != 0 || (fs::exists(path, ec) && access(path.c_str(), W_OK) != 0))
    throw RuntimeError(fmt::format("{}: cannot write '{}': permission denied", option, path));
}

std::vector<Shape3> parse_shapes(const std::vector<std::string>& items) {
  static const std::regex re(R"((\d+)x(\d+)x(\d+))");
  std::vector<Shape3> out;
  for (const auto& item : items) {
    std::smatch m;
    if (!std::regex_match(item, m, re) || m[1].length() > 9 || m[2].length() > 9 || m[3].length() > 9)
      throw UserError(fmt::format("--shape: '{}' is not MxNxK (e.g. 4096x4096x1024)", item));
    Shape3 s{std::stoll(m[1]), std::stoll(m[2]), std::stoll(m[3])};
    if (s.m <= 0 || s.n <= 0 || s.k <= 0)
      throw UserError(fmt::format("--shape: '{}' has an empty dimension", item));
    out.push_back(s);
  }
  return out;
}

bool have_gpu(const char* command, const char* hint) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) return true;
  cudaGetLastError();
  fmt::print(stderr, "evtc {}: no CUDA device is available ({})\n", command, hint);
  return false;
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
Command add_grouped_command(CLI::App& app);
Command add_aot_command(CLI::App& app);
Command add_fuzz_command(CLI::App& app);

namespace {

// Where a command that needs a subcommand was given a word that names none (CLI11 says only "A
// subcommand is required"): "unknown command 'cache frob' (the commands of cache: ls, ...)".
// nullopt when every word before the first positional argument names a command.
std::optional<std::string> unknown_command(const CLI::App& app, int argc, char** argv) {
  const CLI::App* at = &app;
  std::string path;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") return std::nullopt;
    if (word.size() > 1 && word[0] == '-') {
      const CLI::Option* o = word.find('=') == std::string::npos ? at->get_option_no_throw(word) : nullptr;
      if (o && o->get_items_expected_min() > 0) ++i;  // its value
      continue;
    }
    const auto all = at->get_subcommands([](const CLI::App*) { return true; });
    const auto it = std::find_if(all.begin(), all.end(), [&](const CLI::App* a) { return a->get_name() == word; });
    if (it != all.end()) {
      at = *it;
      path += (*it)->get_name() + " ";
      continue;
    }
    if (at->get_require_subcommand_min() == 0 || all.empty()) return std::nullopt;
    std::string names;
    for (const CLI::App* a : all) names += (names.empty() ? "" : ", ") + a->get_name();
    return fmt::format("unknown command '{}{}' (the commands{}: {})", path, word,
                       at == &app ? "" : " of " + path.substr(0, path.size() - 1), names);
  }
  return std::nullopt;
}

// SIGTERM and SIGINT: with no compile running, the default action at once; during a compile,
// noted, so the compile stops its compiler and removes its lock and folder as it unwinds, and
// main() then dies of the signal. SIGALRM's default action bounds the unwinding to 10 s.
extern "C" void on_stop_signal(int sig) {
  if (evtc::jit::compiles_in_progress() == 0) {
    signal(sig, SIG_DFL);
    raise(sig);  // delivered when this handler returns
    return;
  }
  evtc::jit::note_interrupt(sig);
  alarm(10);
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT}) sigaction(sig, &sa, nullptr);
}

// Dies of the signal that interrupted a compile, if one did.
void die_if_interrupted() {
  if (const int sig = evtc::jit::interrupt_signal()) {
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

}  // namespace

}  // namespace evtc::cli

int main(int argc, char** argv) {
  using namespace evtc::cli;
  CLI::App app{"evtc: fuses GEMM epilogues into CUTLASS Epilogue-Visitor-Tree kernels"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("evtc ") + std::string(evtc::version()));
  std::string log_level;
  app.add_option("--log", log_level,
                 "Messages to show: error, warning, info (each compile's start and end; the default) or "
                 "debug (also nvcc's command lines); EVTC_LOG sets the same")
      ->check(CLI::IsMember(evtc::log_level_names()))
      ->type_name("LEVEL");
  const std::vector<Command> commands = {
      add_explain_command(app), add_ref_command(app), add_run_command(app),
      add_compile_command(app), add_cache_command(app), add_tune_command(app),
      add_grouped_command(app), add_aot_command(app), add_fuzz_command(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (dynamic_cast<const CLI::RequiredError*>(&e))
      if (const auto unknown = unknown_command(app, argc, argv)) {
        fmt::print(stderr, "{}\nRun with --help for more information.\n", *unknown);
        return kExitUsage;
      }
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  if (!log_level.empty()) evtc::set_log_level(*evtc::parse_log_level(log_level));
  install_stop_handlers();
  try {
    for (const Command& c : commands)
      if (c.app->parsed()) {
        const int rc = c.run();
        die_if_interrupted();
        return rc;
      }
  } catch (const evtc::jit::Interrupted&) {
    die_if_interrupted();
    return kExitFailed;
  } catch (const evtc::UserError& e) {
    fmt::print(stderr, "{}\n", e.what());
    return kExitUsage;
  } catch (const evtc::Error& e) {
    die_if_interrupted();  // an error an interrupted compile caused (a background compile's)
    fmt::print(stderr, "error: {}\n", e.what());
    return kExitFailed;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "error: out of host memory (are the problem sizes much larger than meant?)\n");
    return kExitFailed;
  } catch (const std::filesystem::filesystem_error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return kExitFailed;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return kExitFailed;
  }
  return kExitUsage;
}
