#include "runtime/selection/tuning_store.hpp"

#include "runtime/selection/candidates.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "evtc/error.hpp"
#include "jit/kernel_cache.hpp"

namespace fs = std::filesystem;

namespace evtc::tuning {
namespace {

constexpr int kRecordFormat = 1;

}  // namespace

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string problem_key(const ProblemIdentity& id) {
  const std::string material =
      fmt::format("graph={};a={}/{};b={}/{};precise={};arch=sm{};device={}{}{}", id.graph_hash,
                  dtype_name(id.gemm.a_dtype), id.gemm.a_layout == Layout::row_major ? "r" : "c",
                  dtype_name(id.gemm.b_dtype), id.gemm.b_layout == Layout::row_major ? "r" : "c",
                  id.precise_math, id.arch, id.device_name,
                  id.gemm.fp8_fast_accum ? ";fp8_fast_accum" : "",
                  id.gemm.fp8_blockwise ? ";fp8_blockwise" : "");
  return fmt::format("{:016x}", XXH3_64bits(material.data(), material.size()));
}

std::string TuningRecord::to_json() const {
  nlohmann::json j;
  j["format"] = kRecordFormat;
  j["m"] = m;
  j["n"] = n;
  j["k"] = k;
  j["config"] = best.name();
  j["median_ms"] = best_ms;
  j["order"] = order.name();
  if (!orders.empty()) {
    j["orders"] = nlohmann::json::array();
    for (const auto& [name, ms] : orders) j["orders"].push_back({{"order", name}, {"median_ms", ms}});
  }
  j["graph_hash"] = identity.graph_hash;
  j["a"] = {{"dtype", dtype_name(identity.gemm.a_dtype)},
            {"layout", identity.gemm.a_layout == Layout::row_major ? "row" : "col"}};
  j["b"] = {{"dtype", dtype_name(identity.gemm.b_dtype)},
            {"layout", identity.gemm.b_layout == Layout::row_major ? "row" : "col"}};
  j["precise_math"] = identity.precise_math;
  j["fp8_fast_accum"] = identity.gemm.fp8_fast_accum;
  j["fp8_blockwise"] = identity.gemm.fp8_blockwise;
  j["arch"] = fmt::format("sm_{}a", identity.arch);
  j["device"] = identity.device_name;
  j["tuned_at"] = tuned_at;
  j["candidates"] = nlohmann::json::array();
  for (const auto& c : candidates) {
    nlohmann::json e{{"config", c.config}};
    if (c.median_ms >= 0) e["median_ms"] = c.median_ms;
    else e["error"] = c.error;
    j["candidates"].push_back(e);
  }
  return j.dump(2) + "\n";
}

TuningRecord TuningRecord::from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw RuntimeError(fmt::format("tuning record is not JSON: {}", e.what()));
  }
  if (j.value("format", 0) != kRecordFormat)
    throw RuntimeError(fmt::format("tuning record has format {}, expected {}", j.value("format", 0),
                                   kRecordFormat));
  TuningRecord r;
  try {
    r.m = j.at("m").get<int64_t>();
    r.n = j.at("n").get<int64_t>();
    r.k = j.at("k").get<int64_t>();
    const std::string name = j.at("config").get<std::string>();
    const auto cfg = KernelConfig::parse(name);
    if (!cfg) throw RuntimeError(fmt::format("tuning record names an unknown config '{}'", name));
    r.best = *cfg;
    r.best_ms = j.at("median_ms").get<double>();
    // Records written before orders were tuned ran with CUTLASS's heuristic order.
    if (j.contains("order")) {
      const std::string order = j.at("order").get<std::string>();
      const auto parsed = VisitOrder::parse(order);
      if (!parsed) throw RuntimeError(fmt::format("tuning record names an unknown visiting order '{}'", order));
      r.order = *parsed;
    }
    for (const auto& e : j.value("orders", nlohmann::json::array()))
      r.orders.emplace_back(e.at("order").get<std::string>(), e.at("median_ms").get<double>());
    r.identity.graph_hash = j.at("graph_hash").get<std::string>();
    r.identity.device_name = j.at("device").get<std::string>();
    r.identity.precise_math = j.value("precise_math", false);
    r.identity.gemm.fp8_fast_accum = j.value("fp8_fast_accum", false);
    r.identity.gemm.fp8_blockwise = j.value("fp8_blockwise", false);
    r.tuned_at = j.value("tuned_at", "");
    for (const auto& e : j.value("candidates", nlohmann::json::array())) {
      CandidateTiming t;
      t.config = e.at("config").get<std::string>();
      t.median_ms = e.value("median_ms", -1.0);
      t.error = e.value("error", "");
      r.candidates.push_back(t);
    }
  } catch (const nlohmann::json::exception& e) {
    throw RuntimeError(fmt::format("tuning record: {}", e.what()));
  }
  return r;
}

TuningStore::TuningStore(std::string cache_dir, const ProblemIdentity& id)
    : folder_((fs::path(cache_dir) / "tuning" / problem_key(id)).string()) {}

std::string TuningStore::save(const TuningRecord& r) const {
  fs::create_directories(folder_);
  const fs::path final_path = fs::path(folder_) / fmt::format("{}x{}x{}.json", r.m, r.n, r.k);
  jit::write_file_atomically(final_path.string(), r.to_json());  // readers see the old record or the new one
  return final_path.string();
}

std::optional<TuningRecord> TuningStore::find(int64_t m, int64_t n, int64_t k) const {
  std::ifstream f(fs::path(folder_) / fmt::format("{}x{}x{}.json", m, n, k));
  if (!f) return std::nullopt;
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return TuningRecord::from_json(ss.str());
  } catch (const RuntimeError&) {
    return std::nullopt;  // a record from another evtc version: tune again
  }
}

std::vector<TuningRecord> TuningStore::all() const {
  std::vector<TuningRecord> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(folder_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name[0] == '.' || e.path().extension() != ".json") continue;
    std::ifstream f(e.path());
    std::stringstream ss;
    ss << f.rdbuf();
    try {
      out.push_back(TuningRecord::from_json(ss.str()));
    } catch (const RuntimeError&) {
    }
  }
  return out;
}

std::optional<TuningRecord> nearest(const std::vector<TuningRecord>& records, int64_t m, int64_t n,
                                    int64_t k) {
  auto dist = [&](const TuningRecord& r) {
    auto d = [](int64_t a, int64_t b) { return std::abs(std::log(double(size_or(a)) / double(size_or(b)))); };
    return d(r.m, m) + d(r.n, n) + d(r.k, k);
  };
  // Ties go to the smaller shape, so the choice does not depend on the folder's order.
  auto before = [&](const TuningRecord& a, const TuningRecord& b) {
    return std::tuple(dist(a), a.m, a.n, a.k) < std::tuple(dist(b), b.m, b.n, b.k);
  };
  const TuningRecord* best = nullptr;
  for (const auto& r : records)
    if (!best || before(r, *best)) best = &r;
  if (!best) return std::nullopt;
  return *best;
}

}  // namespace evtc::tuning
