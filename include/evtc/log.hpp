// evtc's messages: one switch with levels for the C++ library, the CLI and the Python package.
//
//   EVTC_LOG=error|warning|info|debug     (default: info)
//
// error: only what failed; warning: also what ran slower than asked (a fallback to the unfused
// path, a refused kernel library); info: also each kernel compile's start and finish, tuning,
// waits for other processes; debug: also every nvcc command line and the FX pass's reports.
// Messages are single lines on stderr, prefixed "evtc: ". set_log_level (the CLI's --log, Python's
// evtc.set_log_level, TORCH_LOGS=evtc) overrides the environment for the rest of the process.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace evtc {

enum class LogLevel { error = 0, warning = 1, info = 2, debug = 3 };

// The level in effect: set_log_level's if it was called, else EVTC_LOG's, else the default
// (info, or set_default_log_level's). An EVTC_LOG that names no level is said once and the
// default is used.
LogLevel log_level();
void set_log_level(LogLevel level);
// The level used when neither set_log_level nor EVTC_LOG gives one (a tool with its own
// progress display lowers it).
void set_default_log_level(LogLevel level);
// Back to EVTC_LOG's level (undoes set_log_level).
void reset_log_level();

// "error", "warning", "info", "debug"; nullopt for anything else.
std::optional<LogLevel> parse_log_level(std::string_view name);
std::string_view log_level_name(LogLevel level);
// The level names in order, for help texts and validators.
const std::vector<std::string>& log_level_names();

bool log_enabled(LogLevel level);
// evtc's version ("0.1.0"), the one number the library, the CLI and the Python package report.
std::string_view version();
// Writes "evtc: <message>\n" on stderr (one write, whole lines even from several threads) when
// `level` is enabled.
void log(LogLevel level, std::string_view message);

}  // namespace evtc
