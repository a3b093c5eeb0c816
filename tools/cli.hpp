// The evtc command-line tool: each subcommand lives in its own tools/cmd_*.cpp as an
// add_*_command function, listed in tools/evtc.cpp.
// Exit codes: 0 success; 1 a check failed or a run failed (CUDA, compiler); 2 bad usage or
// bad input (an unknown option, a parse error in an expression).
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "evtc/expression.hpp"
#include "evtc/runtime.hpp"

namespace evtc::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;

struct Command {
  CLI::App* app;             // the subcommand, created on the main app
  std::function<int()> run;  // called when it was chosen; returns the exit code
};

// An argument that is either an expression or the path of a file holding one: its text, and
// the name diagnostics give it (the file's path, or "expr").
struct ExpressionArg {
  std::string text;
  std::string name;
};
// UserError "no such file" for a path-shaped argument (no '=', no call) that names no file.
ExpressionArg read_expression_arg(const std::string& arg);
// read_expression_arg, then parse_expression with diagnostics naming the file.
Graph parse_expression_arg(const std::string& arg, const ParseOptions& options = {});

// A --layout-a/--layout-b value (layout_value() has checked it): r or row, c or col.
Layout parse_layout(const std::string& s);

// Validators listing their choices in --help and in their error: a dtype (the canonical names
// of float_dtype_names(); aliases such as bfloat16 or e4m3 are accepted and made canonical) and a
// layout (r or c; row and col accepted).
const CLI::Validator& dtype_value();
const CLI::Validator& layout_value();
// A kernel configuration name (KernelConfig::parse), e.g. coop_128x256x64_c2x1_persistent.
const CLI::Validator& config_value();
// --visit-order: a VisitOrder name (evtc/kernel_config.hpp).
const CLI::Validator& visit_order_value();

// --arch: the GPU architecture to build for (evtc/arch.hpp: sm80, sm86, sm90, sm120, ...),
// checked by parse_arch; empty: the device's (EVTC_ARCH overrides both).
void add_arch_option(CLI::App* sub, std::string& arch);
std::optional<int> arch_option(const std::string& arch);

// --cast-mode: where the epilogue rounds (evtc/passes.hpp, CastMode; its names are
// cast_mode_names(), which the option's validator checks), default eager.
void add_cast_mode_option(CLI::App* sub, std::string& mode);
CastMode cast_mode_option(const std::string& mode);

// The GEMM options run, compile and tune share: --dtype (A's, and B's unless --dtype-b),
// --dtype-b, --layout-a, --layout-b and --fast-accum (fp8 only).
struct GemmFlags {
  std::string dtype = "bf16", dtype_b, layout_a = "r", layout_b = "r";
  bool fast_accum = false;
  bool fp8_blockwise = false;

  void add_to(CLI::App* sub);
  // Checked values; UserError naming the option otherwise.
  GemmDesc desc() const;
  // Operand and output dtypes for names the expression does not declare: A's dtype, or for
  // fp8 A/B f32 operands and bf16 outputs.
  ParseOptions parse_options() const;
};

// Writes `text` to the file at `path` (an option's value, e.g. --emit); RuntimeError (exit 1)
// naming the option, the path and why when it cannot be written completely; UserError (exit 2)
// when `path` is a folder.
void write_output_file(const std::string& path, const std::string& text, const char* option);
// Checks, before long work, that write_output_file could write `path` (not a folder: UserError,
// exit 2; its folder exists and is writable: RuntimeError, exit 1), naming the path.
void check_output_path(const std::string& path, const char* option);

// Validators of numeric options, with messages that name the allowed values: a problem size
// (an integer from 1 to 2^40; CLI11's own range check printed a 309-digit bound), a count that
// may be 0, and a seed (a non-negative integer that fits 64 bits: "-1" wrapped around before).
const CLI::Validator& size_value();
const CLI::Validator& count_value();
const CLI::Validator& seed_value();
// A number of `what` ("days", "seconds") that is finite and 0 or more (CLI11's NonNegativeNumber
// printed a 309-digit bound, and took nan).
CLI::Validator non_negative_value(const std::string& what);

// A --shape value: MxNxK, positive sizes of at most 9 digits.
struct Shape3 {
  int64_t m, n, k;
};
// Parses --shape values; UserError naming the option and the bad value.
std::vector<Shape3> parse_shapes(const std::vector<std::string>& items);

// Whether a CUDA device is available; if not, says so on stderr as "evtc COMMAND: no CUDA device
// is available (HINT)". Commands that run on the GPU call it before compiling anything.
bool have_gpu(const char* command, const char* hint);

// Prints progress of long work ("compiling 3/8"): on a terminal one line rewritten in place,
// otherwise a line per step.
ProgressFn progress_printer(const std::string& what);

}  // namespace evtc::cli
