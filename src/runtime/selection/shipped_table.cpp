#include "runtime/selection/shipped_table.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "evtc/arch.hpp"
#include "evtc/error.hpp"
#include "runtime/selection/candidates.hpp"
#include "runtime/selection/tuning_store.hpp"

namespace evtc::selection {
namespace {

constexpr int kTableFormat = 1;

double log_distance(int64_t a, int64_t b) { return std::abs(std::log2(double(a) / double(b))); }

template <class T>
T field(const nlohmann::json& j, const char* name, const std::string& where) {
  if (!j.contains(name)) throw RuntimeError(fmt::format("{}: '{}' is missing", where, name));
  try {
    return j.at(name).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw RuntimeError(fmt::format("{}: '{}' has the wrong type ({})", where, name, j.at(name).type_name()));
  }
}

}  // namespace

SelectionTable parse_table(const std::string& json, const std::string& file) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    throw RuntimeError(fmt::format("selection table {} is not JSON: {}", file, e.what()));
  }
  const std::string where = "selection table " + file;
  if (!j.is_object()) throw RuntimeError(where + ": not a JSON object");
  if (const int format = field<int>(j, "format", where); format != kTableFormat)
    throw RuntimeError(fmt::format("{}: format {}, expected {}", where, format, kTableFormat));
  SelectionTable t;
  t.file = file;
  t.gpu = field<std::string>(j, "gpu", where);
  t.gpu_class = field<std::string>(j, "gpu_class", where);
  if (j.contains("sm_count")) t.sm_count = field<int>(j, "sm_count", where);
  const auto dtype = parse_dtype(field<std::string>(j, "dtype", where));
  if (!dtype) throw RuntimeError(fmt::format("{}: dtype '{}' is not one of evtc's", where, j["dtype"].get<std::string>()));
  t.dtype = *dtype;
  if (j.contains("kind")) {
    const std::string kind = field<std::string>(j, "kind", where);
    if (kind != "residual")
      throw RuntimeError(fmt::format("{}: kind '{}' is not one a table is measured with (residual, or none for "
                                     "D = acc)", where, kind));
    t.kind = TableKind::residual;
  }
  const auto entries = field<nlohmann::json>(j, "entries", where);
  if (!entries.is_array()) throw RuntimeError(where + ": 'entries' is not an array");
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string at = fmt::format("{}, entry {}", where, i);
    TableEntry e;
    e.m = field<int64_t>(entries[i], "m", at);
    e.n = field<int64_t>(entries[i], "n", at);
    e.k = field<int64_t>(entries[i], "k", at);
    if (e.m <= 0 || e.n <= 0 || e.k <= 0) throw RuntimeError(at + ": sizes must be positive");
    const std::string name = field<std::string>(entries[i], "config", at);
    const auto config = KernelConfig::parse(name);
    if (!config) throw RuntimeError(fmt::format("{}: '{}' is not a kernel configuration", at, name));
    e.config = *config;
    if (entries[i].contains("order")) {
      const std::string order = field<std::string>(entries[i], "order", at);
      const auto parsed = VisitOrder::parse(order);
      if (!parsed) throw RuntimeError(fmt::format("{}: '{}' is not a tile visiting order ({})", at, order, VisitOrder::forms()));
      e.order = *parsed;
    }
    e.ms = field<double>(entries[i], "ms", at);
    e.cublas_ms = field<double>(entries[i], "cublas_ms", at);
    if (entries[i].contains("unswapped_config")) {
      const std::string other = field<std::string>(entries[i], "unswapped_config", at);
      e.unswapped = KernelConfig::parse(other);
      if (!e.unswapped || e.unswapped->swap_ab)
        throw RuntimeError(fmt::format("{}: '{}' is not an untransposed kernel configuration", at, other));
      e.unswapped_ms = field<double>(entries[i], "unswapped_ms", at);
    }
    t.entries.push_back(e);
  }
  std::sort(t.entries.begin(), t.entries.end(),
            [](const TableEntry& a, const TableEntry& b) { return std::tie(a.m, a.n, a.k) < std::tie(b.m, b.n, b.k); });
  return t;
}

const std::vector<SelectionTable>& shipped_tables() {
  // The tables are part of the build: one that does not parse is a defect of this build, and
  // the error names its file.
  static const std::vector<SelectionTable> tables = [] {
    std::vector<SelectionTable> out;
    for (const EmbeddedTable& e : embedded_tables()) out.push_back(parse_table(e.json, e.file));
    return out;
  }();
  return tables;
}

std::string gpu_class_of(const std::string& device_name) {
  for (const char* cls : {"H100", "H200"})
    if (device_name.find(cls) != std::string::npos) {
      std::string lower = cls;
      lower[0] = 'h';
      return lower;
    }
  return "";
}

std::vector<std::string> gpu_classes() {
  std::vector<std::string> out;
  for (const SelectionTable& t : shipped_tables())
    if (!t.gpu_class.empty() && std::find(out.begin(), out.end(), t.gpu_class) == out.end()) out.push_back(t.gpu_class);
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<DeviceInfo> device_of_class(const std::string& gpu_class) {
  for (const SelectionTable& t : shipped_tables())
    if (t.gpu_class == gpu_class && !t.gpu.empty() && t.sm_count > 0) return DeviceInfo{t.gpu, kVerifiedArch, t.sm_count};
  return std::nullopt;
}

const SelectionTable* table_for(const std::string& gpu_class, DType ab, int sm_count, TableKind kind) {
  if (gpu_class.empty()) return nullptr;
  // f16 runs the same main loops at the same speed as bf16.
  const DType measured = ab == DType::f16 ? DType::bf16 : ab;
  auto fits = [&](const SelectionTable& t) { return t.dtype == measured && t.kind == kind && !t.entries.empty(); };
  for (const SelectionTable& t : shipped_tables())
    if (t.gpu_class == gpu_class && fits(t)) return &t;
  for (const SelectionTable& t : shipped_tables())
    if (sm_count > 0 && t.sm_count == sm_count && fits(t)) return &t;
  return nullptr;
}

std::vector<const TableEntry*> nearest_in_n_and_k(const SelectionTable& table, int64_t m, int64_t n, int64_t k,
                                                  size_t count, const EntryFilter& usable) {
  std::vector<const TableEntry*> near;
  for (const TableEntry& e : table.entries)
    if (e.m == m && (!usable || usable(e.config))) near.push_back(&e);
  auto nk_distance = [&](const TableEntry* e) { return log_distance(e->n, n) + log_distance(e->k, k); };
  std::stable_sort(near.begin(), near.end(),
                   [&](const TableEntry* a, const TableEntry* b) { return nk_distance(a) < nk_distance(b); });
  near.resize(std::min(near.size(), count));
  return near;
}

const SelectionTable* shipped_table_named(const std::string& file) {
  for (const SelectionTable& t : shipped_tables())
    if (t.file == file) return &t;
  return nullptr;
}

std::optional<TableMatch> match(const SelectionTable& table, int64_t m, int64_t n, int64_t k, int sm_count,
                                const EntryFilter& usable) {
  if (table.entries.empty() || m <= 0 || n <= 0 || k <= 0) return std::nullopt;
  auto kept = [&](const TableEntry& e) { return !usable || usable(e.config); };
  for (const TableEntry& e : table.entries)
    if (e.m == m && e.n == n && e.k == k && kept(e)) return TableMatch{&e, true};
  // The measured M nearest on a log scale; of two equally near, the larger.
  int64_t bucket = 0;
  for (const TableEntry& e : table.entries) {
    if (!kept(e)) continue;
    if (bucket == 0) bucket = e.m;
    const double d = log_distance(e.m, m), best = log_distance(bucket, m);
    if (d < best - 1e-9 || (std::abs(d - best) <= 1e-9 && e.m > bucket)) bucket = e.m;
  }
  if (bucket == 0) return std::nullopt;  // no entry usable here
  const std::vector<const TableEntry*> near = nearest_in_n_and_k(table, bucket, n, k, 4, usable);
  // A configuration measured at a nearby shape carries over as long as its tile grid fills the
  // GPU about as well here as there: the nearest entry whose grid efficiency here is at least
  // 85 % of its own, else the one that keeps the most of it. Both are taken with M rounded up
  // to whole tiles of the configuration's rows (its tile_n where transposed): the padding of
  // the last row tile is the problem's whatever the tile, but the count of row tiles is the
  // configuration's. A 2×1 cluster rounds an odd count up (three 128-row tiles at M = 384 run as
  // four), and the waves follow the count. Measured on the H200 at 28 shapes outside the table
  // (bench/results/20261128-1433-h200-gemm-sweep-off-grid-picks.json): compared at the entry's
  // own M instead, the rule kept 2×1 clusters that took 1.72× cuBLAS at 384×16384×3072 and
  // 2.18× at 300×35840×5120, where this takes 1.03× and 1.27×; over the 27 shapes whose old and
  // new picks were both timed, 1.165× → 1.098× (docs/backend.md, "Shapes outside the table").
  tuning::DeviceLimits device;
  if (sm_count > 0) device.sm_count = sm_count;
  GemmDesc here;
  here.m = m;
  here.n = n;
  here.k = k;
  const TableEntry* best = nullptr;
  double best_kept = -1;
  for (const TableEntry* e : near) {
    GemmDesc there = here;
    there.m = e->m;
    there.n = e->n;
    there.k = e->k;
    const double own = tuning::grid_efficiency(e->config, tuning::whole_row_tiles(e->config, there), device);
    const double kept =
        own > 0 ? tuning::grid_efficiency(e->config, tuning::whole_row_tiles(e->config, here), device) / own : 0;
    if (kept >= 0.85) return TableMatch{e, false};
    if (kept > best_kept) {
      best = e;
      best_kept = kept;
    }
  }
  return TableMatch{best, false};
}

}  // namespace evtc::selection
