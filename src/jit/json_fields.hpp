// Typed fields of JSON files a person may have written or edited (kernel lists, library
// manifests): a wrong type is an error naming the field and the value found ("\"m\" must be a
// whole number from 0 to 2147483647, not 4.5"), never nlohmann-json's "type_error.302". Each
// function takes `bad`, which turns that text into the exception to throw (naming the file and
// the entry).
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace evtc::jit::json_fields {

// A value as it appears in the file, cut short (a field may hold a whole document).
inline std::string shown(const nlohmann::json& v) {
  std::string s = v.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// The field `name` of `object`, or nullopt when it is absent (or null, with `null_is_absent`).
inline const nlohmann::json* find(const nlohmann::json& object, const char* name, bool null_is_absent = false) {
  const auto it = object.find(name);
  if (it == object.end() || (null_is_absent && it->is_null())) return nullptr;
  return &*it;
}

template <class Bad>
const nlohmann::json& required(const nlohmann::json& object, const char* name, const Bad& bad) {
  const nlohmann::json* v = find(object, name);
  if (!v) throw bad(fmt::format("has no \"{}\"", name));
  return *v;
}

template <class Bad>
std::string string_of(const nlohmann::json& v, const char* name, const Bad& bad) {
  if (!v.is_string()) throw bad(fmt::format("\"{}\" must be a string, not {}", name, shown(v)));
  return v.get<std::string>();
}

template <class Bad>
bool bool_of(const nlohmann::json& v, const char* name, const Bad& bad) {
  if (!v.is_boolean()) throw bad(fmt::format("\"{}\" must be true or false, not {}", name, shown(v)));
  return v.get<bool>();
}

// A whole number from `lo` to `hi` (4.5, 1e300, "8" and numbers past `hi` are refused). The
// range is named when it is narrower than int64's.
template <class Bad>
int64_t integer_of(const nlohmann::json& v, const char* name, const Bad& bad, int64_t lo = 0,
                   int64_t hi = std::numeric_limits<int64_t>::max()) {
  const bool whole =
      v.is_number_integer() &&
      (v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(hi) && (lo <= 0 || v.get<uint64_t>() >= uint64_t(lo))
                              : v.get<int64_t>() >= lo && v.get<int64_t>() <= hi);
  if (!whole)
    throw bad(hi == std::numeric_limits<int64_t>::max() && lo == 0
                  ? fmt::format("\"{}\" must be a whole number, not {}", name, shown(v))
                  : fmt::format("\"{}\" must be a whole number from {} to {}, not {}", name, lo, hi, shown(v)));
  return v.get<int64_t>();
}

template <class Bad>
std::string string_field(const nlohmann::json& object, const char* name, const Bad& bad,
                         std::optional<std::string> fallback = std::nullopt) {
  const nlohmann::json* v = find(object, name);
  if (!v && fallback) return *fallback;
  return string_of(v ? *v : required(object, name, bad), name, bad);
}

template <class Bad>
bool bool_field(const nlohmann::json& object, const char* name, const Bad& bad, bool fallback) {
  const nlohmann::json* v = find(object, name);
  return v ? bool_of(*v, name, bad) : fallback;
}

template <class Bad>
int64_t integer_field(const nlohmann::json& object, const char* name, const Bad& bad,
                      std::optional<int64_t> fallback = std::nullopt, int64_t lo = 0,
                      int64_t hi = std::numeric_limits<int64_t>::max()) {
  const nlohmann::json* v = find(object, name);
  if (!v && fallback) return *fallback;
  return integer_of(v ? *v : required(object, name, bad), name, bad, lo, hi);
}

}  // namespace evtc::jit::json_fields
