// The store of tuned choices on disk.
//
// A tuned choice is persisted under $EVTC_CACHE_DIR/tuning/<problem key>/<M>x<N>x<K>.json,
// one file per problem shape, written to a temporary file and renamed into place (so
// concurrent processes never read half a record). The problem key hashes the graph's hash,
// the A/B dtypes and layouts, the precise-math flag, the target arch and the device name:
// a choice is only reused for the same epilogue on the same kind of GPU.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "evtc/gemm.hpp"
#include "evtc/kernel_config.hpp"

namespace evtc::tuning {

// Which problems a tuned choice applies to.
struct ProblemIdentity {
  std::string graph_hash;  // graph_hash_hex of the lowered graph
  GemmDesc gemm;           // dtypes and layouts (sizes ignored)
  bool precise_math = false;
  int arch = 90;
  std::string device_name;  // e.g. "NVIDIA H100 80GB HBM3"
};
// 16 hex digits naming the folder of a problem's tuned choices.
std::string problem_key(const ProblemIdentity& id);

struct CandidateTiming {
  std::string config;     // KernelConfig::name()
  double median_ms = -1;  // < 0 when it failed
  std::string error;      // why it failed (did not compile, cannot implement, launch failed)
};

struct TuningRecord {
  int64_t m = 0, n = 0, k = 0;
  KernelConfig best;
  double best_ms = 0;      // with `order`
  VisitOrder order;        // the tile visiting order `best` runs with
  std::vector<std::pair<std::string, double>> orders;  // best's median ms with each order tried
  std::vector<CandidateTiming> candidates;
  ProblemIdentity identity;
  std::string tuned_at;  // UTC, ISO 8601

  std::string to_json() const;
  // Parses to_json(); throws RuntimeError naming what is wrong.
  static TuningRecord from_json(const std::string& text);
};

// The tuned choices of one problem identity in a cache folder.
class TuningStore {
 public:
  TuningStore(std::string cache_dir, const ProblemIdentity& id);
  // Writes the record (replacing an older one of the same shape); returns its path.
  std::string save(const TuningRecord& r) const;
  std::optional<TuningRecord> find(int64_t m, int64_t n, int64_t k) const;
  // Every record, in no particular order; unreadable files are skipped.
  std::vector<TuningRecord> all() const;
  const std::string& folder() const { return folder_; }

 private:
  std::string folder_;
};

// The current time, UTC, ISO 8601 (a record's tuned_at).
std::string utc_now();

// The record of `records` nearest to M×N×K: the smallest sum of |log| ratios of M, N and K
// (a problem twice as large in one dimension is as far as one half as large).
std::optional<TuningRecord> nearest(const std::vector<TuningRecord>& records, int64_t m, int64_t n,
                                    int64_t k);

}  // namespace evtc::tuning
